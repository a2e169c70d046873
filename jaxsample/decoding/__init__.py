"""Decoding strategies over any model with a KV cache, each one ``jax.jit``-compiled loop.

The model protocol is :class:`Model` (``apply_step(params, tokens, positions, cache) -> StepOutput``
and ``init_cache(batch_size, max_len)``); see :mod:`jaxsample.decoding.model`. Strategies:

* :func:`generate` (greedy or any :class:`jaxsample.Sampler` chain) and :func:`stream` (the same
  step, jitted with a donated state and driven from Python);
* :func:`beam_search`, :func:`beam_sample`, :func:`group_beam_search` (HuggingFace semantics);
* :func:`sample_and_rank` (``n`` / ``best_of``);
* :func:`contrastive_search`;
* :func:`speculative_generate` (draft model + vLLM's rejection sampler);
* :func:`prompt_lookup_generate` (model-free n-gram drafts from the context, HF / vLLM ``ngram``).

Every per-row value (sampling parameters, seeds, lengths, EOS ids, stop sequences, penalties) is a
traced array: new values never recompile. :data:`BIGRAM` and :class:`TinyDecoder` are toy models
for tests and benchmarks.
"""

from jaxsample.decoding._stopping import FinishReason, Logprobs
from jaxsample.decoding.beam import BeamOutput, beam_sample, beam_search, group_beam_search
from jaxsample.decoding.contrastive import contrastive_search
from jaxsample.decoding.generate import GenerateOutput, generate
from jaxsample.decoding.lookup import prompt_lookup_generate
from jaxsample.decoding.model import BIGRAM, Model, StepOutput
from jaxsample.decoding.rank import RankedOutput, sample_and_rank
from jaxsample.decoding.speculative import SpeculativeOutput, speculative_generate
from jaxsample.decoding.stream import StreamChunk, stream
from jaxsample.decoding.toy import TinyDecoder

__all__ = sorted([
    "BIGRAM",
    "BeamOutput",
    "FinishReason",
    "GenerateOutput",
    "Logprobs",
    "Model",
    "RankedOutput",
    "SpeculativeOutput",
    "StepOutput",
    "StreamChunk",
    "TinyDecoder",
    "beam_sample",
    "beam_search",
    "contrastive_search",
    "generate",
    "group_beam_search",
    "prompt_lookup_generate",
    "sample_and_rank",
    "speculative_generate",
    "stream",
])
