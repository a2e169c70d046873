"""Adaptive-p (llama.cpp ``adaptive_p``, PR #17927): a selector that favours tokens near a target probability.

The state is an exponential moving average of the probability of the drawn tokens; the selector
keeps it per row, starting at its converged value (:func:`adaptive_p_init`). Rows with no finite
logit return token 0 and keep their state.

Sharding/TPU: rows are independent; shard the batch axis. A softmax and an elementwise reshape over
the vocabulary, then the Gumbel-max draw (whose exact fallback is a batch-level ``lax.cond``: an
all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from jaxsample import _math, _noise, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample._types import Array, ArrayLike, Float, Key
from jaxsample.chain import Param, Selector, static_int
from jaxsample.samplers.categorical import draw

_K = DEFAULT_CANDIDATES
# adaptive-p transform constants (llama.cpp PR #17927): logit = PEAK - SHARPNESS * d^2 / (1 + d),
# d = |p - adapted_target| / WIDTH.
_WIDTH, _PEAK, _SHARPNESS = 0.3, 5.0, 10.0
_MAX_DECAY = 0.99


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
    key: Key["*B"],
    logits: Float["*B V"],
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
    return _adaptive_p(_noise.row_keys(key, batch), x, AdaptivePState(ws, tw), target, decay, candidates)


def _adaptive_p(keys: Array, x: Array, state: AdaptivePState, target: Array, decay: Array, candidates: int):
    """The core on typed ``keys [*B]``, NaN-free float32 ``x [*B, V]`` and ``[*B]`` state and parameters."""
    ws, tw = state
    decay = jnp.clip(decay, 0.0, _MAX_DECAY)
    probs = _math.softmax(x)
    on = target >= 0
    goal = jnp.clip(target, 0.0, 1.0)
    adapted = jnp.clip(jnp.where(tw == 0, goal, 2.0 * goal - ws / jnp.where(tw == 0, 1.0, tw)), 0.0, 1.0)
    d = jnp.abs(probs - adapted[..., None]) * jnp.float32(1.0 / _WIDTH)
    shaped = jnp.where(x > -jnp.inf, _PEAK - _SHARPNESS * d * d / (1.0 + d), -jnp.inf)
    token = draw(keys, jnp.where(on[..., None], shaped, x), candidates)

    p_token = jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]
    update = on & _math.has_finite(x)
    new = AdaptivePState(
        jnp.where(update, p_token + decay * ws, ws),
        jnp.where(update, 1.0 + decay * tw, tw),
    )
    return token, new


@dataclasses.dataclass(frozen=True)
class AdaptiveP(Selector):
    """Adaptive-p selector reading ``adaptive_p_target`` (``< 0`` off: plain ``dist``), ``adaptive_p_decay``.

    State: :class:`AdaptivePState` ``[B]``, initialised at the converged EMA.
    """

    target: float = dataclasses.field(default=-1.0, compare=False)
    decay: float = dataclasses.field(default=0.9, compare=False)
    _: dataclasses.KW_ONLY
    candidates: int = static_int(DEFAULT_CANDIDATES)
    name: str = "adaptive_p"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("adaptive_p_target", self.target), Param("adaptive_p_decay", self.decay, lo=0.0, hi=_MAX_DECAY))

    def init(self, info):
        return adaptive_p_init(info.params["adaptive_p_target"], info.params["adaptive_p_decay"])

    def select(self, x, state, params, info):
        return _adaptive_p(info.key, x, state, params["adaptive_p_target"], params["adaptive_p_decay"], self.candidates)
