"""Named decoding recipes of the seed table: a sampler preset plus the strategy settings around it.

* ``meena`` (Adiwardana et al., 2020, "Towards a Human-like Open-Domain Chatbot"): sample-and-rank,
  ``N = 20`` independent samples with plain random sampling at temperature ``T = 0.88``, the one
  with the highest log-likelihood kept (no length normalisation).
* ``lamda`` (Thoppilan et al., 2022): sample-and-rank, ``16`` independent samples with top-k 40
  (temperature 1), the most likely kept.

``jaxsample.decoding.sample_and_rank(model, params, prompt, **recipe("meena").kwargs(), ...)``
runs one; ``configs/decoding/meena.yaml`` and ``lamda.yaml`` are the same recipes for the
evaluation runner.

>>> r = recipe("meena")
>>> r.best_of, r.preset.values["temperature"]
(20, 0.88)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxsample.presets._preset import Preset
from jaxsample.presets.vllm import vllm


class Recipe(NamedTuple):
    """A sample-and-rank recipe: sampler preset, samples drawn and returned, ranking."""

    preset: Preset
    best_of: int
    n: int
    rank_by: str
    length_penalty: float

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`jaxsample.decoding.sample_and_rank` (sampler and values included)."""
        return dict(
            sampler=self.preset.sampler,
            sampler_params=dict(self.preset.values),
            n=self.n,
            best_of=self.best_of,
            rank_by=self.rank_by,
            length_penalty=self.length_penalty,
        )


#: name -> (vLLM sampler fields, best_of); both rank by raw log-likelihood, no length penalty.
RECIPES: dict[str, tuple[dict[str, Any], int]] = {
    "meena": (dict(temperature=0.88), 20),
    "lamda": (dict(temperature=1.0, top_k=40), 16),
}


def recipe(name: str, n: int = 1) -> Recipe:
    """The named recipe (see :data:`RECIPES`), returning the ``n`` best samples (default 1, as published)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    fields, best_of = RECIPES[name]
    if not 1 <= n <= best_of:
        raise ValueError(f"n must be in [1, {best_of}] for recipe {name!r}, got {n}")
    return Recipe(vllm(**fields), best_of, n, "raw", 0.0)
