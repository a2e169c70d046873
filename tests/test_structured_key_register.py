"""The key register: objects in any order with one bit per declared property instead of one copy of
their states per set of written properties. Its ops compose exactly; the register form accepts the
same documents as the tracked-set form (every order, each key at most once, required keys present)."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from jaxsample.structured import automaton as am
from jaxsample.structured import pushdown
from jaxsample.structured.automaton import KeyOp, compose
from jaxsample.structured.json_schema import schema_expr

ops = hs.builds(KeyOp, *(hs.integers(0, 15) for _ in range(4)))


@settings(max_examples=300, deadline=None)
@given(ops, ops, hs.integers(0, 15))
def test_composed_ops_act_as_one_after_the_other(a, b, register):
    first = a.apply(register)
    want = None if first is None else b.apply(first)
    both = compose(a, b)
    assert (None if both is None else both.apply(register)) == want


SCHEMAS = {
    "required": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                  "c": {"type": "integer"}}, "required": ["b"]},
    "nested": {"type": "object", "properties": {"a": {"type": "integer"}, "o": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}}},
    "array_of_objects": {"type": "array", "items": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}},
    "extras": {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
               "additionalProperties": {"type": "integer"}},
    "prefix_keys": {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"},
                                                     "abc": {"type": "integer"}}, "required": ["ab"]},
}  # fmt: skip


def _candidates(schema) -> list[bytes]:
    """Objects over the schema's keys (and one undeclared) in every order, with repeats and gaps."""
    keys = sorted(_keys(schema)) + ["z"]
    out = []
    for n in range(4):
        for names in itertools.product(keys, repeat=n):
            doc = "{" + ",".join(f'"{k}":1' for k in names) + "}"
            inner = "{" + ",".join(f'"{k}":{{"a":1}}' if k == "o" else f'"{k}":1' for k in names) + "}"
            out += [doc.encode(), inner.encode(), f"[{doc},{doc}]".encode(), f"[{doc}]".encode()]
    return out


def _keys(schema) -> set:
    if not isinstance(schema, dict):
        return set()
    found = set(schema.get("properties", {}))
    for sub in [*schema.get("properties", {}).values(), schema.get("items")]:
        found |= _keys(sub)
    return found


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_register_form_accepts_the_tracked_set_forms_documents(name):
    schema = SCHEMAS[name]
    tracked = am.compile_expr(schema_expr(schema, whitespace="compact"))
    registered = am.compile_expr(schema_expr(schema, whitespace="compact", key_register=True))
    assert isinstance(registered, pushdown.Pushdown) and len(registered.ops) > 1
    docs = _candidates(schema)
    assert any(tracked.matches(d) for d in docs) and not all(tracked.matches(d) for d in docs)
    for d in docs:
        assert registered.matches(d) == tracked.matches(d), d


def test_a_large_object_stays_small_and_accepts_any_order():
    props = {f"p{i:02d}": {"type": "integer"} for i in range(40)}
    schema = {"type": "object", "properties": props, "required": ["p05", "p31"]}
    pd = am.compile_expr(schema_expr(schema, whitespace="compact", key_register=True))
    assert pd.num_states < 600
    names = list(props)[::-1]
    doc = {k: i for i, k in enumerate(names)}
    assert pd.matches(json.dumps(doc, separators=(",", ":")).encode())
    assert not pd.matches(b'{"p05":1,"p31":2,"p05":3}')  # a key twice
    assert not pd.matches(b'{"p05":1,"p30":2}')  # a required key missing
    end = pd.run(b'{"p31":1,"p02":2,', max_depth=0)
    assert end is not None and end[2] == 1 << 31 | 1 << 2  # a bit per declared property, in schema order
