"""Smaller anchor features: HF ``prompt_ignore_length`` (against HF's processor), the Meena / LaMDA
sample-and-rank recipes (presets == shipped configs, and they run)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import presets, stages
from jaxsample.decoding import BIGRAM, sample_and_rank
from jaxsample.evaluation.configs import LOADERS

V = 9
PROMPTS = np.array([[1, 2, 3, 4, -1], [5, 5, 6, 1, 2]], np.int32)
GENERATED = np.array([[7, 1, 8], [0, 3, 3]], np.int32)


def _hf_penalty_sampler():
    return js.chain(stages.penalties(scope="hf"), select=stages.greedy())


def _ours(ignore, penalty=1.7):
    sampler = _hf_penalty_sampler()
    p = sampler.params((2,), repetition_penalty=penalty, prompt_ignore_length=ignore)
    st = sampler.init(p, vocab_size=V, prompt=PROMPTS, history_size=8)
    for t in range(GENERATED.shape[1]):
        st = sampler.accept(GENERATED[:, t], st, p)
    logits = jax.random.normal(jax.random.key(0), (2, V))
    return logits, sampler.process(logits, st, p)[0]


@pytest.mark.parametrize("ignore", [[0, 0], [2, 4], [4, 5], [6, 7]])
def test_prompt_ignore_length_matches_hf_repetition_penalty(ignore):
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits, ours = _ours(jnp.array(ignore))
    rows = []
    for b in range(2):  # HF sees prompt + generated, unpadded
        ids = [int(t) for t in PROMPTS[b] if t >= 0] + GENERATED[b].tolist()
        proc = RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=torch.tensor([ignore[b]]))
        rows.append(proc(torch.tensor([ids]), torch.tensor(np.asarray(logits[b : b + 1]))).numpy()[0])
    np.testing.assert_allclose(np.asarray(ours), np.stack(rows), rtol=1e-6)


def test_prompt_ignore_length_hand_case_and_default():
    logits, ours = _ours(jnp.array([4, 0]))
    x, y = np.asarray(logits), np.asarray(ours)
    penalised = {7, 1, 8}  # row 0: the prompt [1, 2, 3, 4] is ignored, the generated 7, 1, 8 count
    for v in range(V):
        want = (x[0, v] / 1.7 if x[0, v] > 0 else x[0, v] * 1.7) if v in penalised else x[0, v]
        np.testing.assert_allclose(y[0, v], want, rtol=1e-6)
    _, default = _ours(0)
    np.testing.assert_array_equal(np.asarray(default)[1], y[1])
    with pytest.raises(ValueError, match="prompt_ignore_length"):
        _hf_penalty_sampler().params((2,), prompt_ignore_length=-1)


@pytest.mark.parametrize("name", ["meena", "lamda"])
def test_recipes_match_the_shipped_configs(name):
    r = presets.recipe(name)
    _, dcfg, scfg, _ = LOADERS["decoding"](f"configs/decoding/{name}.yaml")
    assert (dcfg.strategy, dcfg.best_of, dcfg.num_return, dcfg.rank_by, dcfg.length_penalty) == (
        "best_of", r.best_of, r.n, r.rank_by, r.length_penalty)
    built = presets.vllm(**scfg.settings)  # no seed: vLLM draws a fresh one, so compare the rest
    assert built.sampler == r.preset.sampler
    assert {k: v for k, v in built.values.items() if k != "seed"} == {
        k: v for k, v in r.preset.values.items() if k != "seed"}


def test_published_values_and_the_recipe_runs():
    meena, lamda = presets.recipe("meena"), presets.recipe("lamda")
    assert (meena.best_of, meena.preset.values["temperature"]) == (20, 0.88)
    assert (lamda.best_of, lamda.preset.values["top_k"], lamda.preset.values["temperature"]) == (16, 40, 1.0)
    table = jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2]]))
    out = sample_and_rank(BIGRAM, {"logits": table}, jnp.array([[0], [1]]), max_new_tokens=3, **lamda.kwargs())
    assert out.tokens.shape == (2, 1, 3)
    with pytest.raises(ValueError, match="unknown recipe"):
        presets.recipe("gpt")
    with pytest.raises(ValueError, match="n must be"):
        presets.recipe("lamda", n=17)


def test_vllm_preset_thinking_token_budget():
    p = presets.vllm(temperature=0.0, think_start_token_ids=[4], think_end_token_ids=[5], thinking_token_budget=1)
    assert [s.name for s in p.sampler.stages][:4] == ["allowed_tokens", "min_tokens", "logit_bias", "reasoning_budget"]
    params = p.params((1,))
    st = p.sampler.init(params, vocab_size=V, prompt=jnp.array([[1, 4]]), history_size=8)
    x = jnp.zeros((1, V)).at[0, 2].set(3.0)
    toks = []
    sample = jax.jit(p.sampler.sample)  # one compilation for the three steps (eager: ~10 CPU-s of op compiles)
    for _ in range(3):
        tok, _, st = sample(x, st, params)
        toks.append(int(tok[0]))
    assert toks == [2, 5, 2]
    assert "reasoning_budget" not in [s.name for s in presets.vllm().sampler.stages]
    with pytest.raises(ValueError, match="thinking_token_budget"):
        presets.vllm(thinking_token_budget=3)
