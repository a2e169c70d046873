"""JSON Schema -> expression tree (then byte DFA and token tables), exactly or with a clear error.

Supported: ``type`` (single or list), ``enum``/``const``, ``properties``/``required`` (emitted in
schema order, optional ones omissible), ``additionalProperties`` (``false``; a schema or ``true``
only for property-less "map" objects), ``items``/``prefixItems``/``minItems``/``maxItems``,
``minLength``/``maxLength``, ``pattern`` (ECMAScript search semantics: unanchored unless ``^...$``),
``format`` (date, time, date-time, uuid, email, ipv4, hostname, uri), integer bounds
(``minimum``/``maximum``/``exclusive*``, any integers) and number bounds with integer values,
``anyOf``, ``oneOf`` (branches are checked to be disjoint), ``allOf`` (merged), local ``$ref``,
``true``/``{}`` (any JSON value). Recursion — a ``$ref`` cycle, and the containers of generic JSON
values — is a rule entered on the device stack (a :class:`~jaxsample.structured.pushdown.Grammar`
with at most ``max_depth`` nested frames), not unrolled.

Deliberate over-constraints (outputs stay valid, some valid documents cannot be produced):
properties in schema order; an absent ``additionalProperties`` next to ``properties`` means closed
(as in XGrammar and llama.cpp); bounded numbers have no exponent; enum objects are written compactly;
whitespace follows the ``whitespace`` mode. Keywords that constrain values but are not supported
(``not``, ``if``, ``uniqueItems``, ``patternProperties``, ``minProperties``, ``multipleOf``, ...)
raise :class:`~jaxsample.structured.automaton.GrammarError` naming the keyword and its location —
never a silent under-constraint. Unknown keywords are annotations and are ignored, as validators do.

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(schema_expr({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
...                               "required": ["n"]}, whitespace="compact"))
>>> d.matches(b'{"n":12}'), d.matches(b'{"n":0}')
(True, False)
"""

from __future__ import annotations

import json
import math
from typing import Any

from jaxsample.structured import regex as _regex
from jaxsample.structured.numbers import integer_range, number_range
from jaxsample.structured.pushdown import DEFAULT_MAX_DEPTH, Grammar
from jaxsample.structured.automaton import (
    EMPTY,
    EPSILON,
    Alt,
    Call,
    Chars,
    GrammarError,
    Repeat,
    Seq,
    alt,
    chars,
    compile_expr,
    complement,
    intersects,
    lit,
    normalise_ranges,
    opt,
    plus,
    repeat,
    seq,
    star,
)

WHITESPACE_MODES = ("compact", "bounded", "free")
JSON_RULE = "$json"  # generic JSON containers: a recursive rule (refs are named by their JSON pointer)
_FIRST = {"object": "{", "array": "[", "string": '"', "number": "-0123456789", "integer": "-0123456789",
          "boolean": "tf", "null": "n"}  # fmt: skip
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding", "contentMediaType", "$anchor",
}  # fmt: skip
_UNSUPPORTED = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "patternProperties", "propertyNames", "unevaluatedItems", "contains", "minContains", "maxContains",
    "minProperties", "maxProperties", "$dynamicRef", "$recursiveRef",
}  # fmt: skip
_FAMILIES = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_HEX = chars("0-9a-fA-F")
# DEL is legal JSON but excluded unescaped (as llguidance and llama.cpp do): a harmless over-constraint.
_UNESCAPED = complement(((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)))
_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
# Escapes are the canonical ones (as llguidance emits): short escapes except the redundant "\/", and
# "\uXXXX" only for the characters that cannot appear raw (U+0000-U+001F, DEL). Every other
# character is written as itself: an over-constraint that keeps outputs valid and canonical.
_U_ESCAPE = seq(lit("u00"), alt(seq(chars("01"), _HEX), seq(lit("7"), chars("fF"))))
_STRING_CHAR = alt(Chars(_UNESCAPED), seq(lit("\\"), alt(chars('"\\\\bfnrt'), _U_ESCAPE)))

_DAY = "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMATS = {
    "date": f"[0-9]{{4}}-{_DAY}",
    "time": _TIME,
    "date-time": f"[0-9]{{4}}-{_DAY}T{_TIME}",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,4}",
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "hostname": rf"{_LABEL}(\.{_LABEL}){{0,8}}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+",
}


def _json_encoded(expr):
    """Maps an expression over decoded string characters to one over their JSON encodings."""
    if isinstance(expr, Chars):
        plain = normalise_ranges(
            (max(lo, a), min(hi, b)) for lo, hi in expr.ranges for a, b in _UNESCAPED if max(lo, a) <= min(hi, b)
        )
        escaped = []
        for lo, hi in expr.ranges:
            for cp in [*range(lo, min(hi, 0x5C) + 1), *([0x7F] if lo <= 0x7F <= hi else [])]:
                if cp < 0x20 or cp in (0x22, 0x5C, 0x7F):
                    escaped.append(lit(_SHORT_ESCAPES.get(cp, f"\\u{cp:04x}")))
        return alt(*([Chars(plain)] if plain else []), *escaped)
    if isinstance(expr, Seq):
        return seq(*map(_json_encoded, expr.items))
    if isinstance(expr, Alt):
        return alt(*map(_json_encoded, expr.items))
    if isinstance(expr, Repeat):
        return repeat(_json_encoded(expr.item), expr.lo, expr.hi)
    raise TypeError(expr)


# -------------------------------------------------------------------------------------- compiler
class _Compiler:
    def __init__(self, root, whitespace, max_whitespace, max_depth):
        if whitespace not in WHITESPACE_MODES:
            raise ValueError(f"whitespace must be one of {WHITESPACE_MODES}, got {whitespace!r}")
        self.root = root
        if whitespace == "compact":
            self.ws = EPSILON
        elif whitespace == "bounded":
            self.ws = opt(alt(lit(" "), seq(lit("\n"), repeat(chars(" \t"), 0, int(max_whitespace)))))
        else:
            self.ws = star(chars(" \t\n\r"))
        self.comma = seq(self.ws, lit(","), self.ws)
        self.colon = seq(self.ws, lit(":"), self.ws)
        self.max_depth = int(max_depth)
        self.active: set[str] = set()
        self.rules: dict[str, Any] = {}  # recursive rules: $ref pointers on a cycle, JSON_RULE; None until built
        self.string = seq(lit('"'), star(_STRING_CHAR), lit('"'))

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def error(path: str, msg: str) -> GrammarError:
        return GrammarError(f"JSON schema at {path}: {msg}")

    def container(self, open_, close, first, rest_item, lo=0, hi=None):
        """``open first (comma item){lo-1, hi-1} close`` with emptiness when ``lo == 0``."""
        body = seq(first, repeat(seq(self.comma, rest_item), max(lo - 1, 0), None if hi is None else hi - 1))
        if lo == 0:
            body = opt(body)
        if hi == 0:
            body = EPSILON
        return seq(lit(open_), self.ws, body, self.ws, lit(close))

    def any_value(self):
        """Any JSON value: scalars inline, containers the recursive rule ``JSON_RULE`` (one stack frame each)."""
        scalars = alt(self.string, number_range(None, None), lit("true"), lit("false"), lit("null"))
        if JSON_RULE not in self.rules:
            self.rules[JSON_RULE] = EPSILON  # reserved: the body below calls the rule
            value = alt(scalars, Call(JSON_RULE))
            member = seq(self.string, self.colon, value)
            self.rules[JSON_RULE] = alt(self.container("{", "}", member, member), self.container("[", "]", value, value))
        return alt(scalars, Call(JSON_RULE))

    def literal(self, value):
        return lit(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    # ------------------------------------------------------------------ schemas
    def compile(self, schema, path: str = "#"):
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            return EMPTY
        if not isinstance(schema, dict):
            raise self.error(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
        for key in schema:
            if key in _UNSUPPORTED:
                raise self.error(path, f"keyword {key!r} is not supported")
        if "$ref" in schema:
            return self.ref(schema, path)
        if "allOf" in schema:
            return self.compile(self.merge_all_of(schema, path), path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.union(schema, key, path)
        if "enum" in schema or "const" in schema:
            return self.enum(schema, path)
        types = schema.get("type")
        if types is None:
            implied = [t for t, keys in _FAMILIES.items() if keys & schema.keys()]
            types = implied or ["object", "array", "string", "number", "boolean", "null"]
        if isinstance(types, str):
            types = [types]
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        return alt(*(self.typed(schema, t, path) for t in types))

    def ref(self, schema, path):
        ref = schema["$ref"]
        extra = set(schema) - {"$ref"} - _ANNOTATIONS
        if extra:
            raise self.error(path, f"'$ref' with sibling keyword(s) {sorted(extra)} is not supported")
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.error(path, f"only local '$ref' (starting with '#') is supported, got {ref!r}")
        target = self.resolve(ref, path)
        if ref in self.active:  # a cycle: the schema is a rule entered on the stack
            self.rules.setdefault(ref, None)
            return Call(ref)
        self.active.add(ref)
        try:
            return self.compile(target, ref)
        finally:
            self.active.discard(ref)

    def grammar(self, root):
        """``root`` when nothing recursed, else a :class:`Grammar` with the recursive rules (built here)."""
        while any(body is None for body in self.rules.values()):
            for ref in [r for r, body in self.rules.items() if body is None]:
                self.active = {ref}
                self.rules[ref] = self.compile(self.resolve(ref, ref), ref)
        return Grammar({"$root": root, **self.rules}, "$root", self.max_depth) if self.rules else root

    def regular(self, expr):
        """``expr`` with each call replaced by a regular superset (the callee's first character, then
        anything): enough to prove ``oneOf`` branches disjoint."""
        if isinstance(expr, Call):
            first = "{[" if expr.rule == JSON_RULE else self.first_chars(self.resolve(expr.rule, expr.rule), {expr.rule})
            return seq(chars([(ord(c), ord(c)) for c in first]), star(Chars(complement(()))))
        if isinstance(expr, (Seq, Alt)):
            return (seq if isinstance(expr, Seq) else alt)(*map(self.regular, expr.items))
        if isinstance(expr, Repeat):
            return repeat(self.regular(expr.item), expr.lo, expr.hi)
        return expr

    def first_chars(self, schema, seen: set) -> str:
        """Characters a value of ``schema`` may start with (a superset)."""
        every = "".join(sorted(set("".join(_FIRST.values()))))
        if not isinstance(schema, dict) or not schema:
            return every
        if "$ref" in schema:
            ref = schema["$ref"]
            return every if ref in seen else self.first_chars(self.resolve(ref, ref), seen | {ref})
        for key in ("anyOf", "oneOf"):
            if key in schema and isinstance(schema[key], list):
                return "".join(sorted({c for sub in schema[key] for c in self.first_chars(sub, seen)}))
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else list(schema["enum"])
            return "".join(sorted({json.dumps(v)[0] for v in values})) or every
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or "allOf" in schema or any(t not in _FIRST for t in types):
            return every
        return "".join(sorted({c for t in types for c in _FIRST[t]}))

    def merge_all_of(self, schema, path):
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for i, sub in enumerate(schema["allOf"]):
            if isinstance(sub, dict) and "$ref" in sub and len(sub) == 1:
                sub = self.resolve(sub["$ref"], f"{path}/allOf/{i}")
            if not isinstance(sub, dict):
                raise self.error(f"{path}/allOf/{i}", "allOf items must be objects")
            for k, v in sub.items():
                if k == "properties":
                    props = dict(merged.get("properties", {}))
                    for name, p in v.items():
                        if name in props and props[name] != p:
                            raise self.error(path, f"allOf: conflicting definitions of property {name!r}")
                        props[name] = p
                    merged["properties"] = props
                elif k == "required":
                    merged["required"] = list(dict.fromkeys(list(merged.get("required", [])) + list(v)))
                elif k in merged and merged[k] != v and k not in _ANNOTATIONS:
                    raise self.error(path, f"allOf: conflicting values for keyword {k!r} are not supported")
                else:
                    merged[k] = v
        return merged

    def resolve(self, ref, path):
        """The subschema a local JSON pointer names."""
        target = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            try:
                target = target[int(part) if isinstance(target, list) else part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise self.error(path, f"'$ref' {ref!r} does not resolve") from None
        return target

    def union(self, schema, key, path):
        extra = set(schema) - {key} - _ANNOTATIONS
        if extra:
            raise self.error(path, f"{key!r} with sibling keyword(s) {sorted(extra)} is not supported")
        branches = [self.compile(s, f"{path}/{key}/{i}") for i, s in enumerate(schema[key])]
        if key == "oneOf":
            dfas = []
            for i, b in enumerate(branches):
                if b == EMPTY:
                    continue
                d = compile_expr(self.regular(b))
                for j, other in dfas:
                    if intersects(d, other):
                        raise self.error(path, f"'oneOf' branches {j} and {i} overlap (anyOf semantics would under-constrain)")
                dfas.append((i, d))
        return alt(*branches)

    def enum(self, schema, path):
        extra = set(schema) - {"enum", "const", "type"} - _ANNOTATIONS
        if extra:
            raise self.error(path, f"'enum'/'const' combined with {sorted(extra)} is not supported")
        values = list(schema["enum"]) if "enum" in schema else []
        if "const" in schema:
            values = [v for v in values if v == schema["const"]] if "enum" in schema else [schema["const"]]
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            values = [v for v in values if any(_is_type(v, t) for t in types)]
        return alt(*(self.literal(v) for v in values)) if values else EMPTY

    def typed(self, schema, t, path):
        if t == "null":
            return lit("null")
        if t == "boolean":
            return alt(lit("true"), lit("false"))
        if t in ("integer", "number"):
            return self.number(schema, t, path)
        if t == "string":
            return self.string_schema(schema, path)
        if t == "array":
            return self.array(schema, path)
        if t == "object":
            return self.object(schema, path)
        raise self.error(path, f"unknown type {t!r}")

    def number(self, schema, t, path):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        lo_x, hi_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        lo_excl = hi_excl = False
        if isinstance(lo_x, bool):  # draft 4
            lo_excl, lo_x = lo_x, None
        if isinstance(hi_x, bool):
            hi_excl, hi_x = hi_x, None
        if lo_x is not None and (lo is None or lo_x >= lo):
            lo, lo_excl = lo_x, True
        if hi_x is not None and (hi is None or hi_x <= hi):
            hi, hi_excl = hi_x, True
        mult = schema.get("multipleOf")
        if mult is not None:
            if mult != 1:
                raise self.error(path, f"keyword 'multipleOf' ({mult}) is not supported (only 1)")
            t = "integer"
        if t == "integer":
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl and lo == math.floor(lo) else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl and hi == math.ceil(hi) else math.floor(hi))
            if ilo is not None and ihi is not None and ilo > ihi:
                return EMPTY
            return integer_range(ilo, ihi)
        for name, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and v != math.floor(v):
                raise self.error(path, f"keyword {name!r} with a non-integer bound ({v}) is not supported for numbers")
        return number_range(None if lo is None else int(lo), None if hi is None else int(hi), lo_excl, hi_excl)

    def string_schema(self, schema, path):
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        pattern, fmt = schema.get("pattern"), schema.get("format")
        if pattern is not None and fmt is not None:
            raise self.error(path, "'pattern' together with 'format' is not supported")
        if (pattern is not None or fmt is not None) and (lo > 0 or hi is not None):
            raise self.error(path, "'minLength'/'maxLength' together with 'pattern'/'format' is not supported")
        if fmt is not None:
            if fmt not in FORMATS:
                raise self.error(path, f"keyword 'format' value {fmt!r} is not supported (known: {sorted(FORMATS)})")
            return seq(lit('"'), _json_encoded(_regex.parse_regex(FORMATS[fmt])), lit('"'))
        if pattern is not None:
            return seq(lit('"'), _json_encoded(self.pattern(pattern, path)), lit('"'))
        return seq(lit('"'), repeat(_STRING_CHAR, lo, None if hi is None else int(hi)), lit('"'))

    def pattern(self, pattern, path):
        try:
            expr = _regex.parse_regex(pattern)
        except GrammarError as e:
            raise self.error(path, f"'pattern': {e}") from None
        anchored_start = pattern.startswith("^")
        anchored_end = pattern.endswith("$") and not pattern.endswith("\\$")
        if isinstance(expr, Alt) and (anchored_start or anchored_end) and _top_level_bar(pattern):
            raise self.error(path, f"'pattern' {pattern!r}: anchors inside a top-level alternation are not supported")
        anything = star(Chars(complement(())))
        return seq(EPSILON if anchored_start else anything, expr, EPSILON if anchored_end else anything)

    def array(self, schema, path):
        if schema.get("uniqueItems") and schema.get("maxItems", 2) > 1:
            raise self.error(path, "keyword 'uniqueItems' is not supported")
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        hi = None if hi is None else int(hi)
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):  # draft 4 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = [self.compile(p, f"{path}/prefixItems/{i}") for i, p in enumerate(prefix)]
        rest = self.compile(items, f"{path}/items")
        elems = prefix + [rest]
        k = len(prefix)

        def tail(i):  # the elements after position i-1 (i >= 1 elements already written)
            if i >= k:
                more = repeat(seq(self.comma, rest), max(lo - i, 0), None if hi is None else hi - i)
                return more
            nxt = seq(self.comma, elems[i], tail(i + 1)) if hi is None or i < hi else EMPTY
            return alt(EPSILON, nxt) if i >= lo else nxt

        body = seq(elems[0], tail(1)) if hi is None or hi >= 1 else EMPTY
        if lo == 0:
            body = alt(EPSILON, body)
        return seq(lit("["), self.ws, body, self.ws, lit("]"))

    def object(self, schema, path):
        props = schema.get("properties", {})
        required = list(schema.get("required", []))
        additional = schema.get("additionalProperties")
        missing = [r for r in required if r not in props]
        if missing:
            raise self.error(path, f"'required' names undeclared properties {missing}")
        if not props:
            if additional is None or additional is True:
                return self.any_object()
            value = self.compile(additional, f"{path}/additionalProperties")
            member = seq(self.string, self.colon, value)
            return self.container("{", "}", member, member)
        if additional not in (None, False):
            raise self.error(path, "'additionalProperties' other than false next to 'properties' is not supported")
        members = [
            (seq(self.literal(name), self.colon, self.compile(sub, f"{path}/properties/{name}")), name in required)
            for name, sub in props.items()
        ]
        members = [(m, r) for m, r in members if m != EMPTY or r]
        if any(m == EMPTY for m, _ in members):
            return EMPTY
        # rest[j]: properties j.. after at least one was written; first member may be any up to the first required.
        rest = [EPSILON] * (len(members) + 1)
        for j in range(len(members) - 1, -1, -1):
            m, req = members[j]
            step = seq(self.comma, m)
            rest[j] = seq(step if req else opt(step), rest[j + 1])
        firsts = []
        for i, (m, req) in enumerate(members):
            firsts.append(seq(m, rest[i + 1]))
            if req:
                break
        body = alt(*firsts)
        if not any(r for _, r in members):
            body = opt(body)
        return seq(lit("{"), self.ws, body, self.ws, lit("}"))

    def any_object(self):
        member = seq(self.string, self.colon, self.any_value())
        return self.container("{", "}", member, member)


def _top_level_bar(pattern: str) -> bool:
    depth, i, in_class = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def _is_type(value, t: str) -> bool:
    return {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool)
        or isinstance(value, float) and value.is_integer(),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(t, False)


def schema_expr(
    schema: Any,
    *,
    whitespace: str = "bounded",
    max_whitespace: int = 20,
    max_depth: int = DEFAULT_MAX_DEPTH,
):
    """Expression tree of the JSON documents a schema accepts, or a :class:`~jaxsample.structured.pushdown.Grammar`
    when it recurses (see the module docstring).

    Args:
      schema: the schema (a dict, a bool, or its JSON text).
      whitespace: ``"compact"`` (none), ``"bounded"`` (default: at each separator nothing, one
        space, or a newline plus at most ``max_whitespace`` spaces/tabs, as llama.cpp) or ``"free"``
        (any ``[ \\t\\n\\r]*``; beware run-on whitespace with small models).
      max_whitespace: indentation bound of the bounded mode.
      max_depth: stack frames of a recursive schema: each nested ``$ref`` on a cycle, and each
        container inside a generic value (``{}``/``true``: its outermost container is free when the
        value ends the document), takes one. The default limit of the compiled tables, changeable
        per batch on the device.

    Raises:
      GrammarError: unsupported keyword or invalid schema (the message names keyword and location).
    """
    if isinstance(schema, (str, bytes)):
        schema = json.loads(schema)
    c = _Compiler(schema, whitespace, max_whitespace, max_depth)
    return c.grammar(c.compile(schema))
