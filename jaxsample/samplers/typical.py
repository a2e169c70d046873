"""Locally typical sampling (llama.cpp ``typical``, HF ``TypicalLogitsWarper``).

Tokens are taken in increasing distance ``|-log p - H|`` from the entropy until their mass exceeds
``p``: a cut-off search over the negated distances (:mod:`jaxsample._threshold`), no sort. The
``K`` tokens nearest the entropy resolve most peaked rows; other rows take an exact search on the
distance (steps on a model of the mass of the window and everything above it, smooth where the
window's own mass jumps by each heavy token its top end passes, with the exact mass above it from
the ``K`` most probable tokens, :class:`jaxsample._threshold.Heavy`; rows whose top end lies beyond
those take two-sided secant steps in the probit of the mass; finished on 128 tokens; the bit
bisection where that does not settle). Log-probabilities, distances and
probabilities are recomputed from the logits in each pass that reads them, never stored.

Sharding/TPU: rows are independent; shard the batch axis. A log-softmax normaliser, the entropy
and a cut-off search over the vocabulary; skipping off batches, the candidates, the exact fallback
and each search step are batch-level ``lax.cond``s (an all-reduce of one bool under GSPMD; both
branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import entr

from jaxsample import _candidates, _fastpath, _math, _threshold, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage, static_int


def _normaliser(x: Array) -> tuple[Array, Array, Array, Array]:
    """:func:`_math.shifted_normaliser` ``(x)`` and :func:`_candidates.chunk_maxima` ``(x)``: the row
    maximum taken from the chunk maxima, which the ``K`` most probable tokens reuse on flat rows
    (one pass over ``V`` for both)."""
    maxima = _candidates.chunk_maxima(x)
    return _math.shifted_normaliser(x, jnp.max(maxima, axis=-1, keepdims=True)) + (maxima,)


def _statistics(x: Array, normaliser: tuple[Array, Array, Array, Array]):
    """``(normaliser, (logp, H))``: :func:`_normaliser` ``(x)`` and :func:`_math.log_probs_entropy`."""
    return normaliser, _math.log_probs_entropy(x, normaliser[0])


def _typical(x: Array, p: Array, min_keep: Array, candidates: int, statistics=None) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``p float32[*B]``, ``min_keep int32[*B]``;
    ``statistics``: :func:`_statistics` if the caller has it."""
    p = _p(p)
    off = p >= 1

    def apply():
        # Log-probabilities, probabilities and keys are recomputed from x in each pass that uses them.
        stats = _statistics(x, _normaliser(x)) if statistics is None else statistics
        (m, _, log_sum, maxima), (logp, entropy) = stats

        def key(v):
            return -jnp.abs(logp(v) + entropy)

        def weight(v):
            return jnp.exp(logp(v))

        target = jnp.where(off, 0.0, p)
        h, vocab = entropy[..., 0], x.shape[-1]
        # Below the key -d with d >= H (no log-probability exceeds 0 = -H + H) and d >= log(V / (1 - p)) - H
        # lie only tokens of probability < exp(-H - d) <= (1 - p) / V.
        start = -jnp.maximum(h, jnp.log(vocab / jnp.maximum(1.0 - target, 0.0)) - h)
        # Gaussian logits of deviation s have H = log V - s^2 / 2 and log-probabilities distributed
        # (by mass) as N(-H, s^2): the window of mass p has half-width s * probit((1 + p) / 2).
        s = jnp.sqrt(2.0 * jnp.maximum(jnp.log(jnp.float32(vocab)) - h, 1e-6))
        first = -s * _math.probit(jnp.clip(0.5 + 0.5 * target, 0.5, 1.0 - 1e-6))
        uncovered = jnp.isfinite(m[..., 0]) & _beyond_candidates(h, log_sum[..., 0], target, candidates, vocab)
        def heavy():  # the K most probable tokens: those above the window, for the search's model
            vals, _ = _candidates.top(x, candidates, maxima=maxima)
            lp, k = logp(vals), key(vals)
            out = lp + entropy > 0
            limit = jnp.where(out[..., -1], k[..., -1], 0.0)
            return _threshold.Heavy(jnp.where(out, k, jnp.inf), jnp.where(out, jnp.exp(lp), 0.0), limit)

        t = _threshold.cutoff(
            lambda: key(x),  # recomputed where read: a [B, V] array of keys is never written out
            weights=lambda: weight(x),
            weights_at=lambda vals, ids: weight(jnp.take_along_axis(x, ids, axis=-1)),
            target=target,
            min_count=jnp.maximum(min_keep, 1),
            strict=True,
            candidates=candidates,
            search=_threshold.Search(x, key, weight, h, start, first, uncovered, two_sided=True, window=128,
                                     heavy=heavy, spread=s),
        )
        return _math.keep(x, off[..., None] | (key(x) >= t[..., None]))

    return _math.if_any(~off, apply, lambda: x)


def _beyond_candidates(h: Array, log_sum: Array, target: Array, k: int, vocab: int) -> Array:
    """``bool[*B]``: rows where no ``k`` tokens can hold the mass ``target``, so the ``k`` tokens nearest
    the entropy ``h`` cannot cover them (``log_sum``: :func:`_math.shifted_normaliser`'s, the largest
    probability being ``exp(-log_sum)``). Read from the row's statistics alone (batch invariance).

    Two bounds: ``k`` tokens weigh at most ``k`` times the largest probability; and a row where ``k``
    tokens hold ``q`` has an entropy of at most ``f(q) = h2(q) + q log k + (1 - q) log(V - k)`` (each
    part spread evenly), which falls for ``q > k / V``: an entropy above ``f(target)`` leaves every
    ``k`` tokens short of it. Flat rows (``V = 131072``, ``k = 64``, ``p = 0.9``: ``f = 5.25`` nats,
    Gaussian logits of deviation 2-3 have ``H`` 9.8-7.3) pass the second where the first misses
    those with one outlying logit.
    """
    if k >= vocab:
        return jnp.zeros(h.shape, bool)
    light = k * jnp.exp(-log_sum) * (1.0 + 1e-3) < target
    q = jnp.clip(target, k / vocab, 1.0)
    spread = entr(q) + entr(1.0 - q) + q * np.log(k) + (1.0 - q) * np.log(vocab - k)
    return light | (h > spread + 1e-3 * (1.0 + spread))


def _p(p: Array) -> Array:
    return jnp.maximum(_math.nan_to(p, 1.0), 0.0)


def typical(
    logits: Float["*B V"], p: Float["*B"] | float, min_keep: Int["*B"] | int = 1, *,
    candidates: int = DEFAULT_CANDIDATES,
) -> Float["*B V"]:
    """Locally typical sampling (llama.cpp ``typical``, HF ``TypicalLogitsWarper``).

    With ``H`` the entropy of the row and ``s_i = |-log p_i - H|``, tokens are taken in increasing
    ``s_i`` until their probability sums to more than ``p`` (strictly, as llama.cpp; the crossing
    token is kept). Tokens tied in ``s_i`` with the last one are kept (as HF). ``min_keep`` counts
    in the same order (both anchors), so unlike the other filters this one may remove the most
    probable token. Zero-probability tokens contribute nothing to ``H`` (HF's ``nansum``; llama.cpp
    would produce NaN).

    Args:
      logits: ``[..., V]``.
      p: scalar or ``[...]``; ``p >= 1`` is off. ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many tokens, in typicality order.
      candidates: static size of the fast path.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.4, 0.2, 0.2, 0.2]))
    >>> (typical(x, 0.5) > -jnp.inf).tolist()
    [False, True, True, True]
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, dtype = _math.prepare(logits, map_nan=False)
    batch = x.shape[:-1]
    p = _validate.probability(p, batch, "p (typical)")
    min_keep = _validate.min_keep(min_keep, batch, "typical")
    cut = _math.normalised_filter(x, _p(p) < 1, lambda v, s: _typical(v, p, min_keep, candidates, s), _statistics, _normaliser)
    return _math.restore(cut, dtype)


@dataclasses.dataclass(frozen=True)
class Typical(Stage, _fastpath.CandidateForm):
    """:func:`typical` reading ``typical_p`` (``>= 1`` off) and ``min_keep``; on candidates only when off."""

    default: float = dataclasses.field(default=1.0, compare=False)
    _: dataclasses.KW_ONLY
    candidates: int = static_int(DEFAULT_CANDIDATES)
    name: str = "typical"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("typical_p", self.default, lo=0.0), MIN_KEEP)

    def update(self, x, state, params, info):
        return _typical(x, params["typical_p"], params["min_keep"], self.candidates), state

    def candidate_rows(self, params):
        return ~(params["typical_p"] < 1)

    def on_candidates(self, c, state, params, info):
        return c, state
