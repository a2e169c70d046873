"""Min-p: keep tokens with ``prob >= p * max_prob``, computed as ``logit >= max_logit + log(p)``.

Sharding/TPU: rows are independent; shard the batch axis. One max and one compare pass over the
vocabulary; ``min_keep > 1`` adds a candidate search. Skipping off batches is a batch-level
``lax.cond`` (an all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _fastpath, _math, _threshold, _validate
from jaxsample._candidates import Candidates
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage


def _min_p(x: Array, p: Array, min_keep: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``p float32[*B]``, ``min_keep int32[*B]``."""
    p = jnp.maximum(_math.nan_to(p, 0.0), 0.0)
    off = (p <= 0)[..., None]

    def apply():
        above = x >= _math.row_max(x) + jnp.log(jnp.where(off, 1.0, p[..., None]))
        return _math.keep(x, off | above | _threshold.keep_top(x, jnp.maximum(min_keep, 1)))

    return _math.if_any(~off, apply, lambda: x)


def min_p(logits: Float["*B V"], p: Float["*B"] | float, min_keep: Int["*B"] | int = 1) -> Float["*B V"]:
    """Keeps tokens with ``prob >= p * max_prob``, computed as ``logit >= max_logit + log(p)``.

    The logit form is llama.cpp's (inclusive keep); HF ``MinPLogitsWarper`` and vLLM compare
    probabilities, which selects the same set up to rounding. ``p > 1`` keeps only the
    ``max(1, min_keep)`` most probable tokens (llama.cpp).

    Args:
      logits: ``[..., V]``.
      p: scalar or ``[...]``; ``p <= 0`` is off. ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    >>> (min_p(x, 0.51) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    p = _validate.probability(p, batch, "p (min_p)")
    return _math.restore(_min_p(x, p, _validate.min_keep(min_keep, batch, "min_p")), dtype)


@dataclasses.dataclass(frozen=True)
class MinP(Stage, _fastpath.CandidateForm):
    """:func:`min_p` reading ``min_p`` (``<= 0`` off) and ``min_keep``."""

    default: float = dataclasses.field(default=0.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "min_p"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("min_p", self.default, lo=0.0), MIN_KEEP)

    def update(self, x, state, params, info):
        return _min_p(x, params["min_p"], params["min_keep"]), state

    def on_candidates(self, c: Candidates, state, params, info):
        """Min-p of complete candidates (the row maximum is the first candidate)."""
        p = jnp.maximum(_math.nan_to(params["min_p"], 0.0), 0.0)
        off = (p <= 0)[..., None]
        above = c.vals >= c.vals[..., :1] + jnp.log(jnp.where(off, 1.0, p[..., None]))
        kth = _threshold.kth_candidate(c.vals, jnp.maximum(params["min_keep"], 1))
        return c.mask(off | above | (c.vals >= kth[..., None])), state
