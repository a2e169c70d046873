"""Small Flax models for jaxsample: a decoder-only LM and a BART-style encoder-decoder.

Both expose the decoding interface ``generate`` and beam search use (``init_cache``/``encode`` and
``apply_step`` returning a :class:`StepOutput`), a full-sequence ``__call__`` for training, optax
training (:mod:`jaxsample.models.train`) and orbax checkpoints (:mod:`jaxsample.models.checkpoint`).

``flax.linen`` is used rather than ``flax.nnx``: parameters stay a plain pytree that flows through
``jit``, optax and orbax unchanged, and every model entry point is a pure function of
``(params, inputs, cache)``, which is exactly the decoding contract; nnx's mutable objects would
have to be split and merged around every jitted step.

>>> model = make_model(get_config("bart", "tiny"))
>>> model.is_encoder_decoder, model.config.pad_id
(True, 1)
"""

from jaxsample.models.bart import Bart, BartCache
from jaxsample.models.configs import (
    BartConfig,
    DecoderConfig,
    ModelConfig,
    config_diff,
    config_from_dict,
    get_config,
    load_config,
)
from jaxsample.models.decoder import DecoderLM
from jaxsample.models.layers import DecoderCache, KVCache, StepOutput, positions_from_mask

#: Either of the project's Flax model classes. Every ``jaxsample.decoding`` strategy takes one
#: directly (its ``apply_step`` / ``init_cache``). Also exported as ``Model``, its first name; the
#: decoding protocol type is the unrelated :class:`jaxsample.decoding.DecodingModel`.
LanguageModel = DecoderLM | Bart
Model = LanguageModel


def make_model(config: ModelConfig) -> LanguageModel:
    """The model class matching ``config`` (:class:`DecoderLM` or :class:`Bart`)."""
    if isinstance(config, BartConfig):
        return Bart(config)
    if isinstance(config, DecoderConfig):
        return DecoderLM(config)
    raise TypeError(f"expected a DecoderConfig or BartConfig, got {type(config).__name__}")


__all__ = sorted([
    "Bart",
    "BartCache",
    "BartConfig",
    "DecoderCache",
    "DecoderConfig",
    "DecoderLM",
    "KVCache",
    "LanguageModel",
    "Model",
    "ModelConfig",
    "StepOutput",
    "config_diff",
    "config_from_dict",
    "get_config",
    "load_config",
    "make_model",
    "positions_from_mask",
])
