"""Stage factories: every functional sampler as a chain stage, same name as the function.

Each factory fixes static configuration and the *default* of each per-row parameter; actual values
are passed per call through ``params`` (see :class:`jaxsample.chain.Sampler`).
"""

from __future__ import annotations

from jaxsample import selection
from jaxsample import temperature as _temperature
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import Param, Selector, Stage, stateless


def temperature(default: float = 1.0, *, name: str = "temperature") -> Stage:
    """:func:`jaxsample.temperature` reading ``params['temperature']``."""
    return stateless(name, _temperature.temperature, (Param("temperature", default),))


def dynamic_temperature(
    default: float = 1.0, delta: float = 0.0, exponent: float = 1.0, *, name: str = "temperature"
) -> Stage:
    """llama.cpp ``temp_ext`` reading ``temperature``, ``dynatemp_range``, ``dynatemp_exponent``."""
    return stateless(
        name,
        _temperature.dynamic_temperature,
        (
            Param("temperature", default),
            Param("dynatemp_range", delta),
            Param("dynatemp_exponent", exponent, lo=0.0),
        ),
    )


def greedy() -> Selector:
    """Selector taking the first maximal logit."""
    return Selector("greedy", lambda x, s, p, info: (selection.greedy(x), s))


def categorical(*, candidates: int = DEFAULT_CANDIDATES) -> Selector:
    """Selector drawing from ``softmax(logits)`` with the row's per-step key (llama.cpp ``dist``)."""
    return Selector("dist", lambda x, s, p, info: (selection.categorical(info.key, x, candidates=candidates), s))


# --- structured (issue #6) ---
from jaxsample.structured.stage import grammar_stage as _grammar_stage  # noqa: E402


def grammar(*, name: str = "grammar") -> Stage:
    """Grammar masking (regex / JSON schema / GBNF); bind grammars per row with
    :func:`jaxsample.structured.constrain`. Rows without a grammar pass through."""
    return _grammar_stage(name=name)


# --- end structured ---
