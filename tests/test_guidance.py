"""Classifier-free guidance: HF unbatched (log-prob space) and MusicGen (raw logits) forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from tests._helpers import assert_single_trace

INF = float("inf")
cfg = jax.jit(js.classifier_free_guidance)
cfg_logits = jax.jit(js.classifier_free_guidance_logits)


def _lsm(x):
    x = np.asarray(x, np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)


def test_hf_unbatched_upstream_case():
    # HF test_classifier_free_guidance: uncond [1, 0, 1.5], cond [1, 1, 1], scale 1.5.
    cond, uncond = np.array([1.0, 1.0, 1.0]), np.array([1.0, 0.0, 1.5])
    expected = _lsm(uncond) + 1.5 * (_lsm(cond) - _lsm(uncond))
    np.testing.assert_allclose(cfg(jnp.asarray(cond), jnp.asarray(uncond), 1.5), expected, atol=1e-6)


def test_scale_one_is_log_softmax_of_cond_and_zero_is_uncond():
    cond = jax.random.normal(jax.random.key(0), (2, 7))
    uncond = jax.random.normal(jax.random.key(1), (2, 7))
    np.testing.assert_array_equal(cfg(cond, uncond, 1.0), js.log_softmax(cond))
    np.testing.assert_array_equal(cfg(cond, uncond, 0.0), js.log_softmax(uncond))
    np.testing.assert_array_equal(cfg_logits(cond, uncond, 1.0), cond)


def test_musicgen_form_stacked_and_per_row_scale():
    cond = jnp.array([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0]])
    uncond = jnp.array([[1.0, 1.0, 1.0], [0.0, 2.0, 1.0]])
    s = jnp.array([3.0, 0.5])
    want = uncond + s[:, None] * (cond - uncond)
    np.testing.assert_array_equal(cfg_logits(cond, uncond, s), want)
    stacked = jnp.concatenate([cond, uncond])
    np.testing.assert_array_equal(cfg_logits(stacked, None, s), want)
    for i in range(2):
        np.testing.assert_array_equal(cfg_logits(cond[i], uncond[i], s[i]), want[i])
    u = cfg(stacked, None, s)
    np.testing.assert_array_equal(u, cfg(cond, uncond, s))


def test_infinities_resolve_to_limits():
    cond = jnp.array([-INF, 0.0, -INF, 1.0])
    uncond = jnp.array([0.0, -INF, -INF, 1.0])
    out = cfg_logits(jnp.stack([cond] * 4), jnp.stack([uncond] * 4), jnp.array([0.0, 0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(
        out,
        [
            [0.0, -INF, -INF, 1.0],  # s = 0: the unconditional logits
            [-INF, -INF, -INF, 1.0],
            [-INF, 0.0, -INF, 1.0],  # s = 1: cond exactly
            [-INF, INF, -INF, 1.0],  # s > 1 pushes a token the unconditional pass excludes to certainty
        ],
    )


def test_no_retrace_and_bf16():
    c, u = jnp.zeros((2, 3)), jnp.ones((2, 3))
    assert_single_trace(js.classifier_free_guidance, [(c, u, jnp.array(s)) for s in ([1.0, 2.0], [0.0, 1.5])])
    out = js.classifier_free_guidance_logits(c.astype(jnp.bfloat16), u.astype(jnp.bfloat16), 2.0)
    assert out.dtype == jnp.bfloat16 and out.tolist() == [[-1.0] * 3] * 2


def test_errors():
    with pytest.raises(ValueError, match="scale"):
        js.classifier_free_guidance(jnp.zeros(3), jnp.zeros(3), float("nan"))
    with pytest.raises(ValueError, match="scale"):
        js.classifier_free_guidance(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones(3))
    with pytest.raises(ValueError, match="uncond"):
        js.classifier_free_guidance_logits(jnp.zeros((2, 3)), jnp.zeros((3, 3)), 2.0)
    with pytest.raises(ValueError, match="even"):
        js.classifier_free_guidance_logits(jnp.zeros((3, 3)), None, 2.0)


@given(
    st.lists(st.sampled_from([-INF, float("nan"), -1.0, 0.0, 3.0]), min_size=4, max_size=4),
    st.lists(st.sampled_from([-INF, -2.0, 0.0, 1.0]), min_size=4, max_size=4),
    st.floats(-2, 4, width=32),
)
def test_never_nan_and_removed_in_both_stays_removed(c, u, s):
    c, u = jnp.asarray(c, jnp.float32), jnp.asarray(u, jnp.float32)
    both = np.asarray(jnp.isnan(c) | (c == -INF)) & np.asarray(u == -INF)
    for out in (cfg(c, u, s), cfg_logits(c, u, s)):
        out = np.asarray(out)
        assert not np.isnan(out).any()
        assert (out[both] == -INF).all()
