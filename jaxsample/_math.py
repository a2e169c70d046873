"""Numerically safe building blocks over masked logits ``[..., V]``.

Conventions every sampler relies on:

* math runs in float32 (:func:`prepare` upcasts and maps NaN to ``-inf``; :func:`restore` casts back);
* a row with no finite logit (all ``-inf``) never produces NaN: its probabilities are all 0 and its
  log-probabilities all ``-inf``;
* ``+inf`` logits are tokens with certain probability: a row holding ``n`` of them gives each
  probability ``1/n`` and every other token 0.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _validate
from jaxsample._types import COMPUTE_DTYPE, NEG_INF, Array


def prepare(logits) -> tuple[Array, jnp.dtype]:
    """Validates ``logits [..., V]``, upcasts to float32 and maps NaN to ``-inf``.

    Returns:
      ``(x, dtype)``: float32 logits and the input dtype for :func:`restore`.
    """
    _validate.check_logits(logits)
    logits = jnp.asarray(logits)
    x = logits.astype(COMPUTE_DTYPE)
    return jnp.where(jnp.isnan(x), NEG_INF, x), logits.dtype


def restore(x: Array, dtype) -> Array:
    """Casts float32 results back to the caller's dtype (``bfloat16`` in gives ``bfloat16`` out)."""
    return x.astype(dtype)


def keep(x: Array, mask: Array) -> Array:
    """``x`` where ``mask`` else ``-inf``: the only way filters remove tokens."""
    return jnp.where(mask, x, NEG_INF)


def has_finite(x: Array) -> Array:
    """``bool[...]``: whether a row has at least one token that can still be sampled."""
    return jnp.any(x > NEG_INF, axis=-1)


def row_max(x: Array) -> Array:
    """``float32[..., 1]``: the row maximum (``-inf`` for empty rows)."""
    return jnp.max(x, axis=-1, keepdims=True)


def log_softmax(x: Array) -> Array:
    """Log-probabilities ``[..., V]`` that stay NaN-free for empty rows and ``+inf`` logits."""
    m = row_max(x)
    safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
    shifted = x - safe_m
    lse = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))
    out = jnp.where(x > NEG_INF, shifted - lse, NEG_INF)
    posinf = x == jnp.inf
    n_posinf = jnp.sum(posinf, axis=-1, keepdims=True)
    return jnp.where(n_posinf > 0, jnp.where(posinf, -jnp.log(n_posinf.astype(x.dtype)), NEG_INF), out)


def softmax(x: Array) -> Array:
    """Probabilities ``[..., V]`` with the conventions of :func:`log_softmax`."""
    return jnp.exp(log_softmax(x))


def logsumexp(x: Array) -> Array:
    """``float32[..., 1]`` log-normaliser (``-inf`` for empty rows, ``+inf`` with ``+inf`` logits)."""
    m = row_max(x)
    safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
    lse = safe_m + jnp.log(jnp.sum(jnp.exp(x - safe_m), axis=-1, keepdims=True))
    return jnp.where(jnp.isfinite(m), lse, m)


def first_max_mask(x: Array) -> Array:
    """``bool[..., V]`` selecting only the first maximal logit of each row."""
    idx = jnp.argmax(x, axis=-1)
    return jnp.arange(x.shape[-1]) == idx[..., None]
