"""One call from a constraint to a :class:`~jaxsample.structured.tokens.TokenGrammar` for a vocabulary.

>>> from jaxsample.structured.vocab import Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "yes", "no", "y", "es"], kind="raw", special_ids=[0], eos_ids=[0])
>>> g = compile_choice(["yes", "no"], v)
>>> g.allowed(g.start).tolist(), g.allowed(g.walk([3, 4])).tolist()
([False, True, True, True, False], [True, False, False, False, False])
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import sys
from typing import Any, Callable, Sequence

from jaxsample.structured import automaton, effects, gbnf, json_schema, pushdown, regex, tokens
from jaxsample.structured.grammar_cache import cached_compile
from jaxsample.structured.tokens import TokenGrammar
from jaxsample.structured.vocab import Vocabulary


@contextlib.contextmanager
def _collector_paused():
    """Pauses Python's cyclic garbage collector during a compile.

    Compiling allocates many small container objects (NFA edges, state sets) that are not
    garbage; each automatic collection then rescans the whole heap, which is large once JAX is
    loaded (measured: up to half of a compile's time, and most of its variance).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compile_expression(expr, vocab: Vocabulary) -> TokenGrammar:
    """Token grammar of an expression tree (see :mod:`~jaxsample.structured.automaton`) or of a
    recursive :class:`~jaxsample.structured.pushdown.Grammar` (a pushdown automaton)."""
    with _collector_paused():
        return token_grammar(automaton.compile_expr(expr), vocab)


def token_grammar(byte_automaton, vocab: Vocabulary) -> TokenGrammar:
    """Token grammar of a byte automaton: a :class:`~jaxsample.structured.automaton.ByteDFA` or a
    :class:`~jaxsample.structured.pushdown.Pushdown` (its token effects)."""
    if isinstance(byte_automaton, pushdown.Pushdown):
        return effects.build(byte_automaton, vocab)
    return tokens.build(byte_automaton, vocab)


@cached_compile("regex", "pattern")
def compile_regex(pattern: str, vocab: Vocabulary) -> TokenGrammar:
    """Outputs that fully match ``pattern`` (see :mod:`~jaxsample.structured.regex` for the syntax).

    Raises:
      GrammarError: unsupported construct, syntax error, or a pattern matching nothing
        (:class:`~jaxsample.structured.automaton.EmptyLanguageError`).
    """
    return compile_expression(regex.parse_regex(pattern), vocab)


@contextlib.contextmanager
def _deep_recursion(limit: int = 20_000):
    """Raises Python's recursion limit during a compile: expression trees of large schemas nest deeply
    (an object's properties are a chain of alternatives), and the NFA builder recurses along them."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


#: What :func:`compile_json_schema` retries with, in order, when a schema exceeds a state budget;
#: each is a subset of the default language (references as stack calls: the same language up to
#: ``max_depth`` nested calls; discriminators first: unions of objects choose their branch at their
#: first member; schema order: one property order of each object).
BUDGET_FALLBACKS = ({"ref_calls": True}, {"discriminator_first": True}, {"discriminator_first": True, "ref_calls": True},
                    {"property_order": "schema"}, {"property_order": "schema", "ref_calls": True})  # fmt: skip


#: A schema that no fallback fits within the budgets is compiled once more with its own options and
#: the fallbacks that exceeded the DFA budget, with ``MAX_DFA_STATES`` times this (the subset
#: construction of open objects in unions makes several times the states it minimises to: sample
#: schemas of 7k-15k final states pass 60k on the way).
LAST_RESORT_DFA_SCALE = 2.5


#: ``inline_generic`` of the retries, in turn, when a union's generic value and typed container meet on
#: one byte (a deeper level where they meet needs more inline levels).
INLINE_GENERIC = (3, 6)


def _ambiguity_retries(options: dict) -> list[dict]:
    """What an ambiguous pushdown automaton is compiled again with, in turn: each ``inline_generic`` of
    :data:`INLINE_GENERIC` (none if one is given), then the same without ``value_calls`` (property
    values inlined again: the object may then keep schema order or exceed a state budget)."""
    depths = [] if options.get("inline_generic") else [{"inline_generic": d} for d in INLINE_GENERIC]
    out = [{**options, **d} for d in depths]
    if options.get("value_calls"):
        out += [{**options, "value_calls": False, **d} for d in [{}, *depths]]
    return out


def _has_keyword(schema, keyword: str) -> bool:
    """Whether ``keyword`` occurs anywhere in the schema (values of ``enum``/``const`` aside)."""
    todo = [schema]
    while todo:
        s = todo.pop()
        if isinstance(s, dict):
            if keyword in s:
                return True
            todo.extend(v for k, v in s.items() if k not in ("enum", "const", "examples", "default"))
        elif isinstance(s, list):
            todo.extend(s)
    return False


def _explicit(options: dict) -> bool:
    """Whether the options ask for a form the fallbacks would choose (then compiled as asked)."""
    return any(options.get(k) for k in ("ref_calls", "discriminator_first", "value_calls")) or \
        options.get("property_order", "any") != "any"  # fmt: skip


def _fallbacks(schema, options: dict, nfa: bool = False) -> list[dict]:
    """The :data:`BUDGET_FALLBACKS` that can change the result (``ref_calls`` only with a ``$ref``,
    ``discriminator_first`` only with a union; none for explicit ``ref_calls``, ``discriminator_first``,
    ``value_calls`` or schema order), after the key register where ``"auto"``; with ``nfa`` (the
    schema's own expression exceeded the NFA budget: its inlined references, mostly) those with
    ``ref_calls`` before the other ones, which inline them too."""
    if _explicit(options):
        return []
    refs, unions = _has_keyword(schema, "$ref"), _has_keyword(schema, "anyOf") or _has_keyword(schema, "oneOf")
    register = options.get("key_register", json_schema.KEY_REGISTER) == "auto" and _has_keyword(schema, "properties")
    chain = sorted(BUDGET_FALLBACKS, key=lambda f: not f.get("ref_calls")) if nfa else BUDGET_FALLBACKS
    return [{**options, **f} for f in [{"key_register": True}] * register + list(chain)
            if (refs or not f.get("ref_calls")) and (unions or not f.get("discriminator_first"))]


@cached_compile("json_schema", "schema", source_is_json=True, options_of=json_schema.schema_expr)
def compile_json_schema(schema: Any, vocab: Vocabulary, **options) -> TokenGrammar:
    """JSON documents valid under ``schema``; ``options`` as :func:`~jaxsample.structured.json_schema.schema_expr`.

    A schema that exceeds a state budget (:class:`~jaxsample.structured.automaton.BudgetError`)
    with the default ``property_order="any"``, ``ref_calls=False``, ``discriminator_first=False`` and
    ``value_calls=False`` is compiled again with the :data:`BUDGET_FALLBACKS` in turn, after the key
    register (``key_register=True``, when the option is ``"auto"``, the default, and the schema has
    ``properties``: the same language in fewer states) (references as stack calls, then
    discriminators first, without and with calls, then every object in schema order, without and
    with calls; those with calls first where the schema's own expression exceeded the NFA budget,
    its inlined references being what is large): the first that fits is returned. Where none does,
    the schema's own options and the fallbacks that exceeded the DFA budget (not the NFA budget) once
    more, in that order, with :data:`LAST_RESORT_DFA_SCALE` times the DFA budget (not for explicit
    ``ref_calls``, ``discriminator_first``, ``value_calls`` or schema order), else the first budget
    error. Options that come to an attempt made before (``"auto"`` may have chosen the register
    already) are not compiled twice. A schema whose pushdown automaton cannot choose between a
    generic value and a typed container of another union branch
    (:class:`~jaxsample.structured.pushdown.AmbiguousCallError`) is first compiled again with each
    ``inline_generic`` of :data:`INLINE_GENERIC` in turn (the same language), then without
    ``value_calls`` (see :func:`_ambiguity_retries`).
    """
    if isinstance(schema, (str, bytes)):
        schema = json.loads(schema)
    with _collector_paused():
        return first_fit(schema, options, _SchemaAttempts(schema, vocab))


class _SchemaAttempts:
    """:func:`compile_json_schema`'s attempt, ``options -> TokenGrammar``, remembering failures: options
    that, filled in and with ``key_register="auto"`` resolved, equal those of an attempt that failed
    under the same state budgets fail again at once with its error (the register fallback asks for
    what ``"auto"`` may have chosen already; the chain without the register meets attempts it made)."""

    def __init__(self, schema, vocab: Vocabulary):
        self.schema, self.vocab = schema, vocab
        self.failed: dict = {}

    def __call__(self, options: dict) -> TokenGrammar:
        budgets = automaton.budgets(None, None)
        keys = [(_frozen(json_schema.schema_options(**options)), budgets)]
        if keys[0] in self.failed:
            raise self.failed[keys[0]]
        try:
            expr, used = json_schema.schema_expr_and_options(self.schema, **options)
            keys.append((_frozen(used), budgets))
            return compile_expression(expr, self.vocab)
        except automaton.GrammarError as err:
            self.failed.update(dict.fromkeys(keys, automaton.detached(err)))
            raise


def _frozen(options: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def first_fit(schema: Any, options: dict, attempt: Callable[[dict], Any]) -> Any:
    """``attempt(options)`` retried as :func:`compile_json_schema` retries (see :func:`_first_fit`); where
    objects recording their keys meet a construct the key register cannot follow
    (:class:`~jaxsample.structured.pushdown.KeyRegisterError`), all of it again without the register."""
    try:
        return _first_fit(schema, options, attempt)
    except pushdown.KeyRegisterError:
        if options.get("key_register", json_schema.KEY_REGISTER) is False:
            raise
        return _first_fit(schema, {**options, "key_register": False}, attempt)


def _first_fit(schema: Any, options: dict, attempt: Callable[[dict], Any]) -> Any:
    """``attempt(options)``, retried as :func:`compile_json_schema` retries: on an
    :class:`~jaxsample.structured.pushdown.AmbiguousCallError` with each of :func:`_ambiguity_retries`,
    then on a :class:`~jaxsample.structured.automaton.BudgetError` with each of :func:`_fallbacks`,
    then (options not explicit) those of them that failed on the DFA budget (not the NFA budget's:
    the NFA would be the same) again, in the same order, with :data:`LAST_RESORT_DFA_SCALE` times the
    DFA budget; the first result, else the first error. ``attempt`` builds from the options (a token
    grammar, or anything else built the same way, e.g. the byte automaton with it)."""
    with _deep_recursion():
        try:
            return _unambiguous(options, attempt)
        except automaton.BudgetError as err:
            err, nfa = automaton.detached(err), isinstance(err, automaton.NFABudgetError)
            larger = [] if nfa else [lambda: _unambiguous(options, attempt)]
            for fallback in _fallbacks(schema, options, nfa=nfa):
                try:
                    return attempt(fallback)
                except automaton.NFABudgetError:
                    continue
                except automaton.BudgetError:
                    larger.append(functools.partial(attempt, fallback))
                except automaton.GrammarError:
                    continue
            if _explicit(options):
                raise err
            with automaton.dfa_budget_scaled(LAST_RESORT_DFA_SCALE):  # the last resort
                for retry in larger:
                    try:
                        return retry()
                    except automaton.GrammarError:
                        continue
            raise err from None


def _unambiguous(options: dict, attempt: Callable[[dict], Any]) -> Any:
    """``attempt(options)``, on an :class:`~jaxsample.structured.pushdown.AmbiguousCallError` each of
    :func:`_ambiguity_retries` in turn; the first result, else the last ambiguity error."""
    try:
        return attempt(options)
    except pushdown.AmbiguousCallError as err:
        ambiguous = automaton.detached(err)
        for retry in _ambiguity_retries(options):
            try:
                return attempt(retry)
            except pushdown.AmbiguousCallError as again:
                ambiguous = automaton.detached(again)
        raise ambiguous


def compile_json(vocab: Vocabulary, *, max_depth: int = pushdown.DEFAULT_MAX_DEPTH, whitespace: str = "bounded") -> TokenGrammar:
    """Any JSON value with containers nested at most ``max_depth`` deep (JSON mode).

    Containers are a recursive rule on the device stack: the outermost is free, each one inside it
    takes a frame (the tables' stack limit is ``max_depth - 1``).

    Raises:
      ValueError: if ``max_depth < 1``.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return compile_json_schema(True, vocab, max_depth=max_depth - 1, whitespace=whitespace)


@cached_compile("gbnf", "text", options_of=gbnf.parse_gbnf)
def compile_gbnf(text: str, vocab: Vocabulary, **options) -> TokenGrammar:
    """Strings of a GBNF grammar; ``options`` as :func:`~jaxsample.structured.gbnf.parse_gbnf`."""
    with _collector_paused():
        return compile_expression(gbnf.parse_gbnf(text, **options), vocab)


@cached_compile("choice", "options")
def compile_choice(options: Sequence[str], vocab: Vocabulary) -> TokenGrammar:
    """Exactly one of the given strings.

    Raises:
      ValueError: on an empty list.
    """
    if not options:
        raise ValueError("compile_choice needs at least one option")
    return compile_expression(automaton.alt(*(automaton.lit(o) for o in options)), vocab)
