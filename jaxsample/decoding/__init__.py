"""Decoding strategies over any model with a KV cache, each one ``jax.jit``-compiled loop.

The model protocol is :class:`DecodingModel` (first named ``Model``: ``apply_step(params, tokens,
positions, cache) -> StepOutput`` and ``init_cache(batch_size, max_len)``); see
:mod:`jaxsample.decoding.model`. Every strategy also takes ``jaxsample.models`` models directly and
the adapters of :mod:`jaxsample.decoding.adapters` (plain logits functions, Flax NNX modules,
Gemma-style calls, shared-index caches). Options live in one validated
:class:`~jaxsample.decoding.options.DecodingOptions`; the shared loop kernel is
:mod:`jaxsample.decoding.loop`. Strategies:

* :func:`generate`: the one entry point (HF ``generate`` semantics: ``num_beams``, ``do_sample``,
  ``num_beam_groups``, ``penalty_alpha`` / ``top_k``, ``n`` / ``best_of``, a draft model pick the
  strategy below; alone it is greedy or any :class:`jaxsample.Sampler` chain); :func:`stream` (the
  same step, jitted with a donated state and driven from Python);
* :func:`beam_search`, :func:`beam_sample`, :func:`group_beam_search` (HuggingFace semantics);
* :func:`constrained_beam_search` (HF ``force_words_ids`` / ``constraints``);
* :func:`sample_and_rank` (``n`` / ``best_of``);
* :func:`contrastive_search`;
* :func:`dola_generate` (DoLa: contrasting early-exit layers, for models with ``Model.early_exit``);
* :func:`speculative_generate` (draft model + vLLM's rejection sampler);
* :class:`DecodeRequest` / :func:`run_request`: a whole vLLM ``SamplingParams`` or HF
  ``GenerationConfig`` request mapped to the right strategy call;
* :func:`prompt_lookup_generate` (model-free n-gram drafts from the context, HF / vLLM ``ngram``);
* :func:`jump_forward_generate` (``generate(jump_forward=k)``: grammar-forced tokens fed several per
  model call, outputs identical to plain constrained decoding).

Every per-row value (sampling parameters, seeds, lengths, EOS ids, stop sequences, penalties) is a
traced array: new values never recompile. :data:`BIGRAM` and :class:`TinyDecoder` are toy models
for tests and benchmarks.
"""

from jaxsample.decoding._stopping import FinishReason, Logprobs
from jaxsample.decoding.adapters import as_model, from_function, from_gemma, from_nnx, from_shared_index
from jaxsample.decoding.beam import BeamOutput, beam_sample, beam_search, group_beam_search
from jaxsample.decoding.constrained import constrained_beam_search
from jaxsample.decoding.constraints import Constraint
from jaxsample.decoding.contrastive import contrastive_search
from jaxsample.decoding.dispatch import DecodeRequest, run_request
from jaxsample.decoding.dola import dola_generate
from jaxsample.decoding.generate import generate
from jaxsample.decoding.jump_forward import jump_forward_generate
from jaxsample.decoding.lookup import prompt_lookup_generate
from jaxsample.decoding.loop import GenerateOutput
from jaxsample.decoding.model import BIGRAM, DecodingModel, EarlyExit, Model, StepOutput
from jaxsample.decoding.options import DecodingOptions
from jaxsample.decoding.rank import RankedOutput, sample_and_rank
from jaxsample.decoding.speculative import SpeculativeOutput, speculative_generate
from jaxsample.decoding.stream import StreamChunk, stream
from jaxsample.decoding.toy import TinyDecoder

__all__ = sorted([
    "BIGRAM",
    "BeamOutput",
    "Constraint",
    "DecodeRequest",
    "DecodingModel",
    "DecodingOptions",
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
    "as_model",
    "beam_sample",
    "beam_search",
    "constrained_beam_search",
    "contrastive_search",
    "dola_generate",
    "from_function",
    "from_gemma",
    "from_nnx",
    "from_shared_index",
    "generate",
    "group_beam_search",
    "jump_forward_generate",
    "prompt_lookup_generate",
    "run_request",
    "sample_and_rank",
    "speculative_generate",
    "stream",
])
