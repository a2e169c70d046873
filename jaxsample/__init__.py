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
