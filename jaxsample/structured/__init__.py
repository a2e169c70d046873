"""Structured generation on the device: regex / JSON schema / GBNF constraints as jit-side tables.

Every established engine computes the allowed-token mask on the host each step. Here a constraint
is compiled once on the host (expression tree -> minimal byte DFA -> token-level DFA over token
equivalence classes, with dead-end pruning) into small tables that live on the device; in the
decode loop masking and state updates are gathers. See ``docs/structured.md``.

>>> from jaxsample import structured
>>> v = structured.Vocabulary.from_pieces(["<eos>", "1", "2", "12", "x"], kind="raw", special_ids=[0], eos_ids=[0])
>>> g = structured.compile_regex(r"[0-9]{2}", v)
>>> g.allowed(g.start).tolist()
[False, True, True, True, False]
"""

from jaxsample.structured import grammar_cache
from jaxsample.structured.automaton import ByteDFA, EmptyLanguageError, GrammarError
from jaxsample.structured.compiler import (
    compile_choice,
    compile_expression,
    compile_gbnf,
    compile_json,
    compile_json_schema,
    compile_regex,
)
from jaxsample.structured.matcher import Matcher
from jaxsample.structured.pushdown import DEFAULT_MAX_DEPTH, Grammar
from jaxsample.structured.grammar_cache import same_grammar
from jaxsample.structured.stage import forced_tokens, grammar_params, grammar_stage, is_dead
from jaxsample.structured.tables import (
    GrammarState,
    Tables,
    advance,
    allowed,
    bucket,
    forced_token,
    initial_state,
    is_accepting,
    mask,
    nbytes,
    stack,
)
from jaxsample.structured.tokens import TokenGrammar
from jaxsample.structured.triggers import TriggerTables, lazy_grammar_stage, trigger_params
from jaxsample.structured.vocab import Vocabulary

__all__ = sorted([
    "ByteDFA",
    "DEFAULT_MAX_DEPTH",
    "Grammar",
    "GrammarState",
    "Matcher",
    "EmptyLanguageError",
    "GrammarError",
    "Tables",
    "TokenGrammar",
    "TriggerTables",
    "Vocabulary",
    "advance",
    "allowed",
    "bucket",
    "compile_choice",
    "compile_expression",
    "compile_gbnf",
    "compile_json",
    "compile_json_schema",
    "compile_regex",
    "forced_token",
    "forced_tokens",
    "grammar_cache",
    "grammar_params",
    "grammar_stage",
    "initial_state",
    "is_accepting",
    "is_dead",
    "lazy_grammar_stage",
    "mask",
    "nbytes",
    "same_grammar",
    "stack",
    "trigger_params",
])
