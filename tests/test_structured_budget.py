"""State budgets: references compiled as stack calls (``ref_calls``) and the compile-time fallbacks."""

import gc
import json

import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import automaton as am
from jaxsample.structured import compiler, grammar_cache, pushdown
from jaxsample.structured.json_schema import schema_expr
from jaxsample.structured.pushdown import Pushdown
from tests._format_rules import loads, validator
from tests._structured_vocab import bpe_tokenizer, bpe_vocab
from tests.test_structured_regex import random_member

# four objects sharing one definition that uses another: inlined, every use is a copy (and any
# property order copies the copies); as calls, each definition is compiled once
SCHEMA = {
    "$defs": {
        "s": {"type": "string", "maxLength": 12},
        "p": {"type": "object", "properties": {"x": {"$ref": "#/$defs/s"}, "y": {"$ref": "#/$defs/s"}}, "required": ["x"]},
    },
    "type": "object",
    "properties": {k: {"$ref": "#/$defs/p"} for k in "abcd"},
    "required": ["a"],
}
# budget the subset construction needs at whitespace="compact" (inline any order, calls any order,
# inline schema order, calls schema order): 4927, 470, 2483, 344


@pytest.fixture
def fresh_cache():
    grammar_cache.clear()
    yield
    grammar_cache.clear()


def test_ref_calls_keep_the_language_and_cut_the_states():
    rng = np.random.default_rng(0)
    check = validator(SCHEMA)
    # schema order: the same language inlined or called (nesting stays far below max_depth)
    inline = am.compile_expr(schema_expr(SCHEMA, whitespace="compact", property_order="schema"))
    calls = am.compile_expr(schema_expr(SCHEMA, whitespace="compact", property_order="schema", ref_calls=True))
    assert isinstance(calls, Pushdown) and calls.num_states * 5 < inline.num_states
    for i in range(30):
        for doc in (random_member(inline, rng, stop=0.2 + 0.1 * (i % 3), limit=400),
                    random_member(calls, rng, stop=0.2 + 0.1 * (i % 3), limit=400)):  # fmt: skip
            assert inline.matches(doc) and calls.matches(doc), doc
            check.validate(loads(doc.decode()))
            for bad in (doc[:-1], doc + b"}", doc.replace(b'"x"', b'"z"', 1), doc.replace(b":", b"::", 1)):
                assert inline.matches(bad) == calls.matches(bad), bad
    # any order: inlined without the key register, the outer object is past max_order_states and keeps
    # schema order; called, its values are small and it takes any order (a superset, still exactly the
    # schema's documents)
    inline = am.compile_expr(schema_expr(SCHEMA, whitespace="compact", key_register=False))
    calls = am.compile_expr(schema_expr(SCHEMA, whitespace="compact", ref_calls=True))
    assert calls.matches(b'{"b":{"x":""},"a":{"y":"","x":""}}') and not inline.matches(b'{"b":{"x":""},"a":{"x":""}}')
    for i in range(30):
        assert calls.matches(random_member(inline, rng, stop=0.3, limit=400))
        doc = random_member(calls, rng, stop=0.2 + 0.1 * (i % 3), limit=400)
        check.validate(loads(doc.decode()))


def test_ref_calls_of_a_union_of_objects_are_one_call_of_their_union():
    """A union of references to objects starts every branch with ``{``: as calls, the byte enters all
    of them; they return to one place, so they are one call of a rule matching either (refused with
    AmbiguousCallError before), with the inlined language."""
    item = {"type": "object", "properties": {"n": {"type": "integer"}, "up": {"$ref": "#/$defs/node"}}}
    schema = {"$defs": {"node": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]},
                        "a": {**item, "properties": {**item["properties"], "a": {"type": "string"}}, "required": ["a"]},
                        "b": {**item, "properties": {**item["properties"], "b": {"type": "boolean"}}, "required": ["b"]}},
              "type": "array", "items": {"$ref": "#/$defs/node"}}  # fmt: skip
    calls = am.compile_expr(schema_expr(schema, whitespace="compact", ref_calls=True, property_order="schema"))
    inline = am.compile_expr(schema_expr(schema, whitespace="compact", property_order="schema", max_depth=4))
    check, rng = validator(schema), np.random.default_rng(2)
    assert calls.matches(b'[{"n":1,"up":{"up":{"b":true},"a":""},"a":"s"},{"b":false}]')
    assert not calls.matches(b'[{"n":1,"up":{"up":{"b":"x"},"a":""},"a":"s"}]')
    for i in range(40):
        doc = random_member(calls, rng, stop=0.2 + 0.1 * (i % 3), limit=300)
        check.validate(loads(doc.decode()))
        doc = random_member(inline, rng, stop=0.2 + 0.1 * (i % 3), limit=300)
        assert calls.matches(doc), doc


# five properties with large values (nested objects with counted strings): any order would repeat
# every value for each set of written properties, past max_order_states (estimated ~12k states)
BIG = {
    "type": "object",
    "properties": {k: {"type": "object", "properties": {"x": {"type": "string", "maxLength": 12},
                                                         "y": {"type": "integer", "minimum": 0, "maximum": 999}},
                       "required": ["x"]} for k in "abcde"},  # fmt: skip
    "required": ["a"],
}


def test_value_calls_take_any_order_exactly():
    rng = np.random.default_rng(0)
    check = validator(BIG)
    ordered = am.compile_expr(schema_expr(BIG, whitespace="compact", key_register=False))  # past the budget: schema order
    calls = am.compile_expr(schema_expr(BIG, whitespace="compact", value_calls=True))
    assert isinstance(calls, Pushdown) and not isinstance(ordered, Pushdown)
    doc = b'{"e":{"y":7,"x":"q"},"a":{"x":""}}'
    assert calls.matches(doc) and not ordered.matches(doc)
    check.validate(loads(doc.decode()))
    for bad in (b'{"e":{"x":""}}', b'{"a":{"y":1}}', b'{"a":{"x":"0123456789abc"}}', b'{"a":{"x":""},"f":1}',
                b'{"a":{"x":"","y":1000}}'):  # fmt: skip
        assert not calls.matches(bad) and not ordered.matches(bad), bad
        if bad != b'{"a":{"x":""},"f":1}':  # closed by default (an absent additionalProperties)
            assert not check.is_valid(loads(bad.decode())), bad
    for dup in (b'{"a":{"x":""},"a":{"x":""}}', b'{"e":{"x":""},"a":{"x":""},"e":{"x":"1"}}'):
        assert not calls.matches(dup)  # a declared property is never repeated
    for i in range(30):
        assert calls.matches(random_member(ordered, rng, stop=0.2 + 0.1 * (i % 3), limit=400))  # a superset
        out = random_member(calls, rng, stop=0.2 + 0.1 * (i % 3), limit=400).decode()
        check.validate(loads(out))  # valid, no duplicate keys
    # open objects: undeclared members between any declared ones, their values called too
    open_calls = am.compile_expr(schema_expr(BIG, whitespace="compact", value_calls=True, open_objects=True))
    assert open_calls.matches(b'{"z":[1,{"q":null}],"c":{"x":"","w":{}},"a":{"x":"s"},"b":{"x":""}}')
    assert not open_calls.matches(b'{"z":1,"c":{"x":""},"c":{"x":""},"a":{"x":""}}')
    spec = validator(BIG)  # an absent additionalProperties is open for jsonschema
    for i in range(30):
        spec.validate(loads(random_member(open_calls, rng, stop=0.2 + 0.1 * (i % 3), limit=400).decode()))


def test_ambiguous_value_calls_are_retried_inline(fresh_cache):
    # two union branches call different rules for "a" on the same byte: retried without value calls
    a = {"type": "object", "properties": {"z": {"type": "string", "maxLength": 12}}, "required": ["z"]}
    other = {**BIG, "properties": {**BIG["properties"], "a": a}}
    union = {"anyOf": [BIG, other]}
    with pytest.raises(pushdown.AmbiguousCallError):
        am.compile_expr(schema_expr(union, whitespace="compact", value_calls=True))
    v = bpe_vocab()
    got = st.compile_json_schema(union, v, whitespace="compact", value_calls=True)
    assert st.same_grammar(got, st.compile_json_schema(union, v, whitespace="compact"))


def test_budget_fallbacks_in_order(fresh_cache, monkeypatch):
    v = bpe_vocab()
    explicit = {}
    for name, options in [("calls", {"ref_calls": True}), ("both", {"ref_calls": True, "property_order": "schema"}),
                          ("register", {"key_register": True})]:  # fmt: skip
        explicit[name] = st.compile_json_schema(SCHEMA, v, whitespace="compact", **options)
    grammar_cache.clear()
    monkeypatch.setattr(am, "MAX_DFA_STATES", 500)  # inline any order exceeds it, calls fit (so does the register)
    got = st.compile_json_schema(SCHEMA, v, whitespace="compact", key_register=False)
    assert st.same_grammar(got, explicit["calls"])
    got = st.compile_json_schema(SCHEMA, v, whitespace="compact")  # "auto": the register first
    assert st.same_grammar(got, explicit["register"]) and got.pushdown.key_ops.shape[0] > 1
    grammar_cache.clear()
    monkeypatch.setattr(am, "MAX_DFA_STATES", 400)  # only calls in schema order fit
    got = st.compile_json_schema(json.dumps(SCHEMA), v, whitespace="compact", key_register=False)
    assert st.same_grammar(got, explicit["both"])
    ids = bpe_tokenizer().encode('{"a":{"x":"q"},"c":{"x":""}}').ids
    m = st.Matcher(got)
    assert m.accept_tokens(ids) == len(ids) and m.is_accepting()
    grammar_cache.clear()
    with pytest.raises(am.BudgetError, match="too large"):  # explicit options: no fallback
        st.compile_json_schema(SCHEMA, v, whitespace="compact", property_order="schema")
    monkeypatch.setattr(am, "MAX_DFA_STATES", 100)  # nothing fits: the first budget error
    with pytest.raises(am.BudgetError, match="more than 100 DFA states"):
        st.compile_json_schema(SCHEMA, v, whitespace="compact")


def test_ref_call_fallbacks_need_a_ref(fresh_cache, monkeypatch):
    schema = {"type": "object", "properties": {k: {"type": "string", "maxLength": 8} for k in "abcde"}}
    seen = []
    real = compiler.json_schema.schema_expr_and_options
    monkeypatch.setattr(compiler.json_schema, "schema_expr_and_options", lambda s, **o: seen.append(o) or real(s, **o))
    monkeypatch.setattr(am, "MAX_DFA_STATES", 60)
    with pytest.raises(am.BudgetError):
        st.compile_json_schema(schema, bpe_vocab(), whitespace="compact")
    # the default, the key register (a schema with properties), then schema order: no ref_calls; then
    # the last resort (the three again with a larger subset construction)
    assert [(o.get("ref_calls", False), o.get("key_register", "auto")) for o in seen] == [(False, "auto"), (False, True), (False, "auto")] * 2
    assert [o.get("property_order", "any") for o in seen] == ["any", "any", "schema"] * 2


def test_options_that_come_to_a_failed_attempt_are_not_compiled_again(fresh_cache, monkeypatch):
    schema = {"type": "object", "properties": {k: {"type": "string", "maxLength": 8} for k in "abcde"}}
    seen, compiled = [], []
    real, real_compile = compiler.json_schema.schema_expr_and_options, compiler.compile_expression
    monkeypatch.setattr(compiler.json_schema, "schema_expr_and_options", lambda s, **o: seen.append(o) or real(s, **o))
    monkeypatch.setattr(compiler, "compile_expression", lambda e, v: compiled.append(e) or real_compile(e, v))
    monkeypatch.setattr(am, "MAX_DFA_STATES", 60)
    with pytest.raises(am.BudgetError):  # "auto" chooses the register (an object past max_order_states)
        st.compile_json_schema(schema, bpe_vocab(), whitespace="compact", max_order_states=10)
    # the default (the register), not the register fallback again, schema order; the same in the last resort
    assert [(o.get("key_register", "auto"), o.get("property_order", "any")) for o in seen] == [("auto", "any"), ("auto", "schema")] * 2
    assert len(compiled) == 4
    seen.clear()
    monkeypatch.setattr(am, "MAX_NFA_STATES", 30)  # an NFA budget error first: no last resort
    with pytest.raises(am.NFABudgetError):
        st.compile_json_schema(schema, bpe_vocab(), whitespace="compact", max_order_states=10)
    assert [o.get("property_order", "any") for o in seen] == ["any", "schema"]
    seen.clear()
    with pytest.raises(am.NFABudgetError):  # "auto" without the register: the register is another attempt
        st.compile_json_schema(schema, bpe_vocab(), whitespace="compact")
    assert [(o.get("key_register", "auto"), o.get("property_order", "any")) for o in seen] == [("auto", "any"), (True, "any"), ("auto", "schema")]


def test_last_resort_compiles_the_schema_itself_with_a_larger_subset_construction(fresh_cache, monkeypatch):
    # (a|b)*a(a|b){6}: 128 DFA states, minimal too; no fallback applies to a string pattern
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){6}$"}
    v = bpe_vocab()
    whole = st.compile_json_schema(schema, v)
    grammar_cache.clear()
    monkeypatch.setattr(am, "MAX_DFA_STATES", 100)  # 2.5 x 100 holds it: the same grammar
    assert st.same_grammar(st.compile_json_schema(schema, v), whole)
    assert am.budgets(None, None)[1] == 100  # (scaled only within the last resort)
    grammar_cache.clear()
    with pytest.raises(am.BudgetError, match="more than 100 DFA states"):  # explicit options: as asked
        st.compile_json_schema(schema, v, property_order="schema")
    monkeypatch.setattr(am, "MAX_DFA_STATES", 40)  # 100 in the last resort: the first error
    with pytest.raises(am.BudgetError, match="more than 40 DFA states"):
        st.compile_json_schema(schema, v)


def test_last_resort_tries_the_fallbacks_that_exceeded_the_dfa_budget(fresh_cache, monkeypatch):
    # subset construction peaks: inline 500, the register 80, ref_calls 130, schema order 215, with calls 90
    p = {"type": "string", "pattern": "^(a|b)*a(a|b){5}$"}
    schema = {"$defs": {"p": p}, "type": "object", "properties": {k: {"$ref": "#/$defs/p"} for k in "xyz"},
              "required": list("xyz")}  # fmt: skip
    v = bpe_vocab()
    register = st.compile_json_schema(schema, v, whitespace="compact", key_register=True)
    grammar_cache.clear()
    seen = []
    real = compiler.json_schema.schema_expr_and_options
    monkeypatch.setattr(compiler.json_schema, "schema_expr_and_options", lambda s, **o: seen.append(o) or real(s, **o))
    monkeypatch.setattr(am, "MAX_DFA_STATES", 40)  # every form fails; at 100 the register fits, the schema's own not
    assert st.same_grammar(st.compile_json_schema(schema, v, whitespace="compact"), register)
    assert [o.get("key_register", "auto") for o in seen] == ["auto", True, "auto", "auto", "auto", "auto", True]
    text = '{"z":"bbabbbbb","x":"aaaaaa","y":"abbbbb"}'
    ids = bpe_tokenizer().encode(text).ids
    m = st.Matcher(register)
    assert m.accept_tokens(ids) == len(ids) and m.is_accepting()
    seen.clear()
    grammar_cache.clear()
    monkeypatch.setattr(am, "MAX_NFA_STATES", 30)  # the NFA too large: references as calls first, no last resort
    with pytest.raises(am.NFABudgetError):
        st.compile_json_schema(schema, v, whitespace="compact")
    assert [(o.get("key_register", "auto"), o.get("ref_calls", False), o.get("property_order", "any")) for o in seen] == [
        ("auto", False, "any"), (True, False, "any"), ("auto", True, "any"), ("auto", True, "schema"), ("auto", False, "schema")]


def test_a_failed_compile_leaves_no_garbage_cycle_holding_its_attempts(fresh_cache, monkeypatch):
    # every attempt's error kept for a later raise held its frames (expressions, NFAs) in a
    # reference cycle: 10.6M objects after a Github schema's failure, 21 s for the next full collection
    p = {"type": "string", "pattern": "^(a|b)*a(a|b){5}$"}
    schema = {"$defs": {"p": p}, "type": "object", "properties": {k: {"$ref": "#/$defs/p"} for k in "xyz"},
              "oneOf": [{"required": ["x"]}, {"required": ["y"]}]}  # fmt: skip
    v = bpe_vocab()
    monkeypatch.setattr(am, "MAX_DFA_STATES", 20)
    gc.collect()
    with pytest.raises(am.BudgetError):
        st.compile_json_schema(schema, v, whitespace="compact")
    assert gc.collect() < 1000  # (118 objects; 7,667 with the errors kept whole)


def test_ambiguous_union_is_retried_with_inline_generic(fresh_cache):
    from tests.test_structured_json_schema import UNION_OPEN

    v = bpe_vocab()
    explicit = st.compile_json_schema(UNION_OPEN, v, whitespace="compact", open_objects=True,
                                      inline_generic=compiler.INLINE_GENERIC[0])  # fmt: skip
    grammar_cache.clear()
    got = st.compile_json_schema(UNION_OPEN, v, whitespace="compact", open_objects=True)
    assert st.same_grammar(got, explicit)
    for text, ok in [('{"a":{"z":{"y":[{}]}}}', True), ('{"c":"","a":{"x":1}}', True), ('{"a":{"x":"s"}}', False)]:
        ids = bpe_tokenizer().encode(text).ids
        m = st.Matcher(got)
        assert (m.accept_tokens(ids) == len(ids) and m.is_accepting()) == ok, text


def test_deeper_ambiguity_is_retried_with_more_inline_levels(fresh_cache):
    # the typed object of the first branch sits 4 levels down: 3 inline levels still meet a call there
    deep = {"type": "object", "properties": {"x": {"type": "integer"}}}
    for _ in range(3):
        deep = {"type": "object", "properties": {"a": deep}}
    schema = {"anyOf": [{**deep, "required": ["a"]},
                        {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}]}
    v = bpe_vocab()
    with pytest.raises(pushdown.AmbiguousCallError):
        st.compile_json_schema(schema, v, whitespace="compact", open_objects=True, inline_generic=3)
    got = st.compile_json_schema(schema, v, whitespace="compact", open_objects=True)
    for text, ok in [('{"a":{"a":{"a":{"x":1}}}}', True), ('{"c":"","a":{"a":{"a":{"q":[{}]}}}}', True),
                     ('{"a":{"a":{"a":{"x":"s"}}}}', False)]:  # fmt: skip
        ids = bpe_tokenizer().encode(text).ids
        m = st.Matcher(got)
        assert (m.accept_tokens(ids) == len(ids) and m.is_accepting()) == ok, text


def test_discriminator_fallback_needs_a_union(fresh_cache, monkeypatch):
    branch = lambda k: {"type": "object", "properties": {"kind": {"const": k}, "v": {"type": "string", "maxLength": 6}},  # noqa: E731
                        "required": ["kind"]}  # fmt: skip
    union = {"anyOf": [branch("a"), branch("b"), branch("c")]}
    first = am.compile_expr(schema_expr(union, whitespace="compact", discriminator_first=True)).num_states
    parallel = am.compile_expr(schema_expr(union, whitespace="compact")).num_states
    assert first < parallel
    v = bpe_vocab()
    explicit = st.compile_json_schema(union, v, whitespace="compact", discriminator_first=True)
    grammar_cache.clear()
    monkeypatch.setattr(am, "MAX_DFA_STATES", 550)  # any order exceeds it (subset construction), discriminators first fit
    with pytest.raises(am.BudgetError):
        am.compile_expr(schema_expr(union, whitespace="compact"))
    got = st.compile_json_schema(union, v, whitespace="compact")
    assert st.same_grammar(got, explicit)
    seen = []
    real = compiler.json_schema.schema_expr_and_options
    monkeypatch.setattr(compiler.json_schema, "schema_expr_and_options", lambda s, **o: seen.append(o) or real(s, **o))
    monkeypatch.setattr(am, "MAX_DFA_STATES", 10)
    with pytest.raises(am.BudgetError):  # no union: no discriminator retry
        st.compile_json_schema(branch("a"), v, whitespace="compact")
    assert seen and not any(o.get("discriminator_first") for o in seen)
