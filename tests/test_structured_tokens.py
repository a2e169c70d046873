"""Token-level tables: brute-force agreement with the byte DFA, classes, pruning, EOS, forced tokens."""

import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import automaton as am
from jaxsample.structured import tokens
from jaxsample.structured.json_schema import schema_expr
from jaxsample.structured.regex import parse_regex
from tests._structured_vocab import bpe_vocab, sentencepiece_vocab

CASES = {
    "regex": parse_regex(r"(cat|dog)s?( and (cat|dog)s?){0,3}\."),
    "number": parse_regex(r"-?(0|[1-9][0-9]{0,6})(\.[0-9]{1,4})?"),
    "json": schema_expr(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
         "required": ["name"]}, whitespace="bounded", max_whitespace=3),  # fmt: skip
    "unicode": parse_regex("[é😀ж ]{1,5}"),
}


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def vocab(request):
    return bpe_vocab() if request.param == "bpe" else sentencepiece_vocab()


@pytest.mark.parametrize("case", sorted(CASES))
def test_allowed_sets_equal_brute_force_on_random_paths(case, vocab):
    """A token is allowed iff appending its bytes keeps the output a prefix of an accepted string."""
    dfa = am.compile_expr(CASES[case])
    g = tokens.build(dfa, vocab)
    text_ids = [i for i, b in enumerate(vocab.token_bytes) if b]
    rng = np.random.default_rng(0)
    for _ in range(4):
        s, b = g.start, dfa.start  # all 256 single bytes are tokens: byte-live == token-live
        for _ in range(25):
            allowed = g.allowed(s)
            expect = np.zeros(vocab.size, bool)
            expect[text_ids] = [dfa.run(vocab.token_bytes[i], b) != 0 for i in text_ids]
            expect[list(vocab.eos_ids)] = dfa.accept[b]
            np.testing.assert_array_equal(allowed, expect)
            choice = np.flatnonzero(allowed & ~np.isin(np.arange(vocab.size), vocab.eos_ids))
            if choice.size == 0:
                break
            t = int(rng.choice(choice))
            s, b = g.advance(s, t), dfa.run(vocab.token_bytes[t], b)
            assert g.accept[s] == dfa.accept[b]


def test_classes_partition_and_tables_are_compact():
    g = st.compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}}, bpe_vocab()
    )
    assert g.next.shape == (g.num_states, g.num_classes) and g.class_of.shape == (1200,)
    assert np.all(g.next[:, 0] == 0) and np.all(g.next[0] == 0)  # dead class, dead state
    assert g.num_classes < 120 and g.masks.shape[0] <= g.num_states
    # identical columns were merged: all class columns are distinct
    assert len({tuple(c) for c in g.next.T}) == g.num_classes
    for s in range(g.num_states):
        np.testing.assert_array_equal(np.unpackbits(g.masks[g.mask_id[s]].view(np.uint8), bitorder="little")[:1200] != 0, g.allowed(s))


def test_dead_end_pruning_with_a_vocabulary_missing_bytes():
    v = st.Vocabulary.from_pieces(["<eos>", "a", "c", "d", "ab"], kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_regex("ab|cd|ae", v)  # neither "b" nor "e" is a token: "a" alone is a dead end
    assert g.allowed(g.start).tolist() == [False, False, True, False, True]
    assert g.walk([1]) == 0 and g.allowed(g.walk([2])).tolist() == [False, False, False, True, False]
    with pytest.raises(st.EmptyLanguageError, match="vocabulary"):
        st.compile_regex("e+", v)


def test_dead_end_pruning_removes_tokens_leading_nowhere():
    v = st.Vocabulary.from_pieces(["<eos>", "a", "b", "x"], kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_regex("a(b|yz)|x", v)  # after "a" only "b" works
    assert g.allowed(g.start).tolist() == [False, True, False, True]
    s = g.advance(g.start, 1)
    assert g.allowed(s).tolist() == [False, False, True, False] and g.forced[s] == 2


def test_eos_only_in_accepting_states_and_forced_eos():
    v = bpe_vocab()
    g = st.compile_choice(["yes", "no"], v)
    yes = [i for i, b in enumerate(v.token_bytes) if b in (b"y", b"es", b"yes", b"e", b"s")]
    assert not g.allowed(g.start)[[0, 2]].any()
    s = g.walk([v.token_bytes.index(b"y"), v.token_bytes.index(b"e"), v.token_bytes.index(b"s")])
    assert g.allowed(s)[[0, 2]].all() and g.allowed(s).sum() == 2 and g.forced[s] == -1
    assert yes


def test_forced_tokens_are_the_single_allowed_token():
    v = st.Vocabulary.from_pieces(["<eos>", "{", '"', "k", '{"'], kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_regex('\\{"k"', v)
    for s in range(1, g.num_states):
        allowed = np.flatnonzero(g.allowed(s))
        assert g.forced[s] == (allowed[0] if allowed.size == 1 else -1)
    assert g.forced[g.walk([4, 3])] == 2 and g.forced[g.walk([4, 3, 2])] == 0


def test_special_and_padding_columns_never_allowed():
    v = bpe_vocab(size=1300)
    g = st.compile_regex(".*", v)
    for s in range(1, g.num_states):
        a = g.allowed(s)
        assert not a[1] and not a[1200:].any()


def test_edge_cases_empty_output_and_tiny_vocabularies():
    v = st.Vocabulary.from_pieces(["<eos>", "a"], kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_choice([""], v)  # only the empty output: EOS is forced at once
    assert g.allowed(g.start).tolist() == [True, False] and g.forced[g.start] == 0
    g = st.compile_regex("a*", v)
    assert g.allowed(g.start).tolist() == [True, True] and g.num_states == 2
    assert g.walk([1, 1, 1]) == g.start  # minimised: one state loops
    with pytest.raises(ValueError, match="at least one"):
        st.compile_choice([], v)
    only_eos = st.Vocabulary.from_pieces(["<eos>"], kind="raw", eos_ids=[0])
    with pytest.raises(st.EmptyLanguageError):
        st.compile_regex("a", only_eos)


def test_json_mode_depth():
    g = st.compile_json(bpe_vocab(), max_depth=2, whitespace="compact")
    v = bpe_vocab()
    ids = {b: i for i, b in enumerate(v.token_bytes) if b}
    m = st.Matcher(g)
    assert m.accept_tokens([ids[b"["], ids[b"["], ids[b"]"], ids[b"]"]]) == 4 and m.is_accepting()
    m.reset()
    assert m.accept_tokens([ids[b"["], ids[b"["], ids[b"["]]) == 2  # a third level is masked
    assert m.allowed()[ids[b"]"]] and m.allowed()[ids[b"1"]]  # closing or a scalar is still allowed
