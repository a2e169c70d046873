"""Beam search family: exhaustive beams == brute-force enumeration (bigram and transformer caches),
beam sampling (low temperature == search; first draw ~ softmax), group diversity, batch
invariance, no recompiles. Exactness against transformers lives in test_hf_exactness.py."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import (
    BIGRAM,
    FinishReason,
    TinyDecoder,
    beam_sample,
    beam_search,
    group_beam_search,
)
from tests._helpers import assert_draws_follow, counting_model

EOS = 0
V, N = 3, 3
K = (V - 1) ** (N - 1) * V  # every continuation of every live sequence ranks among the first K: exhaustive


def _complete_sequences(v, n, eos):
    """Every sequence beam search can finish: EOS only at the end, or length n."""
    out = []
    for length in range(1, n + 1):
        for seq in itertools.product(range(v), repeat=length):
            if eos in seq[:-1] or (length < n and seq[-1] != eos):
                continue
            out.append(seq)
    return out


def _brute_force(logprob_fn, prompt, alpha, normalization, r):
    scored = []
    for seq in _complete_sequences(V, N, EOS):
        s = logprob_fn(prompt, seq)
        if normalization == "vllm":  # vLLM's get_beam_search_score: prompt + output, a final EOS not counted
            pen = (len(prompt) + len(seq) - (seq[-1] == EOS)) ** alpha
        else:
            pen = len(seq) ** alpha if normalization == "hf" else ((5 + len(seq)) / 6) ** alpha
        scored.append((s / pen, list(seq)))
    scored.sort(key=lambda x: -x[0])
    return scored[:r]


TABLE = np.log(np.random.default_rng(3).dirichlet(np.ones(V), size=V)).astype(np.float32)


def _bigram_logprob(prompt, seq):
    prev, total = prompt[-1], 0.0
    for tok in seq:
        total += TABLE[prev, tok] - np.log(np.exp(TABLE[prev]).sum())
        prev = tok
    return total


def _hypotheses(out, b, r):
    return [list(np.asarray(out.tokens[b, i, : int(out.lengths[b, i])])) for i in range(r)]


@pytest.mark.parametrize(
    "alpha,normalization", [(0.0, "hf"), (1.0, "hf"), (-0.7, "hf"), (2.0, "gnmt"), (1.0, "vllm"), (2.5, "vllm")]
)
def test_exhaustive_beam_equals_brute_force_enumeration(alpha, normalization):
    prompts = [[1], [2, 2]]
    out = beam_search(
        BIGRAM,
        {"logits": jnp.asarray(TABLE)},
        [[1, -1], [2, 2]],
        num_beams=K,
        num_return_sequences=6,
        max_new_tokens=N,
        eos_ids=EOS,
        early_stopping="never",
        length_penalty=alpha,
        length_normalization=normalization,
    )
    for b, prompt in enumerate(prompts):
        ref = _brute_force(_bigram_logprob, prompt, alpha, normalization, 6)
        assert _hypotheses(out, b, 6) == [seq for _, seq in ref]
        np.testing.assert_allclose(out.scores[b], [s for s, _ in ref], rtol=1e-5)
        expect = [FinishReason.EOS if seq[-1] == EOS else FinishReason.LENGTH for _, seq in ref]
        np.testing.assert_array_equal(out.finish_reason[b], expect)


NET = TinyDecoder(vocab_size=V, d_model=16, num_layers=2, num_heads=2)


@functools.cache
def net_params():
    return jax.jit(NET.init_params)(jax.random.key(4), scale=2.0)


@jax.default_matmul_precision("highest")  # GPUs default to TF32 matmuls: cached vs full forward differ by ~1e-3
def test_exhaustive_beam_on_a_transformer_reorders_its_cache_correctly():
    apply = jax.jit(NET.apply_step)

    def logprob(prompt, seq):
        full = list(prompt) + list(seq)
        pos = jnp.arange(len(full))[None]
        logits = apply(net_params(), jnp.asarray([full]), pos, NET.init_cache(1, len(full))).logits[0]
        lp = np.asarray(jax.nn.log_softmax(logits))
        return sum(lp[len(prompt) - 1 + i, t] for i, t in enumerate(seq))

    out = beam_search(
        NET.model,
        net_params(),
        [[1, 2]],
        num_beams=K,
        num_return_sequences=5,
        max_new_tokens=N,
        eos_ids=EOS,
        early_stopping="never",
        length_penalty=0.5,
    )
    ref = _brute_force(logprob, [1, 2], 0.5, "hf", 5)
    assert _hypotheses(out, 0, 5) == [seq for _, seq in ref]
    np.testing.assert_allclose(out.scores[0], [s for s, _ in ref], rtol=1e-4, atol=1e-5)


BIG_V = 9
BIG_TABLE = np.random.default_rng(5).standard_normal((BIG_V, BIG_V)).astype(np.float32)
BIG = {"logits": jnp.asarray(BIG_TABLE)}
TEMP = js.chain(stages.temperature(1.0), select=stages.categorical())


def test_beam_sample_at_low_temperature_is_beam_search():
    prompt = [[1, 4], [3, -1]]
    kw = dict(num_beams=3, num_return_sequences=3, max_new_tokens=5, eos_ids=2, length_penalty=1.0)
    ref = beam_search(BIGRAM, BIG, prompt, **kw)
    got = beam_sample(
        BIGRAM,
        BIG,
        prompt,
        sampler=TEMP,
        sampler_params={"temperature": 1e-3, "seed": jnp.array([1, 2])},
        **kw,
    )
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.scores * 1e-3, ref.scores, rtol=1e-3)


def test_beam_sample_first_draw_follows_the_processed_distribution():
    n = 3000
    out = beam_sample(
        BIGRAM,
        BIG,
        jnp.full((n, 1), 6),
        num_beams=1,
        max_new_tokens=1,
        sampler=TEMP,
        sampler_params={"temperature": 0.8, "seed": jnp.arange(n)},
    )
    assert_draws_follow(out.tokens[:, 0, 0], jax.nn.softmax(jnp.asarray(BIG_TABLE[6]) / 0.8))


def test_group_beam_search_diversity_penalty_spreads_groups():
    kw = dict(num_beams=3, num_beam_groups=3, num_return_sequences=3, max_new_tokens=1)
    same = group_beam_search(BIGRAM, BIG, [[2]], diversity_penalty=0.0, **kw)
    spread = group_beam_search(BIGRAM, BIG, [[2]], diversity_penalty=100.0, **kw)
    order = np.argsort(-BIG_TABLE[2], kind="stable")
    np.testing.assert_array_equal(same.tokens[0, :, 0], [order[0]] * 3)
    np.testing.assert_array_equal(spread.tokens[0, :, 0], order[:3])
    lp = jax.nn.log_softmax(BIG_TABLE[2])
    np.testing.assert_allclose(spread.scores[0], lp[order[:3]], rtol=1e-5)


def test_early_stopping_true_returns_the_first_finished_hypotheses():
    table = np.full((4, 4), -4.0, np.float32)
    table[1, 0], table[1, 2], table[2, 0], table[2, 3], table[3, 0] = 0.0, -0.1, -0.2, -0.3, -0.4
    out = beam_search(
        BIGRAM,
        {"logits": jnp.asarray(table)},
        [[1]],
        num_beams=2,
        num_return_sequences=2,
        max_new_tokens=8,
        eos_ids=0,
        early_stopping=True,
        length_penalty=0.0,
    )
    # step 1 finishes [0]; step 2 finishes [2, 0]: two hypotheses, done, although [2, 3, 0] might score higher
    assert _hypotheses(out, 0, 2) == [[0], [2, 0]]


def test_prompt_results_do_not_depend_on_the_batch():
    kw = dict(
        num_beams=4,
        num_return_sequences=2,
        max_new_tokens=jnp.array([6, 3, 5]),
        max_tokens=6,
        eos_ids=[2, 5],
        length_penalty=jnp.array([1.0, 0.0, 2.0]),
        stop_sequences=[[7, 1]],
    )
    prompts = jnp.array([[1, 4, 4], [3, -1, -1], [8, 0, -1]])
    full = beam_search(BIGRAM, BIG, prompts, **kw)
    one = beam_search(BIGRAM, BIG, prompts[1:2], **dict(kw, max_new_tokens=3, length_penalty=0.0))
    np.testing.assert_array_equal(full.tokens[1], one.tokens[0])
    np.testing.assert_array_equal(full.scores[1], one.scores[0])
    assert int(full.lengths[1].max()) <= 3
    assert np.all(np.diff(np.asarray(full.scores), axis=1) <= 0)


COUNTING, _TRACES = counting_model(BIGRAM)


def test_new_values_never_recompile():
    counts = []
    for lp, max_new, eos, seed in [
        (1.0, [4, 2], [2, 3], [1, 2]),
        (0.3, [1, 5], [4, -1], [5, 5]),
        (-1.0, [5, 5], [-1, -1], [0, 9]),
    ]:
        out = beam_sample(
            COUNTING,
            BIG,
            [[1], [2]],
            num_beams=2,
            max_new_tokens=jnp.array(max_new),
            max_tokens=5,
            length_penalty=jnp.array([lp, 2 * lp]),
            eos_ids=jnp.array(eos),
            sampler=TEMP,
            sampler_params={"seed": jnp.array(seed), "temperature": jnp.array([lp + 2.0, 1.0])},
        )
        jax.block_until_ready(out)
        counts.append(len(_TRACES))
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_return_sequences"):
        beam_search(BIGRAM, BIG, [[1]], num_beams=2, num_return_sequences=3, max_new_tokens=2)
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(BIGRAM, BIG, [[1]], num_beams=2, max_new_tokens=2, early_stopping="sometimes")
    with pytest.raises(ValueError, match="divisible"):
        group_beam_search(
            BIGRAM, BIG, [[1]], num_beams=3, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=2
        )
    with pytest.raises(ValueError, match="length_normalization"):
        beam_search(BIGRAM, BIG, [[1]], num_beams=2, max_new_tokens=2, length_normalization="t5")
