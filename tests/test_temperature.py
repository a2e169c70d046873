"""temperature / dynamic_temperature: exact cases, llama.cpp upstream cases, jit and per-row properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from tests._helpers import assert_single_trace, kept, probs_logits, renormalised

P4 = [0.1, 0.2, 0.3, 0.4]


def test_divides_by_temperature():
    x = jnp.array([1.0, -2.0, 4.0])
    np.testing.assert_array_equal(js.temperature(x, 2.0), x / 2.0)


@pytest.mark.parametrize("t", [0.0, -1.0])
def test_non_positive_is_first_max(t):
    out = js.temperature(jnp.array([1.0, 5.0, 5.0, -jnp.inf]), t)
    np.testing.assert_array_equal(out, [-jnp.inf, 5.0, -jnp.inf, -jnp.inf])


def test_llama_upstream_temp_cases():
    # test_temp({0.1,0.2,0.3,0.4}, {0.1,0.2,0.3,0.4}, 1.0) and ({...}, {0,0,0,1}, 0.0)
    np.testing.assert_allclose(renormalised(js.temperature(probs_logits(P4), 1.0)), P4, atol=1e-5)
    np.testing.assert_allclose(renormalised(js.temperature(probs_logits(P4), 0.0)), [0, 0, 0, 1], atol=1e-5)


def test_llama_upstream_temp_ext_cases():
    out = js.dynamic_temperature(probs_logits(P4), 1.0, 0.0, 1.0)
    np.testing.assert_allclose(renormalised(out), P4, atol=1e-5)
    out = js.dynamic_temperature(probs_logits(P4), 0.0, 0.0, 1.0)
    np.testing.assert_allclose(renormalised(out), [0, 0, 0, 1], atol=1e-5)


def test_dynamic_temperature_formula():
    x = probs_logits(P4)
    p = np.asarray(P4, np.float64)
    h = -(p * np.log(p)).sum() / np.log(4)
    t, d, e = 0.7, 0.4, 2.0
    dyn = max(0.0, t - d) + 2 * d * h**e if t - d >= 0 else (t + d) * h**e
    np.testing.assert_allclose(js.dynamic_temperature(x, t, d, e), np.asarray(x) / dyn, rtol=1e-5)


def test_dynamic_temperature_single_candidate_untouched():
    x = jnp.array([-jnp.inf, 2.0, -jnp.inf])
    np.testing.assert_array_equal(js.dynamic_temperature(x, 0.5, 0.3), x)


def test_dynamic_temperature_zero_result_is_greedy():
    # min_temp = 0 and a row whose float32 entropy is exactly 0 -> dyn_temp = 0 -> first max only
    x = jnp.array([0.0, 200.0, 0.0])
    out = js.dynamic_temperature(x, 0.2, 0.5, 1.0)
    assert kept(out).tolist() == [False, True, False]


# Jitted, one compilation per shape shared by the tests below: eagerly, every call compiles its
# lax.cond anew (eager calls: test_bf16_in_bf16_out and the doctests).
TEMPERATURE = jax.jit(js.temperature)
DYNAMIC_TEMPERATURE = jax.jit(js.dynamic_temperature)


def test_per_row_equals_single_row():
    x = jax.random.normal(jax.random.key(0), (4, 9))
    temps = jnp.array([0.0, 0.5, 1.0, 2.0])
    deltas = jnp.array([0.0, 0.3, 0.6, 1.0])
    batched = TEMPERATURE(x, temps)
    dyn = DYNAMIC_TEMPERATURE(x, temps, deltas, 1.5)
    for i in range(4):
        np.testing.assert_array_equal(batched[i], TEMPERATURE(x[i], temps[i]))
        np.testing.assert_allclose(dyn[i], DYNAMIC_TEMPERATURE(x[i], temps[i], deltas[i], 1.5), rtol=1e-6)


def test_no_retrace_when_values_change():
    x = jnp.ones((2, 5))
    assert_single_trace(js.temperature, [(x, jnp.array([0.5, 1.0])), (x, jnp.array([0.0, 3.0]))])
    assert_single_trace(
        js.dynamic_temperature,
        [(x, jnp.float32(t), jnp.float32(d), jnp.float32(e)) for t, d, e in [(1, 0, 1), (0.5, 0.3, 2), (0, 1, 0)]],
    )


def test_bf16_in_bf16_out():
    x = jnp.array([1.0, 2.0, 3.0], jnp.bfloat16)
    out = js.temperature(x, 2.0)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), [0.5, 1.0, 1.5])


def test_bad_values_raise():
    with pytest.raises(ValueError, match="temp"):
        js.temperature(jnp.ones(3), float("nan"))
    with pytest.raises(ValueError, match="exponent"):
        js.dynamic_temperature(jnp.ones(3), 1.0, 0.5, -1.0)
    with pytest.raises(ValueError, match="temp"):
        js.temperature(jnp.ones((2, 3)), jnp.ones(3))


@given(st.lists(st.sampled_from([-jnp.inf, jnp.nan, 0.0, 1.5, -3.0]), min_size=1, max_size=6), st.floats(-2, 3))
def test_never_nan_and_never_empties_a_row(values, t):
    x = jnp.array(values, jnp.float32)
    for out in (TEMPERATURE(x, jnp.float32(t)), DYNAMIC_TEMPERATURE(x, jnp.float32(t), 0.5)):
        assert not np.isnan(np.asarray(out)).any()
        assert kept(out).any() == bool(np.any(np.isfinite(np.asarray(values))))


def test_ordinary_rows_do_not_depend_on_the_batch_path():
    # A batch of ordinary rows takes one fused division; an extreme row (t = 0, 1e-30, 3e38, inf,
    # NaN, huge logits) sends the whole batch down the guarded path, which must give the ordinary
    # rows the same bits.
    x = jax.random.normal(jax.random.key(0), (6, 257)) * 5
    x = x.at[:, 3].set(-jnp.inf).at[1, 7].set(jnp.nan).at[2, 9].set(jnp.inf)
    t = jnp.array([0.7, 1.3, 2.0, 1e-3, 0.05, 11.0])
    alone = jax.jit(js.temperature)(x, t)
    for extreme_t, extreme_x in [(0.0, 1.0), (1e-30, 1.0), (3e38, 1.0), (jnp.inf, 1.0), (jnp.nan, 1.0), (1.0, 1e38)]:
        xs = jnp.concatenate([x, jnp.full((1, 257), extreme_x)])
        got = jax.jit(js.temperature)(xs, jnp.concatenate([t, jnp.array([extreme_t])]))
        np.testing.assert_array_equal(got[:-1], alone, err_msg=f"t={extreme_t}, x={extreme_x}")
        assert bool(jnp.isfinite(got[-1]).any()) and not bool(jnp.isnan(got[-1]).any())
