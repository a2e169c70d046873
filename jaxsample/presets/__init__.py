"""Builders that speak each ecosystem's vocabulary and reproduce its default stage order.

* :func:`llama_cpp` / :func:`llama_cpp_args`: ``common_params_sampling`` fields or CLI flags;
* :func:`vllm` / :func:`vllm_batch`: a ``SamplingParams`` object, dict or fields (one structure for
  every request);
* :func:`hf`: a ``GenerationConfig`` object, dict, ``generation_config.json`` path or fields
  (processors exist only when enabled, as in HF);
* :func:`scenario`: the task presets of the seed table (code, technical writing, creative, chat,
  brainstorming);
* :func:`recipe`: the seed table's sample-and-rank recipes (Meena, LaMDA) with their strategy settings.

Each returns a :class:`Preset`: a :class:`jaxsample.Sampler` (static structure) plus the values of
the configuration, so configurations differing only in values share one compilation, and (for
vLLM and HF configs) ``request``: the request-level fields (budgets, EOS / pad ids, beams, ``n``,
log-probs, stop strings) that :class:`jaxsample.decoding.DecodeRequest` maps to a strategy call.
"""

from jaxsample.presets._preset import Preset, stack
from jaxsample.presets.hf import SAMPLER_FIELDS as HF_SAMPLER_FIELDS
from jaxsample.presets.hf import hf
from jaxsample.presets.llama_cpp import DEFAULT_SAMPLERS, llama_cpp, llama_cpp_args
from jaxsample.presets.vllm import SAMPLER_FIELDS as VLLM_SAMPLER_FIELDS
from jaxsample.presets.recipes import RECIPES, Recipe, recipe
from jaxsample.presets.vllm import vllm, vllm_batch

#: Task presets (temperature / top-k / top-p) from the vLLM sampling guide in the project's seeds.
SCENARIOS = {
    "code": dict(temperature=0.0),
    "technical_writing": dict(temperature=0.3, top_p=0.9),
    "creative": dict(temperature=0.8, top_k=50, top_p=0.95),
    "chat": dict(temperature=0.7, top_k=40, top_p=0.9),
    "brainstorming": dict(temperature=1.2, top_p=0.95),
}


def scenario(name: str, **overrides) -> Preset:
    """A task preset (see :data:`SCENARIOS`) as a vLLM-style chain; ``overrides`` are vLLM fields.

    >>> scenario("chat").values["top_k"]
    40
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose one of {sorted(SCENARIOS)}")
    return vllm(**{**SCENARIOS[name], **overrides})


__all__ = [
    "DEFAULT_SAMPLERS",
    "HF_SAMPLER_FIELDS",
    "Preset",
    "RECIPES",
    "Recipe",
    "SCENARIOS",
    "VLLM_SAMPLER_FIELDS",
    "hf",
    "llama_cpp",
    "llama_cpp_args",
    "recipe",
    "scenario",
    "stack",
    "vllm",
    "vllm_batch",
]
