"""Config objects end to end: vLLM SamplingParams / HF GenerationConfig -> presets -> DecodeRequest -> strategy.

vLLM cannot be installed here: its ``SamplingParams`` is stood in for by an object with exactly the
fields of ``vllm/sampling_params.py`` (main, commit 00388f6) and vLLM's defaults. HF's
``GenerationConfig`` is the real class from ``transformers``.
"""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import presets
from jaxsample.decoding import (
    BIGRAM,
    DecodeRequest,
    beam_search,
    contrastive_search,
    generate,
    group_beam_search,
    run_request,
    sample_and_rank,
)

# vllm.SamplingParams fields and defaults (vllm/sampling_params.py, main @ 00388f6), private ones included.
VLLM_DEFAULTS = dict(
    n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
    min_p=0.0, seed=None, stop=None, stop_token_ids=None, ignore_eos=False, max_tokens=16, min_tokens=0,
    logprobs=None, prompt_logprobs=None, prompt_logprob_token_ids=None, prompt_logprob_start=None,
    logprob_token_ids=None, flat_logprobs=False, detokenize=True, skip_special_tokens=True,
    spaces_between_special_tokens=True, include_stop_str_in_output=False, output_kind=0, stream_interval=None,
    skip_clone=False, output_text_buffer_length=0, _eos_token_id=None, _all_stop_token_ids=set(),
    structured_outputs=None, logit_bias=None, allowed_token_ids=None, extra_args=None, bad_words=None,
    _bad_words_token_ids=None, skip_reading_prefix_cache=None, thinking_token_budget=None,
    repetition_detection=None, routed_experts_prompt_start=0, trace_decode_token_ids=None,
)


class SamplingParams:
    """Duck-typed ``vllm.SamplingParams`` (a msgspec Struct: fields listed in ``__struct_fields__``)."""

    __struct_fields__ = tuple(VLLM_DEFAULTS)

    def __init__(self, **kw):
        unknown = set(kw) - set(VLLM_DEFAULTS)
        assert not unknown, unknown
        for k, v in {**VLLM_DEFAULTS, **kw}.items():
            setattr(self, k, v)
        if self.stop_token_ids is not None:  # as vLLM's __post_init__
            self.output_text_buffer_length = 3


class Words:
    """A word-level tokenizer with ``encode(text, add_special_tokens=False)`` (the transformers API)."""

    vocab = {"bad": 3, "Ġbad": 4, "two": 5, "words": 6, "Ġwords": 7}

    def encode(self, text, add_special_tokens=False):
        out = []
        for i, w in enumerate(text.split(" ")):
            if w:
                out.append(self.vocab["Ġ" + w if (i > 0 or text.startswith(" ")) and "Ġ" + w in self.vocab else w])
        return out


# ----------------------------------------------------------------------------------------- vLLM
def test_vllm_takes_a_sampling_params_object_with_every_field():
    sp = SamplingParams(n=2, temperature=0.7, top_p=0.9, seed=3, stop=["\n\n"], stop_token_ids=[9], logprobs=5,
                        max_tokens=64, min_tokens=2, ignore_eos=True, include_stop_str_in_output=True,
                        skip_special_tokens=False, prompt_logprobs=1)
    p = presets.vllm(sp, eos_token_ids=[0])
    assert p.values["temperature"] == 0.7 and p.values["seed"] == 3
    assert p.values["min_tokens_ids"] == [9, 0]  # stop ids and EOS are masked until min_tokens
    r = p.request
    assert (r["n"], r["max_new_tokens"], r["min_new_tokens"], r["logprobs"], r["seed"]) == (2, 64, 2, 5, 3)
    assert r["eos_ids"] == (9,)  # ignore_eos: EOS does not stop, stop_token_ids still do
    assert r["stop"] == ("\n\n",) and r["include_stop_str_in_output"] is True and r["skip_special_tokens"] is False
    assert r["prompt_logprobs"] == 1
    assert presets.vllm(SamplingParams(seed=1)).values == presets.vllm(seed=1).values  # private fields skipped


def test_vllm_dict_with_request_fields_and_string_bad_words():
    p = presets.vllm({"n": 2, "best_of": 3, "stop": "</a>", "logprobs": True, "max_tokens": 8, "ignore_eos": False,
                      "bad_words": ["bad", "two words"]}, eos_token_ids=[0], tokenizer=Words())
    assert p.request["stop"] == ("</a>",) and p.request["logprobs"] == 1 and p.request["eos_ids"] == (0,)
    stage = next(s for s in p.sampler.stages if s.name == "bad_words")
    assert stage is not None
    # vLLM tokenises each word without and with a leading space; "two words" -> (5, 7); " two words" has the
    # same first token (5) so only the plain form is banned; "bad" -> (3,) and " bad" -> (4,).
    from jaxsample.presets.vllm import _bad_words_ids

    assert _bad_words_ids(["bad", "two words"], Words()) == [(3,), (4,), (5, 7)]
    with pytest.raises(ValueError, match="bad_words: strings need a tokenizer"):
        presets.vllm(bad_words=["bad"])


def test_vllm_seed_none_draws_fresh_entropy_and_records_it():
    seeds = {presets.vllm(seed=None).values["seed"] for _ in range(4)} | {presets.vllm(seed=-1).values["seed"]}
    assert len(seeds) == 5 and all(0 <= s < 2**31 for s in seeds)
    p = presets.vllm(SamplingParams())
    assert p.request["seed"] == p.values["seed"]  # replayable: the drawn seed is kept
    assert presets.vllm(seed=7).values["seed"] == 7


@pytest.mark.parametrize("fields, message", [
    (dict(temperature=2.5), "temperature must be in \\[0, 2\\]"),
    (dict(temperature=math.nan), "temperature must be a finite number"),
    (dict(temperature="hot"), "temperature must be a number, got str"),
    (dict(top_p=0.0), "top_p must be in \\(0, 1\\]"),
    (dict(top_p=math.nan), "top_p must be a finite number"),
    (dict(top_k=-2), "top_k must be 0 \\(disable\\), or at least 1"),
    (dict(top_k=1.5), "top_k must be an integer, got float"),
    (dict(top_k=True), "top_k must be an integer, got bool"),
    (dict(min_p=1.5), "min_p must be in \\[0, 1\\]"),
    (dict(presence_penalty=2.5), "presence_penalty must be in \\[-2, 2\\]"),
    (dict(frequency_penalty=-3), "frequency_penalty must be in \\[-2, 2\\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be greater than zero"),
    (dict(repetition_penalty=math.inf), "repetition_penalty must be a finite number"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(max_tokens=4, min_tokens=5), "min_tokens must be less than or equal to max_tokens=4"),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0"),
    (dict(n=0), "n must be in \\[1, 16384\\]"),
    (dict(n=2, temperature=0.0), "n must be 1 when using greedy sampling"),
    (dict(n=3, best_of=2), "best_of must be greater than or equal to n=3"),
    (dict(logprobs=-2), "logprobs must be non-negative or -1"),
    (dict(prompt_logprobs=-3), "prompt_logprobs must be non-negative or -1"),
    (dict(stop=["a", ""]), "stop cannot contain an empty string"),
    (dict(stop=["a"], detokenize=False), "stop strings are only supported when detokenize is True"),
    (dict(stop=3), "stop must be a string or a list of strings"),
    (dict(stop_token_ids=["a"]), "stop_token_ids\\[0\\] must be an integer"),
    (dict(bad_words=[""]), "bad_words cannot contain an empty string"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(logit_bias={"x": 1.0}), "logit_bias contains key\\(s\\) that cannot be converted"),
    (dict(logit_bias={1: math.nan}), "logit_bias\\[1\\] must be a finite number"),
    (dict(stream_interval=0), "stream_interval must be at least 1"),
    (dict(ignore_eos="yes"), "ignore_eos must be True or False"),
    (dict(structured_outputs={"regex": "a+"}), "structured_outputs: compile the constraint with jaxsample.structured"),
    (dict(thinking_token_budget=8), "thinking_token_budget"),
    (dict(use_beam_search=True), "unknown field 'use_beam_search'"),
])
def test_vllm_validation_names_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        presets.vllm(fields)


def test_vllm_off_values_of_unavailable_fields_are_accepted():
    presets.vllm(thinking_token_budget=-1, structured_outputs=None, extra_args={"x": 1}, skip_clone=True)


def test_vllm_batch_takes_objects_and_keeps_per_row_budgets():
    batch = presets.vllm_batch([SamplingParams(max_tokens=4, seed=1), {"max_tokens": 6, "seed": 2}],
                               eos_token_ids=[0])
    assert batch.request["max_new_tokens"] == [4, 6] and batch.request["seed"] == [1, 2]
    with pytest.raises(ValueError, match="request field 'n' differs"):
        presets.vllm_batch([{"n": 1}, {"n": 2}])


# ------------------------------------------------------------------------------------------- HF
def test_hf_takes_generation_config_object_dict_and_json(tmp_path):
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, eos_token_id=[2, 7], bos_token_id=1,
                          pad_token_id=0, max_new_tokens=32, num_beams=1, repetition_penalty=1.1)
    gc.save_pretrained(tmp_path)
    data = json.load(open(tmp_path / "generation_config.json"))
    assert "transformers_version" in data
    built = [presets.hf(gc), presets.hf(gc.to_dict()), presets.hf(**gc.to_dict()),
             presets.hf(tmp_path / "generation_config.json"), presets.hf(str(tmp_path))]
    for p in built:
        assert [s.name for s in p.sampler.stages] == ["penalties", "temperature", "top_k", "top_p"]
        assert p.values == built[0].values and p.request == built[0].request
    r = built[0].request
    assert (r["eos_ids"], r["pad_id"], r["start_id"], r["max_new_tokens"]) == ((2, 7), 0, 1, 32)


def test_hf_defaults_from_an_empty_transformers5_dict():
    """transformers 5 writes None for every unset field: all of them mean HF's defaults."""
    from transformers import GenerationConfig

    p = presets.hf(GenerationConfig().to_dict())
    assert ([s.name for s in p.sampler.stages], p.sampler.selector.name) == ([], "greedy")
    assert p.request["max_length"] == 20 and p.request["num_beams"] == 1 and p.request["pad_id"] is None


def test_hf_token_ids_keep_their_meaning():
    p = presets.hf(eos_token_id=5, min_new_tokens=3, decoder_start_token_id=2, bos_token_id=1)
    assert p.values["min_tokens"] == 3 and p.request["eos_ids"] == (5,)
    assert p.request["pad_id"] == 5  # HF: pad defaults to the first EOS id
    assert p.request["start_id"] == 2  # decoder_start_token_id wins over bos_token_id
    with pytest.raises(ValueError, match="need eos_token_id"):
        presets.hf(min_new_tokens=3)  # never silently nothing
    with pytest.raises(ValueError, match="need eos_token_id"):
        presets.hf(min_length=5, prompt_length=2)
    forced = presets.hf(forced_bos_token_id=4, forced_eos_token_id=[5, 6], max_new_tokens=8)
    assert [s.name for s in forced.sampler.stages] == ["forced_bos", "forced_eos"]


@pytest.mark.parametrize("fields, message", [
    (dict(temperature=math.nan, do_sample=True), "temperature must be a finite number"),
    (dict(top_p=math.nan, do_sample=True), "top_p must be a finite number"),
    (dict(top_k="50"), "top_k must be an integer, got str"),
    (dict(num_beams=2.0), "num_beams must be an integer, got float"),
    (dict(do_sample="yes"), "do_sample must be True or False"),
    (dict(eos_token_id=[1, "2"]), "eos_token_id\\[1\\] must be an integer"),
    (dict(eos_token_id=-1), "eos_token_id must hold token ids >= 0"),
    (dict(pad_token_id=[0, 1]), "pad_token_id must be one token id"),
    (dict(max_new_tokens=0), "max_new_tokens must be greater than 0"),
    (dict(early_stopping="sometimes"), "early_stopping must be True, False or 'never'"),
    (dict(num_beams=4, num_beam_groups=3, diversity_penalty=1.0), "divisible by num_beam_groups"),
    (dict(num_beams=4, num_beam_groups=2), "diversity_penalty must be > 0"),
    (dict(num_return_sequences=2), "num_return_sequences > 1 needs"),
    (dict(penalty_alpha=1.5, top_k=4), "penalty_alpha must be in \\[0, 1\\]"),
    (dict(stop_strings=[""]), "stop_strings cannot contain an empty string"),
    (dict(max_time=1.0), "max_time: a wall-clock limit"),
    (dict(watermarking_config={"greenlist_ratio": 1.5}), "greenlist_ratio"),
    (dict(dola_layers="high", num_beams=2, repetition_penalty=1.2), "dola_layers needs num_beams=1"),
    (dict(force_words_ids=[[5]], do_sample=True), "does not support sampling"),
    (dict(output_attentions=True), "output_attentions"),
    (dict(num_beem=4), "unknown field 'num_beem'"),
])
def test_hf_validation_names_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        DecodeRequest.from_preset(presets.hf(fields))


def test_hf_bad_json_file(tmp_path):
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        presets.hf(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        presets.hf(tmp_path / "missing.json")


# -------------------------------------------------------------------------------- DecodeRequest
@pytest.mark.parametrize("make, strategy, options", [
    (lambda: DecodeRequest.from_vllm(max_tokens=8, seed=0), "generate", {"max_new_tokens": 8}),
    (lambda: DecodeRequest.from_vllm(n=2, best_of=4, seed=0), "sample_and_rank", {"n": 2, "best_of": 4}),
    (lambda: DecodeRequest.from_vllm(best_of=3, seed=0), "sample_and_rank", {"n": 1, "best_of": 3}),
    (lambda: DecodeRequest.from_vllm(logprobs=3, seed=0), "generate", {"logprobs": True, "top_logprobs": 3}),
    (lambda: DecodeRequest.from_hf(max_new_tokens=4), "generate", {"max_new_tokens": 4}),
    (lambda: DecodeRequest.from_hf(num_beams=4, num_return_sequences=2, length_penalty=0.5), "beam_search",
     {"num_beams": 4, "num_return_sequences": 2, "length_penalty": 0.5, "do_sample": False}),
    (lambda: DecodeRequest.from_hf(num_beams=2, do_sample=True), "beam_search", {"do_sample": True}),
    (lambda: DecodeRequest.from_hf(num_beams=4, num_beam_groups=2, diversity_penalty=0.5), "group_beam_search",
     {"num_beam_groups": 2, "diversity_penalty": 0.5}),
    (lambda: DecodeRequest.from_hf(penalty_alpha=0.6, top_k=4), "contrastive_search",
     {"top_k": 4, "penalty_alpha": 0.6}),
    (lambda: DecodeRequest.from_hf(do_sample=True, num_return_sequences=3), "sample_and_rank",
     {"n": 3, "best_of": 3}),
    (lambda: DecodeRequest.from_hf(output_scores=True, max_new_tokens=2), "generate", {"logprobs": True}),
])
def test_request_picks_the_strategy(make, strategy, options):
    req = make()
    assert req.strategy == strategy
    assert {k: req.options[k] for k in options} == options


def _bigram(v=6, d=4):
    rng = np.random.default_rng(0)
    return {"logits": jnp.log(jnp.asarray(rng.dirichlet(np.ones(v), v), jnp.float32)),
            "hidden": jnp.asarray(rng.normal(size=(v, d)), jnp.float32)}


PROMPT = jnp.array([[1, 2], [3, -1]])


def _same(a, b):
    for x, y in zip(a, b):
        if x is not None:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_run_request_equals_the_direct_strategy_calls():
    params = _bigram()
    req = DecodeRequest.from_vllm({"n": 2, "best_of": 3, "max_tokens": 5, "seed": 4, "temperature": 0.8},
                                  eos_token_ids=[0])
    direct = sample_and_rank(BIGRAM, params, PROMPT, n=2, best_of=3, max_new_tokens=5, eos_ids=[0],
                             sampler=req.preset.sampler, sampler_params=req.preset.params((2,)))
    _same(run_request(req, BIGRAM, params, PROMPT), direct)

    req = DecodeRequest.from_hf({"num_beams": 3, "eos_token_id": 0, "max_new_tokens": 4, "num_return_sequences": 2})
    direct = beam_search(BIGRAM, params, PROMPT, num_beams=3, num_return_sequences=2, max_new_tokens=4, eos_ids=[0],
                         pad_id=0, sampler=req.preset.sampler, sampler_params=req.preset.params((2,)))
    _same(run_request(req, BIGRAM, params, PROMPT), direct)

    req = DecodeRequest.from_hf({"penalty_alpha": 0.5, "top_k": 3, "eos_token_id": 0, "max_new_tokens": 4})
    direct = contrastive_search(BIGRAM, params, PROMPT, top_k=3, penalty_alpha=0.5, max_new_tokens=4, eos_ids=[0],
                                pad_id=0, sampler=req.preset.sampler, sampler_params=req.preset.params((2,)))
    _same(run_request(req, BIGRAM, params, PROMPT), direct)

    req = DecodeRequest.from_hf({"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 1.0, "eos_token_id": 0,
                                 "max_new_tokens": 3})
    direct = group_beam_search(BIGRAM, params, PROMPT, num_beams=4, num_beam_groups=2, diversity_penalty=1.0,
                               max_new_tokens=3, eos_ids=[0], pad_id=0, sampler=req.preset.sampler,
                               sampler_params=req.preset.params((2,)))
    _same(run_request(req, BIGRAM, params, PROMPT), direct)


def test_run_request_hf_max_length_start_token_and_logprobs():
    params = _bigram()
    req = DecodeRequest.from_hf({"eos_token_id": 0, "bos_token_id": 1, "max_length": 6})
    out = run_request(req, BIGRAM, params, batch_size=2)  # no prompt: starts from BOS, 6 - 1 new tokens
    direct = generate(BIGRAM, params, jnp.array([[1], [1]]), max_new_tokens=5, eos_ids=[0], pad_id=0,
                      sampler=req.preset.sampler, sampler_params=req.preset.params((2,)))
    _same(out, direct)
    out = run_request(req, BIGRAM, params, PROMPT)  # HF counts the (padded) prompt width in max_length
    assert out.tokens.shape == (2, 4)
    req = DecodeRequest.from_vllm(max_tokens=3, logprobs=2, temperature=0.0, eos_token_ids=[0])
    out = run_request(req, BIGRAM, params, PROMPT)
    assert out.logprobs is not None and out.logprobs.top_ids.shape[-1] == 2


def test_run_request_refuses_what_it_would_drop():
    params = _bigram()
    with pytest.raises(ValueError, match="stop: stop strings \\['</a>'\\] are matched on text"):
        run_request(DecodeRequest.from_vllm(stop=["</a>"], seed=0), BIGRAM, params, PROMPT)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        run_request(DecodeRequest.from_vllm(prompt_logprobs=2, seed=0), BIGRAM, params, PROMPT)
    with pytest.raises(ValueError, match="max_new_tokens: the request sets no token budget"):
        run_request(DecodeRequest.from_vllm(max_tokens=None, seed=0), BIGRAM, params, PROMPT)
    with pytest.raises(ValueError, match="no prompt and no start token"):
        run_request(DecodeRequest.from_vllm(seed=0), BIGRAM, params)
    with pytest.raises(ValueError, match="max_length=2 leaves no new token"):
        run_request(DecodeRequest.from_hf(max_length=2), BIGRAM, params, PROMPT)
    with pytest.raises(ValueError, match="logprobs: log-probs are returned by generate only"):
        DecodeRequest.from_vllm(n=2, logprobs=1, seed=0)
    with pytest.raises(ValueError, match="strategy must be one of"):
        DecodeRequest("beam")
