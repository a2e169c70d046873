"""Recursive grammars on a stack: token tables == the byte-level pushdown automaton, device == host
matcher, the depth limit (masked, never stranded, traced), the Matcher API, decoding, no recompiles."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample import structured as st
from jaxsample.structured import automaton as am
from jaxsample.structured.gbnf import parse_gbnf
from jaxsample.structured.json_schema import schema_expr
from tests._helpers import CountingJit
from tests._structured_vocab import bpe_vocab
from tests.test_structured_gbnf import ARITHMETIC, JSON_GBNF

V = 1216  # logits wider than the 1200-token tokenizer: padded columns
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
# objects recording their keys (any order in linear size), next to generic values, arrays of objects
# and a union whose objects may both close needing different keys, one open to the other's key
KEYS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string"},
        "c": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                          "y": {"type": "integer"}}, "required": ["x"]}},
        "d": {},
        "e": {"anyOf": [{"type": "object", "properties": {"k": {"type": "integer"}, "p": {"type": "integer"}}, "required": ["p"]},
                        {"type": "object", "properties": {"k": {"type": "integer"}, "q": {"type": "integer"}}, "required": ["q"],
                         "additionalProperties": {"type": "integer"}}]},
        "f": {"anyOf": [{"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
                        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}]},
    },
    "required": ["a"],
    "dependentRequired": {"b": ["c"]},
}  # fmt: skip
# name: (byte-level automaton, token tables), the same grammar and limit
SOURCES = {
    "arith": (lambda: parse_gbnf(ARITHMETIC, max_depth=3), lambda v: st.compile_gbnf(ARITHMETIC, v, max_depth=3)),
    "json_gbnf": (lambda: parse_gbnf(JSON_GBNF, max_depth=2), lambda v: st.compile_gbnf(JSON_GBNF, v, max_depth=2)),
    "json_mode": (lambda: schema_expr(True, whitespace="bounded", max_depth=2),
                  lambda v: st.compile_json(v, max_depth=3, whitespace="bounded")),
    "tree": (lambda: schema_expr(TREE, whitespace="compact", max_depth=2),
             lambda v: st.compile_json_schema(TREE, v, whitespace="compact", max_depth=2)),
    "tree_keys": (lambda: schema_expr(TREE, whitespace="compact", max_depth=2, key_register=True),
                  lambda v: st.compile_json_schema(TREE, v, whitespace="compact", max_depth=2, key_register=True)),
    "keys": (lambda: schema_expr(KEYS, max_depth=2, key_register=True),
             lambda v: st.compile_json_schema(KEYS, v, max_depth=2, key_register=True)),
}  # fmt: skip


# every byte, and tokens that enter and leave rules (for a moment deeper), return through several
# rules, or return and enter again
CROSSING = (None, *(bytes([b]) for b in range(256)), b"[1]", b"[[", b"]]", b"]]]", b"],[", b"[{", b"}]", b"}},",
            b'{"v":', b'{"v":1}', b"(1)", b"((1))", b"1))", b")*(", b"))+(", b"[[1]]", b"[]]", b'":[{"')  # fmt: skip


def crossing_vocab():
    return st.Vocabulary(CROSSING, (0,))


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for vocab in (bpe_vocab(size=V), crossing_vocab()):
        out.update({(k, vocab.size): (am.compile_expr(expr()), build(vocab)) for k, (expr, build) in SOURCES.items()})
    return out


@pytest.fixture(scope="module")
def ids():
    return {b: i for i, b in enumerate(bpe_vocab(size=V).token_bytes) if b}


def _random_tokens(m, rng, steps, prefer=()):
    """Accepts ``steps`` random allowed non-EOS tokens (``prefer``red ones mostly); returns them."""
    out = []
    for _ in range(steps):
        allowed = m.allowed()
        assert allowed.any(), "a row is never stranded"
        text = np.flatnonzero(allowed & ~np.isin(np.arange(allowed.size), m.eos_ids))
        if text.size == 0:
            break
        good = [t for t in prefer if allowed[t]]
        t = int(rng.choice(good if good and rng.random() < 0.7 else text))
        assert m.accept_token(t)
        out.append(t)
    return out


DEEP = {  # documents reaching each grammar's limit
    "arith": b"(((1+2)*3))-((4))",
    "json_gbnf": b'{"a": [{"b": 1, "c": true}, 2], "d": {"e": {}}}',
    "json_mode": b'[[[1, "x"], {"k": null}], 2.5]',
    "tree": b'{"v":1,"kids":[{"v":2,"kids":[{"v":3},{"v":4}]},{"v":5}]}',
    "tree_keys": b'{"kids":[{"v":2,"kids":[{"v":3},{"v":4}]},{"v":5}],"v":1}',
    "keys": b'{"c": [{"y": 1, "x": 2}, {"x": 3}], "d": [[1], {"k": 2}], "a": 5, "e": {"k": 1, "p": 2}, "b": "s"}',
}


def _greedy(data: bytes, vocab) -> list:
    """Longest-match tokenization (a path through multi-byte tokens that cross rule boundaries)."""
    index = {b: i for i, b in enumerate(vocab.token_bytes) if b}
    out, i = [], 0
    while i < len(data):
        n = max(n for n in range(1, len(data) - i + 1) if data[i : i + n] in index)
        out.append(index[data[i : i + n]])
        i += n
    return out


@pytest.mark.parametrize("crossing", [False, True])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_token_tables_equal_the_byte_level_pushdown_automaton(compiled, name, crossing):
    """Every token at every visited configuration is allowed exactly when its bytes run on the
    byte-level automaton within the limit with a completion left, and then leads to the same state
    and stack (tokens returning through rules, entering rules, at the depth limit). Configurations:
    a document that reaches the limit, then random tokens."""
    v = crossing_vocab() if crossing else bpe_vocab(size=V)
    pd, g = compiled[name, v.size]
    m = st.Matcher(g)
    assert m.limit == pd.max_depth
    script = _greedy(DEEP[name], v)
    rng = np.random.default_rng(len(name))
    deepest = 0
    for step in range(len(script) + 15):
        allowed = m.allowed()
        for t, data in enumerate(v.token_bytes):
            if data is None:
                assert allowed[t] == (t in g.eos_ids and m.is_accepting()), t
                continue
            want = pd.run(data, m.state, m.stack, m.limit, m.keys)
            assert allowed[t] == (want is not None), (data, m.state, m.stack)
            if want is not None:
                assert m._step(t) == want, data
        deepest = max(deepest, len(m.stack))
        if step < len(script):
            assert m.accept_token(script[step]), (name, step)
        elif not _random_tokens(m, rng, 1):
            break
    assert deepest == m.limit


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_matches_is_the_language_of_the_tables_at_every_limit(limit):
    """Regression: ``Pushdown.matches`` did not count a call entered and left within one byte (``x``
    read as a call of ``root``), the tables did: at ``max_depth=1`` it accepted ``((x))``, which the
    tables refuse. Every string of up to 7 bytes over ``( ) x``, one token per byte."""
    import itertools

    pd = am.compile_expr(parse_gbnf('root ::= "(" root ")" | "x"', max_depth=2))
    v = st.Vocabulary.from_pieces(["<eos>", "(", ")", "x"], kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_gbnf('root ::= "(" root ")" | "x"', v, max_depth=2)
    accepted = 0
    for n in range(1, 8):
        for text in itertools.product(b"()x", repeat=n):
            m = st.Matcher(g, max_depth=limit)
            ids = [b"()x".index(b) + 1 for b in text]
            by_tables = m.accept_tokens(ids) == n and m.is_accepting()
            assert pd.matches(bytes(text), max_depth=limit) == by_tables, bytes(text)
            accepted += by_tables
    assert accepted == limit + 1  # x, (x), ((x)), ... up to `limit` calls of root inside the first


def test_device_stepping_equals_the_host_matcher(compiled):
    """Recursive and regular grammars and a free row in one batch; two limits through one trace."""
    grammars = [compiled[k, V][1] for k in ("arith", "json_gbnf", "json_mode", "tree", "keys", "tree_keys")]
    grammars.append(st.compile_regex(r"[a-z]{1,3}(,[0-9]+)*", bpe_vocab(size=V)))
    rows = np.array([0, 1, 2, 3, 4, 5, 6, -1])
    allowed_fn, advance_fn = CountingJit(st.allowed), CountingJit(st.advance)
    for limit in (None, 1):  # the limit is a traced table value
        tables = st.stack(grammars, max_depth=limit, num_depth=32)
        matchers = [st.Matcher(g, max_depth=limit) for g in grammars]
        state = st.initial_state(tables, rows)
        rng = np.random.default_rng(7)
        for _ in range(40):
            dev = np.asarray(allowed_fn(tables, rows, state))
            toks = []
            for r, m in enumerate(matchers):
                np.testing.assert_array_equal(dev[r], m.allowed())
                assert int(state.state[r]) == m.state and int(state.depth[r]) == len(m.stack)
                assert tuple(np.asarray(state.stack[r, : len(m.stack)]).tolist()) == m.stack
                assert sum(int(w) << 32 * j for j, w in enumerate(np.asarray(state.keys[r]).tolist())) == m.keys
                toks += _random_tokens(m, rng, 1) or [-1]  # -1 (padding): a finished row keeps its state
            assert dev[-1].all()
            state = advance_fn(tables, rows, state, np.array(toks + [int(rng.integers(3, 1200))]))
    assert allowed_fn.traces == 1 and advance_fn.traces == 1


def test_depth_limit_masks_deeper_nesting_and_never_strands_a_row(ids):
    v = bpe_vocab(size=V)
    g = st.compile_json(v, max_depth=3, whitespace="compact")
    m = st.Matcher(g)
    assert m.accept_tokens([ids[b"["]] * 3) == 3 and len(m.stack) == 2 == m.limit
    allowed = m.allowed()
    assert not allowed[ids[b"["]] and not allowed[ids[b"{"]]  # a fourth level would exceed the limit
    assert allowed[ids[b"]"]] and allowed[ids[b"1"]] and allowed[ids[b'"']] and not allowed[0]
    assert st.Matcher(g, max_depth=5).accept_tokens([ids[b"["]] * 7) == 6  # a larger limit, same tables
    rng = np.random.default_rng(0)
    opening = [i for b, i in ids.items() if b[:1] in b"[{"]
    closing = [t for b, t in ids.items() if b[-1:] in b']}"0123456789el']
    for _ in range(20):  # random outputs under a tight limit: always finishable, valid JSON, nesting <= 2
        m = st.Matcher(g, max_depth=1)
        toks = _random_tokens(m, rng, 30, opening)
        while not m.is_accepting():
            allowed = m.allowed()
            choice = [t for t in closing if allowed[t]] or np.flatnonzero(allowed).tolist()
            toks.append(int(rng.choice(choice)))
            assert m.accept_token(toks[-1])
        doc = json.loads(b"".join(v.token_bytes[t] for t in toks))
        assert _depth(doc) <= 2


def test_matcher_api():
    pieces = ["<eos>", *"()0123456789+-*/", "))", "2)", "(("]
    v = st.Vocabulary.from_pieces(pieces, kind="raw", special_ids=[0], eos_ids=[0])
    ids = {p.encode(): i for i, p in enumerate(pieces)}
    g = st.compile_gbnf(ARITHMETIC, v)
    m = st.Matcher(g)
    bitmask = np.zeros((2, 1), np.int32)
    m.fill_next_token_bitmask(bitmask, 1)
    unpacked = np.unpackbits(bitmask[1].view(np.uint8), bitorder="little")[: len(pieces)].astype(bool)
    np.testing.assert_array_equal(unpacked, m.allowed())
    assert not bitmask[0].any()
    assert not m.accept_token(ids[b")"]) and m.state == g.start  # refused: nothing changes
    assert m.accept_tokens([ids[b"(("], ids[b"1"], ids[b"+"]]) == 3 and len(m.stack) == 2  # a frame per "("
    assert not m.is_accepting() and not m.allowed()[0]
    assert m.accept_token(ids[b"2)"]) and len(m.stack) == 1  # returns through one frame
    assert m.accept_token(ids[b")"]) and m.is_accepting() and m.stack == ()
    assert m.accept_token(0) and m.is_terminated()
    assert m.allowed().tolist() == [t == 0 for t in range(len(pieces))]  # finished: only EOS
    m.rollback(3)
    assert not m.is_terminated() and len(m.stack) == 2 and m.allowed()[ids[b"2)"]] and not m.allowed()[ids[b"))"]]
    assert m.accept_token(ids[b"2"]) and m.accept_token(ids[b"))"]) and m.stack == ()  # returns through two frames
    with pytest.raises(ValueError, match="roll back 9"):
        m.rollback(9)
    with pytest.raises(ValueError, match="int32"):
        m.fill_next_token_bitmask(np.zeros((1, 1), np.uint32))
    with pytest.raises(ValueError, match="max_depth"):
        st.Matcher(g, max_depth=-1)
    m.reset()
    assert m.state == g.start and m.stack == () and not m.is_terminated()
    regular = st.Matcher(st.compile_regex("1(2)?", v))  # regular grammars too
    assert regular.accept_token(ids[b"1"]) and regular.is_accepting() and not regular.accept_token(ids[b"1"])
    with pytest.raises(ValueError, match="stack"):
        g.advance(g.start, ids[b"("])


def test_generate_recursive_json_with_traced_depth_limits():
    """The chain stage in the real decode loop: per-row grammars, one regular; limits per batch."""
    from jaxsample.decoding import BIGRAM, generate

    v = bpe_vocab(size=V)
    rows = [st.compile_json(v, whitespace="compact"), st.compile_json_schema(TREE, v, whitespace="compact"),
            st.compile_regex("[a-z]{2}", v), st.compile_gbnf(ARITHMETIC, v)]  # fmt: skip
    sampler = js.chain(stages.grammar(), stages.temperature(1.0), select=stages.categorical())
    logits = np.random.default_rng(3).standard_normal((V, V)).astype(np.float32) * 2.0
    ids = {b: i for i, b in enumerate(v.token_bytes) if b}
    for o in (b"[", b"{", b"("):  # a model that loves to nest
        logits[:, ids[o]] += 4.0
    for limit in (2, 4):
        params = {"seed": np.arange(4), **st.grammar_params(rows, max_depth=limit, num_depth=8)}
        out = generate(BIGRAM, {"logits": jnp.asarray(logits)}, np.ones((4, 1), np.int32), max_new_tokens=120,
                       eos_ids=[0, 2], pad_id=-1, sampler=sampler, sampler_params=params)  # fmt: skip
        toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        texts = [b"".join(v.token_bytes[t] or b"" for t in toks[r, : lengths[r]] if t not in (0, 2)) for r in range(4)]
        done = [toks[r, lengths[r] - 1] in (0, 2) for r in range(4)]
        for r in (0, 1):
            if done[r]:
                doc = json.loads(texts[r])
                assert _depth(doc) <= (limit + 1 if r == 0 else 2 * limit + 1), texts[r]
        for r, text in enumerate(texts):  # unfinished rows are prefixes the host matcher accepts too
            m = st.Matcher(rows[r], max_depth=limit)
            assert m.accept_tokens([t for t in toks[r, : lengths[r]] if t >= 0]) == lengths[r]
    # The limit binds, whatever the backend's rounding does to sampled paths: a greedy model whose
    # openers beat closers beat digits (margins >= 0.5) nests exactly to each traced limit.
    table = np.zeros((V, V), np.float32)
    for tok, score in ((b"(", 3.0), (b"[", 3.0), (b")", 2.5), (b"]", 2.5), (b"1", 2.0)):
        table[:, ids[tok]] = score
    table[:, 0] = 0.5  # EOS once the document is complete
    greedy = js.chain(stages.grammar(), select=stages.greedy())
    for limit in (2, 4):
        params = st.grammar_params(rows, max_depth=limit, num_depth=8)
        out = generate(BIGRAM, {"logits": jnp.asarray(table)}, np.ones((4, 1), np.int32), max_new_tokens=24,
                       eos_ids=[0, 2], pad_id=-1, sampler=greedy, sampler_params=params)  # fmt: skip
        toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        texts = [b"".join(v.token_bytes[t] or b"" for t in toks[r, : lengths[r]] if t not in (0, 2)) for r in (0, 3)]
        assert texts == [b"[" * (limit + 1) + b"]" * (limit + 1), b"(" * limit + b"1" + b")" * limit]


def test_new_recursive_grammar_in_the_same_buckets_does_not_recompile():
    v = bpe_vocab(size=V)
    f = CountingJit(st.mask)
    x = jnp.zeros((2, V))
    rows = jnp.array([0, -1])
    pins = dict(num_states=512, num_classes=256, num_masks=256, num_depth=32, num_returns=512, num_pop_tokens=4096,
                num_transitions=16384, num_blocks=1024)
    for g in (st.compile_gbnf(ARITHMETIC, v), st.compile_json(v), st.compile_json_schema(TREE, v)):
        t = st.stack([g], **pins)
        jax.block_until_ready(f(x, t, rows, st.initial_state(t, rows)))
    assert f.traces == 1
    with pytest.raises(ValueError, match="num_returns"):
        st.stack([st.compile_json(v)], num_returns=1)
    call = am.Call("r")
    rules = {"root": am.seq(am.lit("<"), call, am.lit(">")), "r": am.alt(am.lit("x"), am.seq(am.lit("("), call, am.lit(")")))}
    needs_one = st.compile_expression(st.Grammar(rules, "root"), v)  # every output enters "r": one frame
    with pytest.raises(ValueError, match="shortest output"):
        st.stack([needs_one], max_depth=0)
    with pytest.raises(ValueError, match="shortest output"):
        st.Matcher(needs_one, max_depth=0)


def _depth(doc) -> int:
    if isinstance(doc, dict):
        return 1 + max((_depth(x) for x in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((_depth(x) for x in doc), default=0)
    return 0


def test_one_of_with_a_recursive_branch():
    """oneOf branches containing calls are proven disjoint on a regular superset (the callee's first
    character, then anything); a branch the superset cannot separate raises instead of guessing."""
    nullable = {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/node"}],
                "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#"}}, "additionalProperties": False}}}  # fmt: skip
    d = am.compile_expr(schema_expr(nullable, whitespace="compact"))
    assert d.matches(b'{"next":{"next":null}}') and d.matches(b"null") and not d.matches(b'{"next":1}')
    overlapping = {"oneOf": [{"type": "object"}, {"$ref": "#/$defs/node"}], "$defs": nullable["$defs"]}
    with pytest.raises(am.GrammarError, match="overlap"):
        schema_expr(overlapping)


def test_calls_of_rules_matching_nothing_are_skippable_and_only_reachable_rules_are_checked():
    from jaxsample.structured.automaton import EPSILON, Call, alt, lit, seq
    from jaxsample.structured.pushdown import Grammar, compile_grammar

    rules = {"root": seq(lit("("), Call("xs"), lit(")")), "xs": alt(EPSILON, seq(lit("x"), Call("xs"))),
             "unused": Call("undefined")}  # fmt: skip
    p = compile_grammar(Grammar(rules, "root"))
    assert [p.matches(s) for s in (b"()", b"(x)", b"(xxx)", b"(y)", b"(")] == [True, True, True, False, False]
    with pytest.raises(am.GrammarError, match="'undefined' is called but not defined"):
        compile_grammar(Grammar({**rules, "xs": alt(EPSILON, Call("unused"))}, "root"))


def test_a_grammar_past_the_budget_fails_in_the_budgets_time_not_its_sizes():
    """compile_grammar stops when the NFA reaches ``max_nfa_states``: no pass over the whole expression
    first (front ends build expressions of millions of nodes that no budget admits; such passes took
    20 s of a 22 s failed attempt on one JSONSchemaBench schema)."""
    import time

    from jaxsample.structured.automaton import EPSILON, Call, alt, lit, seq
    from jaxsample.structured.pushdown import Grammar, compile_grammar

    rules = {"root": alt(*(seq(lit(f"k{i}"), Call("r")) for i in range(30_000))), "r": alt(EPSILON, lit("x"))}
    start = time.perf_counter()
    with pytest.raises(am.BudgetError):
        compile_grammar(Grammar(rules, "root"), max_nfa_states=1_000)
    assert time.perf_counter() - start < 0.5  # (a pass over its 30,000 branches first: ~1.5 s)


def test_calls_entered_on_one_byte_become_one_call_of_their_union():
    """Rules entered on one byte that return to one state are one call of a rule matching either:
    the same strings, and the same frames at every limit as the grammar factored by hand."""
    from jaxsample.structured.automaton import EPSILON, Call, alt, lit, seq
    from jaxsample.structured.pushdown import Grammar, compile_grammar

    def obj(k):
        return seq(lit("{"), lit(k), alt(EPSILON, Call("v")), lit("}"))

    union = {"root": seq(lit("["), alt(Call("a"), Call("b")), lit("]")), "a": obj("x"), "b": obj("y"),
             "v": seq(lit("("), alt(Call("b"), Call("a")), lit(")"))}  # fmt: skip
    factored = {"root": seq(lit("["), Call("c"), lit("]")), "c": seq(lit("{"), alt(lit("x"), lit("y")), alt(EPSILON, Call("v")), lit("}")),
                "v": seq(lit("("), Call("c"), lit(")"))}  # fmt: skip
    rng = np.random.default_rng(0)

    def nested(n):
        inner = "" if n == 0 else "(" + nested(n - 1) + ")"
        return "{" + str(rng.choice(list("xyz"))) + inner + "}"

    docs = [f"[{nested(n)}]".encode() for n in range(6) for _ in range(8)] + [b"[]", b"[{x}", b"{x}", b"[{x()}]"]
    for limit in range(1, 5):
        merged, plain = compile_grammar(Grammar(union, "root", limit)), compile_grammar(Grammar(factored, "root", limit))
        got = [merged.matches(d) for d in docs]
        assert got == [plain.matches(d) for d in docs], limit
        assert any(got) and not all(got)
    # a rule of the grammar's own named like the union keeps its meaning
    own = compile_grammar(Grammar({"root": seq(lit("["), alt(Call("a"), Call("b")), lit("]"), Call("a | b")),
                                   "a": lit("{x}"), "b": lit("{y}"), "a | b": lit("!")}, "root"))  # fmt: skip
    assert [own.matches(s) for s in (b"[{x}]!", b"[{y}]!", b"[{y}]{x}", b"[!]!")] == [True, True, False, False]


def test_calls_returning_to_different_places_are_inlined_where_not_recursive():
    from jaxsample.structured.automaton import Call, alt, lit, seq
    from jaxsample.structured.pushdown import AmbiguousCallError, Grammar, _called, compile_grammar, inline_all

    # union branches calling a and b on "(" and returning to different places (">" or "]"), as the
    # objects of a union whose same key has differently referenced values
    rules = {"root": alt(seq(lit("<"), Call("a"), lit(">")), seq(lit("<"), Call("b"), lit("]")), Call("a")),
             "a": seq(lit("("), Call("c"), lit(")")), "b": lit("(y)"), "c": alt(lit("x"), seq(lit("["), Call("c"), lit("]")))}  # fmt: skip
    g = Grammar(rules, "root")
    strings = [b"<(x)>", b"<(y)]", b"(x)", b"<([[x]])>", b"<(x)]", b"<(y)>", b"(y)", b"<([x)>"]
    want = [True, True, True, True, False, False, False, False]
    p = compile_grammar(g)
    assert [p.matches(s) for s in strings] == want
    flat = inline_all(g, frozenset({"a", "b"}))  # the rewrite: the same strings, c still called
    assert "c" in _called(flat.rules["root"]) and not {"a", "b"} & _called(flat.rules["root"])
    assert [compile_grammar(flat).matches(s) for s in strings] == want
    with pytest.raises(AmbiguousCallError, match="two ways") as err:  # a and b recursive: refused as before
        compile_grammar(Grammar({**rules, "a": alt(seq(lit("("), Call("a"), lit(")")), lit("x")),
                                 "b": alt(seq(lit("("), Call("b"), lit(")")), lit("y"))}, "root"))  # fmt: skip
    assert [(sorted(r), shifts, one) for r, shifts, one in err.value.conflicts] == [(["a", "b"], False, False)]


def test_a_call_entered_on_a_byte_that_also_shifts_is_inlined_and_other_ambiguity_is_refused():
    from jaxsample.structured.automaton import Call, alt, lit, seq
    from jaxsample.structured.pushdown import AmbiguousCallError, Grammar, compile_grammar

    p = compile_grammar(Grammar({"root": alt(lit("{z}"), Call("a")), "a": lit("{x}")}, "root"))
    assert [p.matches(s) for s in (b"{z}", b"{x}", b"{y}", b"{")] == [True, True, False, False]
    # joined at the root, a | b then calls a and b on "(" returning to different places (")" or "]"
    # follows): which one returned could not be told; refused with the error of the grammar as written
    rules = {"root": alt(Call("a"), Call("b")), "a": alt(seq(lit("("), Call("a"), lit(")")), lit("x")),
             "b": alt(seq(lit("("), Call("b"), lit("]")), lit("y"))}  # fmt: skip
    with pytest.raises(AmbiguousCallError, match="two ways") as err:
        compile_grammar(Grammar(rules, "root"))
    assert [(sorted(r), shifts, one) for r, shifts, one in err.value.conflicts] == [(["a", "b"], False, True)]
