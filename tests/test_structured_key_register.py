"""The key register: objects in any order with one bit per declared property instead of one copy of
their states per set of written properties. Its ops compose exactly; the register form accepts the
same documents as the tracked-set form (every order, each key at most once, required keys present)."""

import itertools
import json
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from jaxsample.structured import automaton as am
from jaxsample.structured import pushdown
from jaxsample.structured.automaton import KeyOp, compose, either
from jaxsample.structured.json_schema import schema_expr

masks = hs.integers(0, 15)
ops = hs.builds(KeyOp, masks, masks, masks, masks, hs.lists(hs.tuples(masks, masks), max_size=2).map(tuple))


@settings(max_examples=400, deadline=None)
@given(ops, ops, masks)
def test_composed_ops_act_as_one_after_the_other(a, b, register):
    first = a.apply(register)
    want = None if first is None else b.apply(first)
    both = compose(a, b)
    assert (None if both is None else both.apply(register)) == want


@settings(max_examples=400, deadline=None)
@given(ops, masks, masks, hs.tuples(masks, masks), masks)
def test_either_passes_where_one_of_the_two_passes(a, absent, present, other, register):
    b = KeyOp(absent, present, a.clear, a.add, (other,))
    one = either(a, b)
    want = a.apply(register) if a.apply(register) is not None else b.apply(register)
    assert (None if one is None else one.apply(register)) == want
    assert either(a, KeyOp(absent, present, a.clear, a.add ^ 1)) is None  # other effects: no single op


def _key_needs_by_sweeps(p) -> tuple:
    """The plain form of ``pushdown._key_needs``: every move again until nothing changes."""
    free, mask = [bool(a) for a in p.accept], [0] * p.num_states
    free[p.bottom] = True
    changed = True
    while changed:
        changed = False
        for (q, b), t in np.ndenumerate(p.delta):
            o = p.ops[p.op[q, b]]
            if not t or free[q]:
                continue
            if free[t] or mask[t] & o.clear & ~o.add:
                got = o.absent or None
            else:
                got = mask[t] & ~(o.clear | o.add)
                if o.absent and got:
                    raise am.KeyRegisterError("a key test where the next state needs keys too")
                if not got:
                    continue
            if got is None:
                free[q] = changed = True
            elif mask[q] | got != mask[q]:
                mask[q] |= got
                changed = True
    return tuple(0 if free[q] else mask[q] for q in range(p.num_states))


@settings(max_examples=300, deadline=None)
@given(hs.integers(2, 7).flatmap(lambda n: hs.tuples(
    hs.lists(hs.lists(hs.integers(0, n - 1), min_size=3, max_size=3), min_size=n, max_size=n),
    hs.lists(hs.lists(hs.integers(0, 3), min_size=3, max_size=3), min_size=n, max_size=n),
    hs.lists(hs.booleans(), min_size=n, max_size=n), hs.lists(ops, min_size=3, max_size=3))))
def test_key_needs_worklist_equals_sweeps(machine):
    delta, op, accept, extra = machine
    delta, op = np.array(delta), np.array(op)
    delta[0] = 0  # state 0 is dead
    p = types.SimpleNamespace(delta=delta, op=op, ops=(KeyOp(), *extra), accept=np.array(accept), bottom=0,
                              enter=np.zeros_like(delta), num_states=len(delta))
    try:
        want = _key_needs_by_sweeps(p)
    except am.KeyRegisterError:
        return  # the sweeps may meet a key test while its target's need is unsettled
    assert pushdown._key_needs(p) == want


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
    # dependentRequired: "}" needs, per dependency, its name clear or its names set (alternatives)
    "dependent": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                   "c": {"type": "integer"}}, "dependentRequired": {"a": ["b"], "c": ["a", "b"]}},
    # both objects may close after {"b": 1}: "}" needs a or c (one op needing either)
    "union_required": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b", "c"]}]},
    # "a" declared in one branch, undeclared (open) in the other: both mark it
    "union_open": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"],
         "additionalProperties": {"type": "integer"}}]},
    # the second branch counts its members (tracked-set form): its keys mark the first's bits too
    "union_counted": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 1}]},
    "union_counted_declared": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b"]},
        {"type": "object", "properties": {"a": {"type": "integer"}, "c": {"type": "integer"}}, "minProperties": 2}]},
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
    for sub in [*schema.get("properties", {}).values(), schema.get("items"), *schema.get("anyOf", [])]:
        found |= _keys(sub)
    return found


def _repeats(doc: bytes) -> set:
    """Keys written twice in one object of ``doc``."""
    out = set()

    def pairs(items):
        names = [k for k, _ in items]
        out.update(k for k in names if names.count(k) > 1)
        return dict(items)

    json.loads(doc, object_pairs_hook=pairs)
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_register_form_accepts_the_tracked_set_forms_documents(name):
    """The same documents, except that a key some object declares is never written twice in one
    object (an open object of a union takes it as undeclared only once)."""
    schema = SCHEMAS[name]
    tracked = am.compile_expr(schema_expr(schema, whitespace="compact", key_register=False))
    registered = am.compile_expr(schema_expr(schema, whitespace="compact", key_register=True))
    assert isinstance(registered, pushdown.Pushdown) and len(registered.ops) > 1
    docs = _candidates(schema)
    assert any(tracked.matches(d) for d in docs) and not all(tracked.matches(d) for d in docs)
    for d in docs:
        assert registered.matches(d) == (tracked.matches(d) and not _repeats(d) & _keys(schema)), d


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


def test_ops_the_automaton_cannot_follow_are_refused():
    from jaxsample.structured.automaton import Call, lit, seq, star

    mark = KeyOp(absent=1, add=1)
    called = pushdown.Grammar({"root": seq(lit("["), Call("r"), lit("]")), "r": seq(mark, lit("a"))}, "root")
    with pytest.raises(pushdown.KeyRegisterError, match="called rule"):
        pushdown.compile_grammar(called)
    before_call = pushdown.Grammar({"root": seq(lit("["), mark, Call("r"), lit("]")), "r": lit("a")}, "root")
    with pytest.raises(pushdown.KeyRegisterError, match="before a call"):
        pushdown.compile_grammar(before_call)
    with pytest.raises(pushdown.KeyOpConflictError):  # "a" read with the op and without it
        am.compile_expr(am.alt(seq(mark, lit("a")), lit("ab")))
    with pytest.raises(am.GrammarError, match="without reading a byte"):
        am.compile_expr(seq(star(mark), lit("a")))


def test_union_branches_that_close_with_different_requirements_keep_the_register():
    """Both objects may close after ``{"uri": ...}`` (one needs ``text``, the other ``blob``): ``}``
    reads one op needing either set, on the device tables and the host matcher alike."""
    from jaxsample import structured as st
    from tests._structured_vocab import bpe_tokenizer, bpe_vocab

    item = {"type": "object", "properties": {"uri": {"type": "string"}, "text": {"type": "string"}}, "required": ["uri", "text"]}
    blob = {"type": "object", "properties": {"uri": {"type": "string"}, "blob": {"type": "string"}}, "required": ["uri", "blob"]}
    g = st.compile_json_schema({"anyOf": [item, blob]}, bpe_vocab(), key_register=True)
    assert g.pushdown.key_ops.shape[1] > 4  # an op with either masks
    for text, ok in [('{"uri":"","text":""}', True), ('{"blob":"","uri":""}', True), ('{"text":"","uri":""}', True),
                     ('{"uri":""}', False), ('{"text":"","blob":"","uri":""}', False), ('{"uri":"","uri":""}', False)]:  # fmt: skip
        ids = bpe_tokenizer().encode(text).ids
        m = st.Matcher(g)
        assert (m.accept_tokens(ids) == len(ids) and m.is_accepting()) == ok, text


def test_compile_json_schema_falls_back_where_union_branches_close_to_different_places():
    """After ``{"r":{"t":1}`` both branches' inner objects may close, one needing ``t``, the other
    nothing, and each goes on to its own outer object (``x`` or ``y`` next): one op cannot choose
    the next state, so the schema compiles without the register, to the same grammar as
    ``key_register=False``."""
    from jaxsample import structured as st
    from tests._structured_vocab import bpe_vocab

    inner = {"type": "object", "properties": {"t": {"type": "integer"}}, "required": ["t"]}
    loose = {"type": "object", "properties": {"t": {"type": "integer"}, "u": {"type": "integer"}}}
    schema = {"anyOf": [{"type": "object", "properties": {"r": inner, "x": {"type": "integer"}}},
                        {"type": "object", "properties": {"r": loose, "y": {"type": "integer"}}}]}
    with pytest.raises(pushdown.KeyOpConflictError):
        am.compile_expr(schema_expr(schema, key_register=True))
    v = bpe_vocab(size=1216)
    registered = st.compile_json_schema(schema, v, key_register=True)
    assert st.same_grammar(registered, st.compile_json_schema(schema, v, key_register=False))


def test_generate_with_recorded_keys_writes_valid_objects_without_repeats():
    """The real decode loop: rows sample a 12-property object (too many for the tracked-set form in
    any order) and an array of such objects; finished outputs validate and never repeat a key."""
    import jax.numpy as jnp
    import jsonschema
    import numpy as np

    import jaxsample as js
    from jaxsample import stages
    from jaxsample import structured as st
    from jaxsample.decoding import BIGRAM, generate
    from tests._structured_vocab import bpe_vocab

    v = bpe_vocab(size=1216)
    obj = {"type": "object", "properties": {f"k{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(12)},
           "required": ["k3"], "additionalProperties": False}  # fmt: skip
    schemas = [obj, {"type": "array", "items": obj, "maxItems": 3}]
    grammars = [st.compile_json_schema(s, v, whitespace="compact", key_register=True) for s in schemas]
    assert all(int(g.pushdown.key_ops.shape[0]) > 1 for g in grammars)
    rows = [0, 1, 0, 1]
    sampler = js.chain(stages.grammar(), stages.temperature(1.0), select=stages.categorical())
    params = {"seed": np.arange(4) + 5, **st.grammar_params([grammars[r] for r in rows])}
    model = {"logits": jnp.asarray(np.random.default_rng(1).standard_normal((1216, 1216)).astype(np.float32))}
    eos = list(v.eos_ids)
    out = generate(BIGRAM, model, np.ones((4, 1), np.int32), max_new_tokens=120, eos_ids=eos, pad_id=-1,
                   sampler=sampler, sampler_params=params)  # fmt: skip
    toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    finished = 0
    for r in range(4):
        ids = toks[r, : lengths[r]].tolist()
        if not set(eos) & set(ids):
            continue
        text = b"".join(v.token_bytes[t] for t in ids[: min(ids.index(e) for e in eos if e in ids)]).decode()

        def unique(pairs):
            keys = [k for k, _ in pairs]
            assert len(keys) == len(set(keys)), text
            return dict(pairs)

        jsonschema.validate(json.loads(text, object_pairs_hook=unique), schemas[rows[r]])
        finished += 1
    assert finished >= 2


def test_rows_are_never_stranded_by_written_keys():
    """Regression: a key prefix (``"k9``) was allowed after ``k9`` had been written, and so was ``,``
    after every key: the row then had no token left (the generate loop ended it with EOS, an invalid
    document). Random walks through objects that fill up: every configuration allows a token, and
    every finished walk is a valid document."""
    import jsonschema
    import numpy as np

    from jaxsample import structured as st
    from tests._structured_vocab import bpe_vocab

    v = bpe_vocab(size=1216)
    inner = {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}}, "required": ["ab"]}
    schema = {"type": "object", "properties": {"k1": {"type": "integer"}, "k2": inner, "k3": {"type": "boolean"}},
              "required": ["k2"], "additionalProperties": False}  # fmt: skip
    g = st.compile_json_schema(schema, v, whitespace="compact", key_register=True)
    rng = np.random.default_rng(0)
    eos = np.isin(np.arange(v.size), v.eos_ids)
    finished = 0
    for _ in range(40):
        m, ids = st.Matcher(g), []
        for _ in range(80):
            allowed = m.allowed()
            assert allowed.any(), b"".join(v.token_bytes[t] for t in ids)
            if allowed[eos].any() and (not (allowed & ~eos).any() or rng.random() < 0.3):
                jsonschema.validate(json.loads(b"".join(v.token_bytes[t] for t in ids)), schema)
                finished += 1
                break
            ids.append(int(rng.choice(np.flatnonzero(allowed & ~eos))))
            assert m.accept_token(ids[-1])
    assert finished >= 20


def test_an_object_too_large_for_the_tracked_sets_keeps_any_order_with_the_register():
    """20 properties: the tracked-set form keeps schema order (past ``max_order_states``) and refuses a
    valid document in another order; with the register (the default ``"auto"`` chooses it for such an
    object) the token tables accept it."""
    import numpy as np

    from jaxsample import structured as st
    from tests._structured_vocab import bpe_vocab

    v = bpe_vocab(size=1216)
    props = {f"p{i:02d}": {"type": "string", "maxLength": 3} for i in range(20)}
    schema = {"type": "object", "properties": props, "required": ["p00"], "additionalProperties": False}
    doc = json.dumps({k: "ab" for k in reversed(props)}, separators=(",", ":")).encode()
    ids = [v.token_bytes.index(bytes([b])) for b in doc]  # one byte per token

    def accepts(g) -> bool:
        m = st.Matcher(g)
        return m.accept_tokens(ids) == len(ids) and m.is_accepting()

    assert not accepts(st.compile_json_schema(schema, v, whitespace="compact", key_register=False))
    registered = st.compile_json_schema(schema, v, whitespace="compact", key_register=True)
    assert accepts(registered) and registered.num_states < 400
    assert st.same_grammar(st.compile_json_schema(schema, v, whitespace="compact"), registered)  # "auto"
    twice = doc.replace(b'"p19"', b'"p18"', 1)  # p18 written twice
    m = st.Matcher(registered)
    assert m.accept_tokens([v.token_bytes.index(bytes([b])) for b in twice]) < len(twice)
    assert np.asarray(m.allowed()).any()  # refused at the repeat, never stranded


def test_key_register_option_is_checked():
    with pytest.raises(ValueError, match="key_register"):
        schema_expr({"type": "object"}, key_register="yes")
