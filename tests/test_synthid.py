"""SynthID-Text watermark: HF SynthIDTextWatermarkLogitsProcessor semantics, g-values, masks, scores."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample
from jaxsample import _torch_rng, stages
from jaxsample.chain import chain
from tests._helpers import sample_noise

CFG = jaxsample.synthid_config(ngram_len=3, keys=[654, 400, -836, 2**62 + 9], sampling_table_size=1000,
                               sampling_table_seed=7, context_history_size=4)
_step = jax.jit(jaxsample.synthid_watermark, static_argnums=4)


def _hash(data):
    """HF's accumulate_hash in Python ints (int64 wrap-around)."""
    h = 1
    for x in data:
        h = ((h + int(x)) * 6364136223846793005 + 1) % 2**64
    return h


def _g_reference(ngram, cfg):
    table = _torch_rng.randint_numpy(cfg.sampling_table_seed, 2, cfg.sampling_table_size)
    out = []
    for key in cfg.keys:
        h = _hash(list(ngram) + [key])
        signed = h - 2**64 if h >= 2**63 else h
        out.append(int(table[signed % cfg.sampling_table_size]))  # Python's % = torch's (floor) %
    return out


def test_g_values_hand_hash():
    toks = np.array([[3, 1, 4, 1, 5, 9]])
    g = np.asarray(jaxsample.synthid_g_values(toks, CFG))
    want = [_g_reference(toks[0, i : i + 3], CFG) for i in range(4)]
    assert g.shape == (1, 4, 4) and g[0].tolist() == want


def test_scores_hand_cases():
    g = jnp.array([[[1, 0], [1, 1], [0, 0]]])
    mask = jnp.array([[True, True, False]])
    assert float(jaxsample.synthid_mean_score(g, mask)[0]) == pytest.approx(3 / 4)
    # weights (3, 1) normalised to sum to 2: (1.5, 0.5) -> (1.5 + 1.5 + 0.5) / (2 * 2)
    assert float(jaxsample.synthid_weighted_mean_score(g, mask, [3.0, 1.0])[0]) == pytest.approx(3.5 / 4)
    # default weights linspace(10, 1, D)
    d = jnp.ones((1, 2, 3))
    assert float(jaxsample.synthid_weighted_mean_score(d, jnp.ones((1, 2)))[0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="weights"):
        jaxsample.synthid_weighted_mean_score(g, mask, [1.0])


def test_mask_repetition_and_eos():
    toks = np.array([[5, 6, 5, 6, 5, 6, 7, 8]])
    m = np.asarray(jaxsample.synthid_mask(toks, CFG, eos_token_id=7))
    # contexts (5,6) (6,5) (5,6)r (6,5)r (5,6)r (6,7): n-grams ending at 7 or later are masked
    assert m[0].tolist() == [True, True, False, False, False, False]


def test_tournament_update_by_hand():
    cfg = CFG._replace(debug_mode=True)  # uniform input distribution
    v = 20
    state = jaxsample.synthid_init((1,), cfg)
    hist = jnp.array([[11, 12]])
    out, state = _step(jnp.zeros((1, v)), state, hist, jnp.array([2]), cfg)
    g = np.asarray(jaxsample.synthid_g_values(np.array([[11, 12] + [t] for t in range(v)]).reshape(v, 3), cfg))[:, 0]
    p = np.full(v, 1 / v)
    for d in range(len(cfg.keys)):
        p = p * (1 + g[:, d] - np.sum(g[:, d] * p))
    np.testing.assert_allclose(np.exp(np.asarray(out[0])), p, rtol=1e-5)
    # the same context again: repeated, the (debug: uniform ones) logits come back unchanged
    again, _ = _step(jnp.zeros((1, v)), state, hist, jnp.array([2]), cfg)
    np.testing.assert_array_equal(np.asarray(again), np.ones((1, v)))


def test_stage_threads_state_and_skips_first_calls():
    cfg = CFG._replace(skip_first_ngram_calls=True)
    sampler = chain(stages.synthid_watermark(**cfg._asdict()), select=stages.greedy())
    params = sampler.params((2,))
    state = sampler.init(params, vocab_size=30, prompt=jnp.array([[1, 2], [3, 4]]))
    fn_state = jaxsample.synthid_init((2,), cfg)
    rng = np.random.default_rng(0)
    hist = np.array([[1, 2], [3, 4]])
    sample = jax.jit(sampler.sample)
    for pos in range(5):
        logits = jnp.asarray(rng.standard_normal((2, 30)), jnp.float32)
        tokens, processed, state = sample(logits, state, params)
        want, fn_state = _step(logits, fn_state, hist, jnp.full((2,), pos), cfg)
        np.testing.assert_allclose(np.asarray(processed), np.asarray(want), rtol=1e-6)
        if pos < 2:  # the first ngram_len - 1 calls are skipped
            np.testing.assert_array_equal(np.asarray(processed), np.asarray(logits))
        hist = np.concatenate([hist, np.asarray(tokens)[:, None]], axis=1)


def test_config_validation():
    with pytest.raises(ValueError, match="keys"):
        jaxsample.synthid_config(ngram_len=3)
    with pytest.raises(ValueError, match="sampling_table_size"):
        jaxsample.synthid_config(ngram_len=3, keys=[1], sampling_table_size=2**25)
    with pytest.raises(ValueError, match="ngram_len"):
        jaxsample.synthid_config(ngram_len=0, keys=[1])


@pytest.mark.parametrize("table_size,skip,debug", [(2**16, False, False), (1000, True, False), (1000, False, True)])
def test_matches_hf(table_size, skip, debug):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import SynthIDTextWatermarkLogitsProcessor

    cfg = CFG._replace(sampling_table_size=table_size, skip_first_ngram_calls=skip, debug_mode=debug)
    proc = SynthIDTextWatermarkLogitsProcessor(**cfg._asdict(), device="cpu")
    rng = np.random.default_rng(table_size)
    b, v = 3, 40
    ids = rng.integers(0, v, (b, 3))
    state = jaxsample.synthid_init((b,), cfg)
    for pos in range(8):
        logits = rng.standard_normal((b, v)).astype(np.float32)
        logits[:, :4] = -np.inf
        ref = proc(torch.tensor(ids), torch.tensor(logits)).numpy()
        got, state = _step(logits, state, ids, np.full(b, pos), cfg)
        ref = np.where(ref <= np.finfo(np.float32).min, -np.inf, ref)  # HF writes finfo.min for p = 0
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5, err_msg=f"step {pos}")
        ids = np.concatenate([ids, rng.integers(4, 8, (b, 1))], axis=1)  # few tokens: contexts repeat
    np.testing.assert_array_equal(np.asarray(jaxsample.synthid_g_values(ids, cfg)), proc.compute_g_values(torch.tensor(ids)).numpy())
    ref_mask = proc.compute_context_repetition_mask(torch.tensor(ids)) * proc.compute_eos_token_mask(torch.tensor(ids), 6)[:, 2:]
    np.testing.assert_array_equal(np.asarray(jaxsample.synthid_mask(ids, cfg, eos_token_id=6)), ref_mask.numpy().astype(bool))
    g = torch.Generator().manual_seed(cfg.sampling_table_seed)
    np.testing.assert_array_equal(
        torch.randint(0, 2, (table_size,), generator=g).numpy(),
        _torch_rng.randint_numpy(cfg.sampling_table_seed, 2, table_size),
    )


# ------------------------------------------------------------------------------------ statistics
STAT = jaxsample.synthid_config(ngram_len=4, keys=list(range(101, 111)), context_history_size=1024)


@functools.lru_cache(maxsize=None)
def _generate(watermarked, rows=48, steps=64, vocab=500):
    parts = (stages.synthid_watermark(**STAT._asdict()),) if watermarked else ()
    return sample_noise(parts, rows, steps, vocab, 3, 1000 * watermarked, history_size=8)


@pytest.mark.slow
def test_mean_scores_separate_watermarked_text():
    # Unwatermarked g-values are fair coins: the mean score is 0.5 with standard error
    # sqrt(0.25 / (10 * 61)) = 0.02 per row. Threshold 0.5 + 4 SE = 0.58: a false positive has
    # probability 3e-5 per row (none among 48). Watermarked rows (10 tournament layers, N(0, 2^2)
    # logits) score 0.70-0.77 (measured, median 0.73); at least 90% must exceed the threshold.
    scores = {}
    for marked in (False, True):
        toks = _generate(marked)
        g = jaxsample.synthid_g_values(toks, STAT)
        mask = jaxsample.synthid_mask(toks, STAT)
        scores[marked] = (np.asarray(jaxsample.synthid_mean_score(g, mask)),
                          np.asarray(jaxsample.synthid_weighted_mean_score(g, mask)))
    threshold = 0.5 + 4 * np.sqrt(0.25 / (10 * 61))
    for plain, marked in zip(scores[False], scores[True]):
        assert abs(plain.mean() - 0.5) < 4 * 0.02 / np.sqrt(48)
        assert (plain > threshold + 0.02).sum() == 0  # weighted scores have a slightly larger SE
        assert (marked > threshold).mean() >= 0.9
