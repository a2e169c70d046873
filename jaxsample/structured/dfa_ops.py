"""Boolean operations on byte DFAs, and a DFA as a leaf of an expression tree (host side, numpy).

Expression trees (:mod:`~jaxsample.structured.automaton`) have no intersection or complement; the
JSON Schema front end needs both (``pattern`` with ``maxLength``, keys of additional properties
that are none of the declared names and match no ``patternProperties`` pattern, ``multipleOf``).
They are computed here on minimal byte DFAs (product construction over joint byte classes, then
trimming and minimisation) and put back into a tree as an :class:`Automaton` leaf, which the NFA
builder embeds state for state.

>>> from jaxsample.structured.automaton import compile_expr, chars, lit, repeat, star, seq
>>> words = compile_expr(star(chars("a-z")))
>>> short = compile_expr(repeat(chars("a-z"), 0, 3))
>>> d = intersect(words, difference(short, compile_expr(lit("ab"))))
>>> [d.matches(w) for w in (b"", b"abc", b"ab", b"abcd")]
[True, True, False, False]
>>> compile_expr(seq(lit("<"), Automaton.of(d), lit(">"))).matches(b"<xy>")
True
"""

from __future__ import annotations

import numpy as np

from jaxsample.structured.automaton import ByteDFA, BudgetError, EmptyLanguageError, GrammarError, budgets
from jaxsample.structured.minimise import minimise, trim

EMPTY_DFA = ByteDFA(np.zeros((2, 1), np.int32), np.zeros(256, np.int32), np.zeros(2, bool), 1)


def _product(a: ByteDFA, b: ByteDFA, accept_both, b_total: bool, max_states: int | None) -> ByteDFA:
    """Reachable product of ``a`` and ``b``; ``b_total``: ``b``'s dead state 0 is a live sink (complement);
    ``max_states`` ``None``: the current DFA budget (:func:`~jaxsample.structured.automaton.budgets`)."""
    max_states = budgets(None, max_states)[1]
    _, joint = np.unique(a.byte_class.astype(np.int64) * (int(b.byte_class.max()) + 1) + b.byte_class,
                         return_inverse=True)  # fmt: skip
    joint = joint.reshape(256).astype(np.int32)
    k = int(joint.max()) + 1
    rep = np.zeros(k, np.int64)
    rep[joint] = np.arange(256)
    ca, cb = a.byte_class[rep], b.byte_class[rep]
    ids = {(a.start, b.start): 1}
    pairs = [(0, 0), (a.start, b.start)]
    rows = [np.zeros(k, np.int32)]
    i = 1
    while i < len(pairs):
        x, y = pairs[i]
        nx, ny = a.delta[x, ca], b.delta[y, cb]
        row = np.zeros(k, np.int32)
        for c in range(k):
            p = (int(nx[c]), int(ny[c]))
            if p[0] == 0 or (p[1] == 0 and not b_total):
                continue
            j = ids.get(p)
            if j is None:
                if len(pairs) >= max_states:
                    raise BudgetError(f"constraint too large: more than {max_states} DFA states (product)")
                j = ids[p] = len(pairs)
                pairs.append(p)
            row[c] = j
        rows.append(row)
        i += 1
    px = np.array([p[0] for p in pairs])
    py = np.array([p[1] for p in pairs])
    accept = accept_both(a.accept[px], b.accept[py]) & (px > 0)
    trimmed = trim(np.stack(rows), accept, 1)
    if trimmed is None:
        return EMPTY_DFA
    delta, accept, start = minimise(*trimmed)
    return ByteDFA(delta, joint, accept, start)


def intersect(a: ByteDFA, b: ByteDFA, *, max_states: int | None = None) -> ByteDFA:
    """Minimal DFA of the byte strings both accept (possibly empty: check :func:`is_empty`)."""
    return _product(a, b, np.logical_and, False, max_states)


def difference(a: ByteDFA, b: ByteDFA, *, max_states: int | None = None) -> ByteDFA:
    """Minimal DFA of the byte strings ``a`` accepts and ``b`` does not."""
    return _product(a, b, lambda x, y: x & ~y, True, max_states)


def is_empty(d: ByteDFA) -> bool:
    return not bool(d.accept.any())


def is_finite(d: ByteDFA) -> bool:
    """Whether the (trimmed, minimal) DFA accepts finitely many strings (no cycle among live states)."""
    live = d.delta.copy()
    indeg = np.zeros(d.num_states, np.int64)
    for s in range(1, d.num_states):
        for t in set(live[s].tolist()) - {0}:
            indeg[t] += 1
    order = [s for s in range(1, d.num_states) if indeg[s] == 0]
    seen = 0
    while order:
        s = order.pop()
        seen += 1
        for t in set(live[s].tolist()) - {0}:
            indeg[t] -= 1
            if indeg[t] == 0:
                order.append(t)
    return seen == d.num_states - 1


class Automaton:
    """Expression leaf standing for a byte DFA's language (see the module docstring).

    Compared by identity (two leaves are equal only if they are the same object), so
    :func:`~jaxsample.structured.automaton.alt` never merges different automata.
    """

    __slots__ = ("dfa", "_edges")

    def __init__(self, dfa: ByteDFA):
        self.dfa = dfa
        self._edges = None

    @classmethod
    def of(cls, dfa: ByteDFA):
        """The leaf, or :data:`~jaxsample.structured.automaton.EMPTY` when ``dfa`` accepts nothing."""
        from jaxsample.structured.automaton import EMPTY, EPSILON

        if is_empty(dfa):
            return EMPTY
        if dfa.num_states == 2 and dfa.accept[dfa.start] and not dfa.delta[dfa.start].any():
            return EPSILON
        return cls(dfa)

    def edges(self) -> list[tuple[int, int, int]]:
        """``(state, byte mask, target)`` per live transition, by state then target (computed once)."""
        if self._edges is None:
            d = self.dfa
            targets = d.delta[1:, d.byte_class].astype(np.int64)  # [S-1, 256], rows from state 1
            keys, inverse = np.unique((np.arange(1, d.num_states)[:, None] * d.num_states + targets).ravel(),
                                      return_inverse=True)  # fmt: skip
            member = np.zeros((keys.size, 256), bool)
            member[inverse.ravel(), np.tile(np.arange(256), d.num_states - 1)] = True
            packed = np.packbits(member, axis=1, bitorder="little")
            src, dst = np.divmod(keys, d.num_states)
            self._edges = [(s, int.from_bytes(packed[i].tobytes(), "little"), t)
                           for i, (s, t) in enumerate(zip(src.tolist(), dst.tolist())) if t]  # fmt: skip
        return self._edges

    def build_nfa(self, nfa, cont: int) -> int:
        """Adds the DFA's live states to ``nfa`` (byte-mask edges; accepting states step to ``cont``)."""
        d = self.dfa
        node = [0] + [nfa.new() for _ in range(1, d.num_states)]
        for s, mask, t in self.edges():
            nfa.edges[node[s]].append((mask, node[t]))
        for s in np.flatnonzero(d.accept).tolist():
            if s:
                nfa.eps[node[s]].append(cont)
        return node[d.start]


def require_nonempty(d: ByteDFA, what: str) -> ByteDFA:
    if is_empty(d):
        raise EmptyLanguageError(f"{what} matches no string at all")
    return d
