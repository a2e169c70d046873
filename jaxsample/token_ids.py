"""Token-id lists: per-row id arrays with ``-1`` padding, their masks, and the id parameters of stages.

Token-id lists are int arrays ``[..., n]`` (one list for all rows, or one per row) in which entries
``< 0`` are padding, so a list of any length fits a buffer of static capacity and changing its
contents never recompiles. The constraint and length processors (:mod:`jaxsample.constraints`,
:mod:`jaxsample.lengths`) read their lists through :func:`as_ids` and :func:`id_mask`; their stages
combine static ids (fixed when the stage is built, e.g. the model's EOS ids) with optional
per-row ids (:func:`ids_param`, :func:`row_ids`).

Sharding/TPU: masks are one scatter per row into ``[*B, V]``; shard the batch axis.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike, Bool, Int
from jaxsample.chain import Param


def as_ids(ids, batch_shape: tuple[int, ...], vocab_size: int, name: str) -> Array:
    """Validates a token-id list and broadcasts it to ``int32[*batch_shape, n]``.

    A Python int is a one-element list and an empty list is allowed. Concrete ids ``>= vocab_size``
    raise ``ValueError`` naming ``name``; traced ones are ignored like padding.
    """
    if _validate.is_concrete(ids):
        arr = np.asarray(ids)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.size == 0:
            arr = arr.astype(np.int32)
        if np.issubdtype(arr.dtype, np.integer) and arr.size and arr.max() >= vocab_size:
            raise ValueError(
                f"{name} must be token ids < vocab size {vocab_size} (negative = padding), got {arr.max()}"
            )
        ids = arr
    return _validate.check_tokens(ids, name, batch_shape)


def id_mask(ids: Array, vocab_size: int) -> Array:
    """``bool[*B, V]`` from already validated ids ``int32[*B, n]``."""
    return _math.scatter(jnp.zeros(ids.shape[:-1] + (vocab_size,), bool), ids, _math.valid_ids(ids, vocab_size), "max")


def token_mask(ids: Int["*B n"] | ArrayLike, vocab_size: int, batch_shape: tuple[int, ...] = ()) -> Bool["*B V"]:
    """``bool[*batch_shape, V]`` that is True at every id of the list.

    Args:
      ids: a Python int, a list, or ``int[..., n]`` whose leading axes broadcast to
        ``batch_shape``. Entries ``< 0`` are padding; repeated ids are fine.
      vocab_size: ``V``.
      batch_shape: the batch shape of the result.

    Raises:
      ValueError: if a concrete id is ``>= vocab_size`` (traced ones are ignored).

    >>> token_mask([3, -1, 0, 3], 5).tolist()
    [True, False, False, True, False]
    """
    vocab_size = _validate.static_int(vocab_size, "vocab_size", lo=1)
    return id_mask(as_ids(ids, tuple(batch_shape), vocab_size, "ids"), vocab_size)


# ------------------------------------------------------------------------------ id parameters of stages
def static_ids(ids, name: str) -> tuple[int, ...]:
    """A stage's static ids as a hashable tuple of non-negative ints."""
    ids = tuple(int(i) for i in np.asarray(ids, np.int64).reshape(-1))
    if any(i < 0 for i in ids):
        raise ValueError(f"{name} must be non-negative token ids, got {ids}")
    return ids


def ids_param(name: str, capacity: int) -> tuple[Param, ...]:
    """The per-row id list parameter ``f"{name}_ids"`` of a stage (none when ``capacity == 0``)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    return (Param(f"{name}_ids", -1, jnp.int32, lo=0, capacity=capacity),) if capacity else ()


def row_ids(params, name: str, static: tuple[int, ...], batch_shape: tuple[int, ...]) -> Array:
    """``int32[*B, n]``: a stage's static ids followed by its per-row ids (if declared)."""
    parts = [jnp.broadcast_to(jnp.asarray(static, jnp.int32).reshape(-1), batch_shape + (len(static),))]
    if f"{name}_ids" in params:
        parts.append(jnp.asarray(params[f"{name}_ids"], jnp.int32))
    return jnp.concatenate(parts, axis=-1)


def row_mask(params, name: str, static: tuple[int, ...], x: Array) -> Array:
    """``bool[*B, V]``: :func:`row_ids` of the stage ``name`` as a mask over the vocabulary of ``x``."""
    return id_mask(row_ids(params, name, static, x.shape[:-1]), x.shape[-1])
