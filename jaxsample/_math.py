"""Numerically safe building blocks over masked logits ``[..., V]``.

Conventions every sampler relies on:

* math runs in float32 (:func:`prepare` upcasts and maps NaN to ``-inf``; :func:`restore` casts back);
  the private cores of the samplers take NaN-free float32 and give NaN-free float32;
* a row with no finite logit (all ``-inf``) never produces NaN: its probabilities are all 0 and its
  log-probabilities all ``-inf``;
* ``+inf`` logits are tokens with certain probability: a row holding ``n`` of them gives each
  probability ``1/n`` and every other token 0.

Sharding/TPU: everything here is row-wise. :func:`if_any` is a batch-level ``lax.cond``: under
GSPMD its predicate is an all-reduce over the batch shards, and under ``vmap`` both branches run
(results are the same: callers guarantee that idle rows come out unchanged either way).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _validate
from jaxsample._types import COMPUTE_DTYPE, NEG_INF, Array


def clean(x: Array) -> Array:
    """``x`` with NaN mapped to ``-inf``."""
    return jnp.where(jnp.isnan(x), NEG_INF, x)


def prepare(logits, map_nan: bool = True) -> tuple[Array, jnp.dtype]:
    """Validates ``logits [..., V]``, upcasts to float32 and maps NaN to ``-inf`` (unless ``map_nan`` is
    False: for a core that does so inside its own pass rather than in a separate one, or that runs
    through :func:`nan_free`).

    The entry of every public function. Chain stages skip it: a :class:`jaxsample.Sampler` cleans
    its input once and calls the functions' NaN-free cores.

    Returns:
      ``(x, dtype)``: float32 logits and the input dtype for :func:`restore`.
    """
    _validate.check_logits(logits)
    logits = jnp.asarray(logits)
    x = logits.astype(COMPUTE_DTYPE)
    return (clean(x) if map_nan else x), logits.dtype


def nan_free(x: Array, core: Callable[[Array], Array]) -> Array:
    """``core(clean(x))`` for float32 ``x [..., V]`` from :func:`prepare` with ``map_nan=False``.

    A batch without NaN (``-inf`` from earlier filters included) runs ``core(x)``, the same
    computation, without writing the cleaned copy: on XLA:CPU a fresh ``[B, V]`` temporary costs
    more than the one read that decides. A batch-level ``lax.cond``: an all-reduce of one bool under
    GSPMD, both branches under ``vmap``.
    """
    return cond(jnp.any(jnp.isnan(x)), lambda: core(clean(x)), lambda: core(x))


def identity(x: Array) -> Array:
    """``x``: the ``read`` of a core whose input is already NaN-free (see :func:`jaxsample.samplers.top_p._cut`)."""
    return x


def nan_free_normalised(
    x: Array, core: Callable, statistics: Callable = lambda v, norm: norm, normaliser: Callable | None = None
) -> Array:
    """``core(v, statistics(v, normaliser(v)))`` with ``v = clean(x)``, for float32 ``x [..., V]``
    from :func:`prepare` with ``map_nan=False``, for a core that needs the normaliser anyway.
    ``normaliser``: :func:`shifted_normaliser` (the default) or a function whose tuple starts with its three outputs.

    A NaN logit makes its row's ``log_sum`` NaN (``exp`` and sums carry it, whatever the row maximum),
    so the normaliser over ``x`` itself decides: a batch without NaN runs ``core(x, ...)``, the same
    computation, without a separate NaN check over ``x`` (:func:`nan_free`'s, ~0.7 ``logsumexp``
    passes at ``B = 64, V = 131072`` on XLA:CPU). ``statistics`` (further row reductions) runs before
    the batch-level ``lax.cond``, as the normaliser does: reductions inside a branch measured ~1 pass
    slower on XLA:CPU.
    """
    def stats(v):
        norm = (normaliser or shifted_normaliser)(v)
        return norm[2], statistics(v, norm)

    log_sum, s = stats(x)
    return cond(jnp.any(jnp.isnan(log_sum)), lambda: core(clean(x), stats(clean(x))[1]), lambda: core(x, s))


def normalised_filter(x: Array, on: Array, core: Callable, statistics: Callable, normaliser: Callable | None = None) -> Array:
    """A public filter that needs the normaliser: :func:`nan_free_normalised` ``(x, core, statistics,
    normaliser)`` if any row is ``on`` (``bool[...]``), else ``x`` NaN-mapped (:func:`nan_free`), skipping
    the statistics of an all-off batch. ``core`` must leave rows that are not ``on`` unchanged."""
    return if_any(on, lambda: nan_free_normalised(x, core, statistics, normaliser), lambda: nan_free(x, identity))


def restore(x: Array, dtype) -> Array:
    """Casts float32 results back to the caller's dtype (``bfloat16`` in gives ``bfloat16`` out)."""
    return x.astype(dtype)


def nan_to(value: Array, off: float) -> Array:
    """A traced parameter ``[*B]`` with NaN replaced by ``off``: the documented meaning of a NaN value."""
    return jnp.where(jnp.isnan(value), off, value)


def keep(x: Array, mask: Array) -> Array:
    """``x`` where ``mask`` else ``-inf``: the only way filters remove tokens."""
    return jnp.where(mask, x, NEG_INF)


def nonempty(out: Array, x: Array) -> Array:
    """``out`` with rows that lost every finite logit (while ``x`` had one) replaced by ``x``'s first maximum.

    Guards rescaling transforms against extreme parameters (a temperature of ``3e38`` or ``1e-38``,
    infinite penalties): the row keeps the token that was most probable before the transform,
    the nearest meaningful value, instead of ending with no finite logit. ``out``, ``x``: ``[..., V]``.
    """
    lost = ~has_finite(out) & has_finite(x)
    return jnp.where(lost[..., None], keep(x, first_max_mask(x)), out)


def has_finite(x: Array) -> Array:
    """``bool[...]``: whether a row has at least one token that can still be sampled."""
    return jnp.any(x > NEG_INF, axis=-1)


def row_max(x: Array) -> Array:
    """``float32[..., 1]``: the row maximum (``-inf`` for empty rows)."""
    return jnp.max(x, axis=-1, keepdims=True)


def shifted_normaliser(x: Array, m: Array | None = None) -> tuple[Array, Array, Array]:
    """``(m, shift, log_sum)``, each ``float32[..., 1]``: the row maximum (``m`` if the caller has it,
    e.g. the first of :func:`jaxsample._candidates.top`), that maximum where finite (else 0), and
    ``log(sum(exp(x - shift)))``. A finite logit's log-probability is ``(x - shift) - log_sum``
    exactly as :func:`log_softmax` computes it."""
    m = row_max(x) if m is None else m
    shift = jnp.where(jnp.isfinite(m), m, 0.0)
    return m, shift, jnp.log(row_sum(jnp.exp(x - shift), keepdims=True))


def log_probs(x: Array, m: Array | None = None) -> Callable[[Array], Array]:
    """The log-softmax of ``x [..., V]`` as an elementwise map: ``f(x)`` is :func:`log_softmax` ``(x)``
    bit for bit, ``f(x[..., ids])`` the same entries of it. For passes that recompute
    log-probabilities from ``x`` where they are used instead of reading a stored copy.
    ``m [..., 1]``: the row maximum if the caller has it."""
    return log_probs_entropy(x, m)[0]


def log_probs_entropy(x: Array, m: Array | None = None) -> tuple[Callable[[Array], Array], Array]:
    """``(f, H)``: :func:`log_probs` ``(x, m)`` and the Shannon entropy ``[..., 1]`` of ``softmax(x)``
    (:func:`entropy_sum` where the normaliser is finite, ``log n`` for rows of ``n`` logits of ``+inf``,
    0 for empty rows): the same entropy as :func:`entropy` of ``f(x)`` up to rounding, without
    forming log-probabilities."""
    m, shift, log_sum = shifted_normaliser(x, m)

    def certain():  # rows holding n > 0 logits of +inf: log(1 / n) for those, -inf for the rest
        n = jnp.sum(x == jnp.inf, axis=-1, keepdims=True, dtype=x.dtype)
        return jnp.where(n > 0, -jnp.log(n), jnp.inf)

    lp_inf = if_any(m == jnp.inf, certain, lambda: jnp.full(m.shape, jnp.inf, x.dtype))  # +inf: no such row

    def f(v):
        out = jnp.where(v > NEG_INF, (v - shift) - log_sum, NEG_INF)
        return jnp.where(lp_inf < jnp.inf, jnp.where(v == jnp.inf, lp_inf, NEG_INF), out)

    h = jnp.where(lp_inf < jnp.inf, -lp_inf, jnp.where(log_sum > NEG_INF, entropy_sum(x, m, log_sum), 0.0))
    return f, h


def entropy_sum(x: Array, m: Array, log_sum: Array) -> Array:
    """``float32[..., 1]``: the Shannon entropy of ``softmax(x)`` from :func:`shifted_normaliser`'s ``m``
    and ``log_sum``, valid where ``log_sum`` is finite (NaN or anything elsewhere).

    ``H = log S - sum(e d) / S`` with ``d = max(x - m, -150)``, ``e = exp(d)``: one reduction of pure
    arithmetic over ``x`` (the clamp makes ``e d`` exactly 0 wherever ``exp`` underflows, ``-inf`` logits
    included) through :func:`row_sum`.
    """
    d = jnp.maximum(x - m, -150.0)
    return log_sum - row_sum(jnp.exp(d) * d, keepdims=True) * jnp.exp(-log_sum)


def probit(q: Array) -> Array:
    """The standard normal quantile of ``q`` in ``(0, 1)``, as ``sqrt(2) erfinv(2 q - 1)``.

    One XLA op (``jax.scipy.special.ndtri`` expands into ~150, which each unrolled step of a search
    repeats: typical's program was 4.4 MB of HLO and compiled in 26 s); about ``3e-3`` absolute off
    ``ndtri`` in the far tails (the cancellation in ``2 q - 1``), enough for the searches' guesses.
    """
    return jnp.sqrt(jnp.float32(2.0)) * lax.erf_inv(2.0 * q - 1.0)


def order_bits(x: Array) -> Array:
    """``int32``: an order-preserving image of float32 ``x`` (``-0.0`` just below ``0.0``), its own
    inverse (:func:`from_order_bits`): negative floats have their magnitude bits flipped."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))


def from_order_bits(k: Array) -> Array:
    """float32 ``x`` with ``order_bits(x) == k``."""
    return lax.bitcast_convert_type(k ^ ((k >> 31) & jnp.int32(0x7FFFFFFF)), jnp.float32)


def log_softmax(x: Array) -> Array:
    """Log-probabilities ``[..., V]`` that stay NaN-free for empty rows and ``+inf`` logits."""
    return log_probs(x)(x)


def softmax(x: Array) -> Array:
    """Probabilities ``[..., V]`` with the conventions of :func:`log_softmax`."""
    return jnp.exp(log_softmax(x))


def entropy(logp: Array) -> tuple[Array, Array]:
    """``(probs [..., V], H [..., 1])``: probabilities and Shannon entropy (nats) of log-probabilities ``logp``.

    Tokens of probability 0 contribute nothing (no ``0 * -inf``).
    """
    probs = jnp.exp(logp)
    return probs, -row_sum(jnp.where(probs > 0, probs * logp, 0.0), keepdims=True)


def logsumexp(x: Array, m: Array | None = None) -> Array:
    """``float32[..., 1]`` log-normaliser (``-inf`` for empty rows, ``+inf`` with ``+inf`` logits);
    ``m [..., 1]``: the row maximum if the caller has it."""
    m, shift, log_sum = shifted_normaliser(x, m)
    return jnp.where(jnp.isfinite(m), shift + log_sum, m)


def masked_sum_count(w: Array, mask: Array) -> tuple[Array, Array]:
    """``(sum(w where mask), count(mask))`` over the last axis of ``w float32[..., V]``, ``mask bool[..., V]``.

    One variadic reduction (a float and an int32 output), which XLA:CPU emits as its own loop with
    the producers fused, where a lone float sum goes to YNNPACK, which first writes the summand
    ``[..., V]`` out: ~0.4 against ~0.8 (a plain sum) to ~2.2 (a masked one) ``logsumexp`` passes at
    ``B = 64, V = 131072``. The row is summed in blocks of 64, the block sums again in blocks of 64,
    and so on (a remainder of ``n mod 64`` entries as one more block), every level by the same
    reduction: the loop's order is XLA's choice (at opt level 0 a sequential scalar loop, whose error
    over 10^5 terms reached 1e-5), and YNNPACK's order changes with the batch size. Its rounding
    differs from ``jnp.sum``'s: searches that must agree on a mass use this one everywhere (and use
    the count, or XLA reduces the float alone again).
    """
    return _blocked_sum((jnp.where(mask, w, 0.0), mask.astype(jnp.int32)))


def _blocked_sum(ops: tuple[Array, Array], block: int = 64) -> tuple[Array, Array]:
    """:func:`masked_sum_count` of its two summands ``(float32[..., n], int32[..., n])``."""

    def reduce(parts, axis):
        return lax.reduce(parts, (jnp.float32(0.0), jnp.int32(0)), lambda a, b: (a[0] + b[0], a[1] + b[1]), (axis,))

    n, last = ops[0].shape[-1], ops[0].ndim - 1
    if n < 2 * block:
        return reduce(ops, last)
    head = n - n % block
    total = _blocked_sum(reduce(tuple(o[..., :head].reshape(o.shape[:-1] + (head // block, block)) for o in ops), last + 1))
    if head == n:
        return total
    tail = reduce(tuple(o[..., head:] for o in ops), last)
    return total[0] + tail[0], total[1] + tail[1]


def row_sum(w: Array, keepdims: bool = False) -> Array:
    """``jnp.sum(w, axis=-1)`` for ``w float32[..., V]`` through :func:`masked_sum_count` (nonzero
    entries counted): ~0.4 ``logsumexp`` passes where ``jnp.sum`` of a fused expression costs ~0.8 on
    XLA:CPU. The select on the count is what keeps it: XLA drops an unused count and sums the float
    alone again. Rounds as :func:`masked_sum_count`, not as ``jnp.sum``."""
    total, n = masked_sum_count(w, w != 0.0)
    out = jnp.where(n > 0, total, jnp.zeros_like(total))
    return out[..., None] if keepdims else out


def row_count(mask: Array, keepdims: bool = False) -> Array:
    """``int32``: the true entries of ``mask bool[..., V]`` over its last axis, through
    :func:`masked_sum_count` (a float sum of ones, exact below 2**24, beside the count): ~0.4
    ``logsumexp`` passes where ``jnp.sum`` of a mask costs ~2 on XLA:CPU. The select on the float
    keeps both outputs (XLA drops an unused one and counts alone again)."""
    ones, n = masked_sum_count(jnp.ones(mask.shape, jnp.float32), mask)
    out = jnp.where(ones > 0, n, 0)
    return out[..., None] if keepdims else out


def cond(pred: Array, true_fn: Callable, false_fn: Callable, *operands):
    """``lax.cond``, except that a concrete ``pred`` (an eager call, outside ``jit``) runs its branch
    directly: ``lax.cond`` would compile both branches again on every eager call, since each call
    builds new branch functions."""
    if not isinstance(pred, jax.core.Tracer):
        return true_fn(*operands) if bool(pred) else false_fn(*operands)
    return lax.cond(pred, true_fn, false_fn, *operands)


def if_any(on: Array, compute: Callable[[], Array], otherwise: Callable[[], Array]) -> Array:
    """``compute()`` if any row is ``on``, else ``otherwise()``: a batch-level skip of idle work.

    Rows stay independent of their batch only if ``compute()`` equals ``otherwise()`` in every row
    that is not ``on`` (e.g. a filter whose parameter is "off" there, and ``otherwise`` the input).
    """
    return cond(jnp.any(on), compute, otherwise)


def valid_ids(ids: Array, vocab_size: int) -> Array:
    """``bool[..., n]``: entries that are real token ids (``0 <= id < V``; not padding, not out of range)."""
    return (ids >= 0) & (ids < vocab_size)


def scatter(target: Array, ids: Array, values: Array, op: str = "add") -> Array:
    """Scatters ``values [..., K]`` into ``target [..., N]`` at ``ids [..., K]`` per row.

    Ids outside ``[0, N)`` are dropped (callers map unwanted entries to ``N``).
    ``op`` is ``"add"``, ``"max"`` or ``"set"`` (``"set"`` needs distinct ids per row).
    """
    n, k = target.shape[-1], ids.shape[-1]
    if n == 0 or k == 0:
        return target
    ids = jnp.where(valid_ids(ids, n), ids, n)
    lead = target.shape[:-1]
    rows = math.prod(lead)
    flat = target.reshape(rows, n)
    flat_ids = jnp.broadcast_to(ids, lead + (k,)).reshape(rows, k)
    flat_vals = jnp.broadcast_to(values, lead + (k,)).reshape(rows, k)
    rows = jnp.arange(rows)[:, None]
    ref = flat.at[rows, flat_ids]
    out = {"add": ref.add, "max": ref.max, "set": ref.set}[op](flat_vals, mode="drop")
    return out.reshape(target.shape)


def chunks(x: Array, size: int, fill: float = NEG_INF) -> Array:
    """``[..., V] -> [..., ceil(V / size), size]`` (the tail padded with ``fill``): rows cut into chunks."""
    v = x.shape[-1]
    n = -(-v // size)
    if n * size != v:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n * size - v)], constant_values=fill)
    return x.reshape(x.shape[:-1] + (n, size))


def argmax(x: Array) -> Array:
    """``int32[...]``: index of the first maximal entry of each NaN-free row, as ``jnp.argmax``.

    ``jnp.argmax`` is a (value, index) reduction that XLA:CPU runs as a scalar loop (about 40x the
    cost of ``max`` at ``V = 32000``). On CPU it is therefore a ``max`` over chunks of ``~sqrt(V)``
    entries, the first chunk holding the row maximum, and the first maximum inside that chunk: one
    vectorised pass plus two reductions over ``~sqrt(V)`` entries. GPU and TPU run ``jnp.argmax``
    (one fused reduction there, 0.8 ``logsumexp`` passes against 1.0 on an H100). The same index
    either way. (XLA's ``max`` need not propagate NaN, so NaN must be mapped first, as
    :func:`prepare` does.)
    """
    v = x.shape[-1]
    size = 1 << max(0, (math.isqrt(v) - 1).bit_length())  # power of two >= sqrt(V)
    if v <= 2 * size:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    return lax.platform_dependent(
        x, cpu=functools.partial(_chunked_argmax, size=size), default=lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32)
    )


def _chunked_argmax(x: Array, size: int) -> Array:
    """:func:`argmax` on CPU: the first chunk of ``size`` entries holding the row maximum, then inside it."""
    xc = chunks(x, size)
    chunk = jnp.argmax(jnp.max(xc, axis=-1), axis=-1)
    block = jnp.take_along_axis(xc, chunk[..., None, None], axis=-2)[..., 0, :]
    return (chunk * size + jnp.argmax(block, axis=-1)).astype(jnp.int32)


def first_max_mask(x: Array) -> Array:
    """``bool[..., V]`` selecting only the first maximal logit of each row."""
    return jnp.arange(x.shape[-1]) == argmax(x)[..., None]
