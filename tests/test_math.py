"""The row reductions of ``jaxsample._math`` that every sampler's passes go through."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsample import _math

_row_sum = jax.jit(_math.row_sum, static_argnames="keepdims")
_row_count = jax.jit(_math.row_count, static_argnames="keepdims")
_sum_count = jax.jit(_math.masked_sum_count)


@pytest.mark.parametrize("vocab", [1, 5, 64, 100, 128, 200, 4096, 50257])
def test_row_sum_and_count_match_float64_on_every_vocabulary_shape(vocab):
    # Short rows (one reduction), multiples of the block of 64, and rows with a tail of V mod 64.
    x = np.random.default_rng(vocab).normal(0.0, 2.0, (3, vocab)).astype(np.float32)
    w = np.exp(x - x.max(-1, keepdims=True))
    mask = x > 0.3
    got = np.asarray(_row_sum(jnp.asarray(w)))
    np.testing.assert_allclose(got, w.astype(np.float64).sum(-1), rtol=2e-6)
    assert np.array_equal(np.asarray(_row_count(jnp.asarray(mask))), mask.sum(-1))
    total, n = _sum_count(jnp.asarray(w), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(total), np.where(mask, w, 0.0).astype(np.float64).sum(-1), rtol=2e-6)
    assert np.asarray(n).dtype == np.int32 and np.array_equal(np.asarray(n), mask.sum(-1))


def test_row_sum_keeps_zeros_nan_and_inf_as_a_sum_does():
    w = jnp.array([[0.0, 0.0, 0.0], [1.0, jnp.nan, 2.0], [1.0, jnp.inf, 2.0], [-0.0, 0.0, 0.0], [1.5, -1.5, 0.0]])
    got = np.asarray(_row_sum(w))
    assert got[0] == 0.0 and np.isnan(got[1]) and got[2] == np.inf and got[3] == 0.0 and got[4] == 0.0
    assert _row_sum(w, keepdims=True).shape == (5, 1)
    assert _row_count(w > 0.5, keepdims=True).shape == (5, 1)
    assert np.asarray(_row_count(jnp.zeros((2, 0), bool))).tolist() == [0, 0]


def test_row_sum_over_a_long_row_is_accurate_under_the_test_tier_flags():
    # The fast tier compiles at opt level 0, where XLA:CPU's reduction loop is sequential; the blocks
    # of 64 keep the error of 131072 terms near float32's, far below a sequential sum's 1e-5.
    x = np.random.default_rng(0).normal(0.0, 2.0, (4, 131072)).astype(np.float32)
    w = np.exp(x - x.max(-1, keepdims=True))
    exact = w.astype(np.float64).sum(-1)
    np.testing.assert_allclose(np.asarray(_row_sum(jnp.asarray(w))), exact, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-3.0, 3.0, width=32), min_size=1, max_size=300), st.floats(-3.0, 3.0, width=32))
def test_row_count_is_the_number_of_true_entries(values, threshold):
    x = jnp.asarray(np.asarray(values, np.float32)[None])
    assert int(_row_count(x >= threshold)[0]) == sum(v >= threshold for v in np.asarray(values, np.float32))


def test_row_sum_is_one_fused_loop_with_its_count():
    # The count is what keeps XLA:CPU's own loop (a float-only sum goes to YNNPACK after writing its
    # summand out): it must survive in the optimised program, as a second reduction output.
    w = jnp.ones((2, 4096))
    hlo = jax.jit(_math.row_sum).lower(w).compile().as_text()
    assert "s32[" in hlo and "reduce(" in hlo


@pytest.mark.parametrize("name", ["log_softmax", "dynamic_temperature", "typical"])
def test_normalised_rows_are_the_same_alone_and_in_a_batch(name, monkeypatch):
    # The probe of benchmarks/invariance.py (mixed rows: ties, peaked, flat, sparse, -inf, huge) for
    # the functions whose rows differed alone and in 64 rows while the row sums ran in YNNPACK, whose
    # order and exp change with the shape (log_softmax up to 3 ulp, dynamic_temperature 14, a typical
    # row kept another set): every row of B = 64 bit for bit against the same row alone.
    from benchmarks import invariance

    monkeypatch.setattr(invariance, "SIZES", (1,))
    fn, args = next((f, a) for n, f, a in invariance.functions(1000) if n == name)
    assert invariance.compare(name, jax.jit(fn), args) == []
