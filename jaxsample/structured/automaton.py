"""Character-level expressions -> byte NFA -> minimised byte DFA (host side, numpy).

Every front end (:mod:`~jaxsample.structured.regex`, :mod:`~jaxsample.structured.json_schema`,
:mod:`~jaxsample.structured.gbnf`) produces the small expression tree defined here, over Unicode
code points. :func:`compile_expr` lowers it to bytes (UTF-8, surrogates excluded, so every accepted
byte string is valid UTF-8), builds a Thompson NFA in continuation-passing style (a subexpression
shared by several parents with the same continuation is built once, which keeps "optional
properties" linear), determinises it over byte equivalence classes and minimises the result.

>>> dfa = compile_expr(seq(lit("a"), star(chars("0-9"))))
>>> dfa.matches(b"a12"), dfa.matches(b"b")
(True, False)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from jaxsample.structured.minimise import minimise, trim, unique_rows

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)

#: Default budgets: compile errors instead of runaway memory (a schema is untrusted input).
MAX_NFA_STATES = 400_000
MAX_DFA_STATES = 60_000


class GrammarError(ValueError):
    """A pattern, schema or grammar that cannot be compiled (syntax, unsupported feature, budget)."""


class EmptyLanguageError(GrammarError):
    """The constraint admits no output at all (or none the vocabulary can spell)."""


class BudgetError(GrammarError):
    """A state budget (``MAX_NFA_STATES``, ``MAX_DFA_STATES``) was exceeded."""


def detached(err: GrammarError) -> GrammarError:
    """``err`` without its traceback and context, to be raised again later: a failed attempt's frames
    (and the automata in them, millions of objects) are then freed at once instead of living on in
    a reference cycle until a full garbage collection, which the next compile would pay for."""
    err.__traceback__ = err.__context__ = err.__cause__ = None
    return err


class NFABudgetError(BudgetError):
    """``MAX_NFA_STATES`` was exceeded: the expression itself is too large (a larger DFA budget
    would not help)."""


# --------------------------------------------------------------------------------------- expressions
# Nodes compare structurally. Front ends share subtrees (an object's rest after each property is one
# node under many parents), so a tree can be far larger than its nodes: each node's hash is
# computed once and kept (``_hash``), so hashing a tree costs its distinct nodes, not its size.
def _cached_hash(self) -> int:
    h = self._hash
    if h is None:
        h = hash((type(self).__name__, *(getattr(self, f) for f in self.__match_args__)))
        object.__setattr__(self, "_hash", h)
    return h


def _reduce(self):  # pickled without the kept hash (string hashes differ between processes)
    return type(self), tuple(getattr(self, f) for f in self.__match_args__)


@dataclass(frozen=True, slots=True)
class Chars:
    """One code point from a union of inclusive ranges ``((lo, hi), ...)``."""

    ranges: tuple[tuple[int, int], ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash
    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Seq:
    """Concatenation."""

    items: tuple
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash
    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Alt:
    """Alternation (``Alt(())`` matches nothing)."""

    items: tuple
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash
    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item{lo,hi}``; ``hi=None`` is unbounded."""

    item: object
    lo: int
    hi: int | None
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    __hash__ = _cached_hash
    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Call:
    """A reference to a rule of a recursive grammar (:class:`~jaxsample.structured.pushdown.Grammar`).

    Compiled to a call of the rule's automaton: the return point goes on the row's stack.
    """

    rule: str


class KeyRegisterError(GrammarError):
    """Key-register ops where the automaton cannot apply them: in a called rule (one register per
    row), right before a call, or in conflict (:class:`~jaxsample.structured.pushdown.KeyOpConflictError`)."""


@dataclass(frozen=True, slots=True)
class KeyOp:
    """A zero-width test and update of a row's *key register* (a bitset, zero at the start).

    Bits in ``absent`` must be clear, bits in ``present`` set and, when ``either`` lists
    ``(present, absent)`` pairs, one of them must hold too, else the path dies; then the bits in
    ``clear`` are cleared and those in ``add`` set. JSON objects use it to record which declared
    properties were written (any order in linear size instead of one state per set of written
    properties); ``either`` is where objects of a union that may both close need different keys
    (see :func:`either`) and where a written key needs others (``dependentRequired``). Only
    :func:`~jaxsample.structured.pushdown.compile_grammar` compiles it: it attaches the op to the
    byte read after it (see :func:`compose` for several on one byte).
    """

    absent: int = 0
    present: int = 0
    clear: int = 0
    add: int = 0
    either: tuple = ()

    def apply(self, register: int) -> int | None:
        """The register after the op, ``None`` if its test fails."""
        if not any(register & p == p and not register & a for p, a in self.requirement()):
            return None
        return (register & ~self.clear) | self.add

    def requirement(self) -> list[tuple[int, int]]:
        """The op's test as alternatives: ``(bits that must be set, bits that must be clear)``."""
        return [(self.present | p, self.absent | a) for p, a in self.either] or [(self.present, self.absent)]


#: Most alternatives an op's ``either`` may list (a byte whose ops would need more: a
#: :class:`KeyRegisterError`, compiled without the register).
MAX_EITHER = 8


def key_test(alternatives, clear: int = 0, add: int = 0) -> KeyOp | None:
    """The op with these effects whose test passes where one of ``alternatives`` (``(bits set,
    bits clear)`` pairs) holds: their common bits as ``present``/``absent``, the rest as ``either``;
    ``None`` if none can hold."""
    alts = sorted({(p, a) for p, a in alternatives if not p & a})
    alts = [(p, a) for p, a in alts if not any((q, b) != (p, a) and q & p == q and b & a == b for q, b in alts)]
    if not alts:
        return None
    if len(alts) > MAX_EITHER:
        raise KeyRegisterError(f"a byte whose key ops need one of more than {MAX_EITHER} sets of keys")
    present = functools.reduce(operator.and_, [p for p, _ in alts])
    absent = functools.reduce(operator.and_, [a for _, a in alts])
    either = tuple((p & ~present, a & ~absent) for p, a in alts) if len(alts) > 1 else ()
    return KeyOp(absent, present, clear, add, either)


def compose(a: KeyOp, b: KeyOp) -> KeyOp | None:
    """The op of ``a`` then ``b`` (``None``: no register passes both)."""
    known, cleared = a.clear | a.add, a.clear & ~a.add  # after ``a``: ``a.add`` set, ``cleared`` clear
    later = [(p & ~known, x & ~known) for p, x in b.requirement() if not (p & cleared or x & a.add)]
    both = [(p | q, x | y) for p, x in a.requirement() for q, y in later]
    return key_test(both, a.clear | b.clear, (a.add & ~b.clear) | b.add)


def either(a: KeyOp, b: KeyOp) -> KeyOp | None:
    """One op passing where ``a`` or ``b`` passes, for two ops with the same effects (``clear``,
    ``add``) that differ in their tests; ``None`` if their effects differ."""
    if (a.clear, a.add) != (b.clear, b.add):
        return None
    return key_test(a.requirement() + b.requirement(), a.clear, a.add)


EPSILON = Seq(())
EMPTY = Alt(())  # matches nothing


def normalise_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sorted, merged, surrogate-free code point ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    cleaned = []
    for lo, hi in out:  # surrogates are not encodable in UTF-8
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            if a <= b:
                cleaned.append((a, b))
    return tuple(cleaned)


def complement(ranges) -> tuple[tuple[int, int], ...]:
    """Every code point not in ``ranges``."""
    out, nxt = [], 0
    for lo, hi in normalise_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return normalise_ranges(out)


def chars(spec: str | Sequence[tuple[int, int]] = (), *, negate: bool = False) -> Chars:
    """A character class; ``spec`` is ``"a-z_"``-style text or explicit ranges."""
    if isinstance(spec, str):
        ranges, i = [], 0
        while i < len(spec):
            if i + 2 < len(spec) and spec[i + 1] == "-":
                ranges.append((ord(spec[i]), ord(spec[i + 2])))
                i += 3
            else:
                ranges.append((ord(spec[i]), ord(spec[i])))
                i += 1
    else:
        ranges = list(spec)
    r = normalise_ranges(ranges)
    return Chars(complement(r) if negate else r)


def lit(text: str):
    """The literal string ``text``."""
    return seq(*(Chars(((ord(c), ord(c)),)) for c in text))


def seq(*items):
    flat = []
    for it in items:
        if it == EMPTY:
            return EMPTY
        flat.extend(it.items if isinstance(it, Seq) else (it,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items):
    flat, seen = [], set()  # (by hash: pairwise comparisons were quadratic in the alternatives)
    for it in items:
        for x in it.items if isinstance(it, Alt) else (it,):
            if x not in seen:
                seen.add(x)
                flat.append(x)
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def repeat(item, lo: int, hi: int | None):
    if hi is not None and hi < lo:
        return EMPTY
    if item == EMPTY:
        return EPSILON if lo == 0 else EMPTY
    if item == EPSILON or hi == 0:
        return EPSILON
    if lo == hi == 1:
        return item
    return Repeat(item, lo, hi)


def opt(item):
    return repeat(item, 0, 1)


def star(item):
    return repeat(item, 0, None)


def plus(item):
    return repeat(item, 1, None)


# ------------------------------------------------------------------------------------------- UTF-8
def _utf8_len(cp: int) -> int:
    return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations encode exactly the code points ``[lo, hi]``."""
    out, stack = [], [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        for b in (0x7F, 0x7FF, 0xFFFF):  # split where the encoded length changes
            if lo <= b < hi:
                stack += [(b + 1, hi), (lo, b)]
                break
        else:
            n = _utf8_len(lo)
            for i in range(1, n):
                m = (1 << (6 * i)) - 1
                if lo & ~m != hi & ~m:
                    if lo & m:
                        stack += [((lo | m) + 1, hi), (lo, lo | m)]
                        break
                    if hi & m != m:
                        stack += [(hi & ~m, hi), (lo, (hi & ~m) - 1)]
                        break
            else:
                a, b = chr(lo).encode("utf-8", "surrogatepass"), chr(hi).encode("utf-8", "surrogatepass")
                out.append(list(zip(a, b)))
    return out


def _mask(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


@functools.lru_cache(maxsize=4096)
def _byte_paths(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], ...]:
    """UTF-8 byte-mask paths (256-bit masks, one per byte) spelling exactly the code points ``ranges``.

    Surrogates (U+D800-DFFF) have no UTF-8 encoding and are left out here, whichever front end
    (literal, regex atom, class, GBNF, JSON ``const``) produced the ranges.
    """
    return tuple(tuple(_mask(a, b) for a, b in seq)
                 for lo, hi in normalise_ranges(ranges) for seq in utf8_sequences(lo, hi))


# --------------------------------------------------------------------------------------------- NFA
class _NFA:
    """Thompson NFA; an edge is ``(symbol mask, target)``: bits 0-255 are bytes, bit ``256 + s`` is
    symbol ``s``: a call of a rule (``call_symbol``) or a :class:`KeyOp` (``op_symbol``), numbered when first built.

    With ``rules`` (a recursive grammar's definitions), a rule gets its index ``i`` when first called
    (``called`` lists them in that order; call :meth:`call_index` on the root first), and a call of
    a rule in ``nullable`` may also be skipped: the automaton enters a rule on a byte, its empty
    match is the caller's own path (``ε | Call(r)``).
    """

    def __init__(self, max_states: int, rules: dict | None = None, nullable: frozenset = frozenset()):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []
        self.max_states = max_states
        self.rules = {} if rules is None else rules
        self.nullable = nullable
        self.called: list[str] = []
        self.rule_index: dict[str, int] = {}
        self.call_symbol: list[int] = []  # rule index -> symbol
        self.op_symbol: dict[KeyOp, int] = {}
        self.symbols = 0
        self._memo: dict = {}

    def call_index(self, rule: str) -> int:
        """The index of ``rule`` (numbered when first called)."""
        i = self.rule_index.get(rule)
        if i is None:
            if rule not in self.rules:
                raise GrammarError(f"rule {rule!r} is called but not defined")
            i = self.rule_index[rule] = len(self.called)
            self.called.append(rule)
            self.call_symbol.append(self.symbols)
            self.symbols += 1
        return i

    def new(self) -> int:
        if len(self.eps) >= self.max_states:
            raise NFABudgetError(
                f"constraint too large: more than {self.max_states} NFA states (lower repetition bounds, "
                "max_whitespace or the recursion depth)"
            )
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node, cont: int) -> int:
        key = (id(node), cont)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        state = self._build(node, cont)
        self._memo[key] = (node, state)
        return state

    def _build(self, node, cont: int) -> int:
        if isinstance(node, Chars):
            entry = self.new()
            for path in _byte_paths(node.ranges):
                cur = entry
                for m in path[:-1]:
                    nxt = self.new()
                    self.edges[cur].append((m, nxt))
                    cur = nxt
                self.edges[cur].append((path[-1], cont))
            return entry
        if isinstance(node, Seq):
            for item in reversed(node.items):
                cont = self.build(item, cont)
            return cont
        if isinstance(node, Alt):
            entry = self.new()
            self.eps[entry] = [self.build(x, cont) for x in node.items]
            return entry
        if isinstance(node, Call):
            skip = self.new() if node.rule in self.nullable else None
            entry = self.new()
            self.edges[entry].append((1 << (256 + self.call_symbol[self.call_index(node.rule)]), cont))
            if skip is None:
                return entry
            self.eps[skip] = [cont, entry]
            return skip
        if isinstance(node, KeyOp):
            s = self.op_symbol.get(node)
            if s is None:
                s = self.op_symbol[node] = self.symbols
                self.symbols += 1
            entry = self.new()
            self.edges[entry].append((1 << (256 + s), cont))
            return entry
        if isinstance(node, Repeat):
            if node.hi is None:
                loop = self.new()
                self.eps[loop] = [self.build(node.item, loop), cont]
                c = loop
            else:
                c = cont
                for _ in range(node.hi - node.lo):
                    e = self.new()
                    self.eps[e] = [self.build(node.item, c), cont]
                    c = e
            for _ in range(node.lo):
                c = self.build(node.item, c)
            return c
        if hasattr(node, "build_nfa"):  # a leaf that builds itself (dfa_ops.Automaton)
            return node.build_nfa(self, cont)
        raise TypeError(f"not an expression node: {node!r}")


_DFA_SCALE = contextvars.ContextVar("dfa_budget_scale", default=1.0)


@contextlib.contextmanager
def dfa_budget_scaled(factor: float):
    """Within the block (this thread or task), the default ``MAX_DFA_STATES`` budget times ``factor``."""
    token = _DFA_SCALE.set(factor)
    try:
        yield
    finally:
        _DFA_SCALE.reset(token)


def budgets(max_nfa_states: int | None, max_dfa_states: int | None) -> tuple[int, int]:
    """The state budgets, ``None`` meaning the module's current ``MAX_NFA_STATES`` / ``MAX_DFA_STATES``
    (the latter scaled within :func:`dfa_budget_scaled`)."""
    return (MAX_NFA_STATES if max_nfa_states is None else max_nfa_states,
            int(MAX_DFA_STATES * _DFA_SCALE.get()) if max_dfa_states is None else max_dfa_states)  # fmt: skip


# --------------------------------------------------------------------------------------------- DFA
class ByteDFA(NamedTuple):
    """A byte-level DFA. State 0 is the absorbing dead state.

    Attributes:
      delta: ``int32[S, K]`` next state per byte class.
      byte_class: ``int32[256]`` class of each byte.
      accept: ``bool[S]``.
      start: the initial state.
    """

    delta: np.ndarray
    byte_class: np.ndarray
    accept: np.ndarray
    start: int

    @property
    def num_states(self) -> int:
        return int(self.delta.shape[0])

    def run(self, data: bytes, state: int | None = None) -> int:
        s = self.start if state is None else state
        for b in data:
            s = int(self.delta[s, self.byte_class[b]])
        return s

    def matches(self, data: bytes) -> bool:
        return bool(self.accept[self.run(data)])


def _byte_classes(masks: list[int], width: int = 256) -> tuple[np.ndarray, dict[int, int]]:
    """Coarsest partition of the ``width`` symbols respecting every mask; mask -> bitset of its class ids.

    Classes are numbered by their first symbol.
    """
    distinct = sorted(set(masks))
    if not distinct:
        return np.zeros(width, np.int32), {}
    n_bytes = -(-width // 8)
    raw = np.frombuffer(b"".join(m.to_bytes(n_bytes, "little") for m in distinct), np.uint8)
    bits = np.unpackbits(raw.reshape(len(distinct), n_bytes), axis=1, bitorder="little")[:, :width].astype(bool)
    _, byte_class = unique_rows(np.ascontiguousarray(bits.T))
    byte_class = byte_class.astype(np.int32)
    member = np.zeros((len(distinct), int(byte_class.max()) + 1), bool)
    member[np.nonzero(bits)[0], byte_class[np.nonzero(bits)[1]]] = True
    packed = np.packbits(member, axis=1, bitorder="little")
    classes = {m: int.from_bytes(packed[i].tobytes(), "little") for i, m in enumerate(distinct)}
    return byte_class, classes


def _determinise(nfa: _NFA, starts: Sequence[int], final: int | set, max_states: int):
    """Subset construction over symbol classes from each of ``starts``: ``(delta, symbol_class, accept, entries)``.

    Per DFA state, the classes are split into groups reached by the same member edges (bitsets of
    classes): when the members' edges have pairwise disjoint bitsets once equal ones are merged (the
    usual case: the members of "after ``"``" in an object read different first letters), those are
    the groups, found in one pass over the edges; otherwise the groups are refined edge by edge. A
    member's edges refine all classes the same way wherever it comes first: that refinement is kept
    per NFA state. A group's target set is the union of its edges' targets, taken in edge order (the
    order fixes each set's iteration order, hence the numbering: the same as refining edge by edge).
    A state is accepting when it holds one of the ``final`` NFA states; ``entries`` are the starts'
    DFA states.
    """
    symbol_class, cls_of_mask = _byte_classes([m for es in nfa.edges for m, _ in es], 256 + nfa.symbols)
    finals = {final} if isinstance(final, int) else set(final)
    k = int(symbol_class.max()) + 1
    everything = (1 << k) - 1
    eps, edges = nfa.eps, nfa.edges
    closures: list = [None] * len(eps)
    out_edges: list = [None] * len(eps)  # NFA state -> [(class bitset, target closure)], merged per bitset
    disjoint = [False] * len(eps)  # whether those bitsets are pairwise disjoint
    first_groups: list = [None] * len(eps)  # NFA state -> its edges' refinement of every class

    def closure(n: int) -> frozenset:
        if not eps[n]:
            got = closures[n] = frozenset((n,)) if edges[n] or n in finals else frozenset()
            return got
        seen, todo = {n}, [n]
        while todo:
            for t in eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        got = closures[n] = frozenset(x for x in seen if edges[x] or x in finals)
        return got

    def edges_of(n: int) -> list:
        if len(edges[n]) == 1:
            ((m, t),) = edges[n]
            got = closures[t]
            disjoint[n] = True
            got = out_edges[n] = [(cls_of_mask[m], frozenset() | (closure(t) if got is None else got))]
            return got
        merged: dict[int, frozenset] = {}
        for m, t in edges[n]:
            c = cls_of_mask[m]
            got = closures[t]
            merged[c] = merged.get(c, frozenset()) | (closure(t) if got is None else got)
        union, apart = 0, True
        for c in merged:
            apart = apart and not union & c
            union |= c
        disjoint[n] = apart
        got = out_edges[n] = list(merged.items())
        return got

    def refine(groups: list, es: list) -> list:
        for mask, targets in es:
            refined = []
            add = refined.append
            for g, acc in groups:
                inside = g & mask
                if inside:
                    add((inside, acc | targets))
                    if inside != g:
                        add((g ^ inside, acc))
                else:
                    add((g, acc))
            groups = refined
        return groups

    def merged_groups(members: frozenset) -> list | None:
        """The groups of a DFA state whose members' edges, equal bitsets merged, are disjoint; else None."""
        merged: dict[int, frozenset] = {}
        union = 0
        for n in members:
            es = out_edges[n]
            for c, t in es if es is not None else edges_of(n):
                got = merged.get(c)
                if got is None:
                    if union & c:
                        return None
                    union |= c
                    merged[c] = frozenset() | t
                else:
                    merged[c] = got | t
        return list(merged.items())

    class_index: dict[int, np.ndarray] = {}
    ids: dict[frozenset, int] = {frozenset(): 0}
    sets = [frozenset()]
    entries = []
    for start in starts:
        first = closure(start)
        if first not in ids:
            ids[first] = len(sets)
            sets.append(first)
        entries.append(ids[first])
    rows_of, cols_of, targets_of = [], [], []  # the table, one (state, class group, target) at a time
    i = 1
    while i < len(sets):
        members = sets[i]
        groups = merged_groups(members) if len(members) > 1 else None
        if groups is None:
            for n in members:
                es = out_edges[n]
                if es is None:
                    es = edges_of(n)
                if groups is None:
                    if len(members) == 1 and es and disjoint[n]:  # one NFA state with disjoint edges: its edges are the groups
                        groups = es
                        break
                    groups = first_groups[n]
                    if groups is None:
                        groups = first_groups[n] = refine([(everything, frozenset())], es)
                elif es:
                    groups = refine(groups, es)
        for g, key in groups:
            if not key:
                continue
            j = ids.get(key)
            if j is None:
                if len(sets) >= max_states:
                    raise BudgetError(f"constraint too large: more than {max_states} DFA states")
                j = ids[key] = len(sets)
                sets.append(key)
            idx = class_index.get(g)
            if idx is None:
                idx = class_index[g] = np.array([c for c in range(k) if g >> c & 1], np.int64)
            rows_of.append(i)
            cols_of.append(idx)
            targets_of.append(j)
        i += 1
    delta = np.zeros((len(sets), k), np.int32)
    if rows_of:
        sizes = [c.size for c in cols_of]
        delta[np.repeat(rows_of, sizes), np.concatenate(cols_of)] = np.repeat(targets_of, sizes)
    accept = np.array([not finals.isdisjoint(s) for s in sets], bool)
    return delta, symbol_class, accept, entries


def compile_expr(expr, *, max_nfa_states: int | None = None, max_dfa_states: int | None = None) -> ByteDFA:
    """Minimal byte DFA accepting exactly the UTF-8 encodings of ``expr``'s strings.

    A recursive :class:`~jaxsample.structured.pushdown.Grammar` gives its byte-level pushdown
    automaton instead (:func:`~jaxsample.structured.pushdown.compile_grammar`; it also ``matches``).

    Raises:
      EmptyLanguageError: if ``expr`` matches nothing.
      GrammarError: if a state budget is exceeded.
    """
    from jaxsample.structured import pushdown  # (it builds on this module)

    if isinstance(expr, pushdown.Grammar):
        return pushdown.compile_grammar(expr, max_nfa_states=max_nfa_states, max_dfa_states=max_dfa_states)
    max_nfa_states, max_dfa_states = budgets(max_nfa_states, max_dfa_states)
    nfa = _NFA(max_nfa_states)
    final = nfa.new()
    start = nfa.build(expr, final)
    if nfa.op_symbol:  # key register ops are attached to bytes by the pushdown construction
        return pushdown.compile_grammar(pushdown.Grammar({"root": expr}, "root", 0), max_nfa_states=max_nfa_states,
                                        max_dfa_states=max_dfa_states)  # fmt: skip
    delta, byte_class, accept, (start,) = _determinise(nfa, [start], final, max_dfa_states)
    trimmed = trim(delta, accept, start, reachable=True)
    if trimmed is None:
        raise EmptyLanguageError("the constraint matches no string at all")
    delta, accept, start = minimise(*trimmed)
    return ByteDFA(delta, byte_class, accept, start)


def intersects(a: ByteDFA, b: ByteDFA) -> bool:
    """Whether two DFAs accept a common byte string (product reachability)."""
    seen = {(a.start, b.start)}
    todo = [(a.start, b.start)]
    while todo:
        x, y = todo.pop()
        if a.accept[x] and b.accept[y]:
            return True
        pairs = set(zip(a.delta[x, a.byte_class].tolist(), b.delta[y, b.byte_class].tolist()))
        for p in pairs:
            if p[0] and p[1] and p not in seen:
                seen.add(p)
                todo.append(p)
    return False
