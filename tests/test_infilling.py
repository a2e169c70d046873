"""Tests of wakong.infilling: span schemes, BART noises, fixed-shape encoding."""

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wakong
from tests._helpers import unmask
from wakong._distribution import span_length_cdfs
from wakong.infilling import (
    NoiseConfig,
    SpanSpec,
    _sample,
    _scheme,
    _shuffle,
    apply_span_masks,
    delete_units,
    infill,
    mask_units,
    noise_example,
    pad_features,
    permute_sentences,
    replace_random,
    rotate,
    scheme_masks,
    span_scheme,
    with_specials,
)
from wakong.report import expected_mask_rate, expected_span_counts

BART = SpanSpec(budget_rate=0.4, poisson_rate=3.0, max_span_len=10)
SPECS = [SpanSpec(), BART, SpanSpec(0.5, 1.0, 3), SpanSpec(0.05, 8.0, 20)]


# ---------------------------------------------------------------- span schemes


def test_default_spec_is_the_reference_algorithm():
    for seed in range(50):
        for n in (0, 1, 2, 3, 7, 40, 256, 1250):
            a, b = random.Random(seed), random.Random(seed)
            expected = wakong.generate_mask_scheme(b, n) if n >= 2 else []
            assert span_scheme(a, n) == expected
            assert a.getstate() == b.getstate()  # same draws: later records are unaffected


def test_generalised_algorithm_with_reference_tables_is_bit_exact():
    """The code path of non-default specs, fed the reference tables, reproduces wakong 1.1.1."""
    cdfs = span_length_cdfs()
    for seed in range(200):
        for n in (2, 3, 5, 17, 40, 100, 257, 1250):
            a, b = random.Random(seed), random.Random(seed)
            assert _scheme(a, n, 0.188, 10, cdfs) == wakong.generate_mask_scheme(b, n)
            assert a.getstate() == b.getstate()


def _plain_scheme(rng: random.Random, n: int, spec: SpanSpec) -> list:
    """The algorithm written with random.Random's own choices / shuffle / sample (no inlining)."""
    x = n * spec.budget_rate
    budget = min(int(x) + (rng.random() < x - float(int(x))), n // 2)
    lengths = []
    while budget > 0:
        cap = min(spec.max_span_len, budget)
        lengths.append(rng.choices(range(cap + 1), cum_weights=spec.cdfs()[cap - 1])[0])
        budget -= lengths[-1] + 1
    rng.shuffle(lengths)
    slots = sorted(rng.sample(range(n - sum(lengths) - len(lengths) + 1), len(lengths)))
    offset, scheme = rng.random() < 0.5, []
    for slot, length in zip(slots, lengths):
        scheme.append((slot + offset, length))
        offset += length + 1
    return scheme


@pytest.mark.parametrize("which", range(len(SPECS)))
def test_inlined_draws_equal_random_methods_for_every_spec(which):
    """_scheme inlines choices / shuffle / sample: same schemes and generator states for any constants."""
    spec = SPECS[which]
    for seed in range(60):
        for n in (2, 3, 4, 9, 22, 61, 200, 510, 1500):
            a, b = random.Random(seed), random.Random(seed)
            assert _scheme(a, n, spec.budget_rate, spec.max_span_len, spec.cdfs()) == _plain_scheme(b, n, spec)
            assert a.getstate() == b.getstate()


def test_inlined_shuffle_and_sample_equal_random_methods():
    """Both of sample's paths (a pool for small populations, a set of picks for large ones), rejection
    at every bit length, picks in draw order."""
    for seed in range(20):
        for n, k in [(0, 0), (1, 1), (2, 1), (5, 5), (21, 3), (22, 3), (30, 6), (100, 6), (300, 40), (5000, 40),
                     (2**20 + 3, 7), (64, 64), (65, 64), (1000, 1)]:
            a, b = random.Random(seed), random.Random(seed)
            assert _sample(a.getrandbits, n, k) == b.sample(range(n), k)
            assert a.getstate() == b.getstate()
        for n in (0, 1, 2, 3, 17, 64, 65, 300):
            a, b = random.Random(seed), random.Random(seed)
            x, y = list(range(n)), list(range(n))
            _shuffle(a.getrandbits, x)
            b.shuffle(y)
            assert x == y and a.getstate() == b.getstate()
    with pytest.raises(ValueError):
        _sample(random.Random(0).getrandbits, 3, 4)


def test_permute_and_replace_draw_as_random_methods():
    for seed in range(30):
        for n, ratio in [(1, 1.0), (2, 1.0), (7, 1.0), (40, 0.5), (300, 1.0)]:
            a, b = random.Random(seed), random.Random(seed)
            chosen = b.sample(range(n), math.ceil(n * ratio))
            moved = chosen[:]
            b.shuffle(moved)
            order = list(range(n))
            for dst, src in zip(chosen, moved):
                order[dst] = src
            assert permute_sentences(list(range(n)), a, ratio) == order
            assert a.getstate() == b.getstate()


def test_short_sequences_are_never_masked_and_draw_nothing():
    for spec in SPECS:
        rng = random.Random(3)
        state = rng.getstate()
        assert span_scheme(rng, 0, spec) == span_scheme(rng, 1, spec) == []
        assert rng.getstate() == state


@given(n=st.integers(2, 600), seed=st.integers(0, 2**32), which=st.integers(0, len(SPECS) - 1))
def test_scheme_invariants(n, seed, which):
    spec = SPECS[which]
    scheme = span_scheme(random.Random(seed), n, spec)
    budget = n * spec.budget_rate
    lo, hi = min(int(budget), n // 2), min(int(budget) + 1, n // 2)
    cost = sum(s + 1 for _, s in scheme)
    assert lo <= cost <= hi + 1
    assert bool(scheme) == (cost > 0)
    assert scheme == sorted(scheme)
    for (p, s), nxt in zip(scheme, scheme[1:] + [None]):
        assert 0 <= p and p + s <= n and 0 <= s <= spec.max_span_len
        if nxt is not None:
            assert nxt[0] - (p + s) >= 2  # the reference's gap of at least two unmasked units


def test_budget_is_capped_so_placement_never_fails():
    spec = SpanSpec(0.5, 1.0, 3)
    for seed in range(2000):
        for n in (2, 3, 4, 5):
            span_scheme(random.Random(seed), n, spec)  # would raise in rng.sample without the cap


@pytest.mark.parametrize("spec,n,count", [(SpanSpec(), 64, 4000), (BART, 100, 3000), (BART, 24, 6000)])
def test_generalised_statistics_match_the_exact_expectation(spec, n, count):
    rng = random.Random(11)
    rates, spans = np.zeros(count), np.zeros((count, spec.max_span_len + 1))
    for i in range(count):
        for _, s in span_scheme(rng, n, spec):
            spans[i, s] += 1
        rates[i] = spans[i] @ np.arange(spec.max_span_len + 1) / n
    assert abs(rates.mean() - expected_mask_rate(n, spec)) <= 4.5 * rates.std() / math.sqrt(count)
    expected = expected_span_counts(n, spec)
    se = spans.std(axis=0) / math.sqrt(count) + 1e-3 / count
    assert np.all(np.abs(spans.mean(axis=0) - expected) <= 4.5 * se)


def test_spec_validation():
    for bad in (dict(budget_rate=0.0), dict(budget_rate=0.6), dict(poisson_rate=0), dict(max_span_len=0),
                dict(max_span_len=65), dict(max_span_len=2.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SpanSpec(**bad)


def test_pickled_specs_draw_in_workers_that_never_import_jax():
    import pickle
    import subprocess
    import sys

    data = pickle.dumps([SpanSpec(), BART])
    code = (
        "import pickle, random, sys; specs = pickle.loads(sys.stdin.buffer.read());"
        "from wakong.infilling import span_scheme;"
        "print([span_scheme(random.Random(42), 40, s) for s in specs], 'jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True).stdout.decode()
    expected = [span_scheme(random.Random(42), 40, s) for s in (SpanSpec(), BART)]
    assert out.strip() == f"{expected} False"


def test_tables_of_a_new_spec_are_truncated_poisson():
    pmfs = BART.pmfs()
    k = np.arange(11)
    poisson = np.exp(-3.0) * 3.0**k / np.array([math.factorial(x) for x in k])
    np.testing.assert_allclose(pmfs[-1], poisson / poisson.sum(), rtol=1e-12)
    np.testing.assert_allclose(pmfs[1, :3], poisson[:3] / poisson[:3].sum(), rtol=1e-12)
    np.testing.assert_allclose(pmfs.sum(axis=1), 1.0)


# ---------------------------------------------------------------- applying schemes


@given(n=st.integers(0, 300), seed=st.integers(0, 2**32))
def test_infill_round_trip_and_mask_count(n, seed):
    words = [f"w{i}" for i in range(n)]
    scheme = span_scheme(random.Random(seed), n)
    out = infill(words, scheme)
    assert out is not words
    assert out.count("<mask>") == len(scheme)  # one mask per span, zero-length spans included
    assert len(out) == n - sum(s for _, s in scheme) + len(scheme)
    assert unmask(out, words, scheme) == words  # every span's words back in place of its mask


def test_scheme_masks_representation():
    masked, inserted = scheme_masks([(0, 0), (2, 3), (7, 0)], 7, max_len=9)
    assert masked.astype(int).tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert inserted.astype(int).tolist() == [1, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    with pytest.raises(ValueError, match="exceeds"):
        scheme_masks([], 5, max_len=4)


@given(seed=st.integers(0, 2**32), which=st.integers(0, len(SPECS) - 1))
def test_fixed_shape_infilling_equals_list_infilling(seed, which):
    rng = random.Random(seed)
    lengths = np.array([0, 1, 2, rng.randrange(3, 40), 40])
    ids = np.arange(5 * 40).reshape(5, 40) + 10
    schemes = [span_scheme(rng, int(n), SPECS[which]) for n in lengths]
    masked, inserted = zip(*(scheme_masks(s, int(n), 40) for s, n in zip(schemes, lengths)))
    for out_len in (48, 30):
        out, out_lengths = apply_span_masks(ids, lengths, np.stack(masked), np.stack(inserted), mask_id=4, pad_id=1, out_len=out_len)
        assert out.shape == (5, out_len) and out.dtype == np.int32
        for row, (n, scheme) in enumerate(zip(lengths, schemes)):
            expected = infill(ids[row, :n].tolist(), scheme, 4)
            assert out_lengths[row] == len(expected)
            kept = min(len(expected), out_len)
            assert out[row, :kept].tolist() == expected[:kept]
            assert np.all(out[row, kept:] == 1)


def test_fixed_shape_infilling_accepts_span_mask_output():
    """The swap-in point: ``wakong.span_mask``'s (masked, inserted) feed apply_span_masks directly."""
    import jax

    lengths = np.array([0, 1, 5, 17, 32], np.int32)
    masked, inserted = (np.asarray(x) for x in wakong.span_mask(jax.random.key(0), lengths, 32))
    ids = np.arange(5 * 32).reshape(5, 32) + 10
    out, out_lengths = apply_span_masks(ids, lengths, masked, inserted, mask_id=4, pad_id=1, out_len=40)
    for row, n in enumerate(lengths):
        runs = np.sum(masked[row, :n] & ~np.concatenate([[False], masked[row, : n - 1]])) if n else 0
        assert out_lengths[row] == n - masked[row].sum() + runs + inserted[row].sum()
        assert np.sum(out[row] == 4) == runs + inserted[row].sum()
        assert [t for t in out[row] if t not in (1, 4)] == [t for t, m in zip(ids[row, :n], masked[row, :n]) if not m]


# ---------------------------------------------------------------- other BART noises


def test_permute_sentences():
    sentences = [f"s{i}" for i in range(10)]
    assert permute_sentences(sentences, random.Random(0), 0.0) == sentences
    seen = set()
    for seed in range(200):
        out = permute_sentences(sentences, random.Random(seed), 1.0)
        assert sorted(out) == sentences
        seen.add(tuple(out))
        half = permute_sentences(sentences, random.Random(seed), 0.3)
        assert sorted(half) == sentences and sum(a != b for a, b in zip(half, sentences)) <= 3
    assert len(seen) > 190
    assert permute_sentences([], random.Random(0)) == []
    with pytest.raises(ValueError, match="permute_sentences"):
        permute_sentences(sentences, random.Random(0), 1.5)


def test_rotate_is_a_uniform_nontrivial_rotation():
    units = list("abcde")
    counts = np.zeros(5)
    for seed in range(4000):
        out = rotate(units, random.Random(seed))
        offset = units.index(out[0])
        assert out == units[offset:] + units[:offset] and offset != 0
        counts[offset] += 1
    assert counts[0] == 0 and np.all(np.abs(counts[1:] - 1000) < 4.5 * math.sqrt(1000 * 0.75))
    assert rotate(["x"], random.Random(0)) == ["x"] and rotate([], random.Random(0)) == []


def test_token_masking_and_deletion_counts():
    units = ["<mask>"] + [f"u{i}" for i in range(19)]
    for seed in range(50):
        masked = mask_units(units, random.Random(seed), 0.15)
        assert sum(a != b for a, b in zip(masked, units)) == math.ceil(19 * 0.15)
        assert masked[0] == "<mask>"
        kept = delete_units(units, random.Random(seed), 0.3)
        assert len(kept) == 20 - math.ceil(19 * 0.3) and kept[0] == "<mask>"
        assert kept == [u for u in units if u in kept]  # order preserved
    assert mask_units(units, random.Random(0), 0.0) == units == delete_units(units, random.Random(0), 0.0)


def test_random_replacement_only_touches_masks():
    ids = [4, 7, 4, 8] * 500
    out = replace_random(ids, random.Random(0), 0.1, mask_id=4, vocab=np.arange(100, 110))
    changed = [b for a, b in zip(ids, out) if a != b]
    assert all(a == 4 for a, b in zip(ids, out) if a != b) and all(100 <= b < 110 for b in changed)
    assert all(isinstance(b, int) for b in out)
    assert abs(len(changed) - 100) < 4.5 * math.sqrt(1000 * 0.09)
    with pytest.raises(ValueError, match="vocabulary"):
        replace_random(ids, random.Random(0), 0.1, mask_id=4, vocab=[])


# ---------------------------------------------------------------- composed noising

SENTENCES = [[(10,), (11, 12), (13,)], [(20,), (21,), (22, 23, 24), (25,)], [(30,), (31,)]]
TARGET = [10, 11, 12, 13, 20, 21, 22, 23, 24, 25, 30, 31]


def test_noise_example_word_level_masks_whole_words():
    for seed in range(100):
        out = noise_example(SENTENCES, random.Random(seed), NoiseConfig(), mask_id=4)
        assert out.target == TARGET and out.n_units == 9
        words = [w for s in SENTENCES for w in s]
        assert out.source == [t for w in infill(words, out.scheme, (4,)) for t in w]


def test_noise_example_token_level():
    for seed in range(100):
        out = noise_example(SENTENCES, random.Random(seed), NoiseConfig(unit="token"), mask_id=4)
        assert out.n_units == 12 and out.source == infill(TARGET, out.scheme, 4)


def test_noise_example_permutation_only_permutes_sentences():
    flat = [tuple(t for w in s for t in w) for s in SENTENCES]
    orders = set()
    for seed in range(60):
        out = noise_example(SENTENCES, random.Random(seed), NoiseConfig(infill=False, permute_sentences=1.0), mask_id=4)
        assert out.target == TARGET and out.scheme == []
        pieces, i = [], 0
        while i < len(out.source):  # every sentence starts with a distinct id
            piece = next(f for f in flat if f[0] == out.source[i])
            assert tuple(out.source[i : i + len(piece)]) == piece
            pieces.append(flat.index(piece))
            i += len(piece)
        assert sorted(pieces) == [0, 1, 2]
        orders.add(tuple(pieces))
    assert len(orders) == 6


def test_noise_example_is_deterministic_and_pinned():
    """Golden output: change only deliberately (it fixes the order of the random draws)."""
    config = NoiseConfig(spans=BART, unit="token", permute_sentences=1.0, rotate=0.5, delete=0.1, mask=0.1, random_ratio=0.5)
    run = lambda: noise_example(SENTENCES, random.Random(2024), config, mask_id=4, vocab=range(100, 200))  # noqa: E731
    assert run() == run()
    assert run() == GOLDEN


GOLDEN = ([24, 4, 10, 11, 169, 21, 22, 23], TARGET, 12, [(3, 4)], 0)


def test_max_source_leaves_out_trailing_inserted_masks_only():
    spec = SpanSpec(budget_rate=0.5, poisson_rate=0.3, max_span_len=3)  # mostly zero-length spans
    config = NoiseConfig(spans=spec, unit="token")
    dropped = 0
    for seed in range(300):
        free = noise_example(SENTENCES, random.Random(seed), config, mask_id=4)
        out = noise_example(SENTENCES, random.Random(seed), config, mask_id=4, max_source=len(TARGET))
        assert len(out.source) <= len(TARGET) and out.target == TARGET
        assert out.source == infill(TARGET, out.scheme, 4)  # every remaining mask keeps its span
        removed = [span for span in free.scheme if span not in out.scheme]
        assert len(removed) == out.dropped_inserts and all(s == 0 for _, s in removed)
        inserts = [span for span in free.scheme if span[1] == 0]
        assert removed == inserts[len(inserts) - len(removed) :]  # the last inserted masks
        dropped += out.dropped_inserts
    assert dropped > 0


def test_noise_config_validation():
    with pytest.raises(ValueError, match="unit"):
        NoiseConfig(unit="char")
    for name in ("permute_sentences", "rotate", "delete", "mask", "random_ratio"):
        with pytest.raises(ValueError, match=name):
            NoiseConfig(**{name: 1.5})


# ---------------------------------------------------------------- fixed-shape encoding


def test_with_specials_keeps_eos_when_cutting():
    assert with_specials([5, 6, 7], 0, 2, 5) == [0, 5, 6, 7, 2]
    assert with_specials([5, 6, 7], 0, 2, 4) == [0, 5, 6, 2]
    assert with_specials([], 0, 2, 2) == [0, 2]
    with pytest.raises(ValueError, match="max_len"):
        with_specials([5], 0, 2, 1)


def test_pad_features_hand_computed():
    f = pad_features([0, 9, 4, 2], [0, 9, 7, 8, 2], pad_id=1, decoder_start_id=2, max_source_len=6, max_target_len=7)
    assert f["input_ids"].tolist() == [0, 9, 4, 2, 1, 1]
    assert f["attention_mask"].tolist() == [1, 1, 1, 1, 0, 0]
    assert f["labels"].tolist() == [0, 9, 7, 8, 2, 1, 1]
    assert f["decoder_input_ids"].tolist() == [2, 0, 9, 7, 8, 1, 1]
    assert f["loss_mask"].tolist() == [True] * 5 + [False] * 2  # no loss after EOS (bart-base-jax's bug)
    assert f["decoder_attention_mask"].tolist() == [1] * 5 + [0] * 2
    assert {k: v.dtype for k, v in f.items()} == {
        "input_ids": np.int32, "attention_mask": np.int32, "decoder_input_ids": np.int32,
        "decoder_attention_mask": np.int32, "labels": np.int32, "loss_mask": np.bool_,
    }


def test_pad_features_exact_fit_and_overflow():
    f = pad_features([0, 5, 2], [0, 5, 2], pad_id=1, decoder_start_id=2, max_source_len=3, max_target_len=3)
    assert f["labels"][-1] == 2 and f["loss_mask"].all() and f["decoder_input_ids"].tolist() == [2, 0, 5]
    with pytest.raises(ValueError, match="does not fit"):
        pad_features([0, 5, 6, 2], [0, 2], pad_id=1, decoder_start_id=2, max_source_len=3, max_target_len=3)
