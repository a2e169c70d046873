"""Stages for temperature and the two basic selectors."""

from __future__ import annotations

from jaxsample import selection
from jaxsample.temperature import dynamic_temperature as _dynamic_temperature
from jaxsample.temperature import temperature as _temperature
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import Param, Selector, Stage, cached, stateless


@cached
def temperature(default: float = 1.0, *, name: str = "temperature") -> Stage:
    """:func:`jaxsample.temperature` reading ``params['temperature']``."""
    return stateless(name, _temperature, (Param("temperature", default),))


@cached
def dynamic_temperature(
    default: float = 1.0, delta: float = 0.0, exponent: float = 1.0, *, name: str = "temperature"
) -> Stage:
    """llama.cpp ``temp_ext`` reading ``temperature``, ``dynatemp_range``, ``dynatemp_exponent``."""
    return stateless(
        name,
        _dynamic_temperature,
        (
            Param("temperature", default),
            Param("dynatemp_range", delta),
            Param("dynatemp_exponent", exponent, lo=0.0),
        ),
    )


@cached
def greedy() -> Selector:
    """Selector taking the first maximal logit."""
    return Selector("greedy", lambda x, s, p, info: (selection.greedy(x), s))


@cached
def categorical(*, candidates: int = DEFAULT_CANDIDATES) -> Selector:
    """Selector drawing from ``softmax(logits)`` with the row's per-step key (llama.cpp ``dist``)."""
    return Selector("dist", lambda x, s, p, info: (selection.categorical(info.key, x, candidates=candidates), s))

