"""greedy / categorical: exactness of the candidate path, distribution, key handling, invariances."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.extend import random as jrandom

import jaxsample as js
from jaxsample import _noise


def test_greedy_first_max_and_nan():
    assert js.greedy(jnp.array([1.0, 3.0, 3.0])) == 1
    assert js.greedy(jnp.array([jnp.nan, 1.0])) == 1
    assert js.greedy(jnp.full((3,), -jnp.inf)) == 0
    assert js.greedy(jnp.array([[0.0, 1.0], [2.0, 1.0]])).tolist() == [1, 0]


def test_threefry_is_jax_threefry_and_noise_is_addressed_by_id():
    k1, k2 = jnp.array([1, 2**32 - 1, 12345], jnp.uint32), jnp.array([0, 7, 2**31], jnp.uint32)
    x0, x1 = jnp.array([0, 3, 2**32 - 2], jnp.uint32), jnp.array([9, 0, 77], jnp.uint32)
    for ours, theirs in zip(_noise.threefry2x32(k1, k2, x0, x1), jrandom.threefry2x32_p.bind(k1, k2, x0, x1)):
        np.testing.assert_array_equal(ours, theirs)
    # Token i of a row is word i % 2 of JAX's hash of the counter i // 2 under the row's key words.
    keys = jax.random.split(jax.random.key(4), 3)
    w = jax.vmap(lambda k: jax.random.bits(k, (2,), jnp.uint32))(keys)
    counter = jnp.broadcast_to(jnp.arange(4, dtype=jnp.uint32), (3, 4))
    lo, hi = jrandom.threefry2x32_p.bind(
        jnp.broadcast_to(w[:, :1], (3, 4)), jnp.broadcast_to(w[:, 1:], (3, 4)), jnp.zeros_like(counter), counter
    )
    expected = jnp.stack([lo, hi], axis=-1).reshape(3, 8)[:, :7]
    np.testing.assert_array_equal(_noise.bits_all(keys, 7), expected)
    ids = jnp.array([[6, 0, 3], [1, 1, 5], [2, 4, 6]], jnp.int32)
    np.testing.assert_array_equal(_noise.bits_at(keys, ids), jnp.take_along_axis(expected, ids, axis=-1))


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_unrolled_fold_in_and_bits_equal_jax_random(impl):
    """The key derivations of a decoding step (``fold_in``, ``bits``) are JAX's, bit for bit, eager and
    jitted: written-out threefry for threefry keys, ``jax.random`` itself for other implementations."""
    keys = jax.random.split(jax.random.key(5, impl=impl), 12).reshape(3, 4)
    data = jnp.array(np.random.RandomState(0).randint(-(2**31), 2**31 - 1, (3, 4)), jnp.int32)
    flat = keys.reshape(-1)
    data_of = jax.random.key_data
    for fold_in, bits in [(_noise.fold_in, _noise._bits), (jax.jit(_noise.fold_in), jax.jit(_noise._bits, static_argnums=1))]:
        expected = jax.vmap(jax.random.fold_in)(flat, data.reshape(-1)).reshape(3, 4)
        np.testing.assert_array_equal(data_of(fold_in(keys, data)), data_of(expected))
        expected = jax.vmap(lambda k: jax.random.fold_in(k, 2**31 + 5))(flat).reshape(3, 4)  # a uint32 beyond int32
        np.testing.assert_array_equal(data_of(fold_in(keys, jnp.uint32(2**31 + 5))), data_of(expected))
        for shape in [(), (2,), (3,)]:
            expected = jax.vmap(lambda k: jax.random.bits(k, shape, jnp.uint32))(flat).reshape((3, 4) + shape)
            np.testing.assert_array_equal(bits(keys, shape), expected)
    single = jax.random.key(9, impl=impl)
    np.testing.assert_array_equal(
        data_of(_noise.row_keys(single, (2, 3))),
        data_of(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(single, jnp.arange(6, dtype=jnp.uint32)).reshape(2, 3)),
    )


# One compilation per shape (and candidates) shared by the tests below: an eager call compiles its
# lax.cond anew on every call. Eager calls: the key, empty-row and batch-size tests.
CATEGORICAL = jax.jit(js.categorical, static_argnames="candidates")


def _reference_gumbel_max(keys, x):
    g = _noise.gumbel_all(_noise.row_keys(keys, x.shape[:-1]), x.shape[-1])
    return jnp.argmax(jnp.where(x > -jnp.inf, x + g, -jnp.inf), axis=-1)


@pytest.mark.parametrize("n_finite", [1, 5, 64, 65, 300])
def test_candidate_and_full_paths_agree_with_gumbel_max(n_finite):
    x = jax.random.normal(jax.random.key(0), (8, 300))
    x = jnp.where(jnp.arange(300) < n_finite, x, -jnp.inf)
    keys = jax.random.split(jax.random.key(1), 8)
    expected = _reference_gumbel_max(keys, x)
    np.testing.assert_array_equal(CATEGORICAL(keys, x), expected)
    np.testing.assert_array_equal(CATEGORICAL(keys, x, candidates=4), expected)
    # one candidate: the dense draw's pruning rarely proves its best, so most rows take the exact draw
    np.testing.assert_array_equal(CATEGORICAL(keys, x, candidates=1), expected)


@functools.cache
def _backend_programs(k: int):
    """The CPU program (candidates, bounds) and the GPU/TPU one (every id hashed), jitted side by side."""
    from jaxsample.samplers import categorical as cat

    return jax.jit(lambda keys, x: (cat._on_candidates(keys, x, k), cat._whole_row(keys, x)))


@pytest.mark.parametrize("kind", ["normal", "peaked", "ties", "sparse", "posinf", "empty", "huge"])
def test_cpu_and_accelerator_programs_draw_the_same_token(kind):
    """``draw`` runs the candidate program on CPU and the whole-row one elsewhere: same token."""
    rng = np.random.default_rng(len(kind))
    for k in (1, 4, 64):
        for v in (1, 7, 300):
            x = rng.normal(0.0, 8.0 if kind == "peaked" else 1.0, (6, v))
            if kind == "ties":
                x = rng.integers(-1, 2, (6, v)).astype(np.float64)
            elif kind == "sparse":
                x = np.where(rng.random((6, v)) < 0.05, x, -np.inf)
            elif kind == "posinf":
                x = np.where(rng.random((6, v)) < 0.3, np.inf, x)
            elif kind == "empty":
                x[::2] = -np.inf
            elif kind == "huge":
                x = x * 1e37
            keys = jax.random.split(jax.random.key(k * v), 6)
            cpu, accelerator = _backend_programs(k)(keys, jnp.asarray(x, jnp.float32))
            np.testing.assert_array_equal(cpu, accelerator, err_msg=f"k={k} V={v}")


def test_chunked_argmax_is_jnp_argmax():
    """``_math.argmax`` runs chunked on CPU and ``jnp.argmax`` elsewhere: the same first maximum."""
    from jaxsample import _math

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5000)).astype(np.float32)
    x[1, [7, 4000]] = 9.0  # tie across chunks: the first
    x[2, [4000, 4001]] = 9.0  # tie inside a chunk
    x[3] = -np.inf  # all -inf: 0
    x[4, 4999] = np.inf
    x[5] = 0.0  # all tied
    x[6, :4990] = -np.inf  # the maximum in the padded last chunk
    for v in (5000, 4096, 130):
        row = jnp.asarray(x[:, :v])
        got = jax.jit(lambda r: _math._chunked_argmax(r, 128))(row)
        np.testing.assert_array_equal(got, jnp.argmax(row, axis=-1), err_msg=f"V={v}")
        np.testing.assert_array_equal(jax.jit(_math.argmax)(row), jnp.argmax(row, axis=-1))


def test_gumbel_bound_holds_for_every_uniform():
    bits = jnp.arange(2**23, dtype=jnp.uint32) << 9  # every value the noise can take
    bound = jax.jit(_noise.gumbel_bound)(bits)
    noise = jax.jit(_noise._gumbel_from_bits)(bits)
    assert bool(jnp.all(bound >= noise))
    assert float(jnp.min(bound - noise)) < 1e-3  # tight at the small uniforms (the large noise)


def test_mixed_covered_rows_are_batch_invariant():
    x = jax.random.normal(jax.random.key(2), (6, 200))
    x = x.at[::2, 10:].set(-jnp.inf)  # even rows covered, odd rows take the full path
    keys = jax.random.split(jax.random.key(3), 6)
    batched = CATEGORICAL(keys, x)
    for i in range(6):
        assert CATEGORICAL(keys[i], x[i]) == batched[i]
    # a covered row alone or next to uncovered rows gives the same token
    assert CATEGORICAL(keys[::2], x[::2]).tolist() == batched[::2].tolist()


def test_raw_and_typed_keys_agree():
    x = jax.random.normal(jax.random.key(4), (3, 10))
    typed = jax.random.split(jax.random.key(5), 3)
    raw = jax.random.key_data(typed)
    np.testing.assert_array_equal(js.categorical(typed, x), js.categorical(raw, x))


def test_single_key_rows_do_not_depend_on_batch_size():
    x = jax.random.normal(jax.random.key(6), (5, 10))
    k = jax.random.key(7)
    np.testing.assert_array_equal(js.categorical(k, x)[:3], js.categorical(k, x[:3]))


def test_distribution_matches_softmax():
    p = np.array([0.05, 0.15, 0.3, 0.5])
    keys = jax.random.split(jax.random.key(8), 100_000)
    sample = jax.jit(jax.vmap(lambda k: js.categorical(k, jnp.log(jnp.asarray(p)))))
    counts = np.bincount(np.asarray(sample(keys)), minlength=4)
    expected = p * len(keys)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 21.1  # df=3, p=1e-4


def test_plus_inf_tokens_share_the_mass():
    x = jnp.array([jnp.inf, 0.0, jnp.inf, 5.0])
    keys = jax.random.split(jax.random.key(9), 4000)
    toks = np.asarray(jax.jit(jax.vmap(lambda k: js.categorical(k, x)))(keys))  # one program, not op by op
    assert set(toks.tolist()) == {0, 2}
    assert abs((toks == 0).mean() - 0.5) < 0.05


def test_empty_row_returns_zero_and_v1():
    assert js.categorical(jax.random.key(0), jnp.full((4,), -jnp.inf)) == 0
    assert js.categorical(jax.random.key(0), jnp.array([3.0])) == 0


def test_bad_key_shape_raises():
    with pytest.raises(ValueError, match="key"):
        js.categorical(jax.random.split(jax.random.key(0), 3), jnp.zeros((2, 4)))


# Row lengths: below, at and above candidates=2, and a longer row (3..8 take the same path).
@given(st.lists(st.sampled_from([-jnp.inf, jnp.nan, 0.0, 1.0, 2.5]), min_size=8, max_size=8),
       st.sampled_from([1, 2, 3, 8]), st.integers(0, 2**30))
def test_always_returns_a_finite_token(values, length, seed):
    values = values[:length]
    x = jnp.array(values, jnp.float32)
    tok = int(CATEGORICAL(jax.random.key(seed), x, candidates=2))
    assert 0 <= tok < len(values)
    if np.isfinite(np.asarray(values, np.float32)).any():
        assert np.isfinite(values[tok])
