"""Decoding strategies over any model with a KV cache, each one ``jax.jit``-compiled loop.

The model protocol is :class:`Model` (``apply_step(params, tokens, positions, cache) -> StepOutput``
and ``init_cache(batch_size, max_len)``); see :mod:`jaxsample.decoding.model`. Strategies:

* :func:`generate` (greedy or any :class:`jaxsample.Sampler` chain) and :func:`stream` (the same
  step, jitted with a donated state and driven from Python);
* :func:`beam_search`, :func:`beam_sample`, :func:`group_beam_search` (HuggingFace semantics);
* :func:`constrained_beam_search` (HF ``force_words_ids`` / ``constraints``);
* :func:`sample_and_rank` (``n`` / ``best_of``);
* :func:`contrastive_search`;
* :func:`dola_generate` (DoLa: contrasting early-exit layers, for models with ``Model.early_exit``);
* :func:`speculative_generate` (draft model + vLLM's rejection sampler);
* :class:`DecodeRequest` / :func:`run_request`: a whole vLLM ``SamplingParams`` or HF
  ``GenerationConfig`` request mapped to the right strategy call;
* :func:`prompt_lookup_generate` (model-free n-gram drafts from the context, HF / vLLM ``ngram``).

Every per-row value (sampling parameters, seeds, lengths, EOS ids, stop sequences, penalties) is a
traced array: new values never recompile. :data:`BIGRAM` and :class:`TinyDecoder` are toy models
for tests and benchmarks.
"""

from jaxsample.decoding._stopping import FinishReason, Logprobs
from jaxsample.decoding.beam import BeamOutput, beam_sample, beam_search, group_beam_search
from jaxsample.decoding.constrained import constrained_beam_search
from jaxsample.decoding.constraints import Constraint
from jaxsample.decoding.contrastive import contrastive_search
from jaxsample.decoding.dispatch import DecodeRequest, run_request
from jaxsample.decoding.dola import dola_generate
from jaxsample.decoding.generate import GenerateOutput, generate
from jaxsample.decoding.lookup import prompt_lookup_generate
from jaxsample.decoding.model import BIGRAM, EarlyExit, Model, StepOutput
from jaxsample.decoding.rank import RankedOutput, sample_and_rank
from jaxsample.decoding.speculative import SpeculativeOutput, speculative_generate
from jaxsample.decoding.stream import StreamChunk, stream
from jaxsample.decoding.toy import TinyDecoder

__all__ = sorted([
    "BIGRAM",
    "BeamOutput",
    "Constraint",
    "DecodeRequest",
    "EarlyExit",
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
    "constrained_beam_search",
    "contrastive_search",
    "dola_generate",
    "generate",
    "group_beam_search",
    "prompt_lookup_generate",
    "run_request",
    "sample_and_rank",
    "speculative_generate",
    "stream",
])
