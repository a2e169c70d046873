"""Adaptive selectors with explicit state: mirostat v1 / v2 and adaptive-p (llama.cpp).

Each is a pure function ``(key, logits, state..., params...) -> (token, new_state)``: it truncates
or reshapes the distribution according to its state, draws one token per row with
:func:`jaxsample.categorical` (Gumbel-max, sort-free), and returns the state updated with the drawn
token. The chain versions (:func:`jaxsample.stages.mirostat` ...) keep the state per row.

State conventions (llama.cpp): mirostat's ``mu`` starts at ``2 * tau``; adaptive-p's exponential
moving average starts at its converged value (:func:`adaptive_p_init`). Rows with no finite logit
return token 0 and leave their state unchanged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from jaxsample import _candidates, _math, _threshold, _validate, selection
from jaxsample._types import Array, ArrayLike, KeyLike

_LN2 = math.log(2.0)
_K = _candidates.DEFAULT_CANDIDATES

# adaptive-p transform constants (llama.cpp PR #17927): logit = PEAK - SHARPNESS * d^2 / (1 + d),
# d = |p - adapted_target| / WIDTH.
_WIDTH, _PEAK, _SHARPNESS = 0.3, 5.0, 10.0
_MAX_DECAY = 0.99


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
    n_finite = jnp.sum(x > -jnp.inf, axis=-1)
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


def mirostat(
    key: KeyLike,
    logits: ArrayLike,
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
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    mu = _validate.param(mu, batch, "mu (mirostat)")
    tau = _validate.param(tau, batch, "tau (mirostat)")
    eta = _validate.param(eta, batch, "eta (mirostat)")
    m = _validate.static_int(m, "m (mirostat)", lo=1)
    n_vocab = vocab if n_vocab is None else _validate.static_int(n_vocab, "n_vocab (mirostat)", lo=1)
    pool = min(max(m, candidates), vocab)

    top = _candidates.top(x, pool)
    k = _zipf_k(x, mu, m, n_vocab, top)
    masked = _math.keep(x, _threshold.first_k(x, k, pool, top))
    token = selection.categorical(key, masked, candidates=pool)
    new_mu = _update_mu(mu, tau, eta, _token_logprob(masked, token), _math.has_finite(x))
    return token, new_mu


def mirostat_v2(
    key: KeyLike, logits: ArrayLike, mu: ArrayLike, tau: ArrayLike, eta: ArrayLike, *, candidates: int = _K
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
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits)
    batch = x.shape[:-1]
    mu = _validate.param(mu, batch, "mu (mirostat_v2)")
    tau = _validate.param(tau, batch, "tau (mirostat_v2)")
    eta = _validate.param(eta, batch, "eta (mirostat_v2)")
    keep = _math.log_softmax(x) >= (-mu * _LN2)[..., None]
    keep |= ~jnp.any(keep, axis=-1, keepdims=True) & (x >= _math.row_max(x))
    masked = _math.keep(x, keep)
    token = selection.categorical(key, masked, candidates=candidates)
    new_mu = _update_mu(mu, tau, eta, _token_logprob(masked, token), _math.has_finite(x))
    return token, new_mu


class AdaptivePState(NamedTuple):
    """Exponential moving average of the original probability of drawn tokens (adaptive-p)."""

    weighted_sum: Array  # float32[...]: sum_i decay**i * p_i
    total_weight: Array  # float32[...]: sum_i decay**i


def adaptive_p_init(target: ArrayLike, decay: ArrayLike) -> AdaptivePState:
    """The converged EMA for ``target`` (llama.cpp initialises here to avoid warm-up artifacts).

    >>> [round(float(v), 4) for v in adaptive_p_init(0.5, 0.9)]
    [5.0, 10.0]
    """
    decay = jnp.clip(jnp.asarray(decay, jnp.float32), 0.0, _MAX_DECAY)
    return AdaptivePState(jnp.asarray(target, jnp.float32) / (1.0 - decay), 1.0 / (1.0 - decay))


def adaptive_p(
    key: KeyLike,
    logits: ArrayLike,
    weighted_sum: ArrayLike,
    total_weight: ArrayLike,
    target: ArrayLike,
    decay: ArrayLike,
    *,
    candidates: int = _K,
) -> tuple[Array, AdaptivePState]:
    """Adaptive-p (llama.cpp ``adaptive_p``, PR #17927): favours tokens whose probability is near a target.

    With ``p`` the row's softmax and ``a = clip(2 * target - weighted_sum / total_weight, 0, 1)``
    (``target`` itself while ``total_weight == 0``), draws from ``softmax(5 - 10 d**2 / (1 + d))``
    over the finite logits, ``d = |p - a| / 0.3``, then updates the EMA with the drawn token's
    *original* probability: ``weighted_sum <- p_token + decay * weighted_sum``,
    ``total_weight <- 1 + decay * total_weight``. ``target < 0`` draws from ``softmax(logits)``
    and leaves the state unchanged. (llama.cpp updates on ``accept`` and only for the token it
    drew; this function updates immediately.)

    Args:
      key: one key, or one key per row.
      logits: ``[..., V]``.
      weighted_sum, total_weight: the EMA state (:func:`adaptive_p_init` to start), scalar or ``[...]``.
      target: target probability, scalar or ``[...]``; negative is off, above 1 acts as 1.
      decay: EMA decay in ``[0, 0.99]`` (``ValueError`` outside when concrete, clamped when traced).
      candidates: static size of the sort-free fast path of the draw.

    Returns:
      ``(token int32[...], AdaptivePState)``.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.9, 0.1, 0.0]))
    >>> token, state = adaptive_p(jax.random.key(0), x, *adaptive_p_init(0.1, 0.5), 0.1, 0.5)
    >>> int(token), [round(float(v), 3) for v in state]
    (1, [0.2, 2.0])
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits)
    batch = x.shape[:-1]
    ws = _validate.param(weighted_sum, batch, "weighted_sum (adaptive_p)")
    tw = _validate.param(total_weight, batch, "total_weight (adaptive_p)")
    target = _validate.param(target, batch, "target (adaptive_p)")
    decay = _validate.param(decay, batch, "decay (adaptive_p)", lo=0.0, hi=_MAX_DECAY)
    decay = jnp.clip(decay, 0.0, _MAX_DECAY)

    probs = _math.softmax(x)
    on = target >= 0
    goal = jnp.clip(target, 0.0, 1.0)
    adapted = jnp.clip(jnp.where(tw == 0, goal, 2.0 * goal - ws / jnp.where(tw == 0, 1.0, tw)), 0.0, 1.0)
    d = jnp.abs(probs - adapted[..., None]) * jnp.float32(1.0 / _WIDTH)
    shaped = jnp.where(x > -jnp.inf, _PEAK - _SHARPNESS * d * d / (1.0 + d), -jnp.inf)
    token = selection.categorical(key, jnp.where(on[..., None], shaped, x), candidates=candidates)

    p_token = jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]
    update = on & _math.has_finite(x)
    new = AdaptivePState(
        jnp.where(update, p_token + decay * ws, ws),
        jnp.where(update, 1.0 + decay * tw, tw),
    )
    return token, new
