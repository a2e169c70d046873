"""Transformer building blocks shared by the decoder-only LM and BART, and the KV cache.

Cache layout (every leaf has the batch as leading axis, so beams/rows can be gathered with
``x[idx]``): per self-attention layer ``KVCache(k, v)`` of shape ``[B, L, H, Dh]`` where slot ``l``
holds absolute position ``l``, plus one ``written: bool[B, L]`` per model. A query at position ``p``
attends to slots ``l <= p`` that have been written. Because a slot is addressed by its position,
rolling a row back (speculative decoding, restarting from a shorter prefix) needs no bookkeeping:
stale slots beyond the query position are never attended and are overwritten when reached again.

Cache writes use a select, not a scatter nor a per-row ``dynamic_update_slice``: for every slot
``l`` we find the token (if any) whose position is ``l`` and blend it in with ``jnp.where``. The
work is elementwise over ``[B, L, H, Dh]`` (the same order as reading the cache in attention), it is
exact (no one-hot matmul rounding), and it partitions along batch, sequence or head axes under
SPMD with no communication, whereas scatters are serialised on TPU and per-row slices need a loop
or a ``vmap``-ed dynamic index the partitioner cannot shard along the written axis.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxsample._types import Array

_MASKED = float(jnp.finfo(jnp.float32).min)  # finite: fully masked (padding) queries stay NaN-free


class StepOutput(NamedTuple):
    """Result of a model step (or of a full forward pass, where ``cache`` is ``None``)."""

    logits: Array  # float32[B, T, V]
    cache: Any  # pytree, every leaf with leading axis B
    hidden: Array | None  # float32[B, T, D] last-layer hidden states (what the LM head reads)
    layer_logits: Array | None = None  # float32[B, T, J, V] early-exit logits when asked for (DoLa)


class KVCache(NamedTuple):
    """Self-attention keys and values of one layer (or precomputed cross-attention ones)."""

    k: Array  # [B, L, H, Dh]
    v: Array  # [B, L, H, Dh]


class CacheWrite(NamedTuple):
    """Where a step writes: computed once from the positions and shared by every layer."""

    hit: Array  # bool[B, L]: slot l receives a token this step
    src: Array  # int32[B, L]: index t of the token written into slot l (meaningless where ~hit)


def positions_from_mask(mask: Array) -> Array:
    """``int32[B, T]`` positions of the valid tokens of ``mask: bool[B, T]`` (``0, 1, ...``), ``-1`` elsewhere.

    >>> positions_from_mask(jnp.array([[False, True, True, False]])).tolist()
    [[-1, 0, 1, -1]]
    """
    mask = jnp.asarray(mask, bool)
    return jnp.where(mask, jnp.cumsum(mask, axis=-1) - 1, -1).astype(jnp.int32)


def default_positions(tokens: Array) -> Array:
    """``arange(T)`` broadcast to ``tokens [B, T]``."""
    return jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)


def causal_mask(positions: Array) -> Array:
    """``bool[B, T, T]``: query ``t`` sees key ``s`` iff both are real and ``pos[s] <= pos[t]``."""
    q, k = positions[:, :, None], positions[:, None, :]
    return (k >= 0) & (q >= 0) & (k <= q)


def padding_mask(valid: Array, num_queries: int) -> Array:
    """``bool[B, T, S]``: every query sees every real key of ``valid: bool[B, S]`` (encoder/cross attention)."""
    return jnp.broadcast_to(valid[:, None, :], (valid.shape[0], num_queries, valid.shape[1]))


def segment_mask(queries: Array, keys: Array) -> Array:
    """``bool[B, T, S]``: a query sees the keys of its own packed example (segment ids ``> 0``; 0 is padding).

    >>> segment_mask(jnp.array([[1, 1, 2]]), jnp.array([[1, 2, 0]])).astype(int).tolist()
    [[[1, 0, 0], [1, 0, 0], [0, 1, 0]]]
    """
    return (queries[:, :, None] == keys[:, None, :]) & (queries[:, :, None] > 0)


def cache_write(positions: Array, max_len: int) -> CacheWrite:
    """Slots written by tokens at ``positions: int32[B, T]`` (``< 0`` or ``>= max_len`` write nothing)."""
    if positions.shape[1] == 1:
        hit = positions == jnp.arange(max_len)  # [B, L]
        return CacheWrite(hit, jnp.zeros(hit.shape, jnp.int32))
    eq = positions[:, :, None] == jnp.arange(max_len)  # [B, T, L]
    return CacheWrite(jnp.any(eq, axis=1), jnp.argmax(eq, axis=1).astype(jnp.int32))


def write(cache: Array, new: Array, w: CacheWrite) -> Array:
    """Blends ``new: [B, T, H, Dh]`` into ``cache: [B, L, H, Dh]`` at the slots of ``w``."""
    new = new.astype(cache.dtype)
    if new.shape[1] == 1:
        rows = new  # broadcasts over L
    else:
        rows = jnp.take_along_axis(new, w.src[:, :, None, None], axis=1)  # [B, L, H, Dh]
    return jnp.where(w.hit[:, :, None, None], rows, cache)


def cache_mask(positions: Array, written: Array) -> Array:
    """``bool[B, T, L]``: query ``t`` attends slot ``l`` iff it is real, ``l`` is written and ``l <= pos``."""
    slots = jnp.arange(written.shape[1])
    return written[:, None, :] & (slots <= positions[:, :, None]) & (positions[:, :, None] >= 0)


def rotary(x: Array, positions: Array, theta: float) -> Array:
    """Rotary position embedding (rotate-half form) of ``x: [B, T, H, Dh]`` at ``positions: [B, T]``."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.maximum(positions, 0).astype(jnp.float32)[:, :, None, None] * freq  # [B, T, 1, half]
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _dense_init(std: float):
    return nn.initializers.normal(std)


class Attention(nn.Module):
    """Multi-head attention with biases (BART / GPT-2 style); queries are scaled by ``Dh ** -0.5``."""

    num_heads: int
    head_dim: int
    dtype: Any
    init_std: float
    out_init_std: float
    dropout_rate: float = 0.0
    rope_theta: float | None = None  # rotary positions on q and k when set

    def setup(self):
        dense = lambda name: nn.DenseGeneral(  # noqa: E731
            (self.num_heads, self.head_dim), dtype=self.dtype, kernel_init=_dense_init(self.init_std), name=name
        )
        self.query, self.key, self.value = dense("query"), dense("key"), dense("value")
        self.out = nn.DenseGeneral(
            self.num_heads * self.head_dim, axis=(-2, -1), dtype=self.dtype,
            kernel_init=_dense_init(self.out_init_std), name="out",
        )
        self.dropout = nn.Dropout(self.dropout_rate)

    def kv(self, x: Array, positions: Array | None = None) -> KVCache:
        """Keys and values ``[B, S, H, Dh]`` of ``x: [B, S, D]``."""
        k = self.key(x)
        if self.rope_theta is not None:
            k = rotary(k, positions, self.rope_theta)
        return KVCache(k, self.value(x))

    def __call__(self, x: Array, kv: KVCache, mask: Array, positions: Array | None = None,
                 deterministic: bool = True) -> Array:
        """Attends queries from ``x: [B, T, D]`` to ``kv`` (``[B, S, H, Dh]``) under ``mask: bool[B, T, S]``."""
        q = self.query(x) * jnp.asarray(self.head_dim ** -0.5, self.dtype)
        if self.rope_theta is not None:
            q = rotary(q, positions, self.rope_theta)
        scores = jnp.einsum("bthd,bshd->bhts", q, kv.k.astype(self.dtype), preferred_element_type=jnp.float32)
        scores = jnp.where(mask[:, None], scores, _MASKED)
        probs = self.dropout(jax.nn.softmax(scores, axis=-1), deterministic=deterministic)
        out = jnp.einsum("bhts,bshd->bthd", probs.astype(self.dtype), kv.v.astype(self.dtype))
        return self.out(out)


class Mlp(nn.Module):
    """``fc2(dropout(gelu(fc1(x))))`` with exact (erf) GELU, as BART and GPT-2 use."""

    d_ff: int
    d_model: int
    dtype: Any
    init_std: float
    out_init_std: float
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: Array, deterministic: bool = True) -> Array:
        h = nn.Dense(self.d_ff, dtype=self.dtype, kernel_init=_dense_init(self.init_std), name="fc1")(x)
        h = nn.Dropout(self.dropout_rate)(nn.gelu(h, approximate=False), deterministic=deterministic)
        return nn.Dense(self.d_model, dtype=self.dtype, kernel_init=_dense_init(self.out_init_std), name="fc2")(h)


class Block(nn.Module):
    """Self-attention, optional cross-attention and MLP sublayers, pre- or post-LayerNorm.

    Post-LN (BART): ``x = LN(x + drop(f(x)))``; pre-LN (GPT-2 and later): ``x = x + drop(f(LN(x)))``.
    """

    d_model: int
    num_heads: int
    d_ff: int
    dtype: Any
    init_std: float
    out_init_std: float
    layer_norm_eps: float
    norm_first: bool
    cross_attention: bool = False
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    rope_theta: float | None = None

    def setup(self):
        attn = lambda name, rope: Attention(  # noqa: E731
            self.num_heads, self.d_model // self.num_heads, self.dtype, self.init_std, self.out_init_std,
            self.attention_dropout_rate, rope, name=name,
        )
        norm = lambda name: nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype, name=name)  # noqa: E731
        self.self_attn, self.self_attn_norm = attn("self_attn", self.rope_theta), norm("self_attn_norm")
        if self.cross_attention:
            self.cross_attn, self.cross_attn_norm = attn("cross_attn", None), norm("cross_attn_norm")
        self.mlp = Mlp(self.d_ff, self.d_model, self.dtype, self.init_std, self.out_init_std, self.dropout_rate)
        self.mlp_norm = norm("mlp_norm")
        self.dropout = nn.Dropout(self.dropout_rate)

    def _pre(self, x: Array, norm: nn.Module) -> Array:
        return norm(x) if self.norm_first else x

    def _post(self, x: Array, y: Array, norm: nn.Module, deterministic: bool) -> Array:
        x = x + self.dropout(y, deterministic=deterministic)
        return x if self.norm_first else norm(x)

    def cross_kv(self, encoded: Array) -> KVCache:
        """Cross-attention keys/values of the encoder output (computed once per sequence)."""
        return self.cross_attn.kv(encoded)

    def __call__(
        self,
        x: Array,
        positions: Array,
        mask: Array,
        cache: KVCache | None = None,
        slots: CacheWrite | None = None,
        cross: tuple[KVCache, Array] | None = None,
        deterministic: bool = True,
    ) -> tuple[Array, KVCache | None]:
        """One layer over ``x: [B, T, D]``.

        Args:
          positions: ``int32[B, T]`` absolute positions (``-1`` = padding).
          mask: self-attention mask, ``bool[B, T, T]`` without a cache, ``bool[B, T, L]`` with one.
          cache: this layer's cache; the step's keys/values are written at ``slots`` and the
            queries attend to the whole updated cache.
          cross: ``(encoder keys/values, mask bool[B, T, S])`` for cross-attention.

        Returns:
          ``(x [B, T, D], updated cache or None)``.
        """
        h = self._pre(x, self.self_attn_norm)
        kv = self.self_attn.kv(h, positions)
        if cache is not None:
            kv = KVCache(write(cache.k, kv.k, slots), write(cache.v, kv.v, slots))
        y = self.self_attn(h, kv, mask, positions, deterministic)
        x = self._post(x, y, self.self_attn_norm, deterministic)
        if self.cross_attention:
            cross_kv, cross_mask = cross
            h = self._pre(x, self.cross_attn_norm)
            x = self._post(x, self.cross_attn(h, cross_kv, cross_mask, None, deterministic), self.cross_attn_norm,
                           deterministic)
        x = self._post(x, self.mlp(self._pre(x, self.mlp_norm), deterministic), self.mlp_norm, deterministic)
        return x, (None if cache is None else kv)


class DecoderCache(NamedTuple):
    """Self-attention caches of a decoder stack."""

    layers: tuple[KVCache, ...]  # one per layer, [B, L, H, Dh]
    written: Array  # bool[B, L]: slot l holds the key/value of position l


def init_decoder_cache(config: Any, batch_size: int, max_len: int, num_layers: int) -> DecoderCache:
    """An empty cache of ``config``'s shapes (heads, head size, compute dtype): zeroed ``[B, L, H, Dh]``
    keys/values, nothing written; ``max_len`` must be in ``[1, config.max_len]``."""
    if not 1 <= max_len <= config.max_len:
        raise ValueError(f"max_len must be in [1, config.max_len={config.max_len}], got {max_len}")
    shape = (batch_size, max_len, config.num_heads, config.head_dim)
    zeros = lambda: jnp.zeros(shape, config.compute_dtype)  # noqa: E731
    return DecoderCache(tuple(KVCache(zeros(), zeros()) for _ in range(num_layers)),
                        jnp.zeros((batch_size, max_len), bool))


def decoder_stack(
    blocks: list[Block],
    x: Array,
    positions: Array,
    cache: DecoderCache | None,
    cross: tuple[tuple[KVCache, ...], Array] | None,
    deterministic: bool,
    exits: tuple[int, ...] = (),
    segments: Array | None = None,
) -> tuple[Array, DecoderCache | None, tuple[Array, ...]]:
    """Runs causal ``blocks`` over ``x: [B, T, D]``, full-sequence (``cache=None``) or against a cache.

    Both paths compute the same function of the row's tokens: the full-sequence path masks keys by
    position (``causal_mask``), the cached path writes the step's keys/values at their positions
    and masks slots the same way (``cache_mask``).

    Args:
      cross: ``(per-layer encoder keys/values, encoder valid mask bool[B, S])`` for encoder-decoders,
        or a full cross-attention mask ``bool[B, T, S]`` (packed examples).
      exits: layer indices whose output is also returned (``0``: the input ``x``, ``i``: after block ``i``).
      segments: ``int32[B, T]`` packed-example ids (full-sequence path): a token attends only within its
        example (positions restart at 0 in each).

    Returns:
      ``(x, cache, hidden states [B, T, D] after each layer of exits)``.
    """
    if cache is None:
        slots, written, mask, caches = None, None, causal_mask(positions), (None,) * len(blocks)
        if segments is not None:
            mask = mask & segment_mask(segments, segments)
    else:
        slots = cache_write(positions, cache.written.shape[1])
        written = cache.written | slots.hit
        mask, caches = cache_mask(positions, written), cache.layers
    new, taps = [], [x]
    for i, block in enumerate(blocks):
        layer_cross = None if cross is None else (
            cross[0][i], cross[1] if cross[1].ndim == 3 else padding_mask(cross[1], x.shape[1]))
        x, c = block(x, positions, mask, caches[i], slots, layer_cross, deterministic)
        new.append(c)
        taps.append(x)
    return x, (None if cache is None else DecoderCache(tuple(new), written)), tuple(taps[i] for i in exits)


def apply(module: nn.Module, params: Any, *args: Any, method: Any = None, dropout_rng: Array | None = None,
          **kwargs: Any):
    """``module.apply`` on the ``params`` collection; dropout is on iff ``dropout_rng`` is given."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return module.apply({"params": params}, *args, method=method, rngs=rngs, deterministic=dropout_rng is None,
                        **kwargs)


def check_tokens(tokens: Any, positions: Any, name: str = "tokens") -> tuple[Array, Array]:
    """``int32[B, T]`` tokens and positions of the same shape (``ValueError`` otherwise)."""
    tokens, positions = jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32)
    if tokens.ndim != 2 or tokens.shape != positions.shape:
        raise ValueError(f"{name} and positions must both be [B, T]; got {tokens.shape} and {positions.shape}")
    return tokens, positions


def check_exits(exits: Any, num_layers: int) -> None:
    """``ValueError`` unless ``exits`` is a tuple of layer indices in ``[0, num_layers]``."""
    if not isinstance(exits, tuple) or any(not isinstance(i, int) or not 0 <= i <= num_layers for i in exits):
        raise ValueError(f"exits must be a tuple of layer indices in [0, {num_layers}], got {exits!r}")


def lm_logits(embedding: Array, hidden: Array, dtype: Any, bias: Array | None = None) -> Array:
    """Tied output projection ``hidden [B, T, D] @ embedding.T`` accumulated in float32 -> ``[B, T, V]``."""
    logits = jnp.einsum("btd,vd->btv", hidden.astype(dtype), embedding.astype(dtype),
                        preferred_element_type=jnp.float32)
    return logits if bias is None else logits + bias.astype(jnp.float32)


def exit_logits(embedding: Array, taps: tuple[Array, ...], dtype: Any) -> Array | None:
    """``float32[B, T, J, V]`` LM head on each early-exit hidden state (no final norm, as HF DoLa), or None."""
    if not taps:
        return None
    return jnp.stack([lm_logits(embedding, h, dtype) for h in taps], axis=2)
