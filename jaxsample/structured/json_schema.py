"""JSON Schema -> expression tree (then byte DFA and token tables), exactly or with a clear error.

The language compiled is always a subset of the schema's valid documents (outputs validate); where
it is smaller than the schema's, that is a documented *over-constraint*, never the opposite. What a
schema cannot be compiled to raises :class:`~jaxsample.structured.automaton.GrammarError` naming
the keyword and its JSON pointer (``err.keyword``, ``err.pointer``).

Supported (JSON Schema 2020-12, with drafts 4-2019 forms normalised by
:func:`~jaxsample.structured.schema_merge.normalise`):

* ``type``, ``enum``/``const`` (values also filtered by sibling keywords), ``true``/``false``/``{}``;
* ``allOf`` (merged, :func:`~jaxsample.structured.schema_merge.merge`), ``anyOf``, ``oneOf`` (branches
  proven disjoint on values, :mod:`~jaxsample.structured.schema_disjoint`, after removing the types
  two branches leave unconstrained and separating object branches by their required names; else an
  error), sibling keywords next to all three and next to
  ``$ref`` (draft 2019+; ignored in drafts 4-7, as those drafts say), local ``$ref`` (JSON pointers,
  ``$anchor``, ``$id``), ``not`` (of presence conditions, types, ``{}`` and string constraints);
* objects: ``properties`` in **any order** (``property_order="any"``, the JSON Schema meaning; each
  property at most once), ``required``, ``additionalProperties`` (``false``, ``true`` or a schema),
  ``patternProperties``, ``propertyNames``, ``minProperties``/``maxProperties``,
  ``dependentRequired``/``dependentSchemas``/``dependencies``, ``unevaluatedProperties``;
* arrays: ``items``, ``prefixItems`` (and tuple ``items``/``additionalItems``), ``minItems``/
  ``maxItems``, ``contains``/``minContains``, ``uniqueItems`` over finite item sets (enums,
  booleans, small integer ranges), ``unevaluatedItems``;
* strings: ``minLength``/``maxLength``, ``pattern`` (ECMAScript search semantics: unanchored unless
  ``^...$``), ``format`` (:mod:`~jaxsample.structured.formats`), any combination of them;
* numbers: ``minimum``/``maximum``/``exclusive*`` (exact decimals), ``multipleOf`` (exact decimal
  arithmetic, :func:`~jaxsample.structured.numbers.multiple_of`).

Over-constraints (outputs remain valid; some valid documents cannot be produced): objects with too
many property orders for ``max_order_states`` keep schema order (with ``value_calls``, unless
calling their large values makes any order fit); ``oneOf`` object branches not
proven disjoint never hold both branches' required names; with ``discriminator_first`` (a budget
fallback) a union's discriminating property comes first; an absent
``additionalProperties`` means closed unless ``open_objects=True`` (as XGrammar and llama.cpp);
a schema without ``type`` produces only the types its keywords imply unless ``untyped="any"``; bounded numbers have no
exponent; enum/const numbers are written as given (``1`` not ``1.0``); strings use canonical
escapes; recursion (a ``$ref`` cycle, the containers of ``{}``/``true`` values) nests at most
``max_depth`` frames on the device stack (a runtime parameter, see below); ``minProperties``
counts at most one additional property (their keys could repeat); format subsets
(:mod:`~jaxsample.structured.formats`).

Recursion is not unrolled: a schema reached again through ``$ref`` while it is being expanded
(a cycle), and the containers of generic values (``{}``/``true``, rule ``JSON_RULE``), are rules of a
:class:`~jaxsample.structured.pushdown.Grammar`, entered on the row's stack (one frame per nested
call; tail calls take none). :func:`schema_expr` then returns that grammar instead of an expression.

Whitespace (the JSON grammar's own freedom) follows ``whitespace`` (see :func:`schema_expr`).

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(schema_expr({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1},
...                               "s": {"type": "string"}}, "required": ["n"]}, whitespace="compact"))
>>> d.matches(b'{"n":12}'), d.matches(b'{"s":"x","n":1}'), d.matches(b'{"n":0}'), d.matches(b'{"n":1,"n":2}')
(True, True, False, False)
"""

from __future__ import annotations

import collections
import functools
import inspect
import json
import math
from typing import Any

from jaxsample.structured import dfa_ops, formats
from jaxsample.structured import regex as _regex
from jaxsample.structured import schema_merge as sm
from jaxsample.structured.automaton import (
    EMPTY,
    EPSILON,
    Alt,
    ByteDFA,
    Call,
    Chars,
    GrammarError,
    KeyOp,
    Repeat,
    Seq,
    alt,
    chars,
    compile_expr,
    lit,
    opt,
    repeat,
    seq,
    star,
)
from jaxsample.structured.json_objects import ObjectBuilder, RegisterWanted
from jaxsample.structured.json_text import (
    JSON_WS,
    STRING_BODY,
    STRING_CHAR,
    canonical_json,
    escape,
    json_encoded,
    names_dfa,
    search_dfa,
    search_expr,
)
from jaxsample.structured.numbers import integer_range, multiple_of, number_range, plain_decimals
from jaxsample.structured.pushdown import DEFAULT_MAX_DEPTH, Grammar
from jaxsample.structured.schema_disjoint import Disjoint
from jaxsample.structured.schema_merge import error

WHITESPACE_MODES = ("free", "compact", "bounded")
PROPERTY_ORDERS = ("any", "schema")
UNTYPED_MODES = ("implied", "any")
#: Most values an item set may have for ``uniqueItems`` (the array tracks the subset used).
MAX_UNIQUE_VALUES = 8
#: The recursive rule of generic JSON containers; other rules are named by their ``$ref`` (and siblings).
JSON_RULE = "$json"
ROOT_RULE = "$root"
#: Most times one ``$ref`` may be open on a path before its schema repeats exactly (then it is a call).
MAX_REF_NESTING = 16


def _is_type(value, t: str) -> bool:
    jt = sm.json_type(value)
    return jt == t or (t == "number" and jt == "integer")


# -------------------------------------------------------------------------------------- compiler
#: Key-register bits reserved per nesting level (see :meth:`_Compiler.key_bit`).
LEVEL_KEYS = 4096
#: The values of option ``key_register``, and its default.
KEY_REGISTER_MODES = (True, False, "auto")
KEY_REGISTER = "auto"


class _Compiler:
    def __init__(self, root, opts: dict, known: dict | None = None):
        self.root = root
        self.opts = opts
        ws_pattern = opts["whitespace_pattern"]
        mode = opts["whitespace"]
        if mode not in WHITESPACE_MODES:
            raise ValueError(f"whitespace must be one of {WHITESPACE_MODES}, got {mode!r}")
        if opts["property_order"] not in PROPERTY_ORDERS:
            raise ValueError(f"property_order must be one of {PROPERTY_ORDERS}, got {opts['property_order']!r}")
        if opts["untyped"] not in UNTYPED_MODES:
            raise ValueError(f"untyped must be one of {UNTYPED_MODES}, got {opts['untyped']!r}")
        if not (isinstance(opts["key_register"], bool) or opts["key_register"] == "auto"):
            raise ValueError(f"key_register must be one of {KEY_REGISTER_MODES}, got {opts['key_register']!r}")
        if opts["unknown_formats"] not in ("ignore", "error"):
            raise ValueError(f"unknown_formats must be 'ignore' or 'error', got {opts['unknown_formats']!r}")
        if ws_pattern is not None:
            self.ws = _regex.parse_regex(ws_pattern)
            if not dfa_ops.is_empty(dfa_ops.difference(compile_expr(self.ws), compile_expr(star(JSON_WS)))):
                raise ValueError(f"whitespace_pattern {ws_pattern!r} matches more than JSON whitespace [ \\t\\n\\r]*")
        elif mode == "compact":
            self.ws = EPSILON
        elif mode == "bounded":
            self.ws = opt(alt(lit(" "), seq(lit("\n"), repeat(chars(" \t"), 0, int(opts["max_whitespace"])))))
        else:
            self.ws = star(JSON_WS)
        seps = opts["separators"]
        if seps is not None:
            if len(seps) != 2:
                raise ValueError(f"separators must be (item, key) strings, got {seps!r}")
            for sep, mark in zip(seps, ",:"):
                if not isinstance(sep, str) or sep.strip(" \t\n\r") != mark:
                    raise ValueError(f"separators: {sep!r} must be {mark!r} with JSON whitespace around it")
            self.comma, self.colon = lit(seps[0]), lit(seps[1])
        else:
            self.comma, self.colon = seq(self.ws, lit(","), self.ws), seq(self.ws, lit(":"), self.ws)
        self.draft4to7 = isinstance(root, dict) and any(
            f"draft-0{n}" in str(root.get("$schema", "")) for n in (3, 4, 5, 6, 7)
        )
        self.active: set[str] = set()  # rules being expanded on this path
        self.open_refs: collections.Counter = collections.Counter()
        self.rules: dict[str, Any] = {}  # recursive rules (None while pending)
        self.pending: dict[str, tuple[Any, str]] = {}  # rule -> (schema, path) still to compile
        self._any = None
        self.level = 0  # document nesting of the value being compiled (containers entered)
        self.inline_until = 0  # generic values above this nesting are compiled inline (see any_value)
        self._inline: dict[int, Any] = {}
        self._sizes: dict[int, tuple[Any, int]] = {}
        self._entered: dict[tuple, Any] = {}  # (rule, context) -> its expression: a reference used twice is shared
        self._unmarked: dict[tuple, tuple] = {}  # (id(key), id(names)) -> (key, names, their difference)
        self._anchors = None
        self.string = seq(lit('"'), STRING_BODY, lit('"'))
        self.first = None  # (property, level): objects at that nesting write it first (see discriminator)
        self.key_names: dict[int, dict[str, int]] = {l: dict(n) for l, n in (known or {}).items()}  # level -> property -> its bit index
        self.known = known  # every level's property names, from a first pass (undeclared ones are marked too)
        self.open_levels: list[tuple[int, frozenset]] = []  # (level, names marked already) of objects reading undeclared or tracked keys
        self.in_rule = False  # compiling a called rule (no key register there: one register per row)
        self.key_ops = False  # whether an object emitted key-register ops (then a pushdown automaton)

    def keys_recorded(self) -> bool:
        """Whether objects here may use the key register (option ``key_register``, outside called rules)."""
        return self.opts["key_register"] is True and not self.in_rule

    def unmarked_key(self, key: ByteDFA, names: ByteDFA) -> dfa_ops.Automaton:
        """The keys ``key`` accepts that ``names`` does not, as an expression node (computed once per
        pair: an object entered in many places asks again with the same automata)."""
        hit = self._unmarked.get((id(key), id(names)))
        if hit is None or hit[0] is not key or hit[1] is not names:
            plain = dfa_ops.Automaton.of(dfa_ops.difference(key, names))
            hit = self._unmarked[id(key), id(names)] = (key, names, plain)
        return hit[2]

    def key_bit(self, name: str, path: str) -> int:
        """The key-register bit of property ``name`` at the current nesting: objects at one nesting
        share bits by name (union branches then record the same ops), nested objects use others.
        Each nesting has a block of :data:`LEVEL_KEYS` bits (the automaton keeps only those used)."""
        names = self.key_names.setdefault(self.level, {})
        i = names.setdefault(name, len(names))
        if i >= LEVEL_KEYS:
            raise error(path, "properties", f"more than {LEVEL_KEYS} property names at one nesting")
        return 1 << (self.level * LEVEL_KEYS + i)

    def unmarked(self) -> bool:
        """Whether an object recording its keys takes an undeclared key that another object at its
        nesting declares, or an object keeping the tracked-set form reads keys where others record
        theirs (the two would read the key with and without a mark: a second pass marks it)."""
        return self.known is None and any(self.key_names.get(l, {}).keys() - d for l, d in self.open_levels)

    def level_keys(self) -> int:
        """Every key-register bit of the current nesting (cleared where an object closes)."""
        return ((1 << LEVEL_KEYS) - 1) << (self.level * LEVEL_KEYS)

    def sub(self, **changes) -> "_Compiler":
        """A compiler for the same document with other options (e.g. compact whitespace for checks)."""
        return _Compiler(self.root, {**self.opts, **changes})

    # ------------------------------------------------------------------ helpers
    def container(self, open_, close, body, empty_ok: bool):
        """``open ws (body ws)? close``: one whitespace run in an empty container."""
        inner = seq(body, self.ws)
        return seq(lit(open_), self.ws, alt(EPSILON, inner) if empty_ok else inner, lit(close))

    def any_value(self):
        """Any JSON value: scalars inline, containers the recursive rule ``JSON_RULE`` (one frame each).

        Inside union branches (``self.inline_until`` > ``self.level``, the document nesting of the
        value) the container levels down to nesting ``inline_until`` are inline copies instead: a
        generic value next to a typed object or array of another branch at the same place (a key
        undeclared in one branch, declared in the other) is then determinised with it instead of
        entering the rule on the same byte (the pushdown automaton cannot choose there); all
        branches call the rule from the same nesting on, where their calls merge. Same language,
        more states."""
        if self.inline_until > self.level:
            return self.inline_value(self.inline_until - self.level)
        if self._any is None:
            scalars = alt(self.string, number_range(), lit("true"), lit("false"), lit("null"))
            value = alt(scalars, Call(JSON_RULE))
            member = seq(self.string, self.colon, value)
            objects = self.container("{", "}", seq(member, star(seq(self.comma, member))), True)
            arrays = self.container("[", "]", seq(value, star(seq(self.comma, value))), True)
            self.rules[JSON_RULE] = alt(objects, arrays)
            self._any = value
        return self._any

    def inline_value(self, depth: int):
        """Any JSON value with its outermost ``depth`` container levels inline (then ``JSON_RULE``)."""
        if depth not in self._inline:
            saved, self.inline_until = self.inline_until, 0
            inner = self.any_value() if depth == 1 else self.inline_value(depth - 1)
            self.inline_until = saved
            scalars = alt(self.string, number_range(), lit("true"), lit("false"), lit("null"))
            member = seq(self.string, self.colon, inner)
            objects = self.container("{", "}", seq(member, star(seq(self.comma, member))), True)
            arrays = self.container("[", "]", seq(inner, star(seq(self.comma, inner))), True)
            self._inline[depth] = alt(scalars, objects, arrays)
        return self._inline[depth]

    def size(self, expr) -> int:
        """Estimated DFA states of ``expr``: its positions (character occurrences, repetitions unrolled).

        Generic values and objects record their own estimate when built; an embedded DFA counts
        its states.
        """
        hit = self._sizes.get(id(expr))
        if hit is not None and hit[0] is expr:
            return hit[1]
        if isinstance(expr, (Chars, Call, KeyOp)):  # a call's rule is compiled once, not here
            n = 1
        elif isinstance(expr, (Seq, Alt)):
            n = sum(1 if type(x) is Chars else self.size(x) for x in expr.items)
        elif isinstance(expr, Repeat):
            n = self.size(expr.item) * max(expr.lo, expr.hi or 1, 1)
        else:
            n = expr.dfa.num_states
        self._sizes[id(expr)] = (expr, n)
        return n

    # ------------------------------------------------------------------ references (recursion)
    def resolve(self, ref, path: str):
        """The subschema a local reference names (JSON pointer, ``$anchor``/``$id`` name, or the root)."""
        if not isinstance(ref, str):
            raise error(path, "$ref", f"must be a string, got {ref!r}")
        if ref.startswith("#/") or ref == "#":
            target = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                try:
                    target = target[int(part) if isinstance(target, list) else part]
                except (KeyError, IndexError, ValueError, TypeError):
                    raise error(path, "$ref", f"{ref!r} does not resolve") from None
            return target
        anchors = self.anchors()
        if ref in anchors:
            return anchors[ref]
        raise error(path, "$ref", f"only references within the schema are supported, got {ref!r}")

    def anchors(self) -> dict:
        """``#name`` for ``$anchor``/``$id: "#name"``, and every ``$id``/``id`` value, to its subschema."""
        if self._anchors is None:
            self._anchors, todo = {}, [self.root]
            while todo:
                s = todo.pop()
                if isinstance(s, dict):
                    if isinstance(s.get("$anchor"), str):
                        self._anchors["#" + s["$anchor"]] = s
                    for key in ("$id", "id"):
                        if isinstance(s.get(key), str) and s is not self.root:
                            self._anchors[s[key]] = s
                            self._anchors.setdefault(s[key].rsplit("/", 1)[-1], s)
                    todo.extend(v for k, v in s.items() if k not in ("enum", "const", "examples", "default"))
                elif isinstance(s, list):
                    todo.extend(s)
        return self._anchors

    def enter(self, rule: str, schema, path: str, refs: list):
        """RECURSION: ``schema``, reached through the references ``refs``, compiled inline (once per
        :meth:`context`: a reference met again in the same context is the same expression); when the
        same ``rule`` (the schema, named by its reference) is already being expanded on this path,
        or with option ``ref_calls`` every reference, a :class:`Call` of it instead (the rule is
        compiled once, by :meth:`grammar`)."""
        if rule in self.active or (refs and self.opts["ref_calls"]):
            if rule not in self.rules:
                self.rules[rule] = None
                self.pending[rule] = (schema, path)
            return Call(rule)
        if any(self.open_refs[r] >= MAX_REF_NESTING for r in refs):
            raise error(path, "$ref", f"{refs[0]!r} nests more than {MAX_REF_NESTING} times without repeating a schema")
        key = (rule, self.context())
        hit = self._entered.get(key)
        if hit is not None:
            return hit
        self.active.add(rule)
        self.open_refs.update(refs)
        try:
            out = self._entered[key] = self.compile(schema, path)
            return out
        finally:
            self.active.discard(rule)
            self.open_refs.subtract(refs)

    def context(self) -> tuple:
        """Everything besides a schema that its compiled expression depends on: the references being
        expanded (later ones become calls; their count bounds nesting), and the nesting relative to
        the generic values inlined in unions and to a discriminator (with its absolute level: rules
        of called values name it)."""
        inline = max(self.inline_until - self.level, 0)
        first = None if self.first is None else (self.first, self.level)
        level = self.level if self.opts["key_register"] is True else None  # key bits are per nesting
        return frozenset(self.active), frozenset((+self.open_refs).items()), inline, first, level

    def value_call(self, schema, value) -> Call:
        """A :class:`Call` of ``value`` (``schema`` compiled here) as a rule compiled once: an object
        past ``max_order_states`` calls its largest values (see :mod:`json_objects`). Equal schemas
        share a rule; where a discriminator is written first, per nesting."""
        rule = f"$value {_key(schema)}" + (f" @{self.level} {self.first}" if self.first is not None else "")
        self.rules.setdefault(rule, value)
        return Call(rule)

    def grammar(self, root):
        """``root``, or a :class:`Grammar` of it and the recursive rules it calls (compiled here)."""
        while self.pending:
            rule, (schema, path) = self.pending.popitem()
            self.active, self.open_refs, self.in_rule = {rule}, collections.Counter(), True
            self.rules[rule] = self.compile(schema, path)
        if not self.rules:  # key ops need the pushdown construction (one rule, no stack)
            return Grammar({ROOT_RULE: root}, ROOT_RULE, 0) if self.key_ops else root
        return Grammar({ROOT_RULE: root, **self.rules}, ROOT_RULE, int(self.opts["max_depth"]))

    def ref(self, schema, path):
        ref = schema["$ref"]
        target = self.resolve(ref, path)
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in sm.ANNOTATIONS}
        rule = ref
        if siblings and not self.draft4to7:
            target = _with_siblings(target, siblings)
            rule = f"{ref} & {_key(siblings)}"
        return self.enter(rule, target, _ref_path(ref, path), [ref])

    def view(self, schema, path: str, refs: list, seen=()):
        """A schema's own keywords: normalised, top-level ``$ref`` and ``allOf`` resolved (refs noted)."""
        if not isinstance(schema, dict):
            if isinstance(schema, bool):
                return schema
            raise error(path, "", f"a schema must be an object or a boolean, got {type(schema).__name__}")
        self.check(schema, path)
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen:
                raise error(path, "$ref", f"{ref!r} refers to itself without nesting (a cycle through allOf/$ref)")
            refs.append(ref)
            target = self.resolve(ref, path)
            siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in sm.ANNOTATIONS}
            if siblings and not self.draft4to7:
                return self.view(_with_siblings(target, siblings), path, refs, (*seen, ref))
            return self.view(target, _ref_path(ref, path), refs, (*seen, ref))
        s = sm.normalise(schema, path)
        if "allOf" in s:
            branches = s.pop("allOf")
            if not isinstance(branches, list):
                raise error(path, "allOf", "must be a list")
            # unevaluated* of this schema see what the branches evaluate: applied after the merge;
            # a branch's own unevaluated* see only that branch: they act as its additional*/items
            lifted = {k: s.pop(k) for k in _UNEVALUATED if k in s}
            for i, b in enumerate(branches):
                b = self.view(b, f"{path}/allOf/{i}", refs, seen)
                if b is False:
                    return False
                if b is not True:
                    s = self.merge(s, _close_unevaluated(b), path)
            s.update(lifted)
        return s

    def merge(self, a, b, path):
        return sm.merge(a, b, path, self.name_schema)

    def name_schema(self, obj: dict, name: str):
        """The schema an object applies to an undeclared property ``name``."""
        text = escape(name).encode()
        matching = [v for p, v in obj.get("patternProperties", {}).items() if self.pattern_dfa(p, "").matches(text)]
        if matching:
            return matching[0] if len(matching) == 1 else {"allOf": matching}
        return obj.get("additionalProperties", True)

    def pattern_dfa(self, pattern, path: str) -> ByteDFA:
        try:
            return search_dfa(pattern)
        except GrammarError as e:
            raise error(path, "pattern", str(e)) from None

    # ------------------------------------------------------------------ schemas
    def check(self, schema: dict, path: str):
        for key in sorted(sm.UNSUPPORTED & schema.keys(), key=lambda k: k != "if"):
            if key in ("then", "else") and "if" not in schema:
                continue  # without "if" they are ignored (JSON Schema 2020-12, 10.2.2)
            raise error(path, key, f"keyword {key!r} is not supported")

    def compile(self, schema, path: str = ""):
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            return EMPTY
        if not isinstance(schema, dict):
            raise error(path, "", f"a schema must be an object or a boolean, got {type(schema).__name__}")
        self.check(schema, path)
        if "$ref" in schema:
            return self.ref(schema, path)
        if "allOf" in schema:
            refs: list = []
            merged = self.view(schema, path, refs)
            if not refs:
                return self.compile(merged, path)
            return self.enter(f"allOf {_key(merged)}", merged, path, refs)
        s = sm.normalise(schema, path)
        if s.get("dependentSchemas"):
            return self.compile(self.dependent_schemas(s, path), path)
        for key in ("oneOf", "anyOf"):
            if key in s:
                return self.union(s, key, path)
        if "_not" in s:
            s = self.apply_not(s, path)
            if s is False:
                return EMPTY
        if "enum" in s:
            return self.enum(s, path)
        types = sm.types_of(s)
        if types is None:
            implied = [t for t, keys in sm.FAMILIES.items() if keys & s.keys()] if self.opts["untyped"] == "implied" else []
            types = implied or list(sm.ALL_TYPES)
        else:  # in the order written (a set's order would vary with Python's string hashing between processes)
            types = [t for t in dict.fromkeys([s["type"]] if isinstance(s["type"], str) else s["type"]) if t in types]
        return alt(*(self.typed(s, t, path) for t in types))

    def dependent_schemas(self, s, path):
        """``dependentSchemas``: for each name, either it is absent or the object also meets its schema."""
        deps = s.pop("dependentSchemas")
        out = s
        for name, sub in deps.items():
            out = self.merge(out, {"anyOf": [{"properties": {name: False}}, {"required": [name], "allOf": [sub]}]},
                             f"{path}/dependentSchemas")  # fmt: skip
        return out

    def union(self, s, key, path):
        branches = s[key]
        if not isinstance(branches, list) or not branches:
            raise error(path, key, "must be a non-empty list")
        rest = {k: v for k, v in s.items() if k != key}
        constrained = {k for k in rest if k not in sm.ANNOTATIONS and not k.startswith("x-")}
        if key == "anyOf" and any(b is True or b == {} for b in branches):  # a branch accepts every value:
            return self.compile(rest, path) if constrained else self.any_value()  # no choice left to make
        if constrained:
            views = [self.view(b, f"{path}/{key}/{i}", []) for i, b in enumerate(branches)]
            # presence-only branches become a predicate, unless their properties are evaluated names
            # that unevaluatedProperties of the object would otherwise forbid
            named = {n for v in views if isinstance(v, dict) for n in v.get("properties", {})}
            foldable = "unevaluatedProperties" not in rest or named <= rest.get("properties", {}).keys()
            presence = all(v is True or isinstance(v, dict) and sm.presence_only(v) for v in views)
            if foldable and presence and _only_objects(rest, self.opts["untyped"]):
                preds = [("all", []) if v is True else sm.presence_predicate(v) for v in views]
                rest["_presence"] = [*rest.get("_presence", []), ("any" if key == "anyOf" else "one", preds)]
                return self.compile(rest, path)
            branches = [_with_siblings(b, rest) for b in branches]
        if key == "oneOf":
            branches = self.check_disjoint(branches, path)
        first = self.discriminator(branches, path, key) if self.opts["discriminator_first"] else None
        saved_first, self.first = self.first, first
        try:
            compiled = [self.compile(b, f"{path}/{key}/{i}") for i, b in enumerate(branches)]
            if self.opts["inline_generic"] and len(branches) > 1 and self.inline_until <= self.level and _has_call(alt(*compiled)):
                # a generic value may meet a typed container of another branch on the same byte
                saved, self.inline_until = self.inline_until, self.level + int(self.opts["inline_generic"])
                try:
                    compiled = [self.compile(b, f"{path}/{key}/{i}") for i, b in enumerate(branches)]
                finally:
                    self.inline_until = saved
        finally:
            self.first = saved_first
        return alt(*compiled)

    def discriminator(self, branches, path, key):
        """``(name, level)``: a property every branch's objects require with pairwise disjoint finite
        values (``const``/``enum``), written first in each branch's objects (an over-constraint on the
        order that lets the union choose its branch after one member instead of tracking every branch
        in parallel); ``None`` if there is none."""
        if len(branches) < 2:
            return None
        proof, implied, found = Disjoint(self), self.opts["untyped"] == "implied", []
        for i, b in enumerate(branches):
            try:
                v = self.view(b, f"{path}/{key}/{i}", [])
            except GrammarError:
                return None
            if not isinstance(v, dict) or proof.types(v, implied) != {"object"}:
                return None
            found.append(v)
        names = [n for n in found[0].get("required", []) if all(n in set(v.get("required", [])) for v in found[1:])]
        for name in names:
            values = []
            for i, v in enumerate(found):
                try:
                    pv = self.view(proof.prop(v, name), f"{path}/{key}/{i}", [])
                except GrammarError:
                    pv = None
                if not isinstance(pv, dict) or not isinstance(pv.get("enum"), list):
                    break
                values.append(pv["enum"])
            else:
                if all(not any(sm.json_equal(x, y) for x in a for y in b) for i, a in enumerate(values)
                       for b in values[:i]):  # fmt: skip
                    return name, self.level + 1
        return None

    def enum(self, s, path):
        values = s["enum"]
        if not isinstance(values, list):
            raise error(path, "enum", "must be a list")
        types = sm.types_of(s)
        if types is not None:
            values = [v for v in values if any(_is_type(v, t) for t in types)]
        rest = {k: v for k, v in s.items() if k in sm.VALUE_KEYWORDS}
        values = list({canonical_json(v): v for v in values}.values())
        if rest and values:  # keep the values the sibling keywords accept (JSON Schema meaning, any depth)
            checker = self.sub(whitespace="compact", whitespace_pattern=None, separators=None, open_objects=True,
                               untyped="any", max_depth=max(self.opts["max_depth"], *map(_depth, values)))  # fmt: skip
            sibling = {**rest, "type": s["type"]} if "type" in s else rest
            check = compile_expr(checker.grammar(checker.compile(sibling, path)))
            values = [v for v in values if check.matches(canonical_json(v).encode())]
        return alt(*(self.literal(v, path) for v in values))

    def literal(self, value, path):
        """One JSON value: scalars as their canonical text, containers with whitespace and (objects)
        members in any order, as their JSON Schema equality allows."""
        if isinstance(value, dict):
            props = {k: {"enum": [v]} for k, v in value.items()}
            schema = {"type": "object", "properties": props, "required": list(value), "additionalProperties": False}
        elif isinstance(value, list):
            schema = {"type": "array", "prefixItems": [{"enum": [v]} for v in value], "items": False,
                      "minItems": len(value)}  # fmt: skip
        else:
            return lit(canonical_json(value))
        return self.compile(schema, path)

    def apply_not(self, s, path):
        """Folds ``not`` into the schema: ``{}``/``true``, types, presence conditions, string constraints."""
        s = dict(s)
        for sub in s.pop("_not"):
            at = f"{path}/not"
            v = self.view(sub, at, [])
            if v is True or v == {}:
                return False
            if v is False:
                continue
            keys = {k for k in v if k not in sm.ANNOTATIONS and not k.startswith("x-")}
            if keys == {"type"}:
                banned = sm.types_of(v)
                mine = sm.types_of(s) or set(sm.ALL_TYPES) | {"integer"}
                if "number" in banned:
                    banned = banned | {"integer"}
                left = {t for t in mine if t not in banned}
                if "number" in mine and "integer" in banned and "number" not in banned:
                    raise error(path, "not", "'not' of 'integer' within numbers is not supported")
                if not left:
                    return False
                s["type"] = sorted(left)
            elif keys and sm.presence_only(v) and (sm.types_of(v) in (None, {"object"})):
                s["_presence"] = [*s.get("_presence", []), ("not", sm.presence_predicate(v))]
                if sm.types_of(v) is None and not _only_type(s, "object"):  # every non-object is valid under v
                    return False
            elif (keys and keys <= sm.FAMILIES["string"] | {"enum", "type"} and sm.types_of(v) in (None, {"string"})
                  and all(isinstance(x, str) for x in v.get("enum", []))):  # fmt: skip
                s["_not_strings"] = [*s.get("_not_strings", []), v]
                if sm.types_of(v) is None and "enum" not in v and not _only_type(s, "string"):
                    return False  # every non-string is valid under v
            else:
                raise error(path, "not", f"'not' of {sorted(keys)} is not supported (only of {{}}, types, "
                            "presence of properties and string constraints)")  # fmt: skip
        return s

    def typed(self, s, t, path):
        if t == "null":
            return lit("null")
        if t == "boolean":
            return alt(lit("true"), lit("false"))
        if t in ("integer", "number"):
            return self.number(s, t, path)
        if t == "string":
            body = self.string_body(s, path)
            return EMPTY if body == EMPTY else seq(lit('"'), body, lit('"'))
        if t in ("array", "object"):
            self.level += 1
            try:
                return self.array(s, path) if t == "array" else self.object(s, path)
            finally:
                self.level -= 1
        raise error(path, "type", f"unknown type {t!r}")

    # ------------------------------------------------------------------ numbers
    def number(self, s, t, path):
        lo, hi = s.get("minimum"), s.get("maximum")
        lo_x, hi_x = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if k in s and (isinstance(s[k], bool) or not isinstance(s[k], (int, float))):
                raise error(path, k, f"must be a number, got {s[k]!r}")
        lo_excl = hi_excl = False
        if lo_x is not None and (lo is None or lo_x >= lo):
            lo, lo_excl = lo_x, True
        if hi_x is not None and (hi is None or hi_x <= hi):
            hi, hi_excl = hi_x, True
        if t == "integer":
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl and lo == math.floor(lo) else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl and hi == math.ceil(hi) else math.floor(hi))
            if ilo is not None and ihi is not None and ilo > ihi:
                return EMPTY
            expr = integer_range(ilo, ihi)
        else:
            expr = number_range(lo, hi, lo_excl, hi_excl)
        mult = s.get("multipleOf")
        if mult is None:
            return expr
        if mult <= 0:
            raise error(path, "multipleOf", f"must be > 0, got {mult}")
        try:
            m = multiple_of(mult, integer=t == "integer")
        except GrammarError as e:
            raise error(path, "multipleOf", str(e)) from None
        if lo is None and hi is None and t == "number":
            expr = plain_decimals()  # no exponent: the product stays small
        return dfa_ops.Automaton.of(dfa_ops.intersect(compile_expr(expr), m))

    # ------------------------------------------------------------------ strings
    def string_body(self, s, path):
        """JSON-encoded string contents (between the quotes) meeting the string keywords of ``s``."""
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        for k in ("minLength", "maxLength"):
            if k in s and (isinstance(s[k], bool) or not isinstance(s[k], int) or s[k] < 0):
                raise error(path, k, f"must be a non-negative integer, got {s[k]!r}")
        parts, dfas = [], []
        for p in s.get("_patterns", []):
            if not isinstance(p, str):
                raise error(path, "pattern", f"must be a string, got {p!r}")
            parts.append(("pattern", p))
        for f in s.get("_formats", []):
            if f in formats.FORMATS:
                parts.append(("format", f))
            elif f in formats.UNSUPPORTED or self.opts["unknown_formats"] == "error":
                raise error(path, "format", f"format {f!r} is not supported (known: {', '.join(formats.FORMATS)})")
            # other names are annotations (JSON Schema 2020-12 format-annotation; validators ignore them)
        length = repeat(STRING_CHAR, lo, hi)
        nots = s.get("_not_strings", [])
        if not parts and not nots:
            return length
        if len(parts) == 1 and not nots and lo == 0 and hi is None:
            kind, x = parts[0]
            if kind == "format":
                return json_encoded(formats.format_expr(x))
            try:
                return json_encoded(search_expr(x))
            except GrammarError as e:
                raise error(path, "pattern", str(e)) from None
        for kind, x in parts:
            if kind == "pattern":
                dfas.append(self.pattern_dfa(x, path))
            else:
                dfas.append(compile_expr(json_encoded(formats.format_expr(x))))
        if lo or hi is not None or not dfas:
            dfas.append(compile_expr(length))
        d = functools.reduce(dfa_ops.intersect, dfas)
        for v in nots:
            d = dfa_ops.difference(d, self.string_upper(v, f"{path}/not"))
        return dfa_ops.Automaton.of(d)

    def string_upper(self, v: dict, path) -> ByteDFA:
        """A superset DFA of a string-only schema's contents (exact but for format subsets)."""
        if "enum" in v:
            return names_dfa([x for x in v["enum"] if isinstance(x, str)])
        exact = {**v, "_formats": [f for f in v.get("_formats", []) if f in formats.EXACT]}
        body = self.string_body(exact, path)
        return compile_expr(body)

    # ------------------------------------------------------------------ arrays
    def array(self, s, path):
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        items = s["items"] if "items" in s else s.get("unevaluatedItems", True)
        prefix = s.get("prefixItems", [])
        if "contains" in s and s.get("minContains", 1) > 0:
            return self.contains_array(s, path, lo, hi, prefix, items)
        if s.get("uniqueItems") and (hi is None or hi > 1):
            return self.unique_array(s, path, lo, hi, prefix, items)
        if hi is not None and hi < lo:
            return EMPTY
        elems = [self.compile(p, f"{path}/prefixItems/{i}") for i, p in enumerate(prefix)]
        rest = self.compile(items, f"{path}/items")
        k = len(elems)

        def after(i):  # the elements after the first i (i >= 1)
            if i >= k:
                return repeat(seq(self.comma, rest), max(lo - i, 0), None if hi is None else hi - i)
            if hi is not None and i >= hi:
                return EPSILON
            more = seq(self.comma, elems[i], after(i + 1))
            return alt(EPSILON, more) if i >= lo else more

        first = EMPTY if hi == 0 else seq(elems[0] if k else rest, after(1))
        return self.container("[", "]", first, lo == 0)

    def contains_array(self, s, path, lo, hi, prefix, items):
        """Arrays with an element valid under ``contains`` (and ``items``); ``minContains`` of them."""
        need = s.get("minContains", 1)
        if "maxContains" in s:
            raise error(path, "maxContains", "keyword 'maxContains' is not supported")
        if s.get("uniqueItems") and (hi is None or hi > 1):
            raise error(path, "uniqueItems", "'uniqueItems' together with 'contains' is not supported")
        schemas = [*prefix, items]
        plain = [self.compile(x, f"{path}/prefixItems/{i}") for i, x in enumerate(prefix)]
        plain.append(self.compile(items, f"{path}/items"))
        hit = [self.compile({"allOf": [x, s["contains"]]}, f"{path}/contains") for x in schemas]
        k = len(prefix)

        settled = max(k, lo)  # from here on (unbounded arrays) only the matches count

        @functools.cache
        def after(i, found):
            """The elements after the first i (i >= 1), ``found`` of which (capped) matched ``contains``."""
            options = [EPSILON] if i >= lo and found >= need else []
            if hi is not None and i >= hi:
                return alt(*options)
            if hi is None and i >= settled:
                loop = star(seq(self.comma, plain[k]))
                return loop if found >= need else seq(loop, self.comma, hit[k], after(i, found + 1))
            j = min(i, k)
            options.append(seq(self.comma, plain[j], after(i + 1, found)))
            options.append(seq(self.comma, hit[j], after(i + 1, min(found + 1, need))))
            return alt(*options)

        first = alt(seq(plain[0], after(1, 0)), seq(hit[0], after(1, min(1, need))))
        return self.container("[", "]", first, False)

    def unique_array(self, s, path, lo, hi, prefix, items):
        """``uniqueItems`` over a finite item set: the array tracks the subset of values used."""
        if prefix:
            raise error(path, "uniqueItems", "'uniqueItems' together with 'prefixItems' is not supported")
        values = self.finite_values(items, f"{path}/items")
        if values is None:
            raise error(path, "uniqueItems", "'uniqueItems' is supported only for finite item sets (enum/const/"
                        f"boolean/null/small integer ranges, at most {MAX_UNIQUE_VALUES} values)")  # fmt: skip
        texts = list(dict.fromkeys(canonical_json(v) for v in values))

        @functools.cache
        def after(used: frozenset):
            options = [EPSILON] if len(used) >= lo else []
            if hi is None or len(used) < hi:
                for i, t in enumerate(texts):
                    if i not in used:
                        options.append(seq(self.comma, lit(t), after(used | {i})))
            return alt(*options)

        first = alt(*(seq(lit(t), after(frozenset([i]))) for i, t in enumerate(texts)))
        return self.container("[", "]", first, lo == 0)

    def finite_values(self, schema, path):
        """The values of a schema with finitely many (at most ``MAX_UNIQUE_VALUES``), or ``None``."""
        v = self.view(schema, path, [])
        if not isinstance(v, dict):
            return None
        if "enum" in v and not ({"anyOf", "oneOf"} & v.keys()):
            texts = compile_expr(self.enum(v, path))
            vals = []
            for x in v["enum"]:
                if texts.matches(canonical_json(x).encode()) and not any(sm.json_equal(x, y) for y in vals):
                    vals.append(x)
            return vals if len(vals) <= MAX_UNIQUE_VALUES else None
        keys = {k for k in v if k not in sm.ANNOTATIONS}
        types = sm.types_of(v)
        if types and keys <= {"type"} and types <= {"boolean", "null"}:
            return [x for t in sorted(types) for x in ({"boolean": [False, True], "null": [None]}[t])]
        if types == {"integer"} and keys <= {"type", "minimum", "maximum"} and "minimum" in v and "maximum" in v:
            r = range(math.ceil(v["minimum"]), math.floor(v["maximum"]) + 1)
            return list(r) if len(r) <= MAX_UNIQUE_VALUES else None
        return None

    # ------------------------------------------------------------------ objects
    def object(self, s, path):
        return ObjectBuilder(self, s, path).build()

    # ------------------------------------------------------------------ oneOf
    def check_disjoint(self, branches, path):
        """The ``oneOf`` branches, proven disjoint (else an error); types whose every value two branches
        accept (invalid under ``oneOf``) removed from all branches first."""
        views = []
        for i, b in enumerate(branches):
            try:
                views.append(self.view(b, f"{path}/oneOf/{i}", []))
            except GrammarError:
                views.append(None)
        proof = Disjoint(self)
        shared = set().union(*(proof.accepted_types(x, y) for i, x in enumerate(views) for y in views[:i]))
        if shared:
            if "number" in shared:
                shared.add("integer")
            implied = self.opts["untyped"] == "implied"
            kept = [None if v is None or not proof.types(v, implied) & shared else sorted(proof.types(v, implied) - shared)
                    for v in views]  # fmt: skip
            branches = [{"allOf": [b, {"type": k}]} if k is not None else b for b, k in zip(branches, kept)]
            views = [None if v is None else self.view(b, f"{path}/oneOf/{i}", []) for i, (b, v) in
                     enumerate(zip(branches, views))]  # fmt: skip
        lower = list(views)  # what is compiled (may be narrowed below); ``views``: what is valid
        untyped = self.opts["untyped"]
        for i in range(len(views)):
            for j in range(i):
                if views[i] is None or views[j] is None:
                    raise error(path, "oneOf", f"branches {j} and {i} may overlap (a branch cannot be read)")
                if proof.directed(lower[i], views[j], 0) and proof.directed(lower[j], views[i], 0):
                    continue
                ri, rj = proof.required_objects(views[i], untyped), proof.required_objects(views[j], untyped)
                if ri and rj:  # over-constraint: each branch's objects lack one of the names the other requires
                    for a, names in ((i, rj), (j, ri)):
                        branches[a] = {"allOf": [branches[a], {"not": {"required": names}}]}
                        lower[a] = self.view(branches[a], f"{path}/oneOf/{a}", [])
                if not (proof.directed(lower[i], views[j], 0) and proof.directed(lower[j], views[i], 0)):
                    raise error(path, "oneOf", f"branches {j} and {i} may overlap (a document valid under both "
                                "would be invalid; anyOf semantics would under-constrain)")  # fmt: skip
        return branches


_UNEVALUATED = {"unevaluatedProperties": "additionalProperties", "unevaluatedItems": "items"}


def _with_siblings(target, siblings: dict) -> dict:
    """``target`` and ``siblings`` both apply; ``unevaluated*`` of the siblings see what ``target`` evaluates."""
    lifted = {k: v for k, v in siblings.items() if k in _UNEVALUATED}
    return {"allOf": [target, {k: v for k, v in siblings.items() if k not in _UNEVALUATED}], **lifted}


def _close_unevaluated(s: dict) -> dict:
    """A merged branch's ``unevaluated*`` as its ``additionalProperties``/``items`` (it has no subschemas left)."""
    if not any(k in s for k in _UNEVALUATED):
        return s
    s = dict(s)
    for k, plain in _UNEVALUATED.items():
        if k in s:
            value = s.pop(k)
            s.setdefault(plain, value)
    return s


def _only_type(s: dict, t: str) -> bool:
    """Restricts ``s`` (in place) to type ``t``, as a ``not`` that every other type violates requires;
    ``False`` when ``s`` allows no value of type ``t``."""
    mine = sm.types_of(s)
    if mine is not None and t not in mine:
        return False
    s["type"] = t
    return True


def _only_objects(s: dict, untyped: str) -> bool:
    """Whether the compiled language of ``s`` has objects only (by ``type``, or implied by keywords)."""
    types = sm.types_of(s)
    if types is not None:
        return types == {"object"}
    return untyped == "implied" and {t for t, keys in sm.FAMILIES.items() if keys & s.keys()} == {"object"}


def _has_call(expr, seen=None) -> bool:
    """Whether an expression tree calls ``JSON_RULE``."""
    seen = set() if seen is None else seen
    if id(expr) in seen:
        return False
    seen.add(id(expr))
    if isinstance(expr, Call):
        return expr.rule == JSON_RULE
    if isinstance(expr, (Seq, Alt)):
        return any(_has_call(x, seen) for x in expr.items)
    if isinstance(expr, Repeat):
        return _has_call(expr.item, seen)
    return False


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _key(schema) -> str:
    """A schema's canonical text (names the rule of a schema reached again on a cycle)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), default=repr)


def _ref_path(ref: str, path: str) -> str:
    return ref[1:] if ref.startswith("#/") else path


def schema_expr(
    schema: Any,
    *,
    whitespace: str = "free",
    whitespace_pattern: str | None = None,
    separators: tuple[str, str] | None = None,
    max_whitespace: int = 20,
    property_order: str = "any",
    max_order_states: int = 8192,
    open_objects: bool = False,
    untyped: str = "implied",
    unknown_formats: str = "ignore",
    max_depth: int = DEFAULT_MAX_DEPTH,
    ref_calls: bool = False,
    inline_generic: int = 0,
    discriminator_first: bool = False,
    value_calls: bool = False,
    key_register: bool | None = None,
):
    """Expression tree of the JSON documents a schema accepts, or a
    :class:`~jaxsample.structured.pushdown.Grammar` when it recurses (see the module docstring).

    Args:
      schema: the schema (a dict, a bool, or its JSON text).
      whitespace: where JSON allows whitespace: ``"free"`` (default, any ``[ \\t\\n\\r]*``, vLLM's
        default: every formatting of a valid document is accepted), ``"compact"`` (none: ``,``
        and ``:`` separators) or ``"bounded"`` (nothing, one space, or a newline plus at most
        ``max_whitespace`` spaces/tabs: llama.cpp's rule against run-on whitespace).
      whitespace_pattern: a regex used at every whitespace position instead (matched once there,
        so bounds hold, as llguidance's ``whitespace_pattern``); must match JSON whitespace only.
      separators: ``(item, key)`` separator strings replacing whitespace around ``,`` and ``:``
        (XGrammar's ``separators``, e.g. ``(", ", ": ")``).
      max_whitespace: indentation bound of the bounded mode.
      property_order: ``"any"`` (default: properties in any order, each at most once, the JSON
        Schema meaning) or ``"schema"`` (the order of ``properties``, as llguidance/XGrammar).
      max_order_states: estimated NFA states an object may take for any order (tracking which
        declared properties were written costs up to ``2**(n-1)`` copies of the values); larger
        objects keep schema order (or, with ``value_calls``, call their large values to fit any order).
      open_objects: what an absent ``additionalProperties`` means: ``False`` (default) closed, as
        XGrammar and llama.cpp; ``True`` open (the JSON Schema meaning, as llguidance).
      untyped: the types of a schema without ``type``: ``"implied"`` (default) only those its
        keywords imply (``properties`` -> objects; all when none), or ``"any"`` every type, the
        keywords applying to their own (the JSON Schema meaning, as llguidance).
      unknown_formats: ``"ignore"`` (default: a ``format`` outside JSON Schema's list is an
        annotation, as validators treat it) or ``"error"``.
      max_depth: stack frames of a recursive schema: each nested ``$ref`` on a cycle, and each
        container inside a generic value (``{}``/``true``; an outermost container that ends the
        document is a tail call and takes none), takes one. The default limit of the compiled
        tables, changeable per row on the device.
      ref_calls: every ``$ref`` is a call of a rule compiled once (one stack frame per nested call,
        at most ``max_depth``) instead of an inlined copy: far fewer states for schemas that use
        their definitions in many places (a schema nesting references deeper than ``max_depth``
        loses its deepest documents); the compilers retry with it when the inlined schema exceeds
        a state budget.
      inline_generic: in the branches of an ``anyOf``/``oneOf`` that hold generic values, their
        outermost ``inline_generic`` container levels are inline copies instead of calls of the
        generic rule (the same language, more states), so a generic value and a typed object or
        array of another branch starting at the same place (a key undeclared in one open object,
        declared in the other) can be told apart by the pushdown automaton; ``0`` (default): calls.
        :func:`~jaxsample.structured.compiler.compile_json_schema` retries with it when the
        automaton cannot choose (:class:`~jaxsample.structured.pushdown.AmbiguousCallError`).
      discriminator_first: in an ``anyOf``/``oneOf`` of objects that all require one property with
        pairwise disjoint ``const``/``enum`` values (a discriminator), each branch's objects write it
        first (an over-constraint on the order): the union then chooses its branch after one member
        instead of tracking every branch's objects in parallel. ``False`` (default): any order;
        :func:`~jaxsample.structured.compiler.compile_json_schema` retries with it when the schema
        exceeds a state budget.

      value_calls: in an object past ``max_order_states``, its large property values become calls
        of rules compiled once (their states are no longer repeated for every set of written
        properties; one stack frame per called value) so that it keeps any order instead of schema
        order: the schema's documents, more of them than the default. ``False`` (default: regular
        automata stay regular; as a state-budget fallback it rescued none of the JSONSchemaBench
        sample's budget failures); :func:`~jaxsample.structured.compiler.compile_json_schema`
        retries without it where the automaton cannot choose between a call and another union
        branch's inline value.
      key_register: objects in any order record the declared properties written in a per-row
        register of key bits (:class:`~jaxsample.structured.automaton.KeyOp`) instead of one copy of
        their states per set of written properties: linear size at any number of properties. Objects
        whose presence conditions go beyond ``required`` and three ``dependentRequired``, that count
        properties or that sit in a called rule keep the tracked-set form. ``True``: every such object; ``"auto"`` (the default,
        :data:`KEY_REGISTER`): only a schema with an object past ``max_order_states`` (which would
        otherwise keep schema order) is compiled with the register, and
        :func:`~jaxsample.structured.compiler.compile_json_schema` tries it first for a schema over a
        state budget; smaller schemas stay regular automata (no register lanes per step); ``False``:
        never. The compiler retries without it where the automaton cannot apply the ops
        (:class:`~jaxsample.structured.pushdown.KeyRegisterError`).

    Raises:
      GrammarError: unsupported keyword or invalid schema (the message names keyword and pointer).
      ValueError: an invalid option.
    """
    if isinstance(schema, (str, bytes)):
        schema = json.loads(schema)
    opts = schema_options(whitespace=whitespace, whitespace_pattern=whitespace_pattern, separators=separators,
                          max_whitespace=max_whitespace, property_order=property_order,
                          max_order_states=max_order_states, open_objects=open_objects, untyped=untyped,
                          unknown_formats=unknown_formats, max_depth=max_depth, ref_calls=ref_calls,
                          inline_generic=inline_generic, discriminator_first=discriminator_first,
                          value_calls=value_calls, key_register=key_register)  # fmt: skip
    return _resolved(schema, opts)[0]


def schema_options(**options) -> dict:
    """Every option of :func:`schema_expr`, its defaults filled in (``key_register`` as given, or
    :data:`KEY_REGISTER`)."""
    unknown = options.keys() - _DEFAULTS.keys()
    if unknown:
        raise TypeError(f"schema_expr() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    out = {**_DEFAULTS, **options}
    if out["key_register"] is None:
        out["key_register"] = KEY_REGISTER
    return out


def schema_expr_and_options(schema: Any, **options) -> tuple:
    """:func:`schema_expr`'s result and every option it was built with, ``key_register="auto"``
    resolved (``True`` where an object wanted the register, else ``False``: the same expression)."""
    if isinstance(schema, (str, bytes)):
        schema = json.loads(schema)
    return _resolved(schema, schema_options(**options))


def _resolved(schema, opts: dict) -> tuple:
    """``(expression or grammar, options)`` with ``key_register="auto"`` resolved."""
    if opts["key_register"] == "auto":
        try:
            return _compiled(schema, opts), {**opts, "key_register": False}
        except RegisterWanted:
            opts = {**opts, "key_register": True}
    return _compiled(schema, opts), opts


_DEFAULTS = {name: p.default for name, p in inspect.signature(schema_expr).parameters.items()
             if p.kind is p.KEYWORD_ONLY}  # fmt: skip


def _compiled(schema, opts: dict):
    """The expression or grammar of ``schema``; compiled a second time, knowing every nesting's
    property names, where objects recording keys take as undeclared a key that another declares."""
    c = _Compiler(schema, opts)
    out = c.grammar(c.compile(schema))
    if c.unmarked():
        c = _Compiler(schema, opts, known=c.key_names)
        out = c.grammar(c.compile(schema))
    return out
