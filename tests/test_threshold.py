"""_threshold: order keys, tie/float policy, cut-off search (candidate path == bisection == brute force)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxsample import _threshold
from jaxsample._threshold import MASS_RTOL

# (no subnormals: XLA on CPU flushes them to zero)
SPECIAL = np.array([-np.inf, -3.4e38, -1.0, -1.2e-38, -0.0, 0.0, 1.2e-38, 0.5, 1.0, 3.4e38, np.inf], np.float32)


def test_order_key_is_monotone_and_invertible():
    u = np.asarray(_threshold.order_key(jnp.asarray(SPECIAL)))
    assert np.all(np.diff(u.astype(np.int64)) >= 0)
    assert u[4] == u[5]  # -0.0 and 0.0 share a key
    assert np.all(np.diff(np.delete(u, 4).astype(np.int64)) > 0)
    back = np.asarray(_threshold.from_order_key(jnp.asarray(u)))
    np.testing.assert_array_equal(np.delete(back, 4), np.delete(SPECIAL, 4))
    assert back[5] == 0.0


def test_mass_reached_tolerance_is_a_few_ulps():
    p = jnp.float32(0.8)  # 0.800000011920929
    assert bool(_threshold.mass_reached(jnp.float32(0.8) * (1 - 3e-7), p))  # within 4 ulps: equal
    assert not bool(_threshold.mass_reached(jnp.float32(0.79999), p))
    assert not bool(_threshold.mass_reached(p, p, strict=True))  # equal does not exceed
    assert bool(_threshold.mass_reached(jnp.float32(0.80001), p, strict=True))
    assert bool(_threshold.mass_reached(jnp.float32(0.0), jnp.float32(0.0)))
    assert MASS_RTOL == 2.0**-21


def _brute_cutoff(keys, weights, target, min_count, strict):
    """Sort-based oracle: numpy, stable descending sort, sequential float32 cumsum."""
    out = []
    for r in range(keys.shape[0]):
        order = np.argsort(-keys[r], kind="stable")
        s = keys[r][order]
        t = np.inf
        if target is not None:
            cum = np.cumsum(weights[r][order], dtype=np.float32)
            tgt = np.float32(target[r])
            ok = cum > tgt * (1 + MASS_RTOL) if strict else cum >= tgt * (1 - MASS_RTOL)
            t = s[np.argmax(ok)] if ok.any() else -np.inf
        if min_count is not None:
            t = min(t, s[int(np.clip(min_count[r], 1, len(s))) - 1])
        out.append(t)
    return np.asarray(out, np.float32)


def _random_rows(seed, b, v, ties=True, neg_inf=0.2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, v)).astype(np.float32) * 2
    if ties:
        x = np.round(x * 2) / 2  # many exact ties
    x[rng.random((b, v)) < neg_inf] = -np.inf
    x[0] = -np.inf  # an empty row
    return x


@functools.cache
def _cutoff_fn(strict, with_target, with_count, candidates):
    def f(keys, weights, target, min_count):
        return _threshold.cutoff(
            keys,
            weights=weights if with_target else None,
            target=target if with_target else None,
            min_count=min_count if with_count else None,
            strict=strict,
            candidates=candidates,
        )

    return jax.jit(f)


@pytest.mark.parametrize(
    "strict,with_target,with_count",
    [(False, True, False), (True, True, False), (False, False, True), (True, True, True)],
)
def test_cutoff_paths_agree_with_brute_force(strict, with_target, with_count):
    b, v = 12, 97
    keys = _random_rows(0, b, v)
    weights = np.where(np.isfinite(keys), np.random.default_rng(1).random((b, v)), 0).astype(np.float32)
    weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-30)
    target = np.random.default_rng(2).random(b).astype(np.float32)
    target[1], target[2] = 0.0, 1.0
    min_count = np.random.default_rng(3).integers(-2, v + 5, size=b).astype(np.int32)
    expected = _brute_cutoff(
        keys, weights, target if with_target else None, min_count if with_count else None, strict
    )
    # fast path, fallback for most rows, and (once) K >= V
    for candidates in (64, 3) + ((200,) if strict and with_count else ()):
        got = _cutoff_fn(strict, with_target, with_count, candidates)(keys, weights, target, min_count)
        np.testing.assert_array_equal(np.asarray(got), expected, err_msg=f"candidates={candidates}")


def test_cutoff_needs_a_criterion():
    with pytest.raises(ValueError, match="target"):
        _threshold.cutoff(jnp.zeros((2, 3)))


def test_cutoff_result_is_a_key_or_minus_inf():
    keys = _random_rows(4, 16, 50, ties=False)
    w = np.where(np.isfinite(keys), 1.0 / 50, 0.0).astype(np.float32)
    t = np.asarray(_cutoff_fn(False, True, False, 3)(keys, w, np.full(16, 0.3, np.float32), np.ones(16, np.int32)))
    for r in range(16):
        assert t[r] == -np.inf or t[r] in keys[r]


def test_cutoff_rows_are_independent_of_their_batch():
    keys = _random_rows(5, 8, 120, ties=False, neg_inf=0.0)
    keys[::2, 5:] = -np.inf  # even rows fit the candidates, odd rows need the bisection
    w = np.asarray(jax.nn.softmax(jnp.asarray(keys), axis=-1))
    target = np.full(8, 0.9, np.float32)
    count = np.ones(8, np.int32)
    f = _cutoff_fn(False, True, False, 8)
    batched = np.asarray(f(keys, w, target, count))
    for r in range(8):
        assert float(f(keys[r], w[r], target[r], count[r])) == batched[r]


def test_kth_largest_counts_ties():
    x = jnp.array([[1.0, 3.0, 3.0, 2.0, -jnp.inf], [5.0, 4.0, 3.0, 2.0, 1.0]])
    for candidates in (64, 1):
        got = _threshold.kth_largest(x, jnp.array([2, 4]), candidates)
        np.testing.assert_array_equal(got, [3.0, 2.0])
        got = _threshold.kth_largest(x, jnp.array([3, 9]), candidates)  # k clipped to V
        np.testing.assert_array_equal(got, [2.0, 1.0])
    np.testing.assert_array_equal(_threshold.kth_largest(x, jnp.array([0, 1])), [3.0, 5.0])


@pytest.mark.parametrize("candidates", [64, 2])
def test_first_k_breaks_ties_by_lowest_id(candidates):
    x = jnp.array(
        [
            [1.0, 3.0, 3.0, 2.0, 3.0, 0.0],
            [2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
            [-jnp.inf, 1.0, -jnp.inf, 0.0, -jnp.inf, -jnp.inf],
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        ]
    )
    k = jnp.array([2, 4, 5, 3])
    got = np.asarray(_threshold.first_k(x, k, candidates))
    expected = [
        [0, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 1, 0, 1, 0, 0],  # only the finite tokens matter
        [0, 0, 0, 1, 1, 1],
    ]
    finite = np.isfinite(np.asarray(x))
    np.testing.assert_array_equal(got & finite, np.asarray(expected, bool))


def test_first_k_fallback_matches_stable_sort_on_large_ties():
    rng = np.random.default_rng(6)
    x = np.round(rng.normal(size=(6, 300))).astype(np.float32)  # ~7 distinct values, huge tie groups
    k = np.array([1, 10, 70, 150, 299, 5], np.int32)
    got = np.asarray(_threshold.first_k(jnp.asarray(x), jnp.asarray(k), 8))
    for r in range(6):
        rank = np.argsort(np.argsort(-x[r], kind="stable"), kind="stable")
        np.testing.assert_array_equal(got[r], rank < k[r])


@given(
    st.lists(st.sampled_from([-np.inf, 0.0, 1.0, 1.5, -2.0, 7.0]), min_size=1, max_size=9),
    st.floats(0.0, 1.0),
    st.integers(-1, 12),
    st.booleans(),
)
def test_cutoff_property_small_rows(values, target, min_count, strict):
    keys = np.full((1, 9), -np.inf, np.float32)  # fixed shape: one compilation for all examples
    keys[0, : len(values)] = values
    w = np.nan_to_num(np.asarray(jax.nn.softmax(jnp.asarray(keys), axis=-1)))
    target = np.asarray([target], np.float32)
    min_count = np.asarray([min_count], np.int32)
    expected = _brute_cutoff(keys, w, target, min_count, strict)
    for candidates in (64, 1):
        got = _cutoff_fn(strict, True, True, candidates)(keys, w, target, min_count)
        np.testing.assert_array_equal(np.asarray(got), expected)
