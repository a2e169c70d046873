"""Selectors: turn processed logits into one token id per row."""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _candidates, _math, _noise, _validate
from jaxsample._types import Array, ArrayLike, KeyLike


def greedy(logits: ArrayLike) -> Array:
    """Index of the first maximal logit (ties go to the lowest id), ``int32[...]``.

    NaN counts as ``-inf``; a row with no finite logit returns 0.

    >>> import jax.numpy as jnp
    >>> int(greedy(jnp.array([0.1, 2.0, 2.0])))
    1
    """
    x, _ = _math.prepare(logits)
    return _math.argmax(x)


def gumbel_max(keys: Array, vals: Array, ids: Array) -> Array:
    """``int32[...]``: the id maximising ``vals + gumbel(id)`` over candidates ``[..., K]`` (ties: lowest id).

    This is ``argmax`` over the whole row as long as every finite logit is a candidate; a row with
    no finite candidate returns 0, like ``argmax`` of an all ``-inf`` row.
    """
    y = jnp.where(vals > -jnp.inf, vals + _noise.gumbel_at(keys, ids), -jnp.inf)
    best = jnp.max(y, axis=-1, keepdims=True)
    token = jnp.min(jnp.where(y == best, ids, jnp.iinfo(jnp.int32).max), axis=-1)
    return jnp.where(best[..., 0] > -jnp.inf, token, 0).astype(jnp.int32)


def certain(x: Array) -> Array:
    """Rows holding ``+inf`` logits sample uniformly among them: map those to 0, others to -inf."""
    posinf = _math.row_max(x) == jnp.inf
    return _math.if_any(posinf, lambda: jnp.where(posinf, jnp.where(x == jnp.inf, 0.0, -jnp.inf), x), lambda: x)


def categorical(key: KeyLike, logits: ArrayLike, *, candidates: int = _candidates.DEFAULT_CANDIDATES) -> Array:
    """One draw from ``softmax(logits)`` per row by the Gumbel-max trick, ``int32[...]``.

    The token is ``argmax(logits + G)`` with ``G`` the Gumbel noise of :mod:`jaxsample._noise`,
    which is addressed by token id. Rows with at most ``candidates`` finite logits (any row after
    top-k, most rows after top-p or min-p) draw noise for their candidates only; other rows draw it
    for the whole vocabulary. Both paths return the same token, so results do not depend on the
    batch. No sort is performed.

    Args:
      key: a single key, or one key per row (typed ``[...]`` or raw ``uint32[..., 2]``). With one
        key per row, a row's draw depends only on its key and its logits.
      logits: ``[..., V]``; NaN counts as ``-inf``.
      candidates: static size of the candidate fast path.

    Returns:
      ``int32[...]`` token ids. A row with no finite logit returns 0.

    >>> import jax, jax.numpy as jnp
    >>> int(categorical(jax.random.key(0), jnp.array([-jnp.inf, 0.0, -jnp.inf])))
    1
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits)
    x = certain(x)
    batch, vocab = x.shape[:-1], x.shape[-1]
    keys = _noise.row_keys(key, batch)
    k = min(candidates, vocab)
    vals, ids = _candidates.top(x, min(k + 1, vocab))
    covered = vals[..., -1] == -jnp.inf if k < vocab else jnp.ones(batch, bool)
    vals, ids = vals[..., :k], ids[..., :k]

    def fast():
        return gumbel_max(keys, vals, ids)

    def full():
        y = jnp.where(x > -jnp.inf, x + _noise.gumbel_all(keys, vocab), -jnp.inf)
        return _math.argmax(y)

    return _candidates.choose(covered, fast, full)
