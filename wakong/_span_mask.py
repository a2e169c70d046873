"""The fixed-shape JAX form of the Wakong algorithm: :func:`span_mask`.

The reference draws its spans with ``random.Random`` one at a time. Here every row of a batch gets
spans with *the same joint distribution*, drawn in an order that suits vector hardware: one threefry
block per span entry, no sort, scatter or loop over positions. Arrays are ``[entries, T]``, rows
last, so that every step is elementwise over a tile of ``T`` rows.

1. **Budget** ``M = floor(0.188 L) + Bernoulli(frac(0.188 L))``, read from a table built in float64
   (float32 would change ``M`` at e.g. ``L = 1250``). ``L < 2`` gets ``M = 0`` (the ``Wakong`` guard).
2. **Span lengths.** While at least 10 budget units remain, the reference draws from the one full
   table, so those draws are i.i.d.: all ``capacity`` of them are drawn at once and a chain over the
   budget finds how many are used. Then fewer than 10 units remain and at most 9 more draws follow,
   each from the reference's table truncated at what is left (packed into one int32 per row).
3. **Placement.** ``shuffle`` followed by ``sorted(sample(range(P), n))`` is one uniformly random
   injection ``f`` of the ``n`` spans (in draw order) into the ``P = L - S - n + 1`` slots. We draw
   its Lehmer code ``r_q ~ U[0, P - q)`` (``f(q)`` is the ``r_q``-th slot not taken by ``f(0..q-1)``)
   and decode it without a sort: ``y = r``, then for ``j = n-2 .. 0``: ``y_q += [y_q >= r_j]`` for
   all ``q > j``. Span ``q`` starts at ``f(q) + sum_{f(j) < f(q)} (s_j + 1)``, as in the reference.
4. **Shift** every start by one with probability 1/2.
5. **Masks** are built as 32-bit words (a span, shorter than 32, sets bits in at most two words,
   chosen by a one-hot over the words) and unpacked to booleans at the end.

Exactness: each probability is the reference's exact one (counted over the 2**53 values of
``random()``) rounded to a multiple of ``2**-32``; that touches only the span-length CDFs and the
budget fraction, by at most ``2**-33``, far below anything measurable. The shuffle, the slots and the
shift are exact: the Lehmer code uses Lemire's multiply-shift on 28-bit words *with* its rejection
step (rejected entries are redrawn from 32-bit words in a rarely taken branch).

Speed on XLA:CPU (the issue's bar: 100x the reference's sequences per second at ``L = 512``) comes
from three rules. (a) *One expensive expression per output element*: XLA's loop fusion recomputes
a producer for every element of every consumer, so each threefry block yields one packed word
(length and slot word together), the budget chains return one packed int32 per row, and
``_materialised`` stores an array once (behind a branch XLA cannot remove) where several consumers
would otherwise recompute it. (b) *Loops over span entries only* (at most the tile's largest span
count), ``_CHUNK`` steps fused per iteration. (c) *Tiles* of at most ``_TILE`` rows, so that the
intermediates stay in cache; only the packed words and the outputs are batch-sized.

A row whose spans do not fit the fast ``capacity`` (probability below ``_FAST_MISS`` per row, from
the exact span-count distribution) sends its tile through an exact branch with room for every
possible span, under ``lax.cond``; a row's result never depends on the branch, the tiling or other
rows, only on its key and its length.

Other constants (:class:`~wakong.infilling.SpanSpec`: budget rate, Poisson rate, longest span ``K``)
run the same program on :class:`SpanTables`, the spec's distribution as integer tables: constants for
:func:`span_mask` (the reference's), traced arrays for :func:`sample_spans`, so that a new budget or
Poisson rate never recompiles (only ``K``, the tables' shape, is static). Lengths take the low
``K.bit_length()`` bits of an entry word, the slot word the rest; the tail after the i.i.d. draws
(at most ``K - 1`` draws) packs into as many int32 words as it needs (one for ``K = 10``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from typing import NamedTuple

from jaxsample import _noise, _validate
from jaxsample._types import Array, ArrayLike, KeyLike
from wakong import _exact
from wakong._distribution import PROPOSED_MASK_RATE
from wakong.infilling import SpanSpec

_U32 = jnp.uint32
# Random streams: block i of a stream is threefry(row key, (stream, i)), two 32-bit words.
_MISC, _ENTRIES, _TAIL, _SLOTS = 0, 1, 2, 3  # slot redraw number a uses stream _SLOTS + a
_NOWHERE = 1 << 24  # start of an entry that is not a span: beyond every word
_CHUNK = 4  # loop steps fused into one pass
_TILE = 8192  # rows per tile: few tiles (each has fixed loop and branch costs), intermediates still in cache
_FAST_MISS = 1e-7  # per-row probability that a row needs more span entries than the fast capacity
#: Longest span the fixed-shape form handles (a span must fit two 32-bit mask words).
DEVICE_SPAN_LIMIT = 31


class SpanTables(NamedTuple):
    """A :class:`~wakong.infilling.SpanSpec`'s distribution for lengths ``0..max_len``, as integer tables.

    ``whole int32[max_len + 1]``, ``thr uint32[max_len + 1]``: the budget of ``L`` words is
    ``whole[L] + (u < thr[L])`` for a uniform 32-bit ``u``; ``lengths uint32[K, K]``: row ``m - 1``
    holds ``T_t`` (``t < m``, zeros after) with ``P(s <= t | at most m left) = T_t / 2**32``.
    Numpy arrays are compiled in as constants; jax arrays are traced (new values never recompile).
    """

    whole: ArrayLike
    thr: ArrayLike
    lengths: ArrayLike


def _count_below(total: float, c: float) -> int:
    """``#{k < 2**53 : (k / 2**53) * total < c}``: the reference's ``random() * total < c`` events."""
    lo, hi = 0, 1 << 53
    while lo < hi:
        mid = (lo + hi) // 2
        if (mid * 2.0**-53) * total < c:
            lo = mid + 1
        else:
            hi = mid
    return lo


@functools.cache
def _length_thresholds(spec: SpanSpec = SpanSpec()) -> np.ndarray:
    """``uint32[K, K]``: row ``m - 1`` has ``T_t`` with ``P(s <= t | cap m) = T_t / 2**32`` (``t < m``).

    ``random.choices(range(m + 1), cum_weights=cdf)`` returns ``bisect_right(cdf, random() * cdf[-1])``,
    i.e. ``s <= t`` exactly when ``random() * cdf[-1] < cdf[t]``; we count those 53-bit events and round.
    """
    k = spec.max_span_len
    out = np.zeros((k, k), np.uint32)
    for m, cdf in enumerate(spec.cdfs(), start=1):
        for t in range(m):
            out[m - 1, t] = min((_count_below(cdf[-1] + 0.0, cdf[t]) + (1 << 20)) >> 21, 0xFFFFFFFF)
    return out


@functools.cache
def _budget_table(max_len: int, rate: float = PROPOSED_MASK_RATE) -> tuple[np.ndarray, np.ndarray]:
    """``(whole, thr)`` for ``L = 0..max_len``: ``M = whole[L] + (u32 < thr[L])``, float64 as the reference,
    capped at ``L // 2`` as :func:`wakong.infilling.span_scheme` caps it (never binding for ``0.188``)."""
    lengths = np.arange(max_len + 1, dtype=np.int64)
    x = lengths * float(rate)
    whole = np.floor(x)
    # random() < frac happens for ceil(frac * 2**53) of the 2**53 values of random(); round to 32 bits.
    thr = (np.ceil((x - whole) * 2.0**53).astype(np.int64) + (1 << 20)) >> 21
    whole = whole.astype(np.int64) + (thr >> 32)  # a fraction that rounds up to 1 always adds one
    thr = thr & 0xFFFFFFFF
    cap = lengths // 2  # also: the Wakong class never masks fewer than two words
    thr = np.where(whole >= cap, 0, thr)
    whole = np.minimum(whole, cap)
    return whole.astype(np.int32), thr.astype(np.uint32)


def span_tables(spec: SpanSpec, max_len: int) -> SpanTables:
    """The :class:`SpanTables` (numpy) of ``spec`` for sequences of up to ``max_len`` units.

    >>> t = span_tables(SpanSpec(budget_rate=0.4, poisson_rate=3.0), 512)
    >>> t.whole.shape, t.lengths.shape, int(t.whole[100])
    ((513,), (10, 10), 40)
    """
    if spec.max_span_len > DEVICE_SPAN_LIMIT:
        raise ValueError(f"max_span_len must be <= {DEVICE_SPAN_LIMIT} on the device, got {spec.max_span_len}")
    return SpanTables(*_budget_table(max_len, spec.budget_rate), _length_thresholds(spec))


@functools.cache
def _capacities(max_len: int, spec: SpanSpec = SpanSpec()) -> tuple[int, int]:
    """``(fast, full)`` numbers of span entries: ``full`` fits every outcome; ``fast`` fits a row of
    ``max_len`` words except with probability below ``_FAST_MISS`` (exact, from :mod:`wakong._exact`),
    so that a full tile of ``_TILE`` rows takes the exact fallback about once in 1000 tiles or less."""
    whole, thr = _budget_table(max_len, spec.budget_rate)
    full = max(int((whole + (thr > 0)).max()), 1)
    if max_len < 2:
        return full, full
    exact = _exact.statistics(max_len, None if spec == SpanSpec() else spec)
    beyond = np.cumsum(exact.spans_pmf[::-1])[::-1]  # beyond[c] = P(#spans >= c)
    fast = next((c for c in range(1, beyond.size - 1) if beyond[c + 1] < _FAST_MISS), full)
    return min(fast, full), full


def capacity(spec: SpanSpec, max_len: int) -> int:
    """Span entries of the fast branch for ``spec`` at ``max_len`` units: a row needs more with probability
    below 1e-7 (such tiles take the exact fallback). A static argument of :func:`sample_spans`; give the
    capacity of the largest budget rate you will trace, so that smaller ones run at full speed.

    >>> capacity(SpanSpec(), 512), capacity(SpanSpec(budget_rate=0.4, poisson_rate=3.0), 512)
    (29, 69)
    """
    return _capacities(max_len, spec)[0]


def _blocks(k1: Array, k2: Array, stream: int, n: int) -> tuple[Array, Array]:
    """``(lo, hi)``, each ``uint32[n, B]``: the two words of threefry blocks ``0..n-1`` of ``stream``."""
    i = jnp.arange(n, dtype=_U32)[:, None]
    return _noise.threefry2x32(k1, k2, jnp.full_like(i, stream), i)


def _materialised(one: Array, fn, *args):
    """``fn(*args)``, in a branch XLA cannot remove (``one`` is a traced 1), so that its outputs are
    stored: XLA:CPU would otherwise fuse cheap elementwise producers (threefry, the budget chain)
    into every consumer and recompute them there, once per element of a larger array."""
    zeros = lambda *a: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *a))
    return lax.cond(one == 1, fn, zeros, *args)


def _mul_wide(u: Array, r: Array, small: bool) -> tuple[Array, Array]:
    """High and low 32 bits of ``u * r`` (uint32), from 16-bit limbs; ``small`` promises ``r < 2**16``."""
    uh, ul = u >> 16, u & 0xFFFF
    if small:
        hi = (uh * r + ((ul * r) >> 16)) >> 16
    else:
        rh, rl = r >> 16, r & 0xFFFF
        mid = uh * rl + ((ul * rl) >> 16)
        low_mid = ul * rh + (mid & 0xFFFF)
        hi = uh * rh + (mid >> 16) + (low_mid >> 16)
    return hi, u * r


def _draw_lengths(u: Array, cap: int, table) -> Array:
    """``int32[...]``: span lengths for words ``u``, from ``table`` (``SpanTables.lengths``) truncated at ``cap``."""
    return sum((u >= table[cap - 1, t]).astype(jnp.int32) for t in range(cap))


def _len_bits(k: int) -> int:
    """Low bits of an entry word that hold a full-table length (``0..k``); the slot word takes the rest."""
    return int(k).bit_length()


def _row_words(k1: Array, k2: Array, lengths: Array, capacity: int, tables: SpanTables) -> tuple[Array, Array]:
    """Every random draw of a row that needs a threefry block, one output element per block (so XLA
    evaluates each block once). Entry ``q``'s draws never depend on ``capacity``.

    Returns:
      ``entries uint32[capacity, B]``: entry ``q``'s full-table length (low ``_len_bits(K)`` bits, from
      the low word of block ``q`` of stream ``_ENTRIES``) and its slot word (the other bits of the high
      word: 28 for ``K = 10``); ``misc uint32[B]``: the budget, with the shift in the top bit.
    """
    k = tables.lengths.shape[0]
    lo, hi = _blocks(k1, k2, _ENTRIES, capacity)
    entries = (hi & _U32(~((1 << _len_bits(k)) - 1) & 0xFFFFFFFF)) | _draw_lengths(lo, k, tables.lengths).astype(_U32)
    fraction, shift = _blocks(k1, k2, _MISC, 1)
    budget = jnp.asarray(tables.whole)[lengths] + (fraction[0] < jnp.asarray(tables.thr)[lengths])
    misc = budget.astype(_U32) | (shift[0] & _U32(1 << 31))
    return entries, misc


def _iid_chain(budget: Array, full: Array, k: int) -> Array:
    """``int32[B]``: ``n_iid | (left + 1) << 16`` after the i.i.d. draws (while at least ``k`` budget
    units remain, entry ``q`` takes ``full[q]``). ``left >= k`` means ``capacity`` was too small."""
    left, n_iid = budget, jnp.zeros_like(budget)
    for length in full:
        iid = left >= k
        left, n_iid = jnp.where(iid, left - length - 1, left), n_iid + iid
    return n_iid | (jnp.minimum(left, k) + 1) << 16


@functools.cache
def _tail_layout(k: int) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """How the at most ``k - 1`` tail draws pack into int32 words: ``(count_bits, ((word, shift, bits), ...))``.

    Word 0 starts with the number of draws (``count_bits``) and the final budget (one bit); draw ``j``
    leaves at most ``k - 1 - j`` units, so its length takes ``(k - 1 - j).bit_length()`` bits. Words
    hold at most 31 bits (non-negative int32). For ``k = 10`` everything fits one word (30 bits).
    """
    count_bits = int(k - 1).bit_length()
    fields, word, at = [], 0, count_bits + 1
    for j in range(k - 1):
        bits = int(k - 1 - j).bit_length()
        if at + bits > 31:
            word, at = word + 1, 0
        fields.append((word, at, bits))
        at += bits
    return count_bits, tuple(fields)


def _tail_draws(k1: Array, k2: Array, left: Array, table) -> tuple[Array, ...]:
    """The at most ``K - 1`` draws once fewer than ``K`` budget units remain, each truncated at what is left.

    Args:
      k1, k2: row keys (draw ``j`` uses word ``j % 2`` of block ``j // 2`` of stream ``_TAIL``).
      left: ``int32[B]`` budget left after the i.i.d. draws (``0..K - 1``).
      table: ``SpanTables.lengths`` (``[K, K]``).

    Returns:
      int32 words per row (:func:`_tail_layout`; one element per row and word, so that XLA runs the
      chain once): the number of draws, the final budget (0 or -1) plus one, and every length.
    """
    k = table.shape[0]
    count_bits, fields = _tail_layout(k)
    packed = [jnp.zeros_like(left) for _ in range(fields[-1][0] + 1 if fields else 1)]
    words = jnp.stack(_blocks(k1, k2, _TAIL, k // 2), axis=1).reshape(-1, left.shape[0])
    for j, (u, (word, at, _)) in enumerate(zip(words[: k - 1], fields)):
        length = _draw_lengths(u, 1, table)
        for cap in range(2, k - j):  # draw j has at most k - 1 - j units left
            length = jnp.where(left == cap, _draw_lengths(u, cap, table), length)
        active = left > 0
        packed[0] = packed[0] + active
        packed[word] = packed[word] + (jnp.where(active, length, 0) << at)
        left = left - jnp.where(active, length + 1, 0)
    packed[0] = packed[0] | (left + 1) << count_bits
    return tuple(packed)


def _exact_slots(k1: Array, k2: Array, words: Array, bound: Array, small: bool, len_bits: int = 4) -> Array:
    """``floor(u * bound / 2**w)`` for the ``w = 32 - len_bits``-bit slot words ``u = words >> len_bits``,
    with Lemire's rejection step: an entry whose remainder is below ``2**w mod bound`` is redrawn from
    the (32-bit) low word of its block of stream ``_SLOTS``, then ``_SLOTS + 1``, ..., so the result is
    exactly uniform."""
    hi, lo = _mul_wide(words, bound, small)
    reject = (lo >> len_bits) < _U32(1 << (32 - len_bits)) % bound

    def body(state):
        hi, reject, stream = state
        hi2, lo2 = _mul_wide(_blocks(k1, k2, stream, bound.shape[0])[0], bound, small)
        hi = jnp.where(reject, hi2, hi)
        return hi, reject & (lo2 < (_U32(0) - bound) % bound), stream + 1

    return lax.while_loop(lambda s: jnp.any(s[1]), body, (hi, reject, _U32(_SLOTS)))[0]


def _loop(steps: Array, step, init):
    """``init`` after ``step(i, acc)`` for ``i = 0 .. steps - 1`` (``steps`` traced).

    ``_CHUNK`` steps run per loop iteration, fused into one pass over ``acc``, so the last iteration
    may run up to ``_CHUNK - 1`` extra steps: callers give their entry arrays ``_CHUNK`` spare rows
    that are not spans, so that those steps are no-ops without a per-element guard.
    """

    def body(state):
        i, acc = state
        for r in range(_CHUNK):
            acc = step(i + r, acc)
        return i + _CHUNK, acc

    return lax.while_loop(lambda s: s[0] < steps, body, (jnp.int32(0), init))[1]


def _row(x: Array, j: Array) -> Array:
    """Row ``j`` of ``x`` (``[n, T]``), as ``[1, T]``."""
    return lax.dynamic_slice_in_dim(x, j, 1, axis=0)


def _decode(code: Array, count: Array) -> Array:
    """Slots ``[n, T]`` of the injection with Lehmer code ``code`` (see the module docstring).

    ``count`` (a scalar) bounds the number of real entries in the tile; entries ``>= count`` have a
    code larger than every slot, so they never shift a real entry (their own slots are garbage).
    """
    q = jnp.arange(code.shape[0])[:, None]

    def step(i, slots):
        j = count - 2 - i  # an extra step has j < 0: it reads a spare row (code larger than every slot)
        pivot = _row(code, jnp.where(j < 0, j + code.shape[0], j))
        return slots + ((slots >= pivot) & (q > j)).astype(code.dtype)

    return _loop(count - 1, step, code)


def _offsets(slot: Array, width: Array, count: Array) -> Array:
    """``sum_{j: slot_j < slot_q} width_j`` for every entry ``q`` (entries ``>= count`` have width 0)."""

    def step(j, acc):
        return acc + jnp.where(_row(slot, j) < slot, _row(width, j), 0)

    return _loop(count, step, jnp.zeros_like(slot))


def _pack(start: Array, span: Array, real: Array, count: Array, max_len: int) -> tuple[Array, Array]:
    """Bit-packed masks from the spans ``[n, T]`` (where ``real``; the first ``count`` rows hold them all).

    Returns ``(masked uint32[ceil(max_len / 32), T], inserted uint32[max_len // 32 + 1, T])``: bit
    ``i % 32`` of word ``i // 32``. A span is shorter than 32, so it sets a low part in word
    ``start // 32`` and a high part in the next word; both are computed per entry before the loop,
    which then only ORs them into the words through a one-hot.
    """
    word = jnp.where(real, start >> 5, _NOWHERE)
    offset = (start & 31).astype(_U32)
    run = (_U32(1) << span.astype(_U32)) - 1  # span <= 10
    low = run << offset
    high = jnp.where(offset == 0, _U32(0), run >> (32 - offset))
    point = jnp.where(span == 0, _U32(1) << offset, _U32(0))
    masked_words = jnp.arange(-(-max_len // 32))[:, None]
    inserted_words = jnp.arange(max_len // 32 + 1)[:, None]

    def step(q, words):
        masked, inserted = words
        w = _row(word, q)
        masked = masked | jnp.where(masked_words == w, _row(low, q), jnp.where(masked_words == w + 1, _row(high, q), 0))
        inserted = inserted | jnp.where(inserted_words == w, _row(point, q), 0)
        return masked, inserted

    tile = start.shape[1:]
    init = (jnp.zeros(masked_words.shape[:1] + tile, _U32), jnp.zeros(inserted_words.shape[:1] + tile, _U32))
    return _loop(count, step, init)


def _draw(k1: Array, k2: Array, lengths: Array, max_len: int, capacity: int, tables: SpanTables):
    """Packed masks for one tile: ``(masked uint32[Wm, T], inserted uint32[Wi, T], fits bool[T])``."""
    one = (k1[0] >> 31).astype(jnp.int32) | 1  # a traced 1
    k = tables.lengths.shape[0]
    len_bits = _len_bits(k)
    entries, misc = _materialised(
        one, functools.partial(_row_words, capacity=capacity, tables=tables), k1, k2, lengths
    )
    budget = (misc & _U32(0x7FFFFFFF)).astype(jnp.int32)
    shift = (misc >> 31).astype(jnp.int32)
    full = (entries & ((1 << len_bits) - 1)).astype(jnp.int32)
    chain = _materialised(one, functools.partial(_iid_chain, k=k), budget, full)
    n_iid, left = chain & 0xFFFF, (chain >> 16) - 1
    fits = left < k
    tail = _materialised(one, functools.partial(_tail_draws, table=tables.lengths), k1, k2, jnp.where(fits, left, 0))
    count_bits, fields = _tail_layout(k)
    count = n_iid + (tail[0] & ((1 << count_bits) - 1))
    left = ((tail[0] >> count_bits) & 1) - 1

    q = jnp.arange(capacity + _CHUNK)[:, None]  # _CHUNK spare rows for the loops' extra steps
    entries, full = jnp.pad(entries, ((0, _CHUNK), (0, 0))), jnp.pad(full, ((0, _CHUNK), (0, 0)))
    real = q < count
    j = q - n_iid  # index among the tail draws
    span = jnp.where(j < 0, full, 0)
    for i, (word, at, bits) in enumerate(fields):
        span = jnp.where(j == i, (tail[word] >> at) & ((1 << bits) - 1), span)
    span = _materialised(one, lambda x: x, jnp.where(real, span, 0).astype(jnp.int8))
    slots = lengths - budget + left + 1  # P = L - S - n + 1 >= n for every L >= 2
    bound = jnp.where(real, slots - q, 1).astype(_U32)
    small = max_len < (1 << 16) - 1
    slot_words = entries & _U32(~((1 << len_bits) - 1) & 0xFFFFFFFF)
    hi, lo = _mul_wide(slot_words, bound, small)
    suspect = (lo >> len_bits) < bound
    hi = lax.cond(jnp.any(suspect & real), lambda: _exact_slots(k1, k2, slot_words, bound, small, len_bits),
                  lambda: hi)
    # Slots and offsets are < max_len + 2: int16 when that fits (twice the SIMD lanes of int32).
    narrow = jnp.int16 if max_len < (1 << 15) - 2 else jnp.int32
    code = jnp.where(real, hi, jnp.iinfo(narrow).max).astype(narrow)
    most = jnp.minimum(jnp.max(count), capacity)  # loops below stop at the tile's largest count
    slot = _decode(code, most)
    before = _offsets(slot, jnp.where(real, span + 1, 0).astype(narrow), most)
    start = slot.astype(jnp.int32) + before.astype(jnp.int32) + shift
    masked, inserted = _pack(start, span, real, most, max_len)
    return masked, inserted, fits & (count <= capacity)


def _unpack(words: Array, rows: int, width: int) -> Array:
    """``uint32[tiles, tile, W]`` -> ``bool[rows, width]`` (the first ``rows`` rows; bit ``i % 32`` of word ``i // 32``)."""
    words = words.reshape(words.shape[0] * words.shape[1], words.shape[2])[:rows]
    return ((words[:, :, None] >> jnp.arange(32, dtype=_U32)) & 1).reshape(rows, -1)[:, :width].astype(bool)


def _key_words(key: KeyLike, batch_shape: tuple[int, ...]) -> tuple[Array, Array]:
    """The threefry key ``(k1, k2)`` of every row, ``uint32[B]`` each (rows flattened).

    A threefry row key is used as is; a single threefry key is folded with the row index exactly as
    ``jax.random.fold_in`` does (one threefry block), without materialising typed keys. Keys of other
    PRNG implementations are hashed to two words with ``jax.random.bits``.
    """
    key = _noise.typed_key(key)
    if str(jax.random.key_impl(key)) == "threefry2x32":
        data = jax.random.key_data(key)
        if key.shape == ():
            n = math.prod(batch_shape)
            rows = jnp.arange(n, dtype=_U32)
            return _noise.threefry2x32(data[0], data[1], jnp.zeros_like(rows), rows)
        if key.shape == tuple(batch_shape):
            data = data.reshape(-1, 2)
            return data[:, 0], data[:, 1]
    keys = _noise.row_keys(key, batch_shape).reshape(-1)
    words = jax.vmap(lambda k: jax.random.bits(k, (2,), _U32))(keys)
    return words[:, 0], words[:, 1]


def _tile_size(rows: int) -> int:
    """Rows per tile: at most ``_TILE``, preferably a divisor of ``rows`` (no padding)."""
    if rows <= _TILE:
        return rows
    return next((t for t in range(_TILE, _TILE // 2, -1) if rows % t == 0), _TILE)


def _check_lengths(lengths: ArrayLike, max_len: int) -> Array:
    arr = jnp.asarray(lengths)
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"lengths must be an integer array, got dtype {arr.dtype}")
    _validate.check_range(lengths, "lengths", lo=0, hi=max_len)  # integer dtype checked above
    return jnp.clip(arr, 0, max_len).astype(jnp.int32)


def span_mask(key: KeyLike, lengths: ArrayLike, max_len: int) -> tuple[Array, Array]:
    """Wakong span masks for a batch of sequences, as fixed-shape boolean arrays.

    The spans of each row have exactly the joint distribution of
    ``generate_mask_scheme(rng, length)`` (budget, truncated Poisson lengths, uniform placement with
    at least two unmasked words between spans, symmetric shift). Rows with ``length < 2`` get no
    spans, as ``Wakong`` returns such word lists unchanged.

    Args:
      key: one PRNG key (row ``b`` then uses ``fold_in(key, b)``) or one key per row (shape ``[*B]``),
        typed or raw ``uint32[..., 2]``. A row's masks depend only on its key and its length.
      lengths: ``int[*B]`` numbers of words, ``0 <= length <= max_len``; may be traced (new values
        never recompile; traced values outside the range are clamped to it).
      max_len: static padded length (a non-negative Python int).

    Returns:
      ``(masked, inserted)``: ``masked: bool[*B, max_len]`` marks the words covered by spans;
      ``inserted: bool[*B, max_len + 1]`` marks zero-length spans (a mask inserted before word ``i``;
      ``i == length`` appends one). Nothing at or beyond ``length`` is masked.

    Raises:
      ValueError: for concrete ``lengths`` that are not integers or lie outside ``[0, max_len]``, or a
        ``max_len`` that is not a non-negative int.

    >>> import jax
    >>> masked, inserted = span_mask(jax.random.key(0), jnp.array([40, 512, 0]), 512)
    >>> masked.shape, inserted.shape
    ((3, 512), (3, 513))
    >>> bool(masked[2].any() or inserted[2].any()), bool(masked[0, 40:].any() or inserted[0, 41:].any())
    (False, False)
    >>> 0.13 < float(masked[1].sum()) / 512 < 0.17
    True
    """
    max_len = _validate.static_int(max_len, "max_len", lo=0)
    lens = _check_lengths(lengths, max_len)
    return _sample(key, lens, max_len, _capacities(max_len)[0])


def sample_spans(key: KeyLike, lengths: ArrayLike, tables: SpanTables, capacity: int) -> tuple[Array, Array]:
    """:func:`span_mask` for any :class:`~wakong.infilling.SpanSpec`: the spans of each row have exactly
    the joint law of :func:`wakong.infilling.span_scheme` with that spec (its budget rate and cap,
    truncated Poisson, placement and shift), probabilities rounded to multiples of ``2**-32``.

    Args:
      key, lengths: as :func:`span_mask` (``max_len`` is ``len(tables.whole) - 1``).
      tables: :func:`span_tables` of the spec; traced when passed as jax arrays (a new budget or Poisson
        rate never recompiles; the longest span ``K`` is the tables' static shape).
      capacity: static span entries of the fast branch (:func:`capacity`); rows that need more take an
        exact fallback, so any capacity gives the same masks.

    Returns:
      ``(masked bool[*B, max_len], inserted bool[*B, max_len + 1])`` as :func:`span_mask`.

    >>> import jax
    >>> tables = span_tables(SpanSpec(budget_rate=0.4, poisson_rate=3.0), 64)
    >>> m, i = jax.jit(sample_spans, static_argnums=3)(jax.random.key(0), jnp.array([64, 3]), tables, 16)
    >>> m.shape, i.shape
    ((2, 64), (2, 65))
    """
    max_len = int(np.shape(tables.whole)[0]) - 1
    if np.shape(tables.thr) != (max_len + 1,) or np.ndim(tables.lengths) != 2:
        raise ValueError("tables must be span_tables(spec, max_len): whole/thr [max_len + 1], lengths [K, K]")
    capacity = _validate.static_int(capacity, "capacity", lo=1)
    return _sample(key, _check_lengths(lengths, max_len), max_len, capacity, tables)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _sample(key: KeyLike, lengths: Array, max_len: int, capacity: int,
            tables: SpanTables | None = None) -> tuple[Array, Array]:
    """:func:`span_mask` on checked ``int32`` lengths, with ``capacity`` span entries in the fast branch,
    for ``tables`` (default: the reference's, compiled in as constants).

    The batch runs in tiles of at most ``_TILE`` rows (a loop), so that every intermediate stays small
    and in cache; only the packed words and the outputs are batch-sized.
    """
    batch_shape = lengths.shape
    rows = math.prod(batch_shape)
    if rows == 0:
        return jnp.zeros(batch_shape + (max_len,), bool), jnp.zeros(batch_shape + (max_len + 1,), bool)
    k1, k2 = _key_words(key, batch_shape)
    tile = _tile_size(rows)
    tiles = -(-rows // tile)
    pad = lambda x: jnp.pad(x.reshape(-1), (0, tiles * tile - rows)).reshape(tiles, tile)
    if tables is None:
        tables, full = span_tables(SpanSpec(), max_len), _capacities(max_len)[1]
    else:
        full = max(max_len // 2, 1)  # the budget never exceeds L // 2
    fast = min(capacity, full)

    def one_tile(args):
        k1, k2, lengths = args
        masked, inserted, fits = _draw(k1, k2, lengths, max_len, fast, tables)
        if fast < full:
            masked, inserted = lax.cond(
                jnp.all(fits), lambda: (masked, inserted), lambda: _draw(k1, k2, lengths, max_len, full, tables)[:2]
            )
        return masked.T, inserted.T

    masked, inserted = lax.map(one_tile, (pad(k1), pad(k2), pad(lengths)))  # [tiles, tile, W]
    shape = batch_shape + (-1,)
    return _unpack(masked, rows, max_len).reshape(shape), _unpack(inserted, rows, max_len + 1).reshape(shape)
