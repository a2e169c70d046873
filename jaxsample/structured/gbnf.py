"""GBNF (llama.cpp grammar) subset -> expression tree.

Supported: rules ``name ::= ...`` (``root`` is the start), alternatives ``|``, sequences, string
literals with escapes (``\\n \\r \\t \\\\ \\" \\xNN \\uNNNN \\UNNNNNNNN``), character classes
``[a-z]``/``[^...]``, ``.``, groups, ``* + ? {m} {m,} {m,n}`` and ``#`` comments. Token terminals
``<[id]>``/``<token>`` raise :class:`~jaxsample.structured.automaton.GrammarError`.

Rules may be recursive. References are inlined, except a reference to a rule that is already
being expanded on the current path: that one becomes a :class:`~jaxsample.structured.automaton.Call`,
and the grammar a :class:`~jaxsample.structured.pushdown.Grammar`, compiled to a pushdown automaton
whose stack holds ``max_depth`` frames (one per nested call; right recursion uses none). Grammars
the deterministic automaton cannot follow (left recursion, a byte that could continue two ways)
raise a ``GrammarError`` when compiled.

>>> from jaxsample.structured.pushdown import compile_grammar
>>> p = compile_grammar(parse_gbnf('root ::= "(" inner ")"\\ninner ::= [a-z]+ | root', max_depth=2))
>>> p.matches(b"((ab))"), p.matches(b"(((ab)))"), p.matches(b"((((ab))))"), p.matches(b"(()")
(True, True, False, False)
"""

from __future__ import annotations

import re

from jaxsample.structured.automaton import EMPTY, EPSILON, MAX_CODE_POINT, Call, Chars, GrammarError, alt, repeat, seq
from jaxsample.structured.pushdown import DEFAULT_MAX_DEPTH, Grammar
from jaxsample.structured.regex import _Parser as _RegexParser

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_RULE_START = re.compile(r"[A-Za-z0-9_-]+[ \t]*::=")
_ESC = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "^": 94}


class _Grammar:
    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.rules: dict[str, object] = {}

    def error(self, msg: str) -> GrammarError:
        line = self.t.count("\n", 0, self.i) + 1
        return GrammarError(f"GBNF line {line}: {msg}")

    def skip(self, newlines: bool = True):
        while self.i < len(self.t):
            c = self.t[self.i]
            if c == "#":
                while self.i < len(self.t) and self.t[self.i] != "\n":
                    self.i += 1
            elif c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            else:
                break

    def parse(self) -> dict:
        self.skip()
        while self.i < len(self.t):
            m = _NAME.match(self.t, self.i)
            if not m:
                raise self.error(f"expected a rule name, got {self.t[self.i:self.i + 10]!r}")
            name = m.group(0)
            self.i = m.end()
            self.skip(False)
            if not self.t.startswith("::=", self.i):
                raise self.error(f"expected '::=' after rule name {name!r}")
            self.i += 3
            if name in self.rules:
                raise self.error(f"rule {name!r} is defined twice")
            self.rules[name] = self.alternatives(depth=0)
            self.skip()
        return self.rules

    def at_rule_start(self) -> bool:
        return bool(_RULE_START.match(self.t, self.i))

    def alternatives(self, depth: int):
        out = [self.sequence(depth)]
        while self.i < len(self.t) and self.t[self.i] == "|":
            self.i += 1
            out.append(self.sequence(depth))
        return ("alt", out)

    def sequence(self, depth: int):
        items = []
        while True:
            self.skip()  # a rule body runs on across lines until the next "name ::="
            if self.i >= len(self.t) or self.t[self.i] in "|)" or self.at_rule_start():
                break
            items.append(self.postfix(self.atom(depth)))
        return ("seq", items)

    def postfix(self, item):
        while self.i < len(self.t) and self.t[self.i] in "*+?{":
            c = self.t[self.i]
            if c == "{":
                m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.t, self.i)
                if not m:
                    raise self.error("malformed repetition")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                self.i = m.end()
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            item = ("rep", item, lo, hi)
        return item

    def atom(self, depth: int):
        c = self.t[self.i]
        if c == '"':
            self.i += 1
            out = []
            while True:
                if self.i >= len(self.t):
                    raise self.error("unterminated string literal")
                c = self.t[self.i]
                if c == '"':
                    self.i += 1
                    return ("lit", out)
                out.append(self.char())
        if c == "[":
            p = _RegexParser(self.t)
            p.i = self.i + 1
            ranges = p.parse_class()
            self.i = p.i
            return ("chars", ranges)
        if c == ".":
            self.i += 1
            return ("chars", ((0, MAX_CODE_POINT),))
        if c == "(":
            self.i += 1
            inner = self.alternatives(depth + 1)
            self.skip()
            if self.i >= len(self.t) or self.t[self.i] != ")":
                raise self.error("missing ')'")
            self.i += 1
            return inner
        if c in "<!":
            raise self.error("token terminals (<[id]>, <token>, !<...>) are not supported")
        m = _NAME.match(self.t, self.i)
        if not m:
            raise self.error(f"unexpected character {c!r}")
        self.i = m.end()
        return ("ref", m.group(0))

    def char(self) -> int:
        c = self.t[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        e = self.t[self.i]
        self.i += 1
        if e in _ESC:
            return _ESC[e]
        n = {"x": 2, "u": 4, "U": 8}.get(e)
        if n is None:
            raise self.error(f"unknown escape \\{e}")
        digits = self.t[self.i : self.i + n]
        self.i += n
        try:
            code = int(digits, 16)
        except ValueError:
            raise self.error(f"bad \\{e} escape") from None
        if code > 0x10FFFF:
            raise self.error(f"\\{e}{digits} is beyond U+10FFFF")
        return code


def _refs(node, out: set) -> set:
    if node[0] == "ref":
        out.add(node[1])
    elif node[0] in ("alt", "seq"):
        for x in node[1]:
            _refs(x, out)
    elif node[0] == "rep":
        _refs(node[1], out)
    return out


def _components(rules: dict) -> dict[str, frozenset]:
    """The rules each rule reaches and that reach it back (its recursive component; empty if none)."""
    graph = {name: _refs(body, set()) for name, body in rules.items()}
    reach = {}
    for name in rules:
        seen, todo = set(), list(graph[name])
        while todo:
            r = todo.pop()
            if r not in seen and r in graph:
                seen.add(r)
                todo.extend(graph[r])
        reach[name] = seen
    return {name: frozenset(r for r in reach[name] if name in reach[r]) for name in rules}


def parse_gbnf(text: str, *, root: str = "root", max_depth: int = DEFAULT_MAX_DEPTH):
    """Expression tree of a GBNF grammar's start rule, or a :class:`~jaxsample.structured.pushdown.Grammar`
    when it recurses (see the module docstring).

    Args:
      text: the grammar.
      root: the start rule.
      max_depth: stack frames of a recursive grammar (nested calls; the default limit of the
        compiled tables, changeable per batch on the device).

    Raises:
      GrammarError: on syntax errors, undefined rules, unsupported constructs.
    """
    rules = _Grammar(text).parse()
    if root not in rules:
        raise GrammarError(f"GBNF: no {root!r} rule")
    for name, body in rules.items():
        for r in _refs(body, set()):
            if r not in rules:
                raise GrammarError(f"GBNF: rule {r!r} is referenced but not defined")
    component = _components(rules)
    memo: dict = {}
    called: list[str] = []

    def rule(name: str, path: tuple):
        if name in path:  # recursion: enter the rule on the stack
            if name not in called:
                called.append(name)
            return Call(name)
        key = (name, frozenset(path) & component[name])
        if key not in memo:
            memo[key] = lower(rules[name], path + (name,))
        return memo[key]

    def lower(node, path):
        kind = node[0]
        if kind == "alt":
            return alt(*(lower(x, path) for x in node[1]))
        if kind == "seq":
            return seq(*(lower(x, path) for x in node[1])) if node[1] else EPSILON
        if kind == "rep":
            return repeat(lower(node[1], path), node[2], node[3])
        if kind == "lit":
            return seq(*(Chars(((c, c),)) for c in node[1])) if node[1] else EPSILON
        if kind == "chars":
            return Chars(node[1]) if node[1] else EMPTY
        return rule(node[1], path)

    start = rule(root, ())
    if not called:
        return start
    bodies = {root: start}
    i = 0
    while i < len(called):  # each called rule, expanded from itself (which may call more rules)
        if called[i] != root:
            bodies[called[i]] = lower(rules[called[i]], (called[i],))
        i += 1
    return Grammar(bodies, root, int(max_depth))
