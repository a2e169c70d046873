"""Decoder-only transformer LM with a position-addressed KV cache.

GPT-2-style pre-LayerNorm blocks (biases everywhere, exact GELU, residual projections initialised
with ``std / sqrt(2 * layers)``), rotary positions instead of a learned table, a final LayerNorm and
the output projection tied to the token embedding.

Decoding interface (the contract ``generate`` and beam search rely on):

- ``init_cache(batch_size, max_len) -> DecoderCache``;
- ``apply_step(params, tokens int32[B, T], positions int32[B, T], cache) -> StepOutput``, where
  ``positions[b, t]`` is the absolute position of token ``t`` of row ``b`` and ``-1`` marks padding
  (not written, not attended; its logits are garbage). Prefill is one call with the right-padded
  prompt, decoding calls with ``T = 1`` and per-row positions, so ragged rows advance independently.

>>> import jax, jax.numpy as jnp
>>> from jaxsample.models.configs import get_config
>>> model = DecoderLM(get_config("decoder", "tiny", d_model=32, d_ff=64, num_layers=1))
>>> params = model.init(jax.random.key(0))
>>> out = model.apply_step(params, jnp.array([[5, 6, 7]]), jnp.array([[0, 1, 2]]), model.init_cache(1, 16))
>>> out.logits.shape, out.cache.written[0, :4].tolist()
((1, 3, 512), [True, True, True, False])
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp

from jaxsample._types import Array, ArrayLike
from jaxsample.models import layers
from jaxsample.models.configs import DecoderConfig
from jaxsample.models.layers import DecoderCache, StepOutput


class _DecoderNet(nn.Module):
    config: DecoderConfig

    def setup(self):
        c = self.config
        dtype = c.compute_dtype
        self.embed = nn.Embed(c.vocab_size, c.d_model, dtype=dtype,
                              embedding_init=nn.initializers.normal(c.init_std))
        self.blocks = [
            layers.Block(
                c.d_model, c.num_heads, c.d_ff, dtype, c.init_std, c.init_std / math.sqrt(2 * c.num_layers),
                c.layer_norm_eps, norm_first=True, dropout_rate=c.dropout_rate,
                attention_dropout_rate=c.attention_dropout_rate, rope_theta=c.rope_theta, name=f"block_{i}",
            )
            for i in range(c.num_layers)
        ]
        self.final_norm = nn.LayerNorm(c.layer_norm_eps, dtype=dtype)
        self.dropout = nn.Dropout(c.dropout_rate)

    def __call__(self, tokens: Array, positions: Array, cache: DecoderCache | None = None,
                 deterministic: bool = True, exits: tuple[int, ...] = ()) -> StepOutput:
        c = self.config
        x = self.dropout(self.embed(jnp.clip(tokens, 0, c.vocab_size - 1)), deterministic=deterministic)
        x, cache, taps = layers.decoder_stack(self.blocks, x, positions, cache, None, deterministic, exits)
        hidden = self.final_norm(x)
        logits = layers.lm_logits(self.embed.embedding, hidden, c.compute_dtype)
        return StepOutput(logits, cache, hidden.astype(jnp.float32),
                          layers.exit_logits(self.embed.embedding, taps, c.compute_dtype))


@dataclasses.dataclass(frozen=True)
class DecoderLM:
    """Decoder-only LM. Hashable (a valid static argument of ``jax.jit``); ``params`` is a pytree.

    Attributes:
      config: the :class:`~jaxsample.models.configs.DecoderConfig` (sizes, special ids, dtype).
    """

    config: DecoderConfig
    is_encoder_decoder: ClassVar[bool] = False

    @property
    def module(self) -> nn.Module:
        """The underlying ``flax.linen`` module."""
        return _DecoderNet(self.config)

    def init(self, rng: Array) -> dict[str, Any]:
        """Freshly initialised float32 parameters (``N(0, init_std)`` weights, zero biases)."""
        tokens = jnp.zeros((1, 2), jnp.int32)
        return self.module.init(rng, tokens, layers.default_positions(tokens))["params"]

    def init_cache(self, batch_size: int, max_len: int) -> DecoderCache:
        """Empty cache for ``batch_size`` rows of at most ``max_len`` positions (``<= config.max_len``)."""
        return layers.init_decoder_cache(self.config, batch_size, max_len, self.config.num_layers)

    def apply_step(self, params: Any, tokens: ArrayLike, positions: ArrayLike, cache: DecoderCache) -> StepOutput:
        """Writes ``tokens [B, T]`` at ``positions [B, T]`` into ``cache`` and returns their logits.

        Each token attends to the written slots of its row at positions ``<=`` its own (itself
        included). Positions ``< 0`` (padding) or ``>= max_len`` (the cache length; a decode loop
        must stop before) are not written. Positions need not be contiguous or increasing:
        re-feeding an earlier position overwrites its slot and ignores the later ones (rewind).

        Returns:
          ``StepOutput(logits float32[B, T, V], updated cache, hidden float32[B, T, D])``.
        """
        tokens, positions = layers.check_tokens(tokens, positions)
        if cache.written.shape[0] != tokens.shape[0]:
            raise ValueError(f"cache has batch {cache.written.shape[0]} but tokens have batch {tokens.shape[0]}")
        return layers.apply(self.module, params, tokens, positions, cache)

    def apply_step_exits(self, params: Any, tokens: ArrayLike, positions: ArrayLike, cache: DecoderCache,
                         exits: tuple[int, ...]) -> StepOutput:
        """:meth:`apply_step` whose output also holds ``layer_logits float32[B, T, J, V]``: the tied LM
        head on the hidden state after layer ``exits[j]`` (``0``: embeddings; no final LayerNorm, as
        HF's DoLa reads ``hidden_states[j]``)."""
        tokens, positions = layers.check_tokens(tokens, positions)
        layers.check_exits(exits, self.config.num_layers)
        return layers.apply(self.module, params, tokens, positions, cache, exits=tuple(exits))

    @property
    def early_exit(self):
        """The :class:`~jaxsample.decoding.model.EarlyExit` of this model (for DoLa)."""
        from jaxsample.decoding.model import EarlyExit

        return EarlyExit(self.config.num_layers, True, self.apply_step_exits)

    def __call__(self, params: Any, tokens: ArrayLike, positions: ArrayLike | None = None, *,
                 dropout_rng: Array | None = None) -> StepOutput:
        """Full-sequence causal forward pass (training, scoring); ``cache`` of the output is ``None``.

        Args:
          tokens: ``int32[B, T]``.
          positions: ``int32[B, T]``, default ``arange(T)``; ``-1`` marks padding. Gives the same
            logits as feeding the tokens through :meth:`apply_step` in any split.
          dropout_rng: enables dropout (training) when given.
        """
        tokens = jnp.asarray(tokens, jnp.int32)
        positions = layers.default_positions(tokens) if positions is None else positions
        tokens, positions = layers.check_tokens(tokens, positions)
        return layers.apply(self.module, params, tokens, positions, None, dropout_rng=dropout_rng)
