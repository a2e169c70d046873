"""Prompt-lookup decoding: the proposer against vLLM's rule (brute force) and HF's generator, greedy
output == greedy decoding, sampled output distributed as the target, no recompiles, row independence."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import BIGRAM, TinyDecoder, generate, lookup
from jaxsample.decoding.lookup import prompt_lookup_generate, propose
from tests._helpers import assert_sequences_follow, bigram_sequence_probs


def _vllm_propose(tokens, min_n, max_n, k):
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` by brute force (earliest longest match)."""
    n_tok = len(tokens)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = tokens[n_tok - n :]
        for i in range(0, n_tok - n):  # windows ending before the last token
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + k]
    return []


def _propose_rows(rows, min_n, max_n, k):
    width = max(len(r) for r in rows) + 2
    ctx = np.full((len(rows), width), -1, np.int32)
    for i, r in enumerate(rows):
        ctx[i, : len(r)] = r
    lengths = jnp.array([len(r) for r in rows])
    drafts, count = jax.jit(propose, static_argnums=(2, 4))(jnp.asarray(ctx), lengths, k, jnp.int32(min_n), max_n)
    return [list(np.asarray(drafts)[i, : int(count[i])]) for i in range(len(rows))]


def test_propose_hand_cases():
    # vLLM's docstring: [1,2,3,4,2,3], min 2, max 3, k 4 -> [4, 2, 3]
    assert _propose_rows([[1, 2, 3, 4, 2, 3]], 2, 3, 4) == [[4, 2, 3]]
    # longest wins over earliest: [5,1,2] occurs once, [2] occurs earlier
    assert _propose_rows([[2, 9, 5, 1, 2, 7, 8, 5, 1, 2]], 1, 3, 2) == [[7, 8]]
    # earliest among equally long matches; no match; too short for min_n
    assert _propose_rows([[4, 6, 4, 7, 4]], 1, 2, 1) == [[6]]
    assert _propose_rows([[1, 2, 3]], 1, 2, 3) == [[]]
    assert _propose_rows([[1, 2, 1, 2]], 3, 3, 3) == [[]]
    assert _propose_rows([[7, 7, 7]], 1, 2, 3) == [[7]]


@pytest.mark.parametrize("min_n,max_n,k", [(1, 2, 3), (2, 4, 5), (1, 1, 2)])
def test_propose_matches_vllm_rule_on_random_contexts(min_n, max_n, k):
    rng = np.random.default_rng(min_n * 10 + max_n)
    rows = [list(rng.integers(0, 3, size=rng.integers(1, 14))) for _ in range(64)]
    got = _propose_rows(rows, min_n, max_n, k)
    for r, g in zip(rows, got):
        assert g == _vllm_propose(r, min_n, max_n, k), r


def test_propose_matches_hf_prompt_lookup_candidate_generator():
    torch = pytest.importorskip("torch")
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = np.random.default_rng(3)
    rows = [list(rng.integers(0, 4, size=rng.integers(2, 16))) for _ in range(40)]
    got = _propose_rows(rows, 1, 3, 4)
    for r, g in zip(rows, got):
        gen = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor([99]), num_output_tokens=4, max_matching_ngram_size=3, max_length=1000
        )
        cand, _ = gen.get_candidates(torch.tensor([r]))
        assert g == cand[0, len(r) :].tolist(), r


NET = TinyDecoder(vocab_size=12, d_model=16, num_layers=2, num_heads=2)


@functools.cache
def net_params():
    return jax.jit(NET.init_params)(jax.random.key(10), scale=3.0)


def test_greedy_equals_greedy_decoding_with_eos_stops_and_ragged_prompts():
    prompts = jnp.array([[1, 2, 3, 4, 1, 2, 3], [5, 6, 5, 6, -1, -1, -1], [7, 7, 0, -1, -1, -1, -1]])
    kw = dict(
        max_new_tokens=jnp.array([12, 9, 12]),
        max_tokens=12,
        eos_ids=3,
        stop_sequences=[[9, 9]],
        min_new_tokens=jnp.array([0, 2, 0]),
    )
    ref = generate(NET.model, net_params(), prompts, **kw)
    out = prompt_lookup_generate(NET.model, net_params(), prompts, num_draft_tokens=3, prompt_lookup_max=2, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
    assert np.all(np.asarray(out.num_accepted) <= np.asarray(out.num_drafted))


def test_greedy_copy_task_accepts_drafts_and_equals_greedy():
    # a bigram table that copies: next token = token + 1 (mod V); the prompt already holds the cycle
    v = 6
    table = jnp.log(jnp.full((v, v), 0.02).at[jnp.arange(v), (jnp.arange(v) + 1) % v].set(0.9))
    prompts = jnp.array([[0, 1, 2, 3, 4, 5, 0], [3, 4, 5, 0, 1, 2, 3]])
    ref = generate(BIGRAM, {"logits": table}, prompts, max_new_tokens=10)
    out = prompt_lookup_generate(BIGRAM, {"logits": table}, prompts, num_draft_tokens=4, max_new_tokens=10)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert np.all(np.asarray(out.num_accepted) == np.asarray(out.num_drafted))
    assert np.all(np.asarray(out.num_accepted) >= 8)  # 10 tokens in at most 3 target calls


def test_source_is_searched_first():
    v = 6
    table = jnp.log(jnp.full((v, v), 0.02).at[jnp.arange(v), (jnp.arange(v) + 1) % v].set(0.9))
    kw = dict(num_draft_tokens=4, max_new_tokens=6)
    src = jnp.array([[2, 3, 4, 5, 0, 1]])
    with_src = prompt_lookup_generate(BIGRAM, {"logits": table}, [[1]], source=src, **kw)
    without = prompt_lookup_generate(BIGRAM, {"logits": table}, [[1]], **kw)
    np.testing.assert_array_equal(with_src.tokens, without.tokens)
    assert int(with_src.num_accepted[0]) >= 4 and int(without.num_accepted[0]) < int(with_src.num_accepted[0])


V = 4
TABLE = jnp.asarray(np.random.default_rng(12).standard_normal((V, V)), jnp.float32)
SAMPLER = js.chain(stages.temperature(1.0), select=stages.categorical())


def test_sampled_output_is_distributed_as_the_target():
    n_rows, n_new = 4000, 3
    prompt = jnp.tile(jnp.array([[1, 2, 1, 3, 1]]), (n_rows, 1))  # "1" occurs earlier: drafts from step 1
    out = prompt_lookup_generate(
        BIGRAM, {"logits": TABLE}, prompt, num_draft_tokens=2, max_new_tokens=n_new, sampler=SAMPLER,
        sampler_params={"seed": jnp.arange(n_rows)},
    )
    assert_sequences_follow(out.tokens, bigram_sequence_probs(TABLE, 1, n_new))
    acc = np.asarray(out.num_accepted).sum() / np.asarray(out.num_drafted).sum()
    assert 0.05 < acc < 0.95  # drafts are proposed, and some are rejected


def test_sampled_output_is_bit_identical_to_sampled_decoding():
    # a stateful chain (vLLM penalties over the history) with per-row values; drafts are accepted often
    sampler = js.chain(stages.penalties(scope="vllm"), stages.temperature(), stages.top_k(),
                       select=stages.categorical())
    prompts = jnp.array([[1, 2, 1, 3, 1, 2], [0, 2, 0, 2, 0, -1], [3, 3, 3, 3, -1, -1]])
    sp = {"seed": jnp.array([3, 4, 5]), "temperature": jnp.array([0.7, 1.0, 0.3]),
          "repetition_penalty": jnp.array([1.0, 1.3, 1.1]), "top_k": jnp.array([0, 3, 2])}
    kw = dict(max_new_tokens=10, sampler=sampler, sampler_params=sp, eos_ids=0, min_new_tokens=2)
    ref = generate(BIGRAM, {"logits": TABLE}, prompts, **kw)
    out = prompt_lookup_generate(BIGRAM, {"logits": TABLE}, prompts, num_draft_tokens=3, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
    assert int(out.num_accepted.sum()) >= 3


def test_rows_are_independent_of_the_batch_and_values_never_recompile():
    prompts = jnp.array([[1, 2, 1, 3, 1], [0, 2, 0, 2, 0], [3, 3, 3, 3, 3]])
    kw = dict(num_draft_tokens=2, max_tokens=6, sampler=SAMPLER)
    before = lookup._decode_jit._cache_size()
    full = prompt_lookup_generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=6,
                                  sampler_params={"seed": jnp.array([7, 8, 9])}, **kw)
    again = prompt_lookup_generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=jnp.array([6, 5, 4]),
                                   prompt_lookup_min=jnp.array([1, 2, 2]),
                                   sampler_params={"seed": jnp.array([1, 2, 3])}, **kw)
    assert lookup._decode_jit._cache_size() - before == 1
    assert np.asarray(again.lengths).tolist() == [6, 5, 4]
    moved = prompt_lookup_generate(BIGRAM, {"logits": TABLE}, prompts[jnp.array([1, 2, 0])], max_new_tokens=6,
                                   sampler_params={"seed": jnp.array([8, 9, 7])}, **kw)
    np.testing.assert_array_equal(moved.tokens, full.tokens[jnp.array([1, 2, 0])])  # same rows, other slots
    assert lookup._decode_jit._cache_size() - before == 1


def test_invalid_arguments():
    p = {"logits": TABLE}
    with pytest.raises(ValueError, match="num_draft_tokens"):
        prompt_lookup_generate(BIGRAM, p, [[1]], num_draft_tokens=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        prompt_lookup_generate(BIGRAM, p, [[1]], prompt_lookup_max=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        prompt_lookup_generate(BIGRAM, p, [[1]], prompt_lookup_max=2, prompt_lookup_min=3, max_new_tokens=2)
    with pytest.raises(ValueError, match="source"):
        prompt_lookup_generate(BIGRAM, p, [[1]], source=jnp.zeros((2, 3), jnp.int32), max_new_tokens=2)
