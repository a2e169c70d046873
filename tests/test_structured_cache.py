"""Compiled grammars are deduplicated by content (source, options, vocabulary content), not object identity."""

import json
import types

import jax
import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import grammar_cache
from tests._structured_vocab import bpe_vocab

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "integer"}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture
def fresh_cache():
    grammar_cache.clear()
    yield
    grammar_cache.set_limits(max_entries=grammar_cache.MAX_ENTRIES, max_bytes=grammar_cache.MAX_BYTES)
    grammar_cache.clear()


def _copy(vocab):
    """An equal vocabulary that is a different object (and holds different bytes objects)."""
    return st.Vocabulary(tuple(None if b is None else bytes(bytearray(b)) for b in vocab.token_bytes), vocab.eos_ids)


def test_equal_content_gives_the_same_grammar(fresh_cache):
    v = bpe_vocab()
    w = _copy(v)
    assert w is not v and w == v
    assert st.compile_regex("[a-c]{2}x", v) is st.compile_regex("[a-c]{2}x", w)
    g = st.compile_json_schema(SCHEMA, v, whitespace="compact")
    assert st.compile_json_schema(json.dumps(SCHEMA), w, whitespace="compact") is g  # JSON text, same content
    assert st.compile_json_schema(json.loads(json.dumps(SCHEMA)), v, whitespace="compact") is g  # equal dict
    assert st.compile_json_schema(SCHEMA, v) is st.compile_json_schema(SCHEMA, v, whitespace="free")  # default
    assert st.compile_gbnf('root ::= "x" [0-9]+', v) is st.compile_gbnf('root ::= "x" [0-9]+', w, root="root")
    assert st.compile_choice(["yes", "no"], v) is st.compile_choice(("yes", "no"), w)
    info = grammar_cache.info()
    assert info["entries"] == 5 and info["hits"] == 6 and info["bytes"] > 0
    assert not g.next.flags.writeable  # shared objects are read-only
    with pytest.raises(ValueError):
        g.masks[0, 0] = 1


def test_whatever_changes_the_output_changes_the_key(fresh_cache):
    v = bpe_vocab()
    g = st.compile_json_schema(SCHEMA, v, whitespace="compact")
    assert st.compile_json_schema(SCHEMA, v, whitespace="bounded") is not g
    unused = st.compile_json_schema(SCHEMA, v, whitespace="compact", max_whitespace=3)  # every option is keyed,
    assert unused is not g and st.same_grammar(unused, g)  # even one the output happens not to depend on
    reordered = dict(SCHEMA, properties={"b": SCHEMA["properties"]["b"], "a": SCHEMA["properties"]["a"]})
    assert reordered == SCHEMA  # equal as dicts, but property order is part of the output
    h = st.compile_json_schema(reordered, v, whitespace="compact")
    assert h is not g and not st.same_grammar(g, h)
    other_eos = st.Vocabulary(v.token_bytes, (0,))  # same tokens, one EOS id fewer
    assert st.compile_json_schema(SCHEMA, other_eos, whitespace="compact") is not g
    assert st.compile_regex("ab", v) is not st.compile_choice(["ab"], v)  # front end is part of the key
    assert st.compile_json_schema({"const": 1}, v) is not st.compile_json_schema({"const": True}, v)


def test_grammar_params_shares_one_slot_between_equal_grammars(fresh_cache):
    v = bpe_vocab()
    a = st.compile_regex("[0-9]{3}", v)
    grammar_cache.clear()
    b = st.compile_regex("[0-9]{3}", v)  # compiled again: equal content, another object
    c = st.compile_regex("[a-z]{3}", v)
    assert a is not b and st.same_grammar(a, b) and not st.same_grammar(a, c)
    p = st.grammar_params([a, b, None, c, b])
    assert p["grammar_grammar"].tolist() == [0, 0, -1, 1, 0]
    assert p["grammar_tables"].start.shape[0] == 2  # two distinct grammars: bucket 2


def test_bounds_eviction_clear_and_uncacheable_sources(fresh_cache):
    v = bpe_vocab()
    grammar_cache.set_limits(max_entries=2)
    first = st.compile_regex("a+", v)
    st.compile_regex("b+", v)
    st.compile_regex("c+", v)  # evicts "a+" (least recently used)
    assert grammar_cache.info()["entries"] == 2
    assert st.compile_regex("a+", v) is not first
    grammar_cache.set_limits(max_bytes=0)  # nothing fits: every compile is fresh
    assert grammar_cache.info()["entries"] == 0 and st.compile_regex("b+", v) is not st.compile_regex("b+", v)
    grammar_cache.set_limits(max_entries=8, max_bytes=1 << 30)
    before = grammar_cache.info()["uncacheable"]
    st.compile_choice({"x", "y"}, v)  # a set is not JSON data: compiled without the cache
    assert grammar_cache.info()["uncacheable"] == before + 1
    grammar_cache.clear()
    assert grammar_cache.info()["entries"] == 0 and grammar_cache.info()["hits"] == 0
    with pytest.raises(ValueError, match="max_entries"):
        grammar_cache.set_limits(max_entries=-1)


def test_clear_keeps_the_vocabulary_hash(fresh_cache, monkeypatch):
    """A cold compile after ``clear()`` does not hash the (immutable) vocabulary again: ~1.5 ms of
    every cold compile at V = 8k; an equal vocabulary object is still hashed (and found equal)."""
    v = bpe_vocab()
    st.compile_regex("a+", v)
    grammar_cache.clear()
    hashed = []
    dumps = grammar_cache.pickle.dumps  # spied on in grammar_cache only (the trie's digest pickles too)
    monkeypatch.setattr(grammar_cache, "pickle", types.SimpleNamespace(dumps=lambda *a, **k: hashed.append(1) or dumps(*a, **k)))
    g = st.compile_regex("b+", v)
    assert hashed == [] and grammar_cache.info()["misses"] == 1
    assert st.compile_regex("b+", _copy(v)) is g and hashed == [1]


def test_same_grammar_compares_every_array():
    v = bpe_vocab()
    g = st.compile_regex("[0-9]{2}", v)
    arrays = g._asdict()
    forced = g.forced.copy()
    forced[-1] += 1
    assert st.same_grammar(g, st.TokenGrammar(**dict(arrays)))  # another object, equal arrays
    assert not st.same_grammar(g, st.TokenGrammar(**dict(arrays, forced=forced)))
    assert not st.same_grammar(g, st.TokenGrammar(**dict(arrays, masks=g.masks[:-1])))  # a shape differs
    assert not st.same_grammar(g, st.TokenGrammar(**dict(arrays, start=g.start + 1)))


def _tables_equal(a, b) -> bool:
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


def test_stack_prepares_a_read_only_grammar_once(fresh_cache, monkeypatch):
    """A service stacks the same cached grammars batch after batch: the per-grammar part of ``stack``
    (packed ``next``, mask blocks) is kept for read-only grammars, recomputed for writeable ones."""
    from jaxsample.structured import tables

    v = bpe_vocab()
    g = st.compile_json_schema(SCHEMA, v)  # cached: read-only
    calls = []
    packed_next = tables._packed_next
    monkeypatch.setattr(tables, "_packed_next", lambda nxt: calls.append(1) or packed_next(nxt))
    first = st.stack([g])
    assert _tables_equal(st.stack([g]), first)
    assert len(calls) == 1
    writable = st.TokenGrammar(**{**g._asdict(), "next": g.next.copy()})  # user-owned: may change
    assert _tables_equal(st.stack([writable]), first) and len(calls) == 2
    writable.next[writable.next == 2] = 0  # changed in place: the next stack sees it
    assert not _tables_equal(st.stack([writable]), first) and len(calls) == 3
    grammar_cache.clear()  # also drops the kept parts
    st.stack([g])
    assert len(calls) == 4
    with pytest.raises(ValueError, match="read-only"):
        tables.remember(writable, tables.prepared(g))
