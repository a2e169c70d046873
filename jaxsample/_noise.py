"""Counter-based noise addressed by token id: the randomness behind every sampler.

The noise of token ``i`` in a row is a pure function of ``(row key, i)``: one threefry-2x32 hash of
the counter ``i // 2`` (each hash yields two words). So the same Gumbel value is produced whether a
sampler draws noise for the whole vocabulary or only for a few candidate ids, and a row's draws never
depend on the batch it sits in. This is what lets :func:`jaxsample.categorical` sample from a
candidate set and still return exactly ``argmax(logits + gumbel)`` over the full vocabulary.

Sharding/TPU: keys are per row; shard them with the batch. threefry is pure integer arithmetic,
identical on every backend (no hardware RNG), which is what keeps draws batch- and backend-invariant.
:func:`threefry2x32` is written out round by round, so that XLA fuses the hash with what consumes it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._types import Array, KeyLike


def _is_typed(key) -> bool:
    return jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key)


def typed_key(key: KeyLike) -> Array:
    """A typed key (any shape) from a typed key or raw ``uint32[..., 2]`` key data, checked."""
    if _is_typed(key):
        return key
    key = jnp.asarray(key)
    if key.dtype != jnp.uint32 or key.ndim == 0 or key.shape[-1] != 2:
        raise ValueError(
            f"key must be a typed PRNG key or raw uint32 key data of shape [..., 2], "
            f"got dtype {key.dtype} and shape {key.shape}"
        )
    return jax.random.wrap_key_data(key)


def row_keys(key: KeyLike, batch_shape: tuple[int, ...]) -> Array:
    """Normalises a key argument to one typed key per row.

    Args:
      key: a typed key (shape ``()`` or ``batch_shape``) or raw ``uint32`` key data (shape ``(2,)``
        or ``batch_shape + (2,)``). A single key is expanded with ``fold_in(key, flat_row_index)``
        so that row ``b`` gets the same key whatever the batch size.
      batch_shape: ``logits.shape[:-1]``.

    Returns:
      Typed keys of shape ``batch_shape``.
    """
    key = typed_key(key)
    if key.shape == tuple(batch_shape):
        return key
    if key.shape == ():
        n = int(np.prod(batch_shape, dtype=np.int64))
        return fold_in(jnp.broadcast_to(key, (n,)), jnp.arange(n, dtype=jnp.uint32)).reshape(batch_shape)
    raise ValueError(
        f"key must be a single key or one key per row (batch shape {tuple(batch_shape)}), "
        f"got key batch shape {key.shape}"
    )


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


@jax.jit
def threefry2x32(k1: Array, k2: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 with 20 rounds, unrolled: bit-identical to ``jax.extend.random.threefry2x32_p``.

    All arguments ``uint32``, broadcast together; returns the two output words. JAX's own lowering on
    CPU keeps the rounds in a loop that writes every intermediate word to memory (about 11
    ``logsumexp`` passes for one word per token at ``B=64, V=131072``, against 2.4 for this form).
    Under ``jax.jit`` itself: a step's program calls it ~80 times, each traced once per shape (not
    ~350 ops every call; a chain of every stage traced in 3.9 s, not 7.6) and inlined by XLA before
    fusion, so the compiled program is the same.
    """
    u32 = jnp.uint32
    ks = (k1, k2, k1 ^ k2 ^ u32(0x1BD11BDA))
    x0, x1 = x0 + k1, x1 + k2
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << u32(r)) | (x1 >> u32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + u32(i + 1)
    return x0, x1


def _unrolled(keys: Array) -> bool:
    """Whether the keys' bits can be computed with :func:`threefry2x32` (threefry keys, the default)."""
    return str(jax.random.key_impl(keys)) == "threefry2x32"


def fold_in(keys: Array, data: Array) -> Array:
    """``jax.random.fold_in`` row by row: typed keys ``[*B]`` and ``data`` (any int, broadcast to ``[*B]``).

    Threefry keys are hashed with :func:`threefry2x32` (``fold_in(k, d)`` is the hash of the
    counter ``(0, d)``, bit for bit), which XLA fuses with its neighbours; JAX's own CPU lowering runs
    each ``fold_in`` as a loop over memory (~70 us a call in a decode step). Other PRNG
    implementations go through ``jax.random.fold_in``.
    """
    data = jnp.broadcast_to(lax.convert_element_type(jnp.asarray(data), jnp.uint32), keys.shape)
    if not _unrolled(keys):
        return jax.vmap(jax.random.fold_in)(keys.reshape(-1), data.reshape(-1)).reshape(keys.shape)
    k = jax.random.key_data(keys)
    y0, y1 = threefry2x32(k[..., 0], k[..., 1], jnp.zeros_like(data), data)
    return jax.random.wrap_key_data(jnp.stack([y0, y1], axis=-1), impl=jax.random.key_impl(keys))


def _bits(keys: Array, shape: tuple[int, ...]) -> Array:
    """``jax.random.bits(key, shape, uint32)`` for each typed key ``[*B]``: ``uint32[*B, *shape]``.

    With partitionable threefry keys (JAX's default) word ``j`` is ``y0 ^ y1`` of the hash of the
    counter ``(0, j)``, computed with :func:`threefry2x32` as in :func:`fold_in`; any other PRNG
    implementation goes through ``jax.random.bits``.
    """
    if _unrolled(keys) and jax.config.jax_threefry_partitionable:
        k = jax.random.key_data(keys)[..., None, :]
        y0, y1 = threefry2x32(k[..., 0], k[..., 1], jnp.uint32(0), jnp.arange(math.prod(shape), dtype=jnp.uint32))
        return (y0 ^ y1).reshape(keys.shape + shape)
    flat = keys.reshape(-1)
    return jax.vmap(lambda k: jax.random.bits(k, shape, jnp.uint32))(flat).reshape(keys.shape + shape)


def _words(keys: Array) -> tuple[Array, Array]:
    """Two ``uint32`` words per typed key (works for every PRNG implementation)."""
    w = _bits(keys, (2,))
    return w[..., 0], w[..., 1]


def _to_unit_open(bits: Array) -> Array:
    """``uint32`` -> float32 in ``(0, 1)``: ``((bits >> 9) + 0.5) / 2**23``, exact in float32.

    The top 23 bits plus the half-step fit the 24-bit float32 significand, so the result lies in
    ``[2**-24, 1 - 2**-24]`` (``(bits + 0.5) / 2**32`` rounds to exactly ``1.0`` for the top 128
    patterns, and the Gumbel noise built from it to ``-inf``).
    """
    return ((bits >> 9).astype(jnp.float32) + 0.5) * jnp.float32(2.0**-23)


def _gumbel_from_bits(bits: Array) -> Array:
    # -log(E) with E = -log1p(-w) ~ Exp(1): finite for every w in [2**-24, 1 - 2**-24], from
    # -log(-log(2**-24)) ~ -2.82 to -log(2**-24) ~ 16.6.
    w = _to_unit_open(bits)
    return -jnp.log(-jnp.log1p(-w))


def gumbel_bound(bits: Array) -> Array:
    """An upper bound of :func:`_gumbel_from_bits` without logarithms (integer and float ops only).

    With ``w = 2**e * m`` (``1 <= m < 2``) the uniform, the noise ``-log(-log1p(-w)) <= -log(w) <=
    -e log 2``; ``1e-4`` covers the float32 rounding of the logarithms (checked for every one of the
    ``2**23`` values in ``tests/test_selection.py``). Loose by up to ~3.5 for ``w`` near 1.
    """
    e = (lax.bitcast_convert_type(_to_unit_open(bits), jnp.int32) >> 23) - 127
    return e.astype(jnp.float32) * jnp.float32(-math.log(2.0)) + jnp.float32(1e-4)


def bits_at(keys: Array, ids: Array) -> Array:
    """``uint32`` random words for token ids.

    Args:
      keys: typed keys ``[*B]``.
      ids: ``int32[*B, K]`` token ids (any non-negative values).

    Returns:
      ``uint32[*B, K]``; entry ``[b, j]`` depends only on ``(keys[b], ids[b, j])``.
    """
    k1, k2 = _words(keys)
    ids = ids.astype(jnp.uint32)
    counter = ids >> 1
    lo, hi = threefry2x32(k1[..., None], k2[..., None], jnp.zeros_like(counter), counter)
    return jnp.where((ids & 1) == 0, lo, hi)


def bits_all(keys: Array, vocab_size: int) -> Array:
    """``uint32[*B, V]``: :func:`bits_at` for every id ``0..V-1`` (one hash per pair of ids)."""
    k1, k2 = _words(keys)
    half = (vocab_size + 1) // 2
    counter = jnp.arange(half, dtype=jnp.uint32)
    lo, hi = threefry2x32(k1[..., None], k2[..., None], jnp.zeros_like(counter), counter)
    return jnp.stack([lo, hi], axis=-1).reshape(keys.shape + (2 * half,))[..., :vocab_size]


def gumbel_at(keys: Array, ids: Array) -> Array:
    """Standard Gumbel noise ``float32[*B, K]`` for token ids (see :func:`bits_at`)."""
    return _gumbel_from_bits(bits_at(keys, ids))


def gumbel_all(keys: Array, vocab_size: int) -> Array:
    """Standard Gumbel noise ``float32[*B, V]`` for the whole vocabulary."""
    return _gumbel_from_bits(bits_all(keys, vocab_size))


def uniform(keys: Array, stream: int = 0) -> Array:
    """One uniform ``float32`` in ``(0, 1)`` per row, independent of the token noise.

    ``stream`` selects an independent value (e.g. one per stage); it is folded into the key.
    """
    return _to_unit_open(_bits(fold_in(keys, 0x5EED0000 + stream), ()))
