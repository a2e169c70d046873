"""The table build's parts against brute force: trie walk (quotient tries, expansions, merged walkers),
incremental minimisation, row deduplication, vocabulary tries."""

import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import automaton as am
from jaxsample.structured import minimise as mn
from jaxsample.structured import tokens, trie, walk
from jaxsample.structured.json_schema import schema_expr
from jaxsample.structured.regex import parse_regex
from tests._structured_vocab import bpe_vocab, sentencepiece_vocab


def _check_against_bytes(dfa, vocab, g, paths=6, steps=30, seed=0):
    """Walk random token paths; at each step the allowed set equals the byte DFA's live tokens."""
    text = {i: b for i, b in enumerate(vocab.token_bytes) if b}
    ids = np.array(list(text))
    rng = np.random.default_rng(seed)
    for _ in range(paths):
        s, b = g.start, dfa.start
        for _ in range(steps):
            expect = np.zeros(vocab.size, bool)
            expect[ids] = [dfa.run(text[i], b) != 0 for i in ids]
            expect[list(vocab.eos_ids)] = dfa.accept[b]
            allowed = g.allowed(s)
            if g.num_states == dfa.num_states:  # same states: results must agree exactly, not only liveness
                np.testing.assert_array_equal(allowed, expect)
            else:
                assert not (allowed & ~expect).any()
            choice = np.flatnonzero(allowed & ~np.isin(np.arange(vocab.size), vocab.eos_ids))
            if choice.size == 0:
                break
            t = int(rng.choice(choice))
            s, b = g.advance(s, t), dfa.run(text[t], b)


@pytest.mark.parametrize(
    "expr",
    [
        schema_expr({"type": "object", "properties": {"a": {"type": "string", "maxLength": 12},
                     "b": {"type": "string", "format": "email"}}, "required": ["a"]}),  # fmt: skip
        schema_expr({"type": "array", "items": {"type": "string"}, "maxItems": 3}, whitespace="free"),
        parse_regex(r"[^\n]{0,30}\n(é|ж|😀|[a-z])+"),
    ],
    ids=["counted-strings", "free-ws-array", "multibyte"],
)
def test_quotient_walks_match_the_byte_dfa(expr, request, monkeypatch):
    """String bodies walk quotient tries (with escapes: exact first byte) and expand at the closing quote."""
    monkeypatch.setattr(walk, "HEAVY_NODES", 64)  # the test vocabulary is small: use quotients more eagerly
    monkeypatch.setattr(walk, "HEAVY_SHARE", 1 / 256)
    vocab = bpe_vocab()
    dfa = am.compile_expr(expr)
    index = trie.vocab_index(vocab)
    plan = walk.plan(dfa.delta, dfa.byte_class, index)
    assert plan.modes, "the test must exercise quotient walks"
    if request.node.callspec.id == "counted-strings":  # escapes inside strings: first byte exact
        assert any(m.quotient.exact_depth for m in plan.modes)
    g = tokens.build(dfa, vocab)
    assert g.num_states == dfa.num_states  # every byte is a token: no token-level trimming
    # exact: every (state, token) result equals the byte DFA's run
    text = {i: b for i, b in enumerate(vocab.token_bytes) if b}
    rng = np.random.default_rng(1)
    for s in rng.choice(np.arange(1, dfa.num_states), size=min(40, dfa.num_states - 1), replace=False):
        got = g.next[s][g.class_of]
        for i in rng.choice(list(text), size=300, replace=False):
            assert got[i] == dfa.run(text[i], int(s)), (s, text[i])
    _check_against_bytes(dfa, vocab, g)


def test_walkers_merge_and_keep_their_origins():
    """Whitespace variants reach the same (state, node): one walker, every origin gets its results."""
    vocab = bpe_vocab()
    dfa = am.compile_expr(schema_expr({"type": "array", "items": {"type": "integer"}}, max_whitespace=6))
    index = trie.vocab_index(vocab)
    plan = walk.plan(dfa.delta, dfa.byte_class, index)
    w = walk.walk(dfa.delta, dfa.byte_class, index, plan)
    o, u, t = w.fine
    text = [index.strings[k] for k in u]
    assert all(dfa.run(b, int(s)) == int(n) for s, b, n in zip(o, text, t))
    # completeness: every live (origin, string) pair of a few origins is listed
    for s in (1, 2, 3):
        live = {k for k, b in enumerate(index.strings) if dfa.run(b, s) != 0}
        listed = set(u[o == s].tolist())
        for m, (mo, term, _) in zip(plan.modes, w.coarse):
            listed |= {k for k in range(len(index.strings)) if m.quotient.string_terminal[k] in set(term[mo == s].tolist())}
        assert listed == live


def test_vocabularies_missing_bytes_are_trimmed_and_minimised():
    pieces = ["<eos>", "ab", "abc", "b", "c", "ba", "cc"]  # no "a": a lone "a" cannot be spelled
    v = st.Vocabulary.from_pieces(pieces, kind="raw", special_ids=[0], eos_ids=[0])
    dfa = am.compile_expr(parse_regex("(ab|a)c*|b"))
    g = tokens.build(dfa, v)
    assert g.allowed(g.start).tolist() == [False, True, True, True, False, False, False]
    s = g.walk([1])  # "ab": then c* or end
    assert g.allowed(s).tolist() == [True, False, False, False, True, False, True]
    assert g.walk([2, 4, 6]) == s  # "abc" "c" "cc" loops in the same (minimised) state


def _random_dfa(rng, n, k, p_dead=0.2, p_accept=0.3):
    delta = np.where(rng.random((n, k)) < p_dead, 0, rng.integers(1, n, size=(n, k)))
    delta[0] = 0
    accept = rng.random(n) < p_accept
    accept[0] = False
    return delta, accept


def _language_sample(delta, accept, start, strings):
    out = []
    for w in strings:
        s = start
        for c in w:
            s = delta[s, c]
        out.append(bool(accept[s]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_incremental_minimisation_matches_plain_moore(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    delta, accept = _random_dfa(rng, 60, 3)
    accept[rng.integers(1, 60)] = True
    trimmed = mn.trim(delta, accept, 1)
    assert trimmed is not None
    d2, a2, s2 = mn._moore(*trimmed)
    monkeypatch.setattr(mn, "_moore_blocks", None)  # the incremental refinement must succeed on its own
    d1, a1, s1 = mn.minimise(*trimmed)
    assert d1.shape == d2.shape  # same number of states (the minimal DFA is unique)
    strings = [rng.integers(0, 3, size=rng.integers(0, 12)) for _ in range(400)]
    ref = _language_sample(delta, accept, 1, strings)
    assert _language_sample(d1, a1, s1, strings) == ref == _language_sample(d2, a2, s2, strings)
    # a counter chain needs one round per link
    n = 300
    chain = np.zeros((n + 2, 2), np.int64)
    chain[1 : n + 1, 0] = np.arange(2, n + 2)
    acc = np.zeros(n + 2, bool)
    acc[n + 1] = True
    d, a, s = mn.minimise(*mn.trim(chain, acc, 1))
    assert d.shape[0] == n + 2


@pytest.mark.parametrize("seed", range(8))
def test_small_rounds_in_python_give_the_numpy_rounds_result(seed, monkeypatch):
    """Refinement rounds with few dirty states run in Python (``SMALL_ROUND``): the minimal DFA is the
    one of numpy rounds only, entry for entry, on random tables and on counter chains with branches."""
    rng = np.random.default_rng(seed)
    if seed % 2:
        n = 120  # a chain (one round per link) with random side exits into a second chain
        delta = np.zeros((2 * n + 2, 3), np.int64)
        delta[1:n, 0] = np.arange(2, n + 1)
        delta[n + 1 : 2 * n, 0] = np.arange(n + 2, 2 * n + 1)
        side = rng.choice(np.arange(1, n), 20, replace=False)
        delta[side, 1] = rng.integers(n + 1, 2 * n + 1, 20)
        delta[1, 2], accept = n + 1, np.zeros(2 * n + 2, bool)
        accept[[n, 2 * n]] = True
    else:
        delta, accept = _random_dfa(rng, 90, 3, p_dead=0.3)
        accept[rng.integers(1, 90)] = True
    trimmed = mn.trim(delta, accept, 1)
    monkeypatch.setattr(mn, "_moore_blocks", None)  # each refinement must succeed on its own
    out = []
    for small in (-1, 10**9, mn.SMALL_ROUND):  # numpy rounds only, Python rounds only, the default
        monkeypatch.setattr(mn, "SMALL_ROUND", small)
        out.append(tuple(x.tolist() if hasattr(x, "tolist") else x for x in mn.minimise(*trimmed)))
    assert out[0] == out[1] == out[2]


@pytest.mark.parametrize("seed", range(6))
def test_coreachable_is_plain_backward_search(seed):
    """``coreachable`` (levels of one state read as one slice, edges into the dead state left out of
    ``predecessors``) against a plain search, on random tables and on chains with side branches."""
    rng = np.random.default_rng(seed)
    delta, _ = _random_dfa(rng, 200, 4, p_dead=[0.5, 0.8, 0.95][seed % 3])
    if seed % 2:  # a long chain: one state per level
        delta[1:150, 0] = np.arange(2, 151)
    seeds = np.zeros(200, bool)
    seeds[rng.integers(1, 200, size=1 + seed)] = True
    want = seeds.copy()
    changed = True
    while changed:
        grown = want | want[delta].any(axis=1)
        grown[0] = False
        changed = not np.array_equal(grown, want)
        want = grown
    assert mn.coreachable(delta, seeds).tolist() == want.tolist()


def test_unique_rows_exact_including_sparse_bits():
    rng = np.random.default_rng(0)
    a = np.zeros((300, 200), bool)
    a[np.arange(300), rng.integers(0, 200, 300)] = True  # single bits: a plain weighted sum collides
    a[::7] = a[3]
    first, inv = mn.unique_rows(a)
    np.testing.assert_array_equal(a[first][inv], a)
    assert len(first) == len({r.tobytes() for r in a})
    assert list(first) == sorted(first)  # first-occurrence order
    b = rng.integers(-3, 5, size=(500, 7))
    b[::5] = b[1]
    first, inv = mn.unique_rows(b)
    np.testing.assert_array_equal(b[first][inv], b)
    assert len(first) == len(np.unique(b, axis=0))


@pytest.mark.parametrize("seed", range(6))
def test_unique_columns_is_unique_rows_of_the_transpose(seed):
    # Token tables deduplicate their class columns in place (no transposed read): the same groups,
    # order and inverse as unique_rows of the transpose, on the float hash and on the modular one
    # (entries too large for an exact float sum), with empty and single-line tables.
    rng = np.random.default_rng(seed)
    for shape in [(0, 3), (3, 0), (1, 1), (5, 9), (300, 40)]:
        a = rng.integers(-2, 4, size=shape).astype(np.int32)
        if shape[1] > 4:
            a[:, 1::3] = a[:, :1]
            a[:, -1] = a[:, 2]
        for table in (a, a.astype(np.int64) * (2**40 if seed % 2 else 1)):
            got, want = mn.unique_columns(table), mn.unique_rows(table.T)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def test_vocabulary_trie_and_quotients():
    vocab = bpe_vocab()
    index = trie.vocab_index(vocab)
    assert trie.vocab_index(vocab) is index  # cached per vocabulary
    t = index.trie
    for u in range(0, len(index.strings), 37):  # every string ends at its node
        n = 0
        for b in index.strings[u]:
            kids = np.arange(t.first[n], t.first[n] + t.count[n])
            n = int(kids[t.label[kids] == b][0])
        assert index.end[u] == n and t.term[n] == u
    blocks = np.zeros(256, np.int64)
    blocks[ord('"')], blocks[ord("\\")] = 1, 2
    for exact in (0, 1):
        q = index.quotient(blocks, exact)
        assert index.quotient(blocks, exact) is q
        for u in range(0, len(index.strings), 41):
            s = index.strings[u]
            m = 0
            for d, b in enumerate(s):
                kids = np.arange(q.trie.first[m], q.trie.first[m] + q.trie.count[m])
                letter = b if d < exact else q.blocks[b]
                m = int(kids[q.trie.label[kids] == letter][0])
            assert q.of_byte_node[index.end[u]] == m and q.string_terminal[u] == q.terminal[m] >= 0
            assert index.end[u] in q.members[q.members_start[m] : q.members_start[m + 1]]
        assert q.trie.size < t.size


def test_suffix_ids_subtree_ranges_and_chain_sizes_by_brute_force():
    """``suffixes``: equal ids exactly for equal suffixes, ``first`` at an occurrence of its id;
    ``subtree``: the strings below a node are those starting with its bytes; ``chains``' hit ranges
    list the tokens on each unary path (checked against a walk down the path)."""
    index = trie.VocabIndex(bpe_vocab().token_bytes)
    flat, offset, suffix, first = index.suffixes
    data = index.flat.tobytes()
    ends = np.repeat(offset + index.lengths, index.lengths)
    text = [data[x : ends[x]] for x in range(flat.size)]
    ids: dict = {}
    for x, sfx in enumerate(text):
        assert ids.setdefault(sfx, suffix[x]) == suffix[x], f"suffix {sfx!r} has two ids"
    assert len(ids) == len(set(ids.values())) == first.size  # distinct suffixes, distinct ids
    assert all(suffix[first[i]] == i for i in range(first.size))
    t = index.trie
    lo, hi, depth = index.subtree
    prefix = [b""] * t.size
    for n in range(t.size):  # breadth first: parents before children
        for k in range(t.first[n], t.first[n] + t.count[n]):
            prefix[k] = prefix[n] + bytes([t.label[k]])
    for n in range(1, t.size, 7):
        below = [u for u, s in enumerate(index.strings) if s.startswith(prefix[n])]
        assert (lo[n], hi[n], depth[n]) == (below[0], below[-1] + 1, len(prefix[n]))
    ch = index.chains
    for n in range(0, t.size, 5):
        m, on_path = n, []
        while t.count[m] == 1 and m != ch.end[n]:
            m = int(t.first[m])
            if t.term[m] >= 0:
                on_path.append(m)
        assert m == ch.end[n]
        assert sorted(ch.term_node[ch.hit_lo[n] : ch.hit_hi[n]].tolist()) == sorted(on_path)


def test_quotient_cache_bounds_and_vocabularies(monkeypatch):
    """Quotients are kept per vocabulary: at least ``MAX_QUOTIENTS``, more while under ``MAX_QUOTIENT_BYTES``;
    an evicted partition is rebuilt equal; another vocabulary has its own index and quotients."""
    index = trie.VocabIndex(bpe_vocab().token_bytes)  # a fresh index: an empty cache

    def partition(k):
        blocks = np.zeros(256, np.int64)
        blocks[ord('"')], blocks[ord("\\")], blocks[ord("a") + k] = 1, 2, 3
        return blocks

    first = index.quotient(partition(0))
    size = trie._nbytes(first)
    monkeypatch.setattr(trie, "MAX_QUOTIENTS", 2)
    monkeypatch.setattr(trie, "MAX_QUOTIENT_BYTES", int(3.5 * size))
    for k in range(1, 6):
        index.quotient(partition(k))
    assert 2 < len(index._quotients) <= 4  # the byte budget keeps more than the count floor
    assert index._quotient_bytes == sum(trie._nbytes(q) for q in index._quotients.values()) <= 3.5 * size + size
    again = index.quotient(partition(0))  # evicted (least recently used), rebuilt equal
    assert again is not first
    def arrays(x):
        return [x] if isinstance(x, np.ndarray) else [a for y in x for a in arrays(y)] if isinstance(x, tuple) else []

    assert len(arrays(first)) == len(arrays(again)) > 10
    for a, b in zip(arrays(first), arrays(again)):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(trie, "MAX_QUOTIENT_BYTES", 0)  # only the count floor
    index.quotient(partition(6))
    assert len(index._quotients) == 2
    other = trie.vocab_index(sentencepiece_vocab())
    assert other is not trie.vocab_index(bpe_vocab())
    assert other.quotient(partition(0)).of_byte_node.size == other.trie.size != index.trie.size


def test_regroup_keys_do_not_overflow_int32():
    """Walkers merge only at the same (state, node): the key ``state * nodes + node`` is computed in
    int64. In int32 (the DFA's dtype) state 2**16 at a node of a 2**16-node trie wrapped onto state 0
    at that node (the 32k benchmark vocabulary's trie has 174k nodes: DFAs past ~12k states merged
    walkers of different states and recorded tokens in the wrong state)."""
    n_fine = 1 << 16
    q = np.array([0, 1 << 16], np.int32)
    n = np.array([5, 5], np.int64)
    parent = np.array([0, 1])
    ptr, origin = np.arange(3), np.array([7, 9], np.int32)
    q2, n2, ptr2, origin2 = walk._regroup(parent, q, n, ptr, origin, n_fine)
    assert sorted(zip(q2.tolist(), n2.tolist())) == [(0, 5), (1 << 16, 5)]
    assert ptr2.tolist() == [0, 1, 2] and sorted(origin2.tolist()) == [7, 9]
