"""Recursive grammars: rules that call each other -> a deterministic byte-level pushdown automaton.

A :class:`Grammar` is a set of named rules (expression trees of :mod:`~jaxsample.structured.automaton`
in which :class:`~jaxsample.structured.automaton.Call` nodes refer to rules) and a root rule. Front
ends produce one when a grammar recurses (GBNF rules, ``$ref`` cycles, generic JSON values); a call
marks where a rule is *entered on the stack* instead of inlined. :func:`compile_grammar` builds one
automaton over all rules (subset construction from every rule's start over bytes and call symbols,
trimming, minimisation) and fixes its byte-level semantics, which the token tables, the device and
the host matcher all follow:

* **shift**: a byte that is a transition of the current rule's automaton;
* **enter**: a byte that starts a called rule: the call's return state is pushed (nested calls at
  the same byte push several) and the byte is consumed inside the callee;
* **return**: in a state where the rule may end, a byte that neither shifts nor enters pops the
  top return state and is processed there (a *lazy* return: ``1`` then ``,`` after a number); a
  state where the rule must end (accepting with no transition, e.g. after a closing bracket)
  returns at once.

The machine is deterministic: in every state at most one of shift / enter / return applies to a
byte. :func:`compile_grammar` checks it and raises :class:`~jaxsample.structured.automaton.GrammarError`
naming the rule otherwise (the tables follow one path; they never guess). Left recursion is refused
(as llama.cpp does). Calls whose return state must end at once are **tail calls**: nothing is
pushed, so right recursion (``list ::= item ("," list)?``) uses no depth. Below every stack lies the
state ``bottom`` ("the root rule returned"), where only EOS is allowed.

**Depth.** A row's stack holds at most ``max_depth`` return states, counting calls entered and left
within one byte (``x`` read as a call of a rule holds a frame while it is read). ``need[q]`` is the least
stack room (frames above the current depth) needed to finish the current rule from ``q``; the
token tables mask every token after which the output could no longer be finished within the limit,
so an output is never stuck and never invalid: at the limit, tokens that would nest deeper are
simply not allowed (a closing bracket, a scalar or an empty container still is).

>>> from jaxsample.structured.automaton import Call, alt, lit, seq
>>> g = Grammar({"root": alt(lit("x"), seq(lit("("), Call("root"), lit(")")))}, "root", max_depth=1)
>>> p = compile_grammar(g)
>>> [p.matches(s) for s in (b"x", b"(x)", b"((x))", b"(x")]   # (x): the inner call of root takes the frame
[True, True, False, False]
"""

from __future__ import annotations

import functools
import operator
from typing import Any, NamedTuple

import numpy as np

from jaxsample.structured.automaton import (
    Alt,
    Call,
    Chars,
    EmptyLanguageError,
    GrammarError,
    KeyOp,
    KeyRegisterError,
    Repeat,
    Seq,
    _determinise,
    _NFA,
    alt,
    budgets,
    compose,
    detached,
    either,
    repeat,
    seq,
)
from jaxsample.structured.minimise import _gather, coreachable, partition, predecessors

#: Default stack capacity (frames) of recursive grammars.
DEFAULT_MAX_DEPTH = 32
#: Most rewrites of ambiguous calls (:func:`merge_calls`, :func:`inline_calls`) per grammar.
MAX_CALL_REWRITES = 16


class AmbiguousCallError(GrammarError):
    """A byte both shifts and enters a called rule (or enters two) where a rule is called.

    ``conflicts``: every such place of the automaton, as ``(rules entered, whether the byte also
    shifts, whether the calls all return to one state)`` (see :func:`compile_grammar`).
    """

    def __init__(self, message: str, conflicts: tuple = ()):
        super().__init__(message)
        self.conflicts = conflicts


class Grammar(NamedTuple):
    """A recursive grammar: ``rules`` maps names to expressions (with :class:`Call` nodes), ``root`` starts.

    ``max_depth`` is the default stack limit (nested calls that push a return state).
    """

    rules: dict[str, Any]
    root: str
    max_depth: int = DEFAULT_MAX_DEPTH


class Pushdown(NamedTuple):
    """A deterministic byte-level pushdown automaton (see the module docstring). State 0 is dead.

    Attributes:
      delta: ``int32[Q, K]`` shifts per byte class (0: none).
      byte_class: ``int32[256]``.
      accept: ``bool[Q]`` states where the current rule may end.
      enter: ``int32[Q, K]`` state after entering called rule(s) with a byte (0: no call).
      enter_push: ``int32[Q, K]`` index into ``pushes`` of the return states pushed by that byte.
      pushes: return-state sequences (outermost first); ``pushes[0]`` is empty.
      start: the root rule's start state.
      bottom: the state below every stack (accepting, no transition).
      need: ``int32[Q]`` least stack room needed to finish the current rule.
      returns: ``int32[R]`` the states that can be on top of a stack (pushed states and ``bottom``).
      max_depth: default stack limit.
      closed: ``bool[Q]`` states where the rule must end (accepting, nothing continues): they return at once.
      op: ``int32[Q, K]`` index into ``ops`` of the key-register op a shifted byte applies first (0: none).
      ops: the :class:`~jaxsample.structured.automaton.KeyOp` s; ``ops[0]`` does nothing.
      key_need: per state, the key bits of which one at least must be clear for the output to be
        completable (every way on needs a key not yet written: inside a key, after ``,``); 0: none
        (see :func:`_key_needs`).
    """

    delta: np.ndarray
    byte_class: np.ndarray
    accept: np.ndarray
    enter: np.ndarray
    enter_push: np.ndarray
    pushes: tuple
    start: int
    bottom: int
    need: np.ndarray
    returns: np.ndarray
    max_depth: int
    closed: np.ndarray
    op: np.ndarray | None = None
    ops: tuple = (KeyOp(),)
    key_need: tuple = ()

    def viable(self, q: int, keys: int) -> bool:
        """Whether the output can still be completed from ``q`` with key register ``keys``."""
        need = self.key_need[q] if self.key_need else 0
        return not need or keys & need != need

    @property
    def num_states(self) -> int:
        return int(self.delta.shape[0])

    def step(self, q: int, byte: int, stack: list, keys: int = 0) -> int:
        """State after one byte (``stack`` updated in place; 0: the byte is not allowed)."""
        return self.step_peak(q, byte, stack, keys)[0]

    def step_peak(self, q: int, byte: int, stack: list, keys: int = 0) -> tuple[int, int, int]:
        """``(state, peak, keys)``: :meth:`step`, the deepest the stack was while reading the byte (calls
        entered and left at once count, as they do for the depth limit) and the key register after it."""
        c = self.byte_class[byte]
        peak = len(stack)
        while True:
            if self.delta[q, c]:
                if self.op is not None and self.op[q, c]:
                    keys = self.ops[self.op[q, c]].apply(keys)
                    if keys is None:
                        return 0, peak, 0
                q = int(self.delta[q, c])
                break
            if self.enter[q, c]:
                stack.extend(self.pushes[self.enter_push[q, c]])
                peak = max(peak, len(stack))
                q = int(self.enter[q, c])
                break
            if not self.accept[q] or q == self.bottom:
                return 0, peak, 0
            q = stack.pop() if stack else self.bottom  # lazy return: the byte is processed by the caller
        while self.closed[q] and q != self.bottom:  # the rule must end: return at once
            q = stack.pop() if stack else self.bottom
        return q, peak, keys

    def run(self, data: bytes, state: int | None = None, stack: tuple = (), max_depth: int | None = None,
            keys: int = 0):  # fmt: skip
        """``(state, stack, keys)`` after ``data`` from ``state`` (default: the start) with return states
        ``stack`` and key register ``keys``; ``None`` if it dies, nests past ``max_depth`` frames (default:
        the grammar's) or leaves no completion within them. The byte-level meaning every token table follows."""
        limit = self.max_depth if max_depth is None else int(max_depth)
        q, frames = self.start if state is None else state, list(stack)
        for b in data:
            q, peak, keys = self.step_peak(q, b, frames, keys)
            if q == 0 or peak > limit:
                return None
        if len(frames) + self.need[q] > limit or any(i + self.need[r] > limit for i, r in enumerate(frames)):
            return None
        return (q, tuple(frames), keys) if self.viable(q, keys) else None

    def matches(self, data: bytes, max_depth: int | None = None) -> bool:
        """Whether ``data`` is a complete output with at most ``max_depth`` frames (default: the grammar's)
        at every byte (calls entered and left within one byte count, as for the token tables)."""
        end = self.run(data, max_depth=max_depth)
        return end is not None and bool(self.accept[end[0]]) and all(self.accept[r] for r in end[1])


# ----------------------------------------------------------------------------------- expressions
def _nullable(expr, rules_nullable: dict) -> bool:
    if isinstance(expr, Chars):
        return False
    if isinstance(expr, Call):
        return rules_nullable.get(expr.rule, False)
    if isinstance(expr, Seq):
        return all(_nullable(x, rules_nullable) for x in expr.items)
    if isinstance(expr, Alt):
        return any(_nullable(x, rules_nullable) for x in expr.items)
    if isinstance(expr, Repeat):
        return expr.lo == 0 or _nullable(expr.item, rules_nullable)
    if isinstance(expr, KeyOp):
        return True
    if hasattr(expr, "dfa"):  # an embedded DFA (dfa_ops.Automaton)
        return bool(expr.dfa.accept[expr.dfa.start])
    raise TypeError(f"not an expression node: {expr!r}")


def _nullable_rules(rules: dict) -> frozenset:
    """The rules that match the empty string (a call of an undefined rule counts as not empty here;
    it is an error where the automaton reaches it)."""
    nullable = {name: False for name in rules}
    changed = True
    while changed:
        changed = False
        for name, expr in rules.items():
            if not nullable[name] and _nullable(expr, nullable):
                nullable[name] = changed = True
    return frozenset(name for name, v in nullable.items() if v)


# ------------------------------------------------------------------------------------- automaton
def _trim(table, accept, entries, call_cols):
    """Live states (reachable from the root, able to finish their rule); calls of empty rules removed."""
    n, _ = table.shape
    byte_cols = np.setdiff1d(np.arange(table.shape[1]), list(call_cols))
    nonempty = np.ones(len(entries), bool)
    while True:  # co-reachability to acceptance through shifts and calls of non-empty rules
        cols = byte_cols.tolist() + [c for c, r in call_cols.items() if nonempty[r]]
        co = coreachable(np.ascontiguousarray(table[:, cols]), accept)
        now = co[np.asarray(entries)]
        if np.array_equal(now, nonempty):
            break
        nonempty = now
    for c, r in call_cols.items():
        if not nonempty[r]:
            table[:, c] = 0
    callee = {c: entries[r] for c, r in call_cols.items()}
    fwd = np.zeros(n, bool)
    frontier = np.array([entries[0]])
    fwd[frontier] = True
    while frontier.size:
        rows = table[frontier]
        nxt = [rows.ravel()] + [np.array([e]) for c, e in callee.items() if (rows[:, c] != 0).any()]
        nxt = np.unique(np.concatenate(nxt))
        frontier = nxt[~fwd[nxt]]
        fwd[frontier] = True
    live = fwd & co
    live[0] = False
    if not live[entries[0]]:
        raise EmptyLanguageError("the grammar matches no string at all")
    return live, nonempty


def compile_grammar(
    g: Grammar, *, max_nfa_states: int | None = None, max_dfa_states: int | None = None
) -> Pushdown:
    """The pushdown automaton of a recursive grammar (see the module docstring).

    Where one byte enters several rules that all return to the same state (``a | b`` with both
    starting ``{``), the alternatives are one call of a rule matching either (:func:`merge_calls`);
    where it also shifts, non-recursive rules entered there are inlined (:func:`inline_calls`); where
    the rules entered return to different places (union branches calling different rules at the same
    point), non-recursive ones are inlined everywhere (:func:`inline_all`): the same language. Every
    conflict found is rewritten, then compiled again (at most :data:`MAX_CALL_REWRITES` rounds); a
    conflict no rewrite removes (a recursive rule), or a rewritten grammar that fails, raises the
    first :class:`AmbiguousCallError`.

    Raises:
      GrammarError: undefined rules, left recursion, a choice the automaton cannot make
        deterministically, a budget exceeded, or a root that needs more than ``max_depth`` frames.
      EmptyLanguageError: if the grammar matches nothing.
    """
    parts: dict[str, frozenset] = {}
    first = None
    for rewrites in range(MAX_CALL_REWRITES + 1):
        try:
            return _compile(g, max_nfa_states, max_dfa_states)
        except AmbiguousCallError as err:
            first = first or detached(err)
            recursive = _recursive(g.rules)
            if any(rules & recursive for rules, shifts, one_return in err.conflicts if shifts or not one_return):
                raise first from None  # a conflict no rewrite removes: refused at once
            everywhere = frozenset().union(*(rules for rules, shifts, one in err.conflicts if not (shifts or one)))
            inline = frozenset().union(*(rules for rules, shifts, _ in err.conflicts if shifts)) - everywhere
            merge = [rules for rules, shifts, one in err.conflicts if not shifts and one and not rules & everywhere]
            inlined = inline_all(g, everywhere) or g
            rewritten = merge_calls(inline_calls(inlined, inline) or inlined, merge, parts)
            if rewritten is g or rewrites == MAX_CALL_REWRITES:
                raise first from None
            g = rewritten
        except GrammarError:
            if first is None:
                raise
            raise first from None  # the rewrites did not help: the grammar as written is ambiguous


def _called(expr) -> set:
    """The rules ``expr`` calls."""
    out, seen, todo = set(), set(), [expr]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, Call):
            out.add(x.rule)
        elif isinstance(x, (Alt, Seq)):
            todo.extend(x.items)
        elif isinstance(x, Repeat):
            todo.append(x.item)
    return out


def _recursive(rules: dict) -> frozenset:
    """The rules that can call themselves (inlining one would only move its ambiguity a level down)."""
    calls = {name: _called(body) for name, body in rules.items()}
    out = set()
    for name in rules:
        seen, todo = set(), list(calls[name])
        while todo:
            r = todo.pop()
            if r == name:
                out.add(name)
                break
            if r not in seen and r in calls:
                seen.add(r)
                todo.extend(calls[r])
    return frozenset(out)


def _map_alts(join, call=None):
    """A rewrite of expressions applying ``join`` to the (rewritten) alternatives of every :class:`Alt`
    and ``call(node, walk)`` (if given) to every :class:`Call` (memoised by node: expressions are DAGs)."""
    memo: dict[int, tuple] = {}

    def walk(x):
        hit = memo.get(id(x))
        if hit is not None:
            return hit[1]
        if isinstance(x, Call) and call is not None:
            y = call(x, walk)
        elif isinstance(x, Alt):
            y = alt(*join([walk(i) for i in x.items]))
        elif isinstance(x, Seq):
            y = seq(*(walk(i) for i in x.items))
        elif isinstance(x, Repeat):
            y = repeat(walk(x.item), x.lo, x.hi)
        else:
            y = x
        memo[id(x)] = (x, y)
        return y

    return walk


def merge_calls(g: Grammar, groups: list, parts: dict) -> Grammar:
    """``g`` with the calls of each group of rules in ``groups`` that are alternatives of one
    :class:`Alt` replaced by one call of a rule matching any of them (named ``a | b``; ``parts`` maps
    such names to the rules they join and is updated); ``g`` itself where no :class:`Alt` holds two.

    Exact: the alternatives of an :class:`Alt` share what follows it, so ``Call(a) | Call(b)`` and a
    call of ``a | b`` (whose body is ``body(a) | body(b)``) match the same strings with one frame.
    """
    added: dict[str, Any] = {}
    changed = []

    def join(items: list) -> list:
        for rules in groups:
            calls = [i for i in items if isinstance(i, Call) and i.rule in rules]
            if len(calls) < 2:
                continue
            changed.append(True)
            base = frozenset().union(*(parts.get(c.rule, {c.rule}) for c in calls))
            name = " | ".join(sorted(base))
            while name in g.rules and parts.get(name) != base:  # a rule of the grammar's own named so
                name += "'"
            if name not in g.rules and name not in added:
                parts[name] = base
                added[name] = alt(*(g.rules[r] for r in sorted(base)))
            at = items.index(calls[0])
            items = [i for i in items if i not in calls]
            items = items[:at] + [Call(name)] + items[at:]
        return items

    walk = _map_alts(join)
    new = {name: walk(body) for name, body in g.rules.items()}
    if not changed:
        return g
    while len(new) < len(g.rules) + len(added):  # merged bodies may join more calls
        name = next(n for n in added if n not in new)
        new[name] = walk(added[name])
    return g._replace(rules=new)


def inline_calls(g: Grammar, rules: frozenset) -> Grammar | None:
    """``g`` with the calls of ``rules`` that are alternatives of an :class:`Alt` beside others
    replaced by the rules' bodies (``None``: no such call), so that the automaton can choose between
    them and the other alternatives. The same strings; the inlined level takes no stack frame."""
    if not rules:
        return None
    changed = []

    def join(items: list) -> list:
        mine = [isinstance(i, Call) and i.rule in rules for i in items]
        if not any(mine) or all(mine):
            return items
        changed.append(True)
        return [g.rules[i.rule] if m else i for i, m in zip(items, mine)]

    walk = _map_alts(join)
    new = {name: walk(body) for name, body in g.rules.items()}
    return g._replace(rules=new) if changed else None


def inline_all(g: Grammar, rules: frozenset) -> Grammar | None:
    """``g`` with every call of the (non-recursive) ``rules`` replaced by the rule's body (``None``: no
    such call): rules entered on one byte from callers that return to different places become states
    of their callers, which the automaton follows in parallel. The same strings; fewer frames."""
    if not rules:
        return None
    changed = []

    def call(x: Call, walk):
        if x.rule not in rules:
            return x
        changed.append(True)
        return walk(g.rules[x.rule])

    walk = _map_alts(lambda items: items, call)
    new = {name: walk(body) for name, body in g.rules.items()}
    return g._replace(rules=new) if changed else None


def _compile(g: Grammar, max_nfa_states: int | None, max_dfa_states: int | None) -> Pushdown:
    max_nfa_states, max_dfa_states = budgets(max_nfa_states, max_dfa_states)
    nfa = _NFA(max_nfa_states, g.rules, _nullable_rules(g.rules))
    nfa.call_index(g.root)
    finals, starts = [], []
    while len(starts) < len(nfa.called):  # the rules reachable from the root, numbered as first called
        finals.append(nfa.new())
        starts.append(nfa.build(g.rules[nfa.called[len(starts)]], finals[-1]))
    names = nfa.called
    table, symbol_class, accept, entries = _determinise(nfa, starts, set(finals), max_dfa_states)
    call_cols = {int(symbol_class[256 + nfa.call_symbol[i]]): i for i in range(len(names))}
    call_cols = {c: r for c, r in call_cols.items() if c not in set(symbol_class[:256].tolist())}
    op_cols = {int(symbol_class[256 + s]): op for op, s in nfa.op_symbol.items()}
    live, nonempty = _trim(table, accept, entries, call_cols)
    keep = np.flatnonzero(live)
    renum = np.zeros(table.shape[0], np.int64)
    renum[keep] = np.arange(1, keep.size + 1)
    t = np.concatenate([np.zeros((1, table.shape[1]), np.int64), renum[table[keep]]])
    acc = np.concatenate([[False], accept[keep]])
    block = partition(t, acc)
    # renumber blocks: dead 0, root start 1, the others by first state
    first = np.full(int(block.max()) + 1, t.shape[0])
    np.minimum.at(first, block, np.arange(t.shape[0]))
    root_block = block[renum[entries[0]]]
    rest = np.setdiff1d(np.arange(first.size), [block[0], root_block])
    order = np.concatenate([[block[0], root_block], rest[np.argsort(first[rest], kind="stable")]])
    new_id = np.zeros(first.size, np.int64)
    new_id[order] = np.arange(first.size)
    reps = first[order]
    t = new_id[block[t[reps]]]
    acc = acc[reps]
    rule_start = [int(new_id[block[renum[e]]]) if nonempty[i] and live[e] else 0 for i, e in enumerate(entries)]
    return _machine(t, acc, symbol_class[:256], call_cols, rule_start, names, g.max_depth, op_cols)


def _machine(t, accept, byte_symbol, call_cols, rule_start, names, max_depth, op_cols=None) -> Pushdown:
    """Byte-level semantics (key ops, enter tables, checks, depth needs) of the minimised table over all rules."""
    byte_cols = np.unique(byte_symbol)
    compact = np.zeros(t.shape[1], np.int64)
    compact[byte_cols] = np.arange(byte_cols.size)
    byte_class = compact[byte_symbol].astype(np.int32)
    delta = t[:, byte_cols]
    q_count, k = delta.shape
    op, ops = _key_ops(t, delta, op_cols or {}, call_cols)
    bottom = q_count  # appended below: accepting, no transition
    calls = [(q, r, int(t[q, c])) for c, r in call_cols.items() for q in np.flatnonzero(t[:, c]).tolist()]
    calls_at: dict[int, list] = {}
    for q, r, ret in calls:
        calls_at.setdefault(q, []).append((r, ret))
    closed = accept & ~(delta != 0).any(axis=1) & np.array([q not in calls_at for q in range(q_count)])
    pushes: dict[tuple, int] = {(): 0}
    entry_memo: dict[tuple[int, int], tuple[int, tuple] | None] = {}
    ambiguous: dict[tuple, str] = {}

    def act(q: int, b: int, path: tuple = ()) -> tuple[int, tuple] | None:
        """``(state, pushed return states)`` after shifting or entering with byte class ``b`` at ``q``."""
        key = (q, b)
        if key in entry_memo:
            return entry_memo[key]
        if key in path:
            rule = names[[i for i, s in enumerate(rule_start) if s == q][0]] if q in rule_start else "?"
            raise GrammarError(f"rule {rule!r} is left-recursive (it can call itself before reading a byte)")
        found = [(int(delta[q, b]), ())] if delta[q, b] else []
        entered = []
        for r, ret in calls_at.get(q, ()):
            inner = act(rule_start[r], b, path + (key,))
            if inner is not None:
                found.append((inner[0], (() if closed[ret] else (ret,)) + inner[1]))
                entered.append((names[r], ret))
        if len(found) > 1:  # noted, then raised once every byte is checked
            ambiguous.setdefault((frozenset(r for r, _ in entered), bool(delta[q, b]), len({r for _, r in entered}) == 1),
                                 f"byte {_byte_name(byte_class, b)} can continue two ways where rule {entered[-1][0]!r} is called")  # fmt: skip
        entry_memo[key] = found[0] if found else None
        return entry_memo[key]

    enter = np.zeros((q_count + 1, k), np.int32)
    enter_push = np.zeros((q_count + 1, k), np.int32)
    for q in calls_at:
        for b in range(k):
            got = act(q, b)
            if got is not None and not delta[q, b]:
                enter[q, b] = got[0]
                enter_push[q, b] = pushes.setdefault(got[1], len(pushes))
    if ambiguous:
        raise AmbiguousCallError(
            f"{next(iter(ambiguous.values()))} (the grammar is ambiguous there for a deterministic pushdown "
            "automaton; factor the common prefix out of the alternatives)", tuple(ambiguous))
    delta = np.concatenate([delta, np.zeros((1, k), delta.dtype)]).astype(np.int32)
    accept = np.concatenate([accept, [True]])
    closed = np.concatenate([closed, [True]])
    if op is not None:
        op = np.concatenate([op, np.zeros((1, k), np.int32)])
        callee = {rule_start[r] for _, r, _ in calls}
        if _reaches(delta, enter, callee, op):
            raise KeyRegisterError("key register ops inside a called rule are not supported (one register per row)")
    p = Pushdown(
        delta, byte_class, accept, enter, enter_push, tuple(pushes), 1, bottom,
        np.zeros(q_count + 1, np.int32), np.zeros(0, np.int32), int(max_depth),
        accept & ~(delta != 0).any(axis=1) & ~(enter != 0).any(axis=1), op, ops,
    )  # fmt: skip
    member = _membership(p, calls, rule_start)
    _check_returns(p, calls, rule_start, member, names)
    need = _need(p, calls, rule_start)
    if need[p.start] > max_depth:
        raise GrammarError(f"the shortest output of the grammar nests {need[p.start]} calls deep (max_depth={max_depth})")
    returns = sorted({s for seq_ in pushes for s in seq_} | {bottom})
    p = p._replace(need=need.astype(np.int32), returns=np.asarray(returns, np.int32))
    if op is not None:
        p = p._replace(key_need=_key_needs(p))
        if any(p.key_need[r] for r in returns):
            raise KeyRegisterError("a call returns where a key must still be written")
    return p


def _key_needs(p: Pushdown) -> tuple:
    """Per state, the bits of which one at least must be clear to complete the output (0: none needed).

    A least fixpoint over the byte transitions (a worklist over the distinct moves, joins only
    grow): accepting states need nothing; a shift or a call passes on its target's need (a call's
    callee holds no ops: it completes); a byte read with an op passes on its target's need as the op
    leaves it (a bit it clears satisfies it, a bit it adds cannot), and its ``absent`` bits (a key
    written for the first time) are needed when the target needs nothing or the op satisfies the
    target's need. Alternatives join: one that needs nothing wins, otherwise any of their bits will
    do. An op's ``present`` test (required keys before ``}``) counts as satisfiable: the JSON objects
    recording keys can always write a missing required key first. A key test whose target still
    needs other keys would need a conjunction: :class:`KeyRegisterError`.
    """
    free = p.accept.copy()
    free[p.bottom] = True
    free[np.flatnonzero((p.enter != 0).any(axis=1))] = True
    free, mask = free.tolist(), [0] * p.num_states
    qs, bs = np.nonzero(p.delta)
    n, m = p.num_states, len(p.ops)
    code = np.unique((qs.astype(np.int64) * n + p.delta[qs, bs]) * m + p.op[qs, bs])
    moves = list(zip((code // (n * m)).tolist(), (code // m % n).tolist(), [p.ops[o] for o in (code % m).tolist()]))
    into: list[list] = [[] for _ in range(n)]  # per target: (state, op) of its moves
    for q, t, o in moves:
        into[t].append((q, o))

    def gain(t: int, o: KeyOp) -> int | None:
        """What a move to ``t`` with ``o`` needs (``None``: nothing); a key test into a state that
        needs keys gives nothing here (``t`` may need nothing later) and is checked at the end."""
        if free[t] or mask[t] & o.clear & ~o.add:
            return o.absent or None
        return 0 if o.absent else mask[t] & ~(o.clear | o.add)

    todo = list(range(p.num_states))  # a worklist of targets: the joins only grow (a least fixpoint)
    while todo:
        t = todo.pop()
        for q, o in into[t]:
            if free[q]:
                continue
            got = gain(t, o)
            if got is None:
                free[q] = True
                todo.append(q)
            elif mask[q] | got != mask[q]:
                mask[q] |= got
                todo.append(q)
    for q, t, o in moves:
        if o.absent and not free[q] and gain(t, o) == 0 and mask[t] & ~(o.clear | o.add):
            raise KeyRegisterError("a key test where the next state needs keys too")
    return tuple(0 if free[q] else mask[q] for q in range(p.num_states))


class KeyOpConflictError(KeyRegisterError):
    """A byte can be read both with and without a key-register op (or with two), e.g. where a JSON
    object that records its keys and one that does not are both still possible."""


def _key_ops(t: np.ndarray, delta: np.ndarray, op_cols: dict, call_cols):
    """Moves key-op symbol transitions onto the bytes read after them (``delta`` updated in place).

    A state with op transitions reads byte ``b`` either by its own shift or through its ops (composed
    along a chain of them) and the shift after them; more than one way is a :class:`KeyOpConflictError`,
    except ways to the same state whose ops differ only in the keys they need (objects of a union that
    may both close): one op needing either (:func:`~jaxsample.structured.automaton.either`).
    Returns ``(op, ops)``: ``int32[Q, K]`` indices into the ops (0: none), or ``(None, (KeyOp(),))``.
    """
    if not op_cols:
        return None, (KeyOp(),)
    cols = np.fromiter(op_cols, np.int64)
    col_ops = [op_cols[c] for c in cols.tolist()]
    has = (t[:, cols] != 0).any(axis=1)
    calls = (t[:, list(call_cols)] != 0).any(axis=1) if call_cols else np.zeros(t.shape[0], bool)
    direct = delta.copy()
    memo: dict[int, list] = {}

    def through(q: int, path: tuple = ()) -> list:
        """Per byte class: ``(target, op)`` reached from ``q`` through its op transitions (``None``: none)."""
        if q in memo:
            return memo[q]
        if q in path:
            raise GrammarError("key register ops loop without reading a byte")
        out = [None] * delta.shape[1]
        for c, o in zip(cols.tolist(), col_ops):
            x = int(t[q, c])
            if not x:
                continue
            if calls[x]:
                raise KeyRegisterError("a key register op right before a call is not supported")
            reach = [(int(direct[x, b]), KeyOp()) if direct[x, b] else None for b in range(delta.shape[1])]
            if has[x]:
                for b, got in enumerate(through(x, path + (q,))):
                    if got is not None:
                        if reach[b] is not None:
                            raise KeyOpConflictError(_conflict(b))
                        reach[b] = got
            for b, got in enumerate(reach):
                if got is None:
                    continue
                both = compose(o, got[1])
                if both is not None and out[b] is not None:
                    merged = either(out[b][1], both) if out[b][0] == got[0] else None
                    if merged is None:
                        raise KeyOpConflictError(_conflict(b))
                    both = merged
                if both is not None:
                    out[b] = (got[0], both)
        memo[q] = out
        return out

    op = np.zeros(delta.shape, np.int32)
    ids = {KeyOp(): 0}
    for q in np.flatnonzero(has).tolist():
        for b, got in enumerate(through(q)):
            if got is None:
                continue
            if direct[q, b]:
                raise KeyOpConflictError(_conflict(b))
            delta[q, b] = got[0]
            op[q, b] = ids.setdefault(got[1], len(ids))
    return op, _dense(tuple(ids))


def _dense(ops: tuple) -> tuple:
    """The ops over the bits they test or set, numbered from 0 in order (others are never set)."""
    used = 0
    for o in ops:
        used |= functools.reduce(operator.or_, [p | a for p, a in o.requirement()]) | o.add
    bits = [i for i, c in enumerate(reversed(bin(used))) if c == "1"]
    position = {i: j for j, i in enumerate(bits)}

    def dense(mask: int) -> int:
        out, mask = 0, mask & used  # bits never tested or set (a clear of them) are dropped
        while mask:
            low = mask & -mask
            out |= 1 << position[low.bit_length() - 1]
            mask ^= low
        return out

    return tuple(KeyOp(dense(o.absent), dense(o.present), dense(o.clear), dense(o.add),
                       tuple((dense(p), dense(a)) for p, a in o.either)) for o in ops)  # fmt: skip


def _conflict(b: int) -> str:
    return f"a byte (class {b}) can be read with two different key-register ops (or with and without one)"


def _reaches(delta: np.ndarray, enter: np.ndarray, starts, op: np.ndarray) -> bool:
    """Whether a state reachable from ``starts`` by shifts and entered calls reads a byte with a key op."""
    seen = np.zeros(delta.shape[0], bool)
    todo = [s for s in starts if s]
    seen[todo] = True
    while todo:
        q = todo.pop()
        if op[q].any():
            return True
        for x in set(delta[q].tolist()) | set(enter[q].tolist()):
            if x and not seen[x]:
                seen[x] = True
                todo.append(x)
    return False


def _byte_name(byte_class, b: int) -> str:
    members = np.flatnonzero(byte_class == b)
    return repr(bytes([int(members[0])]))


def _membership(p: Pushdown, calls, rule_start) -> np.ndarray:
    """``bool[n_rules, Q]``: states each rule's start reaches by shifts and returns from its calls."""
    ret_of = {}
    for q, _, ret in calls:
        ret_of.setdefault(q, []).append(ret)
    out = np.zeros((len(rule_start), p.num_states), bool)
    for i, s in enumerate(rule_start):
        if not s:
            continue
        seen = out[i]
        seen[s] = True
        frontier = np.array([s])
        while frontier.size:  # breadth first, a layer at a time
            nxt = [p.delta[frontier].ravel()] + [np.asarray(ret_of[q]) for q in frontier.tolist() if q in ret_of]
            nxt = np.unique(np.concatenate(nxt))
            frontier = nxt[~seen[nxt]]
            seen[frontier] = True
        seen[0] = False  # the dead state
    return out


def _check_returns(p: Pushdown, calls, rule_start, member, names):
    """Refuses grammars where a byte could both continue a rule and return from it, and grammars where
    one byte could return through an unbounded number of frames (the device bounds returns per token).

    ``follow[r]``: byte classes that may follow rule ``r`` where it returns (over all call sites).
    """
    k = p.delta.shape[1]
    closed = p.closed
    first = (p.delta != 0) | (p.enter != 0)  # [Q, K]
    follow = np.zeros((len(rule_start), k), bool)

    def follow_of(q):
        rows = member[:, q]
        return follow[rows].any(axis=0) if rows.any() else np.zeros(k, bool)

    changed = True
    while changed:
        changed = False
        for q, r, ret in calls:
            add = follow_of(q) if closed[ret] else first[ret] | (follow_of(ret) if p.accept[ret] else False)
            new = follow[r] | add
            if not np.array_equal(new, follow[r]):
                follow[r] = new
                changed = True
    for q in np.flatnonzero(p.accept & ~closed).tolist():
        clash = first[q] & follow_of(q)
        if q != p.bottom and clash.any():
            rule = names[int(np.flatnonzero(member[:, q])[0])]
            raise GrammarError(
                f"rule {rule!r} can either go on or end before byte {_byte_name(p.byte_class, int(np.argmax(clash)))} "
                "(a deterministic pushdown automaton cannot decide; make the end of the rule explicit)"
            )
    # lazy returns through several frames: call sites whose return state may end but go on
    open_sites = [(q, r, ret) for q, r, ret in calls if p.accept[ret] and not closed[ret]]
    tail = {i: {i} for i in range(len(rule_start))}
    changed = True
    while changed:
        changed = False
        for q, r, ret in calls:
            if closed[ret]:
                for i in np.flatnonzero(member[:, q]).tolist():
                    for j in list(tail.values()):
                        if i in j and r not in j:
                            j.add(r)
                            changed = True
    edges = {
        s: [t for t, (_, rt, _) in enumerate(open_sites) if any(member[i, open_sites[s][0]] for i in tail[rt])]
        for s in range(len(open_sites))
    }
    state = {}

    def visit(s):
        state[s] = 1
        for t in edges[s]:
            if state.get(t) == 1 or (t not in state and visit(t)):
                return True
        state[s] = 2
        return False

    for s in edges:
        if s not in state and visit(s):
            raise GrammarError(
                f"rule {names[open_sites[s][1]]!r} is called where the caller may itself end, recursively: "
                "one byte could return through any number of calls (make the end of the rule explicit)"
            )


def _need(p: Pushdown, calls, rule_start) -> np.ndarray:
    """Least stack room to finish the current rule from each state.

    Level by level: the states that finish within room ``k`` are those reaching acceptance through
    shifts and calls whose callee finishes within ``k - 1`` (``k`` for a tail call: it pushes nothing).
    """
    big = np.iinfo(np.int32).max // 4
    need = np.full(p.num_states, big, np.int64)
    if not calls:
        q_, r_, ret_ = np.zeros((3, 0), np.int64)
    else:
        q_, r_, ret_ = (np.array(x, np.int64) for x in zip(*calls))
    start = np.asarray(rule_start, np.int64)[r_] if len(calls) else q_
    tail = p.closed[ret_]
    pstart, pedge = predecessors(p.delta)
    k_cols = p.delta.shape[1]
    done = np.zeros(p.num_states, bool)
    for k in range(p.num_states + 1):
        before = done.copy()
        inside = done | p.accept
        inside[0] = False
        frontier = np.flatnonzero(inside & ~done)
        while True:
            usable = np.where(tail, inside[start], before[start]) & (start > 0) & inside[ret_] & ~inside[q_]
            new = [q_[usable]]
            if frontier.size:
                e, _ = _gather(pstart, pedge, frontier)
                new.append(e // k_cols)
            new = np.unique(np.concatenate(new))
            new = new[~inside[new] & (new != 0)]
            if new.size == 0:
                break
            inside[new] = True
            frontier = new
        need[inside & ~done] = k
        done = inside
        if np.array_equal(done, before) and k:
            break
    return need
