"""p-less sampling (llama.cpp fork sampler ``p_less``): keep tokens with ``p_i >= sum_j p_j**2``.

Sharding/TPU: rows are independent; shard the batch axis. One softmax and two passes over the
vocabulary; ``min_keep > 1`` adds a candidate search (a batch-level ``lax.cond``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _math, _threshold, _validate
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage


def _p_less(x: Array, min_keep: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]`` and ``min_keep int32[*B]``."""
    probs = _math.softmax(x)
    collision = _math.row_sum(jnp.square(probs), keepdims=True)
    keep = _threshold.mass_reached(probs, collision) | _threshold.keep_top(x, jnp.maximum(min_keep, 1))
    return _math.keep(x, keep)


def p_less(logits: Float["*B V"], min_keep: Int["*B"] | int = 1) -> Float["*B V"]:
    """p-less sampling (llama.cpp fork sampler ``p_less``): keeps tokens with ``p_i >= sum_j p_j**2``.

    The threshold is the probability that two independent draws agree; the most probable token always
    passes, and a uniform row keeps every token (comparison within
    :data:`jaxsample._threshold.MASS_RTOL`, since ``p == sum p**2`` exactly there).

    Args:
      logits: ``[..., V]``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.15, 0.2, 0.25, 0.3]))
    >>> (p_less(x) > -jnp.inf).tolist()
    [False, False, False, True, True]
    """
    x, dtype = _math.prepare(logits, map_nan=False)
    min_keep = _validate.min_keep(min_keep, x.shape[:-1], "p_less")
    return _math.restore(_math.nan_free(x, lambda x: _p_less(x, min_keep)), dtype)


@dataclasses.dataclass(frozen=True)
class PLess(Stage):
    """:func:`p_less` (no off value: include the stage only when wanted) reading ``min_keep``."""

    _: dataclasses.KW_ONLY
    name: str = "p_less"

    @property
    def params(self) -> tuple[Param, ...]:
        return (MIN_KEEP,)

    def update(self, x, state, params, info):
        return _p_less(x, params["min_keep"]), state
