"""jaxsample: every llama.cpp, vLLM and HuggingFace sampler as a pure, jit-compiled JAX function.

Conventions (see ``docs/conventions.md``): logits ``[..., V]`` in, same shape out, removed tokens at
``-inf``; per-row parameters are traced arrays; randomness only through explicit keys.
"""

from jaxsample import stages
from jaxsample.chain import Param, Sampler, SamplerState, Selector, Stage, StepInfo, chain
from jaxsample.selection import categorical, greedy
from jaxsample.temperature import dynamic_temperature, temperature

__version__ = "0.1.0"

__all__ = sorted([
    "Param",
    "Sampler",
    "SamplerState",
    "Selector",
    "Stage",
    "StepInfo",
    "categorical",
    "chain",
    "dynamic_temperature",
    "greedy",
    "stages",
    "temperature",
])

# --- processors: token constraints, lengths, infill, guidance, logprobs (branch `processors`) ---------------
from jaxsample.bias import (  # noqa: E402
    allowed_tokens,
    ignore_eos,
    logit_bias,
    suppress_tokens,
    suppress_tokens_at_begin,
)
from jaxsample.guidance import classifier_free_guidance, classifier_free_guidance_logits  # noqa: E402
from jaxsample.infill import (  # noqa: E402
    InfillTable,
    infill,
    infill_table,
    infill_table_from_tokenizer,
    token_pieces,
)
from jaxsample.lengths import exponential_decay_length_penalty, forced_bos, forced_eos, min_tokens  # noqa: E402
from jaxsample.logprobs import (  # noqa: E402
    TopLogprobs,
    compute_logprobs,
    gather_logprobs,
    step_logprobs,
    top_logprobs,
)
from jaxsample.processors import log_softmax, remove_inf_nan, token_mask  # noqa: E402

__all__ = sorted(__all__ + [
    "InfillTable",
    "TopLogprobs",
    "allowed_tokens",
    "classifier_free_guidance",
    "classifier_free_guidance_logits",
    "compute_logprobs",
    "exponential_decay_length_penalty",
    "forced_bos",
    "forced_eos",
    "gather_logprobs",
    "ignore_eos",
    "infill",
    "infill_table",
    "infill_table_from_tokenizer",
    "log_softmax",
    "logit_bias",
    "min_tokens",
    "remove_inf_nan",
    "step_logprobs",
    "suppress_tokens",
    "suppress_tokens_at_begin",
    "token_mask",
    "token_pieces",
    "top_logprobs",
])
# --- end processors ------------------------------------------------------------------------------------------
# --- history-based processors (branch ``penalties``) ---
from jaxsample.dry import dry, dry_sequence_breakers  # noqa: E402
from jaxsample.ngram import bad_words, encoder_no_repeat_ngram, no_repeat_ngram, sequence_bias  # noqa: E402
from jaxsample.penalties import encoder_repetition_penalty, penalties  # noqa: E402

__all__ = sorted(__all__ + [
    "bad_words",
    "dry",
    "dry_sequence_breakers",
    "encoder_no_repeat_ngram",
    "encoder_repetition_penalty",
    "no_repeat_ngram",
    "penalties",
    "sequence_bias",
])
