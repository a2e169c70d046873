"""JSON schema compiler: generated documents validate, bounds are exact, unsupported keywords raise."""

import functools
import json
import re

import numpy as np
import pytest

from jaxsample.structured import automaton as am
from jaxsample.structured.json_schema import schema_expr
from jaxsample.structured.numbers import integer_range, number_range
from jaxsample.structured.pushdown import Pushdown
from tests._format_rules import RULES, loads, validator
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
    check = validator(_closed(SCHEMAS[name]))
    rng = np.random.default_rng(len(name))
    for _ in range(25):
        doc = random_member(d, rng, stop=0.2, limit=400).decode("utf-8")
        check.validate(loads(doc))
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
    check = validator(_closed(SCHEMAS[name]))
    rng = np.random.default_rng(1)
    for _ in range(40):
        doc = bytearray(random_member(d, rng, stop=0.2, limit=300))
        i = int(rng.integers(len(doc)))
        doc[i : i + 1] = bytes([int(rng.choice(list(b'0123456789-.,:{}[]"aeE \\')))])
        if d.matches(bytes(doc)):
            check.validate(loads(bytes(doc).decode()))


@pytest.mark.parametrize(
    "lo, hi", [(None, None), (0, None), (-3, 120), (7, 7), (-120, -5), (95, 1005), (None, -10), (-999, 0), (1, 9)]
)
def test_integer_ranges_are_exact(lo, hi):
    d = am.compile_expr(integer_range(lo, hi))
    for n in range(-1200, 1200):
        ok = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert d.matches(str(n).encode()) == ok, n
    zero_ok = (lo is None or lo <= 0) and (hi is None or hi >= 0)
    assert d.matches(b"-0") == zero_ok  # "-0" is valid JSON for the integer 0
    assert not d.matches(b"007") and not d.matches(b"") and not d.matches(b"-00") and not d.matches(b"1.0")


@pytest.mark.parametrize("lo, hi, lx, hx", [(0, 10, False, False), (-5, 3, True, True), (None, 0, False, True),
                                            (2, None, True, False), (-4, -1, False, False)])  # fmt: skip
def test_number_ranges_are_exact(lo, hi, lx, hx):
    d = am.compile_expr(number_range(lo, hi, lx, hx))
    for text in ["0", "0.0", "-0", "-0.00", "-0.5", "0.5", "10", "10.0", "10.01", "-5", "-5.0", "-4.99", "3", "3.000", "2",
                 "2.0001", "-1", "-1.5", "-4", "-4.0001", "7.25", "-0.0001", "1e3", "00.5", "1.", ".5"]:  # fmt: skip
        v = float(text) if re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", text) else None
        ok = v is not None and (lo is None or (v > lo if lx else v >= lo)) and (hi is None or (v < hi if hx else v <= hi))
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
    "schema, pointer",
    [
        ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "/uniqueItems"),
        ({"not": {"type": "number", "minimum": 3}}, "/not"),
        ({"if": {}, "then": {}}, "/if"),
        ({"type": "array", "contains": {}, "maxContains": 2}, "/maxContains"),
        ({"type": "string", "format": "regex"}, "/format"),
        ({"$ref": "http://example.com/s.json"}, "/$ref"),
        ({"$ref": "#/$defs/missing"}, "/$ref"),
        ({"type": "string", "pattern": "a(?=b)"}, "/pattern"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf"),
        ({"oneOf": [{"type": "object", "properties": {"a": {}}}, {"type": "object"}]}, "/oneOf"),
        ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "/properties/a/uniqueItems"),
        ({"properties": {"a~b/c": {"not": {"minimum": 1}}}}, "/properties/a~0b~1c/not"),
        ({"$defs": {"x": {"if": {}}}, "$ref": "#/$defs/x"}, "/$defs/x/if"),
        ({"type": "number", "multipleOf": 0.000012345}, "/multipleOf"),
        ({"allOf": [{"contains": {"type": "integer"}}, {"contains": {"type": "string"}}]}, "/contains"),
        ({"type": "tuple"}, "/type"),
    ],
)
def test_unsupported_features_raise_naming_keyword_and_pointer(schema, pointer):
    with pytest.raises(am.GrammarError) as e:
        schema_expr(schema)
    assert e.value.pointer == pointer and f"at {pointer}:" in str(e.value), str(e.value)
    assert e.value.keyword == pointer.rsplit("/", 1)[1]


def test_unknown_formats_are_annotations_unless_asked():
    d = am.compile_expr(schema_expr({"type": "string", "format": "byte"}))
    assert d.matches(b'"anything"')
    with pytest.raises(am.GrammarError, match="byte"):
        schema_expr({"type": "string", "format": "byte"}, unknown_formats="error")


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
    d = am.compile_expr(schema_expr({"type": "string", "format": "time"}))
    rng = np.random.default_rng(0)
    for _ in range(50):
        assert RULES["time"](json.loads(random_member(d, rng, stop=0.5)))
    assert d.matches(b'"23:59:59Z"') and not d.matches(b'"23:59:60Z"') and d.matches(b'"08:30:00.25+05:30"') and not d.matches(b'"24:00:00Z"')


def test_enum_containers_take_whitespace_and_any_member_order():
    d = am.compile_expr(schema_expr({"enum": [{"k": [1, None], "j": {}}]}))
    assert d.matches(b'{"k":[1,null],"j":{}}') and d.matches(b'{ "j": { }, "k": [1, null] }')
    assert not d.matches(b'{"k":[null,1],"j":{}}') and not d.matches(b'{"k":[1,null]}')
    d = am.compile_expr(schema_expr({"const": {"k": 1}}, whitespace="compact"))
    assert d.matches(b'{"k":1}') and not d.matches(b'{"k": 1}')


# ---------------------------------------------------------------------------------- coverage
UNION_OPEN = {"anyOf": [{"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                          "required": ["a"]},
                         {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}]}


# (schema, options, valid documents that must be accepted, documents that must be refused); every
# case is also checked by sampling: random accepted documents must validate (exact multipleOf,
# RFC formats, no duplicate keys).
CASES = {
    "any_order": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
                   "required": ["a", "b"]}, {},
                  [{"b": "x", "a": 1}, {"c": [1], "b": "", "a": 0}, {"a": 1, "b": "y", "c": None}],
                  ['{"a":1}', '{"a":1,"b":"x","a":2}', '{"a":1,"b":"x","d":0}']),
    "open_schema": ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "boolean"},
                     "required": ["a"]}, {},
                    [{"a": 1}, {"x": True, "a": 2, "y": False}],
                    ['{"a":1,"x":1}', '{"a":1,"a":2}', '{"x":true}']),
    "open_true": ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}, {},
                  [{"a": 1, "b": {"c": [1, "x"]}}, {"z": None}], ['{"a":"s"}']),
    "open_by_option": ({"type": "object", "properties": {"a": {"type": "integer"}}}, {"open_objects": True},
                       [{"a": 1, "b": 2}, {"q": "r"}], ['{"a":1.5}']),
    "pattern_properties": ({"type": "object", "properties": {"id": {"type": "string"}},
                            "patternProperties": {"^x-": {"type": "integer"}, "_n$": {"type": "number", "minimum": 0}},
                            "additionalProperties": False}, {},
                           [{"id": "1", "x-a": 3}, {"x-b": 1, "a_n": 0.5, "x-c_n": 7}],
                           ['{"x-a":"s"}', '{"y":1}', '{"x-c_n":-1}', '{"id":1}']),
    "property_names": ({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,3}$"},
                        "additionalProperties": {"type": "integer"}}, {},
                       [{}, {"ab": 1, "c": 2}], ['{"abcd":1}', '{"A":1}', '{"":1}']),
    "min_max_properties": ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2,
                            "maxProperties": 2}, {},
                           [{"a": 1, "b": 2}, {"c": 1, "a": 2}], ['{"a":1}', '{"a":1,"b":2,"c":3}', '{}']),
    "max_properties_map": ({"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 2,
                            "minProperties": 1}, {},
                           [{"k": "v"}, {"k": "v", "l": "w"}], ['{}', '{"a":"1","b":"2","c":"3"}']),
    "dependent_required": ({"type": "object", "properties": {"card": {"type": "string"}, "addr": {"type": "string"},
                                                             "name": {"type": "string"}},
                            "dependencies": {"card": ["addr"]}}, {},
                           [{"name": "x"}, {"card": "1", "addr": "a"}, {"addr": "a"}], ['{"card":"1"}']),
    "dependent_schemas": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentSchemas": {"a": {"properties": {"b": {"minimum": 10}}, "required": ["b"]}}}, {},
                          [{}, {"b": 1}, {"a": 1, "b": 10}], ['{"a":1}', '{"a":1,"b":9}']),
    "all_of_merge": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
                                 "required": ["a"]},
                                {"properties": {"a": {"maximum": 5}, "b": {"type": "string"}}, "required": ["b"]}]}, {},
                     [{"a": 3, "b": ""}, {"b": "x", "a": 5}], ['{"a":6,"b":""}', '{"a":1}', '{"a":-1,"b":"x"}']),
    "combinators_with_siblings": ({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"},
                                                                    "y": {"type": "integer"}},
                                   "oneOf": [{"required": ["x"]}, {"required": ["y"]}]}, {},
                                  [{"x": 1}, {"kind": "a", "y": 2}], ['{"x":1,"y":2}', '{}', '{"kind":"a"}']),
    "any_of_with_siblings": ({"type": "string", "maxLength": 4, "anyOf": [{"pattern": "^a"}, {"format": "date"}]}, {},
                             ["ab", "a"], ['"abcde"', '"2024-01-01"', '"b"']),
    "ref_with_siblings": ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}, {},
                          [3, 100], ["2", '"x"']),
    "ref_siblings_draft7": ({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"n": {"type": "integer"}},
                             "$ref": "#/definitions/n", "minimum": 3}, {},
                            [2, 3], ['"x"']),
    "enum_with_siblings": ({"enum": ["a", "bbb", 1, None], "type": "string", "maxLength": 2, "references": "x"}, {},
                           ["a"], ['"bbb"', "1", "null"]),
    "length_and_pattern": ({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3}, {},
                           ["ab", "xyz"], ['"a"', '"abcd"', '"A1"']),
    "length_and_format": ({"type": "string", "format": "ipv4", "maxLength": 8}, {},
                          ["1.2.3.4", "10.0.0.1"], ['"100.2.3.4"', '"1.2.3"']),
    "multiple_of_integer": ({"type": "integer", "multipleOf": 3, "minimum": -10, "maximum": 10}, {},
                            [-9, 0, 9, 3], ["10", "-10", "4"]),
    "multiple_of_decimal": ({"type": "number", "multipleOf": 0.25, "maximum": 2}, {},
                            [0.25, 1.5, -3, 2], ["0.3", "2.25", "0.125"]),
    "unique_items": ({"type": "array", "items": {"enum": ["x", "y", 1]}, "uniqueItems": True, "minItems": 1}, {},
                     [["x"], ["y", 1, "x"]], ['["x","x"]', "[]", '["x","y",1,"x"]']),
    "unique_booleans": ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, {},
                        [[], [True, False]], ["[true,true]"]),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "minContains": 2}, {},
                 [[5, 1, 6], [9, 9]], ["[5]", "[1,2,3]", "[]"]),
    "not_forms": ({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "string", "not": {"pattern": "x"}},
                                                    "c": {"not": {"type": "string"}}},
                   "not": {"required": ["b", "c"]}}, {},
                  [{"b": "y"}, {"c": 1}, {"c": [None]}], ['{"a":1}', '{"b":"x"}', '{"c":"s"}', '{"b":"y","c":1}']),
    "one_of_discriminated": ({"oneOf": [{"type": "object", "properties": {"t": {"const": "a"}, "v": {"type": "integer"}},
                                         "required": ["t"]},
                                        {"type": "object", "properties": {"t": {"const": "b"}, "v": {"type": "string"}},
                                         "required": ["t"]}]}, {},
                             [{"t": "a", "v": 1}, {"v": "s", "t": "b"}], ['{"t":"a","v":"s"}', '{"t":"c"}']),
    "one_of_by_required_names": ({"oneOf": [{"type": "object", "properties": {"x": {"type": "string"}, "y": {}},
                                             "required": ["x"]},
                                            {"type": "object", "properties": {"z": {"type": "integer"}},
                                             "required": ["z"]}]}, {},
                                 [{"x": "a"}, {"y": 1, "x": "b"}, {"z": 2}], ['{"x":"a","z":1}', "{}"]),
    "decimal_bounds": ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25}, {},
                       [0.5, 1, 2.2, 2.249], ["0.49", "2.25", "3"]),
    "unevaluated_items": ({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False}, {},
                          [[], [1]], ["[1,2]"]),
    "required_undeclared": ({"type": "object", "required": ["k"]}, {}, [{"k": [1]}], ["{}"]),
    # a typeless `not` of string keywords / presence: every other type is valid under the `not`'s
    # schema, so none is valid under the `not` (was accepted: 5, {}, "s")
    "not_of_untyped_string_keywords": ({"not": {"pattern": "^a"}}, {}, ["b", ""], ["5", "{}", '"a"', "null", "[]"]),
    "not_of_untyped_presence": ({"type": ["object", "string"], "not": {"required": ["a"]}}, {}, [{}],
                                ['"s"', '{"a":1}']),
    "not_of_typed_string_keywords": ({"not": {"type": "string", "pattern": "^a"}}, {}, ["b", 5, None, [1]], ['"a"']),
    # enum values filtered by sibling keywords in their JSON Schema meaning (was: "x" dropped,
    # `properties` implying objects)
    "enum_with_untyped_siblings": ({"enum": ["x", {"a": 1}, {"a": "y"}], "properties": {"a": {"type": "string"}}}, {},
                                   ["x", {"a": "y"}], ['{"a":1}']),
    # a schema without `type` is every type when asked (keywords apply to their own type)
    "untyped_any": ({"properties": {"a": {"type": "integer"}}, "items": {"type": "string"}, "maxLength": 1},
                    {"untyped": "any", "open_objects": True},
                    [{"a": 1}, {"b": [1, {}]}, ["x"], "s", 3, -0.5, None, True], ['{"a":"s"}', "[1]", '"st"']),
}


@functools.cache
def _case_dfa(name):
    schema, options, _, _ = CASES[name]
    return am.compile_expr(schema_expr(schema, whitespace="compact", **options))


@pytest.mark.parametrize("name", sorted(CASES))
def test_coverage_cases_are_exact_on_examples_and_sound_on_samples(name):
    schema, options, valid, invalid = CASES[name]
    d = _case_dfa(name)
    for doc in valid:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        assert d.matches(text.encode()), text
    for text in invalid:
        assert not d.matches(text.encode()), text
    check = validator(schema)  # the schema's own meaning (absent additionalProperties: open)
    rng = np.random.default_rng(0)
    for i in range(30):
        doc = random_member(d, rng, stop=0.15 + 0.1 * (i % 4), limit=300).decode("utf-8")
        check.validate(loads(doc))


def test_properties_keep_schema_order_when_asked_or_past_the_budget():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"}, "required": ["a", "f"]}
    ordered = am.compile_expr(schema_expr(schema, whitespace="compact", property_order="schema"))
    small = am.compile_expr(schema_expr(schema, whitespace="compact", max_order_states=10, key_register=False))
    free = am.compile_expr(schema_expr(schema, whitespace="compact"))
    registered = am.compile_expr(schema_expr(schema, whitespace="compact", max_order_states=10))  # "auto"
    for d in (ordered, small, free):
        assert d.matches(b'{"a":1,"c":3,"f":6}')
        assert not d.matches(b'{"a":1}') and not d.matches(b'{"a":1,"a":1,"f":6}')
    assert free.matches(b'{"f":6,"a":1}') and not ordered.matches(b'{"f":6,"a":1}') and not small.matches(b'{"f":6,"a":1}')
    assert free.num_states > 4 * ordered.num_states  # the price of any order
    # past the budget the default records the keys instead (any order, linear size)
    assert isinstance(registered, Pushdown) and registered.op is not None and not isinstance(free, Pushdown)
    for doc, ok in [(b'{"f":6,"a":1}', True), (b'{"a":1,"c":3,"f":6}', True), (b'{"a":1}', False), (b'{"a":1,"a":1,"f":6}', False)]:
        assert registered.matches(doc) == ok, doc


# ---------------------------------------------------------------------------------- defects
@pytest.mark.parametrize(
    "fmt, bad",
    [
        ("email", [".a@x.io", "a..b@x.io", "a.@x.io", "._a@x.io", "a@-x.io", "a@x-.io", "a@x.-io", "a@x..io",
                   "a" * 65 + "@x.io"]),
        ("uri", ["a:[", "a:]", "a:b#c#d", "a:%zz", "a:%4", "a://[::1", "a://[v1]", "1a:b", "a: b"]),
        ("hostname", [".".join(["a" * 63] * 4), "-a", "a-", "a..b", "a" * 64, "a_b"]),
    ],
)
def test_format_defects_are_fixed(fmt, bad):
    d = am.compile_expr(schema_expr({"type": "string", "format": fmt}))
    for text in bad:
        assert not d.matches(json.dumps(text).encode()), text


def test_unevaluated_properties_see_what_subschemas_evaluate():
    base = {"$defs": {"b": {"properties": {"b": {"type": "integer"}}}}}
    cases = [  # (schema, accepted, refused)
        ({**base, "$ref": "#/$defs/b", "properties": {"a": {}}, "unevaluatedProperties": False},
         ['{"a":1,"b":2}'], ['{"a":1,"c":3}']),
        ({"allOf": [{"properties": {"b": {}}}], "properties": {"a": {}}, "unevaluatedProperties": False},
         ['{"a":1,"b":2}'], ['{"c":3}']),
        ({"allOf": [{"properties": {"a": {}}, "unevaluatedProperties": False}, {"properties": {"b": {}}}]},
         ['{"a":1}'], ['{"b":1}']),  # the first branch does not see "b": it forbids it
        ({"properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}, "required": ["b"]}], "unevaluatedProperties": False},
         ['{"a":1,"b":2}', '{"b":2}'], ['{"a":1}', '{"b":1,"c":2}']),
    ]
    for schema, good, bad in cases:
        d = am.compile_expr(schema_expr(schema, whitespace="compact", open_objects=True))
        check = validator(schema)
        for text in good:
            assert d.matches(text.encode()) and check.is_valid(json.loads(text)), (schema, text)
        for text in bad:
            assert not d.matches(text.encode()) and not check.is_valid(json.loads(text)), (schema, text)


def test_unevaluated_properties_false_closes_the_object():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}
    for open_objects in (False, True):
        d = am.compile_expr(schema_expr(schema, whitespace="compact", open_objects=open_objects))
        assert d.matches(b'{"a":1}') and not d.matches(b'{"a":1,"b":2}')
    d = am.compile_expr(schema_expr({"type": "object", "unevaluatedProperties": False}, whitespace="compact"))
    assert d.matches(b"{}") and not d.matches(b'{"b":2}')
    d = am.compile_expr(schema_expr({"type": "object", "unevaluatedProperties": {"type": "integer"}}, whitespace="compact"))
    assert d.matches(b'{"b":2}') and not d.matches(b'{"b":"x"}')


@pytest.mark.parametrize("whitespace", ["bounded", "free"])
def test_empty_containers_have_one_whitespace_run(whitespace):
    d = am.compile_expr(schema_expr({"type": "object", "properties": {"a": {"type": "array"}}}, whitespace=whitespace))
    assert d.matches(b"{ }") and d.matches(b'{"a":[ ]}') and d.matches(b"{\n}")
    if whitespace == "bounded":  # one run of at most one space (or a newline and indentation)
        assert not d.matches(b"{  }") and not d.matches(b'{"a":[  ]}') and not d.matches(b"{ \n}")
        from jaxsample import structured as st

        pieces = ["<eos>", "{", "  ", " ", "}", '"a"', ":", "[", "]"]
        v = st.Vocabulary.from_pieces(pieces, kind="raw", special_ids=[0], eos_ids=[0])
        # integer items keep the grammar regular (generic items are a recursive rule, which needs a
        # token for every byte, more than this vocabulary has)
        s = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
        g = st.compile_json_schema(s, v, whitespace="bounded")
        after_brace = g.allowed(g.walk([1]))
        assert not after_brace[2] and after_brace[3] and after_brace[5]  # "  " would have forced "}"


def test_whitespace_options_match_the_host_engines():
    s = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    free = am.compile_expr(schema_expr(s))  # default: any JSON whitespace, as vLLM
    assert free.matches(b'{ "a" :\n\t[ 1 ,\r\n 2 ] }') and not free.matches(b' {"a":[]}')
    seps = am.compile_expr(schema_expr(s, whitespace="compact", separators=(", ", ": ")))
    assert seps.matches(b'{"a": [1, 2]}') and not seps.matches(b'{"a":[1,2]}') and not seps.matches(b'{ "a": [1, 2]}')
    pat = am.compile_expr(schema_expr(s, whitespace_pattern=r"[ \n]{0,2}"))
    assert pat.matches(b'{ "a" : [1,\n 2]  }') and not pat.matches(b'{"a":[1,   2]}') and not pat.matches(b'{"a":[1,\t2]}')
    with pytest.raises(ValueError, match="whitespace_pattern"):
        schema_expr(s, whitespace_pattern="[ x]*")
    with pytest.raises(ValueError, match="separators"):
        schema_expr(s, separators=(";", ":"))


def test_negative_zero_is_an_integer():
    d = am.compile_expr(schema_expr({"type": "integer", "minimum": 0}))
    assert d.matches(b"-0") and d.matches(b"0") and not d.matches(b"-1")
    d = am.compile_expr(schema_expr({"type": "integer", "exclusiveMinimum": 0}))
    assert not d.matches(b"-0") and not d.matches(b"0")


def test_one_of_overlap_is_refused_even_when_the_compiled_branches_are_disjoint():
    # Closed by default, the compiled branches are disjoint ({"a":1} vs {"b":"x"}), but the value
    # {"a": 1} is valid under both (the second branch is open in JSON Schema), so it is not valid
    # under oneOf: a oneOf proof must reason on the schemas' values, not on the compiled bytes.
    schema = {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "string"}}}]}  # fmt: skip
    assert not validator(schema).is_valid({"a": 1})
    with pytest.raises(am.GrammarError) as e:
        schema_expr(schema)
    assert e.value.keyword == "oneOf" and e.value.pointer == "/oneOf"
    # closed objects (the default) that require names the other branch never writes are disjoint
    # outputs; open ones are not (a document may carry both names): the later branch is then
    # compiled without the other's required names (an over-constraint, see below)
    disjoint = CASES["one_of_by_required_names"][0]
    d = am.compile_expr(schema_expr(disjoint, open_objects=True, whitespace="compact"))
    assert not d.matches(b'{"x":"a","z":1}') and not validator(disjoint).is_valid({"x": "a", "z": 1})
    assert d.matches(b'{"x":"a"}') and d.matches(b'{"z":1,"q":null}')
    d = am.compile_expr(schema_expr({"oneOf": [{"type": "number", "maximum": 0}, {"type": "integer", "minimum": 1}]}))
    assert d.matches(b"-0.5") and d.matches(b"3") and not d.matches(b"0.5")


def test_any_of_with_an_unconstrained_branch_is_every_value():
    """anyOf [object, {}] is every value (generic values are a recursive rule: the union is folded
    instead of offering the automaton a shift and a call on the same '{')."""
    d = am.compile_expr(schema_expr({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {}]},
                                    whitespace="compact"))  # fmt: skip
    assert d.matches(b'{"a":"x"}') and d.matches(b'[1,{"b":null}]') and d.matches(b"3")
    sib = am.compile_expr(schema_expr({"type": "integer", "anyOf": [{"minimum": 5}, True]}))
    assert sib.matches(b"3") and not sib.matches(b'"x"')


def test_untyped_schemas_imply_their_types_unless_asked():
    schema = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    implied = am.compile_expr(schema_expr(schema, whitespace="compact"))
    assert implied.matches(b'{"a":1}') and not implied.matches(b'"x"') and not implied.matches(b"[]")
    with pytest.raises(ValueError, match="untyped"):
        schema_expr(schema, untyped="all")
    # oneOf proofs follow the option: the implied branches are disjoint objects, but under "any"
    # both branches also have every string ("x" is valid under both, so not under oneOf)
    one_of = {"oneOf": [{"properties": {"k": {"const": n}}, "required": ["k"]} for n in (1, 2)]}
    assert not validator(one_of).is_valid("x")
    d = am.compile_expr(schema_expr(one_of, whitespace="compact"))
    assert d.matches(b'{"k":2}') and not d.matches(b'"x"')
    # every string, number, ... is valid under both branches, so none is valid under oneOf: those
    # types are dropped from both, and the objects are told apart by "k"
    d = am.compile_expr(schema_expr(one_of, untyped="any", whitespace="compact"))
    assert d.matches(b'{"k":1}') and not d.matches(b'"x"') and not d.matches(b"1") and not d.matches(b'{"k":3}')


def test_union_of_generic_and_typed_needs_inline_generic():
    from jaxsample.structured.pushdown import AmbiguousCallError

    with pytest.raises(AmbiguousCallError, match="two ways"):  # never a guess: refused without the option
        am.compile_expr(schema_expr(UNION_OPEN, whitespace="compact", open_objects=True))
    d = am.compile_expr(schema_expr(UNION_OPEN, whitespace="compact", open_objects=True, inline_generic=3))
    check = validator(UNION_OPEN)
    good = [{"a": {}}, {"a": {"x": 1}}, {"a": {"x": "s"}, "c": "q"}, {"a": {"z": {"y": [[{}]]}}}, {"c": "", "a": [{"b": [{}]}]}]
    for doc in good:
        assert d.matches(json.dumps(doc, separators=(",", ":")).encode()), doc
    for text in ['{"a":{"x":"s"}}', '{"a":{"x":{"y":[1]}}}', '{"c":1}', '{"a":[]}']:
        assert not d.matches(text.encode()), text
    rng = np.random.default_rng(1)
    for _ in range(200):  # sound (generic objects may repeat a key: json.loads keeps the last, as before)
        doc = random_member(d, rng, stop=0.2, limit=200)
        assert check.is_valid(json.loads(doc)), doc
        for bad in (doc.replace(b'"x":', b'"c":', 1), doc.replace(b'"c":"', b'"c":1,"y":"', 1)):
            if bad != doc:
                try:
                    value = json.loads(bad)
                except ValueError:
                    continue
                assert d.matches(bad) == check.is_valid(value), bad


def _valid_samples(schema, n=60, **opts):
    """Random members of the compiled language, each checked against the schema (soundness)."""
    d = am.compile_expr(schema_expr(schema, whitespace="compact", **opts))
    rng = np.random.default_rng(0)
    for _ in range(n):
        text = random_member(d, rng)
        assert validator(schema).is_valid(loads(text)), text
    return d


def test_one_of_enum_values_filtered_by_type():
    # merged branches whose type list is empty have no values, whatever their enum says
    schema = {"allOf": [{"oneOf": [{"type": "integer", "minimum": 0, "maximum": 2}, {"type": "string", "enum": ["off"]}]},
                        {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 2}, {"type": "string", "enum": ["off"]}]}]}  # fmt: skip
    d = _valid_samples(schema)
    assert d.matches(b"1") and d.matches(b'"off"') and not d.matches(b'"on"')
    # unsound case still refused: two enums sharing a value of the branches' types
    with pytest.raises(am.GrammarError, match="oneOf"):
        schema_expr({"oneOf": [{"type": "string", "enum": ["a", "b"]}, {"type": "string", "enum": ["b", "c"]}]})


def test_one_of_enum_against_a_branch_that_negates_it():
    prim = {"type": "string", "enum": ["null", "int"]}
    schema = {"definitions": {"p": prim}, "oneOf": [{"$ref": "#/definitions/p"},
              {"type": "string", "pattern": "^[a-z]+$", "not": {"$ref": "#/definitions/p"}}]}  # fmt: skip
    d = _valid_samples(schema)
    assert d.matches(b'"null"') and d.matches(b'"float"') and not d.matches(b'"Null"')
    # without the not, "null" is valid under both: refused
    with pytest.raises(am.GrammarError, match="oneOf"):
        schema_expr({"oneOf": [prim, {"type": "string", "pattern": "^[a-z]+$"}]})
    assert validator({"oneOf": [prim, {"type": "string", "pattern": "^[a-z]+$"}]}).is_valid("x")


def test_one_of_required_names_count_as_properties():
    schema = {"oneOf": [{"type": "object", "required": ["a", "b"]},
                        {"type": "object", "additionalProperties": {"const": False}, "maxProperties": 1}]}  # fmt: skip
    d = _valid_samples(schema, open_objects=True)
    assert d.matches(b'{"q":false}') and d.matches(b'{"a":1,"b":2}')
    with pytest.raises(am.GrammarError, match="oneOf"):  # two required names fit in maxProperties 2
        schema_expr({"oneOf": [{"type": "object", "required": ["a", "b"]},
                               {"type": "object", "additionalProperties": {"const": False}, "maxProperties": 2}]})  # fmt: skip
    assert validator({"oneOf": [{"type": "object", "required": ["a", "b"]},
                                {"type": "object", "additionalProperties": {"const": False}, "maxProperties": 2}]}  # fmt: skip
                     ).is_valid({"a": 1}) is False


def test_one_of_types_both_branches_leave_free_are_dropped():
    # untyped branches (JSON Schema meaning): every string/number/... is valid under both, so none is
    # valid under oneOf; the objects are told apart by a discriminator
    schema = {"oneOf": [{"properties": {"t": {"enum": ["a"]}}, "required": ["t"], "additionalProperties": False},
                        {"properties": {"t": {"enum": ["b"]}, "u": {}}, "required": ["t"]}]}  # fmt: skip
    d = _valid_samples(schema, untyped="any")
    assert d.matches(b'{"t":"a"}') and d.matches(b'{"u":1,"t":"b"}')
    assert not d.matches(b'"s"') and not d.matches(b"1") and not validator(schema).is_valid("s")
    # a type only one branch leaves free stays (its values are valid under that branch only): the
    # strings of the second branch overlap the first's strings, so this is still refused
    with pytest.raises(am.GrammarError, match="oneOf"):
        schema_expr({"oneOf": [{"properties": {"t": {"enum": ["a"]}}, "required": ["t"]},
                               {"minLength": 2}]}, untyped="any")  # fmt: skip
    assert validator({"oneOf": [{"required": ["t"]}, {"minLength": 2}]}).is_valid("ss") is False


def test_one_of_open_objects_separated_by_required_names():
    # open objects: {"k": "", "s": "", "r": "x", "d": 1} is valid under both branches; the second branch
    # is compiled without the first's required names (over-constraint), which makes them disjoint
    schema = {"oneOf": [{"type": "object", "properties": {"k": {"type": "string"}, "s": {"type": "string"}},
                         "required": ["k", "s"]},
                        {"type": "object", "properties": {"r": {"type": "string"}, "d": {"type": "integer"}},
                         "required": ["r", "d"]}]}  # fmt: skip
    assert not validator(schema).is_valid({"k": "", "s": "", "r": "x", "d": 1})
    d = _valid_samples(schema, open_objects=True)
    assert d.matches(b'{"k":"","s":""}') and d.matches(b'{"r":"","d":1,"k":""}')
    assert not d.matches(b'{"k":"","s":"","r":"x","d":1}') and not d.matches(b'{"r":"","d":1,"k":"","s":""}')
    # a branch that requires nothing cannot be separated this way: still refused
    with pytest.raises(am.GrammarError, match="oneOf"):
        schema_expr({"oneOf": [schema["oneOf"][0], {"type": "object", "properties": {"r": {"type": "string"}}}]},
                    open_objects=True)


def test_union_with_a_discriminator_writes_it_first():
    # every branch requires "kind" with its own const: the union chooses its branch after that member
    # (an over-constraint on the order: "kind" comes first), instead of tracking open objects in parallel
    branch = lambda k, p: {"type": "object", "properties": {"kind": {"const": k}, p: {"type": "string"}},  # noqa: E731
                           "required": ["kind", p]}  # fmt: skip
    schema = {"anyOf": [branch("a", "x"), branch("b", "y"), branch("c", "z")]}
    d = _valid_samples(schema, open_objects=True, discriminator_first=True)
    assert d.matches(b'{"kind":"a","x":"","q":1}') and d.matches(b'{"kind":"c","w":[],"z":""}')
    assert not d.matches(b'{"x":"","kind":"a"}') and validator(schema).is_valid({"x": "", "kind": "a"})
    small = d.num_states
    # values that overlap do not choose a branch: no order imposed
    shared = {"anyOf": [branch("a", "x"), {**branch("b", "y"), "properties": {"kind": {"enum": ["a", "b"]},
                                                                                 "y": {"type": "string"}}}]}  # fmt: skip
    d = _valid_samples(shared, open_objects=True, discriminator_first=True)
    assert d.matches(b'{"x":"","kind":"a"}')
    # the default keeps any order (the union tracked in parallel, larger)
    d = am.compile_expr(schema_expr(schema, open_objects=True, whitespace="compact"))
    assert d.matches(b'{"x":"","kind":"a"}') and small * 2 < d.num_states


def test_type_lists_compile_the_same_in_every_process():
    """Regression: a ``type`` list compiled its branches in a set's order, which changes with Python's
    string hashing, so the tables (state numbering) differed between processes."""
    import os
    import subprocess
    import sys

    code = ("import hashlib, sys; from tests._structured_vocab import bpe_vocab; from jaxsample import structured as st; "
            "g = st.compile_json_schema({'type': ['string', 'null', 'integer', 'boolean']}, bpe_vocab(), whitespace='compact'); "
            "print(list({'string', 'null', 'integer', 'boolean'}), hashlib.sha256(g.next.tobytes() + g.class_of.tobytes()).hexdigest())")  # fmt: skip
    out = [subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True,
                          text=True, check=True).stdout.split("] ") for seed in ("1", "2")]  # fmt: skip
    assert out[0][0] != out[1][0]  # the two processes iterate the set differently
    assert out[0][1] == out[1][1]


def _diamond(depth: int) -> dict:
    """``d{i+1}`` is an object of two ``d{i}``: ``2**depth`` uses of ``d0`` when every reference is inlined."""
    defs = {"d0": {"type": "integer", "minimum": 0, "maximum": 9}}
    for i in range(depth):
        ref = {"$ref": f"#/$defs/d{i}"}
        defs[f"d{i + 1}"] = {"type": "object", "properties": {"x": ref, "y": ref}, "required": ["x", "y"],
                             "additionalProperties": False}  # fmt: skip
    return {"$defs": defs, "$ref": f"#/$defs/d{depth}"}


def test_a_reference_inlined_in_the_same_context_is_compiled_once():
    """A schema reached again through the same reference, in the same context, is one shared expression:
    expression building is linear in the references, not in the paths through them (the old cost: an
    object per path, ``2**16`` here: 40 s)."""
    import time

    start = time.perf_counter()
    expr = schema_expr(_diamond(16), whitespace="compact")
    assert time.perf_counter() - start < 2.0
    nodes, todo = set(), [expr]
    while todo:  # distinct nodes (by identity): linear in the depth when d{i} is shared
        x = todo.pop()
        if id(x) not in nodes:
            nodes.add(id(x))
            todo.extend(getattr(x, "items", ()))
    assert len(nodes) < 100 * 16
    d = am.compile_expr(schema_expr(_diamond(2), whitespace="compact"))
    doc = {"x": {"x": 1, "y": 2}, "y": {"x": 3, "y": 4}}
    assert d.matches(json.dumps(doc, separators=(",", ":")).encode())
    assert not d.matches(b'{"x":{"x":1,"y":2},"y":{"x":3}}')
    assert not d.matches(b'{"x":{"x":1,"y":2},"y":{"x":3,"y":10}}')
