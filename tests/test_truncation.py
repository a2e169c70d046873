"""Truncation filters: upstream test vectors (llama.cpp, HF), sort-based differential tests, invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from jaxsample import _noise
from tests import reference_samplers as ref
from tests._helpers import CountingJit, kept, probs_logits, renormalised

P4 = [0.1, 0.2, 0.3, 0.4]

# One jitted entry point per filter (parameters traced), shared by every test of this module.
J = {
    "top_k": jax.jit(js.top_k),
    "top_k_exact": jax.jit(functools.partial(js.top_k, exact=True)),
    "top_p": jax.jit(js.top_p),
    "min_p": jax.jit(js.min_p),
    "typical": jax.jit(js.typical),
    "top_n_sigma": jax.jit(js.top_n_sigma),
    "top_h": jax.jit(js.top_h),
    "epsilon_cutoff": jax.jit(js.epsilon_cutoff),
    "eta_cutoff": jax.jit(js.eta_cutoff),
    "p_less": jax.jit(js.p_less),
    "xtc": jax.jit(js.xtc),
}

V_SMALL = 16


def small(name, *args):
    """``J[name]`` on rows padded with ``-inf`` to one shape ``[4, V_SMALL]``, sliced back.

    Padding with removed tokens changes no filter's result, and all small hand cases then share one
    compilation per filter.
    """
    i = 1 if name == "xtc" else 0
    x = jnp.asarray(args[i])
    rows = x.reshape(-1, x.shape[-1])
    padded = jnp.full((4, V_SMALL), -jnp.inf, x.dtype).at[: rows.shape[0], : rows.shape[1]].set(rows)
    out = J[name](*args[:i], padded, *args[i + 1 :])
    return out[: rows.shape[0], : rows.shape[1]].reshape(x.shape)


def _kept_probs(out, original_probs):
    """Original probabilities of the kept tokens, descending (llama.cpp tests without ``dist``)."""
    return sorted(np.asarray(original_probs)[kept(out)].tolist(), reverse=True)


def _dist_probs(out):
    """Probabilities after ``dist`` (softmax over kept tokens), descending."""
    r = renormalised(out)
    return sorted(r[r > 0].tolist(), reverse=True)


# ------------------------------------------------------------------- llama.cpp tests/test-sampling.cpp
@pytest.mark.parametrize(
    "k,expected",
    [(1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]), (0, [0.4, 0.3, 0.2, 0.1])],
)
def test_llama_top_k(k, expected):
    for name in ("top_k", "top_k_exact"):
        np.testing.assert_allclose(_dist_probs(small(name, probs_logits(P4), k)), expected, atol=1e-5)


@pytest.mark.parametrize(
    "p,expected",
    [(0.0, [1.0]), (0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]), (1.0, [0.4, 0.3, 0.2, 0.1])],
)
def test_llama_top_p(p, expected):
    np.testing.assert_allclose(_dist_probs(small("top_p", probs_logits(P4), p, 0)), expected, atol=1e-5)


@pytest.mark.parametrize(
    "p,expected",
    [
        (0.00, [0.4, 0.3, 0.2, 0.1]),
        (0.24, [0.4, 0.3, 0.2, 0.1]),
        (0.26, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9]),
        (0.49, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9]),
        (0.51, [0.4 / 0.7, 0.3 / 0.7]),
        (0.74, [0.4 / 0.7, 0.3 / 0.7]),
        (0.76, [1.0]),
        (1.00, [1.0]),
        (1.05, [1.0]),
    ],
)
def test_llama_min_p(p, expected):
    np.testing.assert_allclose(_dist_probs(small("min_p", probs_logits(P4), p, 0)), expected, atol=1e-5)


@pytest.mark.parametrize(
    "t,expected", [(0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1])]
)
def test_llama_xtc(t, expected):
    probs = [0.4, 0.3, 0.2, 0.1]
    # upstream draws with seed 0 and probability 0.99; probability 1 makes the draw irrelevant
    out = small("xtc", jax.random.key(0), probs_logits(probs), 1.0, t, 0)
    np.testing.assert_allclose(_kept_probs(out, probs), expected, atol=1e-5)


def test_llama_typical():
    for probs, expected in [([0.97, 0.01, 0.01, 0.01], [0.97]), ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2])]:
        out = small("typical", probs_logits(probs), 0.5, 0)
        np.testing.assert_allclose(_kept_probs(out, probs), expected, atol=1e-5)


@pytest.mark.parametrize(
    "n,expected", [(1.0, [0.571429, 0.428571]), (0.0, [0.4, 0.3, 0.2, 0.1]), (3.0, [0.4, 0.3, 0.2, 0.1])]
)
def test_llama_top_n_sigma(n, expected):
    np.testing.assert_allclose(_dist_probs(small("top_n_sigma", probs_logits(P4), n)), expected, atol=1e-5)


def _top_n_sigma_float64(x: np.ndarray, n: float) -> np.ndarray:
    finite = np.isfinite(x)
    y = x[finite].astype(np.float64)
    return finite & (x >= y.max() - n * y.std())


def test_top_n_sigma_rows_that_overflowed_or_cancelled_keep_the_float64_set_in_any_batch():
    """Rows whose moments overflowed float32 (logits near 1e37) or cancelled (logits 1 + 0..3 ulp) keep
    the tokens a float64 computation keeps, alone, in a batch of 8 and of 64 (before: alone and in a
    batch kept different sets on XLA:CPU, whose summation order depends on the batch size)."""
    rng = np.random.default_rng(3)
    v = 1000
    huge = (rng.normal(0.0, 3.0, v) * 1e37).astype(np.float32)
    gaps = (1.0 + rng.integers(0, 4, v) * 1e-7).astype(np.float32)
    gaps[rng.random(v) < 0.15] = -np.inf
    rows = np.stack([huge, gaps] + [rng.normal(0.0, 3.0, v).astype(np.float32) for _ in range(62)])
    n = np.full(64, 2.05, np.float32)
    for r in (0, 1):
        want = _top_n_sigma_float64(rows[r], 2.05)
        assert 1 < want.sum() < np.isfinite(rows[r]).sum()  # the filter bites: neither all nor only the maximum
        for batch in (rows[r : r + 1], rows[:8], rows):
            got = np.asarray(J["top_n_sigma"](batch, n[: len(batch)]))[0 if len(batch) == 1 else r]
            np.testing.assert_array_equal(got > -np.inf, want, err_msg=f"row {r}, batch of {len(batch)}")


def _finite_rows(seed: int, v: int = 4096) -> np.ndarray:
    """64 all-finite rows: flat, peaked, ties, huge (near 1e37) and tiny spreads."""
    rng = np.random.default_rng(seed)
    zipf = -1.6 * np.log(rng.permutation(v) + 1.0)
    rows = [zipf + 0.1 * rng.normal(size=v), np.round(rng.normal(0.0, 2.0, v)), rng.normal(0.0, 3.0, v) * 1e37,
            1.0 + rng.integers(0, 4, v) * 1e-7, np.full(v, 5.0)]
    rows += list(rng.normal(0.0, 2.0, (64 - len(rows), v)))
    return np.stack(rows).astype(np.float32)


def _rows_of(*values):
    return (np.resize(np.float32(values), 64),)


@pytest.mark.parametrize(
    "name,args",
    [
        ("top_n_sigma", _rows_of(1.0, 0.5, 3.0, 2.05, np.inf)),
        ("eta_cutoff", _rows_of(3e-4, 0.1, 1e-8)),
        ("epsilon_cutoff", _rows_of(3e-4, 0.01, 1e-8)),
        ("top_p", _rows_of(0.95, 0.5, 0.999)),
        ("typical", _rows_of(0.9, 0.5, 0.999)),
        ("p_less", (np.resize(np.int32([1, 3]), 64),)),
        ("dynamic_temperature", _rows_of(0.8, 1.5) + _rows_of(0.5, 0.0, 2.0)),
    ],
)
def test_all_finite_batches_match_the_general_path(name, args):
    """A batch without NaN skips the NaN map (and, for ``top_n_sigma``, a batch of finite logits skips
    the masks and the empty-row guard); a batch with one NaN anywhere takes the general program, as
    does ``top_n_sigma``'s with one ``-inf``. Every row comes out the same, bit for bit, either way."""
    fn = J.get(name) or jax.jit(getattr(js, name))
    rows = _finite_rows(5)
    alone = np.asarray(fn(rows, *args))
    out = {}
    for spoil in (-np.inf, np.nan):  # the last row becomes the first one spoiled (one batch shape: one compile)
        batch = rows.copy()
        batch[-1] = rows[0]
        batch[-1, 7] = spoil
        out[spoil] = np.asarray(fn(batch, *(np.concatenate([a[:-1], a[:1]]) for a in args)))
        mixed = out[spoil][:-1]
        np.testing.assert_array_equal(mixed.view(np.uint32), alone[:-1].view(np.uint32), err_msg=f"{name}, {spoil}")
    # the NaN is treated as -inf (whatever path each batch took)
    np.testing.assert_array_equal(out[np.nan].view(np.uint32), out[-np.inf].view(np.uint32), err_msg=name)


def test_llama_fork_p_less():
    out = small("p_less", probs_logits([0.1, 0.15, 0.2, 0.25, 0.3]), 1)
    np.testing.assert_allclose(_dist_probs(out), [0.54545455, 0.45454545], atol=1e-5)
    out = small("p_less", probs_logits([0.2] * 5), 1)  # p == sum p^2 exactly: every token kept
    np.testing.assert_allclose(_dist_probs(out), [0.2] * 5, atol=1e-5)


def _queue_p_expectation(n_vocab, min_id, top_p):
    """Upstream ``test_sampler_queue`` expectation after top-p: ``(size, min_token_id)``."""
    divisor = n_vocab * (n_vocab - 1) // 2 - min_id * (min_id - 1) // 2
    target = int(np.ceil(np.float32(top_p) * np.float32(divisor)))  # ceilf(float * float)
    min_id, size, cum = n_vocab, 0, 0
    while True:  # do-while: at least one token
        min_id -= 1
        size += 1
        cum += min_id
        if cum >= target:
            break
    if min_id == 1:  # token 0 has p == 0 and comes along
        min_id, size = 0, size + 1
    return size, min_id


QUEUE = [
    ("k", 10000, 1.0, 1.0), ("k", 1, 1.0, 1.0), ("p", 10000, 1.0, 1.0), ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0), ("m", 10000, 1.0, 1e-12), ("k", 100, 1.0, 1.0), ("p", 10000, 0.0003, 1.0),
    ("p", 10000, 0.8, 1.0), ("m", 10000, 1.0, 9997.9 / 9999.0), ("m", 10000, 1.0, 0.1),
    ("kp", 100, 0.8, 0.1), ("km", 100, 0.8, 0.1), ("pk", 100, 0.8, 0.1), ("pm", 100, 0.8, 0.1),
    ("mk", 100, 0.8, 0.1), ("mp", 100, 0.8, 9997.9 / 9999.0), ("mp", 100, 0.8, 0.1),
    ("kpm", 100, 0.8, 0.1), ("kmp", 100, 0.8, 0.1), ("pkm", 100, 0.8, 0.1), ("pmk", 100, 0.8, 0.1),
    ("mkp", 100, 0.8, 0.1), ("mpk", 100, 0.8, 0.1),
]  # fmt: skip


@pytest.mark.parametrize("seq,top_k,top_p,min_p", QUEUE)
def test_llama_sampler_queue(seq, top_k, top_p, min_p):
    """Upstream ``test_sampler_queue`` on ``logits = log(id)``, ``n_vocab = 10000``.

    llama.cpp's candidate array still holds token 0 (logit ``-inf``) until a sampler truncates
    it away; ``size`` below is that array's size, i.e. our finite count plus that token.
    """
    n_vocab = 10000
    f32 = np.float32
    x = jnp.log(jnp.arange(n_vocab, dtype=jnp.float32))
    ids = np.arange(n_vocab)
    min_id, zero_in, size = 0, True, n_vocab
    for s in seq:
        if s == "k":
            x = J["top_k_exact"](x, top_k)
            zero_in = zero_in and top_k >= size
            size = kept(x).sum() + zero_in
            assert size == min(size, top_k)
            min_id = max(min_id, n_vocab - top_k)
        elif s == "p":
            x = J["top_p"](x, f32(top_p), 1)
            expected_size, min_id = _queue_p_expectation(n_vocab, min_id, top_p)
            zero_in = zero_in and min_id == 0
            size = kept(x).sum() + zero_in
            assert size == expected_size
        else:
            x = J["min_p"](x, f32(min_p), 1)
            zero_in = False
            size = kept(x).sum()
            assert size == min(max(int(np.ceil((f32(1) - f32(min_p)) * f32(n_vocab))), 1), size)
            min_id = max(int(np.floor(f32(min_p) * f32(n_vocab))), 1, n_vocab - size)
            min_id = min(min_id, n_vocab - 1)
        # upstream checks the last id only when the array is sorted; the kept set is always a top range
        np.testing.assert_array_equal(ids[kept(x)], np.arange(max(min_id, 1), n_vocab), err_msg=s)


# ------------------------------------------------------------- HF tests/generation/test_logits_process.py
RAMP = jnp.stack([jnp.arange(10.0) - 5, (jnp.arange(10.0) - 5) * 100])


def test_hf_top_k():
    ramp = jnp.tile(jnp.arange(10.0), (2, 1)).at[1, :5].add(10.0)
    np.testing.assert_array_equal(kept(small("top_k", ramp, 3)), [[0] * 7 + [1] * 3, [0, 0, 1, 1, 1] + [0] * 5])
    uniform = jnp.full((2, 5), 0.2)
    assert kept(small("top_k", uniform, 3)).all()  # ties with the k-th value are kept
    # HF's min_tokens_to_keep=3 with top_k=1 is top_k(max(1, 3))
    assert kept(small("top_k", jnp.tile(jnp.arange(5.0), (2, 1)), 3)).sum(-1).tolist() == [3, 3]


def test_hf_top_p():
    dist = probs_logits([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]])
    np.testing.assert_array_equal(kept(small("top_p", dist, 0.8, 1)), [[1, 0, 0, 1], [0, 1, 1, 1]])
    # The reference's boundary (cum[1] == 0.2 <= 1 - 0.8) is decided by rounding: torch on CPU and
    # XLA:CPU sum in order; a GPU scan/softmax rounds the other way. The function above decides it
    # the same on both (checked on an H200).
    with jax.default_device(jax.devices("cpu")[0]):
        np.testing.assert_array_equal(kept(ref.top_p_hf(dist, 0.8)), [[1, 0, 0, 1], [0, 1, 1, 1]])
    assert kept(small("top_p", RAMP, 0.9, 2)).sum(-1).tolist() == [3, 2]


def test_hf_min_p():
    dist = probs_logits([[0.9, 0.0274, 0.047, 0.0274], [0.15, 0.3, 0.3, 0.25], [0.97, 0.01, 0.01, 0.01]])
    expected = [[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    np.testing.assert_array_equal(kept(small("min_p", dist, 0.05, 1)), expected)
    assert kept(small("min_p", RAMP, 0.9, 2)).sum(-1).tolist() == [2, 2]


def test_hf_typical():
    dist = probs_logits([[0.97, 0.01, 0.01, 0.01], [0.4, 0.2, 0.2, 0.2]])
    np.testing.assert_array_equal(kept(small("typical", dist, 0.5, 1)), [[1, 0, 0, 0], [0, 1, 1, 1]])
    assert kept(small("typical", jnp.full((2, 5), 0.2), 0.5, 3)).all()  # uniform: ties keep every token
    assert kept(small("typical", RAMP, 0.7, 2)).sum(-1).tolist() == [2, 2]


def test_hf_epsilon():
    dist = probs_logits([[0.87, 0.099, 0.001, 0.03], [0.4, 0.299, 0.101, 0.2]])
    np.testing.assert_array_equal(kept(small("epsilon_cutoff", dist, 0.1, 1)), [[1, 0, 0, 0], [1, 1, 1, 1]])
    assert kept(small("epsilon_cutoff", RAMP, 5e-2, 2)).sum(-1).tolist() == [3, 2]


def test_hf_eta():
    dist = probs_logits([[0.0, 0.1, 0.8, 0.1], [0.01, 0.04, 0.9, 0.05]])
    np.testing.assert_array_equal(kept(small("eta_cutoff", dist, 0.0625, 1)), [[0, 1, 1, 1], [0, 0, 1, 0]])
    assert kept(small("eta_cutoff", RAMP, 0.1, 2)).sum(-1).tolist() == [2, 2]


@pytest.mark.parametrize(
    "probs,h,expected",
    [
        ([0.97, 0.01, 0.01, 0.01], 0.3, [1, 0, 0, 0]),
        ([0.4, 0.3, 0.2, 0.1], 0.7, [1, 1, 0, 0]),
        ([0.25, 0.25, 0.25, 0.25], 1.0, [1, 1, 1, 1]),
        ([0.75, 0.25, 0.0, 0.0], 0.4, [1, 0, 0, 0]),
    ],
)
def test_hf_top_h(probs, h, expected):
    np.testing.assert_array_equal(kept(small("top_h", probs_logits(probs), h)), expected)


def test_top_h_restricts_to_top_n():
    x = -jnp.arange(300.0) / 100  # nearly uniform: top_h = 1 keeps all of the top 100 and nothing else
    assert kept(J["top_h"](x, 1.0)).tolist() == [True] * 100 + [False] * 200
    assert kept(js.top_h(x, 1.0, top_n=7)).sum() == 7


# ------------------------------------------------------------------------------ tie and float policy
def test_float_policy_knife_edges():
    # mass exactly p in real arithmetic: counts as reached
    assert kept(small("top_p", probs_logits(P4), 0.7, 1)).tolist() == [False, False, True, True]
    # 80 tokens of log(id) over ids 9900..9999 carry exactly 0.8 of the mass (796760 / 995950)
    x = jnp.full(10000, -jnp.inf).at[:100].set(jnp.log(jnp.arange(9900, 10000, dtype=jnp.float32)))
    assert kept(J["top_p"](x, np.float32(0.8), 1)).sum() == 80
    # a mass short by 1e-5 is not reached
    assert kept(small("top_p", probs_logits(P4), 0.70001, 1)).sum() == 3
    # strict typical: the three (most typical) 0.2s sum to 0.6, which is not "more than 0.6"
    x = probs_logits([0.4, 0.2, 0.2, 0.2])
    assert kept(small("typical", x, 0.6, 1)).sum() == 4
    assert kept(small("typical", x, 0.59, 1)).sum() == 3


def test_ties_at_the_cutoff_are_kept():
    x = jnp.array([1.0, 2.0, 2.0, 2.0, 0.0])
    assert kept(small("top_k", x, 2)).sum() == 3
    assert kept(small("top_k_exact", x, 2)).tolist() == [False, True, True, False, False]
    assert kept(small("top_p", x, 0.1, 1)).sum() == 3


# ------------------------------------------------------------------------- differential (sort-based)
V_DIFF, B_DIFF = 200, 16


def _diff_rows():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(B_DIFF, V_DIFF)) * 2).astype(np.float32)
    x[1::3] = np.round(x[1::3] * 2) / 2  # heavy ties
    x[rng.random(x.shape) < 0.15] = -np.inf
    x[2, :] = -np.inf  # empty row
    x[3, :] = -np.inf
    x[3, 7] = 1.0  # single candidate
    x[4, 11] = np.inf  # a certain token
    x[5, 30:] = -np.inf  # fits the candidates
    x[6] = 0.5  # uniform
    return x


def _pick(rng, values, p=None):
    return np.asarray(rng.choice(values, size=B_DIFF, p=p))


def _diff_params(name, seed):
    rng = np.random.default_rng(seed)
    mk = _pick(rng, [0, 1, 1, 2, 5, 70]).astype(np.int32)
    prob = np.where(rng.random(B_DIFF) < 0.7, rng.random(B_DIFF), _pick(rng, [0.0, 1.0, 1.5])).astype(np.float32)
    table = {
        "top_k": (_pick(rng, [-1, 0, 1, 3, 17, 64, 65, 150, 199, 200, 250]).astype(np.int32),),
        "top_p": (prob, mk),
        "min_p": (np.where(prob > 1, 1.5, prob * 0.3).astype(np.float32), mk),
        "typical": (prob, mk),
        "top_n_sigma": (_pick(rng, [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]).astype(np.float32),),
        "top_h": (np.minimum(prob, 1.0),),
        "epsilon_cutoff": (_pick(rng, [0.0, 1e-4, 1e-3, 0.01, 0.1, 0.5]).astype(np.float32), mk),
        "eta_cutoff": (_pick(rng, [0.0, 1e-4, 1e-3, 0.01, 0.1, 0.5]).astype(np.float32), mk),
        "p_less": (mk,),
        "xtc": (
            _pick(rng, [0.0, 0.5, 1.0]).astype(np.float32),
            _pick(rng, [0.0, 0.01, 0.05, 0.1, 0.3, 0.6]).astype(np.float32),
            mk,
        ),
    }
    table["top_k_exact"] = table["top_k"]
    return table[name]


def _fast(name, candidates):
    fn = {
        "top_k": js.top_k,
        "top_k_exact": functools.partial(js.top_k, exact=True),
        "top_p": js.top_p,
        "typical": js.typical,
    }.get(name)
    if fn is not None:
        return functools.partial(fn, candidates=candidates)
    return getattr(js, name)


_REFS = {
    "top_k": ref.top_k, "top_k_exact": ref.top_k_exact, "top_p": ref.top_p, "min_p": ref.min_p,
    "typical": ref.typical, "top_n_sigma": ref.top_n_sigma, "top_h": ref.top_h,
    "epsilon_cutoff": ref.epsilon_cutoff, "eta_cutoff": ref.eta_cutoff, "p_less": ref.p_less,
}  # fmt: skip


def _differential(name):
    """One jitted function: the fast path, the forced fallback (tiny candidate set), the reference."""

    def run(keys, x, *params):
        if name == "xtc":
            return [js.xtc(keys, x, *params), ref.xtc(_noise.uniform(keys), x, *params)]
        outs = [_fast(name, c)(x, *params) for c in (64, 4)]
        return outs + [_REFS[name](x, *params)]

    return CountingJit(run)


@jax.jit
def _tokens(keys, fast, reference):
    """The library's draw from the fast output, and Gumbel-max over the reference with the same noise."""
    noise = _noise.gumbel_all(keys, reference.shape[-1])
    expected = jnp.argmax(jnp.where(reference > -jnp.inf, reference + noise, -jnp.inf), axis=-1)
    return js.categorical(keys, fast), expected


@pytest.mark.parametrize("name", sorted(J))
def test_matches_sort_based_reference(name):
    run = _differential(name)
    x = _diff_rows()
    keys = jax.random.split(jax.random.key(1), B_DIFF)
    for seed in (0, 1):  # new parameter values: no retrace
        params = _diff_params(name, seed)
        outs = run(keys, jnp.asarray(x), *params)
        for out in outs[:-1]:
            np.testing.assert_array_equal(kept(out), kept(outs[-1]))
            np.testing.assert_array_equal(np.asarray(out), np.where(kept(outs[-1]), x, -np.inf))
        drawn, expected = _tokens(keys, outs[0], outs[-1])
        np.testing.assert_array_equal(drawn, expected)
        # a row's result does not depend on the rest of its batch
        for r in (0, 4, 9):
            alone = [np.tile(np.asarray(p)[r], B_DIFF) for p in params]
            outs_r = run(keys[np.full(B_DIFF, r)], jnp.asarray(np.tile(x[r], (B_DIFF, 1))), *alone)
            np.testing.assert_array_equal(np.asarray(outs_r[0])[0], np.asarray(outs[0])[r])
    assert run.traces == 1


def test_bfloat16_in_bfloat16_out():
    x = jnp.asarray(_diff_rows()[:4, :V_SMALL], jnp.bfloat16)
    args = {"top_k": (3,), "top_k_exact": (3,), "top_n_sigma": (1.0,), "top_h": (0.5,), "p_less": (1,)}
    for name in sorted(J):
        a = args.get(name, (0.5, 1) if name != "xtc" else (1.0, 0.05, 1))
        pre = (jax.random.key(0),) if name == "xtc" else ()
        out = small(name, *pre, x, *a)
        assert out.dtype == jnp.bfloat16, name
        expected = small(name, *pre, x.astype(jnp.float32), *a)
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected), err_msg=name)


# ------------------------------------------------------------------------------------------ invariants
OFF = {
    "top_k": [(0,), (-3,), (7,), (V_SMALL,)],
    "top_p": [(1.0, 1), (1.5, 3)],
    "min_p": [(0.0, 1)],
    "typical": [(1.0, 1)],
    "top_n_sigma": [(0.0,), (-1.0,)],
    "top_h": [(0.0,)],
    "epsilon_cutoff": [(0.0, 1)],
    "eta_cutoff": [(0.0, 1)],
}


@pytest.mark.parametrize("name", sorted(OFF))
def test_off_values_are_identity(name):
    x = jnp.array([[0.3, -1.0, 2.0, 2.0, -jnp.inf, 0.1, 5.0]])
    for args in OFF[name]:
        np.testing.assert_array_equal(small(name, x, *args), x)


def test_xtc_off_and_no_op_cases():
    x = probs_logits([0.4, 0.3, 0.2, 0.1])
    key = jax.random.key(0)
    for prob, thr, mk in [(0.0, 0.1, 0), (1.0, 0.51, 0), (1.0, 0.35, 0), (1.0, 0.09, 2)]:
        np.testing.assert_array_equal(small("xtc", key, x, prob, thr, mk), x)
    single = jnp.array([-jnp.inf, 2.0, -jnp.inf, -jnp.inf])  # fewer than 2 candidates
    np.testing.assert_array_equal(small("xtc", key, single, 1.0, 0.0, 0), single)


def test_xtc_applies_with_the_given_probability():
    x = jnp.tile(probs_logits([0.4, 0.3, 0.2, 0.1]), (20000, 1))
    keys = jax.random.split(jax.random.key(3), 20000)
    applied = ~kept(J["xtc"](keys, x, 0.3, 0.1, 1))[:, 0]
    # binomial(20000, 0.3): sd = 64.8; 5 sd
    assert abs(applied.sum() - 6000) < 325
    # the decision is the row's uniform draw: applied iff u <= probability
    np.testing.assert_array_equal(applied, np.asarray(_noise.uniform(keys)) <= np.float32(0.3))


def test_min_keep_is_honoured():
    x = jnp.array([[10.0, 0.0, -1.0, -2.0, -3.0, -4.0]])
    for name in ("top_p", "min_p", "epsilon_cutoff", "eta_cutoff"):
        out = small(name, x, {"top_p": 0.0}.get(name, 0.5), 4)
        assert kept(out).tolist() == [[True, True, True, True, False, False]], name
    assert kept(small("p_less", x, 3)).sum() == 3
    assert kept(small("typical", x, 0.0, 4)).sum() == 4


def test_validation_errors():
    x = jnp.zeros((2, 5))
    cases = [
        (js.top_p, (x, -0.1), "top_p"),
        (js.min_p, (x, -0.1), "min_p"),
        (js.typical, (x, -0.5), "typical"),
        (js.epsilon_cutoff, (x, -1e-3), "epsilon"),
        (js.eta_cutoff, (x, -1e-3), "epsilon"),
        (js.top_h, (x, 1.5), "top_h"),
        (js.top_h, (x, -0.5), "top_h"),
        (js.top_k, (x, 2.5), "top_k"),
        (js.top_p, (x, 0.5, -1), "min_keep"),
        (js.top_p, (x, jnp.ones(3) * 0.5), "top_p"),
        (js.top_n_sigma, (x, float("nan")), "top_n_sigma"),
        (js.xtc, (jax.random.key(0), x, -0.1, 0.1), "probability"),
    ]
    for fn, args, match in cases:
        with pytest.raises(ValueError, match=match):
            fn(*args)


def test_traced_out_of_range_values_are_clamped():
    x = probs_logits(P4)
    np.testing.assert_array_equal(kept(small("top_p", x, -0.5, 1)), kept(small("top_p", x, 0.0, 1)))
    np.testing.assert_array_equal(kept(small("top_h", x, 3.0)), kept(small("top_h", x, 1.0)))
    np.testing.assert_array_equal(kept(small("epsilon_cutoff", x, -1.0, 1)), [True] * 4)


VALUES = st.lists(st.sampled_from([-jnp.inf, jnp.nan, jnp.inf, 0.0, 1.0, 1.5, -2.0, 3.0]), min_size=8, max_size=8)


@given(VALUES, st.floats(0.0, 1.0), st.integers(0, 3))
def test_never_empties_a_row_and_never_nan(values, p, mk):
    x = jnp.asarray(values, jnp.float32)
    finite_in = np.asarray(x) > -np.inf
    certain = np.isposinf(np.asarray(x))
    outs = {
        "top_k": small("top_k", x, 3), "top_k_exact": small("top_k_exact", x, 3),
        "top_p": small("top_p", x, p, mk), "min_p": small("min_p", x, p, mk), "typical": small("typical", x, p, mk),
        "top_n_sigma": small("top_n_sigma", x, 3 * p),
        "top_h": small("top_h", x, p), "epsilon_cutoff": small("epsilon_cutoff", x, p, mk),
        "eta_cutoff": small("eta_cutoff", x, p, mk), "p_less": small("p_less", x, mk),
        "xtc": small("xtc", jax.random.key(0), x, p, p / 2, mk),
    }  # fmt: skip
    for name, out in outs.items():
        o = np.asarray(out)
        assert not np.isnan(o).any(), name
        assert kept(o).any() == finite_in.any(), name  # all -inf (or NaN) rows stay empty, others never do
        assert np.all(np.where(kept(o), o == np.where(finite_in, np.asarray(x), np.nan), True)), name
        if certain.any() and name != "top_k_exact":  # +inf logits are certain tokens: always kept
            assert kept(o)[certain].all(), name


# ---------------------------------------------------------------------------------------------- stages
def test_stages_in_a_chain_match_the_functions():
    from jaxsample import stages

    order = [
        (stages.top_n_sigma(), js.top_n_sigma, ("top_n_sigma",)),
        (stages.top_k(), js.top_k, ("top_k",)),
        (stages.typical(), js.typical, ("typical_p", "min_keep")),
        (stages.top_p(), js.top_p, ("top_p", "min_keep")),
        (stages.min_p(), js.min_p, ("min_p", "min_keep")),
        (stages.xtc(), js.xtc, ("xtc_probability", "xtc_threshold", "min_keep")),
        (stages.epsilon_cutoff(), js.epsilon_cutoff, ("epsilon_cutoff", "min_keep")),
        (stages.eta_cutoff(), js.eta_cutoff, ("eta_cutoff", "min_keep")),
        (stages.top_h(), js.top_h, ("top_h",)),
        (stages.p_less(), js.p_less, ("min_keep",)),
    ]
    sampler = js.chain(*[s for s, _, _ in order[:-1]], select=stages.greedy())
    x = jnp.asarray(_diff_rows()[[0, 1, 7, 8]])
    params = sampler.params((4,), seed=jnp.arange(4))
    state = sampler.init(params, vocab_size=V_DIFF)
    process = CountingJit(sampler.process)
    np.testing.assert_array_equal(process(x, state, params)[0], x)  # every default is "off"
    values = dict(
        top_n_sigma=[3.0, -1.0, 2.0, 2.5], top_k=[150, 0, 80, 199], typical_p=[0.99, 1.0, 0.95, 1.0],
        top_p=[0.98, 0.9, 1.0, 0.95], min_p=[0.001, 0.0, 0.01, 0.05], xtc_probability=[1.0, 1.0, 0.0, 1.0],
        xtc_threshold=[0.01, 0.6, 0.1, 0.05], epsilon_cutoff=[1e-4, 0.0, 3e-4, 0.0],
        eta_cutoff=[0.0, 1e-3, 0.0, 2e-4], top_h=[0.0, 0.9, 0.0, 1.0], min_keep=[1, 3, 0, 2],
    )  # fmt: skip
    params = sampler.params((4,), seed=jnp.arange(4), **values)
    out, _ = process(x, state, params)

    @jax.jit  # the functions one after another, in one compiled program (eager: each op compiled alone)
    def functions_in_order(x, state, params):
        for stage, fn, names in order[:-1]:
            args = [params[n] for n in names]
            key = (sampler.step_info(state, params, stage.name).key,) if stage.name == "xtc" else ()
            x = fn(*key, x, *args)
        return x

    np.testing.assert_array_equal(out, functions_in_order(x, state, params))
    assert (kept(out).sum(-1) < kept(x).sum(-1)).all()
    assert process.traces == 1
    p_less = order[-1][0]
    assert [p.name for p in p_less.params] == ["min_keep"]
    got, _ = p_less.update(x, (), {"min_keep": params["min_keep"]}, None)
    np.testing.assert_array_equal(got, js.p_less(x, params["min_keep"]))
