"""Grammar-constrained decoding through the real loop: ``jaxsample.decoding.generate`` with per-row
grammars (shared tables in the sampler parameters), an unconstrained row, and no recompilation for
a new schema of the same bucket."""

import importlib
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample import structured as st
from jaxsample.decoding import BIGRAM, FinishReason, generate
from tests._structured_vocab import bpe_vocab

generate_module = importlib.import_module("jaxsample.decoding.loop")  # the compiled loop kernel of generate

V = 1216  # logits wider than the 1200-token tokenizer: padded columns
EOS = (0, 2)
BUCKETS = dict(num_grammars=4, num_states=256, num_classes=128, num_masks=64, num_transitions=8192, num_blocks=512)
MODEL_PARAMS = {"logits": jnp.asarray(np.random.default_rng(3).standard_normal((V, V)).astype(np.float32) * 2.0)}
PROMPT = np.array([[1, 5, -1], [1, -1, -1], [1, 9, 7], [1, -1, -1]])
SEEDS = np.array([11, 12, 13, 14])
SAMPLER = js.chain(stages.grammar(), stages.temperature(1.0), select=stages.categorical())

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
FLAGS = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
    "required": ["ok", "level"],
    "additionalProperties": False,
}
ANSWER = r"(yes|no|maybe)( because [a-z]{1,8})?\."
CODE = r"[A-Z]{2}-[0-9]{2,4}"


def _valid(kind, text):
    if kind == "person":
        doc = json.loads(text)
        return set(doc) == {"name", "age"} and len(doc["name"]) <= 6 and 0 <= doc["age"] <= 99
    if kind == "flags":
        doc = json.loads(text)
        return isinstance(doc["ok"], bool) and doc["level"] in ("low", "high") and len(doc) == 2
    return re.fullmatch(ANSWER if kind == "answer" else CODE, text) is not None


@pytest.fixture(scope="module")
def grammars():
    v = bpe_vocab(size=V)
    return {
        "person": st.compile_json_schema(PERSON, v, whitespace="compact"),
        "flags": st.compile_json_schema(FLAGS, v, whitespace="bounded", max_whitespace=2),
        "answer": st.compile_regex(ANSWER, v),
        "code": st.compile_regex(CODE, v),
    }


def _generate(rows, grammars, sampler=SAMPLER):
    sparams = {"seed": SEEDS}
    if sampler is SAMPLER:
        sparams.update(st.grammar_params([None if k is None else grammars[k] for k in rows], **BUCKETS))
    return generate(BIGRAM, MODEL_PARAMS, PROMPT, max_new_tokens=40, eos_ids=list(EOS), pad_id=-1,
                    sampler=sampler, sampler_params=sparams)  # fmt: skip


def _texts(out):
    v = bpe_vocab(size=V)
    toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return [b"".join(v.token_bytes[t] or b"" for t in toks[r, : lengths[r] - 1]) for r in range(toks.shape[0])]


def test_generate_per_row_grammars_free_row_and_no_recompile(grammars):
    calls = [["person", None, "answer", "flags"], ["code", None, "flags", "person"]]  # call 2: a new schema
    outs = []
    for i, rows in enumerate(calls):
        out = _generate(rows, grammars)
        if i == 0:
            compiled = generate_module.decode._cache_size()
        outs.append(out)
        reasons = np.asarray(out.finish_reason)
        for r, (kind, text) in enumerate(zip(rows, _texts(out))):
            if kind is None:
                continue
            assert reasons[r] == FinishReason.EOS, (kind, text)
            assert int(np.asarray(out.tokens)[r, int(out.lengths[r]) - 1]) in EOS
            assert _valid(kind, text.decode("utf-8")), (kind, text)
    assert generate_module.decode._cache_size() == compiled  # new schemas, same buckets: no recompile
    # the free row is untouched: identical to a chain without the grammar stage (same seed)
    plain = _generate(calls[0], grammars, js.chain(stages.temperature(1.0), select=stages.categorical()))
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out.tokens)[1], np.asarray(plain.tokens)[1])
    # and the constraint changed the other rows (the unconstrained model does not emit valid JSON)
    assert not np.array_equal(np.asarray(outs[0].tokens)[0], np.asarray(plain.tokens)[0])


def test_sample_and_rank_keeps_each_rows_grammar(grammars):
    """Strategies that expand rows repeat per-row parameters but not the shared tables."""
    from jaxsample.decoding import sample_and_rank

    rows = ["person", "answer", "code", "flags"]
    sparams = {"seed": SEEDS, **st.grammar_params([grammars[k] for k in rows], **BUCKETS)}
    out = sample_and_rank(BIGRAM, MODEL_PARAMS, PROMPT, n=2, best_of=3, max_new_tokens=40, eos_ids=list(EOS),
                          pad_id=-1, sampler=SAMPLER, sampler_params=sparams)  # fmt: skip
    v = bpe_vocab(size=V)
    toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    for r, kind in enumerate(rows):
        for j in range(2):
            text = b"".join(v.token_bytes[t] or b"" for t in toks[r, j, : lengths[r, j] - 1]).decode()
            assert _valid(kind, text), (kind, text)
