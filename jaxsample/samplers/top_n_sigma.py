"""Top-n-sigma: keep ``logit >= max - n * std`` (llama.cpp ``top_n_sigma``, arXiv 2411.07641).

Sharding/TPU: rows are independent; shard the batch axis. Three reductions over the vocabulary
(max, mean, std); skipping off batches, and taking the mask-free program when every logit of the
batch is finite, are batch-level ``lax.cond`` s (an all-reduce of one bool under GSPMD; both
branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from jaxsample import _fastpath, _math, _validate
from jaxsample._types import Array, Float
from jaxsample.chain import Param, Stage


def _pow2(k: Array) -> Array:
    """``float32`` ``2**k`` for integer ``|k| <= 126``, exactly (its bit pattern)."""
    return lax.bitcast_convert_type((k.astype(jnp.int32) + 127) << 23, jnp.float32)


def _top_n_sigma(x: Array, n: Array, clean: bool = False) -> Array:
    """The core on float32 ``x [*B, V]`` and ``n float32[*B]``; ``x`` is NaN-free unless ``clean``
    (then NaN counts as ``-inf`` here, in the passes that read ``x`` anyway)."""
    n = _math.nan_to(n, 0.0)[..., None]
    cleaned = lambda: _math.clean(x) if clean else x  # noqa: E731

    def apply():
        # Moments of the distances to the row maximum: small numbers, so the float32 sums carry few
        # rounding errors and the result hardly depends on the summation order, which on XLA:CPU
        # changes with the batch size (rows of 1 + {0..3} ulp kept different tokens alone and in a
        # batch when the moments were taken of the logits themselves). Rows whose maximum lies beyond
        # 2**60 take them in units of 2**k (exact: powers of two commute with rounding), so that no
        # sum or square overflows (near 1e37 the sums went to +-inf or NaN by summation order).
        top = _math.row_max(x)
        total = _math.row_sum(_distances(x, top)[0], keepdims=True)

        def dense():
            # Every logit is finite (a sum with an inf or NaN term is not), so the masks of the
            # general case are all true, count = V, and the maximum passes: the same bits without
            # masked copies of the row and without the empty-row guard.
            d, k = _distances(x, top)
            mean = total / x.shape[-1]
            squares = _math.row_sum(jnp.square(d - mean), keepdims=True)
            return _within(x, top, _std(squares, x.shape[-1], k), n)

        def general():
            y = cleaned()
            finite = jnp.isfinite(y)
            count = jnp.maximum(_math.row_count(finite, keepdims=True).astype(jnp.float32), 1.0)
            y_top = _math.row_max(y) if clean else top
            y_d, y_k = _distances(y, y_top)
            y_d = jnp.where(finite, y_d, 0.0)
            mean = _math.row_sum(y_d, keepdims=True) / count
            squares = _math.row_sum(jnp.where(finite, jnp.square(y_d - mean), 0.0), keepdims=True)
            return _math.nonempty(_within(y, y_top, _std(squares, count, y_k), n), y)

        return _math.cond(jnp.all(jnp.isfinite(total)), dense, general)

    return _math.if_any(n > 0, apply, cleaned)


def _distances(x: Array, top: Array) -> tuple[Array, Array]:
    """``(x - top) / 2**k`` for finite ``x`` (``[*B, V]``) and ``k [*B, 1]``: 0 unless the row maximum
    ``top [*B, 1]`` lies beyond ``2**60``."""
    shift = jnp.where(jnp.isfinite(top), top, 0.0)
    _, e = jnp.frexp(shift)
    k = jnp.where(e > 60, e - 20, 0)
    scale = _pow2(-k)
    # The row factors are formed once, not per entry (XLA would fuse the bit cast of 2**-k into the
    # pass over the row, which then no longer fuses into the sums that read it).
    scale, offset = lax.optimization_barrier((scale, shift * scale))
    return x * scale - offset, k


def _std(squares: Array, count, k: Array) -> Array:
    """The standard deviation from the sum of squared deviations ``[*B, 1]`` over ``count`` logits."""
    return jnp.sqrt(squares / count) * _pow2(k)


def _within(x: Array, top: Array, std: Array, n: Array) -> Array:
    """``x`` where ``x >= top - n * std`` (all of it where ``n <= 0``), else ``-inf``."""
    # std == 0 (one finite logit, or all equal) keeps the maxima even for n = inf (no inf * 0)
    margin = jnp.where((n > 0) & (std > 0), n * std, 0.0)
    return _math.keep(x, (n <= 0) | (x >= top - margin))


def top_n_sigma(logits: Float["*B V"], n: Float["*B"] | float) -> Float["*B V"]:
    """Keeps ``logit >= max - n * std`` (llama.cpp ``top_n_sigma``, arXiv 2411.07641).

    ``std`` is the population standard deviation of the finite logits. Rows with at most one
    finite logit are unchanged in effect (the maximum always passes).

    Args:
      logits: ``[..., V]``.
      n: scalar or ``[...]``; ``n <= 0`` is off (a no-op since llama.cpp PR #13345).

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    >>> (top_n_sigma(x, 1.0) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    x, dtype = _math.prepare(logits, map_nan=False)
    return _math.restore(_top_n_sigma(x, _validate.param(n, x.shape[:-1], "n (top_n_sigma)"), clean=True), dtype)


@dataclasses.dataclass(frozen=True)
class TopNSigma(Stage, _fastpath.CandidateForm):
    """:func:`top_n_sigma` reading ``top_n_sigma`` (``<= 0`` off); on candidates only when off."""

    default: float = dataclasses.field(default=-1.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "top_n_sigma"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("top_n_sigma", self.default),)

    def update(self, x, state, params, info):
        return _top_n_sigma(x, params["top_n_sigma"]), state

    def candidate_rows(self, params):
        return ~(params["top_n_sigma"] > 0)

    def on_candidates(self, c, state, params, info):
        return c, state
