"""Stage for structured generation (regex / JSON schema / GBNF grammars compiled to device tables)."""

from __future__ import annotations

from jaxsample.chain import Stage, cached
from jaxsample.structured.stage import grammar_stage as _grammar_stage


@cached
def grammar(*, name: str = "grammar") -> Stage:
    """Grammar masking; bind grammars to rows with :func:`jaxsample.structured.grammar_params`.

    Reads the shared parameter ``f"{name}_tables"`` and the per-row ``f"{name}_grammar"`` (``-1``:
    unconstrained, passed through unchanged).
    """
    return _grammar_stage(name=name)
