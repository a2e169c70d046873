"""Mirostat v1 and v2 (llama.cpp ``mirostat``, ``mirostat_v2``): selectors that steer the surprise.

Each is a pure function ``(key, logits, mu, tau, eta, ...) -> (token, new_mu)``: it truncates the
distribution according to ``mu``, draws one token per row with the Gumbel-max trick (sort-free),
and returns ``mu`` updated with the drawn token's surprise. The selectors keep ``mu [B]`` as their
state, starting at ``2 * tau`` (llama.cpp). Rows with no finite logit return token 0 and keep ``mu``.

Sharding/TPU: rows are independent; shard the batch axis. A ``lax.top_k`` (v1: of at least ``m``
entries) and a log-softmax over a whole vocabulary row; the draw's exact fallback is a batch-level
``lax.cond`` (an all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from jaxsample import _candidates, _math, _noise, _threshold, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample._types import Array, ArrayLike, Float, Key
from jaxsample.chain import Param, Selector, static_int
from jaxsample.samplers.categorical import draw

_LN2 = math.log(2.0)
_K = DEFAULT_CANDIDATES


def _token_logprob(masked: Array, token: Array) -> Array:
    """``float32[...]`` log-probability of ``token`` under ``softmax(masked)``."""
    return jnp.take_along_axis(_math.log_softmax(masked), token[..., None], axis=-1)[..., 0]


def _update_mu(mu: Array, tau: Array, eta: Array, logp: Array, valid: Array) -> Array:
    """``mu - eta * (surprise - tau)`` with the surprise ``-log2 p`` of the drawn token."""
    return jnp.where(valid, mu - eta * (-logp / _LN2 - tau), mu)


def _zipf_k(x: Array, mu: Array, m: int, n_vocab: int, top: tuple[Array, Array] | None = None) -> Array:
    """``int32[...]`` mirostat v1's ``k`` from the Zipf exponent of the ``m`` most probable tokens.

    ``top``: ``_candidates.top(x, K)`` for some ``K >= m`` if the caller already has it.
    """
    vals = (_candidates.top(x, m) if top is None else top)[0][..., : min(m, x.shape[-1])]
    m = vals.shape[-1]  # clipped to V
    n_finite = _math.row_count(x > -jnp.inf)
    i = jnp.arange(m - 1)
    used = i + 1 < n_finite[..., None]
    t = jnp.log((i + 2.0) / (i + 1.0))
    b = jnp.where(used, vals[..., :-1] - vals[..., 1:], 0.0)  # ln(p_i / p_{i+1}), softmax-free
    s_hat = jnp.sum(jnp.where(used, t * b, 0.0), axis=-1) / jnp.sum(jnp.where(used, t * t, 0.0), axis=-1)
    e = s_hat - 1.0
    log_n = math.log(n_vocab)
    # (1 - n**-e) / e, continuous at e = 0.
    ratio = jnp.where(jnp.abs(e) > 1e-6, -jnp.expm1(-e * log_n) / jnp.where(e == 0, 1.0, e), log_n)
    k = jnp.exp((mu * _LN2 - jnp.log(ratio)) / s_hat)
    return jnp.where(jnp.isnan(k), 1.0, jnp.clip(jnp.floor(k), 1.0, x.shape[-1])).astype(jnp.int32)


def _mirostat(keys: Array, x: Array, mu: Array, tau: Array, eta: Array, m: int, n_vocab: int, candidates: int):
    """The v1 core on typed ``keys [*B]``, NaN-free float32 ``x [*B, V]`` and ``[*B]`` parameters."""
    pool = min(max(m, candidates), x.shape[-1])
    top = _candidates.top(x, pool)
    k = _zipf_k(x, mu, m, n_vocab, top)
    masked = _math.keep(x, _threshold.first_k(x, k, pool, top))
    token = draw(keys, masked, pool)
    return token, _update_mu(mu, tau, eta, _token_logprob(masked, token), _math.has_finite(x))


def _mirostat_v2(keys: Array, x: Array, mu: Array, tau: Array, eta: Array, candidates: int):
    """The v2 core on typed ``keys [*B]``, NaN-free float32 ``x [*B, V]`` and ``[*B]`` parameters."""
    keep = _math.log_softmax(x) >= (-mu * _LN2)[..., None]
    keep |= ~jnp.any(keep, axis=-1, keepdims=True) & (x >= _math.row_max(x))
    masked = _math.keep(x, keep)
    token = draw(keys, masked, candidates)
    return token, _update_mu(mu, tau, eta, _token_logprob(masked, token), _math.has_finite(x))


def _inputs(key, logits, mu, tau, eta, candidates, fn: str):
    """Validated ``(keys, x, mu, tau, eta, candidates)`` of the public functions."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits)
    batch = x.shape[:-1]
    values = [_validate.param(v, batch, f"{name} ({fn})") for name, v in (("mu", mu), ("tau", tau), ("eta", eta))]
    return (_noise.row_keys(key, batch), x, *values, candidates)


def mirostat(
    key: Key["*B"],
    logits: Float["*B V"],
    mu: ArrayLike,
    tau: ArrayLike,
    eta: ArrayLike,
    m: int = 100,
    n_vocab: int | None = None,
    *,
    candidates: int = _K,
) -> tuple[Array, Array]:
    """Mirostat v1 (llama.cpp ``mirostat``, arXiv 2007.14966): one draw, and the updated ``mu``.

    Estimates the Zipf exponent from the ``m`` most probable tokens,
    ``s = sum t_i b_i / sum t_i^2`` with ``t_i = ln((i+2)/(i+1))`` and ``b_i = ln(p_i / p_{i+1})``,
    sets ``k = (e * 2**mu / (1 - n_vocab**-e)) ** (1/s)`` with ``e = s - 1``, keeps exactly the
    ``max(1, int(k))`` most probable tokens (ties by lowest id) and draws from their renormalised
    softmax. Then ``mu <- mu - eta * (-log2 p_token - tau)`` with ``p_token`` renormalised.

    Differences from llama.cpp, all in degenerate cases: the sums run over finite logits only
    (llama.cpp also counts tokens already at ``-inf``, giving ``ln(p/0)``); ``k`` is computed in
    log space with the ``e -> 0`` limit ``2**mu / ln(n_vocab)``, is clipped to ``V`` when it
    overflows (llama.cpp's ``int(k)`` overflow yields 1), and is 1 when undefined (fewer than two
    finite logits), as in llama.cpp.

    Args:
      key: one key, or one key per row.
      logits: ``[..., V]``.
      mu: current ``mu`` (initially ``2 * tau``), scalar or ``[...]``.
      tau: target surprise in bits, scalar or ``[...]``.
      eta: learning rate, scalar or ``[...]``.
      m: static number of top tokens used for the Zipf estimate (llama.cpp uses 100).
      n_vocab: static vocabulary size in the formula (llama.cpp: the model's); defaults to ``V``.
      candidates: static size of the sort-free fast path (raised to at least ``m``).

    Returns:
      ``(token int32[...], new_mu float32[...])``.

    >>> import jax, jax.numpy as jnp
    >>> token, mu = mirostat(jax.random.key(0), jnp.array([0.0, 9.0, -jnp.inf]), 10.0, 5.0, 0.1)
    >>> int(token), round(float(mu), 3)   # k = 2: p(1) = 0.99988, surprise ~ 0.0002 bits
    (1, 10.5)
    """
    keys, x, mu, tau, eta, candidates = _inputs(key, logits, mu, tau, eta, candidates, "mirostat")
    m = _validate.static_int(m, "m (mirostat)", lo=1)
    n_vocab = x.shape[-1] if n_vocab is None else _validate.static_int(n_vocab, "n_vocab (mirostat)", lo=1)
    return _mirostat(keys, x, mu, tau, eta, m, n_vocab, candidates)


def mirostat_v2(
    key: Key["*B"], logits: Float["*B V"], mu: ArrayLike, tau: ArrayLike, eta: ArrayLike, *, candidates: int = _K
) -> tuple[Array, Array]:
    """Mirostat v2 (llama.cpp ``mirostat_v2``): one draw, and the updated ``mu``.

    Keeps the tokens whose surprise ``-log2 p`` is at most ``mu`` (the most probable token(s) if
    none), draws from their renormalised softmax, and updates
    ``mu <- mu - eta * (-log2 p_token - tau)`` with the renormalised ``p_token``.

    Args:
      key: one key, or one key per row.
      logits: ``[..., V]``.
      mu: current ``mu`` (initially ``2 * tau``), scalar or ``[...]``.
      tau: target surprise in bits, scalar or ``[...]``.
      eta: learning rate, scalar or ``[...]``.
      candidates: static size of the sort-free fast path of the draw.

    Returns:
      ``(token int32[...], new_mu float32[...])``.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.5, 0.25, 0.25]))
    >>> token, mu = mirostat_v2(jax.random.key(0), x, 1.0, 1.0, 0.5)   # keeps only p = 0.5
    >>> int(token), float(mu)
    (0, 1.5)
    """
    return _mirostat_v2(*_inputs(key, logits, mu, tau, eta, candidates, "mirostat_v2"))


@dataclasses.dataclass(frozen=True)
class _MuSelector(Selector):
    """Reads ``mirostat_tau`` and ``mirostat_eta``; state ``mu [B]`` starts at ``2 * tau``."""

    tau: float = dataclasses.field(default=5.0, compare=False)
    eta: float = dataclasses.field(default=0.1, compare=False)
    _: dataclasses.KW_ONLY
    candidates: int = static_int(DEFAULT_CANDIDATES)

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("mirostat_tau", self.tau), Param("mirostat_eta", self.eta))

    def init(self, info):
        return 2.0 * info.params["mirostat_tau"]


@dataclasses.dataclass(frozen=True)
class Mirostat(_MuSelector):
    """Mirostat v1 selector (:func:`mirostat`) reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]``."""

    _: dataclasses.KW_ONLY
    m: int = 100
    n_vocab: int | None = None
    name: str = "mirostat"

    def __post_init__(self):
        object.__setattr__(self, "m", _validate.static_int(self.m, "m (mirostat)", lo=1))
        if self.n_vocab is not None:
            object.__setattr__(self, "n_vocab", _validate.static_int(self.n_vocab, "n_vocab (mirostat)", lo=1))
        super().__post_init__()

    def select(self, x, mu, params, info):
        n_vocab = x.shape[-1] if self.n_vocab is None else self.n_vocab
        tau, eta = params["mirostat_tau"], params["mirostat_eta"]
        return _mirostat(info.key, x, mu, tau, eta, self.m, n_vocab, self.candidates)


@dataclasses.dataclass(frozen=True)
class MirostatV2(_MuSelector):
    """Mirostat v2 selector (:func:`mirostat_v2`) reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]``."""

    _: dataclasses.KW_ONLY
    name: str = "mirostat_v2"

    def select(self, x, mu, params, info):
        return _mirostat_v2(info.key, x, mu, params["mirostat_tau"], params["mirostat_eta"], self.candidates)
