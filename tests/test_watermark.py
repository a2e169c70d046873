"""Greenlist watermark (HF WatermarkLogitsProcessor / WatermarkDetector) and torch's random streams."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample
from jaxsample import _torch_rng, presets, stages
from jaxsample.chain import chain
from jaxsample.watermark import _lefthash_seed, _self_table, _selfhash_seed
from tests._helpers import CountingJit, sample_noise

KEY = 15485863
_wm = jax.jit(jaxsample.watermark, static_argnames=("hashing_key", "seeding_scheme", "context_width"))


# ------------------------------------------------------------------------- torch's random streams
def test_mt19937_reference_values():
    # The reference mt19937 (Matsumoto & Nishimura): default seed 5489 -> 3499211612, 581869302, ...
    out = np.asarray(_torch_rng.mt19937(jnp.uint32(5489), 3)).tolist()
    assert out == [3499211612, 581869302, 3890346734]
    for seed in (0, 1, KEY * 7 % 2**32):  # several twists
        ref = _torch_rng.mt19937_numpy(seed, 1500)
        np.testing.assert_array_equal(np.asarray(_torch_rng.mt19937(jnp.uint32(seed), 1500)), ref)


@functools.lru_cache(maxsize=None)
def _prefix(n):
    return jax.jit(lambda s, g: _torch_rng.randperm_prefix_mask(s, n, g))


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_randperm_prefix_mask_is_the_fisher_yates_prefix(n):
    for seed in (0, 3, KEY * 11):
        perm = _torch_rng.randperm_numpy(seed, n)
        for g in sorted({0, 1, n // 4, n // 2, n - 1, n}):
            want = np.zeros(n, bool)
            want[perm[:g]] = True
            got = np.asarray(_prefix(n)(jnp.uint32(seed % 2**32), jnp.int32(g)))
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} seed={seed} G={g}")


def test_lefthash_seed_is_pythons_modulo():
    toks = np.array([0, 1, 5, 49999, 2**31 - 1])
    for key in (KEY, 12345, 2**62 + 3, 2**63 - 1):
        got = np.asarray(_lefthash_seed(jnp.asarray(toks, jnp.int32), key)).tolist()
        assert got == [(key * int(t)) % (2**64 - 1) % 2**32 for t in toks], key


def _selfhash_reference(window, cand, key, table):
    def wrap(v):  # torch int64 arithmetic
        v %= 2**64
        return v - 2**64 if v >= 2**63 else v

    b = int(table[cand])
    seed = min(wrap(wrap(key * int(table[t])) * b) for t in list(window) + [cand])
    return seed % (2**64 - 1) % 2**32


def test_selfhash_seed_wraps_like_int64():
    rng = np.random.default_rng(0)
    for key in (KEY, 2**62 + 3):  # products wrap around int64
        table = rng.integers(1, 1_000_004, 5000).astype(np.uint32)  # any factors in HF's range
        win = rng.integers(0, 5000, (20, 2))
        cand = rng.integers(0, 5000, 20)
        got = np.asarray(_selfhash_seed(jnp.asarray(win), jnp.asarray(cand), key, jnp.asarray(table)))
        want = [_selfhash_reference(w, c, key, table) for w, c in zip(win, cand)]
        assert got.tolist() == want
    table = _self_table(KEY, 5000)
    assert table.min() >= 1 and table.max() <= 1_000_003 and len(set(table.tolist())) == 5000


# ------------------------------------------------------------------------------- the processor
def test_watermark_hand_case():
    # V = 8, gamma = 0.5: the 4 first entries of randperm(8) seeded with KEY * 3 get +1.
    out = np.asarray(_wm(jnp.zeros(8), jnp.array([-1, 3]), 0.5, 1.0))
    green = _torch_rng.randperm_numpy(KEY * 3, 8)[:4]
    want = np.zeros(8)
    want[green] = 1.0
    np.testing.assert_array_equal(out, want)
    # too short a history: unchanged (context_width 2, one token); -inf stays -inf
    x = jnp.array([0.0, -jnp.inf, 1.0, 2.0])
    np.testing.assert_array_equal(_wm(x, jnp.array([-1, 3]), 0.5, 1.0, context_width=2), x)


def test_watermark_selfhash_biases_only_self_green_top_tokens():
    v = 64
    x = jnp.arange(v, dtype=jnp.float32)[::-1] * 0.01  # distinct, token 0 best
    hist = jnp.array([5, 9])
    out = np.asarray(_wm(x, hist, 0.25, 2.0, seeding_scheme="selfhash", context_width=2))
    table = _self_table(KEY, v)
    biased = set(np.flatnonzero(out != np.asarray(x)).tolist())
    want = set()
    for c in range(40):  # the 40 best tokens, each against its own greenlist
        seed = _selfhash_reference([9], c, KEY, table)
        if c in _torch_rng.randperm_numpy(seed, v)[:16]:
            want.add(c)
    assert biased == want and len(want) > 0


def test_watermark_validates():
    with pytest.raises(ValueError, match="seeding_scheme"):
        jaxsample.watermark(jnp.zeros(4), jnp.array([1]), seeding_scheme="hash")
    with pytest.raises(ValueError, match="greenlist_ratio"):
        jaxsample.watermark(jnp.zeros(4), jnp.array([1]), 1.0)
    with pytest.raises(ValueError, match="hashing_key"):
        jaxsample.watermark(jnp.zeros(4), jnp.array([1]), hashing_key=2**63)
    with pytest.raises(ValueError, match="context_width"):
        jaxsample.watermark(jnp.zeros(4), jnp.array([1]), context_width=0)


def _watermark_sampler(scheme="lefthash", width=1):
    return chain(
        stages.watermark(seeding_scheme=scheme, context_width=width, hashing_key=KEY), select=stages.greedy()
    )


def test_stage_equals_function_and_values_do_not_recompile():
    sampler = _watermark_sampler()
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((3, 50)), jnp.float32)
    prompt = jnp.asarray(rng.integers(0, 50, (3, 4)), jnp.int32)
    process = CountingJit(lambda x, s, p: sampler.process(x, s, p)[0])
    for ratio, bias in ((0.25, 2.0), (np.array([0.1, 0.5, 0.9]), np.array([1.0, -1.0, 4.0]))):
        params = sampler.params((3,), greenlist_ratio=ratio, watermark_bias=bias)
        state = sampler.init(params, vocab_size=50, prompt=prompt)
        got = process(logits, state, params)
        want = _wm(logits, prompt, ratio, bias)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert process.traces == 1


def test_hf_preset_wires_watermarking_config():
    p = presets.hf(do_sample=True, top_k=0, watermarking_config={"bias": 1.5, "seeding_scheme": "selfhash"})
    assert [s.name for s in p.sampler.stages] == ["watermark"]
    assert p.values["watermark_bias"] == 1.5 and p.values["greenlist_ratio"] == 0.25
    s = presets.hf(watermarking_config={"ngram_len": 3, "keys": [1, 2]}).sampler.stages
    assert [x.name for x in s] == ["synthid_watermark"]
    with pytest.raises(ValueError, match="seeding_scheme"):
        presets.hf(watermarking_config={"seeding_scheme": "x"})
    with pytest.raises(ValueError, match="unknown"):
        presets.hf(watermarking_config={"gamma": 0.5})
    with pytest.raises(ValueError, match="watermarking_config must be"):
        presets.hf(watermarking_config=3)


# ------------------------------------------------------------------------------------ detection
def test_detector_hand_case():
    # lefthash, V = 8, gamma = 0.5: score tokens 1.. against the greenlist of their predecessor.
    toks = np.array([[3, 1, 4, 1, 5, 1, 4]])
    det = jaxsample.detect_watermark(toks, vocab_size=8, greenlist_ratio=0.5)
    green = [int(b) in _torch_rng.randperm_numpy(KEY * int(a), 8)[:4] for a, b in zip(toks[0, :-1], toks[0, 1:])]
    assert det.num_tokens_scored.tolist() == [6.0] and det.num_green_tokens.tolist() == [sum(green)]
    z = (sum(green) - 3) / np.sqrt(6 * 0.25)
    np.testing.assert_allclose(det.z_score, [z], rtol=1e-12)
    # repeated bigrams (1, 4) count once
    det = jaxsample.detect_watermark(toks, vocab_size=8, greenlist_ratio=0.5, ignore_repeated_ngrams=True)
    assert det.num_tokens_scored.tolist() == [5.0]
    with pytest.raises(ValueError, match="context_width"):
        jaxsample.detect_watermark(toks[:, :2], vocab_size=8, context_width=2)
    with pytest.raises(ValueError, match="bos"):
        jaxsample.detect_watermark(np.array([[0, 1], [2, 1]]), vocab_size=8, bos_token_id=0)


# ------------------------------------------------------------------------------- against HF
def _hf():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.generation import logits_process, watermarking

    return torch, logits_process, watermarking


def test_randperm_and_randint_match_torch():
    torch, _, _ = _hf()
    for seed, n in ((0, 1), (KEY, 1000), (2**40 + 5, 257)):
        g = torch.Generator().manual_seed(seed)
        np.testing.assert_array_equal(torch.randperm(n, generator=g).numpy(), _torch_rng.randperm_numpy(seed, n))
    g = torch.Generator().manual_seed(3)
    np.testing.assert_array_equal(torch.randint(0, 2, (5000,), generator=g).numpy(), _torch_rng.randint_numpy(3, 2, 5000))


@pytest.mark.parametrize("scheme,width", [("lefthash", 3), ("selfhash", 1), ("selfhash", 3)])
def test_processor_matches_hf(scheme, width):
    torch, lp, _ = _hf()
    v, rng = 120, np.random.default_rng(width)
    fn = functools.partial(_wm, seeding_scheme=scheme, context_width=width, hashing_key=KEY)
    for ratio in (0.25, 0.5):
        hist = rng.integers(0, v, (4, 5))
        logits = rng.standard_normal((4, v)).astype(np.float32)
        ref = lp.WatermarkLogitsProcessor(v, "cpu", ratio, 1.5, KEY, scheme, width)(torch.tensor(hist), torch.tensor(logits))
        np.testing.assert_array_equal(np.asarray(fn(logits, hist, ratio, 1.5)), ref.numpy())


def test_hf_preset_accepts_hf_config_objects():
    _hf()
    from transformers import SynthIDTextWatermarkingConfig, WatermarkingConfig

    p = presets.hf(watermarking_config=WatermarkingConfig(greenlist_ratio=0.5, bias=1.0, context_width=2))
    assert p.sampler.stages == (stages.watermark(context_width=2),)
    assert p.values["greenlist_ratio"] == 0.5 and p.values["watermark_bias"] == 1.0
    cfg = SynthIDTextWatermarkingConfig(ngram_len=5, keys=[654, 400], sampling_table_size=1000)
    (stage,) = presets.hf(watermarking_config=cfg).sampler.stages
    assert stage == stages.synthid_watermark(5, (654, 400), sampling_table_size=1000)


@pytest.mark.parametrize("scheme,width", [("lefthash", 2), ("selfhash", 2)])
def test_detector_matches_hf(scheme, width):
    torch, _, wm = _hf()
    from transformers import GPT2Config, WatermarkingConfig

    v, rng = 120, np.random.default_rng(5)
    cfg = WatermarkingConfig(greenlist_ratio=0.25, seeding_scheme=scheme, context_width=width, hashing_key=KEY)
    toks = rng.integers(1, 7, (3, 25))  # few distinct tokens: repeated n-grams
    toks[:, 0] = 0
    for ignore in (False, True):
        ref = wm.WatermarkDetector(GPT2Config(vocab_size=v, bos_token_id=0, eos_token_id=1), "cpu", cfg, ignore)(
            torch.tensor(toks), return_dict=True
        )
        got = jaxsample.detect_watermark(
            toks, vocab_size=v, watermarking_config=cfg, ignore_repeated_ngrams=ignore, bos_token_id=0
        )
        for field in ("num_tokens_scored", "num_green_tokens", "green_fraction", "z_score", "p_value", "prediction"):
            np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-12, err_msg=field)


# ------------------------------------------------------------------------------------ statistics
@functools.lru_cache(maxsize=None)
def _generate(scheme, watermarked, rows=48, steps=60, vocab=500):
    """``int32[rows, steps]`` sampled from ``N(0, 2^2)`` logits, with or without the watermark."""
    parts = (stages.watermark(seeding_scheme=scheme, hashing_key=KEY),) if watermarked else ()
    return sample_noise(parts, rows, steps, vocab, 7, 1000 * watermarked, prompt=jnp.arange(rows)[:, None])


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_detection_power_and_false_positive_rate(scheme):
    # gamma = 0.25, delta = 2, 59 scored tokens per row. Measured (these seeds): mean z 7.7
    # (lefthash) and 6.2 (selfhash, which only biases the self-green tokens among the 40 best),
    # standard deviation ~1.3. Power: at least 95% of 48 rows above HF's default threshold z = 3
    # (expected ~99.9%; more than 2 misses has probability < 1e-3).
    marked = jaxsample.detect_watermark(_generate(scheme, True), vocab_size=500, seeding_scheme=scheme)
    assert marked.prediction.mean() >= 0.95
    assert np.median(marked.z_score) > 5.0
    # Unwatermarked text: z ~ N(0, 1) (binomial, slightly discrete). P(z > 4) = 3e-5 per row: no
    # false positive among 48 rows; the mean z is within 4 standard errors of 0.
    plain = jaxsample.detect_watermark(_generate(scheme, False), vocab_size=500, seeding_scheme=scheme, z_threshold=4.0)
    assert plain.prediction.sum() == 0
    assert abs(plain.z_score.mean()) < 4 / np.sqrt(48)
    assert 0.15 < plain.green_fraction.mean() < 0.35
