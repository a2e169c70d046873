"""Tiny models in the shapes users bring: a plain logits function, a Gemma-style call with a shared
write index, and a Flax NNX module with ``nnx.MultiHeadAttention(decode=True)`` caches.

The plain function and the Gemma-style call compute the same one-layer attention LM (token + sinusoid
position embeddings, one head, residual, untied output), so decoding through either adapter must
give the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

V, D = 11, 8


def init_params(seed: int = 0, scale: float = 3.0) -> dict:
    ks = jax.random.split(jax.random.key(seed), 5)
    n = lambda k, shape: jax.random.normal(k, shape) / jnp.sqrt(shape[0])  # noqa: E731
    return {"embed": jax.random.normal(ks[0], (V, D)), "q": n(ks[1], (D, D)), "k": n(ks[2], (D, D)),
            "v": n(ks[3], (D, D)), "out": scale * n(ks[4], (D, V))}


def _sinusoid(positions):
    freq = jnp.exp(-jnp.arange(D // 2) / 2.0)
    a = jnp.maximum(positions, 0)[..., None].astype(jnp.float32) * freq
    return jnp.concatenate([jnp.sin(a), jnp.cos(a)], axis=-1)


def _embed(params, tokens, positions):
    return params["embed"][jnp.clip(tokens, 0, V - 1)] + _sinusoid(positions)


def _attend(params, x, keys, values, mask):
    s = jnp.einsum("btd,bld->btl", x @ params["q"], keys) / jnp.sqrt(D)
    a = jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1)
    return (x + jnp.einsum("btl,bld->btd", a, values)) @ params["out"]


def logits_fn(params, tokens):
    """Plain function: ``logits [B, T, V]`` of a causal model, no cache."""
    t = tokens.shape[1]
    x = _embed(params, tokens, jnp.broadcast_to(jnp.arange(t), tokens.shape))
    causal = jnp.tril(jnp.ones((t, t), bool))[None]
    return _attend(params, x, x @ params["k"], x @ params["v"], causal)


def gemma_init_cache(batch_size, max_len):
    """Gemma-like cache, except the write index is one scalar for the batch (no batch axis)."""
    z = jnp.zeros((batch_size, max_len, D))
    return {"k": z, "v": z, "end_index": jnp.zeros((), jnp.int32)}


def gemma_call(params, tokens, positions, cache, attention_mask):
    """``(tokens [B, T], positions [B, T], cache, attention_mask [B, T, L]) -> (logits, cache)``."""
    x = _embed(params, tokens, positions)
    i = cache["end_index"]
    k = jax.lax.dynamic_update_slice(cache["k"], x @ params["k"], (0, i, 0))
    v = jax.lax.dynamic_update_slice(cache["v"], x @ params["v"], (0, i, 0))
    logits = _attend(params, x, k, v, attention_mask)
    return logits, {"k": k, "v": v, "end_index": i + tokens.shape[1]}


class NnxLM(nnx.Module):
    """Embedding + one ``nnx.MultiHeadAttention`` + output projection; ``decode=True`` for cached steps."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.pos = nnx.Embed(64, D, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=D, qkv_features=D, decode=False, rngs=rngs)
        self.out = nnx.Linear(D, V, rngs=rngs)

    def __call__(self, tokens, positions=None, mask=None, decode=False):
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
            mask = nnx.make_causal_mask(tokens)
        x = self.embed(jnp.clip(tokens, 0, V - 1)) + self.pos(jnp.maximum(positions, 0))
        return self.out(x + self.attn(x, mask=mask, decode=decode)) * 3.0


def nnx_call(module, tokens, positions, attention_mask):
    """The cached call: one token per row, the adapter's mask given to the attention layer."""
    return module(tokens, positions, attention_mask[:, None], decode=True)
