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

# --- truncation filters and adaptive selectors (branch `truncation`) ---
from jaxsample.cutoffs import epsilon_cutoff, eta_cutoff, p_less, xtc  # noqa: E402
from jaxsample.mirostat import AdaptivePState, adaptive_p, adaptive_p_init, mirostat, mirostat_v2  # noqa: E402
from jaxsample.truncation import min_p, top_h, top_k, top_n_sigma, top_p, typical  # noqa: E402

__all__ = sorted(__all__ + [
    "AdaptivePState",
    "adaptive_p",
    "adaptive_p_init",
    "epsilon_cutoff",
    "eta_cutoff",
    "min_p",
    "mirostat",
    "mirostat_v2",
    "p_less",
    "top_h",
    "top_k",
    "top_n_sigma",
    "top_p",
    "typical",
    "xtc",
])
