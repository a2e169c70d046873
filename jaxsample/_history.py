"""Token histories: compaction of padded histories, shared by the penalties, n-gram, DRY and watermark processors.

A history is ``int32[*B, T]``, oldest first. An entry is a token iff ``0 <= id < V``: negative
entries are padding and ids outside the vocabulary (vLLM pads prompts with ``V``) are ignored
alike, wherever they sit.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math
from jaxsample._types import Array

#: Fill value for shifted histories: matches no token and no :func:`compact` sentinel.
NEVER = -(2**31)


def compact(history: Array, vocab_size: int) -> tuple[Array, Array]:
    """Moves the tokens of each row to the end, in order; fills the front with unique negatives.

    Args:
      history: ``int32[..., T]``.
      vocab_size: ``V``; entries outside ``[0, V)`` are dropped.

    Returns:
      ``(c int32[..., T], m int32[...])``: ``c[..., T-m:]`` are the row's ``m`` tokens oldest
      first and ``c[..., p] = -(p + 1)`` for ``p < T - m``. The sentinels are distinct from each
      other and from every token, so position-wise comparisons never match padding.
    """
    t = history.shape[-1]
    valid = _math.valid_ids(history, vocab_size)
    m = jnp.sum(valid, axis=-1, dtype=jnp.int32)
    dest = jnp.where(valid, t - m[..., None] + jnp.cumsum(valid, axis=-1, dtype=jnp.int32) - 1, t)
    sentinels = jnp.broadcast_to(-(1 + jnp.arange(t, dtype=jnp.int32)), history.shape)
    return _math.scatter(sentinels, dest, history, "set"), m
