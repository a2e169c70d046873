"""The :class:`Preset` type shared by the ecosystem builders, and batching of presets per row."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from jaxsample.chain import Sampler


class Preset(NamedTuple):
    """A sampler structure plus the parameter values of one configuration.

    The :class:`~jaxsample.chain.Sampler` holds only static structure (which stages, in which order,
    window sizes), so configurations that differ only in values share one sampler and one
    compilation; ``values`` carries those values.

    >>> from jaxsample import presets
    >>> p = presets.vllm(temperature=0.7, top_p=0.9)
    >>> round(float(p.params((2,))["top_p"][1]), 6)
    0.9
    """

    sampler: Sampler
    values: dict[str, Any]
    #: keyword arguments of the decoding strategy the configuration selects (``{}``: any strategy),
    #: e.g. ``{"dola_layers": "high"}`` for ``decoding.dola_generate`` or ``{"constraints": ...}``
    #: for ``decoding.constrained_beam_search``.
    strategy: dict[str, Any] = {}

    def params(self, batch_shape: tuple[int, ...] = (), **overrides) -> dict:
        """``sampler.params`` with this configuration's values, then ``overrides``."""
        return self.sampler.params(batch_shape, **{**self.values, **overrides})


def stack(presets: Sequence[Preset]) -> Preset:
    """One preset whose values give row ``i`` the configuration of ``presets[i]`` (a mixed batch).

    All presets must share the same sampler structure (true for every vLLM configuration, and for
    llama.cpp / HF configurations that enable the same stages and windows).

    Raises:
      ValueError: if the structures differ.
    """
    presets = list(presets)
    if not presets:
        raise ValueError("stack needs at least one preset")
    first = presets[0].sampler
    for i, p in enumerate(presets[1:], start=1):
        if p.strategy != presets[0].strategy:
            raise ValueError(f"preset {i} selects a different decoding strategy than preset 0 "
                             f"({p.strategy} vs {presets[0].strategy})")
        if p.sampler != first:
            raise ValueError(
                f"preset {i} has a different sampler structure than preset 0 (stages "
                f"{[s.name for s in p.sampler.stages]} vs {[s.name for s in first.stages]}); "
                "enable the same stages in every configuration"
            )
    specs = first.param_specs()
    values: dict[str, Any] = {}
    for name in sorted({k for p in presets for k in p.values}):
        rows = [p.values.get(name, specs[name].default) for p in presets]
        if specs[name].capacity is None:
            values[name] = np.asarray(rows, dtype=np.dtype(specs[name].dtype))
        else:
            values[name] = [list(np.atleast_1d(np.asarray(r)).tolist()) for r in rows]
    return Preset(first, values, presets[0].strategy)
