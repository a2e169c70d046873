"""Device side: tables vs host, bucketing without recompiles, the chain stage (shared tables), decoding loops."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample import structured as st
from tests._helpers import CountingJit, assert_single_trace
from tests._structured_vocab import bpe_vocab

V = 1216  # logits wider than the 1200-token tokenizer: padded columns
SCHEMA_A = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age"],
}
SCHEMA_B = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}
REGEX_C = r"(yes|no|maybe)( because [a-z]{1,8})?\."


@pytest.fixture(scope="module")
def grammars():
    v = bpe_vocab(size=V)
    return {
        "a": st.compile_json_schema(SCHEMA_A, v, whitespace="compact", property_order="schema"),  # small tables
        "b": st.compile_json_schema(SCHEMA_B, v, whitespace="bounded", max_whitespace=2),
        "c": st.compile_regex(REGEX_C, v),
        "d": st.compile_choice(["alpha", "beta", "gamma"], v),
    }


def test_device_mask_and_advance_match_the_host_tables(grammars):
    gs = [grammars[k] for k in "abc"]
    tables = st.stack(gs)
    assert tables.forced.shape[1] == st.bucket(max(g.num_states for g in gs), 64)
    rng = np.random.default_rng(0)
    ids = np.array([0, 1, 2, -1])
    state = st.initial_state(tables, ids)
    mask_fn, adv_fn = jax.jit(st.mask), jax.jit(st.advance)
    x = rng.normal(size=(4, V)).astype(np.float32)
    for _ in range(12):
        out = np.asarray(mask_fn(x, tables, ids, state))
        for r in range(3):
            np.testing.assert_array_equal(np.isfinite(out[r]), gs[r].allowed(int(state.state[r])))
            np.testing.assert_array_equal(out[r][np.isfinite(out[r])], x[r][np.isfinite(out[r])])
        np.testing.assert_array_equal(out[3], x[3])  # unconstrained row untouched
        ok = np.isfinite(out)
        toks = np.array([rng.choice(np.flatnonzero(ok[r] & (np.arange(V) > 2) if (ok[r, 3:]).any() else ok[r]))
                         for r in range(4)])  # fmt: skip
        new = adv_fn(tables, ids, state, toks)
        for r in range(3):
            assert int(new.state[r]) == gs[r].advance(int(state.state[r]), int(toks[r]))
        assert int(new.state[3]) == int(state.state[3])
        state = new
    kept = st.advance(tables, ids, state, np.array([-1, -1, -1, -1]))
    assert np.asarray(kept.state).tolist() == np.asarray(state.state).tolist()


def test_forced_tokens_and_accepting(grammars):
    g = grammars["d"]
    v = bpe_vocab(size=V)
    tables = st.stack([g])
    s = st.initial_state(tables, np.array([0]))
    assert int(st.forced_token(tables, np.array([0]), s)[0]) == -1
    path = []
    state = g.start
    for piece in (b"g", b"am", b"ma"):
        t = v.token_bytes.index(piece) if piece in v.token_bytes else None
        if t is None or not g.allowed(state)[t]:
            break
        path.append(t)
        state = g.advance(state, t)
    s = jnp.asarray([state])
    f = int(st.forced_token(tables, np.array([0]), s)[0])
    assert f == g.forced[state]
    assert bool(st.is_accepting(tables, np.array([0]), s, 0)[0]) == bool(g.accept[state])
    assert int(st.forced_token(tables, np.array([-1]), s)[0]) == -1


def test_new_schema_in_the_same_bucket_does_not_recompile(grammars):
    f = CountingJit(st.mask)
    x = jnp.zeros((2, V))
    ids = jnp.array([0, -1])
    for k in "acd":
        t = st.stack([grammars[k]], num_states=128, num_classes=128, num_masks=64, num_transitions=4096, num_blocks=512)
        jax.block_until_ready(f(x, t, ids, st.initial_state(t, ids)))
    assert f.traces == 1


def test_stack_validation(grammars):
    with pytest.raises(ValueError, match="at least one"):
        st.stack([])
    with pytest.raises(ValueError, match="smaller than needed"):
        st.stack([grammars["a"]], num_states=2)
    with pytest.raises(ValueError, match="smaller than needed"):
        st.stack([grammars["a"], grammars["c"]], num_grammars=1)
    other = st.compile_regex("a", bpe_vocab())
    with pytest.raises(ValueError, match="vocabulary sizes"):
        st.stack([grammars["a"], other])
    with pytest.raises(ValueError, match="V=10 columns"):
        st.mask(jnp.zeros((1, 10)), st.stack([grammars["a"]]), jnp.array([0]), jnp.array([1]))
    t = st.stack([grammars["a"], grammars["c"], grammars["d"]])
    assert t.start.shape == (4,) and int(t.start[3]) == 0  # G bucketed; the padding grammar is dead
    assert st.nbytes(t) > 0


def _straightforward(g, s_size: int, rooms: int):
    """The plain layout of a grammar: dense ``next`` (effects after the padded states), a mask per (state, room)."""
    dense = g.next.astype(np.int64)
    nxt = np.where(dense >= g.num_states, dense - g.num_states + s_size, dense)
    room_ids = g.mask_id[:, None] if g.pushdown is None else g.pushdown.room_mask_id
    ids = room_ids[:, np.minimum(np.arange(rooms), room_ids.shape[1] - 1)]
    return nxt, g.masks[ids]  # [S, C], uint32[S, R, W]


@pytest.mark.parametrize("pins", [{}, dict(num_states=1024, num_classes=512, num_masks=512, num_transitions=70000,
                                           num_blocks=70000)])  # fmt: skip  (wider dtypes: uint16, int32)
def test_packed_tables_are_exactly_the_straightforward_form(grammars, pins):
    """Every (grammar, state, class) of the packed device ``next`` equals the dense host table (0 where dead,
    padded states and classes included), and every (state, room) mask rebuilt from its blocks equals the
    host bitmask, for regular and recursive grammars stacked together (so dtypes are chosen by the buckets)."""
    from jaxsample.structured.tables import _mask_words, _next, _packed_next

    v = bpe_vocab(V)
    extra = [st.compile_gbnf('root ::= e\ne ::= "(" e ")" | [0-9]+', v), st.compile_json(v),
             st.compile_json_schema({"type": "string", "minLength": 3, "maxLength": 40}, v)]  # fmt: skip
    gs = [grammars["a"], grammars["b"], grammars["c"], grammars["d"], *extra]
    t = st.stack(gs, **pins)
    s_size, rooms, w = t.forced.shape[1], t.mask_id.shape[2], -(-V // 32)
    classes = t.live_bits.shape[2] * 32
    q, c = np.meshgrid(np.arange(s_size), np.arange(classes), indexing="ij")
    qr, r = np.meshgrid(np.arange(s_size), np.arange(rooms), indexing="ij")
    next_fn, words_fn = jax.jit(_next), jax.jit(_mask_words)
    for i, g in enumerate(gs):
        nxt, masks = _straightforward(g, s_size, rooms)
        got = np.asarray(next_fn(t, jnp.full(q.shape, i), jnp.asarray(q), jnp.asarray(c)))
        want = np.zeros(q.shape, np.int64)
        want[: g.num_states, : g.num_classes] = nxt
        np.testing.assert_array_equal(got, want)
        words = np.asarray(words_fn(t, jnp.full(qr.size, i), jnp.asarray(qr.ravel()), jnp.asarray(r.ravel())))
        words = words.reshape(s_size, rooms, -1)
        np.testing.assert_array_equal(words[: g.num_states, :, :w], masks)
        assert not words[g.num_states :].any() and not words[..., w:].any()  # padded states and words: nothing allowed
        if g.pushdown is not None:
            _check_returns(t, i, g, nxt)
    stored = [_packed_next(g.next)[-1].size for g in gs]
    live = [int((g.next != 0).sum()) for g in gs]
    assert all(n <= m for n, m in zip(stored, live)) and stored[-2] < 0.8 * live[-2]  # a default per state, the exceptions
    assert max(stored) <= t.targets.shape[1] < (2 * max(max(stored), 256) if not pins else 1 << 17)
    assert sum(g.pushdown is not None for g in gs) == 2


def _check_returns(t, i, g, nxt):
    """Grammar ``i``'s stack tables against the host's: every state a return can pop reads its dense
    ``next`` row through ``return_next`` (every class), effects name a rest by its column (``-1``: the
    token's own class), and each state lists the host's stack-dependent tokens with ``next`` from it."""
    p, k, c = g.pushdown, g.num_states, g.num_classes
    row, col = np.asarray(t.return_row[i])[:k].astype(int), np.asarray(t.return_col[i])[:c].astype(int)
    pushed = p.effect[:, 4:][np.arange(p.effect.shape[1] - 4) < p.effect[:, 2:3]]
    assert (row[pushed] > 0).all() and row[p.bottom] > 0
    np.testing.assert_array_equal(np.asarray(t.return_next[i])[row[row > 0, None], col], nxt[row > 0])
    rest = np.asarray(t.effect[i])[: p.effect.shape[0], 1]
    np.testing.assert_array_equal(rest, np.where(p.effect[:, 1] >= 0, col[np.maximum(p.effect[:, 1], 0)], -1))
    start, count = np.asarray(t.pop_start[i]).astype(int), np.asarray(t.pop_count[i]).astype(int)
    token, value = np.asarray(t.pop_token[i]).astype(int), np.asarray(t.pop_next[i]).astype(int)
    for s in range(k):
        want = p.pop_token[p.pop_start[s] : p.pop_start[s] + p.pop_count[s]]
        np.testing.assert_array_equal(token[start[s] : start[s] + count[s]], want)
        np.testing.assert_array_equal(value[start[s] : start[s] + count[s]], nxt[s, g.class_of[want]])


def _toy_logits(seed=0):
    """A deterministic 'model': logits of the next token depend only on the last token."""
    return jax.random.normal(jax.random.key(seed), (V, V)) * 2.0


def _decode(sampler, steps):
    table = _toy_logits()

    def run(state, params):
        def body(carry, _):
            state, last, done = carry
            tok, _, new = sampler.sample(table[last], state, params, active=~done)
            tok = jnp.where(done, -1, tok)
            return (new, jnp.where(done, last, tok), done | (tok == 0) | (tok == 2)), tok

        b = params["seed"].shape[0]
        carry = (state, jnp.full((b,), 1, jnp.int32), jnp.zeros((b,), bool))
        (state, _, done), toks = jax.lax.scan(body, carry, None, length=steps)
        return toks.T, done, state

    return CountingJit(run)


def _check_output(kind, text):
    if kind == "a":
        doc = json.loads(text)
        assert set(doc) >= {"name", "age"} and len(doc["name"]) <= 6 and 0 <= doc["age"] <= 99
    elif kind == "b":
        doc = json.loads(text)
        assert 1 <= len(doc) <= 3 and set(doc) <= {"red", "green", "blue"}
    elif kind == "c":
        assert re.fullmatch(REGEX_C, text)
    else:
        assert text in ("alpha", "beta", "gamma")


def test_end_to_end_decode_with_per_row_grammars(grammars):
    v = bpe_vocab(size=V)
    sampler = js.chain(stages.temperature(1.0), stages.grammar(), select=stages.categorical())
    b = 5
    run = _decode(sampler, 60)
    rows = ["a", "b", None, "c", "d"]
    buckets = dict(num_grammars=4, num_states=256, num_classes=128, num_masks=64, num_transitions=4096, num_blocks=512)
    results = []
    for trial in range(2):  # second call with rows permuted: same compiled loop
        order = rows if trial == 0 else rows[::-1]
        bound = st.grammar_params([None if k is None else grammars[k] for k in order], **buckets)
        params = sampler.params((b,), seed=jnp.arange(10, 10 + b), temperature=jnp.array([1.0, 0.7, 1.3, 1.0, 1.0]),
                                **bound)  # fmt: skip
        state = sampler.init(params, vocab_size=V)
        toks, done, final = run(state, params)
        results.append((order, np.asarray(toks), np.asarray(done)))
        assert not np.asarray(st.is_dead(sampler, final, params)).any()
    assert run.traces == 1
    checked = 0
    for order, toks, done in results:
        for r, k in enumerate(order):
            if k is None:
                continue
            assert done[r], (k, toks[r])
            ids = [t for t in toks[r] if t >= 0]
            assert ids[-1] in (0, 2) and all(t not in (0, 1, 2) and t < 1200 for t in ids[:-1])
            _check_output(k, b"".join(v.token_bytes[t] for t in ids[:-1]).decode("utf-8"))
            checked += 1
    assert checked == 8


def test_unconstrained_row_equals_a_plain_sampler(grammars):
    plain = js.chain(stages.temperature(1.0), select=stages.categorical())
    constrained = js.chain(stages.temperature(1.0), stages.grammar(), select=stages.categorical())
    seeds = jnp.array([5, 6, 7])
    p0 = plain.params((3,), seed=seeds)
    p1 = constrained.params((3,), seed=seeds, **st.grammar_params([grammars["a"], None, grammars["c"]]))
    t0, _, _ = _decode(plain, 8)(plain.init(p0, vocab_size=V), p0)
    t1, _, _ = _decode(constrained, 8)(constrained.init(p1, vocab_size=V), p1)
    np.testing.assert_array_equal(np.asarray(t0)[1], np.asarray(t1)[1])
    assert not np.array_equal(np.asarray(t0)[0], np.asarray(t1)[0])


def test_tables_are_shared_parameters_and_the_state_is_one_int_per_row(grammars):
    """(A regular grammar's state is one int per row; its stack has no capacity.)"""
    sampler = js.chain(stages.grammar(), select=stages.greedy())
    bound = st.grammar_params([grammars["d"], grammars["d"], None])
    assert bound["grammar_tables"].start.shape == (1,)  # one copy of a grammar shared by two rows
    assert bound["grammar_grammar"].tolist() == [0, 0, -1]
    params = sampler.params((3,), **bound)
    state = sampler.init(params, vocab_size=V)
    gstate, gstack, gdepth, gkeys = jax.tree.leaves(state.stages[0])
    assert gstate.shape == (3,) and gstate.dtype == jnp.int32 and gstack.shape == (3, 0) and gdepth.shape == (3,)
    assert gkeys.shape == (3, 0)  # (no key register either)
    assert gstate.tolist() == [grammars["d"].start, grammars["d"].start, 0]
    x = jax.random.normal(jax.random.key(0), (3, V)).astype(jnp.bfloat16)
    # inactive rows keep their grammar state; forced tokens reported per row
    tok, out, new = sampler.sample(x, state, params, active=jnp.array([True, False, True]))
    np.testing.assert_array_equal(np.asarray(out[2]), np.asarray(x[2].astype(jnp.float32)))  # free row untouched
    assert int(new.stages[0].state[1]) == int(state.stages[0].state[1])
    assert int(new.stages[0].state[0]) == grammars["d"].advance(grammars["d"].start, int(tok[0]))
    forced = np.asarray(st.forced_tokens(sampler, new, params))
    assert forced.shape == (3,) and forced[2] == -1
    assert forced[0] == grammars["d"].forced[int(new.stages[0].state[0])]
    with pytest.raises(ValueError, match="no stage named"):
        st.forced_tokens(js.chain(select=stages.greedy()), state, params)
    with pytest.raises(ValueError, match="batch shape"):
        st.grammar_params([None, None], (3,))
    with pytest.raises(ValueError, match="missing from grammar_tables"):
        sampler.init(sampler.params((3,), grammar_grammar=jnp.array([0, -1, -1])), vocab_size=V)
    with pytest.raises(ValueError, match=r"\[1\] refer to grammars missing"):
        sampler.init(sampler.params((3,), **dict(bound, grammar_grammar=jnp.array([0, 1, -1]))), vocab_size=V)
    with pytest.raises(ValueError, match="V=100 columns"):
        sampler.process(jnp.zeros((3, 100)), sampler.init(params, vocab_size=100), params)


def test_unconstrained_batches_cost_nothing(grammars):
    stage = stages.grammar()
    sampler = js.chain(stage, select=stages.greedy())
    x = jax.random.normal(jax.random.key(1), (2, V))
    free = sampler.params((2,))  # default: no tables
    assert free["grammar_tables"] is None
    state = sampler.init(free, vocab_size=V)
    jaxpr = jax.make_jaxpr(lambda x, s: stage.update(x, s, free, None))(x, state.stages[0])
    assert not jaxpr.eqns  # the stage is the identity: nothing is traced
    assert jax.make_jaxpr(lambda t, s: stage.accept(t, s, free, None))(jnp.zeros(2, jnp.int32), state.stages[0]).eqns == []
    # with tables but every row free: logits untouched (the mask is skipped at run time)
    params = sampler.params((2,), **st.grammar_params([None, None]))
    assert params["grammar_tables"] is None
    bound = st.grammar_params([grammars["d"], None])
    params = sampler.params((2,), grammar_tables=bound["grammar_tables"], grammar_grammar=jnp.array([-1, -1]))
    out, _ = jax.jit(sampler.process)(x, sampler.init(params, vocab_size=V), params)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_accepting_a_disallowed_token_kills_the_row(grammars):
    sampler = js.chain(stages.grammar(), select=stages.greedy())
    params = sampler.params((1,), **st.grammar_params([grammars["d"]]))
    state = sampler.init(params, vocab_size=V)
    state = sampler.accept(jnp.array([1]), state, params)  # a special token: never allowed
    assert bool(st.is_dead(sampler, state, params)[0])
    out, _ = sampler.process(jnp.zeros((1, V)), state, params)
    assert not np.isfinite(np.asarray(out)).any()


def test_traced_grammar_values_single_trace(grammars):
    x = jnp.zeros((2, V))
    ids = jnp.array([0, 0])
    calls = []
    for k in "ad":
        t = st.stack([grammars[k]], num_states=256, num_classes=128, num_masks=64, num_transitions=4096, num_blocks=512)
        calls.append((x, t, ids, st.initial_state(t, ids)))
    outs = assert_single_trace(st.mask, calls)
    assert not np.array_equal(np.isfinite(outs[0]), np.isfinite(outs[1]))
