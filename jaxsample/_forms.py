"""Candidate forms: the stages of a chain computed on ``[..., K]`` candidates instead of ``[..., V]`` rows.

After a filter such as ``top_k(40)`` a row has fewer than ``K`` finite logits, and everything the
rest of a typical chain does (top-p, min-p, temperature, the draw) only needs those. A
:class:`jaxsample.Sampler` whose remaining stages all have a candidate form therefore holds each row
as :class:`jaxsample._candidates.Candidates` from such a filter on, whenever every row of the batch
qualifies, and goes back to ``[B, V]`` arrays only for the processed logits it returns (which XLA
drops when the caller does not use them). Per step this saves every pass over the vocabulary after
the filter: for llama.cpp's default chain at ``V = 32000`` the sampler costs about one ``top_k``.

Contract of a form, per row whose finite logits all lie among its ``K`` candidates and number fewer
than ``K`` (*complete* rows): it returns exactly, bit for bit, what the dense function returns on
the densified row. The dense functions are written to make this hold: what they reduce over the
vocabulary they reduce over :func:`jaxsample._candidates.top` for complete rows (the log-normaliser
of :func:`jaxsample.top_p`), and order-dependent steps (cumulative sums) see the canonical
candidate order (value descending, ties by id, ``-inf`` last), which every form keeps. So whether a
batch takes the forms or not never changes a row's result.

An *entry* is the dense filter that starts the candidate regime: it returns its output as
candidates, the rows that output represents (complete rows), and a thunk for the dense output.
Forms that only handle some parameter values (``typical`` and ``xtc`` when off, dynamic
temperature with ``delta <= 0``) say which rows they handle; a batch with any other row stays dense.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxsample import _candidates, _math, _threshold, selection
from jaxsample._candidates import Candidates
from jaxsample._types import Array
from jaxsample.truncation import _candidate_probs, _top_k_keep, _top_p_cut

Entry = tuple[Candidates, Array, Callable[[], Array]]


def _mask(c: Candidates, keep: Array) -> Candidates:
    return Candidates(jnp.where(keep, c.vals, -jnp.inf), c.ids)


def _enter(x: Array, on: Array, k: int, filtered: Callable, dense: Callable) -> Entry:
    """Common part of the entries.

    Args:
      x: ``float32[..., V]`` NaN-free logits.
      on: ``bool[...]`` rows where the filter does something; if none, the batch stays dense.
      k: static candidate count.
      filtered: ``top -> (keep bool[..., K], aux)``: the filter on the candidates, and whatever
        (small) values the dense output needs.
      dense: ``(top, aux) -> float32[..., V]`` the dense output.
    """
    vocab = x.shape[-1]
    k = min(k, vocab)

    def compute():
        top = _candidates.top(x, k)
        keep, aux = filtered(top)
        out = _mask(Candidates(*top), keep)
        return out, _candidates.complete(out.vals, vocab), top, aux

    shapes = jax.eval_shape(compute)
    idle = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731 (ok = False)
    out, ok, top, aux = _math.if_any(on, compute, idle)
    return out, ok, lambda: _math.if_any(on, lambda: dense(top, aux), lambda: x)


def top_k_entry(x: Array, k: Array, exact: bool, candidates: int) -> Entry:
    """:func:`jaxsample.top_k` as an entry (``k int32[...]``)."""
    off = (k <= 0) | (k >= x.shape[-1])

    def filtered(top):
        if exact:  # canonical order lists ties by id: the first k candidates are llama.cpp's k
            return off[..., None] | (jnp.arange(top[0].shape[-1]) < k[..., None]), ()
        t = jnp.where(off, -jnp.inf, _threshold.kth_largest(x, jnp.where(off, 1, k), candidates, top))
        return top[0] >= t[..., None], t

    def dense(top, t):
        keep = _top_k_keep(x, k, True, candidates, top) if exact else x >= t[..., None]
        return _math.keep(x, keep)

    return _enter(x, ~off, candidates, filtered, dense)


def top_p_entry(x: Array, p: Array, min_keep: Array, candidates: int) -> Entry:
    """:func:`jaxsample.top_p` as an entry (``p float32[...]`` clamped to ``>= 0``, ``min_keep int32[...]``)."""
    min_count = jnp.maximum(min_keep, 1)

    def filtered(top):
        t = _top_p_cut(x, p, min_count, candidates, top)
        return top[0] >= t[..., None], t

    return _enter(x, p < 1, candidates, filtered, lambda top, t: _math.keep(x, x >= t[..., None]))


# --------------------------------------------------------------------------------------- forms
def top_k(c: Candidates, k: Array, exact: bool) -> Candidates:
    """:func:`jaxsample.top_k` on candidates (``k >= V`` keeps every candidate, as it should)."""
    off = k <= 0
    if exact:
        return _mask(c, off[..., None] | (jnp.arange(c.vals.shape[-1]) < k[..., None]))
    kk = jnp.where(off, 1, k)
    t = _threshold.kth_candidate(c.vals, kk)
    return _mask(c, off[..., None] | (c.vals >= t[..., None]))


def top_p(c: Candidates, p: Array, min_keep: Array) -> Candidates:
    """:func:`jaxsample.top_p` on complete candidates: the dense function's candidate path, verbatim."""
    off = p >= 1
    lse = _math.logsumexp(c.vals)
    w = _candidate_probs(c.vals, lse)
    t, _ = _threshold.candidate_cutoff(
        c.vals, w, jnp.where(off, 0.0, p), jnp.maximum(min_keep, 1), False, jnp.ones(off.shape, bool)
    )
    return _mask(c, c.vals >= jnp.where(off, -jnp.inf, t)[..., None])


def min_p(c: Candidates, p: Array, min_keep: Array) -> Candidates:
    """:func:`jaxsample.min_p` on complete candidates (the row maximum is the first candidate)."""
    off = (p <= 0)[..., None]
    above = c.vals >= c.vals[..., :1] + jnp.log(jnp.where(off, 1.0, p[..., None]))
    kk = jnp.maximum(min_keep, 1)
    kth = _threshold.kth_candidate(c.vals, kk)
    return _mask(c, off | above | (c.vals >= kth[..., None]))


def temperature(c: Candidates, t: Array) -> Candidates:
    """:func:`jaxsample.temperature` on candidates; ``t <= 0`` keeps the first candidate (the first maximum)."""
    t = t[..., None]
    greedy = jnp.where(jnp.arange(c.vals.shape[-1]) == 0, c.vals, -jnp.inf)
    out = jnp.where(t > 0, _math.clean(c.vals / jnp.where(t > 0, t, 1.0)), greedy)
    return _candidates.restore_order(Candidates(out, c.ids))


def categorical(keys: Array, c: Candidates) -> Array:
    """:func:`jaxsample.categorical` on complete candidates (``keys`` typed ``[...]``)."""
    vals = selection.certain(c.vals)
    return selection.gumbel_max(keys, vals, c.ids)


def greedy(c: Candidates) -> Array:
    """:func:`jaxsample.greedy` on candidates: the first one, or 0 for a row with no finite logit."""
    return jnp.where(c.vals[..., 0] > -jnp.inf, c.ids[..., 0], 0).astype(jnp.int32)
