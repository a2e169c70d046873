"""torch's CPU random streams, reproduced bit for bit: mt19937, ``randperm`` prefixes, 64-bit integers.

HuggingFace's watermarks draw from ``torch.Generator`` (CPU), so equal keys give equal greenlists
only if we draw the same numbers. torch's CPU generator is the reference mt19937: ``manual_seed(s)``
initialises it with ``s mod 2**32`` (Knuth's ``init_genrand``), ``random()`` returns the next
tempered 32-bit output, ``randperm(n)`` (``n < 2**32 / 20``) is the forward Fisher-Yates shuffle
``for i < n-1: swap(r[i], r[i + random() % (n - i)])`` from the identity, and ``randint(0, m)`` is
``random() % m``.

:func:`randperm_prefix_mask` computes *which* tokens the first ``G`` steps of that shuffle place in
positions ``[0, G)`` (the greenlist) without running the swaps: step ``k`` swaps ``k`` with
``t_k = k + z_k``; position ``q >= G`` ends up holding what position ``k`` held before step ``k``,
``k`` the last step that targeted ``q``; and what position ``k`` held is, following the chain of
earlier steps that targeted it, its root's original id. So the tokens ``x >= G`` in the prefix are
exactly the targeted ones, and the tokens ``x < G`` outside it are the roots of the last steps
targeting ``q >= G``: one scatter-max, ``log2(n)`` rounds of pointer jumping, one scatter.

64-bit integer arithmetic (torch's int64 hashes) runs on ``(hi, lo)`` pairs of uint32, as JAX has no
64-bit integers without ``jax_enable_x64``.
"""

from __future__ import annotations

import functools
import math


import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._types import Array

_N, _M = 624, 397
_UPPER, _LOWER, _MATRIX = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)
_U32 = jnp.uint32


# ------------------------------------------------------------------------------ 64-bit integers
def split64(value: int) -> tuple[int, int]:
    """A Python int as ``(hi, lo)`` uint32 words of its two's-complement 64-bit form."""
    v = int(value) % 2**64
    return v >> 32, v & 0xFFFFFFFF


def mul32(a: Array, b: Array) -> tuple[Array, Array]:
    """Full 64-bit product of two uint32 arrays: ``(hi, lo)``."""
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    lo = (mid << 16) | (p00 & 0xFFFF)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    return hi, lo


def add64(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array]:
    """``a + b mod 2**64`` on ``(hi, lo)`` pairs."""
    lo = a[1] + b[1]
    return a[0] + b[0] + (lo < a[1]).astype(_U32), lo


def mul64(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array]:
    """``a * b mod 2**64`` on ``(hi, lo)`` pairs."""
    hi, lo = mul32(a[1], b[1])
    return hi + a[0] * b[1] + a[1] * b[0], lo


def less64_signed(a: tuple[Array, Array], b: tuple[Array, Array]) -> Array:
    """``a < b`` as signed int64 values."""
    ah, bh = lax.bitcast_convert_type(a[0], jnp.int32), lax.bitcast_convert_type(b[0], jnp.int32)
    return (ah < bh) | ((ah == bh) & (a[1] < b[1]))


def _mulmod(a: Array, b: int, m: int) -> Array:
    """``a * b mod m`` for uint32 ``a < m``, static ``b < m <= 2**24`` (4-bit Horner steps, no overflow)."""
    r = jnp.zeros_like(a)
    for shift in range(20, -1, -4):
        r = (r * 16 + a * ((b >> shift) & 15)) % m
    return r


def mod64_signed(a: tuple[Array, Array], m: int) -> Array:
    """``a mod m`` (non-negative, as torch's ``%``) of signed int64 ``a``; static ``0 < m <= 2**24``."""
    m = int(m)
    if m & (m - 1) == 0:  # 2**64 is a multiple of m: the two's complement bits already give it
        return a[1] & (m - 1)
    u = (_mulmod(a[0] % m, 2**32 % m, m) + a[1] % m) % m  # the unsigned value mod m
    negative = a[0] >= _UPPER
    return jnp.where(negative, (u + (m - 2**64 % m)) % m, u)


# ------------------------------------------------------------------------------------- mt19937
def _seed_state(seed: Array) -> Array:
    """``uint32[624]`` state of ``init_genrand(seed)``."""

    def step(prev, j):
        nxt = jnp.uint32(1812433253) * (prev ^ (prev >> 30)) + j
        return nxt, nxt

    _, rest = lax.scan(step, seed.astype(_U32), jnp.arange(1, _N, dtype=_U32), unroll=8)
    return jnp.concatenate([seed.astype(_U32)[None], rest])


def _twist(mt: Array) -> Array:
    """The next ``uint32[624]`` state (the reference loop, in its three data-parallel chunks)."""

    def mix(y, m):
        return m ^ (y >> 1) ^ jnp.where((y & 1) == 1, _MATRIX, np.uint32(0))

    def y(a, b):
        return (a & _UPPER) | (b & _LOWER)

    new0 = mix(y(mt[0:227], mt[1:228]), mt[397:624])
    new1 = mix(y(mt[227:454], mt[228:455]), new0)
    new2 = mix(y(mt[454:623], mt[455:624]), new1[0:169])
    new3 = mix(y(mt[623:624], new0[0:1]), new1[169:170])
    return jnp.concatenate([new0, new1, new2, new3])


def _temper(y: Array) -> Array:
    y = y ^ (y >> 11)
    y = y ^ ((y << 7) & np.uint32(0x9D2C5680))
    y = y ^ ((y << 15) & np.uint32(0xEFC60000))
    return y ^ (y >> 18)


def mt19937(seed: Array, count: int) -> Array:
    """``uint32[count]``: the first ``count`` outputs of torch's CPU generator after ``manual_seed(seed)``.

    ``seed``: uint32 scalar (torch keeps ``seed mod 2**32``); ``count`` static.
    """
    blocks = max(1, -(-count // _N))

    def step(mt, _):
        mt = _twist(mt)
        return mt, _temper(mt)

    _, out = lax.scan(step, _seed_state(seed), None, length=blocks)
    return out.reshape(-1)[:count]


# ------------------------------------------------------------------------------------ randperm
def randperm_prefix_mask(seed: Array, n: int, prefix: Array) -> Array:
    """``bool[n]``: membership in the first ``prefix`` entries of ``torch.randperm(n)`` seeded ``seed``.

    Args:
      seed: uint32 scalar (``manual_seed`` value mod ``2**32``).
      n: static permutation size (``n < 2**32 / 20``, torch's small-``n`` algorithm).
      prefix: int32 scalar ``G`` in ``[0, n]`` (traced).
    """
    steps = max(n - 1, 0)
    k = jnp.arange(steps, dtype=jnp.int32)
    z = (mt19937(seed, steps) % (n - k).astype(_U32)).astype(jnp.int32) if steps else k
    target = k + z
    live = (k < prefix) & (z > 0)
    last = jnp.full((n,), -1, jnp.int32).at[jnp.where(live, target, n)].max(k, mode="drop")
    idx = jnp.arange(n, dtype=jnp.int32)
    parent = jnp.where((idx < prefix) & (last >= 0), last, idx)
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        parent = parent[parent]
    gone = (idx >= prefix) & (last >= 0)
    evicted = jnp.zeros((n,), bool).at[jnp.where(gone, parent[jnp.maximum(last, 0)], n)].set(True, mode="drop")
    return jnp.where(idx >= prefix, last >= 0, ~evicted)


# ---------------------------------------------------------------- reference streams (build time)
def mt19937_numpy(seed: int, count: int) -> np.ndarray:
    """``uint64[count]`` raw mt19937 outputs for ``manual_seed(seed)`` (numpy's legacy seeding is the same)."""
    return np.random.RandomState(int(seed) % 2**32)._bit_generator.random_raw(count)


@functools.lru_cache(maxsize=8)
def randperm_numpy(seed: int, n: int) -> np.ndarray:
    """``int64[n]`` equal to ``torch.randperm(n, generator=torch.Generator().manual_seed(seed))``.

    Vectorised with the same chain argument as :func:`randperm_prefix_mask`: ``r[i]`` is what
    position ``t_i`` held before step ``i``, i.e. the root of the previous step that targeted
    ``t_i``, or ``t_i`` itself.
    """
    steps = max(n - 1, 0)
    k = np.arange(steps, dtype=np.int64)
    t = k + (mt19937_numpy(seed, max(steps, 1))[:steps] % (n - k).astype(np.uint64)).astype(np.int64)
    moved = t != k
    last = np.full(n, -1, np.int64)
    np.maximum.at(last, t[moved], k[moved])  # last step before k that targeted position k
    root = np.where(last >= 0, last, np.arange(n))
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    order = np.argsort(t, kind="stable")
    previous = np.full(steps, -1, np.int64)
    same = t[order[1:]] == t[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    out = np.empty(n, np.int64)
    out[:steps] = np.where(previous >= 0, root[np.maximum(previous, 0)], t)
    if n:
        out[n - 1] = root[last[n - 1]] if last[n - 1] >= 0 else n - 1
    return out


def randint_numpy(seed: int, high: int, count: int) -> np.ndarray:
    """``int64[count]`` equal to ``torch.randint(0, high, (count,), generator=...manual_seed(seed))``."""
    return (mt19937_numpy(seed, count) % np.uint64(high)).astype(np.int64)


