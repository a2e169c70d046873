"""The fixed-shape JAX form of the Wakong algorithm: :func:`span_mask`.

The reference draws its spans with ``random.Random`` one at a time. Here every row of a batch gets
spans with *the same joint distribution*, drawn in an order that suits vector hardware: ``O(#spans)``
random words per row, no sort, scatter or loop over positions. Arrays are ``[entries, B]``, batch
last, so that every step is elementwise over the batch.

1. **Budget** ``M = floor(0.188 L) + Bernoulli(frac(0.188 L))``, read from a table built in float64
   (float32 would change ``M`` at e.g. ``L = 1250``). ``L < 2`` gets ``M = 0`` (the ``Wakong`` guard).
2. **Span lengths.** While at least 10 budget units remain, the reference draws from the one full
   table, so those draws are i.i.d.: all ``capacity`` of them are drawn at once and a scan over the
   budget finds how many are used. Then fewer than 10 units remain and at most 9 more draws follow,
   each from the reference's table truncated at what is left.
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
shift are exact: uniform integers use Lemire's multiply-shift *with* its rejection step.

Every loop runs over span entries (at most the batch's largest span count), never over positions.
Loops also keep XLA:CPU from fusing long elementwise producers (threefry, the decode chain) into
each consumer, where they would be recomputed per pair. A row whose spans do not fit the fast
``capacity`` (probability below ``1e-9`` per row) sends the batch through an exact branch with room
for every possible span, under ``lax.cond``; a row's result never depends on the branch or on other
rows, only on its key and its length.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _noise, _validate
from jaxsample._types import Array, ArrayLike, KeyLike
from wakong._distribution import MAX_SPAN_LEN, PROPOSED_MASK_RATE, span_length_cdfs, span_length_pmfs

_U32 = jnp.uint32
# Random streams: threefry(row key, (stream, i // 2)) gives words 2i and 2i + 1 of a stream.
_MISC, _PREFIX, _TAIL, _SLOTS = 0, 1, 2, 3  # slot redraw number a uses stream _SLOTS + a
_TAIL_DRAWS = MAX_SPAN_LEN - 1  # once fewer than 10 budget units remain, at most 9 draws follow
_NOWHERE = 1 << 24  # start of an entry that is not a span: beyond every word
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


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
def _length_thresholds() -> np.ndarray:
    """``uint32[10, 10]``: row ``m - 1`` has ``T_t`` with ``P(s <= t | cap m) = T_t / 2**32`` (``t < m``).

    ``random.choices(range(m + 1), cum_weights=cdf)`` returns ``bisect_right(cdf, random() * cdf[-1])``,
    i.e. ``s <= t`` exactly when ``random() * cdf[-1] < cdf[t]``; we count those 53-bit events and round.
    """
    out = np.zeros((MAX_SPAN_LEN, MAX_SPAN_LEN), np.uint32)
    for m, cdf in enumerate(span_length_cdfs(), start=1):
        for t in range(m):
            out[m - 1, t] = (_count_below(cdf[-1] + 0.0, cdf[t]) + (1 << 20)) >> 21
    return out


@functools.cache
def _budget_table(max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(whole, thr)`` for ``L = 0..max_len``: ``M = whole[L] + (u32 < thr[L])``, float64 as the reference."""
    x = np.arange(max_len + 1, dtype=np.float64) * PROPOSED_MASK_RATE
    whole = np.floor(x)
    # random() < frac happens for ceil(frac * 2**53) of the 2**53 values of random(); round to 32 bits.
    thr = (np.ceil((x - whole) * 2.0**53).astype(np.int64) + (1 << 20)) >> 21
    whole = whole.astype(np.int64) + (thr >> 32)  # a fraction that rounds up to 1 always adds one
    whole[:2], thr[:2] = 0, 0  # the Wakong class never masks fewer than two words
    return whole.astype(np.int32), (thr & 0xFFFFFFFF).astype(np.uint32)


@functools.cache
def _capacities(max_len: int) -> tuple[int, int]:
    """``(fast, full)`` numbers of span entries: ``full`` fits every outcome, ``fast`` all but ~1e-9."""
    whole, thr = _budget_table(max_len)
    full = max(int((whole + (thr > 0)).max()), 1)
    pmf = span_length_pmfs()[MAX_SPAN_LEN - 1]
    mean = float(pmf @ np.arange(1, MAX_SPAN_LEN + 2))
    var = float(pmf @ np.arange(1, MAX_SPAN_LEN + 2) ** 2) - mean**2
    # n = #spans is about M / mean + 1/2 with sd sqrt(M var / mean^3); its upper tail is lighter than normal.
    fast = math.ceil(full / mean + 0.5 + 6.5 * math.sqrt(full * var / mean**3) + 2)
    return min(fast, full), full


def _threefry2x32(k1: Array, k2: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 (20 rounds), unrolled: bit-identical to ``jax.extend.random.threefry2x32_p``.

    JAX's own lowering keeps the rounds in a loop, which XLA:CPU runs ~4x slower.
    """
    ks = (k1, k2, k1 ^ k2 ^ _U32(0x1BD11BDA))
    x0, x1 = x0 + k1, x1 + k2
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << _U32(r)) | (x1 >> _U32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + _U32(i + 1)
    return x0, x1


def _words(k1: Array, k2: Array, stream, n: int, used=None) -> Array:
    """``uint32[n, B]``: words ``0..n-1`` of ``stream`` (word ``i`` never depends on ``n``).

    Generated block by block in a loop, so the words are computed once and stored (XLA:CPU would
    otherwise fuse threefry into every consumer and recompute it there). With ``used`` (a traced
    count), only the first ``used`` words are generated; the others are zero.
    """
    blocks = (n + 1) // 2
    stream = jnp.asarray(stream, _U32)

    def block(i, out):
        lo, hi = _threefry2x32(k1, k2, stream, i.astype(_U32))
        return lax.dynamic_update_slice_in_dim(out, jnp.stack([lo, hi]), 2 * i, axis=0)

    stop = blocks if used is None else (used + 1) // 2
    out = lax.fori_loop(0, stop, block, jnp.zeros((2 * blocks, k1.shape[0]), _U32))
    return out[:n]


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


def _span_lengths(k1: Array, k2: Array, budget: Array, capacity: int) -> tuple[Array, ...]:
    """Span lengths in draw order.

    Returns:
      ``(lengths int32[capacity, B], count int32[B], left int32[B], fits bool[B])``: entries ``>= count``
      are not spans (their lengths are garbage); ``left`` is the final budget (0 or -1), so the lengths
      sum to ``budget - left - count``; ``fits`` is False when ``capacity`` was too small for the row.
    """
    table = _length_thresholds()
    u = _words(k1, k2, _PREFIX, capacity)
    full = sum((u >= _U32(t)).astype(jnp.int32) for t in table[-1])  # draws with the full table

    def iid_step(carry, length):  # the reference's loop while at least 10 budget units remain
        left, n_iid = carry
        iid = left >= MAX_SPAN_LEN
        return (jnp.where(iid, left - length - 1, left), n_iid + iid), None

    (left, n_iid), _ = lax.scan(iid_step, (budget, jnp.zeros_like(budget)), full)

    truncated = jnp.asarray(table[:_TAIL_DRAWS, :_TAIL_DRAWS].T)  # [t, cap - 1] for caps 1..9
    t = jnp.arange(_TAIL_DRAWS)[:, None]
    tail_words = _words(k1, k2, _TAIL, _TAIL_DRAWS)

    def tail_step(state):  # at most 9 draws, each from the table truncated at what is left
        i, left, n_tail, lengths = state
        u = lax.dynamic_index_in_dim(tail_words, i, keepdims=False)
        thr = truncated[:, jnp.clip(left - 1, 0, _TAIL_DRAWS - 1)]  # [t, B]: this row's cap
        length = jnp.sum((u >= thr) & (t < left), axis=0, dtype=jnp.int32)
        active = left > 0
        lengths = jnp.where(active & (entry == n_iid + n_tail), length, lengths)  # draw goes after the others
        return i + 1, left - jnp.where(active, length + 1, 0), n_tail + active, lengths

    fits = left < MAX_SPAN_LEN
    entry = jnp.arange(capacity)[:, None]
    init = (jnp.int32(0), jnp.where(fits, left, 0), jnp.zeros_like(left), full)
    _, left, n_tail, lengths = lax.while_loop(lambda s: jnp.any(s[1] > 0), tail_step, init)
    count = n_iid + n_tail
    return lengths, count, left, fits & (count <= capacity)


def _uniform_below(k1: Array, k2: Array, bound: Array, used: Array, small: bool) -> Array:
    """``int32[n, B]``: independent uniform integers in ``[0, bound)`` (``bound >= 1``), exactly.

    Lemire's method: ``hi, lo = u * bound``; ``hi`` is uniform unless ``lo < 2**32 mod bound``. That test
    needs a division, so it only runs (in a rarely entered loop) when ``lo < bound``; rejected entries
    are redrawn from the next stream, so every entry's value depends only on its own words.
    """
    n = bound.shape[0]
    hi, lo = _mul_wide(_words(k1, k2, _SLOTS, n, used), bound, small)

    def body(state):
        hi, lo, suspect, redraw = state
        reject = suspect & (lo < (_U32(0) - bound) % bound)
        redraw = redraw + 1
        hi2, lo2 = _mul_wide(_words(k1, k2, _SLOTS + redraw, n, used), bound, small)
        hi, lo = jnp.where(reject, hi2, hi), jnp.where(reject, lo2, lo)
        return hi, lo, reject & (lo2 < bound), redraw

    suspect = (lo < bound) & (bound > 1)  # 2**32 mod 1 == 0: a bound of 1 never rejects
    hi, *_ = lax.while_loop(lambda s: jnp.any(s[2]), body, (hi, lo, suspect, jnp.uint32(0)))
    return hi.astype(jnp.int32)


def _decode(code: Array, count: Array) -> Array:
    """Slots ``[n, B]`` of the injection with Lehmer code ``code`` (see the module docstring).

    ``count`` (a scalar) bounds the number of real entries in the batch; entries ``>= count`` have a
    code larger than every slot, so they never shift another entry.
    """
    q = jnp.arange(code.shape[0], dtype=code.dtype)[:, None]

    def step(i, slots):
        j = count - 2 - i
        pivot = lax.dynamic_index_in_dim(code, j, keepdims=True)
        return slots + ((slots >= pivot) & (q > j.astype(code.dtype))).astype(code.dtype)

    return lax.fori_loop(0, count - 1, step, code)


def _offsets(slot: Array, width: Array, count: Array) -> Array:
    """``sum_{j: slot_j < slot_q} width_j`` for every entry ``q`` (entries ``>= count`` have width 0)."""

    def step(j, acc):
        below = lax.dynamic_index_in_dim(slot, j, keepdims=True) < slot
        return acc + jnp.where(below, lax.dynamic_index_in_dim(width, j, keepdims=True), 0).astype(acc.dtype)

    return lax.fori_loop(0, count, step, jnp.zeros_like(slot))


def _pack(start: Array, span: Array, count: Array, max_len: int) -> tuple[Array, Array]:
    """Bit-packed masks from the spans ``[n, B]`` (the first ``count`` entries are real, in any order).

    Returns ``(masked uint32[ceil(max_len / 32), B], inserted uint32[max_len // 32 + 1, B])``: bit
    ``i % 32`` of word ``i // 32``. A span covers at most two words (it is shorter than 32), so each
    contributes a low and a high part, set through a one-hot over the words.
    """
    masked_words = jnp.arange(-(-max_len // 32))[:, None]
    inserted_words = jnp.arange(max_len // 32 + 1)[:, None]

    def step(q, words):
        masked, inserted = words
        p = lax.dynamic_index_in_dim(start, q, keepdims=True)
        s = lax.dynamic_index_in_dim(span, q, keepdims=True).astype(_U32)
        word, offset = p >> 5, (p & 31).astype(_U32)
        run = (_U32(1) << s) - 1  # s <= 10
        low = run << offset
        high = jnp.where(offset == 0, _U32(0), run >> (32 - offset))
        masked = masked | jnp.where(masked_words == word, low, jnp.where(masked_words == word + 1, high, _U32(0)))
        point = jnp.where(s == 0, _U32(1) << offset, _U32(0))
        inserted = inserted | jnp.where(inserted_words == word, point, _U32(0))
        return masked, inserted

    batch = start.shape[1:]
    init = (jnp.zeros(masked_words.shape[:1] + batch, _U32), jnp.zeros(inserted_words.shape[:1] + batch, _U32))
    return lax.fori_loop(0, count, step, init)


def _draw(k1: Array, k2: Array, lengths: Array, max_len: int, capacity: int):
    """Packed masks for one batch: ``(masked uint32[Wm, B], inserted uint32[Wi, B], fits bool[B])``."""
    whole, thr = _budget_table(max_len)
    misc = _words(k1, k2, _MISC, 2)
    budget = jnp.asarray(whole)[lengths] + (misc[0] < jnp.asarray(thr)[lengths])
    shift = (misc[1] >> 31).astype(jnp.int32)

    span, count, left, fits = _span_lengths(k1, k2, budget, capacity)
    most = jnp.minimum(jnp.max(count), capacity)  # loops below stop at the batch's largest count
    q = jnp.arange(capacity)[:, None]
    real = q < count
    span = jnp.where(real, span, 0)
    slots = lengths - budget + left + 1  # P = L - S - n + 1 >= n for every L >= 2
    bound = jnp.where(real, slots - q, 1).astype(_U32)
    # Slots and offsets are < max_len + 2: int16 when that fits (twice the SIMD lanes of int32).
    narrow = jnp.int16 if max_len < (1 << 15) - 2 else jnp.int32
    code = _uniform_below(k1, k2, bound, most, small=max_len < (1 << 16) - 1)
    code = jnp.where(real, code, jnp.iinfo(narrow).max).astype(narrow)
    slot = _decode(code, most)
    before = _offsets(slot, jnp.where(real, span + 1, 0).astype(narrow), most)
    start = slot.astype(jnp.int32) + before.astype(jnp.int32) + shift

    masked, inserted = _pack(jnp.where(real, start, _NOWHERE), span, most, max_len)
    return masked, inserted, fits


def _unpack(words: Array, width: int) -> Array:
    """``uint32[W, B]`` -> ``bool[B, width]`` (bit ``i % 32`` of word ``i // 32``)."""
    bits = (words.T[:, :, None] >> jnp.arange(32, dtype=_U32)) & 1
    return bits.reshape(words.shape[1], -1)[:, :width].astype(bool)


def _key_words(key: KeyLike, batch_shape: tuple[int, ...]) -> tuple[Array, Array]:
    """Two ``uint32[B]`` threefry key words per row (rows flattened), derived from the row keys."""
    keys = _noise.row_keys(key, batch_shape).reshape(-1)
    words = jax.vmap(lambda k: jax.random.bits(k, (2,), _U32))(keys)
    return words[:, 0], words[:, 1]


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


def _sample(key: KeyLike, lengths: Array, max_len: int, capacity: int) -> tuple[Array, Array]:
    """:func:`span_mask` on checked ``int32`` lengths, with ``capacity`` span entries in the fast branch."""
    batch_shape = lengths.shape
    flat = lengths.reshape(-1)
    if flat.shape[0] == 0:
        return jnp.zeros(batch_shape + (max_len,), bool), jnp.zeros(batch_shape + (max_len + 1,), bool)
    k1, k2 = _key_words(key, batch_shape)
    full = _capacities(max_len)[1]
    masked, inserted, fits = _draw(k1, k2, flat, max_len, min(capacity, full))
    if capacity < full:
        masked, inserted = lax.cond(
            jnp.all(fits), lambda: (masked, inserted), lambda: _draw(k1, k2, flat, max_len, full)[:2]
        )
    shape = batch_shape + (-1,)
    return _unpack(masked, max_len).reshape(shape), _unpack(inserted, max_len + 1).reshape(shape)
