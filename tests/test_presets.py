"""Ecosystem builders: stage order, field mapping and validation, chain == functions applied by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import presets, stages
from tests._helpers import CountingJit

V = 32


def _names(preset):
    return [s.name for s in preset.sampler.stages], preset.sampler.selector.name


def test_llama_default_chain_order_and_values():
    p = presets.llama_cpp()
    assert _names(p) == (
        ["penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temperature"],
        "dist",
    )
    v = p.params((2,))
    assert v["top_k"].tolist() == [40, 40] and v["penalty_last_n"].tolist() == [64, 64]
    np.testing.assert_allclose(v["temperature"], 0.8)
    np.testing.assert_allclose(v["min_p"], 0.05)
    assert p.sampler.history_size() == 64  # upstream dry_penalty_last_n = 64 (common.h @ 001d906; was -1)


def test_llama_sequence_aliases_logit_bias_and_mirostat():
    assert _names(presets.llama_cpp(samplers="kpt"))[0] == ["top_k", "top_p", "temperature"]
    assert _names(presets.llama_cpp(samplers="top-k;nucleus;temp"))[0] == ["top_k", "top_p", "temperature"]
    with pytest.raises(ValueError, match="samplers"):
        presets.llama_cpp(samplers="kq")
    p = presets.llama_cpp(samplers="k", logit_bias={3: -jnp.inf, 5: 2.0})
    assert _names(p)[0] == ["logit_bias", "top_k"]
    assert p.params((1,))["logit_bias_ids"].tolist()[0][:3] == [3, 5, -1]
    assert _names(presets.llama_cpp(mirostat=2)) == (["temperature"], "mirostat_v2")
    assert _names(presets.llama_cpp(mirostat=1, logit_bias={1: 1.0})) == (["logit_bias", "temperature"], "mirostat")
    with pytest.raises(ValueError, match="mirostat"):
        presets.llama_cpp(mirostat=3)
    with pytest.raises(ValueError, match="eos_ids"):
        presets.llama_cpp(ignore_eos=True)


def test_llama_cli_flags():
    p = presets.llama_cpp_args("--temp 0.5 --top-k 20 -l 7+1.5 --repeat-penalty 1.1 --samplers top_k;temp -s 9")
    assert _names(p)[0] == ["logit_bias", "top_k", "temperature"]
    assert p.values["temperature"] == 0.5 and p.values["top_k"] == 20 and p.values["seed"] == 9
    assert p.values["logit_bias_ids"] == [7] and p.values["logit_bias_values"] == [1.5]
    with pytest.raises(ValueError, match="--top-q"):
        presets.llama_cpp_args("--top-q 3")
    with pytest.raises(ValueError, match="--temp"):
        presets.llama_cpp_args("--temp hot")


def test_llama_chain_equals_functions_by_hand_and_compiles_once():
    p = presets.llama_cpp(penalty_last_n=8, dry_penalty_last_n=8)
    x = jax.random.normal(jax.random.key(0), (3, V)) * 2
    prompt = jnp.array([[1, 2, 3, 1, 2, 3, -1], [4, 4, 4, 4, 4, 4, 4], [-1] * 7])
    params = p.params((3,), repetition_penalty=1.3, frequency_penalty=0.2, dry_multiplier=0.8, top_k=jnp.array([5, 40, 2]),
                      temperature=jnp.array([0.7, 0.0, 1.3]), seed=jnp.array([1, 2, 3]))
    state = p.sampler.init(params, vocab_size=V, prompt=prompt)
    step = CountingJit(p.sampler.sample)
    tokens, processed, _ = step(x, state, params)

    @jax.jit  # the functions one after another, in one compiled program (eager: each op compiled alone)
    def by_hand(x, h):
        y = js.penalties(x, h, 1.3, 0.2, 0.0, 8)
        y = js.dry(y, h, 0.8, 1.75, 2, 8)
        y = js.top_k(y, jnp.array([5, 40, 2]), exact=True)
        y = js.top_p(y, 0.95, 0)
        y = js.min_p(y, 0.05, 0)
        return js.dynamic_temperature(y, jnp.array([0.7, 0.0, 1.3]), 0.0)

    y = by_hand(x, jnp.where(prompt >= 0, prompt, -1))
    np.testing.assert_allclose(processed, y, rtol=1e-6)
    assert js.greedy(y)[1] == tokens[1]  # temperature 0 row is greedy
    # another llama configuration with the same structure: same sampler, no new compilation
    q = presets.llama_cpp(penalty_last_n=8, dry_penalty_last_n=8, top_k=5, top_p=0.5, temp=1.5, seed=4)
    assert q.sampler == p.sampler
    qp = q.params((3,))
    jax.block_until_ready(step(x, q.sampler.init(qp, vocab_size=V, prompt=prompt), qp))
    assert step.traces == 1


def test_vllm_validation_names_fields():
    for kwargs, field in [
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(min_tokens=20, max_tokens=10), "min_tokens"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(logit_bias={i: 1.0 for i in range(9)}, list_capacity=8), "logit_bias"),
    ]:
        with pytest.raises(ValueError, match=field):
            presets.vllm(**kwargs)


def test_vllm_greedy_resets_filters_and_clamps_bias():
    p = presets.vllm(temperature=1e-6, top_p=0.5, top_k=3, min_p=0.2, logit_bias={2: 500.0})
    assert (p.values["temperature"], p.values["top_p"], p.values["top_k"], p.values["min_p"]) == (0.0, 1.0, 0, 0.0)
    assert p.values["logit_bias_values"] == [100.0]
    with pytest.warns(UserWarning, match="0.01"):
        assert presets.vllm(temperature=0.001).values["temperature"] == 0.01


def test_vllm_batch_rows_follow_their_request():
    reqs = [dict(temperature=0.0), dict(temperature=0.8, top_k=3, seed=5), dict(top_p=0.5, min_p=0.1, seed=6,
                                                                                min_tokens=2, stop_token_ids=[4])]
    batch = presets.vllm_batch(reqs, eos_token_ids=[0])
    x = jax.random.normal(jax.random.key(1), (3, V))
    prompt = jnp.array([[1, 2], [3, -1], [5, 5]])
    params = batch.params((3,))
    state = batch.sampler.init(params, vocab_size=V, prompt=prompt, history_size=8)
    sample = jax.jit(batch.sampler.sample)  # each request's own sampler is equal to it: one compile per shape
    tokens, processed, _ = sample(x, state, params)
    for i, r in enumerate(reqs):
        one = presets.vllm(**r, eos_token_ids=[0])
        assert one.sampler == batch.sampler
        p1 = one.params((1,))
        t1, y1, _ = sample(x[i : i + 1], one.sampler.init(p1, vocab_size=V, prompt=prompt[i : i + 1], history_size=8), p1)
        np.testing.assert_array_equal(processed[i], y1[0])
        assert int(t1[0]) == int(tokens[i])
    assert not bool(jnp.isfinite(processed[2, jnp.array([0, 4])]).any())  # min_tokens bans EOS and stop ids


def test_stack_rejects_different_structures():
    with pytest.raises(ValueError, match="structure"):
        presets.stack([presets.vllm(), presets.vllm(bad_words_ids=[[1, 2]])])


def test_hf_processor_order_and_validation():
    p = presets.hf(
        do_sample=True, temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, typical_p=0.9, epsilon_cutoff=3e-4,
        eta_cutoff=1e-3, repetition_penalty=1.2, no_repeat_ngram_size=3, bad_words_ids=[[5, 6]], min_new_tokens=2,
        eos_token_id=0, suppress_tokens=[9], begin_suppress_tokens=[8], renormalize_logits=True,
        sequence_bias={(1, 2): -3.0}, remove_invalid_values=True, exponential_decay_length_penalty=(4, 1.1),
    )
    assert _names(p) == (
        ["sequence_bias", "penalties", "no_repeat_ngram", "bad_words", "min_tokens", "remove_inf_nan",
         "exponential_decay_length_penalty", "suppress_tokens", "suppress_tokens_at_begin", "temperature", "top_k",
         "top_p", "min_p", "typical", "epsilon_cutoff", "eta_cutoff", "log_softmax"],
        "dist",
    )
    assert p.values["sequence_bias_0"] == -3.0
    assert _names(presets.hf()) == ([], "greedy")
    assert _names(presets.hf(do_sample=True)) == (["top_k"], "dist")  # HF's top_k=50 default
    for kwargs, field in [
        (dict(do_sample=True, temperature=0.0), "temperature"),
        (dict(do_sample=True, top_p=1.5), "top_p"),
        (dict(do_sample=True, typical_p=0.0), "typical_p"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(min_length=5, eos_token_id=0), "prompt_length"),
        (dict(forced_eos_token_id=0), "max_new_tokens"),
        (dict(guidance_scale=1.5), "guidance_scale"),
        (dict(num_beams=4, num_return_sequences=5), "num_return_sequences"),  # num_beams itself is accepted
        (dict(foo=1), "foo"),
    ]:
        with pytest.raises(ValueError, match=field):
            presets.hf(**kwargs)


def test_hf_min_length_counts_the_prompt():
    p = presets.hf(min_length=6, prompt_length=[2, 7], eos_token_id=1)
    assert p.params((2,))["min_tokens"].tolist() == [4, 0]


def test_scenarios():
    assert presets.scenario("code").values["temperature"] == 0.0
    assert presets.scenario("creative").values["top_k"] == 50
    with pytest.raises(ValueError, match="poetry"):
        presets.scenario("poetry")
    assert presets.scenario("chat", temperature=0.5).values["temperature"] == 0.5
    assert {s: presets.scenario(s).sampler for s in presets.SCENARIOS}["chat"] == presets.vllm().sampler


def test_stage_factories_used_by_presets_are_shared():
    assert presets.vllm().sampler.stages[-1] == stages.top_p()


def test_stacked_presets_keep_each_presets_stage_defaults():
    """Samplers that differ only in stage defaults are equal; stacking must still give each row its own."""
    a = presets.Preset(js.chain(stages.temperature(0.7), select=stages.categorical()), {})
    b = presets.Preset(js.chain(stages.temperature(0.2), select=stages.categorical()), {})
    assert a.sampler == b.sampler
    np.testing.assert_allclose(presets.stack([a, b]).params((2,))["temperature"], [0.7, 0.2])
