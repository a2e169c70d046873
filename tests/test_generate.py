"""generate / stream / sample_and_rank: exact greedy sequences, stopping rules, log-probs, caches,
per-row seeds and batch invariance, no recompiles, streaming == generate."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import BIGRAM, FinishReason, Model, TinyDecoder, generate, sample_and_rank, stream
from tests._helpers import assert_draws_follow, counting_model

V = 7
TABLE = np.random.default_rng(0).standard_normal((V, V)).astype(np.float32) * 2.0
PARAMS = {"logits": jnp.asarray(TABLE)}
SAMPLER = js.chain(stages.temperature(1.0), select=stages.categorical())
NET = TinyDecoder(vocab_size=13, d_model=16, num_layers=2, num_heads=2)


@functools.cache
def net_params():
    return jax.jit(NET.init_params)(jax.random.key(1), scale=3.0)


def _reference_greedy(table, prompt, max_new, eos=(), stops=(), min_new=0):
    """Plain-Python greedy decoding of the bigram table (what the loop must reproduce)."""
    last, out = prompt[-1], []
    while len(out) < max_new:
        row = table[last].copy()
        if len(out) < min_new:
            row[list(eos)] = -np.inf
        last = int(np.argmax(row))
        out.append(last)
        if len(out) >= min_new:
            if last in eos:
                return out, FinishReason.EOS
            if any(out[-len(s) :] == list(s) for s in stops if len(out) >= len(s)):
                return out, FinishReason.STOP_SEQUENCE
    return out, FinishReason.LENGTH


def _rows(out):
    return [list(np.asarray(out.tokens[b, : int(out.lengths[b])])) for b in range(out.tokens.shape[0])]


def _bigram_greedy(table, prompts, max_new, min_new=(0, 0, 0, 0), eos=(-1, -1), stops=((-1, -1), (-1, -1))):
    """Greedy generate on 4 prompts with fixed shapes, so that these tests share one compilation.

    The cache is prebuilt (as an encoder-decoder caller would pass it) instead of made by the loop.
    """
    padded = np.full((4, 4), -1)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    return generate(
        BIGRAM,
        {"logits": jnp.asarray(table)},
        padded,
        max_new_tokens=jnp.array(max_new),
        max_tokens=10,
        eos_ids=jnp.array(eos),
        stop_sequences=jnp.array(stops),
        min_new_tokens=jnp.array(min_new),
        pad_id=-2,
        cache=BIGRAM.init_cache(4, 14),
    )


def test_greedy_matches_reference_with_ragged_prompts_and_all_stop_rules():
    prompts = [[3], [1, 5, 2], [6, 6], [0, 4, 4, 2]]
    max_new, min_new = [9, 4, 8, 0], [0, 2, 3, 0]
    # EOS ids and stop sequences that actually fire: taken from the unconstrained greedy runs
    free = [_reference_greedy(TABLE, p, 9)[0] for p in prompts]
    eos = (free[0][2], -1)
    stop_seqs = [free[2][3:5], [-1, free[1][0]]]  # right-aligned, -1 = padding
    out = _bigram_greedy(TABLE, prompts, max_new, min_new, eos, stop_seqs)
    for b, p in enumerate(prompts):
        ref, reason = _reference_greedy(
            TABLE, p, max_new[b], eos[:1], [stop_seqs[0], stop_seqs[1][1:]], min_new[b]
        )
        assert _rows(out)[b] == ref
        assert int(out.finish_reason[b]) == reason
        assert np.all(np.asarray(out.tokens[b, len(ref) :]) == -2)
    assert int(out.lengths[3]) == 0 and int(out.finish_reason[3]) == FinishReason.LENGTH
    assert {FinishReason.EOS, FinishReason.LENGTH} <= set(np.asarray(out.finish_reason).tolist())


def test_min_new_tokens_masks_eos_and_counts_as_generated():
    table = np.full((V, V), -5.0, np.float32)
    table[:, 0] = 5.0  # EOS (0) always most likely
    table[:, 1] = 4.0
    out = _bigram_greedy(table, [[1], [1], [2], [2]], [6, 6, 2, 6], min_new=[0, 3, 3, 6], eos=(0, 5))
    assert _rows(out) == [[0], [1, 1, 1, 0], [1, 1], [1, 1, 1, 1, 1, 1]]
    np.testing.assert_array_equal(out.finish_reason, [FinishReason.EOS] * 2 + [FinishReason.LENGTH] * 2)


def _naive_greedy(net, params, prompt, n):
    """Greedy decoding that re-runs the whole sequence every step (no cache reuse)."""
    seq, width = list(prompt), len(prompt) + n
    apply = jax.jit(net.apply_step)
    for _ in range(n):
        toks = np.zeros((1, width), np.int32)
        toks[0, : len(seq)] = seq
        pos = np.where(np.arange(width) < len(seq), np.arange(width), -1)[None]
        logits = apply(params, jnp.asarray(toks), jnp.asarray(pos), net.init_cache(1, width)).logits
        seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    return seq[len(prompt) :]


def test_kv_cache_decoding_equals_full_recomputation_on_a_transformer():
    prompts = [[1, 2, 3, 4, 5], [7], [9, 9, 2]]
    padded = np.full((3, 5), -1)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    out = generate(NET.model, net_params(), padded, max_new_tokens=6)
    for b, p in enumerate(prompts):
        assert _rows(out)[b] == _naive_greedy(NET, net_params(), p, 6)


def test_logprobs_raw_processed_and_top_n():
    sampler = js.chain(stages.temperature(0.5), select=stages.categorical())
    out = generate(
        BIGRAM,
        PARAMS,
        [[1], [2]],
        max_new_tokens=4,
        sampler=sampler,
        sampler_params={"seed": jnp.array([3, 4]), "temperature": jnp.array([0.5, 2.0])},
        logprobs=True,
        top_logprobs=3,
    )
    temps = [0.5, 2.0]
    for b, start in enumerate([1, 2]):
        prev = start
        for i, tok in enumerate(_rows(out)[b]):
            raw = jax.nn.log_softmax(TABLE[prev])
            proc = jax.nn.log_softmax(TABLE[prev] / temps[b])
            np.testing.assert_allclose(out.logprobs.raw[b, i], raw[tok], rtol=1e-5)
            np.testing.assert_allclose(out.logprobs.processed[b, i], proc[tok], rtol=1e-5)
            np.testing.assert_array_equal(out.logprobs.top_ids[b, i], np.argsort(-TABLE[prev])[:3])
            np.testing.assert_allclose(out.logprobs.top_raw[b, i], np.sort(raw)[::-1][:3], rtol=1e-5)
            prev = tok


def test_rows_depend_only_on_their_prompt_params_and_seed():
    prompts = jnp.array([[1, 2], [3, -1], [4, 5], [6, -1]])
    seeds, temps = jnp.array([10, 11, 12, 13]), jnp.array([0.7, 1.5, 1.0, 0.3])
    full = generate(
        BIGRAM,
        PARAMS,
        prompts,
        max_new_tokens=jnp.array([5, 3, 5, 4]),
        max_tokens=5,
        sampler=SAMPLER,
        sampler_params={"seed": seeds, "temperature": temps},
    )
    perm = jnp.array([2, 0, 3, 1])
    shuffled = generate(
        BIGRAM,
        PARAMS,
        prompts[perm],
        max_new_tokens=jnp.array([5, 3, 5, 4])[perm],
        max_tokens=5,
        sampler=SAMPLER,
        sampler_params={"seed": seeds[perm], "temperature": temps[perm]},
    )
    for j, b in enumerate(np.asarray(perm)):
        np.testing.assert_array_equal(full.tokens[b], shuffled.tokens[j])
    alone = generate(
        BIGRAM,
        PARAMS,
        prompts[1:2],
        max_new_tokens=3,
        max_tokens=5,
        sampler=SAMPLER,
        sampler_params={"seed": seeds[1:2], "temperature": temps[1:2]},
    )
    np.testing.assert_array_equal(full.tokens[1], alone.tokens[0])
    assert len({tuple(np.asarray(r)) for r in full.tokens}) > 1


@pytest.mark.slow
def test_first_token_distribution_matches_tempered_softmax():
    n = 4000
    out = generate(
        BIGRAM,
        PARAMS,
        jnp.full((n, 1), 3),
        max_new_tokens=1,
        sampler=SAMPLER,
        sampler_params={"seed": jnp.arange(n), "temperature": 1.5},
    )
    assert_draws_follow(out.tokens[:, 0], jax.nn.softmax(TABLE[3] / 1.5))


COUNTING, _TRACES = counting_model(BIGRAM)


def test_new_values_never_recompile():
    prompt = jnp.array([[1, 2], [3, -1]])
    calls = [
        dict(seed=[1, 2], temperature=[0.5, 1.0], max_new=[3, 4], eos=[0, -1], stop=[[1, 2]], min_new=[0, 1]),
        dict(seed=[7, 9], temperature=[2.0, 0.0], max_new=[6, 1], eos=[3, 4], stop=[[-1, 5]], min_new=[2, 0]),
        dict(
            seed=[0, 0], temperature=[1.0, 1.0], max_new=[0, 6], eos=[-1, -1], stop=[[6, 6]], min_new=[0, 0]
        ),
    ]
    counts = []
    for c in calls:
        out = generate(
            COUNTING,
            PARAMS,
            prompt,
            max_new_tokens=jnp.array(c["max_new"]),
            max_tokens=6,
            sampler=SAMPLER,
            sampler_params={"seed": jnp.array(c["seed"]), "temperature": jnp.array(c["temperature"])},
            eos_ids=jnp.array(c["eos"]),
            stop_sequences=jnp.array(c["stop"]),
            min_new_tokens=jnp.array(c["min_new"]),
        )
        jax.block_until_ready(out)
        counts.append(len(_TRACES))
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]


def test_stream_yields_the_tokens_of_generate():
    prompts = jnp.array([[1, 2], [3, -1], [4, 5], [6, -1]])
    kw = dict(
        max_new_tokens=jnp.array([5, 3, 5, 4]),
        max_tokens=5,
        sampler=SAMPLER,
        eos_ids=2,
        sampler_params={"seed": jnp.array([5, 6, 7, 8]), "temperature": 1.3},
    )
    ref = generate(BIGRAM, PARAMS, prompts, **kw)
    chunks = list(stream(BIGRAM, PARAMS, prompts, **kw))
    got = [[int(c.tokens[b]) for c in chunks if c.emitted[b]] for b in range(4)]
    assert got == _rows(ref)
    np.testing.assert_array_equal(chunks[-1].finish_reason, ref.finish_reason)
    assert len(chunks) == int(ref.lengths.max())


def test_sample_and_rank_returns_best_of_independently_seeded_samples():
    sampler_params = {"seed": jnp.array([40, 41]), "temperature": 1.0}
    ranked = sample_and_rank(
        BIGRAM,
        PARAMS,
        [[1], [5]],
        n=2,
        best_of=6,
        max_new_tokens=4,
        sampler=SAMPLER,
        sampler_params=sampler_params,
        eos_ids=0,
    )
    for b, start in enumerate([1, 5]):
        cands = []
        for i in range(6):  # sample i is the plain sample from stream i of the prompt's seed
            one = generate(
                BIGRAM,
                PARAMS,
                [[start]],
                max_new_tokens=4,
                sampler=SAMPLER,
                eos_ids=0,
                sampler_params={"seed": sampler_params["seed"][b], "seed_stream": i},
                logprobs=True,
            )
            toks = _rows(one)[0]
            cands.append((float(jnp.sum(one.logprobs.raw[0, : len(toks)])), toks))
        best = sorted(cands, key=lambda c: -c[0])[:2]
        assert [_rows_ranked(ranked, b, j) for j in range(2)] == [c[1] for c in best]
        np.testing.assert_allclose(ranked.scores[b], [c[0] for c in best], rtol=1e-5)
        np.testing.assert_allclose(ranked.cumulative_logprob[b], [c[0] for c in best], rtol=1e-5)


def test_sample_and_rank_streams_of_adjacent_seeds_do_not_overlap():
    """With ``seed + i`` per sample, sample 1 of seed 40 was sample 0 of seed 41 (the same tokens)."""
    ranked = sample_and_rank(BIGRAM, PARAMS, [[1], [1]], n=2, best_of=2, max_new_tokens=12, sampler=SAMPLER,
                             sampler_params={"seed": jnp.array([40, 41]), "temperature": 1.0})
    by_index = {(b, int(ranked.sample_index[b, j])): _rows_ranked(ranked, b, j) for b in range(2) for j in range(2)}
    assert by_index[0, 1] != by_index[1, 0]
    alone = generate(BIGRAM, PARAMS, [[1]], max_new_tokens=12, sampler=SAMPLER, sampler_params={"seed": 41})
    assert by_index[1, 0] == _rows(alone)[0]  # sample 0 is the request alone


def _rows_ranked(out, b, j):
    return list(np.asarray(out.tokens[b, j, : int(out.lengths[b, j])]))


def test_invalid_arguments_name_the_culprit():
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(BIGRAM, PARAMS, [[1]], max_new_tokens=5, max_tokens=3)
    with pytest.raises(ValueError, match="min_new_tokens"):
        generate(BIGRAM, PARAMS, [[1]], max_new_tokens=5, min_new_tokens=-1)
    with pytest.raises(ValueError, match="prompt"):
        generate(BIGRAM, PARAMS, [1, 2], max_new_tokens=2)
    with pytest.raises(ValueError, match="at least one token"):
        generate(BIGRAM, PARAMS, [[-1, -1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="init_cache"):
        generate(Model(BIGRAM.apply_step), PARAMS, [[1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="top_q"):
        generate(BIGRAM, PARAMS, [[1]], max_new_tokens=2, sampler=SAMPLER, sampler_params={"top_q": 0.5})
    with pytest.raises(ValueError, match="stop_sequences"):
        generate(BIGRAM, PARAMS, [[1]], max_new_tokens=2, stop_sequences=[[]])
    with pytest.raises(ValueError, match="best_of"):
        sample_and_rank(BIGRAM, PARAMS, [[1]], n=3, best_of=2, max_new_tokens=2)


def test_zero_new_tokens_returns_empty_rows_and_an_empty_stream():
    out = generate(BIGRAM, PARAMS, [[1], [2]], max_new_tokens=0)
    assert out.tokens.shape == (2, 0)
    np.testing.assert_array_equal(out.lengths, [0, 0])
    np.testing.assert_array_equal(out.finish_reason, [FinishReason.LENGTH] * 2)
    assert list(stream(BIGRAM, PARAMS, [[1], [2]], max_new_tokens=0)) == []


def test_logprob_token_ids_are_recorded_at_every_step():
    """vLLM ``logprob_token_ids``: raw log-probs of given ids per step, per row, -inf for unused slots."""
    from jaxsample.decoding import DecodeRequest, run_request

    prompt = jnp.array([[1], [3]])
    ids = jnp.array([[0, 2, -1], [5, 5, 1]])
    out = generate(BIGRAM, PARAMS, prompt, max_new_tokens=4, logprob_token_ids=ids)
    req = out.logprobs.requested
    assert req.shape == (2, 4, 3)
    prev = np.concatenate([np.asarray(prompt), np.asarray(out.tokens)[:, :-1]], axis=1)  # token before each step
    raw = jax.nn.log_softmax(TABLE[prev], axis=-1)  # the bigram model's logits are TABLE[previous token]
    want = np.where(np.asarray(ids)[:, None, :] >= 0,
                    np.take_along_axis(raw, np.maximum(np.asarray(ids), 0)[:, None, :], axis=-1), -np.inf)
    np.testing.assert_allclose(req, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.logprobs.raw, np.take_along_axis(raw, np.asarray(out.tokens)[..., None], -1)[..., 0],
                               rtol=1e-5, atol=1e-6)  # the chosen tokens' log-probs are recorded too
    via = run_request(DecodeRequest.from_vllm(temperature=0.0, max_tokens=4, logprob_token_ids=[0, 2]),
                      BIGRAM, PARAMS, prompt)
    prev = np.concatenate([np.asarray(prompt), np.asarray(via.tokens)[:, :-1]], axis=1)
    raw = jax.nn.log_softmax(TABLE[prev], axis=-1)
    np.testing.assert_allclose(via.logprobs.requested, raw[..., [0, 2]], rtol=1e-5, atol=1e-6)
