"""Sampler chains: params validation, history ring buffer, keys per (seed, position), no retrace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.chain import Param, Stage, _fill_ring, _ring_view, request_keys
from tests._helpers import CountingJit


def _recording_stage(window):
    """A stage that writes the history it sees into its state (to test what stages receive)."""

    def init(info):
        return jnp.full(info.batch_shape + (window,), -7, jnp.int32)

    def update(x, s, p, info):
        return x, info.history[..., -window:]

    return Stage("record", update, init=init, history=window)


def test_params_defaults_overrides_and_errors():
    sampler = js.chain(stages.temperature(0.8), select=stages.categorical())
    p = sampler.params((3,), temperature=jnp.array([0.0, 0.5, 1.0]))
    assert set(p) == {"seed", "seed_stream", "temperature"}
    assert p["seed"].shape == (3,) and p["seed"].dtype == jnp.int32
    np.testing.assert_allclose(sampler.params((2,))["temperature"], [0.8, 0.8])
    with pytest.raises(ValueError, match="top_q"):
        sampler.params((2,), top_q=0.3)
    with pytest.raises(ValueError, match="temperature"):
        sampler.params((2,), temperature=jnp.ones(3))


def test_chain_rejects_duplicate_names_and_conflicting_params():
    with pytest.raises(ValueError, match="unique"):
        js.chain(stages.temperature(), stages.temperature(), select=stages.greedy())
    a = Stage("a", lambda x, s, p, i: (x, s), params=(Param("min_keep", 1, jnp.int32),))
    b = Stage("b", lambda x, s, p, i: (x, s), params=(Param("min_keep", 0, jnp.int32),))
    with pytest.raises(ValueError, match="min_keep"):
        js.chain(a, b, select=stages.greedy())


def test_fill_ring_keeps_last_w_valid_tokens_in_order():
    prompt = jnp.array([[5, -1, 6, 7, 8], [-1, -1, -1, -1, 9], [-1] * 5])
    ring, n = _fill_ring(prompt, 3)
    np.testing.assert_array_equal(_ring_view(ring, n), [[6, 7, 8], [-1, -1, 9], [-1, -1, -1]])
    np.testing.assert_array_equal(n, [4, 1, 0])


def test_history_seen_by_stages_and_accept_with_active():
    sampler = js.chain(_recording_stage(4), select=stages.greedy())
    params = sampler.params((2,))
    state = sampler.init(params, vocab_size=3, prompt=jnp.array([[1, 2], [-1, 0]]))
    active = jnp.array([True, False])
    for tok in [[2, 2], [0, 1], [1, 1]]:
        state = sampler.accept(jnp.array(tok), state, params, active)
    _, state = sampler.process(jnp.zeros((2, 3)), state, params)
    np.testing.assert_array_equal(state.stages[0], [[2, 2, 0, 1], [-1, -1, -1, 0]])
    np.testing.assert_array_equal(state.position, [3, 0])


def test_randomness_is_per_seed_and_position_not_batch_slot():
    sampler = js.chain(stages.temperature(1.0), select=stages.categorical())
    x = jax.random.normal(jax.random.key(0), (4, 50))
    params = sampler.params((4,), seed=jnp.array([11, 12, 13, 14]))
    step = jax.jit(sampler.sample)
    state = sampler.init(params, vocab_size=50)
    toks = []
    for _ in range(3):
        t, _, state = step(x, state, params)
        toks.append(t)
    # row 2 alone, with the same seed, reproduces its column
    p1 = sampler.params((1,), seed=jnp.array([13]))
    s1 = sampler.init(p1, vocab_size=50)
    for i in range(3):
        t, _, s1 = step(x[2:3], s1, p1)
        assert int(t[0]) == int(toks[i][2])
    assert len({tuple(np.asarray(t).tolist()) for t in toks}) > 1  # positions differ


# One sampler and one jitted step for the parametrisations below (a seed is a traced value): two
# compilations (8 rows, 1 row) instead of two per parametrisation.
DIST = js.chain(select=stages.categorical())
DIST_SAMPLE = jax.jit(DIST.sample)


@pytest.mark.parametrize("seed", [None, 7, jnp.array([7])])
def test_rows_sharing_a_seed_draw_from_distinct_streams(seed):
    """One seed for the batch (or none: seed 0) must not give every row the same noise."""
    values = {} if seed is None else {"seed": seed}
    params = DIST.params((8,), **values)
    np.testing.assert_array_equal(params["seed_stream"], np.arange(8))
    tokens, _, _ = DIST_SAMPLE(jnp.zeros((8, 1000)), DIST.init(params, vocab_size=1000), params)
    assert len(set(np.asarray(tokens).tolist())) > 4
    # row 0 of a shared seed is the request alone with that seed (stream 0)
    alone = DIST.params((1,), **values)
    first, _, _ = DIST_SAMPLE(jnp.zeros((1, 1000)), DIST.init(alone, vocab_size=1000), alone)
    assert int(first[0]) == int(tokens[0])


def test_request_keys_streams_are_independent_of_adjacent_seeds():
    keys = request_keys({"seed": jnp.array([5, 6, 5, 5]), "seed_stream": jnp.array([1, 0, 0, 2])})
    data = [tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in keys]
    assert len(set(data)) == 4  # (5, stream 1) is not (6, stream 0)
    assert data[2] == tuple(np.asarray(jax.random.key_data(jax.random.key(5))).tolist())  # stream 0 = key(seed)
    per_row = js.chain(select=stages.greedy()).params((3,), seed=jnp.array([1, 2, 3]))
    np.testing.assert_array_equal(per_row["seed_stream"], [0, 0, 0])


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_step_infos_keys_are_each_names_own_derivation(impl):
    """``step_infos`` derives every name's key in one hash: the same bits as folding the request key
    with the position, then with the name's salt, name by name (other PRNG implementations too)."""
    from jaxsample import _noise
    from jaxsample.chain import _stage_salt

    sampler = js.chain(stages.xtc(), stages.top_k(), _recording_stage(2), select=stages.categorical())
    params = sampler.params((3,), seed=jnp.array([4, 9, 4]), seed_stream=jnp.array([0, 0, 1]))
    state = sampler.init(params, vocab_size=5, prompt=jnp.array([[1, 2], [-1, 0], [3, -1]]))
    state = state._replace(position=jnp.array([0, 5, 2**31 - 1], jnp.int32))
    default = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", impl)
    try:
        infos = sampler.step_infos(state, params)
        base = _noise.fold_in(request_keys(params), state.position)
        for name in ("xtc", "top_k", "record", "dist"):
            want = _noise.fold_in(base, _stage_salt(name))
            assert str(jax.random.key_impl(infos[name].key)) == impl
            np.testing.assert_array_equal(jax.random.key_data(infos[name].key), jax.random.key_data(want), err_msg=name)
            np.testing.assert_array_equal(infos[name].history, _ring_view(state.ring, state.filled))
            assert sampler.step_info(state, params, name).key.shape == (3,)
    finally:
        jax.config.update("jax_default_prng_impl", default)
    assert sorted(infos) == ["dist", "record", "top_k", "xtc"]
    with pytest.raises(ValueError, match="'top_p' is neither a stage nor the selector"):
        sampler.step_info(state, params, "top_p")


def test_sample_compiles_once_for_new_values():
    sampler = js.chain(stages.dynamic_temperature(), select=stages.categorical())
    x = jnp.zeros((2, 8))
    step = CountingJit(sampler.sample)
    for t, d in [(0.5, 0.0), (0.0, 0.2), (1.3, 0.7)]:
        params = sampler.params((2,), temperature=t, dynatemp_range=d, seed=jnp.array([1, 2]))
        state = sampler.init(params, vocab_size=8)
        jax.block_until_ready(step(x, state, params))
    assert step.traces == 1


def test_whole_history_needs_explicit_size():
    stage = _recording_stage(2)._replace(history=-1)
    sampler = js.chain(stage, select=stages.greedy())
    with pytest.raises(ValueError, match="history_size"):
        sampler.init(sampler.params((1,)), vocab_size=3)


def test_inactive_rows_keep_selector_state():
    sampler = js.chain(select=stages.mirostat_v2())
    params = sampler.params((2,), mirostat_tau=3.0, seed=jnp.array([1, 2]))
    state = sampler.init(params, vocab_size=16)
    x = jax.random.normal(jax.random.key(0), (2, 16))
    _, _, new = jax.jit(sampler.sample)(x, state, params, jnp.array([True, False]))
    assert float(new.selector[1]) == float(state.selector[1]) == 6.0
    assert float(new.selector[0]) != 6.0
    np.testing.assert_array_equal(new.position, [1, 0])


def test_equal_configurations_give_equal_samplers():
    a = js.chain(stages.top_k(40), stages.penalties(64), select=stages.categorical())
    b = js.chain(stages.top_k(40), stages.penalties(64), select=stages.categorical())
    assert a == b and hash(a) == hash(b)
    # defaults are values, not structure: stages differing only in them are equal (one compilation),
    # and each still fills its own defaults in (see tests/test_stage_identity.py for every factory)
    assert stages.top_k(40) == stages.top_k(20) and hash(stages.top_k(40)) == hash(stages.top_k(20))
    assert js.chain(stages.top_k(40), select=stages.greedy()).params(())["top_k"] == 40
    assert stages.top_k(40, exact=True) != stages.top_k(40)


def test_list_params_are_padded_and_validated():
    sampler = js.chain(stages.suppress_tokens(capacity=3), select=stages.greedy())
    p = sampler.params((2,), suppress_tokens_ids=[[4], [0, 2]])
    assert p["suppress_tokens_ids"].tolist() == [[4, -1, -1], [0, 2, -1]]
    assert sampler.params((2,))["suppress_tokens_ids"].tolist() == [[-1] * 3] * 2
    out, _ = sampler.process(jnp.zeros((2, 5)), sampler.init(p, vocab_size=5), p)
    np.testing.assert_array_equal(out > -jnp.inf, [[1, 1, 1, 1, 0], [0, 1, 0, 1, 1]])
    with pytest.raises(ValueError, match="capacity=3"):
        sampler.params((1,), suppress_tokens_ids=[1, 2, 3, 4])
