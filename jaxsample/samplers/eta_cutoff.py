"""Eta sampling (HF ``EtaLogitsWarper``): remove tokens with ``prob < min(eps, sqrt(eps) * exp(-H))``.

Sharding/TPU: rows are independent; shard the batch axis. A log-softmax, the entropy and a compare
pass over the vocabulary; skipping off batches is a batch-level ``lax.cond`` (an all-reduce of
one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _fastpath, _math, _threshold, _validate
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage


def _eta_cutoff(x: Array, epsilon: Array, min_keep: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``epsilon float32[*B]``, ``min_keep int32[*B]``."""
    eps = jnp.maximum(_math.nan_to(epsilon, 0.0), 0.0)[..., None]

    def apply():
        probs, entropy = _math.entropy(_math.log_softmax(x))
        eta = jnp.minimum(eps, jnp.sqrt(eps) * jnp.exp(-entropy))
        return _math.keep(x, (probs >= eta) | _threshold.keep_top(x, jnp.maximum(min_keep, 1)))

    return _math.if_any(eps > 0, apply, lambda: x)


def eta_cutoff(logits: Float["*B V"], epsilon: Float["*B"] | float, min_keep: Int["*B"] | int = 1) -> Float["*B V"]:
    """Eta sampling (HF ``EtaLogitsWarper``): removes tokens with ``prob < min(eps, sqrt(eps) * exp(-H))``.

    ``H`` is the entropy of the row's softmax.

    Args:
      logits: ``[..., V]``.
      epsilon: scalar or ``[...]``; ``0`` is off. ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.01, 0.04, 0.9, 0.05]))
    >>> (eta_cutoff(x, 0.0625) > -jnp.inf).tolist()
    [False, False, True, False]
    """
    x, dtype = _math.prepare(logits, map_nan=False)
    batch = x.shape[:-1]
    eps = _validate.probability(epsilon, batch, "epsilon (eta_cutoff)")
    min_keep = _validate.min_keep(min_keep, batch, "eta_cutoff")
    return _math.restore(_math.nan_free(x, lambda x: _eta_cutoff(x, eps, min_keep)), dtype)


@dataclasses.dataclass(frozen=True)
class EtaCutoff(Stage, _fastpath.CandidateForm):
    """:func:`eta_cutoff` reading ``eta_cutoff`` (``0`` off) and ``min_keep``; on candidates only when off."""

    default: float = dataclasses.field(default=0.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "eta_cutoff"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("eta_cutoff", self.default, lo=0.0), MIN_KEEP)

    def update(self, x, state, params, info):
        return _eta_cutoff(x, params["eta_cutoff"], params["min_keep"]), state

    def candidate_rows(self, params):
        return ~(params["eta_cutoff"] > 0)

    def on_candidates(self, c, state, params, info):
        return c, state
