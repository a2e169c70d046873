"""Eta sampling (HF ``EtaLogitsWarper``): remove tokens with ``prob < min(eps, sqrt(eps) * exp(-H))``.

Sharding/TPU: rows are independent; shard the batch axis. A row maximum, two sums (normaliser and
entropy) and a compare pass over the vocabulary; skipping off batches and the NaN map are
batch-level ``lax.cond``s (an all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _fastpath, _math, _threshold, _validate
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage


def _statistics(x: Array, normaliser: tuple[Array, Array, Array]) -> tuple[Array, Array]:
    """``(L, H)``, each ``float32[*B, 1]``: :func:`_math.logsumexp` of ``x [*B, V]`` and, where ``L`` is
    finite, the entropy of ``softmax(x)`` (:func:`_math.entropy_sum`; elsewhere anything), from
    :func:`_math.shifted_normaliser` ``(x)``: with it, three reductions of pure arithmetic over ``x``;
    log-probabilities are never formed."""
    m, _, log_sum = normaliser
    return _math.logsumexp(x, m), _math.entropy_sum(x, m, log_sum)


def _cut(x: Array, eps: Array, min_keep: Array, statistics: tuple[Array, Array] | None = None) -> Array:
    """``x [*B, V]`` without ``logit < L + log(eta)``, ``log(eta) = min(log eps, log(eps) / 2 - H)``,
    except its ``min_keep`` largest; ``eps float32[*B, 1] >= 0`` (0: row unchanged); ``statistics``:
    :func:`_statistics` if the caller has it. One compare pass after the statistics."""
    lse, entropy = _statistics(x, _math.shifted_normaliser(x)) if statistics is None else statistics
    log_eps = jnp.log(eps)
    # Rows without a finite normaliser keep x >= L: their +inf logits, or the whole of an empty row
    # (the entropy, anything there, is not used).
    t = jnp.where(jnp.isfinite(lse), lse + jnp.minimum(log_eps, 0.5 * log_eps - entropy), lse)
    t = jnp.minimum(jnp.where(eps > 0, t, -jnp.inf), _threshold.kth_largest(x, jnp.maximum(min_keep, 1))[..., None])
    return _math.keep(x, x >= t)


def _epsilon(epsilon: Array) -> Array:
    return jnp.maximum(_math.nan_to(epsilon, 0.0), 0.0)[..., None]


def _eta_cutoff(x: Array, epsilon: Array, min_keep: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``epsilon float32[*B]``, ``min_keep int32[*B]``."""
    eps = _epsilon(epsilon)
    return _math.if_any(eps > 0, lambda: _cut(x, eps, min_keep), lambda: x)


def eta_cutoff(logits: Float["*B V"], epsilon: Float["*B"] | float, min_keep: Int["*B"] | int = 1) -> Float["*B V"]:
    """Eta sampling (HF ``EtaLogitsWarper``): removes tokens with ``prob < min(eps, sqrt(eps) * exp(-H))``.

    ``H`` is the entropy of the row's softmax. The comparison is made in log space: a token stays if
    ``logit >= logsumexp(logits) + log(eta)`` with ``log(eta) = min(log eps, log(eps) / 2 - H)`` (as
    ``min_p``'s ``logit >= max_logit + log p``). It can differ from HF's ``softmax(logits) < eta`` only
    for a token whose log-probability lies within float32 rounding of ``log(eta)``.

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
    eps = _epsilon(_validate.probability(epsilon, batch, "epsilon (eta_cutoff)"))
    min_keep = _validate.min_keep(min_keep, batch, "eta_cutoff")
    cut = _math.normalised_filter(x, eps > 0, lambda v, s: _cut(v, eps, min_keep, s), _statistics)
    return _math.restore(cut, dtype)


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
