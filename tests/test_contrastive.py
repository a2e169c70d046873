"""Contrastive search: equals a plain-Python reference (bigram with hidden states, and a transformer
recomputed from scratch every step), alpha = 0 is greedy, stopping rules apply."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample.decoding import BIGRAM, TinyDecoder, contrastive_search, generate

V, D = 8, 4
RNG = np.random.default_rng(7)
PARAMS = {
    "logits": jnp.asarray(RNG.standard_normal((V, V)), jnp.float32),
    "hidden": jnp.asarray(RNG.standard_normal((V, D)), jnp.float32),
}


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _reference(step_fn, prompt, k, alpha, n):
    """HF's loop: top-k of softmax, score (1 - a) p - a max cos(h_c, context), context grows."""
    context, seq, out = list(step_fn(prompt, None)[1]), list(prompt), []
    probs = step_fn(prompt, None)[0]
    for _ in range(n):
        cands = np.argsort(-probs, kind="stable")[:k]
        best, best_score, best_next = None, -np.inf, None
        for c in cands:
            next_probs, hiddens = step_fn(seq, int(c))
            cos = np.max(_unit(np.asarray(context)) @ _unit(hiddens[-1]))
            score = (1 - alpha) * probs[c] - alpha * cos
            if score > best_score:
                best, best_score, best_next = int(c), score, (next_probs, hiddens[-1])
        out.append(best)
        seq.append(best)
        context.append(best_next[1])
        probs = best_next[0]
    return out


def _bigram_step(seq, cand):
    toks = list(seq) + ([] if cand is None else [cand])
    logits, hidden = np.asarray(PARAMS["logits"]), np.asarray(PARAMS["hidden"])
    return np.asarray(jax.nn.softmax(logits[toks[-1]])), [hidden[t] for t in toks]


@pytest.mark.parametrize("k,alpha", [(2, 0.6), (4, 0.3)])
def test_matches_reference_on_bigram_with_ragged_prompts(k, alpha):
    prompts = [[1, 2, 3], [5], [0, 7]]
    padded = np.full((3, 3), -1)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    out = contrastive_search(BIGRAM, PARAMS, padded, top_k=k, penalty_alpha=alpha, max_new_tokens=6)
    for b, p in enumerate(prompts):
        assert list(np.asarray(out.tokens[b])) == _reference(_bigram_step, p, k, alpha, 6)


NET = TinyDecoder(vocab_size=11, d_model=16, num_layers=2, num_heads=2)


@functools.cache
def net_params():
    return jax.jit(NET.init_params)(jax.random.key(8), scale=2.0)


def test_matches_full_recomputation_on_a_transformer():
    width = 10
    apply = jax.jit(NET.apply_step)

    def step(seq, cand):
        toks = list(seq) + ([] if cand is None else [cand])
        padded = np.zeros((1, width), np.int32)
        padded[0, : len(toks)] = toks
        pos = np.where(np.arange(width) < len(toks), np.arange(width), -1)[None]
        o = apply(net_params(), jnp.asarray(padded), jnp.asarray(pos), NET.init_cache(1, width))
        probs = np.asarray(jax.nn.softmax(o.logits[0, len(toks) - 1]))
        return probs, list(np.asarray(o.hidden[0, : len(toks)]))

    prompts = [[1, 2, 3, 4], [6, 6]]
    out = contrastive_search(
        NET.model, net_params(), [[1, 2, 3, 4], [6, 6, -1, -1]], top_k=3, penalty_alpha=0.5, max_new_tokens=5
    )
    for b, p in enumerate(prompts):
        assert list(np.asarray(out.tokens[b])) == _reference(step, p, 3, 0.5, 5)


def test_alpha_zero_is_greedy_and_stopping_rules_apply():
    prompt = [[3, 1], [4, -1]]
    greedy = generate(BIGRAM, PARAMS, prompt, max_new_tokens=jnp.array([7, 3]), max_tokens=7, eos_ids=2)
    out = contrastive_search(
        BIGRAM,
        PARAMS,
        prompt,
        top_k=3,
        penalty_alpha=0.0,
        max_new_tokens=jnp.array([7, 3]),
        max_tokens=7,
        eos_ids=2,
        logprobs=True,
    )
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_array_equal(out.lengths, greedy.lengths)
    np.testing.assert_array_equal(out.finish_reason, greedy.finish_reason)
    assert out.logprobs is not None


def test_needs_hidden_states_and_valid_arguments():
    with pytest.raises(ValueError, match="hidden"):
        contrastive_search(
            BIGRAM, {"logits": PARAMS["logits"]}, [[1]], top_k=2, penalty_alpha=0.5, max_new_tokens=2
        )
    with pytest.raises(ValueError, match="penalty_alpha"):
        contrastive_search(BIGRAM, PARAMS, [[1]], top_k=2, penalty_alpha=1.5, max_new_tokens=2)
    with pytest.raises(ValueError, match="top_k"):
        contrastive_search(BIGRAM, PARAMS, [[1]], top_k=V + 1, penalty_alpha=0.5, max_new_tokens=2)
