"""Token-id sets as masks, and HuggingFace's numerical processors (``InfNanRemove``, ``LogitNormalization``).

Token-id lists are int arrays ``[..., n]`` (one list for all rows, or one per row) in which entries
``< 0`` are padding, so a list of any length fits a buffer of static capacity and changing its
contents never recompiles. The bias, whitelist, suppression and length processors of
:mod:`jaxsample.bias` and :mod:`jaxsample.lengths` all read their id lists through :func:`token_mask`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike


def _as_ids(ids, batch_shape: tuple[int, ...], vocab_size: int, name: str) -> Array:
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


def _check_broadcast(shape: tuple[int, ...], target: tuple[int, ...], name: str, what: str) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``shape`` broadcasts to ``target``."""
    try:
        ok = np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} has shape {tuple(shape)}, which does not broadcast to the {what} shape {tuple(target)}"
        )


def _mask(ids: Array, vocab_size: int) -> Array:
    """``bool[..., V]`` from already validated ids ``int32[..., n]``."""
    return _math.scatter(jnp.zeros(ids.shape[:-1] + (vocab_size,), bool), ids, _math.valid_ids(ids, vocab_size), "max")


def token_mask(ids: ArrayLike, vocab_size: int, batch_shape: tuple[int, ...] = ()) -> Array:
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
    return _mask(_as_ids(ids, tuple(batch_shape), vocab_size, "ids"), vocab_size)


def remove_inf_nan(logits: ArrayLike) -> Array:
    """HF ``InfNanRemoveLogitsProcessor``: NaN -> 0, ``+inf`` -> ``finfo.max``, ``-inf`` -> ``finfo.min``.

    ``finfo`` is that of the input dtype (``bfloat16`` in gives ``bfloat16`` limits). Unlike every
    other processor this one turns removed tokens into (very unlikely) finite ones: that is its job.

    Args:
      logits: ``[..., V]`` float32 or bfloat16.

    Returns:
      ``[..., V]`` finite logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> remove_inf_nan(jnp.array([jnp.nan, 1.0, jnp.inf, -jnp.inf])).tolist()
    [0.0, 1.0, 3.4028234663852886e+38, -3.4028234663852886e+38]
    """
    _validate.check_logits(logits)
    logits = jnp.asarray(logits)
    info = jnp.finfo(logits.dtype)
    x = logits.astype(jnp.float32)
    x = jnp.where(jnp.isnan(x), 0.0, x)
    x = jnp.where(x == jnp.inf, float(info.max), x)
    x = jnp.where(x == -jnp.inf, float(info.min), x)
    return x.astype(logits.dtype)


def log_softmax(logits: ArrayLike) -> Array:
    """HF ``LogitNormalization`` (``renormalize_logits=True``): ``log_softmax`` over the vocabulary.

    Removed tokens stay ``-inf``; an all ``-inf`` row stays all ``-inf`` (no NaN); ``n`` tokens at
    ``+inf`` each get ``-log n``.

    Args:
      logits: ``[..., V]`` float32 or bfloat16 (NaN counts as ``-inf``).

    Returns:
      ``[..., V]`` log-probabilities in the input dtype.

    >>> import jax.numpy as jnp
    >>> [round(v, 4) for v in log_softmax(jnp.log(jnp.array([1.0, 3.0]))).tolist()]
    [-1.3863, -0.2877]
    """
    x, dtype = _math.prepare(logits)
    return _math.restore(_math.log_softmax(x), dtype)
