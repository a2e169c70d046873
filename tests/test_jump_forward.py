"""Jump-forward decoding: grammar-forced tokens fed several per model call, outputs bit-identical to
plain constrained decoding (greedy, sampled, stateful selectors, log-probs, real KV-cache model)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample import structured as st
from jaxsample.decoding import BIGRAM, TinyDecoder, generate, jump_forward, jump_forward_generate, lookup
from tests._structured_vocab import bpe_vocab

V = 1216
EOS = (0, 2)
BUCKETS = dict(num_grammars=4, num_states=256, num_classes=128, num_masks=128, num_transitions=8192, num_blocks=512)
TABLE = {"logits": jnp.asarray(np.random.default_rng(5).standard_normal((V, V)).astype(np.float32) * 2.0)}
PROMPT = np.array([[1, 5, -1], [1, -1, -1], [1, 9, 7], [1, -1, -1]])
ORDER = {  # long required keys: forced runs of several tokens after each value
    "type": "object",
    "properties": {"customer_identifier": {"type": "integer", "minimum": 0, "maximum": 999},
                   "shipping_priority_level": {"enum": ["low", "high"]},
                   "gift_wrapping_requested": {"type": "boolean"}},
    "required": ["customer_identifier", "shipping_priority_level", "gift_wrapping_requested"],
    "additionalProperties": False,
}
SAMPLED = js.chain(stages.grammar(), stages.temperature(1.0), select=stages.categorical())
GREEDY = js.chain(stages.grammar(), select=stages.greedy())


@pytest.fixture(scope="module")
def grammars():
    v = bpe_vocab(size=V)
    # schema order: the keys follow each other, so their unmerged bytes are forced chains
    return {"order": st.compile_json_schema(ORDER, v, whitespace="compact", property_order="schema"),
            "code": st.compile_regex(r"ID-[0-9]{3}-(alpha|beta)", v)}


def _params(grammars, rows, seeds=(11, 12, 13, 14)):
    return {"seed": np.asarray(seeds), **st.grammar_params([None if r is None else grammars[r] for r in rows], **BUCKETS)}


def _pair(model, params, prompt, k, **kw):
    ref = generate(model, params, prompt, **kw)
    out = generate(model, params, prompt, jump_forward=k, **kw)
    counted = jump_forward_generate(model, params, prompt, jump_forward=k, **kw)
    return ref, out, counted


def _same(ref, out):
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)


def test_greedy_and_sampled_equal_plain_constrained_decoding_and_never_recompile(grammars):
    rows = ["order", "code", None, "order"]
    v = bpe_vocab(size=V)
    for sampler in (GREEDY, SAMPLED):
        kw = dict(max_new_tokens=80, eos_ids=list(EOS), pad_id=-1, sampler=sampler, sampler_params=_params(grammars, rows))
        ref, out, counted = _pair(BIGRAM, TABLE, PROMPT, 5, **kw)
        _same(ref, out)
        _same(ref, counted)
        acc = np.asarray(counted.num_accepted)
        # only single-token states are forced (a key with several tokenizations is not): here the
        # key bytes BPE never merged, the closing quotes, ID-, the rest of "beta"
        assert acc[0] >= 8 and acc[1] >= 3 and acc[2] == 0 and acc[3] >= 8
        assert np.all(acc <= np.asarray(counted.num_drafted))
        text = b"".join(v.token_bytes[t] for t in np.asarray(out.tokens)[0, : int(out.lengths[0]) - 1])
        assert list(json.loads(text)) == ORDER["required"]
    # a new schema in the same buckets (and new seeds) reuses the compiled loop
    other = st.compile_json_schema({"type": "object", "properties": {"flag": {"type": "boolean"}},
                                    "required": ["flag"], "additionalProperties": False}, v, whitespace="compact")
    before = lookup._decode_jit._cache_size()
    sp = {"seed": np.array([1, 2, 3, 4]), **st.grammar_params([other, grammars["code"], None, other], **BUCKETS)}
    kw.update(sampler_params=sp)
    ref, out = generate(BIGRAM, TABLE, PROMPT, **kw), generate(BIGRAM, TABLE, PROMPT, jump_forward=5, **kw)
    assert lookup._decode_jit._cache_size() == before
    _same(ref, out)
    text = b"".join(v.token_bytes[t] for t in np.asarray(out.tokens)[0, : int(out.lengths[0]) - 1])
    assert isinstance(json.loads(text)["flag"], bool)


def test_threshold_and_stateful_selector_and_a_chain_that_rejects_forced_tokens(grammars):
    rows = ["order", "order", "code", None]
    sp = _params(grammars, rows)
    # mirostat v2 updates its state from every selected token: forced positions must still select
    miro = js.chain(stages.grammar(), stages.temperature(1.0), select=stages.mirostat_v2())
    kw = dict(max_new_tokens=40, eos_ids=list(EOS), pad_id=-1, sampler=miro, sampler_params=sp)
    ref = generate(BIGRAM, TABLE, PROMPT, **kw)
    for least in (1, 3, 100):  # 100: never a multi-token call
        counted = jump_forward_generate(BIGRAM, TABLE, PROMPT, jump_forward=6, jump_forward_min=least, **kw)
        _same(ref, counted)
        assert (int(counted.num_accepted.sum()) == 0) == (least == 100)
    # a stage after the grammar that bans a token the grammar forces (the '"' byte): plain decoding
    # then draws from all -inf; jump-forward must draw the same (its drafts are verified, not trusted)
    quote = bpe_vocab(size=V).token_bytes.index(b'"')
    banned = js.chain(stages.grammar(), stages.logit_bias(capacity=8), select=stages.greedy())
    sp2 = dict(sp, logit_bias_ids=[quote], logit_bias_values=[-np.inf])
    kw2 = dict(max_new_tokens=12, eos_ids=list(EOS), pad_id=-1, sampler=banned, sampler_params=sp2)
    ref2, out2, counted2 = _pair(BIGRAM, TABLE, PROMPT, 4, **kw2)
    _same(ref2, out2)
    _same(ref2, counted2)


def test_real_model_with_cache_ragged_prompts_eos_and_logprobs(grammars):
    net = TinyDecoder(vocab_size=V, d_model=16, num_layers=1, num_heads=2)
    params = jax.jit(net.init_params)(jax.random.key(3), scale=3.0)
    rows = ["order", "code", "order", None]
    kw = dict(max_new_tokens=jnp.array([32, 16, 24, 8]), max_tokens=32, eos_ids=list(EOS), pad_id=-1,
              sampler=SAMPLED, sampler_params=_params(grammars, rows), logprobs=True, top_logprobs=2)
    ref = generate(net.model, params, PROMPT, **kw)
    out = generate(net.model, params, PROMPT, jump_forward=5, **kw)
    _same(ref, out)
    np.testing.assert_array_equal(out.logprobs.top_ids, ref.logprobs.top_ids)
    for field in ("raw", "processed", "top_raw"):  # wider model calls: same values up to float rounding
        np.testing.assert_allclose(getattr(out.logprobs, field), getattr(ref.logprobs, field), atol=2e-5)


def test_widths_and_invalid_uses(grammars):
    assert jump_forward.widths(1) == (1, 2) and jump_forward.widths(8) == (1, 2, 4, 8, 9)
    assert jump_forward.widths(7) == (1, 2, 4, 8)
    sp = _params(grammars, ["order"] * 4)
    with pytest.raises(ValueError, match="grammar stage"):
        generate(BIGRAM, TABLE, PROMPT, max_new_tokens=4, jump_forward=2)
    with pytest.raises(ValueError, match="jump_forward"):
        generate(BIGRAM, TABLE, PROMPT, max_new_tokens=4, jump_forward=0, sampler=GREEDY, sampler_params=sp)
    with pytest.raises(ValueError, match="jump_forward_min"):
        generate(BIGRAM, TABLE, PROMPT, max_new_tokens=4, jump_forward=2, jump_forward_min=0, sampler=GREEDY,
                 sampler_params=sp)
    with pytest.raises(ValueError, match="greedy / sampled"):
        generate(BIGRAM, TABLE, PROMPT, max_new_tokens=4, jump_forward=2, num_beams=2, sampler=GREEDY,
                 sampler_params=sp)
    with pytest.raises(ValueError, match="log-probs"):
        jump_forward_generate(BIGRAM, TABLE, PROMPT, max_new_tokens=4, logprobs=True, sampler=GREEDY,
                              sampler_params=sp)


def test_recursive_grammar_rides_its_stack_through_jump_forward(grammars):
    """A $ref cycle (a pushdown automaton: state plus stack per row) under jump-forward: outputs equal
    plain constrained decoding's, forced chains cross pushes and pops, the depth limit holds."""
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "node_identifier": {"type": "integer", "minimum": 0, "maximum": 9},
        "children_nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["node_identifier", "children_nodes"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}  # fmt: skip
    v = bpe_vocab(size=V)
    g = st.compile_json_schema(tree, v, whitespace="compact", property_order="schema")
    assert g.pushdown is not None
    sp = {"seed": np.array([3, 4, 5, 6]), **st.grammar_params([g, grammars["code"], None, g], max_depth=2)}
    kw = dict(max_new_tokens=120, eos_ids=list(EOS), pad_id=-1, sampler=GREEDY, sampler_params=sp)
    ref, out, counted = _pair(BIGRAM, TABLE, PROMPT, 6, **kw)
    _same(ref, out)
    _same(ref, counted)
    assert np.asarray(counted.num_accepted)[[0, 3]].min() >= 8
    for r in (0, 3):
        n = int(out.lengths[r])
        text = b"".join(v.token_bytes[t] for t in np.asarray(out.tokens)[r, :n] if t not in EOS)
        m = st.Matcher(g, max_depth=2)
        assert m.accept_tokens(np.asarray(out.tokens)[r, :n].tolist()) == n  # within the depth limit
        if np.asarray(out.tokens)[r, n - 1] in EOS:
            assert json.loads(text)["node_identifier"] in range(10)
