"""JSON schema compiler: generated documents validate, bounds are exact, unsupported keywords raise."""

import json
import re

import numpy as np
import pytest

from jaxsample.structured import automaton as am
from jaxsample.structured.json_schema import schema_expr
from jaxsample.structured.numbers import integer_range, number_range
from tests.test_structured_regex import random_member

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        },
        "required": ["name", "age"],
    },
    "all_optional": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"enum": [1, "x", [2], {"k": None}]}},
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 15},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
    },
    "numbers": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": -5, "maximum": 10},
            {"type": "number", "exclusiveMinimum": 0},
            {"type": ["integer", "null"], "maximum": -7},
        ],
        "items": {"type": "number"},
        "minItems": 2,
        "maxItems": 5,
    },
    "formats": {
        "type": "object",
        "properties": {k: {"type": "string", "format": k} for k in ("date", "date-time", "uuid", "ipv4", "hostname")},
        "required": ["date", "uuid"],
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "any_and_maps": {
        "type": "object",
        "properties": {
            "meta": {},
            "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"anyOf": [{"type": "string", "pattern": "a|b"}, {"type": "array", "items": {"type": "boolean"}}]},
            "one": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        },
        "required": ["meta", "either"],
    },
    "all_of": {
        "allOf": [
            {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            {"properties": {"y": {"type": "string"}}, "required": ["y"]},
        ]
    },
}
_DFAS = {}


def dfa(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _DFAS:
        _DFAS[key] = am.compile_expr(schema_expr(SCHEMAS[name], **kw))
    return _DFAS[key]


def _closed(schema):
    """The schema with additionalProperties: false wherever properties are listed (our default)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out:
            out.setdefault("additionalProperties", False)
        if "allOf" in out:  # branches are merged before closing: close the union of their properties
            names = {n: {} for b in schema["allOf"] for n in b.get("properties", {})}
            out["allOf"] = [{k: v for k, v in b.items() if k != "additionalProperties"} for b in out["allOf"]]
            out.update(properties=names, additionalProperties=False)
        return out
    if isinstance(schema, list):
        return [_closed(x) for x in schema]
    return schema


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("whitespace", ["compact", "bounded", "free"])
def test_every_generated_document_validates(name, whitespace):
    d = dfa(name, whitespace=whitespace)
    validator = jsonschema.Draft202012Validator(_closed(SCHEMAS[name]), format_checker=jsonschema.FormatChecker())
    rng = np.random.default_rng(len(name))
    for _ in range(25):
        doc = random_member(d, rng, stop=0.2, limit=400).decode("utf-8")
        validator.validate(json.loads(doc))
        if whitespace == "compact":
            assert not re.search(r"[\n\t]", doc)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_canonical_valid_documents_are_accepted(name):
    """Compact serialisations of valid documents (in schema property order) are in the language."""
    docs = {
        "person": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 0, "email": "b@x.io", "tags": ["a", "bb"]}],
        "all_optional": [{}, {"c": 1}, {"a": True, "b": None, "c": "x"}],
        "tool_call": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 14}}],
        "numbers": [[-5, 0.5], [10.0, 3e-0 and 3, None, 1.5e3, -2], [0.25, 1, -7]],
        "formats": [{"date": "2024-02-28", "uuid": "123e4567-e89b-12d3-a456-426614174000"}],
        "recursive": [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": -4}]}],
        "any_and_maps": [{"meta": {"x": [1, {"y": None}]}, "scores": {"a": 1, "b": -2}, "either": "zaz", "one": 3}],
        "all_of": [{"x": 1, "y": "s"}],
    }[name]
    for doc in docs:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        assert dfa(name, whitespace="compact").matches(text.encode()), text
        pretty = json.dumps(doc, indent=2, ensure_ascii=False)
        assert dfa(name, whitespace="bounded").matches(pretty.encode()), pretty


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_invalid_documents_are_rejected(name):
    """Random single-byte edits of generated documents: accepted ones must still validate."""
    d = dfa(name, whitespace="compact")
    validator = jsonschema.Draft202012Validator(_closed(SCHEMAS[name]), format_checker=jsonschema.FormatChecker())
    rng = np.random.default_rng(1)
    for _ in range(40):
        doc = bytearray(random_member(d, rng, stop=0.2, limit=300))
        i = int(rng.integers(len(doc)))
        doc[i : i + 1] = bytes([int(rng.choice(list(b'0123456789-.,:{}[]"aeE \\')))])
        if d.matches(bytes(doc)):
            validator.validate(json.loads(bytes(doc).decode()))


@pytest.mark.parametrize(
    "lo, hi", [(None, None), (0, None), (-3, 120), (7, 7), (-120, -5), (95, 1005), (None, -10), (-999, 0), (1, 9)]
)
def test_integer_ranges_are_exact(lo, hi):
    d = am.compile_expr(integer_range(lo, hi))
    for n in range(-1200, 1200):
        ok = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert d.matches(str(n).encode()) == ok, n
    assert not d.matches(b"-0") and not d.matches(b"007") and not d.matches(b"")


@pytest.mark.parametrize("lo, hi, lx, hx", [(0, 10, False, False), (-5, 3, True, True), (None, 0, False, True),
                                            (2, None, True, False), (-4, -1, False, False)])  # fmt: skip
def test_number_ranges_are_exact(lo, hi, lx, hx):
    d = am.compile_expr(number_range(lo, hi, lx, hx))
    for text in ["0", "0.0", "-0.5", "0.5", "10", "10.0", "10.01", "-5", "-5.0", "-4.99", "3", "3.000", "2",
                 "2.0001", "-1", "-1.5", "-4", "-4.0001", "7.25", "-0.0001", "1e3", "00.5", "1.", ".5"]:  # fmt: skip
        v = float(text) if re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", text) else None
        ok = v is not None and (lo is None or (v > lo if lx else v >= lo)) and (hi is None or (v < hi if hx else v <= hi))
        ok = ok and not (text.startswith("-") and v == 0)  # "-0" forms are not produced
        assert d.matches(text.encode()) == ok, text


def test_whitespace_modes():
    s = {"type": "array", "items": {"type": "integer"}}
    compact, bounded, free = (am.compile_expr(schema_expr(s, whitespace=w, max_whitespace=4)) for w in ("compact", "bounded", "free"))
    assert compact.matches(b"[1,2]") and not compact.matches(b"[1, 2]")
    assert bounded.matches(b"[1, 2]") and bounded.matches(b"[\n    1,\n    2\n]") and not bounded.matches(b"[\n     1]")
    assert not bounded.matches(b"[1,  2]")
    assert free.matches(b"[ \n\t\r 1 ,\n\n  2 ]")
    with pytest.raises(ValueError, match="whitespace"):
        schema_expr(s, whitespace="pretty")


def test_recursion_is_a_stack_of_max_depth_frames():
    """A $ref cycle is entered on the stack (not unrolled): each nested node takes one frame."""
    d = am.compile_expr(schema_expr(SCHEMAS["recursive"], whitespace="compact", max_depth=5))
    deep = {"v": 0}
    for depth in range(1, 40):
        deep = {"v": depth, "kids": [deep]}
        text = json.dumps(deep, separators=(",", ":")).encode()
        assert d.matches(text) == (depth <= 5) and d.matches(text, max_depth=depth) and not d.matches(text, max_depth=depth - 1)


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {}, "then": {}}, "if"),
        ({"type": "object", "patternProperties": {"a": {}}}, "patternProperties"),
        ({"type": "object", "minProperties": 1}, "minProperties"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "number", "minimum": 0.5}, "minimum"),
        ({"type": "string", "format": "ipv6"}, "format"),
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
        ({"$ref": "http://example.com/s.json"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "$ref"),
        ({"type": "string", "pattern": "a(?=b)"}, "look-around"),
        ({"type": "string", "pattern": "^a", "maxLength": 3}, "maxLength"),
        ({"enum": ["a", "bbb"], "maxLength": 2}, "maxLength"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
        ({"anyOf": [{"type": "string"}], "minLength": 2}, "anyOf"),
        ({"type": "tuple"}, "tuple"),
    ],
)
def test_unsupported_features_raise_naming_the_keyword(schema, keyword):
    with pytest.raises(am.GrammarError, match=re.escape(keyword)):
        schema_expr(schema)


def test_error_names_the_location():
    with pytest.raises(am.GrammarError, match="#/properties/a/properties/b"):
        schema_expr({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"not": {}}}}}})


def test_annotations_and_unknown_keywords_are_ignored_and_false_is_empty():
    d = am.compile_expr(schema_expr({"type": "boolean", "title": "t", "x-custom": 1, "description": "d"}))
    assert d.matches(b"true") and not d.matches(b"1")
    with pytest.raises(am.EmptyLanguageError):
        am.compile_expr(schema_expr(False))
    with pytest.raises(am.EmptyLanguageError):
        am.compile_expr(schema_expr({"type": "integer", "minimum": 5, "maximum": 4}))


def test_pattern_is_a_search_unless_anchored_and_strings_are_json_encoded():
    unanchored = am.compile_expr(schema_expr({"type": "string", "pattern": "ab"}))
    assert unanchored.matches(b'"xxabyy"') and not unanchored.matches(b'"xxa"')
    quote = am.compile_expr(schema_expr({"type": "string", "pattern": '^a"\\n$'}))
    assert quote.matches(b'"a\\"\\n"') and not quote.matches(b'"a"\n"')


def test_time_format_is_rfc3339():
    import datetime

    d = am.compile_expr(schema_expr({"type": "string", "format": "time"}))
    rng = np.random.default_rng(0)
    for _ in range(50):
        t = json.loads(random_member(d, rng, stop=0.5))
        datetime.datetime.fromisoformat("2024-01-01T" + t)
    assert d.matches(b'"23:59:59Z"') and not d.matches(b'"23:59:60Z"') and d.matches(b'"08:30:00.25+05:30"') and not d.matches(b'"24:00:00Z"')


def test_enum_objects_are_compact_in_every_mode():
    d = am.compile_expr(schema_expr({"enum": [{"k": [1, None]}]}))
    assert d.matches(b'{"k":[1,null]}') and not d.matches(b'{"k": [1, null]}')
