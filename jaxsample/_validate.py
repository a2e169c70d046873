"""Parameter checking and broadcasting shared by every sampler function.

Every numeric parameter may be a Python number or an array broadcastable to the batch shape
``logits.shape[:-1]``. Concrete values (numbers, numpy arrays, non-traced jax arrays) are checked
eagerly and raise ``ValueError`` naming the parameter; traced values are left to the caller, which
clamps them to the nearest meaningful value inside the computation.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample._types import Array


def is_concrete(value: Any) -> bool:
    """True when ``value`` can be inspected on the host (not a tracer under ``jit``/``vmap``)."""
    return not isinstance(value, jax.core.Tracer)


def _describe(arr: np.ndarray) -> str:
    return repr(arr.item()) if arr.size == 1 else f"array of shape {arr.shape}"


def check_range(
    value: Any,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    integer: bool = False,
) -> None:
    """Raises ``ValueError`` naming ``name`` if a concrete ``value`` is outside the range.

    Bounds are inclusive unless ``lo_open`` / ``hi_open``. NaN is always rejected. Traced values
    pass unchecked.
    """
    if value is None or not is_concrete(value):
        return
    arr = host_array(value, name)
    if arr.size == 0:
        return
    if np.issubdtype(arr.dtype, np.floating):
        if np.isnan(arr).any():
            raise ValueError(f"{name} must not be NaN, got {_describe(arr)}")
        if integer and not np.all(np.isinf(arr) | (arr == np.round(arr))):
            raise ValueError(f"{name} must be an integer, got {_describe(arr)}")
    if lo is not None:
        bad = arr <= lo if lo_open else arr < lo
        if bad.any():
            op = ">" if lo_open else ">="
            raise ValueError(f"{name} must be {op} {lo}, got {_describe(arr[bad][:1])}")
    if hi is not None:
        bad = arr >= hi if hi_open else arr > hi
        if bad.any():
            op = "<" if hi_open else "<="
            raise ValueError(f"{name} must be {op} {hi}, got {_describe(arr[bad][:1])}")


def host_array(value: Any, name: str) -> np.ndarray:
    """A concrete numeric ``value`` as a numpy array; ``ValueError`` naming ``name`` otherwise.

    Rejects ``None``, strings, booleans, objects and Python ints too large for 64 bits (which
    numpy cannot hold) with a message instead of numpy's or JAX's ``TypeError``/``OverflowError``.
    """
    if value is None:
        raise ValueError(f"{name} must be a number or an array of numbers, got None")
    try:
        arr = np.asarray(value)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"{name} must be a number or an array of numbers, got {value!r}") from None
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got {value!r}" if arr.size == 1 else
                         f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def check_broadcast(
    shape: tuple[int, ...], target: tuple[int, ...], name: str, *, what: str = "shape",
    onto: str = "the batch shape", hint: str = " (logits.shape[:-1])",
) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``shape`` broadcasts to ``target``."""
    shape, target = tuple(shape), tuple(target)
    try:
        ok = np.broadcast_shapes(shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} has {what} {shape}, which does not broadcast to {onto} {target}{hint}")


def row_param(value: Any, batch_shape: tuple[int, ...], name: str, dtype=jnp.float32) -> Array:
    """Broadcasts a scalar or per-row parameter to ``batch_shape``.

    Args:
      value: Python number or array whose shape broadcasts to ``batch_shape``.
      batch_shape: ``logits.shape[:-1]``.
      name: parameter name used in error messages.
      dtype: dtype of the result (``float32`` or ``int32``).

    Returns:
      ``dtype[*batch_shape]``.

    Raises:
      ValueError: if the shape of ``value`` does not broadcast to ``batch_shape``.
    """
    check_broadcast(np.shape(value), batch_shape, name)
    if is_concrete(value) and not isinstance(value, jax.Array):
        # Host values are cast on the host: JAX would raise OverflowError for Python ints >= 2**31.
        arr = host_array(value, name)
        if jnp.issubdtype(dtype, jnp.integer):
            # Large or infinite "off" values (top_k=inf, top_k=2**40) saturate instead of wrapping.
            info = np.iinfo(np.dtype(dtype))
            if np.issubdtype(arr.dtype, np.floating):
                arr = np.nan_to_num(arr, nan=0.0, posinf=info.max, neginf=info.min)
            arr = np.clip(arr, info.min, info.max)
        return jnp.broadcast_to(jnp.asarray(arr.astype(np.dtype(dtype))), batch_shape)
    arr = jnp.asarray(value)
    if jnp.issubdtype(dtype, jnp.integer) and jnp.issubdtype(arr.dtype, jnp.floating):
        info = jnp.iinfo(dtype)
        arr = jnp.clip(jnp.nan_to_num(arr, nan=0.0), info.min, info.max)
    return jnp.broadcast_to(arr.astype(dtype), batch_shape)


def param(
    value: Any,
    batch_shape: tuple[int, ...],
    name: str,
    *,
    dtype=jnp.float32,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Array:
    """``check_range`` followed by ``row_param``: the one call every sampler makes per parameter."""
    check_range(
        value,
        name,
        lo=lo,
        hi=hi,
        lo_open=lo_open,
        hi_open=hi_open,
        integer=jnp.issubdtype(dtype, jnp.integer),
    )
    return row_param(value, batch_shape, name, dtype)


def probability(value: Any, batch_shape: tuple[int, ...], name: str) -> Array:
    """A probability-like parameter ``float32[*B]``: ``ValueError`` below 0 when concrete (traced: the
    sampler's core clamps it to ``>= 0``)."""
    return param(value, batch_shape, name, lo=0.0)


def min_keep(value: Any, batch_shape: tuple[int, ...], fn: str) -> Array:
    """``int32[*B]`` ``min_keep`` of filter ``fn``: a non-negative integer (traced: ``max(1, .)`` in the core)."""
    return param(value, batch_shape, f"min_keep ({fn})", dtype=jnp.int32, lo=0)


def row_lists(
    value: Any,
    batch_shape: tuple[int, ...],
    capacity: int,
    name: str,
    *,
    dtype=jnp.int32,
    fill: float | int = -1,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Array:
    """Per-row lists padded with ``fill`` to a static ``capacity``: ``dtype[*batch_shape, capacity]``.

    Args:
      value: one list for every row (``[7, 8]``), one list per row (``[[1], [], [2, 3]]``, ragged,
        ``prod(batch_shape)`` of them), or an array ``[..., n]`` broadcastable to the batch shape.
      batch_shape: the logits batch shape.
      capacity: static list length (``>=`` the longest list).
      name: parameter name used in error messages.
      dtype, fill: element dtype and padding value.
      lo, hi, lo_open, hi_open: range of the non-padding entries (see :func:`check_range`).

    Raises:
      ValueError: naming ``name`` when a list is longer than ``capacity``, the number of per-row
        lists does not match the batch, the shape does not broadcast, or an entry is out of range.

    >>> row_lists([[5], [1, 2]], (2,), 3, "ids").tolist()
    [[5, -1, -1], [1, 2, -1]]
    """
    batch_shape = tuple(batch_shape)
    if not is_concrete(value):
        arr = jnp.asarray(value, dtype)
        arr = arr.reshape(1) if arr.ndim == 0 else arr
        if arr.shape[-1] > capacity:
            raise ValueError(f"{name}: {arr.shape[-1]} entries, more than capacity={capacity}")
        arr = jnp.pad(arr, [(0, 0)] * (arr.ndim - 1) + [(0, capacity - arr.shape[-1])], constant_values=fill)
        return jnp.broadcast_to(arr, batch_shape + (capacity,))
    ragged = isinstance(value, (list, tuple)) and any(isinstance(r, (list, tuple, np.ndarray)) for r in value)
    if ragged:
        n = int(np.prod(batch_shape, dtype=np.int64))
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} per-row lists for a batch of {n} rows")
        longest = max((len(r) for r in value), default=0)
        if longest > capacity:
            raise ValueError(f"{name}: a row lists {longest} entries, more than capacity={capacity}")
        arr = np.full((n, capacity), fill, dtype)
        for i, row in enumerate(value):
            arr[i, : len(row)] = np.asarray(row, dtype)
        arr = arr.reshape(batch_shape + (capacity,))
    else:
        arr = np.asarray(value, dtype)
        arr = arr.reshape(1) if arr.ndim == 0 else arr
        if arr.shape[-1] > capacity:
            raise ValueError(f"{name}: {arr.shape[-1]} entries, more than capacity={capacity}")
        arr = np.pad(arr, [(0, 0)] * (arr.ndim - 1) + [(0, capacity - arr.shape[-1])], constant_values=fill)
        try:
            arr = np.broadcast_to(arr, batch_shape + (capacity,))
        except ValueError:
            raise ValueError(
                f"{name} has shape {arr.shape[:-1]}, which does not broadcast to the batch shape {batch_shape}"
            ) from None
    check_range(arr[arr != fill], name, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open)
    return jnp.asarray(arr)


def check_logits(logits: Any, name: str = "logits") -> None:
    """Raises ``ValueError`` unless ``logits`` is a floating array with a vocabulary axis."""
    shape = np.shape(logits)
    if len(shape) == 0:
        raise ValueError(f"{name} must have a vocabulary axis (shape [..., V]), got a scalar")
    if shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary axis (V == 0)")
    dtype = jnp.result_type(logits)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating array, got dtype {dtype}")


def check_tokens(tokens: Any, name: str, batch_shape: tuple[int, ...] | None = None) -> Array:
    """Validates an int array of token ids ``[..., T]`` (entries ``< 0`` are padding).

    The leading dimensions must broadcast to ``batch_shape`` when it is given; the result is
    broadcast to ``batch_shape + (T,)`` as ``int32``.
    """
    arr = jnp.asarray(tokens)
    if arr.ndim == 0:
        raise ValueError(f"{name} must have a trailing token axis (shape [..., T]), got a scalar")
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array of token ids, got dtype {arr.dtype}")
    arr = arr.astype(jnp.int32)
    if batch_shape is None:
        return arr
    check_broadcast(arr.shape[:-1], batch_shape, name, what="leading shape")
    return jnp.broadcast_to(arr, tuple(batch_shape) + arr.shape[-1:])


def static_int(value: Any, name: str, *, lo: int | None = None) -> int:
    """Validates a static (compile-time) integer such as a buffer size or n-gram order."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        else:
            raise ValueError(f"{name} must be a Python int (it fixes array shapes), got {value!r}")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return value


def static_sequences(sequences, name: str, unique: bool = True) -> tuple[tuple[int, ...], ...]:
    """Validates a static collection of token-id sequences into a tuple of int tuples.

    Repeated sequences raise when ``unique`` (their biases would be ambiguous), else are merged.
    """
    try:
        seqs = tuple(tuple(int(t) for t in s) for s in sequences)
    except TypeError as err:
        raise ValueError(
            f"{name} must be a static collection of token-id sequences (under jax.jit, pass it as a "
            f"static argument or close over it), got {sequences!r}"
        ) from err
    for s in seqs:
        if not s or min(s) < 0:
            raise ValueError(f"{name} must hold non-empty sequences of non-negative token ids, got {s!r}")
    if not unique:
        return tuple(dict.fromkeys(seqs))
    if len(set(seqs)) != len(seqs):
        dupes = sorted({s for s in seqs if seqs.count(s) > 1})
        raise ValueError(f"{name} holds repeated sequences: {dupes}")
    return seqs
