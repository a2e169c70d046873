"""Expression nodes (``automaton.Seq``/``Alt``/``Chars``/``Repeat``): structural equality, hashes kept
per node (front ends share subtrees, so a tree can be exponentially larger than its nodes), and
``alt`` deduplicating alternatives without comparing every pair."""

import pickle
import time

from jaxsample.structured import automaton as am
from jaxsample.structured.automaton import alt, lit, repeat, seq


def _ladder(depth: int):
    """``depth`` levels, each an alternative of two sequences sharing the level below: a tree of 2**depth leaves."""
    node = lit("x")
    for _ in range(depth):
        node = alt(seq(lit("a"), node), seq(lit("b"), node))
    return node


def test_hashing_a_shared_tree_costs_its_nodes_not_its_size():
    start = time.perf_counter()
    a, b = _ladder(40), _ladder(40)  # 2**40 leaves as a tree, ~200 distinct nodes
    assert hash(a) == hash(b)
    assert time.perf_counter() - start < 1.0  # (hashing the tree itself would take hours)
    assert hash(_ladder(3)) != hash(_ladder(4))


def test_alt_deduplicates_without_comparing_every_pair(monkeypatch):
    shared = repeat(am.chars("0-9"), 1, None)
    items = [seq(lit(f'"key{i}":'), shared) for i in range(300)]
    calls = []
    eq = am.Seq.__eq__
    monkeypatch.setattr(am.Seq, "__eq__", lambda x, y: calls.append(1) or eq(x, y))
    copy = seq(lit('"key0":'), shared)  # equal to items[0], another object
    got = alt(*items, *items[:10], copy, alt(*items[5:8]))
    assert got == am.Alt(tuple(items))  # first occurrences, in order
    assert len(calls) <= 10  # pairwise: ~45,000


def test_nodes_stay_equal_hashable_and_picklable():
    x = am.Repeat(seq(lit("ab"), am.Call("rule")), 0, None)
    y = am.Repeat(seq(lit("ab"), am.Call("rule")), 0, None)
    assert x == y and hash(x) == hash(y) and x != am.Repeat(seq(lit("ab"), am.Call("rule")), 1, None)
    assert {x: 1}[y] == 1
    back = pickle.loads(pickle.dumps(x))  # the kept hash is not pickled (string hashes are per process)
    assert back == x and back._hash is None and hash(back) == hash(x)
    assert repr(am.Seq((am.Chars(((97, 97),)),))) == "Seq(items=(Chars(ranges=((97, 97),)),))"
