"""llama.cpp fidelity: upstream defaults pinned, every sampling letter, DRY breakers, adaptive-p, grammars."""

import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import presets, structured
from jaxsample.dry import dry_sequence_breakers
from jaxsample.infill import infill, infill_table_from_tokenizer

# ggml-org/llama.cpp common/common.h, struct common_params_sampling, at commit 001d906a6d86e2490e394361e7cc6f478b100088
# (read 2026-11). Fields that are sampler settings, with their upstream defaults; the `samplers`
# default is the enum list PENALTIES, DRY, TOP_N_SIGMA, TOP_K, TYPICAL_P, TOP_P, MIN_P, XTC, TEMPERATURE.
UPSTREAM_DEFAULTS = {
    "min_keep": 0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "xtc_probability": 0.00, "xtc_threshold": 0.10,
    "typ_p": 1.00, "temp": 0.80, "dynatemp_range": 0.00, "dynatemp_exponent": 1.00, "penalty_last_n": 64,
    "penalty_repeat": 1.00, "penalty_freq": 0.00, "penalty_present": 0.00, "dry_multiplier": 0.0, "dry_base": 1.75,
    "dry_allowed_length": 2, "dry_penalty_last_n": 64, "adaptive_target": -1.0, "adaptive_decay": 0.90,
    "mirostat": 0, "top_n_sigma": -1.00, "mirostat_tau": 5.00, "mirostat_eta": 0.10, "ignore_eos": False,
}
UPSTREAM_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
UPSTREAM_DRY_BREAKERS = ("\n", ":", '"', "*")


def test_defaults_are_upstreams():
    params = inspect.signature(presets.llama_cpp).parameters
    for field, value in UPSTREAM_DEFAULTS.items():
        assert params[field].default == value, field
    assert params["samplers"].default == UPSTREAM_SAMPLERS == presets.DEFAULT_SAMPLERS
    assert presets.llama_cpp_args("").sampler == presets.llama_cpp().sampler
    from jaxsample.presets.llama_cpp import DEFAULT_DRY_SEQUENCE_BREAKERS

    assert DEFAULT_DRY_SEQUENCE_BREAKERS == UPSTREAM_DRY_BREAKERS


def _tokenizer():
    """A byte-level BPE over a, b, ab, ' ', ' a', ' ab', ':', plus an end-of-text token (id 8)."""
    import tokenizers

    g = "\u0120"
    vocab = {"a": 0, "b": 1, "ab": 2, g: 3, g + "a": 4, g + "ab": 5, ":": 6, "{": 7}
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [("a", "b"), (g, "a"), (g + "a", "b")]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(["<eot>"])
    return tok


def _names(p):
    return [s.name for s in p.sampler.stages], p.sampler.selector.name


def test_every_sampling_letter():
    tok = _tokenizer()
    p = presets.llama_cpp_args("--sampling-seq edskypmxtia", tokenizer=tok, eos_ids=[8])
    assert _names(p) == (["penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc",
                          "temperature", "infill"], "adaptive_p")
    # names, ';'-separated, as --samplers takes them (alternative spellings included)
    q = presets.llama_cpp_args(["--samplers", "penalties;dry;top-n-sigma;top-k;typ-p;nucleus;min-p;xtc;temp;infill;"
                                "adaptive-p"], tokenizer=tok, eos_ids=[8])
    assert _names(q) == _names(p)  # (the infill stage holds its table: samplers built twice are not equal)
    with pytest.raises(ValueError, match="unknown sampler 'z'"):
        presets.llama_cpp_args("--sampling-seq ekz")


def test_adaptive_p_selector_goes_last_and_reads_target_and_decay():
    p = presets.llama_cpp_args("--sampling-seq akt --adaptive-target 0.4 --adaptive-decay 0.8")
    assert _names(p) == (["top_k", "temperature"], "adaptive_p")  # upstream adds adaptive-p at the end
    assert p.values["adaptive_p_target"] == 0.4 and p.values["adaptive_p_decay"] == 0.8
    assert _names(presets.llama_cpp())[1] == "dist"
    for args, message in [("--adaptive-decay 0.995", "adaptive_decay must be in"),
                          ("--adaptive-target 1.5", "adaptive_target must be <= 1")]:
        with pytest.raises(ValueError, match=message):
            presets.llama_cpp_args(args)


def test_infill_letter_runs_the_infill_sampler():
    tok = _tokenizer()
    p = presets.llama_cpp_args("--sampling-seq i", tokenizer=tok, eos_ids=[8])
    table = infill_table_from_tokenizer(tok, [8])
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 9)), jnp.float32)
    params = p.params((3,))
    state = p.sampler.init(params, vocab_size=9)
    got, _ = p.sampler.process(logits, state, params)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(infill(logits, table)))
    assert _names(presets.llama_cpp(samplers="i", infill_table=table)) == _names(p)
    with pytest.raises(ValueError, match="infill sampler \\(i\\) needs tokenizer= and eos_ids="):
        presets.llama_cpp_args("--sampling-seq i", tokenizer=tok)


def test_dry_sequence_breakers_flag():
    tok = _tokenizer()
    default = presets.llama_cpp(dry_multiplier=0.8, tokenizer=tok)
    dry = lambda p: next(s for s in p.sampler.stages if s.name == "dry")  # noqa: E731
    assert dry(default) == dry(presets.llama_cpp(dry_multiplier=0.8,
                                                 dry_sequence_breakers=dry_sequence_breakers(UPSTREAM_DRY_BREAKERS,
                                                                                             tok)))
    one = presets.llama_cpp_args(["--dry-multiplier", "0.8", "--dry-sequence-breaker", ":"], tokenizer=tok)
    assert dry(one) == dry(presets.llama_cpp(dry_multiplier=0.8, dry_sequence_breakers=dry_sequence_breakers([":"],
                                                                                                             tok)))
    two = presets.llama_cpp_args(["--dry-sequence-breaker", ":", "--dry-sequence-breaker", "ab"], tokenizer=tok)
    assert dry(two) == dry(presets.llama_cpp(dry_sequence_breakers=dry_sequence_breakers([":", "ab"], tok)))
    none = presets.llama_cpp_args(["--dry-sequence-breaker", "none"], tokenizer=tok)
    assert dry(none) == dry(presets.llama_cpp(dry_sequence_breakers=()))
    with pytest.raises(ValueError, match="string breakers need a tokenizer"):
        presets.llama_cpp_args(["--dry-sequence-breaker", ":"])
    with pytest.raises(ValueError, match="--dry-base: must be >= 1"):
        presets.llama_cpp_args("--dry-base 0.5")


VOCAB = structured.Vocabulary.from_pieces(["<eos>", "1", "2", "12", "x", "{", "}", '"', ":", "a"], kind="raw",
                                          special_ids=[0], eos_ids=[0])


def _allowed_first(p):
    params = p.params((1,))
    state = p.sampler.init(params, vocab_size=10)
    out, _ = p.sampler.process(jnp.zeros((1, 10)), state, params)
    return np.flatnonzero(np.isfinite(np.asarray(out[0]))).tolist()


def test_grammar_flags_compile_with_jaxsample_structured(tmp_path):
    gbnf = 'root ::= [0-9] [0-9]'
    p = presets.llama_cpp_args(["--grammar", gbnf, "--sampling-seq", "t"], vocabulary=VOCAB)
    assert _names(p) == (["grammar", "temperature"], "dist")
    expected = structured.compile_gbnf(gbnf, VOCAB).allowed(structured.compile_gbnf(gbnf, VOCAB).start)
    assert _allowed_first(p) == np.flatnonzero(np.asarray(expected)).tolist() == [1, 2, 3]
    path = tmp_path / "g.gbnf"
    path.write_text(gbnf)
    q = presets.llama_cpp_args(["--grammar-file", str(path), "--sampling-seq", "t"], vocabulary=VOCAB)
    assert q.sampler == p.sampler and _allowed_first(q) == [1, 2, 3]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    j = presets.llama_cpp_args(["--json-schema", json.dumps(schema), "--sampling-seq", "t"], vocabulary=VOCAB)
    assert _allowed_first(j) == [5]  # '{' first
    (tmp_path / "s.json").write_text(json.dumps(schema))
    jf = presets.llama_cpp_args(["-jf", str(tmp_path / "s.json"), "--sampling-seq", "t"], vocabulary=VOCAB)
    assert _allowed_first(jf) == [5]


def test_grammar_sampling_only_draws_grammar_tokens():
    p = presets.llama_cpp_args(["--grammar", "root ::= [0-9]+", "--sampling-seq", "kt", "--seed", "3"],
                               vocabulary=VOCAB)
    params = p.params((64,), seed=np.arange(64))
    state = p.sampler.init(params, vocab_size=10)
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(64, 10)), jnp.float32)
    tokens, _, _ = jax.jit(p.sampler.sample)(logits, state, params)
    assert set(np.asarray(tokens).tolist()) <= {1, 2, 3}


@pytest.mark.parametrize("args, message", [
    (["--grammar", "root ::= [0-9]"], "grammar / json_schema need the vocabulary"),
    (["--grammar", "root ::= [0-9]", "--json-schema", "{}"], "are exclusive"),
    (["--json-schema", "{not json"], "json_schema is not valid JSON"),
    (["--grammar-file", "/no/such/file.gbnf"], "--grammar-file: cannot read '/no/such/file.gbnf'"),
    (["--top-k", "many"], "--top-k: expected a number"),
    (["--logit-bias", "x+1"], "--logit-bias: expected TOKEN_ID"),
    (["--frobnicate", "1"], "unsupported llama.cpp flag '--frobnicate'"),
])
def test_bad_flags_name_the_flag(args, message):
    fields = {} if "vocabulary" in message else {"vocabulary": VOCAB}
    with pytest.raises(ValueError, match=message):
        presets.llama_cpp_args(args, **fields)
