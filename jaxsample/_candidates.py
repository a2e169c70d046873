"""Candidate sets: the sort-free fast path shared by truncation and selection.

Most rows a sampler sees in practice have few tokens that matter (after ``top_k``, or a peaked
distribution). Taking the ``K`` largest logits with ``lax.top_k`` costs about two passes over the
vocabulary, after which all work happens on ``[..., K]`` arrays. A row is *covered* when the
answer provably lies inside its candidates; uncovered rows take an exact full-vocabulary path.

Batch invariance: :func:`choose` evaluates the full path only when some row needs it, and then
still returns the fast answer for covered rows, so a row's result depends on that row alone.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

from jaxsample._types import Array

#: Default number of candidates ``K``. Covers llama.cpp's top_k=40 and HF's top_k=50 defaults.
DEFAULT_CANDIDATES = 64


def top(x: Array, k: int) -> tuple[Array, Array]:
    """The ``k`` largest entries of each row, descending, ties in id order.

    Args:
      x: ``float32[..., V]`` (NaN-free).
      k: static number of candidates; clipped to ``V``.

    Returns:
      ``(values float32[..., k'], ids int32[..., k'])`` with ``k' = min(k, V)``.

    The result sits behind ``lax.optimization_barrier``: XLA:CPU lowers ``top_k`` as a sort plus a
    slice and only restores its fast TopK kernel when the slice starts at 0, so indexing the result
    (e.g. ``vals[..., -1]``) would otherwise fuse into the slice and keep a full sort (~35x slower).
    """
    k = min(int(k), x.shape[-1])
    vals, ids = lax.top_k(x, k)
    # One barrier per output: a barrier over the (vals, ids) pair is simplified into a barrier over the
    # TopK tuple itself in multi-device (SPMD) programs, which crashes XLA:CPU's TopkDecomposer
    # (shard_map / pmap over more than one CPU device). Same speed, same fast kernel.
    return lax.optimization_barrier(vals), lax.optimization_barrier(ids.astype(jnp.int32))


def choose(covered: Array, fast: Callable[[], Array], full: Callable[[], Array]) -> Array:
    """Per-row ``where(covered, fast(), full())`` that skips ``full`` when every row is covered.

    Args:
      covered: ``bool[...]`` per-row flag (broadcast against the results' leading axes).
      fast: thunk computing the candidate-path result (valid where ``covered``).
      full: thunk computing the exact full-vocabulary result (valid everywhere).

    Returns:
      The combined result, with the shape and dtype of ``fast()``.
    """

    def both():
        f = fast()
        g = full()
        c = covered.reshape(covered.shape + (1,) * (f.ndim - covered.ndim))
        return jnp.where(c, f, g)

    return lax.cond(jnp.all(covered), fast, both)


def scatter_mask(ids: Array, keep: Array, vocab_size: int) -> Array:
    """``bool[..., V]`` that is True at ``ids[..., j]`` wherever ``keep[..., j]``."""
    hit = jnp.zeros(ids.shape[:-1] + (vocab_size,), bool)
    flat_ids = ids.reshape(-1, ids.shape[-1])
    flat_keep = keep.reshape(-1, ids.shape[-1])
    rows = jnp.arange(flat_ids.shape[0])[:, None]
    out = hit.reshape(-1, vocab_size).at[rows, flat_ids].max(flat_keep)
    return out.reshape(hit.shape)

