"""A tiny decoder-only transformer with a position-masked KV cache, for tests and benchmarks.

It implements the :mod:`jaxsample.decoding.model` protocol the way a real Flax/JAX LLM does:
pre-norm attention + MLP blocks, sinusoidal absolute positions computed from ``positions`` (so
ragged rows need no position table), a KV cache ``[B, L, layers, heads, head_dim]`` written at the
given positions (``-1`` = no write) and attention to cache slots ``<= position`` only. Logits come
from an untied ``[D, V]`` projection, so a large ``V`` makes the step cost that of a real LM head.

>>> import jax, jax.numpy as jnp
>>> net = TinyDecoder(vocab_size=11, d_model=8, num_layers=1, num_heads=2)
>>> params = jax.jit(net.init_params)(jax.random.key(0))
>>> out = jax.jit(net.apply_step)(params, jnp.array([[3, 4]]), jnp.array([[0, 1]]), net.init_cache(1, 4))
>>> out.logits.shape, out.hidden.shape
((1, 2, 11), (1, 2, 8))
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxsample._types import Array
from jaxsample.decoding.model import Model, StepOutput


def _rms_norm(x: Array, scale: Array) -> Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _sinusoid(positions: Array, d: int) -> Array:
    """``[B, T, d]`` sinusoidal embedding of (clipped) positions."""
    half = d // 2
    freq = jnp.exp(-jnp.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
    angle = jnp.maximum(positions, 0).astype(jnp.float32)[..., None] * freq
    emb = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)
    return jnp.pad(emb, [(0, 0)] * (emb.ndim - 1) + [(0, d - 2 * half)])


@dataclasses.dataclass(frozen=True)
class TinyDecoder:
    """Static configuration of the toy transformer (hashable: its methods are stable ``jit`` statics)."""

    vocab_size: int
    d_model: int = 32
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def model(self) -> Model:
        """The protocol view (:class:`Model`) of this network."""
        return Model(self.apply_step, self.init_cache)

    def init_params(self, key: Array, scale: float = 1.0) -> dict:
        """Random weights; ``scale`` multiplies the output projection (larger = peakier logits)."""
        d, f, v, n = self.d_model, self.mlp_ratio * self.d_model, self.vocab_size, self.num_layers
        ks = jax.random.split(key, 8)

        def dense(k, shape, fan_in):
            return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in)

        return {
            "embed": jax.random.normal(ks[0], (v, d), jnp.float32),
            "qkv": dense(ks[1], (n, d, 3 * d), d),
            "out": dense(ks[2], (n, d, d), d),
            "up": dense(ks[3], (n, d, f), d),
            "down": dense(ks[4], (n, f, d), f),
            "norm1": jnp.ones((n, d)),
            "norm2": jnp.ones((n, d)),
            "final_norm": jnp.ones((d,)),
            "unembed": scale * dense(ks[5], (d, v), d),
        }

    def init_cache(self, batch_size: int, max_len: int) -> dict:
        shape = (batch_size, max_len, self.num_layers, self.num_heads, self.head_dim)
        return {"k": jnp.zeros(shape, jnp.float32), "v": jnp.zeros(shape, jnp.float32)}

    def apply_step(self, params: dict, tokens: Array, positions: Array, cache: dict) -> StepOutput:
        b, t = tokens.shape
        max_len = cache["k"].shape[1]
        h, hd = self.num_heads, self.head_dim
        x = jnp.take(params["embed"], jnp.clip(tokens, 0, self.vocab_size - 1), axis=0)
        x = x + _sinusoid(positions, self.d_model)
        slot = jnp.where(positions >= 0, positions, max_len)  # -1 -> out of range -> dropped
        rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
        # query t sees slot s iff s <= positions[b, t] (padding queries see nothing useful; ignored)
        allowed = jnp.arange(max_len)[None, None, :] <= positions[:, :, None]  # [B, T, L]
        ck, cv = cache["k"], cache["v"]
        for layer in range(self.num_layers):
            y = _rms_norm(x, params["norm1"][layer])
            q, k, v = jnp.split(y @ params["qkv"][layer], 3, axis=-1)
            q, k, v = (z.reshape(b, t, h, hd) for z in (q, k, v))
            ck = ck.at[rows, slot, layer].set(k, mode="drop")
            cv = cv.at[rows, slot, layer].set(v, mode="drop")
            s = jnp.einsum("bthd,blhd->bhtl", q, ck[:, :, layer]) / jnp.sqrt(jnp.float32(hd))
            s = jnp.where(allowed[:, None], s, -1e30)
            a = jnp.einsum("bhtl,blhd->bthd", jax.nn.softmax(s, axis=-1), cv[:, :, layer])
            x = x + a.reshape(b, t, self.d_model) @ params["out"][layer]
            y = _rms_norm(x, params["norm2"][layer])
            x = x + jax.nn.gelu(y @ params["up"][layer]) @ params["down"][layer]
        hidden = _rms_norm(x, params["final_norm"])
        logits = hidden @ params["unembed"]
        return StepOutput(logits.astype(jnp.float32), {"k": ck, "v": cv}, hidden)
