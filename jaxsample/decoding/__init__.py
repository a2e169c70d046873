"""Decoding strategies over any model with a KV cache, each one ``jax.jit``-compiled loop.

The model protocol is :class:`Model` (``apply_step(params, tokens, positions, cache) -> StepOutput``
and ``init_cache(batch_size, max_len)``); see :mod:`jaxsample.decoding.model`.
"""

from jaxsample.decoding._stopping import FinishReason, Logprobs
from jaxsample.decoding.beam import BeamOutput, beam_sample, beam_search, group_beam_search
from jaxsample.decoding.generate import GenerateOutput, generate
from jaxsample.decoding.model import BIGRAM, Model, StepOutput
from jaxsample.decoding.toy import TinyDecoder

__all__ = sorted([
    "BIGRAM",
    "BeamOutput",
    "FinishReason",
    "GenerateOutput",
    "Logprobs",
    "Model",
    "StepOutput",
    "TinyDecoder",
    "beam_sample",
    "beam_search",
    "generate",
    "group_beam_search",
])
