"""BART-style encoder-decoder (Lewis et al., 2020) with a position-addressed decoder cache.

Architecture as in ``facebook/bart-base``: token embedding shared by encoder, decoder and the output
projection (tied), learned positional embeddings, a LayerNorm on the embeddings, post-LayerNorm
layers with exact GELU, a final logits bias, no final LayerNorm. Differences from the Hugging Face
port: positional tables have ``max_len`` rows (no fairseq offset of 2) and the logits bias is a
trainable parameter rather than a buffer.

Decoding interface:

- ``encode(params, input_ids int32[B, S], attention_mask bool[B, S], max_len) -> BartCache``: runs
  the encoder once, precomputes every decoder layer's cross-attention keys/values and allocates an
  empty decoder self-attention cache of ``max_len`` positions;
- ``apply_step(params, tokens, positions, cache) -> StepOutput`` with the decoder-only semantics
  (``-1`` positions are padding; decoder position 0 holds ``config.decoder_start_id``).

>>> import jax, jax.numpy as jnp
>>> from jaxsample.models.configs import get_config
>>> model = Bart(get_config("bart", "tiny", d_model=32, d_ff=64, encoder_layers=1, decoder_layers=1))
>>> params = model.init(jax.random.key(0))
>>> cache = model.encode(params, jnp.array([[0, 9, 2, 1]]), jnp.array([[True, True, True, False]]), 8)
>>> out = model.apply_step(params, jnp.array([[model.config.decoder_start_id]]), jnp.array([[0]]), cache)
>>> out.logits.shape, out.cache.encoder_mask.tolist()
((1, 1, 512), [[True, True, True, False]])
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from jaxsample._types import Array, ArrayLike
from jaxsample.models import layers
from jaxsample.models.configs import BartConfig
from jaxsample.models.layers import DecoderCache, KVCache, StepOutput


class BartCache(NamedTuple):
    """Decoding state of an encoder-decoder; every leaf has the batch as leading axis."""

    decoder: DecoderCache  # self-attention caches [B, L, H, Dh] + written bool[B, L]
    cross: tuple[KVCache, ...]  # per decoder layer, keys/values of the encoder output [B, S, H, Dh]
    encoded: Array  # [B, S, D] encoder output (compute dtype)
    encoder_mask: Array  # bool[B, S] real encoder tokens


class _BartNet(nn.Module):
    config: BartConfig

    def setup(self):
        c = self.config
        dtype = c.compute_dtype
        embed = lambda n, name=None: nn.Embed(  # noqa: E731
            n, c.d_model, dtype=dtype, embedding_init=nn.initializers.normal(c.init_std), name=name
        )
        norm = lambda name: nn.LayerNorm(c.layer_norm_eps, dtype=dtype, name=name)  # noqa: E731
        block = lambda cross, name: layers.Block(  # noqa: E731
            c.d_model, c.num_heads, c.d_ff, dtype, c.init_std, c.init_std, c.layer_norm_eps, norm_first=c.norm_first,
            cross_attention=cross, dropout_rate=c.dropout_rate, attention_dropout_rate=c.attention_dropout_rate,
            name=name,
        )
        self.shared = embed(c.vocab_size, "shared")
        self.encoder_positions = embed(c.max_len, "encoder_positions")
        self.decoder_positions = embed(c.max_len, "decoder_positions")
        self.encoder_embed_norm, self.decoder_embed_norm = norm("encoder_embed_norm"), norm("decoder_embed_norm")
        self.encoder_layers = [block(False, f"encoder_{i}") for i in range(c.encoder_layers)]
        self.decoder_layers = [block(True, f"decoder_{i}") for i in range(c.decoder_layers)]
        if c.norm_first:  # mBART: the sublayers' outputs are summed unnormalised, so each stack ends with a norm
            self.encoder_final_norm, self.decoder_final_norm = norm("encoder_final_norm"), norm("decoder_final_norm")
        self.logits_bias = self.param("logits_bias", nn.initializers.zeros_init(), (c.vocab_size,), jnp.float32)
        self.dropout = nn.Dropout(c.dropout_rate)

    def _embed(self, tokens: Array, positions: Array, table: nn.Module, norm: nn.Module,
               deterministic: bool) -> Array:
        c = self.config
        x = self.shared(jnp.clip(tokens, 0, c.vocab_size - 1))
        if c.scale_embedding:
            x = x * jnp.asarray(c.d_model ** 0.5, x.dtype)
        x = x + table(jnp.clip(positions, 0, c.max_len - 1))
        return self.dropout(norm(x), deterministic=deterministic)

    def encode(self, input_ids: Array, attention_mask: Array, deterministic: bool = True,
               positions: Array | None = None, segments: Array | None = None) -> Array:
        positions = layers.default_positions(input_ids) if positions is None else positions
        x = self._embed(input_ids, positions, self.encoder_positions, self.encoder_embed_norm, deterministic)
        mask = (layers.padding_mask(attention_mask, input_ids.shape[1]) if segments is None
                else layers.segment_mask(segments, segments))
        for layer in self.encoder_layers:
            x, _ = layer(x, positions, mask, deterministic=deterministic)
        return self.encoder_final_norm(x) if self.config.norm_first else x

    def cross_kv(self, encoded: Array, deterministic: bool = True) -> tuple[KVCache, ...]:
        return tuple(layer.cross_kv(encoded) for layer in self.decoder_layers)

    def decode(self, tokens: Array, positions: Array, cross: tuple[KVCache, ...], encoder_mask: Array,
               cache: DecoderCache | None = None, deterministic: bool = True,
               exits: tuple[int, ...] = (), segments: Array | None = None) -> StepOutput:
        dtype = self.config.compute_dtype
        x = self._embed(tokens, positions, self.decoder_positions, self.decoder_embed_norm, deterministic)
        x, cache, taps = layers.decoder_stack(self.decoder_layers, x, positions, cache, (cross, encoder_mask),
                                              deterministic, exits, segments)
        if self.config.norm_first:
            x = self.decoder_final_norm(x)
        logits = layers.lm_logits(self.shared.embedding, x, dtype, self.logits_bias)
        return StepOutput(logits, cache, x.astype(jnp.float32), layers.exit_logits(self.shared.embedding, taps, dtype))

    def __call__(self, input_ids: Array, attention_mask: Array, decoder_input_ids: Array,
                 decoder_positions: Array, deterministic: bool = True, encoder_positions: Array | None = None,
                 encoder_segments: Array | None = None, decoder_segments: Array | None = None) -> StepOutput:
        encoded = self.encode(input_ids, attention_mask, deterministic, encoder_positions, encoder_segments)
        cross_mask = attention_mask if decoder_segments is None else layers.segment_mask(decoder_segments,
                                                                                           encoder_segments)
        return self.decode(decoder_input_ids, decoder_positions, self.cross_kv(encoded), cross_mask, None,
                           deterministic, segments=decoder_segments)


@dataclasses.dataclass(frozen=True)
class Bart:
    """BART encoder-decoder. Hashable (a valid static argument of ``jax.jit``); ``params`` is a pytree.

    Attributes:
      config: the :class:`~jaxsample.models.configs.BartConfig` (sizes, special ids, dtype).
    """

    config: BartConfig
    is_encoder_decoder: ClassVar[bool] = True

    @property
    def module(self) -> nn.Module:
        """The underlying ``flax.linen`` module."""
        return _BartNet(self.config)

    def init(self, rng: Array) -> dict[str, Any]:
        """Freshly initialised float32 parameters (``N(0, init_std)`` weights, zero biases)."""
        ids = jnp.zeros((1, 2), jnp.int32)
        return self.module.init(rng, ids, ids >= 0, ids, layers.default_positions(ids))["params"]

    def _check_encoder(self, input_ids: ArrayLike, attention_mask: ArrayLike | None) -> tuple[Array, Array]:
        input_ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.ones(input_ids.shape, bool) if attention_mask is None else jnp.asarray(attention_mask, bool)
        if input_ids.ndim != 2 or mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be [B, S]; got {input_ids.shape}, {mask.shape}")
        if input_ids.shape[1] > self.config.max_len:
            raise ValueError(f"encoder length {input_ids.shape[1]} exceeds config.max_len={self.config.max_len}")
        return input_ids, mask

    def encode(self, params: Any, input_ids: ArrayLike, attention_mask: ArrayLike | None,
               max_len: int) -> BartCache:
        """Encodes ``input_ids [B, S]`` and returns the decoding cache for up to ``max_len`` decoder positions.

        Args:
          attention_mask: ``bool[B, S]``, True on real tokens (``None``: all real).
          max_len: static number of decoder positions (``<= config.max_len``).
        """
        input_ids, mask = self._check_encoder(input_ids, attention_mask)
        decoder = layers.init_decoder_cache(self.config, input_ids.shape[0], max_len, self.config.decoder_layers)
        encoded = layers.apply(self.module, params, input_ids, mask, method=_BartNet.encode)
        cross = layers.apply(self.module, params, encoded, method=_BartNet.cross_kv)
        return BartCache(decoder, cross, encoded, mask)

    def apply_step(self, params: Any, tokens: ArrayLike, positions: ArrayLike, cache: BartCache) -> StepOutput:
        """Decoder step: writes ``tokens [B, T]`` at ``positions [B, T]`` and returns their logits.

        Same semantics as :meth:`DecoderLM.apply_step`; positions must stay below the cache length
        (learned positional embeddings exist only up to ``config.max_len``).

        Returns:
          ``StepOutput(logits float32[B, T, V], updated BartCache, hidden float32[B, T, D])``.
        """
        tokens, positions = layers.check_tokens(tokens, positions)
        if cache.encoder_mask.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"cache has batch {cache.encoder_mask.shape[0]} but tokens have batch {tokens.shape[0]}")
        out = layers.apply(self.module, params, tokens, positions, cache.cross, cache.encoder_mask, cache.decoder,
                           method=_BartNet.decode)
        return out._replace(cache=cache._replace(decoder=out.cache))

    def apply_step_exits(self, params: Any, tokens: ArrayLike, positions: ArrayLike, cache: BartCache,
                         exits: tuple[int, ...]) -> StepOutput:
        """:meth:`apply_step` whose output also holds ``layer_logits float32[B, T, J, V]``: the tied LM
        head (without the logits bias, HF's ``lm_head``) on the decoder hidden state after layer
        ``exits[j]`` (``0``: the normalised embeddings)."""
        tokens, positions = layers.check_tokens(tokens, positions)
        layers.check_exits(exits, self.config.decoder_layers)
        out = layers.apply(self.module, params, tokens, positions, cache.cross, cache.encoder_mask, cache.decoder,
                           method=_BartNet.decode, exits=tuple(exits))
        return out._replace(cache=cache._replace(decoder=out.cache))

    @property
    def early_exit(self):
        """The :class:`~jaxsample.decoding.model.EarlyExit` of the decoder (for DoLa)."""
        from jaxsample.decoding.model import EarlyExit

        return EarlyExit(self.config.decoder_layers, True, self.apply_step_exits)

    def __call__(self, params: Any, input_ids: ArrayLike, attention_mask: ArrayLike | None,
                 decoder_input_ids: ArrayLike, decoder_positions: ArrayLike | None = None, *,
                 dropout_rng: Array | None = None, encoder_positions: ArrayLike | None = None,
                 encoder_segment_ids: ArrayLike | None = None,
                 decoder_segment_ids: ArrayLike | None = None) -> StepOutput:
        """Full teacher-forced forward pass (training); ``cache`` of the output is ``None``.

        Args:
          input_ids, attention_mask: encoder ``int32[B, S]`` / ``bool[B, S]`` (``None``: all real).
          decoder_input_ids: ``int32[B, T]``, labels shifted right behind ``decoder_start_id``.
          decoder_positions: ``int32[B, T]``, default ``arange(T)``; ``-1`` marks padding.
          dropout_rng: enables dropout (training) when given.
          encoder_positions: ``int32[B, S]`` (default ``arange(S)``), e.g. restarting in each packed example.
          encoder_segment_ids, decoder_segment_ids: ``int32[B, S]`` / ``int32[B, T]`` packed-example ids
            (0: padding), given together: tokens attend only within their example (encoder, decoder
            self- and cross-attention), as :func:`wakong.features.attention_masks` describes.
        """
        if (encoder_segment_ids is None) != (decoder_segment_ids is None):
            raise ValueError("give encoder_segment_ids and decoder_segment_ids together (packed examples)")
        input_ids, mask = self._check_encoder(input_ids, attention_mask)
        dec = jnp.asarray(decoder_input_ids, jnp.int32)
        positions = layers.default_positions(dec) if decoder_positions is None else decoder_positions
        dec, positions = layers.check_tokens(dec, positions, "decoder_input_ids")
        if dec.shape[0] != input_ids.shape[0]:
            raise ValueError(f"decoder batch {dec.shape[0]} differs from encoder batch {input_ids.shape[0]}")
        if dec.shape[1] > self.config.max_len:
            raise ValueError(f"decoder length {dec.shape[1]} exceeds config.max_len={self.config.max_len}")
        packed = {}
        if encoder_segment_ids is not None:
            packed = {"encoder_segments": jnp.asarray(encoder_segment_ids, jnp.int32),
                      "decoder_segments": jnp.asarray(decoder_segment_ids, jnp.int32)}
            if packed["encoder_segments"].shape != input_ids.shape or packed["decoder_segments"].shape != dec.shape:
                raise ValueError("segment ids must have the shapes of input_ids and decoder_input_ids")
        if encoder_positions is not None:
            packed["encoder_positions"] = jnp.asarray(encoder_positions, jnp.int32)
        return layers.apply(self.module, params, input_ids, mask, dec, positions, dropout_rng=dropout_rng, **packed)
