"""JSON Schema normalisation and intersection (``allOf``, keywords next to ``$ref``/``anyOf``/``oneOf``).

:func:`normalise` rewrites older drafts' forms into 2020-12 ones (boolean ``exclusiveMinimum``,
tuple ``items``/``additionalItems``, ``dependencies``, ``const``). :func:`merge` returns one
schema whose instances are exactly those valid under both inputs, or raises a
:class:`~jaxsample.structured.automaton.GrammarError` naming the keyword it cannot intersect.
Subschemas are merged lazily (``{"allOf": [a, b]}``), so references inside them stay references
and recursion is left to the compiler. Several ``pattern``/``format``/``not`` values are kept as
lists under the internal keys ``_patterns``/``_formats``/``_not``; presence conditions on object
properties (``required``, ``dependentRequired``, presence-only ``anyOf``/``oneOf``/``not``
branches) become predicates under ``_presence`` (see :func:`presence_predicate`).

>>> merge({"type": ["integer", "string"], "minimum": 0}, {"type": "number", "maximum": 5}, "")
{'type': ['integer'], 'minimum': 0, 'maximum': 5}
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

from jaxsample.structured.automaton import GrammarError

TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding", "contentMediaType", "contentSchema",
    "$anchor", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor",
})  # fmt: skip
ALL_TYPES = ("object", "array", "string", "number", "boolean", "null")
#: Type-specific keywords (after :func:`normalise`): they imply the type when ``type`` is absent.
FAMILIES = {
    "object": {"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
               "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
               "_presence"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
              "unevaluatedItems"},
    "string": {"minLength", "maxLength", "_patterns", "_formats"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}  # fmt: skip
#: Keywords that constrain values (others next to ``enum`` are annotations or unknown: ignored).
VALUE_KEYWORDS = frozenset().union(*FAMILIES.values(), {"_not", "_not_strings", "allOf", "anyOf", "oneOf", "$ref",
                                                        "dependentSchemas"})  # fmt: skip
#: Keywords of JSON Schema (drafts 4 to 2020-12) that constrain values and are never supported.
UNSUPPORTED = frozenset({"if", "then", "else", "maxContains", "$dynamicRef", "$recursiveRef"})
_MIN = ("minProperties", "minItems", "minLength", "minContains")
_MAX = ("maxProperties", "maxItems", "maxLength")
_LIST_KEYS = {"pattern": "_patterns", "format": "_formats", "not": "_not"}
#: Most branches an intersection of two ``anyOf``/``oneOf`` lists may produce.
MAX_PRODUCT = 64


def error(path: str, keyword: str, msg: str) -> GrammarError:
    """A :class:`GrammarError` naming the keyword and its JSON pointer (``.keyword``, ``.pointer``)."""
    pointer = f"{path}/{keyword}" if keyword else path or "/"
    err = GrammarError(f"JSON schema at {pointer}: {msg}")
    err.keyword, err.pointer = keyword, pointer
    return err


def pointer_token(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def json_equal(a, b) -> bool:
    """JSON value equality (``1 == 1.0``, ``True != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(v), "unknown")


def types_of(schema: dict) -> set[str] | None:
    """The ``type`` keyword as a set (``integer`` removed when ``number`` is present); ``None`` if absent."""
    t = schema.get("type")
    if t is None:
        return None
    out = {t} if isinstance(t, str) else set(t)
    if "number" in out:
        out.discard("integer")
    return out


def normalise(schema: dict, path: str) -> dict:
    """Older drafts' forms as 2020-12 keywords (a new dict; the input is not modified)."""
    s = dict(schema)
    for lo, name in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = s.get(name)
        if isinstance(flag, bool):  # draft 4
            del s[name]
            if flag and lo in s:
                s[name] = s.pop(lo)
    if isinstance(s.get("items"), list):  # tuple form (drafts 4-2019)
        s["prefixItems"] = s.pop("items")
        s["items"] = s.pop("additionalItems", True)
    else:
        s.pop("additionalItems", None)  # ignored without a tuple ``items``
    if "dependencies" in s:
        deps = s.pop("dependencies")
        if not isinstance(deps, dict):
            raise error(path, "dependencies", "must be an object")
        req = {k: v for k, v in deps.items() if isinstance(v, list)}
        sch = {k: v for k, v in deps.items() if not isinstance(v, list)}
        if req:
            s["dependentRequired"] = {**s.get("dependentRequired", {}), **req}
        if sch:
            s["dependentSchemas"] = {**s.get("dependentSchemas", {}), **sch}
    if "const" in s:
        const = s.pop("const")
        s["enum"] = [v for v in s["enum"] if json_equal(v, const)] if "enum" in s else [const]
    for key, internal in _LIST_KEYS.items():
        if key in s:
            s[internal] = [*s.get(internal, []), s.pop(key)]
    req = s.get("required")
    if req is not None and (not isinstance(req, list) or not all(isinstance(x, str) for x in req)):
        raise error(path, "required", "must be a list of strings")
    return s


def _lazy(a, b):
    """The intersection of two subschemas, left to the compiler (keeps references lazy)."""
    if a is True or a == {} or a == b:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def _lcm(a, b):
    fa, fb = (Fraction(Decimal(repr(x) if isinstance(x, float) else x)) for x in (a, b))
    num = math.lcm(fa.numerator * fb.denominator, fb.numerator * fa.denominator)
    r = Fraction(num, fa.denominator * fb.denominator)
    return int(r) if r.denominator == 1 else float(Decimal(r.numerator) / Decimal(r.denominator))


def _merge_types(a, b):
    ta, tb = types_of(a), types_of(b)
    if ta is None:
        return tb
    if tb is None:
        return ta
    out = set()
    for x in ta:
        for y in tb:
            if x == y or {x, y} == {"integer", "number"}:
                out.add("integer" if "integer" in (x, y) else x)
    return out


def merge(a: dict, b: dict, path: str, name_schema: Callable[[dict, str], Any] | None = None) -> dict:
    """One schema valid exactly where both ``a`` and ``b`` are (both normalised, no top-level ``$ref``).

    Args:
      name_schema: ``(object schema, name) -> schema`` of a property name the object does not
        declare (its matching ``patternProperties``, else ``additionalProperties``); defaults to
        ``additionalProperties`` only.

    Raises:
      GrammarError: for keywords whose intersection is not supported here.
    """
    name_schema = name_schema or (lambda s, n: s.get("additionalProperties", True))
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
            continue
        old = out[k]
        if k in ANNOTATIONS or k.startswith("x-") or old == v and k not in ("anyOf", "oneOf"):
            continue
        if k == "type":
            continue  # below
        elif k == "enum":
            out[k] = [x for x in old if any(json_equal(x, y) for y in v)]
        elif k in ("required",):
            out[k] = list(dict.fromkeys([*old, *v]))
        elif k in ("_patterns", "_formats", "_not", "_presence"):
            out[k] = [*old, *[x for x in v if x not in old]]
        elif k in _MIN:
            out[k] = max(old, v)
        elif k in _MAX:
            out[k] = min(old, v)
        elif k in ("minimum", "exclusiveMinimum"):
            out[k] = max(old, v)
        elif k in ("maximum", "exclusiveMaximum"):
            out[k] = min(old, v)
        elif k == "multipleOf":
            out[k] = _lcm(old, v)
        elif k == "uniqueItems":
            out[k] = bool(old) or bool(v)
        elif k in ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems"):
            out[k] = _lazy(old, v)
        elif k == "dependentRequired":
            out[k] = {n: list(dict.fromkeys([*old.get(n, []), *v.get(n, [])])) for n in {**old, **v}}
        elif k == "dependentSchemas":
            out[k] = {n: _lazy(old.get(n, True), v.get(n, True)) for n in {**old, **v}}
        elif k in ("properties", "patternProperties", "prefixItems"):
            continue  # below
        elif k in ("anyOf", "oneOf"):
            if len(old) * len(v) > MAX_PRODUCT:
                raise error(path, k, f"intersection of two {k!r} lists has more than {MAX_PRODUCT} branches")
            out[k] = [_lazy(x, y) for x in old for y in v]
        else:
            raise error(path, k, f"allOf: two different values of {k!r} cannot be intersected")
    types = _merge_types(a, b)
    if types is not None:
        out["type"] = sorted(types)
    if "prefixItems" in a or "prefixItems" in b:
        pa, pb = a.get("prefixItems", []), b.get("prefixItems", [])
        ia, ib = a.get("items", True), b.get("items", True)
        n = max(len(pa), len(pb))
        out["prefixItems"] = [_lazy(pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib) for i in range(n)]
    if "properties" in a or "properties" in b:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        props = {}
        for name in [*pa, *[n for n in pb if n not in pa]]:
            x = pa[name] if name in pa else name_schema(a, name)
            y = pb[name] if name in pb else name_schema(b, name)
            props[name] = _lazy(x, y)
        out["properties"] = props
    if "patternProperties" in a or "patternProperties" in b:
        pa, pb = a.get("patternProperties", {}), b.get("patternProperties", {})
        for mine, other_schema, other in ((pa, b, pb), (pb, a, pa)):
            extra = other_schema.get("additionalProperties", True)
            if any(p not in other for p in mine) and extra not in (True, {}):
                raise error(path, "patternProperties", "allOf: patternProperties next to additionalProperties "
                            "in another branch cannot be intersected")  # fmt: skip
        out["patternProperties"] = {p: _lazy(pa.get(p, True), pb.get(p, True)) for p in {**pa, **pb}}
    return out


# ------------------------------------------------------------------------------ presence predicates
def presence_only(schema) -> bool:
    """Whether a (normalised) schema constrains objects only through which properties are present."""
    if not isinstance(schema, dict):
        return False
    for k, v in schema.items():
        if k in ANNOTATIONS or k.startswith("x-"):
            continue
        if k == "required":
            continue
        if k == "type" and types_of(schema) == {"object"}:
            continue
        if k == "properties" and all(p in (True, False, {}) for p in v.values()):
            continue
        if k == "_not" and all(presence_only(normalise(x, "")) for x in v if isinstance(x, dict)):
            if all(isinstance(x, dict) for x in v):
                continue
        if k in ("anyOf", "oneOf", "allOf") and all(presence_only(normalise(x, "")) for x in v if isinstance(x, dict)):
            if all(isinstance(x, dict) for x in v):
                continue
        if k == "dependentRequired":
            continue
        return False
    return True


def presence_predicate(schema: dict):
    """Predicate tree of a presence-only schema: ``("all"|"any"|"one", [...])``, ``("not", p)``, ``("has", n)``."""
    parts = [("has", n) for n in schema.get("required", [])]
    for name, sub in schema.get("properties", {}).items():
        if sub is False:
            parts.append(("not", ("has", name)))
    for name, deps in schema.get("dependentRequired", {}).items():
        parts.append(("any", [("not", ("has", name)), ("all", [("has", d) for d in deps])]))
    for x in schema.get("_not", []):
        parts.append(("not", presence_predicate(normalise(x, ""))))
    for key, op in (("anyOf", "any"), ("oneOf", "one"), ("allOf", "all")):
        if key in schema:
            parts.append((op, [presence_predicate(normalise(x, "")) for x in schema[key]]))
    return ("all", parts)


def predicate_names(pred) -> set[str]:
    op, arg = pred
    if op == "has":
        return {arg}
    if op == "not":
        return predicate_names(arg)
    return set().union(*map(predicate_names, arg)) if arg else set()


def evaluate(pred, present: frozenset) -> bool:
    op, arg = pred
    if op == "has":
        return arg in present
    if op == "not":
        return not evaluate(arg, present)
    values = [evaluate(p, present) for p in arg]
    return all(values) if op == "all" else any(values) if op == "any" else sum(values) == 1
