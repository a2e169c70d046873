"""jaxsample: every llama.cpp, vLLM and HuggingFace sampler as a pure, jit-compiled JAX function.

Conventions (``docs/conventions.md``): logits ``[..., V]`` in, same shape out, removed tokens at
``-inf``; per-row parameters are traced arrays; randomness only through explicit keys; no sort over
the vocabulary on default paths. Chains of stages with explicit state live in :mod:`jaxsample.chain`
(factories in :mod:`jaxsample.stages`, ecosystem builders in :mod:`jaxsample.presets`).
"""

from jaxsample import decoding, stages, structured
from jaxsample.bias import allowed_tokens, ignore_eos, logit_bias, suppress_tokens, suppress_tokens_at_begin
from jaxsample.chain import Param, Sampler, SamplerState, Selector, Stage, StepInfo, chain
from jaxsample.cutoffs import epsilon_cutoff, eta_cutoff, p_less, xtc
from jaxsample.dry import dry, dry_sequence_breakers
from jaxsample.guidance import classifier_free_guidance, classifier_free_guidance_logits
from jaxsample.infill import InfillTable, infill, infill_table, infill_table_from_tokenizer, token_pieces
from jaxsample.lengths import exponential_decay_length_penalty, forced_bos, forced_eos, min_tokens
from jaxsample.logprobs import TopLogprobs, compute_logprobs, gather_logprobs, step_logprobs, top_logprobs
from jaxsample.mirostat import AdaptivePState, adaptive_p, adaptive_p_init, mirostat, mirostat_v2
from jaxsample.ngram import bad_words, encoder_no_repeat_ngram, no_repeat_ngram, sequence_bias
from jaxsample.penalties import encoder_repetition_penalty, penalties
from jaxsample.processors import log_softmax, remove_inf_nan, token_mask
from jaxsample.selection import categorical, greedy
from jaxsample.temperature import dynamic_temperature, temperature
from jaxsample.synthid import (
    SynthIDConfig,
    SynthIDState,
    synthid_config,
    synthid_g_values,
    synthid_init,
    synthid_mask,
    synthid_mean_score,
    synthid_watermark,
    synthid_weighted_mean_score,
)
from jaxsample.truncation import min_p, top_h, top_k, top_n_sigma, top_p, typical
from jaxsample.watermark import WatermarkConfig, greenlist, watermark, watermark_config
from jaxsample.watermark_detection import WatermarkDetection, detect_watermark


__version__ = "0.1.0"

__all__ = [
    "AdaptivePState",
    "InfillTable",
    "Param",
    "Sampler",
    "SamplerState",
    "Selector",
    "Stage",
    "StepInfo",
    "SynthIDConfig",
    "SynthIDState",
    "TopLogprobs",
    "WatermarkConfig",
    "WatermarkDetection",
    "adaptive_p",
    "adaptive_p_init",
    "allowed_tokens",
    "bad_words",
    "categorical",
    "chain",
    "classifier_free_guidance",
    "classifier_free_guidance_logits",
    "compute_logprobs",
    "decoding",
    "detect_watermark",
    "dry",
    "dry_sequence_breakers",
    "dynamic_temperature",
    "encoder_no_repeat_ngram",
    "encoder_repetition_penalty",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "forced_bos",
    "forced_eos",
    "gather_logprobs",
    "greedy",
    "greenlist",
    "ignore_eos",
    "infill",
    "infill_table",
    "infill_table_from_tokenizer",
    "log_softmax",
    "logit_bias",
    "min_p",
    "min_tokens",
    "mirostat",
    "mirostat_v2",
    "no_repeat_ngram",
    "p_less",
    "penalties",
    "remove_inf_nan",
    "sequence_bias",
    "stages",
    "step_logprobs",
    "structured",
    "suppress_tokens",
    "suppress_tokens_at_begin",
    "synthid_config",
    "synthid_g_values",
    "synthid_init",
    "synthid_mask",
    "synthid_mean_score",
    "synthid_watermark",
    "synthid_weighted_mean_score",
    "temperature",
    "token_mask",
    "token_pieces",
    "top_h",
    "top_k",
    "top_logprobs",
    "top_n_sigma",
    "top_p",
    "typical",
    "watermark",
    "watermark_config",
    "xtc",
]
