"""Candidate sets: the sort-free fast path shared by truncation and selection.

Most rows a sampler sees in practice have few tokens that matter (after ``top_k``, or a peaked
distribution). Taking the ``K`` largest logits (:func:`top`, about one pass over the vocabulary)
moves all further work to ``[..., K]`` arrays. A row is *covered* when the answer provably lies
inside its candidates; uncovered rows take an exact full-vocabulary path.

Batch invariance: :func:`choose` evaluates the full path only when some row needs it, and then
still returns the fast answer for covered rows, so a row's result depends on that row alone.

Sharding/TPU: :func:`top` is ``lax.top_k`` (after a chunked max on long rows), row by row; with the
vocabulary axis sharded, XLA gathers it first. :func:`choose` and :func:`restore_order` decide per
batch with ``lax.cond``: an all-reduce of one bool under GSPMD, and both branches under ``vmap``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxsample import _math
from jaxsample._types import Array

#: Default number of candidates ``K``. Covers llama.cpp's top_k=40 and HF's top_k=50 defaults.
DEFAULT_CANDIDATES = 64

#: Chunk size of :func:`top` and how many chunks a row must have (in units of ``k``) before
#: chunking pays off; measured on XLA:CPU (``B=32, V=32000``: 1.3 ms vs 2.0 ms for ``lax.top_k``;
#: ``B=64, V=131072``: 4.5 ms vs 12 ms).
_CHUNK = 32
_LEAF = 16


def _top_k(x: Array, k: int) -> tuple[Array, Array]:
    # The barrier keeps XLA:CPU's TopK kernel: it lowers top_k as a sort plus a slice and restores
    # the kernel only when the slice starts at 0, so indexing the result would otherwise fuse into
    # the slice and keep a full sort (~35x slower).
    vals, ids = lax.top_k(jnp.where(x == 0, jnp.float32(0.0), x), k)  # -0.0 ties with 0.0
    # One barrier per output: a barrier over the (vals, ids) pair is simplified into one over the TopK
    # tuple itself in multi-device (SPMD) programs, which crashes XLA:CPU's TopkDecomposer.
    return lax.optimization_barrier(vals), lax.optimization_barrier(ids.astype(jnp.int32))


def chunk_maxima(x: Array) -> Array:
    """``float32[..., ceil(V / 32)]``: the maxima of ``x [..., V]``'s chunks as :func:`top` takes them
    (one fused pass; their maximum is the row maximum, which a caller can take from here)."""
    return _chunk_max(_math.chunks(x, _CHUNK))


def _chunk_max(xc: Array) -> Array:
    """``float32[..., n]``: the maxima of chunks ``[..., n, c]`` (NaN-free), reduced as ``int32`` order keys.

    The same values as ``jnp.max(xc, axis=-1)`` (of ``-0.0`` and ``0.0``, ``0.0``). XLA:CPU hands a
    float32 ``max`` to YNNPACK, which reads its input from memory, so an input computed on the fly
    (``NaN`` mapped, filtered, hashed) would first be written out as a ``[B, V]`` buffer; an integer
    ``max`` is XLA's own and fuses its producer (~0.15 ``logsumexp`` passes from memory, against
    ~2.3 when a fresh ``[B, V]`` buffer is written first, at ``B = 64, V = 131072``).
    """
    return _math.from_order_bits(jnp.max(_math.order_bits(xc), axis=-1))


def _floor(x: Array, k: int) -> Array:
    """``x`` with ``-inf`` below a lower bound of its ``k``-th largest entry (same ``lax.top_k``, cheaper).

    ``k`` disjoint strided groups give ``k`` distinct entries at or above the least group maximum
    ``L``, so an entry below ``L`` ranks below ``k`` others and stays out of the top ``k`` as ``-inf``.
    When ``L > -inf`` the top ``k`` is finite and unchanged (values, ids, order); when ``L = -inf``
    nothing changes. Fewer entries above ``L`` mean fewer insertions into XLA:CPU's ``k``-heap.
    """
    g = x.shape[-1] // k
    if g < 8:  # short rows: little to save (and the small programs stay as they were)
        return x
    lead = x.shape[:-1]
    bound = jnp.min(jnp.max(x[..., : g * k].reshape(lead + (g, k)), axis=-2), axis=-1, keepdims=True)
    return jnp.where(x < bound, -jnp.inf, x)


def _top(
    x: Array, k: int, chunk: int, leaf: int, prune: bool = True, at: Callable[[Array], Array] | None = None,
    given: Array | None = None,
) -> tuple[Array, Array]:
    """:func:`top` with explicit chunking (tests force several levels on small rows).

    ``prune=False`` skips the ``-inf`` floors (:func:`_floor`, the ``k``-th chunk maximum): the same
    result bit for bit, ``-inf`` ids included (tests and benchmarks compare both). ``at``: as in
    :func:`top`; ``given``: the chunk maxima of ``x`` (chunks of ``chunk``), :func:`top`'s ``maxima``.
    """
    v = x.shape[-1]
    if v <= leaf * k or -(-v // chunk) <= k:
        return _top_k(_floor(x, k) if prune else x, k)
    # The k largest entries lie in the k chunks with the largest maxima (ties by chunk index): an
    # entry of any other chunk is below k chunk maxima, or tied with them at a higher id.
    xc = _math.chunks(x, chunk)  # [..., n, c]
    maxima, best = _top(_chunk_max(xc) if given is None else given, k, chunk, leaf, prune)
    best = jnp.sort(best, axis=-1)  # id order, so that ties below resolve by id
    ids = best[..., None] * chunk + jnp.arange(chunk, dtype=jnp.int32)
    lead = x.shape[:-1]
    if at is None:
        block = jnp.take_along_axis(xc, best[..., None], axis=-2).reshape(lead + (k * chunk,))  # [..., k c]
    else:  # the padding of the last chunk (ids >= V) is -inf, as in xc
        flat = ids.reshape(lead + (k * chunk,))
        block = jnp.where(flat < v, at(jnp.minimum(flat, v - 1)), -jnp.inf)
    if prune:  # below the k-th chunk maximum: below k entries (the chunk maxima), so -inf changes no rank
        block = jnp.where(block < maxima[..., -1:], -jnp.inf, block)
    # The padding of the last chunk sits at the end of the block, so ties at -inf never reach it:
    # the other (k - 1) * c + 1 >= k entries come first.
    vals, j = _top_k(block, k)
    return vals, jnp.take_along_axis(ids.reshape(lead + (k * chunk,)), j, axis=-1)


def top(
    x: Array, k: int, at: Callable[[Array], Array] | None = None, maxima: Array | None = None
) -> tuple[Array, Array]:
    """The ``k`` largest entries of each row, descending, ties in id order.

    Args:
      x: ``float32[..., V]`` (NaN-free).
      k: static number of candidates; clipped to ``V``.
      at: optional ``ids int32[..., n] -> x's entries at ids``, for an ``x`` computed on the fly
        (NaN-mapped, hashed): entries are then read back through ``at`` rather than gathered from
        ``x``, so that on long rows ``x`` feeds one fused pass (:func:`_chunk_max`) and XLA need not
        write it out (a gather takes its operand from memory). See :func:`top_of`.
      maxima: :func:`chunk_maxima` ``(x)`` if the caller has them (the pass over ``V`` is then skipped).

    Returns:
      ``(values float32[..., k'], ids int32[..., k'])`` with ``k' = min(k, V)``, distinct ids.
      ``-0.0`` ties with ``0.0`` (ids in order) and keeps its sign. In rows with fewer than ``k'`` finite
      entries, the ``-inf`` entries are ``-inf`` tokens but not necessarily the lowest ids.

    Cost: ``lax.top_k`` keeps a ``k``-heap per row and runs one row after the other on CPU, so
    long rows are first cut into chunks of ``32``: one ``max`` pass over ``V``, the ``k`` best
    chunks (recursively), and ``lax.top_k`` over their ``32 k`` entries. Before each ``lax.top_k``,
    entries below a lower bound of the ``k``-th largest become ``-inf`` (:func:`_floor`; the ``k``-th
    chunk maximum for the block): same result, and on XLA:CPU far fewer heap insertions (only
    entries at or above the bound can enter the heap), which are most of a ``lax.top_k``'s time there.
    """
    vals, ids = _top(x, min(int(k), x.shape[-1]), _CHUNK, _LEAF, at=at, given=maxima)
    # The search ties -0.0 with 0.0; hand back each candidate's own value (its sign included).
    own = jnp.take_along_axis(x, ids, axis=-1) if at is None else at(ids)
    return jnp.where(vals == 0, own, vals), ids


def top_of(x: Array, k: int, f: Callable[[Array], Array]) -> tuple[Array, Array]:
    """:func:`top` of ``f(x)`` for an elementwise ``f`` (e.g. :func:`jaxsample._math.clean` on logits
    that may hold NaN) without writing ``f(x)`` out: ``f`` is applied in the pass and to gathered entries."""
    return top(f(x), k, at=lambda ids: f(jnp.take_along_axis(x, ids, axis=-1)))


class Candidates(NamedTuple):
    """A row of logits held as ``K`` entries: ``vals`` at ``ids``, ``-inf`` at every other token.

    Canonical order, as :func:`top` returns it and every candidate form of a stage keeps it:
    finite values first, descending, ties by id, then ``-inf`` entries (ids of ``-inf`` tokens).
    Ids are distinct.
    """

    vals: Array  # float32[..., K]
    ids: Array  # int32[..., K]

    def mask(self, keep: Array) -> "Candidates":
        """The candidates with ``-inf`` where ``keep [..., K]`` is False (a filter on candidates)."""
        return Candidates(jnp.where(keep, self.vals, -jnp.inf), self.ids)


def complete(vals: Array, vocab_size: int) -> Array:
    """``bool[...]``: whether candidate values ``[..., K]`` from :func:`top` hold every finite entry."""
    if vals.shape[-1] >= vocab_size:
        return jnp.ones(vals.shape[:-1], bool)
    return vals[..., -1] == -jnp.inf


def densify(c: Candidates, vocab_size: int) -> Array:
    """``float32[..., V]`` logits of candidates (``-inf`` away from ``c.ids``)."""
    empty = jnp.full(c.vals.shape[:-1] + (vocab_size,), -jnp.inf, c.vals.dtype)
    return _math.scatter(empty, c.ids, c.vals, "set")


def restore_order(c: Candidates) -> Candidates:
    """Canonical order again after a monotone map of the values, which may create ties out of id order."""
    finite = c.vals > -jnp.inf
    disordered = (c.vals[..., 1:] == c.vals[..., :-1]) & finite[..., 1:] & (c.ids[..., 1:] < c.ids[..., :-1])

    def sort():
        key = -jnp.where(c.vals == 0, jnp.float32(0.0), c.vals)  # -0.0 ties with 0.0
        _, ids, vals = lax.sort((key, c.ids, c.vals), dimension=c.vals.ndim - 1, num_keys=2)
        return Candidates(vals, ids)

    return _math.cond(jnp.any(disordered), sort, lambda: c)


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

    return _math.cond(jnp.all(covered), fast, both)
