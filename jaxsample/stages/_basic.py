"""Stages for temperature and the two basic selectors."""

from __future__ import annotations

from jaxsample import _forms, _validate, selection
from jaxsample.temperature import dynamic_temperature as _dynamic_temperature
from jaxsample.temperature import temperature as _temperature
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import Form, Param, Selector, Stage, cached, stateless


@cached
def temperature(default: float = 1.0, *, name: str = "temperature") -> Stage:
    """:func:`jaxsample.temperature` reading ``params['temperature']``."""
    form = Form(lambda c, s, p, info: (_forms.temperature(c, p["temperature"]), s))
    return stateless(name, _temperature, (Param("temperature", default),), form=form, nan_free=True)


@cached
def dynamic_temperature(
    default: float = 1.0, delta: float = 0.0, exponent: float = 1.0, *, name: str = "temperature"
) -> Stage:
    """llama.cpp ``temp_ext`` reading ``temperature``, ``dynatemp_range``, ``dynatemp_exponent``."""
    form = Form(  # rows with delta <= 0 are plain temperature
        lambda c, s, p, info: (_forms.temperature(c, p["temperature"]), s), handles=lambda p: p["dynatemp_range"] <= 0
    )
    return stateless(
        name,
        _dynamic_temperature,
        (
            Param("temperature", default),
            Param("dynatemp_range", delta),
            Param("dynatemp_exponent", exponent, lo=0.0),
        ),
        form=form,
        nan_free=True,
    )


@cached
def greedy() -> Selector:
    """Selector taking the first maximal logit."""
    return Selector("greedy", lambda x, s, p, info: (selection.greedy(x), s), form=lambda c, s, p, info: (_forms.greedy(c), s))


@cached
def categorical(*, candidates: int = DEFAULT_CANDIDATES) -> Selector:
    """Selector drawing from ``softmax(logits)`` with the row's per-step key (llama.cpp ``dist``)."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    return Selector(
        "dist",
        lambda x, s, p, info: (selection.categorical(info.key, x, candidates=candidates), s),
        form=lambda c, s, p, info: (_forms.categorical(info.key, c), s),
    )

