"""vLLM logprobs: modes, sampled logprob + rank (ties), top-n without a sort, -inf safety."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from tests._helpers import assert_single_trace

INF = float("inf")
top = jax.jit(js.top_logprobs, static_argnums=2)
logprobs = jax.jit(js.compute_logprobs)
step = jax.jit(js.step_logprobs, static_argnames=("n", "mode"))


def _reference(values, sampled, n):
    """vLLM gather_logprobs with numpy: stable descending sort (ties by lower id)."""
    values = np.asarray(values, np.float32)
    order = np.argsort(-values, axis=-1, kind="stable")[..., :n]
    chosen = np.take_along_axis(values, np.asarray(sampled)[..., None], -1)
    return chosen[..., 0], (values >= chosen).sum(-1), order, np.take_along_axis(values, order, -1)


def test_raw_logprobs_is_float32_log_softmax():
    x = jax.random.normal(jax.random.key(0), (3, 11)).astype(jnp.bfloat16)
    out = logprobs(x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, jax.nn.log_softmax(x.astype(jnp.float32)), atol=1e-6)
    np.testing.assert_array_equal(js.compute_logprobs(jnp.array([-INF, jnp.nan])), [-INF, -INF])


def test_rank_counts_ties_like_vllm():
    lp = jnp.log(jnp.array([0.3, 0.1, 0.3, 0.2, 0.1]))
    r = top(lp, jnp.array(2), 2)
    assert int(r.rank) == 2 and r.ids.tolist() == [0, 2]  # tied with id 0: both count, top-n ties by lower id
    assert int(top(lp, jnp.array(0), 2).rank) == 2
    assert int(top(lp, jnp.array(4), 2).rank) == 5
    assert int(top(lp, jnp.array(3), 2).rank) == 3


def test_matches_sorted_reference():
    x = jax.random.normal(jax.random.key(1), (4, 50))
    x = x.at[:, ::7].set(x[:, 1:2])  # ties
    x = x.at[1, 5:20].set(-INF)
    lp = logprobs(x)
    sampled = jnp.array([0, 7, 49, 13])
    r = top(lp, sampled, 6)
    want = _reference(lp, sampled, 6)
    np.testing.assert_array_equal(r.sampled, want[0])
    np.testing.assert_array_equal(r.rank, want[1])
    np.testing.assert_array_equal(r.ids, want[2])
    np.testing.assert_array_equal(r.values, want[3])
    for i in range(4):
        ri = top(lp[i], sampled[i], 6)
        np.testing.assert_array_equal(ri.ids, r.ids[i])
        assert int(ri.rank) == int(r.rank[i])


def test_modes_pick_raw_or_processed_source():
    raw = jnp.log(jnp.array([[0.2, 0.5, 0.3]]))
    processed = jnp.array([[-INF, 2.0, 1.0]])
    sampled = jnp.array([2])
    r = step(raw, processed, sampled, n=2, mode="raw_logprobs")
    np.testing.assert_allclose(r.values, np.log([[0.5, 0.3]]), rtol=1e-6)
    r = step(raw, processed, sampled, n=2, mode="raw_logits")
    np.testing.assert_array_equal(r.values, raw[:, [1, 2]])
    r = step(raw, processed, sampled, n=2, mode="processed_logprobs")
    np.testing.assert_allclose(r.values, jax.nn.log_softmax(jnp.array([2.0, 1.0]))[None], rtol=1e-6)
    r = step(raw, processed, sampled, n=3, mode="processed_logits")
    np.testing.assert_array_equal(r.values, [[2.0, 1.0, -INF]])
    assert r.rank.tolist() == [2] and r.sampled.tolist() == [1.0]


def test_minus_inf_sampled_token_and_empty_rows():
    r = top(jnp.array([[-INF, 0.0, -INF], [-INF, -INF, -INF]]), jnp.array([0, 1]), 1)
    assert r.sampled.tolist() == [-INF, -INF] and r.rank.tolist() == [3, 3]
    assert r.values.tolist() == [[0.0], [-INF]]


def test_vllm_layout_and_gather():
    lp = jnp.log(jnp.array([[0.2, 0.5, 0.3]]))
    r = top(lp, jnp.array([2]), 1)
    ids, values, ranks = r.vllm_layout(jnp.array([2]))
    assert ids.tolist() == [[2, 1]] and ranks.tolist() == [2]
    np.testing.assert_allclose(values, np.log([[0.3, 0.5]]), rtol=1e-6)
    np.testing.assert_array_equal(js.gather_logprobs(lp, [[1, -1, 2]]), [[lp[0, 1], -INF, lp[0, 2]]])


def test_no_retrace_n_zero_and_errors():
    x = jnp.zeros((2, 5))
    calls = [(x, jnp.array([0, 1])), (x + 1, jnp.array([4, 2]))]
    assert_single_trace(lambda a, s: js.step_logprobs(a, a, s, 2), calls)
    assert top(x, jnp.array([0, 0]), 0).ids.shape == (2, 0)
    with pytest.raises(ValueError, match="n"):
        js.top_logprobs(x, 0, 6)
    with pytest.raises(ValueError, match="sampled"):
        js.top_logprobs(x, 5, 1)
    with pytest.raises(ValueError, match="mode"):
        js.step_logprobs(x, x, 0, 1, mode="logprobs")
    with pytest.raises(ValueError, match="processed_logits"):
        js.step_logprobs(x, None, 0, 1, mode="processed_logits")
    with pytest.raises(ValueError, match="ids"):
        js.gather_logprobs(x, [5])


@given(st.lists(st.sampled_from([-INF, float("nan"), -1.0, 0.0, 2.0]), min_size=5, max_size=5), st.integers(0, 4))
def test_rank_and_top_against_reference(values, sampled):
    lp = logprobs(jnp.asarray(values, jnp.float32))
    assert not np.isnan(np.asarray(lp)).any()
    r = top(lp, jnp.array(sampled), 3)
    want = _reference(lp, sampled, 3)
    assert int(r.rank) == int(want[1]) and 1 <= int(r.rank) <= 5
    np.testing.assert_array_equal(r.values, want[3])
    finite = np.isfinite(want[3])
    np.testing.assert_array_equal(np.asarray(r.ids)[finite], want[2][finite])  # order among -inf is free
