"""Epsilon sampling (HF ``EpsilonLogitsWarper``): remove tokens with ``prob < epsilon``.

Sharding/TPU: rows are independent; shard the batch axis. One softmax and one compare pass over
the vocabulary; skipping off batches is a batch-level ``lax.cond`` (an all-reduce of one bool
under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _fastpath, _math, _threshold, _validate
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage


def _epsilon_cutoff(x: Array, epsilon: Array, min_keep: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``epsilon float32[*B]``, ``min_keep int32[*B]``."""
    eps = jnp.maximum(_math.nan_to(epsilon, 0.0), 0.0)[..., None]

    def apply():
        return _math.keep(x, (_math.softmax(x) >= eps) | _threshold.keep_top(x, jnp.maximum(min_keep, 1)))

    return _math.if_any(eps > 0, apply, lambda: x)


def epsilon_cutoff(logits: Float["*B V"], epsilon: Float["*B"] | float, min_keep: Int["*B"] | int = 1) -> Float["*B V"]:
    """Epsilon sampling (HF ``EpsilonLogitsWarper``): removes tokens with ``prob < epsilon``.

    Args:
      logits: ``[..., V]``.
      epsilon: scalar or ``[...]``; ``0`` is off. ``ValueError`` if concretely ``< 0``. (HF also
        rejects ``>= 1``; here such a value keeps only the ``max(1, min_keep)`` most probable.)
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.87, 0.099, 0.001, 0.03]))
    >>> (epsilon_cutoff(x, 0.1) > -jnp.inf).tolist()
    [True, False, False, False]
    """
    x, dtype = _math.prepare(logits, map_nan=False)
    batch = x.shape[:-1]
    eps = _validate.probability(epsilon, batch, "epsilon (epsilon_cutoff)")
    min_keep = _validate.min_keep(min_keep, batch, "epsilon_cutoff")
    return _math.restore(_math.nan_free(x, lambda x: _epsilon_cutoff(x, eps, min_keep)), dtype)


@dataclasses.dataclass(frozen=True)
class EpsilonCutoff(Stage, _fastpath.CandidateForm):
    """:func:`epsilon_cutoff` reading ``epsilon_cutoff`` (``0`` off) and ``min_keep``; on candidates only when off."""

    default: float = dataclasses.field(default=0.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "epsilon_cutoff"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("epsilon_cutoff", self.default, lo=0.0), MIN_KEEP)

    def update(self, x, state, params, info):
        return _epsilon_cutoff(x, params["epsilon_cutoff"], params["min_keep"]), state

    def candidate_rows(self, params):
        return ~(params["epsilon_cutoff"] > 0)

    def on_candidates(self, c, state, params, info):
        return c, state
