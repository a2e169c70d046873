"""``wakong.device_noise``: the on-device BART noiser against the host path and exact statistics.

* Whole-output laws: for small documents, the device's source sequences and the host path's
  (:func:`wakong.infilling.noise_example`, ``random.Random``) are two samples of one distribution
  (two-sample chi-square over the observed outcomes, fixed seeds), for word and token units, sentence
  permutation, token masking, deletion, rotation, random replacement and the dropping of trailing
  inserted masks when the source would not fit.
* Spans: the unit-level spans the noiser draws (``with_spans``) have the host path's EXACT mask rate,
  span-length pmf and per-position mask rates (:mod:`wakong.report`, :mod:`wakong._exact`), for the
  reference spec, the BART recipe's and a spec whose tail needs several words (K = 20); tolerances are
  4.5 standard errors from the sample (sequence-clustered for the pmf).
* The API: traced parameters never recompile, rows are independent of their batch position, padding
  rows, validation.
"""

import collections
import functools
import random

import jax
import numpy as np
import pytest
import scipy.stats

from tests._helpers import CountingJit
from wakong import report
from wakong.device_noise import DeviceNoiser
from wakong.infilling import NoiseConfig, SpanSpec, noise_example

Z = 4.5


class Ids:
    bos_id, pad_id, eos_id, unk_id, mask_id, decoder_start_id = 0, 1, 2, 3, 4, 2


VOCAB = np.array([30, 31, 32], np.int32)
# Two sentences of whole words (tuples of token ids): 6 words, 9 tokens.
DOC = [[(10,), (11, 12), (13,)], [(14,), (15,), (16, 17)]]


@functools.cache
def _jitted(noiser):
    """One compiled noiser per static structure, shared by the tests."""
    return jax.jit(noiser, static_argnames="with_spans")


def _documents(examples, max_len):
    """Reader-style document arrays for a list of examples (sentences of words of ids)."""
    b = len(examples)
    tokens = np.zeros((b, max_len), np.int32)
    words, sentences = np.zeros((b, max_len), bool), np.zeros((b, max_len), bool)
    lengths = np.zeros(b, np.int32)
    for row, example in enumerate(examples):
        at = 0
        for sentence in example:
            sentences[row, at] = True
            for word in sentence:
                words[row, at] = True
                tokens[row, at : at + len(word)] = word
                at += len(word)
        lengths[row] = at
    return {"tokens": tokens, "lengths": lengths, "word_starts": words, "sentence_starts": sentences}


def _bodies(features):
    """Source bodies (without BOS/EOS) as tuples."""
    ids, mask = np.asarray(features["input_ids"]), np.asarray(features["attention_mask"]).astype(bool)
    return [tuple(row[m][1:-1].tolist()) for row, m in zip(ids, mask)]


def _two_sample_p(a, b):
    """p-value of a two-sample chi-square test (equal sizes) over outcomes; rare ones pooled."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    kept, rest = [], [0, 0]
    for key in set(ca) | set(cb):
        if ca[key] + cb[key] >= 20:
            kept.append((ca[key], cb[key]))
        else:
            rest[0] += ca[key]
            rest[1] += cb[key]
    if sum(rest):
        kept.append(tuple(rest))
    o = np.asarray(kept, float)
    stat = ((o[:, 0] - o[:, 1]) ** 2 / (o[:, 0] + o[:, 1])).sum()
    return scipy.stats.chi2.sf(stat, len(o) - 1), len(o)


CONFIGS = {
    "article-words": (NoiseConfig(spans=SpanSpec(budget_rate=0.3)), 20),
    "bart-recipe-tokens": (
        NoiseConfig(spans=SpanSpec(budget_rate=0.4, poisson_rate=3.0), unit="token", permute_sentences=1.0,
                    random_ratio=0.3), 20),
    "mask-delete-rotate": (
        NoiseConfig(spans=SpanSpec(budget_rate=0.3, poisson_rate=2.0, max_span_len=4), permute_sentences=0.5,
                    mask=0.3, delete=0.2, rotate=0.5), 20),
    "inserts-dropped": (  # many zero-length spans; a source of at most 9 tokens drops trailing inserts
        NoiseConfig(spans=SpanSpec(budget_rate=0.5, poisson_rate=0.5, max_span_len=3), unit="token"), 11),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_have_the_host_paths_law(name):
    config, source_len = CONFIGS[name]
    n = 20_000
    noiser = DeviceNoiser.create(config, Ids, max_source_len=source_len, max_target_len=20, max_len=9)
    params = noiser.params(config, VOCAB)
    docs = _documents([DOC] * n, 9)
    device = _bodies(_jitted(noiser)(params, jax.random.key(1), docs))
    host = [tuple(noise_example(DOC, random.Random(i), config, mask_id=4, vocab=VOCAB,
                                max_source=source_len - 2).source) for i in range(n)]
    p, categories = _two_sample_p(device, host)
    assert categories > 5, categories
    assert p > 1e-4, f"{name}: device and host outputs differ (p = {p:.2e}, {categories} categories)"
    if name == "inserts-dropped":
        assert max(map(len, device)) == source_len - 2 and max(map(len, host)) == source_len - 2


def test_infilling_round_trip_and_mask_count():
    # Infilling only: putting each span's units back where its mask is gives the document back, and
    # the source has exactly one mask per span.
    rng = np.random.default_rng(0)
    examples = [[[tuple(rng.integers(10, 99, rng.integers(1, 3))) for _ in range(rng.integers(1, 9))]
                 for _ in range(rng.integers(1, 4))] for _ in range(300)]
    out = _spans(SpanSpec(budget_rate=0.4, poisson_rate=3.0), examples, 0, unit="word")  # shares a compilation
    bodies = _bodies(out)
    masked, inserted = np.asarray(out["span_masked"]), np.asarray(out["span_inserted"])
    for row, example in enumerate(examples):
        words = [w for s in example for w in s]
        rebuilt, i, source = [], 0, list(bodies[row])
        spans = 0
        for u in range(len(words) + 1):
            if inserted[row, u]:
                assert source[i] == 4
                i, spans = i + 1, spans + 1
            if u == len(words):
                break
            if masked[row, u]:
                if u == 0 or not masked[row, u - 1]:
                    assert source[i] == 4
                    i, spans = i + 1, spans + 1
                rebuilt.extend(words[u])
            else:
                assert tuple(source[i : i + len(words[u])]) == words[u]
                rebuilt.extend(words[u])
                i += len(words[u])
        assert i == len(source) and source.count(4) == spans
        assert rebuilt == list(np.asarray(out["labels"])[row, 1 : 1 + len(rebuilt)])


# --------------------------------------------------------------------------- spans vs exact expectations

SPECS = {
    "reference": SpanSpec(),
    "bart": SpanSpec(budget_rate=0.4, poisson_rate=3.0),
    "long-tail": SpanSpec(budget_rate=0.45, poisson_rate=6.0, max_span_len=14),  # the tail takes two words
}
MAX_LEN = 200
ROWS = {16: 6000, 64: 3000, 200: 1500}
BATCH = sum(ROWS.values())  # every call of these tests has this shape: one compilation per spec


def _spans(spec, examples, seed, unit="token"):
    """The noiser's output with unit-level spans, for documents of up to ``MAX_LEN`` tokens."""
    config = NoiseConfig(spans=spec, unit=unit)
    noiser = DeviceNoiser.create(config, Ids, max_source_len=MAX_LEN + 2, max_target_len=MAX_LEN + 2)
    examples = list(examples) + [[]] * (BATCH - len(examples))  # empty documents: padding rows
    return _jitted(noiser)(noiser.params(config), jax.random.key(seed), _documents(examples, MAX_LEN),
                           with_spans=True)


def _length_counts(masked, inserted, kmax):
    pad = np.zeros((masked.shape[0], 1), np.int8)
    edges = np.diff(np.concatenate([pad, masked.astype(np.int8), pad], axis=1), axis=1)
    rows, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    counts = np.zeros((masked.shape[0], kmax + 1), np.int64)
    np.add.at(counts, (rows, ends - starts), 1)
    counts[:, 0] += inserted.sum(axis=1)
    return counts


@pytest.mark.parametrize("name", list(SPECS))
def test_span_statistics_equal_the_exact_expectations(name):
    spec = SPECS[name]
    out = _spans(spec, [[[(7,)] * n] for n, rows in ROWS.items() for _ in range(rows)], seed=len(name))
    at = 0
    for seq_len, rows in ROWS.items():
        masked = np.asarray(out["span_masked"])[at : at + rows, :seq_len]
        inserted = np.asarray(out["span_inserted"])[at : at + rows, : seq_len + 1]
        at += rows
        _check_spans(spec, seq_len, rows, masked, inserted)


def _check_spans(spec, seq_len, rows, masked, inserted):
    rate = masked.sum(axis=1) / seq_len
    exact_rate = report.expected_mask_rate(seq_len, spec)
    assert abs(rate.mean() - exact_rate) <= Z * rate.std() / np.sqrt(rows) + 1e-12, (rate.mean(), exact_rate)
    counts = _length_counts(masked, inserted, spec.max_span_len)
    exact = report.expected_span_counts(seq_len, spec)
    per_row = counts.sum(axis=1)
    pmf = counts.sum(axis=0) / per_row.sum()
    target = exact / exact.sum()
    se = np.sqrt(((counts - pmf[None] * per_row[:, None]) ** 2).sum(axis=0)) / per_row.sum()
    se = np.maximum(se, np.sqrt(target * (1 - target) / per_row.sum()))  # lengths too rare to be seen
    assert (np.abs(pmf - target) <= Z * se + 1e-9).all(), (pmf, target)
    assert abs(per_row.mean() - exact.sum()) <= Z * per_row.std() / np.sqrt(rows) + 1e-12
    # Per-position mask rates against the exact profile (every position, or the ends of long rows).
    k = seq_len if seq_len <= 64 else 12
    profile = report.expected_position_rates(seq_len, spec, k)
    for observed in (masked[:, :k], masked[:, ::-1][:, :k]):  # from the start and from the end
        p = observed.mean(axis=0)
        assert (np.abs(p - profile) <= Z * np.sqrt(profile * (1 - profile) / rows) + 1e-9).all(), (p, profile)


def test_word_units_and_a_mixture_of_lengths():
    # Word units over multi-token words, lengths uniform on [2, 40): the pooled mask rate over units.
    spec = SPECS["bart"]
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 40, 6000)
    out = _spans(spec, [[[(7, 8) if j % 3 == 0 else (9,) for j in range(k)]] for k in lengths], 9, unit="word")
    units = np.asarray(out["units"])[: len(lengths)]
    np.testing.assert_array_equal(units, lengths)
    masked = np.asarray(out["span_masked"])[: len(lengths)].sum(axis=1)
    expected = sum(report.expected_mask_rate(int(k), spec) * k for k in lengths)
    sd = np.std(masked - np.array([report.expected_mask_rate(int(k), spec) * k for k in lengths]))
    assert abs(masked.sum() - expected) <= Z * sd * np.sqrt(len(lengths))


# --------------------------------------------------------------------------- the API


def _small():
    config = NoiseConfig(spans=SpanSpec(budget_rate=0.4, poisson_rate=3.0), permute_sentences=1.0, mask=0.1,
                         delete=0.1, rotate=0.3, random_ratio=0.2)
    noiser = DeviceNoiser.create(config, Ids, max_source_len=24, max_target_len=24)
    rng = np.random.default_rng(1)
    examples = [[[tuple(rng.integers(10, 99, rng.integers(1, 3))) for _ in range(rng.integers(1, 5))]
                 for _ in range(rng.integers(1, 4))] for _ in range(8)]
    return config, noiser, _documents(examples, noiser.max_len)


# Every call below has the same shapes: one compilation, shared (and counted) by these tests.
_SMALL_CALLS = {}


def _small_call(noiser):
    if noiser not in _SMALL_CALLS:
        _SMALL_CALLS[noiser] = CountingJit(noiser)
    return _SMALL_CALLS[noiser]


def test_traced_parameters_never_recompile():
    config, noiser, docs = _small()
    variants = [config, NoiseConfig(spans=SpanSpec(budget_rate=0.2, poisson_rate=5.0), unit="token",
                                    permute_sentences=0.5, mask=0.3, delete=0.0, rotate=1.0, random_ratio=0.9)]
    counted = _small_call(noiser)
    keys = jax.random.split(jax.random.key(0), 8)
    outs = [counted(noiser.params(c, VOCAB), keys, docs) for c in variants]
    assert counted.traces == 1
    assert not np.array_equal(outs[0]["input_ids"], outs[1]["input_ids"])


def test_rows_depend_only_on_their_key_and_document():
    config, noiser, docs = _small()
    params = noiser.params(config, VOCAB)
    keys = jax.random.split(jax.random.key(5), 8)
    fn = _small_call(noiser)
    full = fn(params, keys, docs)
    perm = np.array([3, 7, 0, 5, 1, 6, 2, 4])
    permuted = fn(params, keys[perm], {k: v[perm] for k, v in docs.items()})
    alone = {k: np.where(np.arange(8).reshape((8,) + (1,) * (v.ndim - 1)) == 2, v, np.zeros_like(v))
             for k, v in docs.items()}
    single = fn(params, keys, alone)  # the other rows empty
    for key in full:
        np.testing.assert_array_equal(np.asarray(permuted[key]), np.asarray(full[key])[perm])
        np.testing.assert_array_equal(np.asarray(single[key])[2], np.asarray(full[key])[2])
    assert fn.traces == 1


def test_padding_rows_and_labels():
    config, noiser, docs = _small()
    docs = {k: np.concatenate([v[:7], np.zeros_like(v[:1])]) for k, v in docs.items()}
    out = _small_call(noiser)(noiser.params(config, VOCAB), jax.random.split(jax.random.key(0), 8), docs)
    out = {k: np.asarray(v) for k, v in out.items()}
    assert (out["input_ids"][-1] == 1).all() and (out["labels"][-1] == 1).all()
    assert not out["loss_mask"][-1].any() and not out["attention_mask"][-1].any()
    for row in range(7):
        n = int(docs["lengths"][row])
        assert out["labels"][row, : n + 2].tolist() == [0, *docs["tokens"][row, :n].tolist(), 2]
        assert out["decoder_input_ids"][row, : n + 2].tolist() == [2, 0, *docs["tokens"][row, :n].tolist()]
        assert out["loss_mask"][row].sum() == n + 2 and (out["decoder_input_ids"][row, n + 2 :] == 1).all()
        src = out["attention_mask"][row].sum()
        assert out["input_ids"][row, 0] == 0 and out["input_ids"][row, src - 1] == 2


def test_validation():
    config, noiser, docs = _small()
    with pytest.raises(ValueError, match="not compiled"):
        DeviceNoiser.create(NoiseConfig(), Ids, max_source_len=24, max_target_len=24).params(config, VOCAB)
    with pytest.raises(ValueError, match="max_span_len"):
        noiser.params(NoiseConfig(spans=SpanSpec(max_span_len=5), random_ratio=0.1), VOCAB)
    with pytest.raises(ValueError, match="replacement ids"):
        noiser.params(config, ())
    with pytest.raises(ValueError, match="max_len"):
        DeviceNoiser.create(config, Ids, max_source_len=24, max_target_len=24, max_len=23)
    with pytest.raises(ValueError, match="tokens must be"):
        noiser(noiser.params(config, VOCAB), jax.random.key(0), {**docs, "tokens": docs["tokens"][:, :5]})
    with pytest.raises(ValueError, match="max_span_len must be <= 31"):
        DeviceNoiser.create(NoiseConfig(spans=SpanSpec(max_span_len=40)), Ids, max_source_len=24, max_target_len=24)
    with pytest.raises(ValueError, match="lengths must be <="):
        noiser(noiser.params(config, VOCAB), jax.random.key(0), {**docs, "lengths": docs["lengths"] + 99})
    with pytest.raises(ValueError, match="missing"):
        noiser(noiser.params(config, VOCAB), jax.random.key(0), {"tokens": docs["tokens"]})
