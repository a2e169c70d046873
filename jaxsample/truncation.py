"""Rank- and mass-based truncation: top-k, top-p, min-p, locally typical, top-n-sigma, top-H.

Every filter only selects: kept logits are returned unchanged, removed ones become ``-inf``, and no
full sort over the vocabulary is performed (see :mod:`jaxsample._threshold`). Tokens tied with a
cut-off are kept, except in ``top_k(..., exact=True)``. A row keeps at least ``max(1, min_keep)``
tokens in the filter's own order; rows that arrive entirely ``-inf`` come out unchanged. ``+inf``
logits are certain tokens (probability ``1/n`` each, every other token 0), so the probability-based
filters keep them and, beyond ``min_keep``, nothing else.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _candidates, _math, _threshold, _validate
from jaxsample._types import Array, ArrayLike

_K = _candidates.DEFAULT_CANDIDATES


def _probability(value, batch, name: str) -> Array:
    """A probability-like parameter: ``ValueError`` below 0 when concrete, clamped to ``>= 0`` when traced."""
    return jnp.maximum(_validate.param(value, batch, name, lo=0.0), 0.0)


def _min_count(min_keep, batch, fn: str) -> Array:
    """``int32[...]`` ``max(1, min_keep)``; ``min_keep`` must be a non-negative integer."""
    return jnp.maximum(_validate.param(min_keep, batch, f"min_keep ({fn})", dtype=jnp.int32, lo=0), 1)


def _candidate_probs(vals: Array, lse: Array) -> Array:
    """Probabilities of candidate logits ``[..., K]`` given the row's log-normaliser ``[..., 1]``.

    In a row holding ``+inf`` logits each of them gets weight 1 (the first one alone reaches any
    target ``<= 1``, and every ``+inf`` token is tied at the cut-off), all others 0.
    """
    certain = jnp.isposinf(lse)
    probs = jnp.exp(vals - jnp.where(jnp.isfinite(lse), lse, 0.0))  # empty rows: exp(-inf) = 0
    return jnp.where(certain, (vals == jnp.inf).astype(jnp.float32), probs)


def _log_normaliser(x: Array, top: tuple[Array, Array]) -> Array:
    """``float32[..., 1]`` logsumexp of each row, over its candidates when they hold every finite logit.

    Summing the same candidate array in both places is what makes the candidate forms of the
    stages (:mod:`jaxsample._forms`) bit-identical to these functions.
    """
    complete = _candidates.complete(top[0], x.shape[-1])[..., None]
    dense = _math.if_any(~complete, lambda: _math.logsumexp(x), lambda: jnp.zeros(complete.shape))
    return jnp.where(complete, _math.logsumexp(top[0]), dense)


def _keep_top(x: Array, min_count: Array, candidates: int = _K, top=None) -> Array:
    """``bool[..., V]``: the ``min_count`` largest logits of each row, ties kept."""
    return x >= _threshold.kth_largest(x, min_count, candidates, top)[..., None]


def _top_k_keep(x: Array, k: Array, exact: bool, candidates: int, top) -> Array:
    """``bool[..., V]`` kept by :func:`top_k` (``k int32[...]``, ``top`` the row's candidates)."""
    off = (k <= 0) | (k >= x.shape[-1])
    kk = jnp.where(off, 1, k)
    keep = _threshold.first_k(x, kk, candidates, top) if exact else _keep_top(x, kk, candidates, top)
    return off[..., None] | keep


def _top_p_cut(x: Array, p: Array, min_count: Array, candidates: int, top) -> Array:
    """``float32[...]`` cut-off of :func:`top_p` (keep ``x >= t``; ``p`` clamped to ``>= 0``)."""
    lse = _log_normaliser(x, top)
    off = p >= 1
    t = _threshold.cutoff(
        x,
        weights=lambda: _candidate_probs(x, lse),
        weights_at=lambda vals, ids: _candidate_probs(vals, lse),
        target=jnp.where(off, 0.0, p),
        min_count=min_count,
        candidates=candidates,
        top=top,
        log_normaliser=lse,
    )
    return jnp.where(off, -jnp.inf, t)


def top_k(logits: ArrayLike, k: ArrayLike, *, exact: bool = False, candidates: int = _K) -> Array:
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
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    k = _validate.param(k, batch, "k (top_k)", dtype=jnp.int32)

    def apply():
        return _math.keep(x, _top_k_keep(x, k, exact, candidates, _candidates.top(x, candidates)))

    return _math.restore(_math.if_any((k > 0) & (k < vocab), apply, lambda: x), dtype)


def top_p(logits: ArrayLike, p: ArrayLike, min_keep: ArrayLike = 1, *, candidates: int = _K) -> Array:
    """Nucleus sampling: keeps the smallest set of most probable tokens whose probability sums to ``>= p``.

    The token that crosses ``p`` is kept, as are tokens tied with it; masses within
    :data:`jaxsample._threshold.MASS_RTOL` of ``p`` count as reaching it. This is llama.cpp ``top_p``
    (``cum >= p``) and, up to float rounding at the boundary, HF ``TopPLogitsWarper`` / vLLM
    (remove tokens whose ascending cumulative mass is ``<= 1 - p``). Probabilities are the softmax of
    the row as given (after any earlier filter, i.e. renormalised after top-k).

    Args:
      logits: ``[..., V]``.
      p: scalar or ``[...]``; ``p >= 1`` is off, ``p <= 0`` keeps the most probable token(s).
        ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens (integer ``>= 0``, scalar or ``[...]``).
      candidates: static size of the fast path; a row whose nucleus does not fit takes the exact
        bisection path.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    >>> (top_p(x, 0.7) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    p = _probability(p, batch, "p (top_p)")
    min_count = _min_count(min_keep, batch, "top_p")

    def apply():
        return _math.keep(x, x >= _top_p_cut(x, p, min_count, candidates, _candidates.top(x, candidates))[..., None])

    return _math.restore(_math.if_any(p < 1, apply, lambda: x), dtype)


def min_p(logits: ArrayLike, p: ArrayLike, min_keep: ArrayLike = 1) -> Array:
    """Keeps tokens with ``prob >= p * max_prob``, computed as ``logit >= max_logit + log(p)``.

    The logit form is llama.cpp's (inclusive keep); HF ``MinPLogitsWarper`` and vLLM compare
    probabilities, which selects the same set up to rounding. ``p > 1`` keeps only the
    ``max(1, min_keep)`` most probable tokens (llama.cpp).

    Args:
      logits: ``[..., V]``.
      p: scalar or ``[...]``; ``p <= 0`` is off. ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    >>> (min_p(x, 0.51) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    p = _probability(p, batch, "p (min_p)")
    off = (p <= 0)[..., None]
    min_count = _min_count(min_keep, batch, "min_p")

    def apply():
        above = x >= _math.row_max(x) + jnp.log(jnp.where(off, 1.0, p[..., None]))
        return _math.keep(x, off | above | _keep_top(x, min_count))

    return _math.restore(_math.if_any(~off, apply, lambda: x), dtype)


def typical(logits: ArrayLike, p: ArrayLike, min_keep: ArrayLike = 1, *, candidates: int = _K) -> Array:
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
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    p = _probability(p, batch, "p (typical)")
    off = p >= 1
    min_count = _min_count(min_keep, batch, "typical")

    def apply():
        logp = _math.log_softmax(x)
        probs, entropy = _math.entropy(logp)
        keys = -jnp.abs(logp + entropy)
        t = _threshold.cutoff(
            keys,
            weights=probs,
            target=jnp.where(off, 0.0, p),
            min_count=min_count,
            strict=True,
            candidates=candidates,
        )
        return _math.keep(x, off[..., None] | (keys >= t[..., None]))

    return _math.restore(_math.if_any(~off, apply, lambda: x), dtype)


def top_n_sigma(logits: ArrayLike, n: ArrayLike) -> Array:
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
    x, dtype = _math.prepare(logits)
    n = _validate.param(n, x.shape[:-1], "n (top_n_sigma)")[..., None]

    def apply():
        finite = jnp.isfinite(x)
        count = jnp.maximum(jnp.sum(finite, axis=-1, keepdims=True, dtype=jnp.float32), 1.0)
        mean = jnp.sum(jnp.where(finite, x, 0.0), axis=-1, keepdims=True) / count
        std = jnp.sqrt(jnp.sum(jnp.where(finite, jnp.square(x - mean), 0.0), axis=-1, keepdims=True) / count)
        # std == 0 (one finite logit, or all equal) keeps the maxima even for n = inf (no inf * 0)
        margin = jnp.where((n > 0) & (std > 0), n * std, 0.0)
        return _math.nonempty(_math.keep(x, (n <= 0) | (x >= _math.row_max(x) - margin)), x)

    return _math.restore(_math.if_any(n > 0, apply, lambda: x), dtype)


def top_h(logits: ArrayLike, top_h: ArrayLike, *, top_n: int = 100) -> Array:
    """Entropy-bounded truncation (HF ``TopHLogitsWarper``, transformers PR #40837).

    Among the ``top_n`` largest logits (100 in HF), with ``q`` their renormalised softmax and
    ``tau = top_h * H(q)``, keeps the longest prefix whose cumulative entropy ``sum -q_i log q_i`` is
    ``<= tau`` (the first token always); everything else is removed. Tokens tied with the last
    kept logit are kept; entropy sums within :data:`jaxsample._threshold.MASS_RTOL` of ``tau`` count
    as within budget.

    Args:
      logits: ``[..., V]``.
      top_h: scalar or ``[...]`` in ``[0, 1]``; ``0`` is off (HF's ``None``). ``ValueError`` if
        concretely outside ``[0, 1]``.
      top_n: static size of the candidate set the entropy is measured on.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    >>> (top_h(x, 0.7) > -jnp.inf).tolist()
    [True, True, False, False]
    """
    x, dtype = _math.prepare(logits)
    h = jnp.clip(_validate.param(top_h, x.shape[:-1], "top_h", lo=0.0, hi=1.0), 0.0, 1.0)
    vals, _ = _candidates.top(x, _validate.static_int(top_n, "top_n", lo=1))
    logq = _math.log_softmax(vals)
    q = jnp.exp(logq)
    cum = jnp.cumsum(jnp.where(q > 0, -q * logq, 0.0), axis=-1)
    within = cum <= (h * cum[..., -1])[..., None] * (1.0 + _threshold.MASS_RTOL)
    last = jnp.maximum(jnp.sum(within, axis=-1), 1) - 1
    t = jnp.take_along_axis(vals, last[..., None], axis=-1)
    keep = (h <= 0)[..., None] | (x >= t)
    return _math.restore(_math.keep(x, keep), dtype)
