"""logit_bias / allowed_tokens / suppress_tokens / suppress_tokens_at_begin / ignore_eos."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from tests._helpers import assert_single_trace, kept

INF = float("inf")
bias_sparse = jax.jit(lambda x, ids, values: js.logit_bias(x, ids=ids, values=values))
bias_dense = jax.jit(lambda x, b: js.logit_bias(x, b))
bias_clamped = jax.jit(lambda x, ids, values, c: js.logit_bias(x, ids=ids, values=values, clamp=c))
allowed_ids = jax.jit(lambda x, ids: js.allowed_tokens(x, ids))
allowed_mask = jax.jit(lambda x, m: js.allowed_tokens(x, mask=m))
suppress = jax.jit(js.suppress_tokens)
suppress_begin = jax.jit(js.suppress_tokens_at_begin)
ignore = jax.jit(js.ignore_eos)


def test_sparse_bias_adds_and_repeats_accumulate():
    out = bias_sparse(jnp.array([1.0, 2.0, 3.0, 4.0]), jnp.array([2, -1, 2, 0]), jnp.array([0.5, 9.0, 0.25, -1.0]))
    np.testing.assert_array_equal(out, [0.0, 2.0, 3.75, 4.0])


def test_hf_sequence_bias_single_token_vectors():
    # HF test_bias_dist_processor, length-1 part: {(1,): 100, (4,): 100} on zero scores.
    out = bias_sparse(jnp.zeros((2, 5)), jnp.array([1, 4]), jnp.array([100.0, 100.0]))
    np.testing.assert_array_equal(out, [[0.0, 100.0, 0.0, 0.0, 100.0]] * 2)


def test_dense_bias_and_both_forms_sum():
    x = jnp.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    b = jnp.array([[1.0, -INF, 0.0], [0.0, 0.0, -2.0]])
    np.testing.assert_array_equal(bias_dense(x, b), [[1.0, -INF, 2.0], [3.0, 4.0, 3.0]])
    out = js.logit_bias(x, jnp.array([1.0, 1.0, 1.0]), ids=[0], values=1.0)
    np.testing.assert_array_equal(out, [[2.0, 2.0, 3.0], [5.0, 5.0, 6.0]])


def test_llama_minus_inf_bias_bans_and_removed_tokens_stay_removed():
    x = jnp.array([0.0, -INF, 1.0, INF])
    out = bias_sparse(x, jnp.array([0, 1, 3]), jnp.array([-INF, INF, -INF]))
    np.testing.assert_array_equal(out, [-INF, -INF, 1.0, -INF])  # +inf on a removed token, -inf on a +inf one
    out = bias_sparse(jnp.zeros(2), jnp.array([0, 0]), jnp.array([INF, -INF]))  # inf - inf on one id: a ban
    np.testing.assert_array_equal(out, [-INF, 0.0])


def test_vllm_clamp_to_plus_minus_100_per_entry():
    x = jnp.zeros((2, 4))
    ids = jnp.array([0, 1, 2, 2])
    vals = jnp.array([150.0, -INF, 60.0, 70.0])
    np.testing.assert_array_equal(bias_clamped(x, ids, vals, 100.0), [[100.0, -100.0, 130.0, 0.0]] * 2)
    out = bias_clamped(x, ids, vals, jnp.array([100.0, 1.0]))  # per-row bound
    np.testing.assert_array_equal(out[1], [1.0, -1.0, 2.0, 0.0])


def test_per_row_ids_values_and_no_retrace():
    x = jax.random.normal(jax.random.key(0), (3, 6))
    ids = jnp.array([[5, -1, -1], [0, 1, 2], [-1, -1, 3]])
    vals = jnp.array([[2.0, 0.0, 0.0], [1.0, -INF, 0.5], [0.0, 0.0, -3.0]])
    out = bias_sparse(x, ids, vals)
    for i in range(3):
        np.testing.assert_array_equal(out[i], bias_sparse(x[i], ids[i], vals[i]))
    calls = [(x, ids, vals), (x, ids[::-1], -vals), (x, jnp.full((3, 3), -1, jnp.int32), vals)]
    assert_single_trace(lambda a, b, c: js.logit_bias(a, ids=b, values=c, clamp=50.0), calls)
    assert_single_trace(lambda a, b, c: js.logit_bias(a, ids=b, values=c, clamp=jnp.float32(1.0)), calls[:2])


def test_allowed_tokens_ids_mask_and_empty_rows():
    x = jnp.arange(5.0) * jnp.ones((3, 1))
    ids = jnp.array([[4, 1, -1], [-1, -1, -1], [2, 2, 2]])
    out = allowed_ids(x, ids)
    np.testing.assert_array_equal(kept(out), [[0, 1, 0, 0, 1], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    np.testing.assert_array_equal(jnp.where(kept(out), out, 0), jnp.where(kept(out), x, 0))  # values untouched
    mask = jnp.array([[True, False, False, False, False], [False] * 5, [True] * 5])
    np.testing.assert_array_equal(kept(allowed_mask(x, mask)), [[1, 0, 0, 0, 0], [1] * 5, [1] * 5])
    # vLLM: a whitelist whose tokens are all removed leaves the row empty (detectable by the caller)
    assert not kept(allowed_ids(jnp.array([0.0, -INF]), jnp.array([1]))).any()
    assert_single_trace(lambda a, b: js.allowed_tokens(a, b), [(x, ids), (x, ids[::-1]), (x, -ids)])
    assert_single_trace(lambda a, m: js.allowed_tokens(a, mask=m), [(x, mask), (x, ~mask)])


def test_suppress_and_suppress_at_begin():
    x = jnp.zeros((2, 4))
    np.testing.assert_array_equal(kept(suppress(x, jnp.array([3, -1, 0]))), [[0, 1, 1, 0]] * 2)
    assert_single_trace(js.suppress_tokens, [(x, jnp.array([[1, 2], [3, -1]])), (x, jnp.array([[0, 0], [-1, -1]]))])
    ids = jnp.array([1, 2])
    pos = jnp.array([0, 1])
    np.testing.assert_array_equal(kept(suppress_begin(x, ids, pos, 0)), [[1, 0, 0, 1], [1, 1, 1, 1]])
    # HF begin_index = prompt_length + 1 after a forced BOS: our begin_index = 1
    np.testing.assert_array_equal(kept(suppress_begin(x, ids, pos, 1)), [[1, 1, 1, 1], [1, 0, 0, 1]])
    assert_single_trace(js.suppress_tokens_at_begin, [(x, ids, pos, jnp.int32(b)) for b in (0, 1, 5)])


def test_ignore_eos_per_row():
    out = ignore(jnp.zeros((3, 4)), jnp.array([3, 2]), jnp.array([True, False, True]))
    np.testing.assert_array_equal(kept(out), [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    calls = [(jnp.zeros((2, 3)), jnp.array([2]), jnp.array(v)) for v in ([1, 0], [0, 1])]
    assert_single_trace(js.ignore_eos, calls)


def test_bf16_in_bf16_out():
    out = js.logit_bias(jnp.array([1.0, 2.0], jnp.bfloat16), ids=[1], values=[0.5])
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), [1.0, 2.5])
    assert js.suppress_tokens(jnp.zeros(3, jnp.bfloat16), [0]).dtype == jnp.bfloat16


def test_errors_name_the_parameter():
    x = jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="ids"):
        js.logit_bias(x, ids=[4], values=[1.0])
    with pytest.raises(ValueError, match="values"):
        js.logit_bias(x, ids=[1], values=[float("nan")])
    with pytest.raises(ValueError, match="values"):
        js.logit_bias(x, ids=[1, 2], values=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="clamp"):
        js.logit_bias(x, ids=[1], values=[1.0], clamp=-1.0)
    with pytest.raises(ValueError, match="bias"):
        js.logit_bias(x, jnp.ones(5))
    with pytest.raises(ValueError, match="`ids` and `values`"):
        js.logit_bias(x, ids=[1])
    with pytest.raises(ValueError, match="dense `bias`"):
        js.logit_bias(x)
    with pytest.raises(ValueError, match="ids"):
        js.allowed_tokens(x, [[1], [2], [3]])
    with pytest.raises(ValueError, match="exactly one"):
        js.allowed_tokens(x)
    with pytest.raises(ValueError, match="mask"):
        js.allowed_tokens(x, mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="ids"):
        js.suppress_tokens(x, [1.5])
    with pytest.raises(ValueError, match="position"):
        js.suppress_tokens_at_begin(x, [1], position=-1)
    with pytest.raises(ValueError, match="begin_index"):
        js.suppress_tokens_at_begin(x, [1], position=0, begin_index=-2)
    with pytest.raises(ValueError, match="eos_ids"):
        js.ignore_eos(x, [9])
    with pytest.raises(ValueError, match="ignore"):
        js.ignore_eos(x, [1], ignore=2)


def test_traced_out_of_range_ids_are_ignored():
    out = bias_sparse(jnp.zeros(3), jnp.array([7, 1]), jnp.array([5.0, 1.0]))
    np.testing.assert_array_equal(out, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(kept(suppress(jnp.zeros(3), jnp.array([3, 99]))), [1, 1, 1])


LOGITS = st.lists(st.sampled_from([-INF, float("nan"), -1.0, 0.0, 2.5]), min_size=5, max_size=5)
props = jax.jit(
    lambda x, ids, b: (
        js.logit_bias(x, ids=ids, values=b),
        js.suppress_tokens(x, ids),
        js.allowed_tokens(x, ids),
    )
)


@given(LOGITS, st.lists(st.integers(-1, 4), min_size=4, max_size=4), st.floats(-5, 5, width=32))
def test_properties(values, ids, b):
    x = jnp.asarray(values, jnp.float32)
    x_clean = np.where(np.isnan(values), -INF, values).astype(np.float32)
    real = [i for i in ids if i >= 0]
    listed = np.zeros(5, bool)
    listed[real] = True
    counts = np.bincount(real, minlength=5).astype(np.float32)
    biased, suppressed, allowed = props(x, jnp.asarray(ids, jnp.int32), jnp.float32(b))
    for out in (biased, suppressed, allowed):
        assert not np.isnan(np.asarray(out)).any()
    want = x_clean + counts * np.float32(b)
    np.testing.assert_allclose(biased, np.where(np.isnan(want), -INF, want), rtol=1e-6)
    np.testing.assert_array_equal(suppressed, np.where(listed, -INF, x_clean))
    allowed_set = listed if listed.any() else np.ones(5, bool)
    np.testing.assert_array_equal(allowed, np.where(allowed_set, x_clean, -INF))


def test_vocabulary_of_one_and_empty_lists():
    x = jnp.array([[0.5], [-INF]])
    np.testing.assert_array_equal(js.logit_bias(x, ids=[0], values=1.0), [[1.5], [-INF]])
    np.testing.assert_array_equal(js.allowed_tokens(x, []), x)
    np.testing.assert_array_equal(js.suppress_tokens(x, []), x)
    np.testing.assert_array_equal(js.suppress_tokens(x, [0]), [[-INF], [-INF]])
