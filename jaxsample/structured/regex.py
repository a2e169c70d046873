"""Regular expressions -> expression trees (then :func:`~jaxsample.structured.automaton.compile_expr`).

The supported syntax is the regular core shared by Python ``re``, ECMAScript and Rust ``regex``:
literals and escapes (``\\n \\t \\r \\f \\v \\0 \\xNN \\uNNNN \\U0010FFFF``, escaped
metacharacters), classes ``[...]``/``[^...]`` with ranges and ``\\d \\w \\s \\D \\W \\S`` (ASCII
meanings, as with ``re.ASCII``), ``.`` (any code point but ``\\n``), groups ``(...)``, ``(?:...)``,
``(?P<name>...)``/``(?<name>...)``, alternation, and the quantifiers ``* + ? {m} {m,} {m,n}``
(lazy/possessive suffixes accepted: they change matching priority, not the language). ``^`` and
``$`` are allowed only at the ends of the pattern. Matching is always *whole string*
(``re.fullmatch``). Anything else (look-arounds, back-references, ``\\b``, ``\\p{..}``, inline
flags) raises :class:`~jaxsample.structured.automaton.GrammarError` naming the construct.

>>> from jaxsample.structured.automaton import compile_expr
>>> compile_expr(parse_regex(r"[a-c]{2}\\d+")).matches(b"ab42")
True
"""

from __future__ import annotations

from jaxsample.structured.automaton import (
    EPSILON,
    MAX_CODE_POINT,
    Chars,
    GrammarError,
    alt,
    complement,
    normalise_ranges,
    repeat,
    seq,
)

_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_CLASS_ESCAPES = {
    "d": _DIGIT,
    "w": _WORD,
    "s": _SPACE,
    "D": complement(_DIGIT),
    "W": complement(_WORD),
    "S": complement(_SPACE),
}
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0, "a": 7, "e": 27}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundary \\b",
    "B": "non-boundary \\B",
    "A": "anchor \\A",
    "Z": "anchor \\Z",
    "z": "anchor \\z",
    "p": "unicode property \\p{...}",
    "P": "unicode property \\P{...}",
    "k": "named back-reference \\k<...>",
}
#: Largest ``{m,n}`` bound accepted (each repetition is a copy of the repeated automaton).
MAX_REPEAT = 10_000


class _Parser:
    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0

    def error(self, msg: str) -> GrammarError:
        return GrammarError(f"regex {self.p!r}: {msg} (at offset {self.i})")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        if self.i >= len(self.p):
            raise self.error("unexpected end of pattern")
        c = self.p[self.i]
        self.i += 1
        return c

    # alternation := concat ('|' concat)*
    def parse_alt(self, depth: int = 0):
        branches = [self.parse_concat(depth)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.parse_concat(depth))
        return alt(*branches)

    def parse_concat(self, depth: int):
        items = []
        while (c := self.peek()) is not None and c not in "|)":
            if c == "^":
                if self.i != 0:
                    raise self.error("'^' is only supported at the start of the pattern")
                self.i += 1
                continue
            if c == "$":
                if self.i != len(self.p) - 1:
                    raise self.error("'$' is only supported at the end of the pattern")
                self.i += 1
                continue
            items.append(self.parse_quantified(depth))
        return seq(*items) if items else EPSILON

    def parse_quantified(self, depth: int):
        atom = self.parse_atom(depth)
        while (c := self.peek()) is not None and c in "*+?{":
            if c == "{":
                bounds = self.parse_braces()
                if bounds is None:
                    break
                lo, hi = bounds
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if self.peek() in ("?", "+"):  # lazy / possessive: same language
                self.i += 1
            atom = repeat(atom, lo, hi)
        return atom

    def parse_braces(self):
        j = self.p.find("}", self.i)
        body = self.p[self.i + 1 : j] if j > 0 else ""
        parts = body.split(",")
        if j < 0 or len(parts) > 2 or not parts[0].strip().isdigit() or (
            len(parts) == 2 and parts[1].strip() and not parts[1].strip().isdigit()
        ):
            if body[:1].isdigit():
                raise self.error(f"malformed repetition {{{body}}}")
            return None  # a literal '{' as in Python re
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1].strip() else None)
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{body}}} has max < min")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repetition bound above {MAX_REPEAT}")
        self.i = j + 1
        return lo, hi

    def parse_atom(self, depth: int):
        c = self.take()
        if c == "(":
            if self.peek() == "?":
                self.i += 1
                k = self.take()
                if k == ":":
                    pass
                elif k == "P" and self.peek() == "<" or k == "<" and self.peek() not in ("=", "!"):
                    end = self.p.find(">", self.i)
                    if end < 0:
                        raise self.error("unterminated group name")
                    self.i = end + 1
                elif k in "=!" or k == "<":
                    raise self.error("look-around assertions are not regular and are not supported")
                elif k == "P" and self.peek() == "=":
                    raise self.error("back-references are not supported")
                else:
                    raise self.error(f"inline flags / group kind '(?{k}' are not supported")
            inner = self.parse_alt(depth + 1)
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.i += 1
            return inner
        if c == ")":
            raise self.error("unbalanced ')'")
        if c == "[":
            return Chars(self.parse_class())
        if c == ".":
            return Chars(complement(((10, 10),)))
        if c == "\\":
            r = self.parse_escape(in_class=False)
            return Chars(r)
        if c in "*+?":
            raise self.error(f"nothing to repeat before {c!r}")
        return Chars(((ord(c), ord(c)),))

    def parse_escape(self, in_class: bool) -> tuple[tuple[int, int], ...]:
        c = self.take()
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _SIMPLE_ESCAPES:
            if c == "0" and (self.peek() or "").isdigit():
                raise self.error("octal escapes are not supported")
            return ((_SIMPLE_ESCAPES[c],) * 2,)
        if c == "b" and in_class:
            return ((8, 8),)
        if c in _UNSUPPORTED_ESCAPES:
            raise self.error(f"{_UNSUPPORTED_ESCAPES[c]} is not supported")
        if c.isdigit():
            raise self.error("back-references are not supported")
        if c in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[c]
            if c in "xu" and self.peek() == "{":
                end = self.p.find("}", self.i)
                digits, self.i = self.p[self.i + 1 : end], end + 1
            else:
                digits, self.i = self.p[self.i : self.i + n], self.i + n
            try:
                cp = int(digits, 16)
            except ValueError:
                raise self.error(f"bad \\{c} escape") from None
            if cp > MAX_CODE_POINT:
                raise self.error("code point out of range")
            return ((cp, cp),)
        if c.isalnum():
            raise self.error(f"unknown escape \\{c}")
        return ((ord(c), ord(c)),)

    def parse_class(self) -> tuple[tuple[int, int], ...]:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "[" and self.peek() == ":":
                raise self.error("POSIX classes [:name:] are not supported")
            if c == "\\":
                r = self.parse_escape(in_class=True)
            else:
                r = ((ord(c), ord(c)),)
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                if len(r) != 1 or r[0][0] != r[0][1]:
                    raise self.error("a class escape cannot start a range")
                self.i += 1
                d = self.take()
                hi = self.parse_escape(in_class=True) if d == "\\" else ((ord(d), ord(d)),)
                if len(hi) != 1 or hi[0][0] != hi[0][1]:
                    raise self.error("a class escape cannot end a range")
                if hi[0][0] < r[0][0]:
                    raise self.error("bad character range")
                r = ((r[0][0], hi[0][0]),)
            ranges.extend(r)
        out = normalise_ranges(ranges)
        return complement(out) if negate else out


def parse_regex(pattern: str):
    """Expression tree of ``pattern`` (whole-string match).

    Raises:
      GrammarError: on a syntax error or an unsupported construct (named in the message).
    """
    if not isinstance(pattern, str):
        raise GrammarError(f"regex must be a str, got {type(pattern).__name__}")
    p = _Parser(pattern)
    expr = p.parse_alt()
    if p.i != len(pattern):
        raise p.error("unbalanced ')'")
    return expr

