"""Parity with HuggingFace's own processors (skipped unless torch and transformers are importable)."""

import numpy as np
import pytest

import jax.numpy as jnp

import jaxsample as js
from tests._helpers import LazyModule

torch = LazyModule("torch")  # imported by the worker that runs these tests, not at collection
hf = LazyModule("transformers.generation.logits_process")

B, V, PROMPT = 3, 12, 4


def _scores(seed=0):
    return np.random.default_rng(seed).normal(size=(B, V)).astype(np.float32)


def _hf(processor, scores, cur_len):
    input_ids = torch.zeros((scores.shape[0], cur_len), dtype=torch.long)
    return processor(input_ids, torch.tensor(scores)).numpy()


@pytest.mark.parametrize("position", [0, 2, 3, 7])
def test_min_new_tokens(position):
    proc = hf.MinNewTokensLengthLogitsProcessor(PROMPT, 3, [0, 5])
    s = _scores()
    np.testing.assert_array_equal(js.min_tokens(s, position, 3, [0, 5]), _hf(proc, s, PROMPT + position))


@pytest.mark.parametrize("position", [0, 1])
def test_forced_bos_and_eos(position):
    s = _scores(1)
    # encoder-decoder: cur_len 1 (decoder start token) is our position 0
    want = _hf(hf.ForcedBOSTokenLogitsProcessor(4), s, 1 + position)
    np.testing.assert_array_equal(js.forced_bos(s, position, 4), want)
    proc = hf.ForcedEOSTokenLogitsProcessor(PROMPT + 2, [3, 7])
    np.testing.assert_array_equal(js.forced_eos(s, position, 2, [3, 7]), _hf(proc, s, PROMPT + position))


@pytest.mark.parametrize("position", [1, 2, 6])
def test_exponential_decay(position):
    proc = hf.ExponentialDecayLengthPenalty((2, 1.3), [1, 2], PROMPT)
    s = _scores(2)
    np.testing.assert_allclose(
        js.exponential_decay_length_penalty(s, position, 2, 1.3, [1, 2]), _hf(proc, s, PROMPT + position), rtol=1e-6
    )


@pytest.mark.parametrize("position", [0, 1])
def test_suppress_tokens(position):
    s = _scores(3)
    np.testing.assert_array_equal(js.suppress_tokens(s, [2, 9]), _hf(hf.SuppressTokensLogitsProcessor([2, 9]), s, 5))
    proc = hf.SuppressTokensAtBeginLogitsProcessor([1, 4], PROMPT)
    np.testing.assert_array_equal(js.suppress_tokens_at_begin(s, [1, 4], position), _hf(proc, s, PROMPT + position))


def test_inf_nan_remove_and_normalization():
    s = _scores(4)
    s[0, 1], s[1, 2], s[2, 3] = np.nan, np.inf, -np.inf
    np.testing.assert_array_equal(js.remove_inf_nan(s), _hf(hf.InfNanRemoveLogitsProcessor(), s, 1))
    s = _scores(5)
    np.testing.assert_allclose(js.log_softmax(s), _hf(hf.LogitNormalization(), s, 1), rtol=1e-5, atol=1e-6)


def test_sequence_bias_single_tokens():
    try:
        proc = hf.SequenceBiasLogitsProcessor(sequence_bias=[[[3], 2.5], [[7], -1.0]])
    except (TypeError, ValueError):
        proc = hf.SequenceBiasLogitsProcessor(sequence_bias={(3,): 2.5, (7,): -1.0})
    s = _scores(6)
    np.testing.assert_allclose(js.logit_bias(s, ids=[3, 7], values=[2.5, -1.0]), _hf(proc, s, 3), rtol=1e-6)


def test_classifier_free_guidance_forms():
    cond, uncond = _scores(7), _scores(8)

    class Out(dict):  # HF reads `.logits` and calls `.get("past_key_values")` (4.x) or `.get("cache")` (5.x)
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

    def model(input_ids, attention_mask=None, use_cache=True, **cache):  # `past_key_values=` or `cache=`
        return Out(torch.tensor(uncond)[:, None, :])

    proc = hf.UnbatchedClassifierFreeGuidanceLogitsProcessor(1.7, model, torch.zeros((B, 1), dtype=torch.long))
    want = _hf(proc, cond, 2)
    np.testing.assert_allclose(js.classifier_free_guidance(cond, uncond, 1.7), want, rtol=1e-5, atol=1e-5)
    proc = hf.ClassifierFreeGuidanceLogitsProcessor(3.0)
    stacked = np.concatenate([cond, uncond])
    got = proc(torch.zeros((B, 2), dtype=torch.long), torch.tensor(stacked)).numpy()
    np.testing.assert_allclose(js.classifier_free_guidance_logits(jnp.asarray(stacked), None, 3.0), got, rtol=1e-6)
