"""Differential tests against established engines (skipped when they are not installed).

* **llguidance** (``pip install llguidance``): the same trained tokenizer (loaded by llguidance from
  its ``tokenizer.json``), the same schemas/regexes, compact JSON separators, properties in schema
  order (llguidance's order; ours defaults to any order). llguidance restricts bytes the grammar
  *forces* to their canonical tokenization (``{"`` but not ``{`` before a forced key), so masks
  must be identical wherever nothing is forced, and llguidance's mask must be a subset of ours
  where something is. Its ``date`` format admits dates that do not exist (February 29 of any
  year, year 0000): there ours is the stricter mask, checked against the calendar.
* **outlines-core** (``pip install outlines-core``): regex token index on the same vocabulary. It
  drops tokens that leave an accepting state for a non-accepting one (``x( b)?``: no ``" "`` after
  ``x``), so masks must be identical in non-accepting states and a subset in accepting ones.

Paths follow random tokens allowed by both engines; every finished output is validated.
"""

import datetime
import json
import re

import numpy as np
import pytest

from jaxsample import structured as st
from tests._structured_vocab import bpe_tokenizer, bpe_vocab

JSON_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer", "minimum": -3, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"x": {"type": "number"}, "ok": {"type": "boolean"}, "d": {"type": "string", "format": "date"}},
        "required": ["x", "ok", "d"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "v": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]+$"}]},
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {
        "type": "object",
        "properties": {
            "function": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["function", "arguments"],
        "additionalProperties": False,
    },
]
REGEXES = [
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"(cat|dog|bird)s?( and (cat|dog|bird)s?){0,2}",
    r"[a-z]{3,8}@[a-z]+\.(com|org)",
    r'\{"name":"[^"]{0,10}"\}',
    r"(é|ü)+[^a-z]{2}",
    r"[A-Z][a-z]+( [A-Z][a-z]+)*\.",
]
EOS = (0, 2)


@pytest.fixture(scope="module")
def llg_tokenizer():
    llg = pytest.importorskip("llguidance")
    return llg, llg.LLTokenizer(bpe_tokenizer().to_str(), n_vocab=bpe_vocab().size, eos_token=list(EOS), slices=[])


def _llg_mask(matcher, v):
    return np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")[:v].astype(bool)


def _impossible_date(out: bytes) -> bool:
    """Whether ``out`` ends inside a JSON string that cannot complete to an RFC 3339 date.

    llguidance's ``date`` allows February 29 of every year and year 0000 (Python and ``jsonschema``
    reject both); ours does not, so there our mask is the stricter one.
    """
    text = out.decode("utf-8", "replace")
    prefix = text[text.rfind('"') + 1 :]
    if len(prefix) < 4 or not prefix[:4].isdigit():
        return False
    year = int(prefix[:4])
    for day in range(366):
        try:
            date = (datetime.date(year, 1, 1) + datetime.timedelta(days=day)).isoformat()
        except ValueError:
            return True  # year 0000
        if date.startswith(prefix[:10]) and date[:4] == prefix[:4]:
            return False
    return True


def _compare_llg(llg, lt, grammar_text, g, paths, check_output, looser=lambda out: False):
    """Masks equal llguidance's on random paths; ``check_output(text)`` raises on a wrong final output.

    ``looser(bytes)``: where llguidance documents a looser language (a token it allows leads to a
    prefix that ``looser`` flags), ours may be the stricter mask.
    """
    v = bpe_vocab()
    stats = {"equal": 0, "forced": 0, "looser": 0}
    for seed in range(paths):
        rng = np.random.default_rng(seed)
        m = llg.LLMatcher(lt, grammar_text, log_level=0)
        assert not m.is_error(), m.get_error()
        s, out = g.start, b""
        for _ in range(60):
            ours, theirs = g.allowed(s), _llg_mask(m, v.size)
            extra = [i for i in np.flatnonzero(theirs & ~ours) if not looser(out + v.token_bytes[i])]
            assert not extra, (out, [v.token_bytes[i] for i in extra])
            if (theirs & ~ours).any():
                stats["looser"] += 1
                theirs = theirs & ours
            if m.compute_ff_bytes():
                stats["forced"] += 1
            else:
                np.testing.assert_array_equal(ours, theirs, err_msg=repr(out))
                stats["equal"] += 1
            t = int(rng.choice(np.flatnonzero(ours & theirs)))
            if t in EOS:
                check_output(out.decode("utf-8"))
                break
            assert m.consume_token(t)
            s, out = g.advance(s, t), out + v.token_bytes[t]
    assert stats["equal"] >= 20, stats  # the exact comparison really ran


@pytest.mark.parametrize("index", range(len(JSON_SCHEMAS)))
def test_json_schema_masks_match_llguidance(llg_tokenizer, index):
    llg, lt = llg_tokenizer
    schema = JSON_SCHEMAS[index]
    options = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    grammar_text = llg.LLMatcher.grammar_from_json_schema(schema, overrides=options)
    g = st.compile_json_schema(schema, bpe_vocab(), whitespace="compact", property_order="schema")
    jsonschema = pytest.importorskip("jsonschema")
    _compare_llg(llg, lt, grammar_text, g, 12, lambda text: jsonschema.validate(json.loads(text), schema),
                 looser=_impossible_date)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_masks_match_llguidance(llg_tokenizer, pattern):
    llg, lt = llg_tokenizer
    g = st.compile_regex(pattern, bpe_vocab())

    def check(text):  # _compare_llg ignores return values: the check must raise
        assert re.fullmatch(pattern, text), text

    _compare_llg(llg, lt, llg.LLMatcher.grammar_from_regex(pattern), g, 10, check)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_masks_match_outlines_core(pattern):
    oc = pytest.importorskip("outlines_core")
    v = bpe_vocab()
    table: dict[bytes, list[int]] = {}
    for i, b in enumerate(v.token_bytes):
        if b:
            table.setdefault(b, []).append(i)
    index = oc.Index(pattern, oc.Vocabulary(EOS[1], table))
    g = st.compile_regex(pattern, v)
    for seed in range(10):
        rng = np.random.default_rng(seed)
        s, q, out = g.start, index.get_initial_state(), b""
        for _ in range(40):
            ours = g.allowed(s)
            theirs = np.zeros(v.size, bool)
            theirs[list(index.get_allowed_tokens(q))] = True
            final = index.is_final_state(q)
            theirs[list(EOS)] = final
            assert not (theirs & ~ours).any()
            if not final:
                np.testing.assert_array_equal(ours, theirs, err_msg=repr(out))
            t = int(rng.choice(np.flatnonzero(theirs)))
            if t in EOS:
                assert re.fullmatch(pattern, out.decode("utf-8"))
                break
            s, q, out = g.advance(s, t), index.get_next_state(q, t), out + v.token_bytes[t]
