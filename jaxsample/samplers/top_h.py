"""Top-H: entropy-bounded truncation (HF ``TopHLogitsWarper``, transformers PR #40837).

Sharding/TPU: rows are independent; shard the batch axis. One ``lax.top_k`` of ``top_n`` entries
over a whole vocabulary row, then work on ``[*B, top_n]``; no batch-level branch.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _candidates, _math, _threshold, _validate
from jaxsample._types import Array, Float
from jaxsample.chain import Param, Stage, static_int


def _top_h(x: Array, h: Array, top_n: int) -> Array:
    """The core on NaN-free float32 ``x [*B, V]`` and ``h float32[*B]`` (clamped to ``[0, 1]``)."""
    h = jnp.clip(_math.nan_to(h, 0.0), 0.0, 1.0)
    vals, _ = _candidates.top(x, top_n)
    logq = _math.log_softmax(vals)
    q = jnp.exp(logq)
    cum = jnp.cumsum(jnp.where(q > 0, -q * logq, 0.0), axis=-1)
    within = cum <= (h * cum[..., -1])[..., None] * (1.0 + _threshold.MASS_RTOL)
    last = jnp.maximum(jnp.sum(within, axis=-1), 1) - 1
    t = jnp.take_along_axis(vals, last[..., None], axis=-1)
    return _math.keep(x, (h <= 0)[..., None] | (x >= t))


def top_h(logits: Float["*B V"], top_h: Float["*B"] | float, *, top_n: int = 100) -> Float["*B V"]:
    """Entropy-bounded truncation (HF ``TopHLogitsWarper``, transformers PR #40837).

    Among the ``top_n`` largest logits (100 in HF), with ``q`` their renormalised softmax and
    ``tau = top_h * H(q)``, keeps the longest prefix whose cumulative entropy ``sum -q_i log q_i`` is
    ``<= tau`` (the first token always); everything else is removed. Tokens tied with the last
    kept logit are kept; entropy sums within :data:`jaxsample._threshold.MASS_RTOL` of ``tau`` count
    as within budget.

    Args:
      logits: ``[..., V]``.
      top_h: scalar or ``[...]`` in ``[0, 1]``; ``0`` is off (HF's ``None``). ``ValueError`` if
        concretely outside ``[0, 1]``.
      top_n: static size of the candidate set the entropy is measured on.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    >>> (top_h(x, 0.7) > -jnp.inf).tolist()
    [True, True, False, False]
    """
    top_n = _validate.static_int(top_n, "top_n", lo=1)
    x, dtype = _math.prepare(logits)
    h = _validate.param(top_h, x.shape[:-1], "top_h", lo=0.0, hi=1.0)
    return _math.restore(_top_h(x, h, top_n), dtype)


@dataclasses.dataclass(frozen=True)
class TopH(Stage):
    """:func:`top_h` reading ``top_h`` (``0`` off, at most 1)."""

    default: float = dataclasses.field(default=0.0, compare=False)
    _: dataclasses.KW_ONLY
    top_n: int = static_int(100)
    name: str = "top_h"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("top_h", self.default, lo=0.0, hi=1.0),)

    def update(self, x, state, params, info):
        return _top_h(x, params["top_h"], self.top_n), state
