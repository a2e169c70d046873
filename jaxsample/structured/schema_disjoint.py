"""Proofs that no JSON value is valid under two schemas (``oneOf`` branches), or no proof.

A ``oneOf`` compiled as a union is exact only if no value is valid under two branches. Comparing
the *compiled* languages is not enough (they are subsets: two closed objects can be disjoint as
bytes while one value satisfies both schemas), so the proof reasons on the schemas: per JSON type
the branches' outputs can have, disjoint types, ``enum`` sets, number intervals, length/count
intervals, string languages (exact formats only), array positions both require, a property
both require with disjoint schemas (a discriminator), property counts (required names included),
``enum`` values the other schema's ``not`` rejects, or names one requires and the other forbids
(``not: {required: [...]}``). ``False`` means "not proven".

>>> from jaxsample.structured.json_schema import schema_expr
>>> _ = schema_expr({"oneOf": [{"properties": {"t": {"const": 1}}, "required": ["t"]},
...                            {"properties": {"t": {"const": 2}}, "required": ["t"]}]})
"""

from __future__ import annotations

import json
from decimal import Decimal

from jaxsample.structured import schema_merge as sm
from jaxsample.structured.automaton import GrammarError, compile_expr, intersects
from jaxsample.structured.json_text import canonical_json, escape


class Disjoint:
    """Proofs that no value the compiler produces for one schema is valid under another (``oneOf``).

    :meth:`schemas` proves both directions; :meth:`directed` one: ``L(a)``, the compiled (lower)
    language of ``a``, against ``T(b)``, all values valid under ``b``. ``False`` = not proven.
    """

    MAX_DEPTH = 4

    def __init__(self, c):
        self.c = c
        self._negated: dict = {}

    def schemas(self, a, b, depth) -> bool:
        return self.directed(a, b, depth) and self.directed(b, a, depth)

    def directed(self, a, b, depth) -> bool:
        if a is False or b is False:
            return True
        if a is True or b is True or depth > self.MAX_DEPTH:
            return False
        for key in ("anyOf", "oneOf"):  # L(a) and T(b) are the unions of their branches'
            if key in a:
                rest = {k: v for k, v in a.items() if k != key}
                return all(self.directed(self.view({"allOf": [rest, x]}), b, depth + 1) for x in a[key])
            if key in b:
                rest = {k: v for k, v in b.items() if k != key}
                return all(self.directed(a, self.view({"allOf": [rest, x]}), depth + 1) for x in b[key])
        common = self.types(a, lower=self.c.opts["untyped"] == "implied") & self.types(b, lower=False)
        if common and "enum" in a and "enum" in b:  # (the types filter the values: none in common = disjoint)
            return not any(sm.json_equal(x, y) for x in a["enum"] for y in b["enum"])
        return all(self.of_type(a, b, t, depth) for t in common)

    def view(self, schema):
        try:
            return self.c.view(schema, "", [])
        except GrammarError:
            return True  # unknown: assume it may contain anything

    @staticmethod
    def types(s, lower: bool) -> set:
        """The JSON types of ``L(s)`` (``lower``: types implied by keywords, the compiler's default) or of ``T(s)``."""
        t = sm.types_of(s)
        if "enum" in s:
            found = {sm.json_type(v) for v in s["enum"]}
            t = found if t is None else {x for x in found if any(x == y or (x, y) == ("integer", "number") for y in t)}
        if t is None:
            implied = {k for k, keys in sm.FAMILIES.items() if keys & s.keys()} if lower else set()
            t = implied or set(sm.ALL_TYPES) | {"integer"}
        if "number" in t:
            t = t | {"integer"}
        return t

    def of_type(self, a, b, t, depth) -> bool:
        """No value of type ``t`` in ``L(a)`` is valid under ``b``."""
        if "enum" in a or "enum" in b:
            e, other = (a, b) if "enum" in a else (b, a)
            vals = [v for v in e["enum"] if sm.json_type(v) == t or (t == "number" and sm.json_type(v) == "integer")]
            vals = [v for v in vals if not self.negated(other, v)]
            if not vals:
                return True
            if t == "string" and not self.other_keys(other, "string"):
                return False
            if t == "string":
                d = self.c.string_upper({k: v for k, v in other.items() if k in sm.FAMILIES["string"]}, "")
                return not any(d.matches(escape(v).encode()) for v in vals)
            return False
        if t in ("integer", "number"):
            return _intervals_disjoint(_interval(a), _interval(b))
        if t == "string":
            if _intervals_disjoint(_count(a, "Length"), _count(b, "Length")):
                return True
            if not (self.other_keys(a, "string") and self.other_keys(b, "string")):
                return False
            da = self.c.string_upper({k: v for k, v in a.items() if k in sm.FAMILIES["string"]}, "")
            db = self.c.string_upper({k: v for k, v in b.items() if k in sm.FAMILIES["string"]}, "")
            return not intersects(da, db)
        if t == "array":
            if _intervals_disjoint(_count(a, "Items"), _count(b, "Items")):
                return True
            need = min(a.get("minItems", 0), b.get("minItems", 0))
            pairs = ((self.view(_item(a, i)), self.view(_item(b, i))) for i in range(min(need, 8)))
            return any(self.directed(x, y, depth + 1) for x, y in pairs)
        if t == "object":
            if _intervals_disjoint(_count(a, "Properties"), _count(b, "Properties")):
                return True
            ra, rb = set(a.get("required", [])), set(b.get("required", []))
            for name in rb:  # b needs a name our objects for a never write, or write with other values
                if self.never_written(a, name):
                    return True
                if name in ra:
                    x, y = self.view(self.prop(a, name)), self.view(self.prop(b, name))
                    if self.directed(x, y, depth + 1):
                        return True
            if any(self.prop(b, name) is False for name in ra):  # a always writes a name b forbids
                return True
            return _lacks_one(a, rb) or _lacks_one(b, ra)  # one never has all the names the other requires
        return False

    @staticmethod
    def accepted_types(a, b) -> set:
        """The types every value of which is valid under both ``a`` and ``b`` (neither constrains them)."""
        if a is None or b is None or a is False or b is False:
            return set()
        out = set()
        for t in ("null", "boolean", "string", "number", "array", "object"):
            for s in (a, b):
                if s is True:
                    continue
                if {"enum", "anyOf", "oneOf", "_not", "_not_strings"} & s.keys() or sm.FAMILIES.get(t, set()) & s.keys():
                    break
                types = sm.types_of(s)
                if types is not None and t not in types:
                    break
            else:
                out.add(t)
        return out

    def required_objects(self, s, untyped) -> list | None:
        """The names a schema whose compiled values are objects only requires, else ``None``."""
        if not isinstance(s, dict) or self.types(s, lower=untyped == "implied") != {"object"}:
            return None
        return sorted(set(s.get("required", [])))

    def negated(self, s, value) -> bool:
        """Whether ``s`` rejects ``value`` through a ``not`` (``value`` meets a negated schema)."""
        text = canonical_json(value).encode()
        return any(d is not None and d.matches(text) for d in map(self.negated_language, s.get("_not", [])))

    def negated_language(self, n):
        """The compiled language of a negated schema (a subset of its values: a match is proof), or ``None``."""
        key = json.dumps(n, sort_keys=True, default=repr)
        if key not in self._negated:
            checker = self.c.sub(whitespace="compact", whitespace_pattern=None, separators=None, open_objects=True,
                                 untyped="any")  # fmt: skip
            try:
                self._negated[key] = compile_expr(checker.grammar(checker.compile(n, "")))
            except GrammarError:
                self._negated[key] = None
        return self._negated[key]

    def never_written(self, s, name) -> bool:
        """Whether the compiled objects of ``s`` never have property ``name`` (closed, undeclared)."""
        if name in s.get("properties", {}):
            return s["properties"][name] is False
        named = set(s.get("required", [])) | set(s.get("dependentRequired", {}))
        named |= {n for deps in s.get("dependentRequired", {}).values() for n in deps}
        named |= {n for p in s.get("_presence", []) for n in sm.predicate_names(p)}
        if name in named:  # the compiler declares names its predicate needs
            return False
        if any(self.c.pattern_dfa(p, "").matches(escape(name).encode()) for p in s.get("patternProperties", {})):
            return False
        extra = s.get("additionalProperties", s.get("unevaluatedProperties"))
        return extra is False or extra is None and not self.c.opts["open_objects"]

    @staticmethod
    def other_keys(s, family) -> bool:
        return bool(sm.FAMILIES[family] & s.keys())

    def prop(self, s, name):
        """The schema ``s`` applies to property ``name`` (JSON Schema meaning)."""
        if name in s.get("properties", {}):
            return s["properties"][name]
        return self.c.name_schema(s, name)


def _lacks_one(s, names) -> bool:
    """Whether ``s`` forbids objects holding all of ``names`` (``not: {required: [subset]}``)."""
    for n in s.get("_not", []):
        n = sm.normalise(n, "") if isinstance(n, dict) else None
        keys = None if n is None else {k for k in n if k not in sm.ANNOTATIONS}
        if keys == {"required"} and n["required"] and set(n["required"]) <= set(names):
            return True
    return False


def _interval(s):
    lo, hi = s.get("minimum"), s.get("maximum")
    lx, hx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    lo_e = hi_e = False
    if lx is not None and (lo is None or lx >= lo):
        lo, lo_e = lx, True
    if hx is not None and (hi is None or hx <= hi):
        hi, hi_e = hx, True
    return (None if lo is None else Decimal(repr(lo)), lo_e, None if hi is None else Decimal(repr(hi)), hi_e)


def _count(s, what):
    lo, hi = s.get(f"min{what}", 0), s.get(f"max{what}")
    if what == "Properties":  # every required name is a property
        lo = max(lo, len(set(s.get("required", []))))
    return (Decimal(lo), False, None if hi is None else Decimal(hi), False)


def _intervals_disjoint(x, y) -> bool:
    for (lo, lo_e, _, _), (_, _, hi, hi_e) in ((x, y), (y, x)):
        if lo is not None and hi is not None and (lo > hi or lo == hi and (lo_e or hi_e)):
            return True
    return False


def _item(s, i):
    prefix = s.get("prefixItems", [])
    return prefix[i] if i < len(prefix) else s.get("items", True)
