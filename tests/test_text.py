"""Text layer: tokenizer adapters, device stop strings (vs a brute-force reference), vLLM's
include_stop_str_in_output, per-request budgets, streaming without broken UTF-8, every strategy."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample.decoding import BIGRAM, Model, beam_search, contrastive_search, generate, sample_and_rank
from jaxsample.decoding import speculative_generate, stop_strings
from jaxsample.text import IncrementalText, TextTokenizer, as_tokenizer, generate_text, score_text, stream_text
from tests._helpers import counting_model

# ------------------------------------------------------------------ a scripted tokenizer and model
# id 0 = EOS; the bigram table walks 1 -> 2 -> ... -> 8 -> 0.
PIECES = [None, b"Hello", b" wor", b"ld", b".\n", b"\nThe", b" caf", b"\xc3", b"\xa9 </ans"]
V = len(PIECES) + 1  # one unused column
WALK = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: 8, 8: 0, 0: 0, 9: 0}
TABLE = jnp.full((V, V), -10.0).at[jnp.array(list(WALK)), jnp.array(list(WALK.values()))].set(0.0)
PARAMS = {"logits": TABLE, "hidden": jax.random.normal(jax.random.key(0), (V, 4))}
TOK = TextTokenizer(lambda s: [1] if s == "Hello" else [2], tuple(PIECES) + (None,), (0,), "scripted")
FULL = " world.\n\nThe café </ans"


def _text(prompts=("Hello",), **kw):
    kw.setdefault("max_tokens", 12)
    return generate_text(BIGRAM, PARAMS, TOK, list(prompts), **kw)


def test_stop_string_spanning_tokens_cut_or_kept():
    out = _text(stop="\n\n")[0]
    assert out.token_ids == [2, 3, 4, 5] and out.finish_reason == "stop" and out.stop_reason == "\n\n"
    assert out.text == " world."  # "The" after the stop string, in the same token, is dropped
    assert _text(stop="\n\n", include_stop_str_in_output=True)[0].text == " world.\n\n"


def test_stop_string_suffix_of_a_token_plus_more_text():
    out = _text(stop=["orld"])[0]
    assert out.token_ids == [2, 3] and out.text == " w"
    out = _text(stop=["The c"], include_stop_str_in_output=True)[0]
    assert out.token_ids == [2, 3, 4, 5, 6] and out.text == " world.\n\nThe c"


def test_first_listed_stop_string_wins_and_multibyte_stop():
    # both complete on token 5; vLLM tries them in list order
    assert _text(stop=[".\n\nT", "\n\n"])[0].text == " world"
    assert _text(stop=["\n\n", ".\n\nT"])[0].text == " world."
    out = _text(stop=["é"])[0]  # é = c3 a9, split over two tokens
    assert out.token_ids == [2, 3, 4, 5, 6, 7, 8] and out.text == " world.\n\nThe caf"


def test_no_stop_eos_and_length():
    out = _text()[0]
    assert out.text == FULL and out.finish_reason == "stop" and out.stop_reason is None
    out = _text(max_tokens=2)[0]
    assert out.text == " world" and out.finish_reason == "length"
    assert _text(stop="zzz")[0].text == FULL


def test_min_tokens_and_per_row_budgets_and_stops():
    outs = _text(
        ["Hello", "Hello", "Hello"], stop=[["\n\n"], ["\n\n"], None], min_tokens=[0, 5, 0], max_tokens=[12, 12, 2]
    )
    assert outs[0].text == " world."
    assert outs[1].text == FULL  # the occurrence ended at token 4 < min_tokens: never stops later
    assert outs[2].text == " world" and outs[2].finish_reason == "length"
    alone = _text(["Hello"], stop="\n\n", min_tokens=5)[0]
    assert alone == outs[1]


def test_stop_strings_only_match_generated_text():
    # prompt "x" encodes to token 2 (" wor"); "wor" in the prompt + "ld" generated does not stop
    out = _text(["x"], stop="world")[0]
    assert out.token_ids[:1] == [3] and out.stop_reason is None


@pytest.mark.parametrize("name", ["beam", "rank", "contrastive", "speculative"])
def test_every_strategy_stops_on_strings(name):
    kw = dict(stop="\n\n", output_width=12)
    if name == "beam":
        outs = _text(strategy=beam_search, num_beams=2, num_return_sequences=2, **kw)[0]
        assert outs[0].text == " world." and outs[0].stop_reason == "\n\n"
        return
    if name == "rank":
        outs = _text(strategy=sample_and_rank, n=2, best_of=2, **kw)[0]
        assert [o.text for o in outs] == [" world.", " world."]
        return
    if name == "contrastive":
        out = _text(strategy=contrastive_search, top_k=2, penalty_alpha=0.0, **kw)[0]
    else:
        def spec(model, params, prompt, **k):
            return speculative_generate(model, params, model, params, prompt, num_draft_tokens=3, **k)

        out = _text(strategy=spec, **kw)[0]
    assert out.text == " world." and out.token_ids == [2, 3, 4, 5]


# ------------------------------------------------------------------------- device matching, exhaustive
def _reference_hit(tokens, seq, stops):
    text = b"".join(tokens[t] or b"" for t in seq[:-1])
    start = len(text)
    text += tokens[seq[-1]] or b""
    return any(text.find(s, max(0, start - len(s) + 1)) >= 0 for s in stops)


def test_hits_match_brute_force_on_random_vocab_and_rows():
    rng = random.Random(0)
    toks = sorted({bytes(rng.choice(b"ab\n") for _ in range(rng.randint(1, 4))) for _ in range(40)}) + [b"", None]
    pool = ["ab", "\n\n", "aba", "b", "abba\nab", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbba"]
    rows, windows, expected = [], [], []
    for _ in range(400):
        stops = rng.sample(pool, rng.randint(1, 3))
        seq = [rng.randrange(len(toks)) for _ in range(rng.randint(1, 70))]
        rows.append(stops)
        expected.append(_reference_hit(toks, seq, [s.encode() for s in stops]))
        windows.append(([-1] * 70 + seq)[-70:])
    table = stop_strings.build(toks, rows)
    assert table.max_len == 63  # the 37-byte string needs two words
    got = np.asarray(jax.jit(stop_strings.hits)(jnp.array(windows), table))
    assert 50 < sum(expected) < 350
    np.testing.assert_array_equal(got, expected)


def test_new_stop_strings_never_recompile_and_rows_are_independent():
    traces = []
    hits = jax.jit(lambda w, t: (traces.append(1), stop_strings.hits(w, t))[1])
    win = jnp.array([[-1] * 29 + [4, 5], [-1] * 29 + [2, 3]])
    sets = [[["\n\n"], ["orld"]], [["orld"], ["x"]], [["caf", "\n\nThe"], []]]
    got = [hits(win, stop_strings.build(TOK.token_bytes, r, max_stop_strings=2, max_len=31)).tolist() for r in sets]
    assert got == [[True, True], [False, False], [True, False]] and len(traces) == 1


def test_generate_with_new_stop_strings_does_not_recompile():
    counting, traces = counting_model(BIGRAM)
    seen = []
    for stop in ("\n\n", ["orld", "caf"], None):
        generate_text(counting, PARAMS, TOK, ["Hello"], stop=stop, max_tokens=12, max_stop_strings=2, max_stop_len=20)
        seen.append(len(traces))
    assert seen[0] >= 2 and seen == [seen[0]] * 3  # prefill + step (+ the abstract model check) traced once


def test_build_and_tokenizer_errors():
    with pytest.raises(ValueError, match="max_len"):
        stop_strings.build(TOK.token_bytes, [["a" * 40]], max_len=31)
    with pytest.raises(ValueError, match="max_stop_strings"):
        stop_strings.build(TOK.token_bytes, [["a", "b"]], max_stop_strings=1)
    with pytest.raises(ValueError, match="empty string"):
        stop_strings.normalise(["a", ""], 1)
    with pytest.raises(ValueError, match="one entry per row"):
        stop_strings.normalise([["a"], ["b"]], 3)
    with pytest.raises(ValueError, match="rows"):
        generate(BIGRAM, PARAMS, jnp.array([[1]]), max_new_tokens=2, stop_sequences=stop_strings.build(TOK.token_bytes, [[], []]))
    with pytest.raises(ValueError, match="max_tokens"):
        _text(max_tokens=[1, 2])
    with pytest.raises(ValueError, match="eos_ids is set by the text layer"):
        _text(eos_ids=[0])


# ---------------------------------------------------------------------------------------- streaming
def test_stream_text_equals_generate_text_and_never_breaks_utf8():
    kw = dict(stop=[["</answer>"], ["\n\n"], None], include_stop_str_in_output=False, max_tokens=[12, 12, 7])
    prompts = ["Hello"] * 3
    chunks = list(stream_text(BIGRAM, PARAMS, TOK, prompts, **kw))
    streamed = ["".join(c.text[b] for c in chunks) for b in range(3)]
    assert streamed == [o.text for o in _text(prompts, **kw)]
    assert all("\ufffd" not in t for c in chunks for t in c.text)
    # row 0: " </ans" is held back (it may start "</answer>") until the row ends
    assert streamed[0] == FULL and not any(t.endswith("</ans") for c in chunks[:-1] for t in c.text[:1])
    assert [c.finish_reason for c in chunks][-1][0] == "stop"


def test_incremental_text_random_bytes_equal_whole_decode():
    rng = random.Random(1)
    pieces = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 3))) for _ in range(50)]
    pieces += ["é".encode(), "日本".encode()[:2], "日本".encode()[2:], b"\xf0\x9f", b"\x98\x80"]
    tok = TextTokenizer(None, tuple(pieces), (), "random")
    for _ in range(200):
        ids = [rng.randrange(len(pieces)) for _ in range(rng.randint(1, 12))]
        inc = IncrementalText(tok, stop=["ab", "\x00\x01"])
        deltas = [inc.push(t) for t in ids] + [inc.finish()]
        assert "".join(deltas) == tok.decode(ids)


# --------------------------------------------------------------------------------- real tokenizers
@pytest.fixture(scope="module")
def corpus():
    from pydoc_data.topics import topics

    return [t for t in topics.values()][:60]


@pytest.fixture(scope="module")
def bpe(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


@pytest.fixture(scope="module")
def sp_model(corpus, tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    path = tmp_path_factory.mktemp("sp") / "tiny"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=str(path), vocab_size=300, byte_fallback=True,
        character_coverage=0.98, num_threads=1, minloglevel=2,
    )
    return str(path) + ".model"


TEXTS = ["Hello, world!\n\nSecond paragraph.", "café — 日本語 ✓", "def f(x):\n    return x"]


def test_byte_level_bpe_round_trips_and_needs_an_eos(bpe, tmp_path):
    with pytest.raises(ValueError, match="no EOS token"):
        as_tokenizer(bpe)
    tok = as_tokenizer(bpe, eos_ids=[bpe.token_to_id("<eos>")], vocab_size=512)
    assert tok.vocab_size == 512 and tok.token_bytes[bpe.token_to_id("<eos>")] is None
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text == bpe.decode(bpe.encode(text).ids)
    with pytest.raises(ValueError, match="vocab_size"):
        as_tokenizer(bpe, eos_ids=[0], vocab_size=10)
    bpe.save(str(tmp_path / "tokenizer.json"))
    from_file = as_tokenizer(tmp_path / "tokenizer.json", eos_ids=tok.eos_ids)
    assert from_file.token_bytes == tok.token_bytes[: len(from_file.token_bytes)]
    assert from_file.encode(TEXTS[0]) == tok.encode(TEXTS[0])


def test_transformers_fast_tokenizer(bpe):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    tok = as_tokenizer(fast)
    assert tok.eos_ids == (fast.eos_token_id,)
    for text in TEXTS:
        assert tok.encode(text) == fast(text)["input_ids"]
        assert tok.decode(tok.encode(text)) == fast.decode(fast(text)["input_ids"])
    nameless = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)
    with pytest.raises(ValueError, match="no EOS token"):
        as_tokenizer(nameless)


def test_sentencepiece_model(sp_model):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = as_tokenizer(sp_model)
    assert tok.eos_ids == (sp.eos_id(),) and tok.encode("hi")[0] == sp.bos_id()
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids).lstrip(" ") == sp.decode(ids)  # "▁" on the first piece is a space here
    assert len(as_tokenizer(sp).token_bytes) == sp.get_piece_size()


def test_unsupported_tokenizers_are_refused(tmp_path):
    from tokenizers import Tokenizer, decoders, models

    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="WordPiece"):
        as_tokenizer(wp, eos_ids=[0])
    with pytest.raises(ValueError, match="tokenizers.Tokenizer"):
        as_tokenizer(object())
    with pytest.raises(ValueError, match="does not exist"):
        as_tokenizer(str(tmp_path / "missing.model"))


def test_tiny_decoder_with_bpe_stops_where_brute_force_says(bpe):
    from jaxsample.decoding import TinyDecoder
    import jaxsample as js
    from jaxsample import stages

    eos = bpe.token_to_id("<eos>")
    tok = as_tokenizer(bpe, eos_ids=[eos])
    net = TinyDecoder(vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2)
    params = net.init_params(jax.random.key(3))
    model = Model(net.apply_step, net.init_cache)
    stops = ["e", "th", "\n"]
    sampler = js.chain(stages.temperature(1.0), select=stages.categorical())
    kw = dict(max_tokens=24, sampler=sampler, sampler_params={"seed": jnp.arange(6)})
    per_row = [stops, stops, ["\n"], None, ["ion", "zq"], stops]
    outs = generate_text(model, params, tok, ["The "] * 6, stop=per_row, include_stop_str_in_output=True, **kw)
    assert sum(o.stop_reason is not None for o in outs) >= 3
    for out, row in zip(outs, per_row):
        ids, encoded = out.token_ids, [s.encode() for s in row or []]
        hit = [_reference_hit(tok.token_bytes, ids[: i + 1], encoded) for i in range(len(ids))]
        assert not any(hit[:-1])  # no earlier token completed a stop string
        assert hit[-1] == (out.stop_reason is not None)
        if out.stop_reason is not None:
            assert out.text.endswith(out.stop_reason) and tok.decode(ids).startswith(out.text)


def test_device_hits_equal_hf_stop_string_criteria(bpe):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.generation.stopping_criteria import StopStringCriteria

    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    tok = as_tokenizer(fast)
    stops = ["\n\n", "the", "e.", ")"]
    hf = StopStringCriteria(fast, stops)
    rng = np.random.default_rng(0)
    seqs = []  # every prefix of two texts (hits where a stop string ends), whatever BPE the corpus trains
    for text in ("the value) is.\n\nThe end. e.g. (the other)\n\n", "then e.g. (x) and the.\n\nthe e. f(the)\n\nthe"):
        text_ids = fast(text)["input_ids"]
        seqs += [text_ids[: i + 1] for i in range(len(text_ids))]
    seqs += [rng.integers(0, len(fast), size=rng.integers(1, 12)).tolist() for _ in range(100)]
    width = 31
    windows = jnp.array([([-1] * width + s)[-width:] for s in seqs])
    ours = np.asarray(stop_strings.hits(windows, stop_strings.build(tok.token_bytes, [stops] * len(seqs))))
    theirs = [bool(hf(torch.tensor([s]), None)[0]) for s in seqs]
    assert 10 < sum(theirs) and ours.tolist() == theirs


def test_score_text_joint_encoding_and_reranking(bpe):
    tok = as_tokenizer(bpe, eos_ids=[bpe.token_to_id("<eos>")])
    table = jax.random.normal(jax.random.key(2), (tok.vocab_size, tok.vocab_size))
    params = {"logits": table}
    prompts, conts = ["The answer is", "The answer is", "x"], [" yes", " no, it is not", ""]
    got = score_text(BIGRAM, params, tok, prompts, conts)
    lp = jax.nn.log_softmax(table, axis=-1)
    for p, c, g in zip(prompts, conts, got):
        joint, alone = tok.encode(p + c), tok.encode(p)
        assert joint[: len(alone)] == alone and g.token_ids == joint[len(alone) :]
        want = [float(lp[a, b]) for a, b in zip(joint[len(alone) - 1 :], g.token_ids)]
        np.testing.assert_allclose(g.token_logprobs, want, atol=1e-5)
        np.testing.assert_allclose(g.logprob, sum(want), atol=1e-4)
    assert got[2].token_ids == [] and np.isnan(got[2].perplexity) and got[0].perplexity > 0
    with pytest.raises(ValueError, match="equal length"):
        score_text(BIGRAM, params, tok, ["a"], [])


def test_run_request_matches_a_requests_stop_strings_with_a_tokenizer():
    """A vLLM request's ``stop`` strings run through ``run_request`` exactly as a stop-string table."""
    from jaxsample.decoding import DecodeRequest, FinishReason, run_request

    req = DecodeRequest.from_vllm(temperature=0.0, max_tokens=12, stop=["orld"], seed=0)
    prompt = jnp.array([[1], [2]])
    with pytest.raises(ValueError, match="pass tokenizer="):
        run_request(req, BIGRAM, PARAMS, prompt)
    out = run_request(req, BIGRAM, PARAMS, prompt, tokenizer=TOK)
    table = stop_strings.build(TOK.token_bytes, [["orld"], ["orld"]])
    want = generate(BIGRAM, PARAMS, prompt, max_new_tokens=12, stop_sequences=table)
    np.testing.assert_array_equal(out.tokens, want.tokens)
    np.testing.assert_array_equal(out.finish_reason, want.finish_reason)
    assert int(FinishReason.STOP_SEQUENCE) in np.asarray(out.finish_reason).tolist()
