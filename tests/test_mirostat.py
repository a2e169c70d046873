"""mirostat / mirostat_v2 / adaptive_p: formulas, sort-based differential tests, dynamics, chain selectors."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import _noise, stages
from jaxsample.samplers.mirostat import _zipf_k
from tests import reference_samplers as ref
from tests._helpers import CountingJit

B, V = 16, 200


def _rows():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(B, V)) * 2.5).astype(np.float32)
    x[1::3] = np.round(x[1::3])  # ties
    x[rng.random(x.shape) < 0.1] = -np.inf
    x[2] = -np.inf  # empty row
    x[3] = -np.inf
    x[3, 5] = 0.0  # single candidate
    x[4, 40:] = -np.inf
    return x


def _state_params(seed):
    rng = np.random.default_rng(seed)
    tau = rng.choice([1.0, 3.0, 5.0, 8.0], size=B).astype(np.float32)
    mu = (2 * tau + rng.normal(size=B)).astype(np.float32)
    eta = rng.choice([0.05, 0.1, 0.5], size=B).astype(np.float32)
    return mu, tau, eta


# ------------------------------------------------------------------------------------------ mirostat
@pytest.mark.parametrize("s", [0.8, 1.0, 1.2, 2.0])
@pytest.mark.parametrize("mu", [2.0, 6.0, 10.0])
def test_zipf_k_matches_the_formula(s, mu):
    n = np.arange(1, 5001, dtype=np.float64)
    x = jnp.asarray(-s * np.log(n), jnp.float32)  # exact Zipf: the estimate is s itself
    e = s - 1
    ratio = math.log(5000) if e == 0 else (1 - 5000.0**-e) / e
    k = (2.0**mu / ratio) ** (1 / s)
    got = int(_zipf_k(x, jnp.float32(mu), 100, 5000))
    assert abs(got - min(max(math.floor(k), 1), 5000)) <= max(1, 1e-4 * k)  # float32 vs float64


def test_zipf_k_degenerate_rows():
    x = jnp.array([[-jnp.inf] * 5, [-jnp.inf, 2.0, -jnp.inf, -jnp.inf, -jnp.inf], [0.0] * 5])
    k = _zipf_k(x, jnp.array([5.0, 5.0, 5.0]), 100, 5)
    # no estimate with < 2 finite logits: k = 1; uniform (s = 0): 2**mu > n - 1, so k overflows to V
    assert k.tolist() == [1, 1, 5]


def test_mirostat_single_step_by_hand():
    # k = 1 (one candidate): the token has probability 1, surprise 0, so mu += eta * tau
    keys = jax.random.split(jax.random.key(1), 8)
    x = jnp.tile(jnp.array([-jnp.inf, 3.0, -jnp.inf]), (8, 1))
    for fn in (js.mirostat, js.mirostat_v2):
        tokens, mu = jax.jit(fn)(keys, x, 4.0, 3.0, 0.5)
        assert tokens.tolist() == [1] * 8 and mu.tolist() == [5.5] * 8
    # v2 keeps tokens with surprise <= mu: p = (0.5, 0.25, 0.25), mu = 2 keeps all; draw renormalised
    x = jnp.tile(jnp.log(jnp.array([0.5, 0.25, 0.25])), (8, 1))
    tokens, mus = jax.jit(js.mirostat_v2)(keys, x, 2.0, 1.0, 1.0)
    assert len(set(tokens.tolist())) > 1
    np.testing.assert_allclose(mus, 2.0 - (-np.log2(np.array([0.5, 0.25, 0.25]))[np.asarray(tokens)] - 1.0))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_mirostat_matches_sort_based_reference(version):
    fn = js.mirostat if version == "v1" else js.mirostat_v2
    reference = ref.mirostat if version == "v1" else ref.mirostat_v2

    def run(keys, x, mu, tau, eta):
        noise = _noise.gumbel_all(keys, x.shape[-1])
        return fn(keys, x, mu, tau, eta), reference(noise, x, mu, tau, eta)

    run = CountingJit(run)
    x = jnp.asarray(_rows())
    keys = jax.random.split(jax.random.key(2), B)
    for seed in (0, 1):  # new state and parameter values: no retrace
        (tok, mu), (tok_ref, mu_ref) = run(keys, x, *_state_params(seed))
        np.testing.assert_array_equal(tok, tok_ref)
        finite = np.isfinite(np.asarray(mu_ref))
        np.testing.assert_allclose(np.asarray(mu)[finite], np.asarray(mu_ref)[finite], rtol=1e-5, atol=1e-5)
        assert float(mu[2]) == _state_params(seed)[0][2]  # empty row: state unchanged
    assert run.traces == 1


@functools.partial(jax.jit, static_argnums=(0, 4))  # one program per selector: tau and eta traced
def _run_chain(fn, x, tau, eta, steps, seed=0):
    def step(mu, i):
        tok, mu = fn(jax.random.fold_in(jax.random.key(seed), i), x, mu, tau, eta)
        return mu, (mu, tok)

    _, (mus, toks) = jax.lax.scan(step, 2 * jnp.float32(tau), jnp.arange(steps))
    return mus, toks


@pytest.mark.parametrize("fn", [pytest.param(js.mirostat, marks=pytest.mark.slow), js.mirostat_v2])
def test_mu_dynamics_on_a_fixed_distribution(fn):
    """On Zipf(1.1), mu settles (no drift) and the renormalised surprise averages tau; a larger tau
    draws rarer tokens."""
    x = -1.1 * jnp.log(jnp.arange(1, 1001.0))
    surprise_orig = -np.asarray(jax.nn.log_softmax(x)) / math.log(2)
    means = {}
    for tau in (3.0, 5.0):
        mus, toks = map(np.asarray, _run_chain(fn, x, tau, 0.1, 2000))
        settled = mus[500:]
        assert settled.max() - settled.min() < 8.0
        assert abs(settled[:750].mean() - settled[750:].mean()) < 1.0  # no drift
        observed = tau - np.diff(np.concatenate([[2 * tau], mus])) / 0.1  # surprise of each draw
        assert abs(observed[500:].mean() - tau) < 0.05
        means[tau] = surprise_orig[toks[500:]].mean()
    assert means[5.0] > means[3.0] + 1.0


# ---------------------------------------------------------------------------------------- adaptive-p
def test_adaptive_p_init_and_update_by_hand():
    ws, tw = js.adaptive_p_init(0.3, 0.9)
    np.testing.assert_allclose([ws, tw], [3.0, 10.0], rtol=1e-6)
    x = jnp.log(jnp.array([0.6, 0.3, 0.1]))
    f32 = np.float32
    step = jax.jit(js.adaptive_p)
    token, state = step(jax.random.key(0), x, ws, tw, f32(0.3), f32(0.9))
    p = [0.6, 0.3, 0.1][int(token)]
    np.testing.assert_allclose(state, [p + 0.9 * 3.0, 1 + 0.9 * 10.0], rtol=1e-6)
    # total_weight == 0 uses the target itself; decay is clamped to 0.99 when traced
    token, state = step(jax.random.key(0), x, f32(0.0), f32(0.0), f32(0.3), f32(1.5))
    np.testing.assert_allclose(state, [[0.6, 0.3, 0.1][int(token)], 1.0], rtol=1e-6)
    token, state = step(jax.random.key(0), x, f32(1.0), f32(1.0), f32(0.3), f32(1.5))
    np.testing.assert_allclose(state, [[0.6, 0.3, 0.1][int(token)] + 0.99, 1.99], rtol=1e-6)


def test_adaptive_p_matches_sort_based_reference():
    def run(keys, x, ws, tw, target, decay):
        noise = _noise.gumbel_all(keys, x.shape[-1])
        return js.adaptive_p(keys, x, ws, tw, target, decay), ref.adaptive_p(noise, x, ws, tw, target, decay)

    run = CountingJit(run)
    x = jnp.asarray(_rows())
    keys = jax.random.split(jax.random.key(4), B)
    rng = np.random.default_rng(5)
    for _ in range(2):
        target = rng.choice([-1.0, 0.0, 0.1, 0.3, 0.9, 1.2], size=B).astype(np.float32)
        decay = rng.choice([0.0, 0.5, 0.9, 0.99], size=B).astype(np.float32)
        ws, tw = (np.asarray(a) for a in js.adaptive_p_init(np.clip(target, 0, 1), decay))
        tw = np.where(rng.random(B) < 0.2, 0.0, tw).astype(np.float32)
        (tok, state), (tok_ref, state_ref) = run(keys, x, ws, tw, target, decay)
        np.testing.assert_array_equal(tok, tok_ref)
        np.testing.assert_allclose(state.weighted_sum[np.r_[0:2, 3:B]], state_ref[0][np.r_[0:2, 3:B]], rtol=1e-6)
        np.testing.assert_allclose(state.total_weight[np.r_[0:2, 3:B]], state_ref[1][np.r_[0:2, 3:B]], rtol=1e-6)
        unchanged = (target < 0) | (np.arange(B) == 2)  # target < 0 (plain sampling) and the empty row
        np.testing.assert_array_equal(state.weighted_sum[unchanged], ws[unchanged])
        np.testing.assert_array_equal(state.total_weight[unchanged], tw[unchanged])
    assert run.traces == 1


def test_adaptive_p_tracks_its_target():
    p = np.array([0.6, 0.3, 0.1], np.float32)
    x = jnp.log(jnp.asarray(p))

    def step(state, i):
        tok, state = js.adaptive_p(jax.random.fold_in(jax.random.key(6), i), x, *state, 0.3, 0.9)
        return state, tok

    state, toks = jax.lax.scan(step, js.adaptive_p_init(0.3, 0.9), jnp.arange(3000))
    assert abs(p[np.asarray(toks)].mean() - 0.3) < 0.03  # plain sampling would average 0.46
    assert abs(float(state.weighted_sum / state.total_weight) - 0.3) < 0.1


# ------------------------------------------------------------------------------ validation and chains
def test_validation_errors():
    x = jnp.zeros(5)
    with pytest.raises(ValueError, match="decay"):
        js.adaptive_p(jax.random.key(0), x, 0.0, 0.0, 0.5, 1.0)
    with pytest.raises(ValueError, match="m "):
        js.mirostat(jax.random.key(0), x, 10.0, 5.0, 0.1, m=0)
    with pytest.raises(ValueError, match="mu"):
        js.mirostat_v2(jax.random.key(0), x, float("nan"), 5.0, 0.1)
    with pytest.raises(ValueError, match="tau"):
        js.mirostat(jax.random.key(0), jnp.zeros((2, 5)), 10.0, jnp.ones(3), 0.1)


@pytest.mark.parametrize(
    "selector,state_of",
    [
        (stages.mirostat(), lambda s: s),
        (stages.mirostat_v2(), lambda s: s),
        (stages.adaptive_p(0.3), lambda s: s.weighted_sum),
    ],
)
def test_chain_selectors_keep_per_row_state(selector, state_of):
    sampler = js.chain(stages.temperature(1.0), select=selector)
    x = jnp.asarray(_rows()[:4])
    names = {p.name for p in selector.params}
    values = {
        "mirostat_tau": jnp.array([3.0, 4.0, 5.0, 6.0]),
        "mirostat_eta": jnp.array([0.1, 0.2, 0.1, 0.3]),
        "adaptive_p_target": jnp.array([0.1, 0.3, -1.0, 0.5]),
        "adaptive_p_decay": jnp.array([0.5, 0.9, 0.9, 0.0]),
    }
    params = sampler.params((4,), seed=jnp.arange(4), **{k: v for k, v in values.items() if k in names})
    state = sampler.init(params, vocab_size=V)
    if "mirostat_tau" in names:
        np.testing.assert_allclose(state.selector, 2 * params["mirostat_tau"])
    step = CountingJit(sampler.sample)
    states = []
    for _ in range(3):
        tokens, _, state = step(x, state, params)
        states.append(np.asarray(state_of(state.selector)))
    # rows are independent of their batch: row 1 (logits, seed, parameters) in every slot
    p1 = {k: jnp.broadcast_to(v[1], v.shape) for k, v in params.items()}
    s1 = sampler.init(p1, vocab_size=V)
    for i in range(3):
        _, _, s1 = step(jnp.broadcast_to(x[1], x.shape), s1, p1)
        np.testing.assert_allclose(np.asarray(state_of(s1.selector)), states[i][1], rtol=1e-6)
    assert step.traces == 1  # new parameter values and states never retrace
