"""The subset construction (``automaton._determinise``) against the straightforward one it replaced.

The reference refines every DFA state's classes member edge by member edge, recomputing each NFA
state's epsilon closure and merged edges where it is met; the optimised construction keeps them per
NFA state and reuses a member's refinement of all classes. Both must give the *same* table (same
state numbering, hence byte-identical device tables), on random expression trees and on recursive
grammars' call symbols (several starts and finals).
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from jaxsample.structured import automaton as am


def _reference_determinise(nfa, starts, final, max_states):
    symbol_class, cls_of_mask = am._byte_classes([m for es in nfa.edges for m, _ in es], 256 + len(nfa.rule_index))
    finals = {final} if isinstance(final, int) else set(final)
    k = int(symbol_class.max()) + 1

    def closure(n):
        seen, todo = {n}, [n]
        while todo:
            for t in nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(x for x in seen if nfa.edges[x] or x in finals)

    def edges_of(n):
        merged = {}
        for m, t in nfa.edges[n]:
            c = cls_of_mask[m]
            merged[c] = merged.get(c, frozenset()) | closure(t)
        return list(merged.items())

    def disjoint(es):
        union = 0
        for c, _ in es:
            if union & c:
                return False
            union |= c
        return True

    ids, sets, entries = {frozenset(): 0}, [frozenset()], []
    for start in starts:
        first = closure(start)
        if first not in ids:
            ids[first] = len(sets)
            sets.append(first)
        entries.append(ids[first])
    delta_rows = [np.zeros(k, np.int32)]
    i = 1
    while i < len(sets):
        members = sets[i]
        if len(members) == 1 and edges_of(next(iter(members))) and disjoint(edges_of(next(iter(members)))):
            groups = edges_of(next(iter(members)))
        else:
            groups = [((1 << k) - 1, frozenset())]
            for n in members:
                for mask, targets in edges_of(n):
                    refined = []
                    for g, acc in groups:
                        if g & mask:
                            refined.append((g & mask, acc | targets))
                            if g & ~mask:
                                refined.append((g & ~mask, acc))
                        else:
                            refined.append((g, acc))
                    groups = refined
        row = np.zeros(k, np.int32)
        for g, key in groups:
            if key:
                if key not in ids:
                    assert len(sets) < max_states
                    ids[key] = len(sets)
                    sets.append(key)
                row[[c for c in range(k) if g >> c & 1]] = ids[key]
        delta_rows.append(row)
        i += 1
    accept = np.array([not finals.isdisjoint(s) for s in sets], bool)
    return np.stack(delta_rows), symbol_class, accept, entries


_RANGES = [(0x30, 0x39), (0x61, 0x66), (0x61, 0x7A), (0x22, 0x22), (0x20, 0x7E), (0xE9, 0xE9), (0x3B1, 0x3C9),
           (0x4E00, 0x4E0F), (0x1F600, 0x1F601), (0x00, 0x10FFFF)]  # fmt: skip


def _exprs(rules=()):
    leaf = hs.builds(lambda rs: am.Chars(am.normalise_ranges(rs)), hs.lists(hs.sampled_from(_RANGES), min_size=1, max_size=3))
    if rules:
        leaf = hs.one_of(leaf, hs.sampled_from([am.Call(r) for r in rules]))
    return hs.recursive(leaf, lambda inner: hs.one_of(
        hs.builds(lambda xs: am.seq(*xs), hs.lists(inner, min_size=1, max_size=4)),
        hs.builds(lambda xs: am.alt(*xs), hs.lists(inner, min_size=1, max_size=4)),
        hs.builds(lambda x, lo, extra: am.repeat(x, lo, None if extra < 0 else lo + extra),
                  inner, hs.integers(0, 2), hs.integers(-1, 3)),
    ), max_leaves=14)  # fmt: skip


def _same(nfa, starts, final):
    got = am._determinise(nfa, starts, final, 100_000)
    want = _reference_determinise(nfa, starts, final, 100_000)
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert got[3] == want[3]


@settings(max_examples=150, deadline=None)
@given(expr=_exprs())
def test_subset_construction_is_the_reference_one(expr):
    nfa = am._NFA(100_000)
    final = nfa.new()
    shared = nfa.build(expr, final)
    start = nfa.build(am.alt(am.seq(expr, am.lit("!")), expr), final)  # a subexpression reached twice
    _same(nfa, [start, shared], final)


@settings(max_examples=100, deadline=None)
@given(bodies=hs.lists(_exprs(("r0", "r1")), min_size=2, max_size=2))
def test_subset_construction_with_call_symbols_is_the_reference_one(bodies):
    nfa = am._NFA(100_000, ["r0", "r1"])
    finals, starts = [], []
    for body in bodies:
        finals.append(nfa.new())
        starts.append(nfa.build(body, finals[-1]))
    _same(nfa, starts, set(finals))
