"""jaxsample: every llama.cpp, vLLM and HuggingFace sampler as a pure, jit-compiled JAX function.

Conventions (``docs/conventions.md``): logits ``[..., V]`` in, same shape out, removed tokens at
``-inf``; per-row parameters are traced arrays; randomness only through explicit keys; no sort over
the vocabulary on default paths. Chains of stages with explicit state live in :mod:`jaxsample.chain`
(factories in :mod:`jaxsample.stages`, ecosystem builders in :mod:`jaxsample.presets`).
"""

from jaxsample import decoding, stages, structured
# Former module paths, kept as aliases; loaded first so the functions below rebind `mirostat` and `temperature`.
from jaxsample import bias, cutoffs, mirostat, processors, selection, temperature, truncation  # noqa: F401
from jaxsample.chain import Param, Sampler, SamplerState, Selector, Stage, StepInfo, chain
from jaxsample.constraints import allowed_tokens, ignore_eos, logit_bias, suppress_tokens, suppress_tokens_at_begin
from jaxsample.dry import dry, dry_sequence_breakers
from jaxsample.guidance import classifier_free_guidance, classifier_free_guidance_logits
from jaxsample.infill import InfillTable, infill, infill_table, infill_table_from_tokenizer, token_pieces
from jaxsample.lengths import exponential_decay_length_penalty, forced_bos, forced_eos, min_tokens
from jaxsample.logprobs import TopLogprobs, compute_logprobs, gather_logprobs, step_logprobs, top_logprobs
from jaxsample.ngram import bad_words, encoder_no_repeat_ngram, no_repeat_ngram, sequence_bias
from jaxsample.normalization import log_softmax, remove_inf_nan
from jaxsample.penalties import encoder_repetition_penalty, penalties
from jaxsample.samplers.adaptive_p import AdaptivePState, adaptive_p, adaptive_p_init
from jaxsample.samplers.categorical import categorical
from jaxsample.samplers.epsilon_cutoff import epsilon_cutoff
from jaxsample.samplers.eta_cutoff import eta_cutoff
from jaxsample.samplers.greedy import greedy
from jaxsample.samplers.min_p import min_p
from jaxsample.samplers.mirostat import mirostat, mirostat_v2
from jaxsample.samplers.p_less import p_less
from jaxsample.samplers.temperature import dynamic_temperature, temperature
from jaxsample.samplers.top_h import top_h
from jaxsample.samplers.top_k import top_k
from jaxsample.samplers.top_n_sigma import top_n_sigma
from jaxsample.samplers.top_p import top_p
from jaxsample.samplers.typical import typical
from jaxsample.samplers.xtc import xtc
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
from jaxsample.token_ids import token_mask
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
