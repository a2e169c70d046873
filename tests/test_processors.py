"""remove_inf_nan / log_softmax / token_mask, and the chain stages of every processor."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from tests._helpers import CountingJit, kept

INF = float("inf")


def test_hf_inf_nan_remove_upstream_case():
    out = js.remove_inf_nan(jnp.array([[0.0, 0.7, 0.8, jnp.nan], [0.1, INF, 0.3, -INF]]))
    f = np.finfo(np.float32)
    np.testing.assert_array_equal(out, np.array([[0.0, 0.7, 0.8, 0.0], [0.1, f.max, 0.3, f.min]], np.float32))
    out = js.remove_inf_nan(jnp.array([jnp.nan, INF, -INF], jnp.bfloat16))
    b = jnp.finfo(jnp.bfloat16)
    assert out.dtype == jnp.bfloat16 and out.tolist() == [0.0, float(b.max), float(b.min)]


def test_hf_logit_normalization_upstream_case():
    scores = jnp.array([[-23.18, -29.96, -43.54, 47.77], [-33.58, -26.87, -32.96, 22.51]])
    out = js.log_softmax(scores)
    np.testing.assert_allclose(jnp.exp(out).sum(-1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(jnp.exp(out), jax.nn.softmax(scores), rtol=1e-6)
    np.testing.assert_array_equal(js.log_softmax(jnp.array([-INF, -INF])), [-INF, -INF])
    np.testing.assert_allclose(js.log_softmax(jnp.array([INF, 0.0, INF])), [-np.log(2), -INF, -np.log(2)])


def test_token_mask():
    np.testing.assert_array_equal(js.token_mask([[1, -1], [0, 1]], 3, (2,)), [[0, 1, 0], [1, 1, 0]])
    np.testing.assert_array_equal(js.token_mask([], 2, (3,)), np.zeros((3, 2), bool))
    with pytest.raises(ValueError, match="ids"):
        js.token_mask([3], 3)


# ------------------------------------------------------------------------------------------------- stages

def _chain(*parts):
    return js.chain(*parts, select=stages.greedy())


def test_list_params_layouts_and_errors():
    sampler = _chain(stages.allowed_tokens(capacity=2), stages.min_tokens(capacity=4), stages.logit_bias(capacity=2))
    p = sampler.params((2, 2), allowed_tokens_ids=[[1], [], [2, 3], [0]], min_tokens_ids=[7, 8])
    assert p["allowed_tokens_ids"].shape == (2, 2, 2) and p["allowed_tokens_ids"][1, 0].tolist() == [2, 3]
    assert p["min_tokens_ids"].tolist() == [[[7, 8, -1, -1]] * 2] * 2
    assert p["logit_bias_values"].tolist() == [[[0.0, 0.0]] * 2] * 2
    p = sampler.params((2,), allowed_tokens_ids=np.array([[1], [2]]))
    assert p["allowed_tokens_ids"].tolist() == [[1, -1], [2, -1]]
    with pytest.raises(ValueError, match="capacity"):
        sampler.params((2,), allowed_tokens_ids=[[1, 2, 3], [1]])
    with pytest.raises(ValueError, match="rows"):
        sampler.params((2,), allowed_tokens_ids=[[1], [2], [3]])
    with pytest.raises(ValueError, match="logit_bias_values"):
        sampler.params((1,), logit_bias_ids=[1], logit_bias_values=[float("nan")])
    with pytest.raises(ValueError, match="allowed_tokens_ids"):
        sampler.params((2,), allowed_tokens_ids=np.zeros((3, 1), int))
    with pytest.raises(ValueError, match="min_tokens_ids"):
        sampler.params((1,), min_tokens_ids=[-3])


def test_stage_chain_equals_functions_applied_by_hand():
    v, b = 8, 3
    sampler = _chain(
        stages.logit_bias(ids=[1], values=[0.5], capacity=2, clamp=100.0),
        stages.allowed_tokens(capacity=4),
        stages.min_tokens(2, stop_ids=[7], capacity=1),
        stages.suppress_tokens([6]),
        stages.suppress_tokens_at_begin([5]),
        stages.exponential_decay_length_penalty(1, 1.5, eos_ids=[7]),
        stages.forced_eos(4, eos_ids=[7]),
    )
    params = sampler.params(
        (b,),
        min_tokens=jnp.array([0, 3, 1]),
        max_new_tokens=jnp.array([1, 9, 3]),
        logit_bias_ids=[[2], [], [3, 3]],
        logit_bias_values=[[1.0], [], [200.0, -1.0]],
        allowed_tokens_ids=[[], [0, 1, 2, 7], []],
        min_tokens_ids=[[4], [], []],
    )
    state = sampler.init(params, vocab_size=v)
    step = CountingJit(sampler.sample)
    x = jax.random.normal(jax.random.key(1), (b, v))

    @jax.jit
    def by_hand(x, pos):
        y = js.logit_bias(x, ids=jnp.array([[1, 2, -1], [1, -1, -1], [1, 3, 3]]),
                          values=jnp.array([[0.5, 1.0, 0.0], [0.5, 0.0, 0.0], [0.5, 200.0, -1.0]]), clamp=100.0)
        y = js.allowed_tokens(y, jnp.array([[-1] * 4, [0, 1, 2, 7], [-1] * 4]))
        y = js.min_tokens(y, pos, jnp.array([0, 3, 1]), jnp.array([[7, 4], [7, -1], [7, -1]]))
        y = js.suppress_tokens(y, jnp.array([6]))
        y = js.suppress_tokens_at_begin(y, jnp.array([5]), pos, 0)
        y = js.exponential_decay_length_penalty(y, pos, 1, 1.5, jnp.array([7]))
        return js.forced_eos(y, pos, jnp.array([1, 9, 3]), jnp.array([7]))

    for pos in range(3):
        tokens, processed, state = step(x, state, params)
        y = by_hand(x, pos)
        np.testing.assert_allclose(processed, y, rtol=1e-6)
        np.testing.assert_array_equal(tokens, js.greedy(y))
    # new values of every kind (same capacities): no recompilation
    params2 = sampler.params(
        (b,),
        min_tokens=5,
        max_new_tokens=2,
        begin_index=1,
        exp_decay_start=0,
        exp_decay_factor=2.0,
        logit_bias_ids=[[0, 1], [2], []],
        logit_bias_values=[[-INF, 3.0], [4.0], []],
        allowed_tokens_ids=[[5], [], [1, 2]],
        min_tokens_ids=[[], [0], [1]],
    )
    jax.block_until_ready(step(x, sampler.init(params2, vocab_size=v), params2))
    assert step.traces == 1


def test_stage_without_row_ids_uses_static_ids_only():
    sampler = _chain(stages.suppress_tokens([1]), stages.ignore_eos([2]), stages.forced_bos(3))
    params = sampler.params((2,), ignore_eos=jnp.array([1, 0]), bos_id=jnp.array([3, 0]))
    state = sampler.init(params, vocab_size=4)
    processed, _ = jax.jit(sampler.process)(jnp.zeros((2, 4)), state, params)
    np.testing.assert_array_equal(kept(processed), [[0, 0, 0, 1], [1, 0, 0, 0]])  # position 0: BOS forced
    state = sampler.accept(jnp.array([3, 0]), state, params)
    processed, _ = jax.jit(sampler.process)(jnp.zeros((2, 4)), state, params)
    np.testing.assert_array_equal(kept(processed), [[1, 0, 0, 1], [1, 0, 1, 1]])


def test_dense_bias_param():
    sampler = _chain(stages.logit_bias(vocab_size=3), stages.allowed_tokens(capacity=2))
    params = sampler.params(
        (2,), logit_bias_dense=[[0.0, 1.0, 0.0], [0.0, 0.0, -2.0]], allowed_tokens_ids=[[0, 1], []]
    )
    processed, _ = jax.jit(sampler.process)(jnp.zeros((2, 3)), sampler.init(params, vocab_size=3), params)
    np.testing.assert_array_equal(processed, [[0.0, 1.0, -INF], [0.0, 0.0, -2.0]])


def test_stateless_stages_and_static_id_errors():
    sampler = _chain(stages.remove_inf_nan(), stages.log_softmax())
    params = sampler.params((1,))
    x = jnp.array([[0.0, INF, -INF]])
    processed, _ = jax.jit(sampler.process)(x, sampler.init(params, vocab_size=3), params)
    np.testing.assert_allclose(processed, js.log_softmax(js.remove_inf_nan(x)))
    with pytest.raises(ValueError, match="stop_ids"):
        stages.min_tokens(1, stop_ids=[-3])
    with pytest.raises(ValueError, match="capacity"):
        stages.allowed_tokens(capacity=-1)
    with pytest.raises(ValueError, match="min_tokens"):
        js.chain(stages.min_tokens(), select=stages.greedy()).params((2,), min_tokens=-1)
