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
from wakong import _exact
from wakong._distribution import MAX_SPAN_LEN, PROPOSED_MASK_RATE, span_length_cdfs

_U32 = jnp.uint32
# Random streams: block i of a stream is threefry(row key, (stream, i)), two 32-bit words.
_MISC, _ENTRIES, _TAIL, _SLOTS = 0, 1, 2, 3  # slot redraw number a uses stream _SLOTS + a
_TAIL_DRAWS = MAX_SPAN_LEN - 1  # once fewer than 10 budget units remain, at most 9 draws follow
_NOWHERE = 1 << 24  # start of an entry that is not a span: beyond every word
_CHUNK = 4  # loop steps fused into one pass
_TILE = 8192  # rows per tile: few tiles (each has fixed loop and branch costs), intermediates still in cache
_FAST_MISS = 1e-7  # per-row probability that a row needs more span entries than the fast capacity
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
    """``(fast, full)`` numbers of span entries: ``full`` fits every outcome; ``fast`` fits a row of
    ``max_len`` words except with probability below ``_FAST_MISS`` (exact, from :mod:`wakong._exact`),
    so that a full tile of ``_TILE`` rows takes the exact fallback about once in 1000 tiles or less."""
    whole, thr = _budget_table(max_len)
    full = max(int((whole + (thr > 0)).max()), 1)
    if max_len < 2:
        return full, full
    beyond = np.cumsum(_exact.statistics(max_len).spans_pmf[::-1])[::-1]  # beyond[c] = P(#spans >= c)
    fast = next((c for c in range(1, beyond.size - 1) if beyond[c + 1] < _FAST_MISS), full)
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


def _blocks(k1: Array, k2: Array, stream: int, n: int) -> tuple[Array, Array]:
    """``(lo, hi)``, each ``uint32[n, B]``: the two words of threefry blocks ``0..n-1`` of ``stream``."""
    i = jnp.arange(n, dtype=_U32)[:, None]
    return _threefry2x32(k1, k2, jnp.full_like(i, stream), i)


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


def _draw_lengths(u: Array, cap: int) -> Array:
    """``int32[...]``: span lengths for words ``u``, from the reference's table truncated at ``cap`` (1..10)."""
    return sum((u >= _U32(t)).astype(jnp.int32) for t in _length_thresholds()[cap - 1, :cap])


def _row_words(k1: Array, k2: Array, lengths: Array, max_len: int, capacity: int) -> tuple[Array, Array]:
    """Every random draw of a row that needs a threefry block, one output element per block (so XLA
    evaluates each block once). Entry ``q``'s draws never depend on ``capacity``.

    Returns:
      ``entries uint32[capacity, B]``: entry ``q``'s full-table length (low 4 bits, from the low word of
      block ``q`` of stream ``_ENTRIES``) and its 28-bit slot word (the top 28 bits of the high word);
      ``misc uint32[B]``: the budget, with the shift in the top bit.
    """
    lo, hi = _blocks(k1, k2, _ENTRIES, capacity)
    entries = (hi & _U32(0xFFFFFFF0)) | _draw_lengths(lo, MAX_SPAN_LEN).astype(_U32)
    fraction, shift = _blocks(k1, k2, _MISC, 1)
    whole, thr = _budget_table(max_len)
    budget = jnp.asarray(whole)[lengths] + (fraction[0] < jnp.asarray(thr)[lengths])
    misc = budget.astype(_U32) | (shift[0] & _U32(1 << 31))
    return entries, misc


def _iid_chain(budget: Array, full: Array) -> Array:
    """``int32[B]``: ``n_iid | (left + 1) << 16`` after the reference's i.i.d. draws (while at least 10
    budget units remain, entry ``q`` takes ``full[q]``). ``left >= 10`` means ``capacity`` was too small."""
    left, n_iid = budget, jnp.zeros_like(budget)
    for length in full:
        iid = left >= MAX_SPAN_LEN
        left, n_iid = jnp.where(iid, left - length - 1, left), n_iid + iid
    return n_iid | (jnp.minimum(left, MAX_SPAN_LEN) + 1) << 16


# Tail draw k leaves at most 9 - k units, so its length fits in _TAIL_BITS[k] bits; with the number of
# draws (4 bits) and the final budget (1 bit) the whole tail packs into one int32 per row.
_TAIL_BITS = tuple(int(9 - k).bit_length() for k in range(_TAIL_DRAWS))
_TAIL_SHIFTS = tuple(int(x) for x in np.cumsum((5,) + _TAIL_BITS[:-1]))


def _tail_draws(k1: Array, k2: Array, left: Array) -> Array:
    """The at most 9 draws once fewer than 10 budget units remain, each truncated at what is left.

    Args:
      k1, k2: row keys (draw ``k`` uses word ``k % 2`` of block ``k // 2`` of stream ``_TAIL``).
      left: ``int32[B]`` budget left after the i.i.d. draws (0..9).

    Returns:
      ``int32[B]``: ``n_tail | (left_final + 1) << 4 | length_k << _TAIL_SHIFTS[k]`` (one element per
      row, so that XLA runs the chain once): ``n_tail`` draws were made, ``left_final`` is 0 or -1.
    """
    packed = jnp.zeros_like(left)
    words = jnp.stack(_blocks(k1, k2, _TAIL, (_TAIL_DRAWS + 1) // 2), axis=1).reshape(-1, left.shape[0])
    for k, u in enumerate(words[:_TAIL_DRAWS]):
        length = _draw_lengths(u, 1)
        for cap in range(2, _TAIL_DRAWS - k + 1):  # draw k has at most 9 - k units left
            length = jnp.where(left == cap, _draw_lengths(u, cap), length)
        active = left > 0
        packed = packed + active + (jnp.where(active, length, 0) << _TAIL_SHIFTS[k])
        left = left - jnp.where(active, length + 1, 0)
    return packed | (left + 1) << 4


def _exact_slots(k1: Array, k2: Array, words: Array, bound: Array, small: bool) -> Array:
    """``floor(u * bound / 2**28)`` for the 28-bit slot words ``u = words >> 4``, with Lemire's rejection
    step: an entry whose remainder is below ``2**28 mod bound`` is redrawn from the (32-bit) low word of
    its block of stream ``_SLOTS``, then ``_SLOTS + 1``, ..., so the result is exactly uniform."""
    hi, lo = _mul_wide(words, bound, small)
    reject = (lo >> 4) < _U32(1 << 28) % bound

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


def _draw(k1: Array, k2: Array, lengths: Array, max_len: int, capacity: int):
    """Packed masks for one tile: ``(masked uint32[Wm, T], inserted uint32[Wi, T], fits bool[T])``."""
    one = (k1[0] >> 31).astype(jnp.int32) | 1  # a traced 1
    entries, misc = _materialised(
        one, functools.partial(_row_words, max_len=max_len, capacity=capacity), k1, k2, lengths
    )
    budget = (misc & _U32(0x7FFFFFFF)).astype(jnp.int32)
    shift = (misc >> 31).astype(jnp.int32)
    full = (entries & 0xF).astype(jnp.int32)
    chain = _materialised(one, _iid_chain, budget, full)
    n_iid, left = chain & 0xFFFF, (chain >> 16) - 1
    fits = left < MAX_SPAN_LEN
    tail = _materialised(one, _tail_draws, k1, k2, jnp.where(fits, left, 0))
    count = n_iid + (tail & 15)
    left = ((tail >> 4) & 1) - 1

    q = jnp.arange(capacity + _CHUNK)[:, None]  # _CHUNK spare rows for the loops' extra steps
    entries, full = jnp.pad(entries, ((0, _CHUNK), (0, 0))), jnp.pad(full, ((0, _CHUNK), (0, 0)))
    real = q < count
    k = q - n_iid  # index among the tail draws
    span = jnp.where(k < 0, full, 0)
    for i, (bits, at) in enumerate(zip(_TAIL_BITS, _TAIL_SHIFTS)):
        span = jnp.where(k == i, (tail >> at) & ((1 << bits) - 1), span)
    span = _materialised(one, lambda x: x, jnp.where(real, span, 0).astype(jnp.int8))
    slots = lengths - budget + left + 1  # P = L - S - n + 1 >= n for every L >= 2
    bound = jnp.where(real, slots - q, 1).astype(_U32)
    small = max_len < (1 << 16) - 1
    slot_words = entries & _U32(0xFFFFFFF0)
    hi, lo = _mul_wide(slot_words, bound, small)
    suspect = (lo >> 4) < bound
    hi = lax.cond(jnp.any(suspect & real), lambda: _exact_slots(k1, k2, slot_words, bound, small), lambda: hi)
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
            return _threefry2x32(data[0], data[1], jnp.zeros_like(rows), rows)
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


@functools.partial(jax.jit, static_argnums=(2, 3))
def _sample(key: KeyLike, lengths: Array, max_len: int, capacity: int) -> tuple[Array, Array]:
    """:func:`span_mask` on checked ``int32`` lengths, with ``capacity`` span entries in the fast branch.

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
    full = _capacities(max_len)[1]
    fast = min(capacity, full)

    def one_tile(args):
        k1, k2, lengths = args
        masked, inserted, fits = _draw(k1, k2, lengths, max_len, fast)
        if fast < full:
            masked, inserted = lax.cond(
                jnp.all(fits), lambda: (masked, inserted), lambda: _draw(k1, k2, lengths, max_len, full)[:2]
            )
        return masked.T, inserted.T

    masked, inserted = lax.map(one_tile, (pad(k1), pad(k2), pad(lengths)))  # [tiles, tile, W]
    shape = batch_shape + (-1,)
    return _unpack(masked, rows, max_len).reshape(shape), _unpack(inserted, rows, max_len + 1).reshape(shape)
