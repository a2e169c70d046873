"""Teacher-forced scoring: against direct computation (bigram), against generate's own log-probs
(TinyDecoder), per-row independence, no recompiles, and against HF GPT-2 (torch) when installed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import BIGRAM, Model, TinyDecoder, generate
from jaxsample.scoring import score_continuations, score_tokens
from tests._helpers import counting_model

V = 7
TABLE = jax.random.normal(jax.random.key(1), (V, V)) * 2
TOKENS = jnp.array([[1, 2, 3, 4, 5, 6], [6, 5, -1, -1, -1, -1], [0, 0, 1, -1, -1, -1]])


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - np.log(np.sum(np.exp(x - x.max(-1, keepdims=True)), -1, keepdims=True)) - x.max(-1, keepdims=True)


def test_bigram_scores_equal_direct_computation():
    s = score_tokens(BIGRAM, {"logits": TABLE}, TOKENS, start=jnp.array([1, 1, 2]), top_n=3)
    lp = _log_softmax(TABLE)
    toks = np.asarray(TOKENS)
    for b, (start, n) in enumerate([(1, 6), (1, 2), (2, 3)]):
        for t in range(6):
            if not start <= t < n:
                assert not s.scored[b, t] and s.logprobs[b, t] == 0
                continue
            row = lp[toks[b, t - 1]]
            assert s.scored[b, t]
            np.testing.assert_allclose(s.logprobs[b, t], row[toks[b, t]], atol=1e-5)
            assert s.ranks[b, t] == np.sum(row >= row[toks[b, t]])
            np.testing.assert_array_equal(s.top_ids[b, t], np.argsort(-row, kind="stable")[:3])
            np.testing.assert_allclose(s.top_logprobs[b, t], np.sort(row)[::-1][:3], atol=1e-5)


def test_continuations_are_ragged_and_rows_independent():
    prompts = jnp.array([[1, 2, 3], [4, -1, -1]])
    conts = jnp.array([[4, 5], [5, 6]])
    c = score_continuations(BIGRAM, {"logits": TABLE}, prompts, conts, continuation_lengths=jnp.array([1, 2]))
    lp = _log_softmax(TABLE)
    np.testing.assert_allclose(c.logprobs, [[lp[3, 4], 0.0], [lp[4, 5], lp[5, 6]]], atol=1e-5)
    np.testing.assert_allclose(c.total, [lp[3, 4], lp[4, 5] + lp[5, 6]], atol=1e-5)
    assert c.lengths.tolist() == [1, 2]
    alone = score_continuations(BIGRAM, {"logits": TABLE}, prompts[1:, :1], conts[1:])
    np.testing.assert_allclose(alone.logprobs[0], c.logprobs[1], atol=1e-6)


@pytest.fixture(scope="module")
def tiny():
    net = TinyDecoder(vocab_size=13, d_model=16, num_layers=2, num_heads=2)
    return Model(net.apply_step, net.init_cache), net.init_params(jax.random.key(0))


def test_scores_of_generated_tokens_equal_generate_logprobs(tiny):
    model, params = tiny
    prompts = jnp.array([[1, 2, 3, 4], [5, 6, -1, -1], [7, -1, -1, -1]])
    sampler = js.chain(stages.temperature(0.7), select=stages.categorical())
    out = generate(
        model, params, prompts, max_new_tokens=5, sampler=sampler, sampler_params={"seed": jnp.array([1, 2, 3])},
        logprobs=True,
    )
    raw = score_continuations(model, params, prompts, out.tokens, continuation_lengths=out.lengths)
    np.testing.assert_allclose(raw.logprobs, out.logprobs.raw, atol=2e-5)
    proc = score_continuations(model, params, prompts, out.tokens, continuation_lengths=out.lengths, temperature=0.7)
    np.testing.assert_allclose(proc.logprobs, out.logprobs.processed, atol=2e-5)


def test_new_lengths_starts_and_temperatures_never_recompile():
    counting, traces = counting_model(BIGRAM)
    for start, temp, lengths in [(1, 1.0, [6, 2, 3]), ([2, 1, 1], [0.5, 2.0, 1.0], [3, 3, 1]), (3, 0.1, [6, 6, 6])]:
        score_tokens(counting, {"logits": TABLE}, jnp.maximum(TOKENS, 0), jnp.array(lengths), start=start, temperature=temp)
    assert len(traces) == 1


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="start"):
        score_tokens(BIGRAM, {"logits": TABLE}, TOKENS, start=0)
    with pytest.raises(ValueError, match="temperature"):
        score_tokens(BIGRAM, {"logits": TABLE}, TOKENS, temperature=0.0)
    with pytest.raises(ValueError, match="continuations"):
        score_continuations(BIGRAM, {"logits": TABLE}, TOKENS, jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(ValueError, match="model"):
        score_tokens(lambda *a: None, {}, TOKENS)


def test_against_hf_gpt2_transition_scores():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    hf = transformers.GPT2LMHeadModel(cfg).eval()

    def torch_logits(tokens):
        with torch.no_grad():
            ids = torch.tensor(np.maximum(np.asarray(tokens), 0), dtype=torch.long)
            return hf(ids).logits.float().numpy()

    def apply(params, tokens, positions, cache):
        b, length = cache["tokens"].shape
        slot = jnp.where(positions >= 0, positions, length)
        rows = jnp.broadcast_to(jnp.arange(b)[:, None], tokens.shape)
        buf = cache["tokens"].at[rows, slot].set(tokens, mode="drop")
        full = jax.pure_callback(torch_logits, jax.ShapeDtypeStruct((b, length, 50), jnp.float32), buf)
        logits = jnp.take_along_axis(full, jnp.clip(positions, 0, length - 1)[..., None], axis=1)
        return BIGRAM.apply_step({"logits": jnp.zeros((1, 1))}, tokens, positions, cache)._replace(
            logits=logits, cache={"tokens": buf}
        )

    model = Model(apply, BIGRAM.init_cache)
    prompts = np.array([[3, 14, 15, 9], [2, 6, 5, 35]])
    gen = hf.generate(
        torch.tensor(prompts), attention_mask=torch.ones(2, 4, dtype=torch.long), max_new_tokens=6,
        do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
    )
    hf_scores = hf.compute_transition_scores(gen.sequences, gen.scores, normalize_logits=True).numpy()
    cont = gen.sequences[:, 4:].numpy()
    ours = score_continuations(model, None, jnp.asarray(prompts), jnp.asarray(cont))
    np.testing.assert_allclose(ours.logprobs, hf_scores, atol=1e-4)
    # prompt log-probs: a direct torch forward over the prompt
    direct = _log_softmax(torch_logits(prompts))
    s = score_tokens(model, None, jnp.asarray(prompts))
    want = np.take_along_axis(direct[:, :-1], prompts[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(s.logprobs[:, 1:], want, atol=1e-4)
