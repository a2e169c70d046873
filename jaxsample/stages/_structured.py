"""Stage for structured generation (regex / JSON schema / GBNF grammars compiled to device tables)."""

from __future__ import annotations

from jaxsample.chain import Stage, cached
from jaxsample.structured.stage import grammar_stage as _grammar_stage
from jaxsample.structured.triggers import lazy_grammar_stage as _lazy_grammar_stage


@cached
def grammar(*, name: str = "grammar") -> Stage:
    """Grammar masking; bind grammars to rows with :func:`jaxsample.structured.grammar_params`.

    Reads the shared parameter ``f"{name}_tables"`` and the per-row ``f"{name}_grammar"`` (``-1``:
    unconstrained, passed through unchanged).
    """
    return _grammar_stage(name=name)


@cached
def lazy_grammar(*, name: str = "grammar", max_triggers: int = 8, max_trigger_bytes: int = 31) -> Stage:
    """Grammar masking that starts at a trigger (llama.cpp ``grammar_lazy`` / ``grammar_triggers``);
    bind rows with :func:`jaxsample.structured.trigger_params` (see :mod:`jaxsample.structured.triggers`).
    """
    return _lazy_grammar_stage(name=name, max_triggers=max_triggers, max_trigger_bytes=max_trigger_bytes)
