"""Stage for structured generation (regex / JSON schema / GBNF grammars compiled to device tables)."""

from __future__ import annotations

from jaxsample.chain import Stage, cached
from jaxsample.structured.stage import grammar_stage as _grammar_stage


@cached
def grammar(*, name: str = "grammar") -> Stage:
    """Grammar masking; bind grammars per row with :func:`jaxsample.structured.constrain`.

    Rows without a grammar pass through unchanged.
    """
    return _grammar_stage(name=name)
