"""jaxsample: every llama.cpp, vLLM and HuggingFace sampler as a pure, jit-compiled JAX function.

Conventions (see ``docs/conventions.md``): logits ``[..., V]`` in, same shape out, removed tokens at
``-inf``; per-row parameters are traced arrays; randomness only through explicit keys.
"""

from jaxsample import stages
from jaxsample.chain import Param, Sampler, SamplerState, Selector, Stage, StepInfo, chain
from jaxsample.selection import categorical, greedy
from jaxsample.temperature import dynamic_temperature, temperature

# --- decoding (issue #4) ---------------------------------------------------------------------
from jaxsample import decoding  # noqa: E402
# --- end decoding -----------------------------------------------------------------------------

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
    "decoding",
    "dynamic_temperature",
    "greedy",
    "stages",
    "temperature",
])
