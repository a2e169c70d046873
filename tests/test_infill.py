"""llama.cpp infill: against a line-by-line Python transcription of ``llama_sampler_infill_apply``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from jaxsample.infill import infill_table, token_pieces
from tests._helpers import CountingJit, assert_single_trace, kept

F32 = np.float32


def llama_infill(cands, pieces, eog_ids, eot):
    """Transcription of llama.cpp ``llama_sampler_infill_apply`` (float32 arithmetic, sequential loops).

    ``cands``: the candidate array as ``[(id, logit)]`` in id order (what a truncating sampler
    leaves). Ties in the sort are broken by id (upstream's ``std::sort`` leaves them unspecified).
    Returns the final ``[(id, logit, p)]``.
    """
    is_eog = set(eog_ids)
    data = [[i, F32(l), F32(0)] for i, l in sorted(cands, key=lambda c: -c[1])]  # softmax_impl(cur_p, true)
    max_l, cum = data[0][1], F32(0)
    for d in data:
        d[2] = F32(np.exp(F32(d[1] - max_l)))
        cum = F32(cum + d[2])
    for d in data:
        d[2] = F32(d[2] / cum)
    p_txt, p_eog = F32(0), F32(0)
    for d in data:
        if d[0] in is_eog:
            p_eog = F32(p_eog + d[2])
        else:
            p_txt = F32(p_txt + d[2])
    if F32(F32(3 * p_eog) * F32(len(data))) > p_txt:
        data = [d for d in data if d[0] in is_eog]
        total = F32(sum(d[2] for d in data))
        return [(i, l, F32(p / total)) for i, l, p in data]
    for i0 in range(len(data)):
        for i1 in range(len(data)):
            if data[i0][1] == -np.inf:
                break
            if i0 == i1 or data[i1][1] == -np.inf:
                continue
            a, b = pieces[data[i0][0]], pieces[data[i1][0]]
            if 0 < len(a) <= len(b) and b[: len(a)] == a:
                dst, src = i0, i1
                if data[i1][2] > data[i0][2]:
                    dst, src = src, dst
                data[dst][2] = F32(data[dst][2] + data[src][2])
                data[src][1], data[src][2] = F32(-np.inf), F32(0)
    kept_, n_non_eog, p_sum = [], 0, F32(0)
    for d in data:
        eog = d[0] in is_eog
        if d[2] < F32(0.2) and not eog:
            continue
        n_non_eog += not eog
        p_sum = F32(p_sum + d[2])
        kept_.append(d)
    if n_non_eog == 0:
        return [(eot, F32(1.0), F32(1.0))]
    for d in kept_:
        d[2] = F32(d[2] / p_sum)
    thold = F32(1.0 / (n_non_eog + 1))
    data, p_sum = [], F32(0)
    for d in kept_:
        if d[2] < thold and d[0] not in is_eog:
            continue
        p_sum = F32(p_sum + d[2])
        data.append(d)
    return [(i, l, F32(p / p_sum)) for i, l, p in data]


def oracle_dense(logits_row, pieces, eog_ids, eot):
    """Runs the transcription on the finite logits of a row; survivors' logits in a dense row."""
    row = np.asarray(logits_row, np.float32)
    cands = [(i, row[i]) for i in range(len(row)) if row[i] > -np.inf]
    out = np.full(len(row), -np.inf, np.float32)
    for i, logit, _ in llama_infill(cands, [p.encode() for p in pieces], eog_ids, eot):
        out[i] = logit
    return out


# ids 0, 1: control EOG tokens (empty pieces); 21: an EOG token with a visible piece; 17: a duplicate "a".
PIECES = ["", "", "a", "ab", "abc", "abd", "b", "ba", "bab", " ", " a", " ab", "c", "cd", "cde", "x", "xy",
          "a", "d", "de", "", "xyz", "q"]
EOG = [0, 1, 21]
TABLE = infill_table(PIECES, EOG, fallback_id=1)
V = len(PIECES)
infill_jit = CountingJit(js.infill)


def test_table_edges_cover_every_prefix_pair():
    edges = set(zip(TABLE.ancestor.tolist(), TABLE.descendant.tolist()))
    expected = {
        (a, d)
        for a in range(V)
        for d in range(V)
        if a != d and PIECES[a] and PIECES[d].startswith(PIECES[a]) and (PIECES[a] != PIECES[d] or a < d)
    }
    assert edges == expected
    assert (2, 17) in edges and (17, 2) not in edges  # identical pieces: the lower id is the ancestor
    assert TABLE.is_eog.tolist() == [i in EOG for i in range(V)] and int(TABLE.fallback) == 1


def test_hand_case_merge_and_thresholds():
    # text: "a" 0.25 -> merged into "ab" 0.3 (0.55); "c" 0.35; "q" 0.1 (< 0.2 dropped); EOG 0.05 total.
    p = np.zeros(V)
    p[[2, 3, 12, 22, 0]] = [0.25, 0.3, 0.35, 0.1, 0.05]
    x = jnp.log(jnp.asarray(p, jnp.float32))
    out = infill_jit(x, TABLE)
    assert np.flatnonzero(kept(out)).tolist() == [0, 3, 12]  # EOG kept, "ab" (0.55), "c" (0.35 >= 1/3)
    np.testing.assert_array_equal(np.asarray(out)[[0, 3, 12]], np.asarray(x)[[0, 3, 12]])


def test_hand_case_second_threshold_drops_weak_survivor():
    # "a"+"ab"+"abc" -> 0.7 in "ab"; "c" 0.25 passes 0.2 but not 1/3 after renormalisation.
    p = np.zeros(V)
    p[[2, 3, 4, 12, 1]] = [0.1, 0.4, 0.2, 0.25, 0.05]
    out = infill_jit(jnp.log(jnp.asarray(p, jnp.float32)), TABLE)
    assert np.flatnonzero(kept(out)).tolist() == [1, 3]


def test_hand_case_eog_dominates():
    # 3 * p_eog * N = 3 * 0.1 * 4 = 1.2 > p_txt = 0.9: only EOG tokens are kept, with their logits.
    p = np.zeros(V)
    p[[2, 6, 12, 0]] = [0.3, 0.3, 0.3, 0.1]
    x = jnp.log(jnp.asarray(p, jnp.float32))
    out = infill_jit(x, TABLE)
    assert np.flatnonzero(kept(out)).tolist() == [0]
    assert float(out[0]) == float(x[0])


def test_hand_case_no_text_left_returns_eot_at_logit_one():
    # 7 unrelated tokens of equal probability 1/7 < 0.2 -> EOT (the fallback) alone, at logit 1.
    ids = [6, 9, 12, 15, 18, 22, 2]  # "b", " ", "c", "x", "d", "q", "a"
    p = np.zeros(V)
    p[ids] = 1.0 / len(ids)
    out = infill_jit(jnp.log(jnp.asarray(p, jnp.float32)), TABLE)
    expected = np.full(V, -np.inf, np.float32)
    expected[1] = 1.0
    np.testing.assert_array_equal(out, expected)


def test_equal_probabilities_prefix_wins_as_upstream():
    # With exactly tied "a" and "ab", upstream merges into the prefix whatever the sort order.
    p = np.zeros(V)
    p[[2, 3, 0]] = [0.45, 0.45, 0.1 / 100]
    out = infill_jit(jnp.log(jnp.asarray(p, jnp.float32)), TABLE)
    assert np.flatnonzero(kept(out)).tolist() == [0, 2]


def _random_rows(seed, n_rows):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, V)) * rng.choice([0.2, 0.5, 1.5, 3.0], size=(n_rows, 1))
    x[:, EOG] += rng.choice([-8.0, -1.5, 0.5], size=(n_rows, 1)) + rng.normal(size=(n_rows, len(EOG)))
    drop = rng.random((n_rows, V)) < rng.choice([0.0, 0.4, 0.8], size=(n_rows, 1))
    x = np.where(drop, -np.inf, x).astype(np.float32)
    x[:, 3] = np.where(np.isfinite(x).any(axis=1), x[:, 3], 0.0)  # at least one candidate per row
    return x


def test_matches_transcription_on_random_rows():
    x = _random_rows(0, 400)
    out = np.asarray(infill_jit(jnp.asarray(x), TABLE))
    branches = {"eog": 0, "fallback": 0, "text": 0, "merged": 0, "rescued": 0}
    related = list(zip(TABLE.ancestor.tolist(), TABLE.descendant.tolist()))
    for row, got in zip(x, out):
        want = oracle_dense(row, PIECES, EOG, 1)
        np.testing.assert_array_equal(got, want, err_msg=f"row {row.tolist()}")
        survivors = np.flatnonzero(got > -np.inf)
        if got[1] == 1.0 and len(survivors) == 1:
            branches["fallback"] += 1
        elif all(i in EOG for i in survivors):
            branches["eog"] += 1
        else:
            branches["text"] += 1
            branches["merged"] += any(row[a] > -np.inf and row[d] > -np.inf for a, d in related)
            p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            branches["rescued"] += any(p[s] < 0.2 for s in survivors if s not in EOG)  # by merged mass
    assert min(branches.values()) >= 5, branches  # every branch of the algorithm is exercised


def _padded_table(pieces, eog, capacity):
    """A table whose edge list is padded with the out-of-range id V (shapes shared across vocabularies)."""
    t = infill_table(pieces, eog)
    pad = capacity - t.ancestor.shape[0]
    fill = jnp.full((pad,), len(pieces), jnp.int32)
    return t._replace(
        ancestor=jnp.concatenate([t.ancestor, fill]), descendant=jnp.concatenate([t.descendant, fill])
    )


def test_matches_transcription_on_random_vocabularies():
    rng = np.random.default_rng(7)
    n_vocab, n_rows, v = 25, 16, 14
    for _ in range(n_vocab):
        pieces = ["".join(rng.choice(list("ab"), size=rng.integers(0, 4))) for _ in range(v)]
        eog = sorted(rng.choice(v, size=rng.integers(1, 3), replace=False).tolist())
        table = _padded_table(pieces, eog, 128)
        x = rng.normal(size=(n_rows, v)) * rng.choice([0.3, 1.0, 3.0], size=(n_rows, 1))
        x[:, eog] -= rng.choice([0.0, 3.0, 8.0], size=(n_rows, 1))
        x = np.where(rng.random((n_rows, v)) < 0.25, -np.inf, x).astype(np.float32)
        x[:, 0] = np.where(np.isfinite(x).any(axis=1), x[:, 0], 0.0)
        out = np.asarray(infill_jit(jnp.asarray(x), table))
        for row, got in zip(x, out):
            want = oracle_dense(row, pieces, eog, eog[0])
            np.testing.assert_array_equal(got, want, err_msg=f"{pieces} {row.tolist()}")


def test_batch_shapes_and_per_row_equals_single_row():
    x = jnp.asarray(_random_rows(1, 6)).reshape(2, 3, V)
    out = infill_jit(x, TABLE)
    assert out.shape == x.shape
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(out[i, j], infill_jit(x[i, j], TABLE))


def test_single_trace_for_new_logits_and_bf16():
    rows = _random_rows(2, 6)
    assert_single_trace(js.infill, [(jnp.asarray(rows[i : i + 2]), TABLE) for i in range(0, 6, 2)])
    out = infill_jit(jnp.asarray(rows[:2], jnp.bfloat16), TABLE)
    assert out.dtype == jnp.bfloat16


def test_all_inf_rows_unchanged_and_nan_is_removed():
    x = jnp.full((V,), -jnp.inf).at[3].set(jnp.nan)
    np.testing.assert_array_equal(infill_jit(x, TABLE), jnp.full((V,), -jnp.inf))
    x = jnp.zeros(V).at[5].set(jnp.nan)
    assert not kept(infill_jit(x, TABLE))[5]


def test_vocab_size_mismatch_and_bad_tables():
    with pytest.raises(ValueError, match="vocab size"):
        js.infill(jnp.zeros(V + 1), TABLE)
    with pytest.raises(ValueError, match="eog_ids"):
        infill_table(["a", "b"], [])
    with pytest.raises(ValueError, match="eog_ids"):
        infill_table(["a", "b"], [2])
    with pytest.raises(ValueError, match="fallback_id"):
        infill_table(["a", "b"], [1], fallback_id=-1)
    with pytest.raises(ValueError, match="vocab_size"):
        infill_table(["a", "b"], [1], vocab_size=1)


def test_padded_vocabulary_columns_are_plain_tokens():
    t = infill_table(["a", "ab", ""], [2], vocab_size=5)
    assert t.is_eog.shape == (5,)
    p = jnp.log(jnp.array([0.3, 0.3, 0.01, 0.39, 0.0]))  # id 3 is a padding column with an empty piece
    assert kept(infill_jit(p, t)).tolist() == [True, False, True, True, False]


def test_pieces_from_byte_level_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    g = "\u0120"  # byte-level space
    vocab = {"a": 0, "b": 1, "ab": 2, g: 3, g + "a": 4, g + "ab": 5, "\u00c3": 6, "\u00a9": 7, "\u00c3\u00a9": 8}
    merges = [("a", "b"), (g, "a"), (g + "a", "b"), ("\u00c3", "\u00a9")]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(["<eot>"])
    pieces = token_pieces(tok)
    assert pieces == [b"a", b"b", b"ab", b" ", b" a", b" ab", b"\xc3", b"\xa9", "é".encode(), b""]
    table = js.infill_table_from_tokenizer(tok, eog_ids=[9])
    edges = set(zip(table.ancestor.tolist(), table.descendant.tolist()))
    assert {(0, 2), (3, 4), (3, 5), (4, 5), (6, 8)} == edges


def test_pieces_from_sentencepiece_style_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<unk>": 0, "<0x41>": 1, "\u2581a": 2, "\u2581ab": 3, "A": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(["</s>"])
    assert token_pieces(tok) == [b"<unk>", b"A", b" a", b" ab", b"A", b""]


@given(
    st.lists(st.sampled_from([-np.inf, np.nan, -2.0, 0.0, 0.5, 1.0, 3.0]), min_size=V, max_size=V),
)
def test_output_is_a_subset_with_original_logits(values):
    x = jnp.asarray(values, jnp.float32)
    out = np.asarray(infill_jit(x, TABLE))
    finite_in = np.isfinite(np.where(np.isnan(values), -np.inf, values))
    assert not np.isnan(out).any()
    if not finite_in.any():
        assert not np.isfinite(out).any()
        return
    survivors = np.flatnonzero(out > -np.inf)
    assert len(survivors) >= 1
    if survivors.tolist() == [1] and out[1] == 1.0:
        return  # fallback: only EOT at logit 1
    assert finite_in[survivors].all()
    np.testing.assert_array_equal(out[survivors], np.asarray(values, np.float32)[survivors])
    assert sum(1 for s in survivors if s not in EOG) <= 4  # each text survivor holds >= 0.2 of the mass


def test_v1_and_jit_of_stage():
    t = infill_table(["x"], [0])
    assert infill_jit(jnp.array([0.5]), t).tolist() == [0.5]
    sampler = js.chain(js.stages.infill(TABLE), select=js.stages.greedy())
    params = sampler.params((2,))
    state = sampler.init(params, vocab_size=V)
    x = jnp.asarray(_random_rows(3, 2))
    tokens, processed, _ = jax.jit(sampler.sample)(x, state, params)
    np.testing.assert_array_equal(processed, infill_jit(x, TABLE))
    np.testing.assert_array_equal(tokens, js.greedy(processed))
