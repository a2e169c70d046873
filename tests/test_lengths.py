"""min_tokens / forced_bos / forced_eos / exponential_decay_length_penalty: HF upstream cases, vLLM cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from tests._helpers import assert_single_trace, kept

INF = float("inf")
UNIFORM = jnp.full((4, 20), 1.0 / 20)  # HF tests' _get_uniform_logits(4, 20)
min_tokens = jax.jit(js.min_tokens)
forced_bos = jax.jit(js.forced_bos)
forced_eos = jax.jit(js.forced_eos)
decay = jax.jit(js.exponential_decay_length_penalty)


@pytest.mark.parametrize("eos", [[0], [0, 18]])
def test_hf_min_new_tokens_upstream_case(eos):
    # MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3): input lengths 5, 6, 7
    # (positions 0, 1, 2) ban EOS; lengths 8 and 15 (positions 3, 10) do not.
    eos = jnp.array(eos, jnp.int32)
    for position in (0, 1, 2):
        out = min_tokens(UNIFORM, position, 3, eos)
        np.testing.assert_array_equal(out[:, eos], -INF)
        assert kept(out).sum() == 4 * (20 - len(eos))
    for position in (3, 10):
        np.testing.assert_array_equal(min_tokens(UNIFORM, position, 3, eos), UNIFORM)


def test_hf_min_length_counts_the_prompt():
    # MinLengthLogitsProcessor(min_length=10): banned at total length 5, free at 15. With a prompt of 5
    # tokens and position = length - 5, pass min_tokens = min_length - prompt_length = 5.
    np.testing.assert_array_equal(min_tokens(UNIFORM, 0, 10 - 5, jnp.array([0]))[:, 0], -INF)
    np.testing.assert_array_equal(min_tokens(UNIFORM, 10, 10 - 5, jnp.array([0])), UNIFORM)


def test_vllm_min_tokens_several_stop_ids_per_row():
    # all_stop_token_ids = stop_token_ids | EOS; per-row min_tokens and positions.
    x = jnp.zeros((3, 6))
    stop = jnp.array([[5, 2, -1], [5, -1, -1], [1, 3, 4]])
    out = min_tokens(x, jnp.array([0, 4, 2]), jnp.array([1, 4, 3]), stop)
    np.testing.assert_array_equal(kept(out), [[1, 1, 0, 1, 1, 0], [1] * 6, [1, 0, 1, 0, 0, 1]])
    pos, n = jnp.array([0, 4, 2]), jnp.array([1, 4, 3])
    for i in range(3):
        np.testing.assert_array_equal(out[i], min_tokens(x[i], pos[i], n[i], stop[i]))


def test_hf_forced_bos_upstream_case():
    out = forced_bos(UNIFORM, 0, 0)
    assert np.isneginf(np.asarray(out[:, 1:])).all()
    assert out[:, 0].tolist() == [0.0] * 4
    np.testing.assert_array_equal(forced_bos(UNIFORM, 3, 0), UNIFORM)
    out = forced_bos(jnp.zeros((2, 4)), jnp.array([0, 0]), jnp.array([3, 1]))  # per-row BOS
    np.testing.assert_array_equal(kept(out), [[0, 0, 0, 1], [0, 1, 0, 0]])


def test_hf_forced_eos_upstream_case():
    # ForcedEOSTokenLogitsProcessor(max_length=5, eos=0): forced at length 4 (= max_length - 1), not at 3.
    # With position = length - P and max_new_tokens = 5 - P the step is the same for any prompt length P.
    for prompt in (0, 1, 3):
        out = forced_eos(UNIFORM, 4 - prompt, 5 - prompt, jnp.array([0]))
        assert np.isneginf(np.asarray(out[:, 1:])).all() and out[:, 0].tolist() == [0.0] * 4
        np.testing.assert_array_equal(forced_eos(UNIFORM, 3 - prompt, 5 - prompt, jnp.array([0])), UNIFORM)
    out = forced_eos(jnp.ones((2, 4)), jnp.array([1, 1]), jnp.array([2, 2]), jnp.array([[1, 3], [-1, -1]]))
    np.testing.assert_array_equal(out, [[-INF, 0.0, -INF, 0.0], [1.0] * 4])  # a row without EOS ids is untouched


def test_hf_exponential_decay_upstream_case():
    # ExponentialDecayLengthPenalty((5, 1.1), eos=0, input_ids_seq_length=2): input length 2 (position 0)
    # unchanged; length 20 (position 18, 18 - 5 = 20 - (5 + 2) = 13 steps) raises positive and negative EOS.
    eos = jnp.array([0])
    np.testing.assert_array_equal(decay(UNIFORM, 0, 5, 1.1, eos), UNIFORM)
    for scores in (UNIFORM, -UNIFORM):
        out = decay(scores, 18, 5, 1.1, eos)
        s = np.float32(scores[0, 0])
        expected = s + np.abs(s) * (np.float32(1.1) ** np.float32(13) - np.float32(1))
        np.testing.assert_allclose(out[:, 0], expected, rtol=1e-6)
        assert (np.asarray(out[:, 0]) > np.asarray(scores[:, 0])).all()
        np.testing.assert_array_equal(out[:, 1:], scores[:, 1:])


def test_exponential_decay_starts_strictly_after_start_and_keeps_removed_eos():
    x = jnp.array([[2.0, -1.0, -INF], [2.0, -1.0, -INF]])
    out = decay(x, jnp.array([3, 4]), 3, 2.0, jnp.array([1, 2, 1]))
    np.testing.assert_array_equal(out, [[2.0, -1.0, -INF], [2.0, 0.0, -INF]])  # -1 + |-1| * (2 - 1); once per id
    out = decay(x, 6, jnp.array([4, 0]), jnp.array([0.5, 3.0]), jnp.array([1]))
    np.testing.assert_allclose(out[:, 1], [-1.75, -1.0 + 728.0])


def test_no_retrace_for_any_per_row_value():
    x = jnp.zeros((2, 5))
    ids = jnp.array([1, 4])
    a = jnp.array
    assert_single_trace(js.min_tokens, [(x, a(p), a(m), ids) for p, m in [([0, 1], [2, 0]), ([3, 3], [1, 9])]])
    assert_single_trace(js.forced_bos, [(x, a(p), a(b)) for p, b in [([0, 1], [2, 0]), ([1, 0], [4, 4])]])
    assert_single_trace(js.forced_eos, [(x, a(p), a(m), ids) for p, m in [([0, 1], [1, 2]), ([5, 5], [6, 9])]])
    values = [([0, 9], [1, 2], [1.5, 2.0]), ([4, 4], [0, 8], [0.5, 1.0])]
    assert_single_trace(js.exponential_decay_length_penalty, [(x + 1, a(p), a(s), a(f), ids) for p, s, f in values])


def test_bf16_in_bf16_out():
    out = js.forced_bos(jnp.ones(4, jnp.bfloat16), 0, 2)
    assert out.dtype == jnp.bfloat16 and np.asarray(out, np.float32).tolist() == [-INF, -INF, 0.0, -INF]


def test_errors_name_the_parameter():
    x = jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="min_tokens"):
        js.min_tokens(x, 0, -1, [0])
    with pytest.raises(ValueError, match="position"):
        js.min_tokens(x, -3, 1, [0])
    with pytest.raises(ValueError, match="stop_ids"):
        js.min_tokens(x, 0, 1, [4])
    with pytest.raises(ValueError, match="min_tokens"):
        js.min_tokens(x, 0, jnp.ones(3, jnp.int32), [0])
    with pytest.raises(ValueError, match="bos_id"):
        js.forced_bos(x, 0, 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        js.forced_eos(x, 0, 0, [1])
    with pytest.raises(ValueError, match="eos_ids"):
        js.forced_eos(x, 0, 3, [[1], [2], [3]])
    with pytest.raises(ValueError, match="factor"):
        js.exponential_decay_length_penalty(x, 0, 1, float("nan"), [1])
    with pytest.raises(ValueError, match="start"):
        js.exponential_decay_length_penalty(x, 0, 1.5, 1.1, [1])


@given(
    st.lists(st.sampled_from([-INF, float("nan"), -1.0, 0.0, 2.0]), min_size=4, max_size=4),
    st.integers(0, 6),
    st.integers(0, 6),
    st.lists(st.integers(-1, 3), min_size=2, max_size=2),
)
def test_properties(values, position, n, ids):
    x = jnp.asarray(values, jnp.float32)
    clean = np.where(np.isnan(values), -INF, values).astype(np.float32)
    ids = jnp.asarray(ids, jnp.int32)
    listed = np.zeros(4, bool)
    listed[[i for i in ids.tolist() if i >= 0]] = True
    out = np.asarray(min_tokens(x, position, n, ids))
    np.testing.assert_array_equal(out, np.where(listed & (position < n), -INF, clean))
    bos = np.asarray(forced_bos(x, position, n % 4))
    assert (kept(bos).sum() == 1 and bos[n % 4] == 0.0) if position == 0 else np.array_equal(bos, clean)
    eos = np.asarray(forced_eos(x, position, n + 1, ids))
    forced = position == n and listed.any()
    np.testing.assert_array_equal(eos, np.where(listed, 0.0, -INF) if forced else clean)
    out = np.asarray(decay(x, position, n, 1.5, ids))
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(kept(out), kept(clean))
