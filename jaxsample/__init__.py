"""jaxsample: every llama.cpp, vLLM and HuggingFace sampler as a pure, jit-compiled JAX function.

Conventions (see ``docs/conventions.md``): logits ``[..., V]`` in, same shape out, removed tokens at
``-inf``; per-row parameters are traced arrays; randomness only through explicit keys.
"""

from jaxsample import stages
# --- structured (issue #6) ---
from jaxsample import structured
# --- end structured ---
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
    "structured",  # structured (issue #6)
    "temperature",
])
