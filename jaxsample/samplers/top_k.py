"""Top-k: keep the ``k`` largest logits of each row.

Ties with the ``k``-th value are kept (HF, vLLM); ``exact=True`` keeps exactly ``k`` tokens, ties
by lowest id (llama.cpp). The stage is an entry of the candidate fast path: after it, a row has at
most ``k`` finite logits.

Sharding/TPU: rows are independent; shard the batch axis. The candidates are one ``lax.top_k``
over the vocabulary (:func:`jaxsample._candidates.top`), which needs the vocabulary axis whole on
a device. A batch skips the filter when every row is off, and takes the exact bisection when some
row's ``k`` exceeds the candidates: batch-level ``lax.cond``s (an all-reduce of one bool under
GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _candidates, _fastpath, _math, _threshold, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES, Candidates
from jaxsample._types import Array, Float, Int
from jaxsample.chain import Param, Stage, static_int


def _off(x: Array, k: Array) -> Array:
    return (k <= 0) | (k >= x.shape[-1])


def _exact_keep(x: Array, k: Array, candidates: int, top) -> Array:
    """``bool[*B, V]`` kept by exact top-k of NaN-free ``x`` (``k int32[*B]``, ``top`` the row's candidates)."""
    off = _off(x, k)
    return off[..., None] | _threshold.first_k(x, jnp.where(off, 1, k), candidates, top)


def _top_k(x: Array, k: Array, exact: bool, candidates: int, read=_math.identity) -> Array:
    """The core on float32 ``x [*B, V]`` (NaN-free after ``read``, as in
    :func:`jaxsample.samplers.top_p._cut`) and ``k int32[*B]``."""
    off = _off(x, k)

    def apply():
        if exact:
            y = read(x)
            return _math.keep(y, _exact_keep(y, k, candidates, _candidates.top(y, candidates)))
        top = _candidates.top_of(x, candidates, read)
        t = jnp.where(off, -jnp.inf, _threshold.kth_largest(lambda: read(x), jnp.where(off, 1, k), candidates, top))
        return _math.keep(x, x >= t[..., None])  # NaN >= t is False: read(x), without writing it out

    return _math.if_any(~off, apply, lambda: read(x))


def top_k(
    logits: Float["*B V"], k: Int["*B"] | int, *, exact: bool = False, candidates: int = DEFAULT_CANDIDATES
) -> Float["*B V"]:
    """Keeps the ``k`` largest logits of each row.

    Tokens tied with the ``k``-th largest value are kept (HF ``TopKLogitsWarper``, vLLM), so a row may
    keep more than ``k``. With ``exact=True`` a row keeps exactly ``min(k, #finite)`` tokens, ties
    broken by the lowest id (llama.cpp ``top_k``, whose tie order is otherwise unspecified).

    Args:
      logits: ``[..., V]`` float32 or bfloat16.
      k: integer, scalar or ``[...]`` per row. ``k <= 0`` or ``k >= V`` is off (no-op).
      exact: static; keep exactly ``k`` tokens instead of keeping ties.
      candidates: static size of the sort-free fast path; rows with ``k`` above it take the exact
        bisection path.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> top_k(jnp.array([1.0, 3.0, 2.0, 3.0]), 1).tolist()
    [-inf, 3.0, -inf, 3.0]
    >>> top_k(jnp.array([1.0, 3.0, 2.0, 3.0]), 1, exact=True).tolist()
    [-inf, 3.0, -inf, -inf]
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, dtype = _math.prepare(logits, map_nan=False)
    k = _validate.param(k, x.shape[:-1], "k (top_k)", dtype=jnp.int32)
    return _math.restore(_top_k(x, k, exact, candidates, _math.clean), dtype)


@dataclasses.dataclass(frozen=True)
class TopK(Stage, _fastpath.CandidateEntry):
    """:func:`top_k` reading ``top_k`` (``<= 0`` off); ``exact=True`` is llama.cpp's exactly-k."""

    default: int = dataclasses.field(default=0, compare=False)
    _: dataclasses.KW_ONLY
    exact: bool = False
    candidates: int = static_int(DEFAULT_CANDIDATES)
    name: str = "top_k"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("top_k", self.default, jnp.int32),)

    @property
    def candidate_count(self) -> int:
        return self.candidates

    def update(self, x, state, params, info):
        return _top_k(x, params["top_k"], self.exact, self.candidates), state

    def enter_candidates(self, x, state, params, info):
        k = params["top_k"]
        off = _off(x, k)

        def filtered(top):
            if self.exact:  # canonical order lists ties by id: the first k candidates are llama.cpp's k
                return off[..., None] | (jnp.arange(top[0].shape[-1]) < k[..., None]), ()
            t = jnp.where(off, -jnp.inf, _threshold.kth_largest(x, jnp.where(off, 1, k), self.candidates, top))
            return top[0] >= t[..., None], t

        def dense(top, t):
            return _math.keep(x, _exact_keep(x, k, self.candidates, top) if self.exact else x >= t[..., None])

        return _fastpath.enter(x, ~off, self.candidates, filtered, dense)

    def on_candidates(self, c: Candidates, state, params, info):
        """Top-k of candidates (``k >= V`` keeps every candidate, as it should)."""
        k = params["top_k"]
        off = k <= 0
        if self.exact:
            return c.mask(off[..., None] | (jnp.arange(c.vals.shape[-1]) < k[..., None])), state
        t = _threshold.kth_candidate(c.vals, jnp.where(off, 1, k))
        return c.mask(off[..., None] | (c.vals >= t[..., None])), state
