"""XTC, exclude top choices (llama.cpp ``xtc``): with a given probability, remove the most probable tokens.

Sharding/TPU: rows are independent; shard the batch axis. One uniform per row from the row's key,
one ``logsumexp`` pass, the ``K`` largest logits (they hold every removed token unless the threshold
is about ``1 / K`` or less; those rows take a softmax over the row) and one masking pass; skipping
batches where no row draws the filter and the softmax are batch-level ``lax.cond``s (an all-reduce
of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _candidates, _fastpath, _math, _noise, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample._types import Array, Float, Int, Key
from jaxsample.chain import MIN_KEEP, Param, Stage


def _removed(x: Array, thr: Array) -> tuple[Array, Array]:
    """``(least float32[*B, 1], n float32[*B])``: the least logit of probability ``>= thr [*B, 1]``
    (``inf`` if none) and how many tokens lie above it (the ones XTC removes).

    Every such token is among the ``K`` largest logits when the ``K``-th has probability below
    ``thr`` (probabilities are monotone in the logit): those rows read their candidates, with
    probabilities computed as :func:`jaxsample._math.softmax` computes them; others the whole row.
    """
    vals, _ = _candidates.top(x, DEFAULT_CANDIDATES)
    m, shift, lse = _math.shifted_normaliser(x)
    probs = jnp.where(vals > -jnp.inf, jnp.exp((vals - shift) - lse), 0.0)  # log_softmax, then exp
    fits = (probs[..., -1:] < thr) | (vals[..., -1:] == -jnp.inf)
    covered = (fits & jnp.isfinite(m))[..., 0]  # rows with +inf logits: the dense path

    def on_candidates():
        least = jnp.min(jnp.where((vals > -jnp.inf) & (probs >= thr), vals, jnp.inf), axis=-1, keepdims=True)
        return jnp.concatenate([least, jnp.sum(vals > least, axis=-1, keepdims=True, dtype=jnp.float32)], -1)

    def dense():
        above = (x > -jnp.inf) & (_math.softmax(x) >= thr)
        least = jnp.min(jnp.where(above, x, jnp.inf), axis=-1, keepdims=True)
        return jnp.concatenate([least, _math.row_count(above & (x > least), keepdims=True).astype(jnp.float32)], -1)

    out = _candidates.choose(covered, on_candidates, dense)
    return out[..., :1], out[..., 1]


def _xtc(keys: Array, x: Array, probability: Array, threshold: Array, min_keep: Array) -> Array:
    """The core on typed ``keys [*B]``, NaN-free float32 ``x [*B, V]`` and per-row ``[*B]`` parameters."""
    chance = jnp.maximum(probability, 0.0)
    thr = threshold[..., None]
    drawn = (chance > 0) & (_noise.uniform(keys) <= chance) & (threshold <= 0.5)

    def apply():
        n_finite = _math.row_count(x > -jnp.inf)
        least, n_removed = _removed(x, thr)
        active = drawn & (n_finite >= 2) & (n_finite - n_removed >= min_keep)
        return _math.keep(x, ~(active[..., None] & (x > least)))

    return _math.if_any(drawn, apply, lambda: x)


def xtc(
    key: Key["*B"], logits: Float["*B V"], probability: Float["*B"] | float, threshold: Float["*B"] | float,
    min_keep: Int["*B"] | int = 1,
) -> Float["*B V"]:
    """Exclude Top Choices (llama.cpp ``xtc``).

    With the given probability (one uniform draw per row), removes every token with
    ``prob >= threshold`` except the least probable of them (and tokens tied with it). The row is
    left unchanged when ``probability <= 0``, ``threshold > 0.5``, it has fewer than 2 finite logits,
    fewer than 2 tokens reach the threshold, or fewer than ``min_keep`` tokens would remain.

    Args:
      key: one key, or one key per row (typed ``[...]`` or raw ``uint32[..., 2]``).
      logits: ``[..., V]``.
      probability: chance of applying the filter, scalar or ``[...]``; ``<= 0`` is off.
        ``ValueError`` if concretely ``< 0``.
      threshold: probability threshold, scalar or ``[...]``; ``> 0.5`` is off.
      min_keep: minimum number of tokens that must remain for the filter to apply.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    >>> (xtc(jax.random.key(0), x, 1.0, 0.19) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    chance = _validate.probability(probability, batch, "probability (xtc)")
    thr = _validate.param(threshold, batch, "threshold (xtc)")
    keep_at_least = _validate.param(min_keep, batch, "min_keep (xtc)", dtype=jnp.int32, lo=0)
    return _math.restore(_xtc(_noise.row_keys(key, batch), x, chance, thr, keep_at_least), dtype)


@dataclasses.dataclass(frozen=True)
class XTC(Stage, _fastpath.CandidateForm):
    """:func:`xtc` reading ``xtc_probability`` (``<= 0`` off), ``xtc_threshold``, ``min_keep``; the row's
    step key draws. On candidates only when off."""

    probability: float = dataclasses.field(default=0.0, compare=False)
    threshold: float = dataclasses.field(default=0.1, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "xtc"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("xtc_probability", self.probability, lo=0.0), Param("xtc_threshold", self.threshold), MIN_KEEP)

    def update(self, x, state, params, info):
        out = _xtc(info.key, x, params["xtc_probability"], params["xtc_threshold"], params["min_keep"])
        return out, state

    def candidate_rows(self, params):
        return ~((params["xtc_probability"] > 0) & (params["xtc_threshold"] <= 0.5))

    def on_candidates(self, c, state, params, info):
        return c, state
