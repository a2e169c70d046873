"""``wakong.span_mask`` (and the reference port) against exact statistics, plus the fixed-shape API.

Exact targets come from ``wakong._exact`` (dynamic program over the budget chain, exhaustive
enumeration for short lengths), which reproduces the tables of the research notes. Every statistical
check runs on both ``span_mask`` and ``generate_mask_scheme`` (the bit-exact port), with fixed seeds
and tolerances of 4.5 standard errors computed from the sample size; span-length pmfs use
sequence-clustered standard errors (spans of one sequence are dependent). ``@pytest.mark.slow``
repeats the key checks with large samples.
"""

import functools
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

import wakong
from tests._helpers import assert_single_trace
from wakong import _exact
from wakong import _span_mask as sm
from wakong.infilling import scheme_masks

Z = 4.5  # two-sided false-alarm rate ~7e-6 per check
SOURCES = ["span_mask", "reference"]
_masks = jax.jit(wakong.span_mask, static_argnums=2)


# --------------------------------------------------------------------------- sampling helpers


def _reference_masks(lengths, max_len, seed):
    """Masks of ``generate_mask_scheme`` (with the ``Wakong`` guard for length < 2), as numpy bools."""
    rng = random.Random(seed)
    masked = np.zeros((len(lengths), max_len), bool)
    inserted = np.zeros((len(lengths), max_len + 1), bool)
    for row, seq_len in enumerate(lengths):
        if seq_len < 2:
            continue
        scheme = wakong.generate_mask_scheme(rng, int(seq_len))
        masked[row], inserted[row] = scheme_masks(scheme, int(seq_len), max_len)
    return masked, inserted


@functools.cache
def _sample(source, lengths, max_len, seed):
    """``(masked, inserted)`` numpy arrays for a tuple of lengths, from either source (cached)."""
    lengths = np.asarray(lengths, np.int32)
    if source == "reference":
        return _reference_masks(lengths, max_len, seed)
    masked, inserted = _masks(jax.random.key(seed), lengths, max_len)
    return np.asarray(masked), np.asarray(inserted)


# The fast tier draws every group below in one call per source (one compilation of span_mask).
GROUPS = {  # name: (seq_len, rows)
    **{f"L{n}": (n, 4000) for n in [2, 3, 4, 5, 8, 16, 32, 64]},
    **{f"outcomes{n}": (n, 20_000) for n in [2, 3, 4, 5, 6, 9]},
    **{f"sym{n}": (n, 20_000) for n in [12, 40, 63]},
    "independent": (64, 20_000),
    "guard": (1, 2000),
    "empty": (0, 2000),
}


def _group(source, name):
    offsets = np.cumsum([0] + [rows for _, rows in GROUPS.values()])
    lengths = tuple(n for n, rows in GROUPS.values() for _ in range(rows))
    masked, inserted = _sample(source, lengths, 64, 0)
    i = list(GROUPS).index(name)
    return masked[offsets[i] : offsets[i + 1]], inserted[offsets[i] : offsets[i + 1]]


def _spans(masked, inserted):
    """``(row, start, length)`` of every span: runs of masked words and zero-length insertions."""
    pad = np.zeros((masked.shape[0], 1), np.int8)
    edges = np.diff(np.concatenate([pad, masked.astype(np.int8), pad], axis=1), axis=1)
    rows, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    zero_rows, zero_pos = np.nonzero(inserted)
    return (
        np.concatenate([rows, zero_rows]),
        np.concatenate([starts, zero_pos]),
        np.concatenate([ends - starts, np.zeros_like(zero_pos)]),
    )


def _length_counts(masked, inserted):
    """``int[B, 11]``: number of spans of each length per row."""
    rows, _, length = _spans(masked, inserted)
    counts = np.zeros((masked.shape[0], 11), np.int64)
    np.add.at(counts, (rows, length), 1)
    return counts


def _assert_close(estimate, target, se, what):
    assert abs(estimate - target) <= Z * se + 1e-12, f"{what}: {estimate} vs exact {target} (se {se:.3g})"


# --------------------------------------------------------------------------- statistics vs exact values

FAST_LENGTHS = [2, 3, 4, 5, 8, 16, 32, 64]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("seq_len", FAST_LENGTHS)
def test_rate_spans_and_no_mask_by_length(source, seq_len):
    masked, inserted = _group(source, f"L{seq_len}")
    n = masked.shape[0]
    exact = _exact.statistics(seq_len)
    counts = _length_counts(masked, inserted)
    spans = counts.sum(axis=1)
    rate = masked.sum(axis=1) / seq_len
    _assert_close(rate.mean(), exact.mean_rate, exact.sd_rate / np.sqrt(n), f"mask rate L={seq_len}")
    _assert_close(spans.mean(), exact.mean_spans, exact.sd_spans / np.sqrt(n), f"#spans L={seq_len}")
    p0 = exact.p_no_spans
    _assert_close((spans == 0).mean(), p0, np.sqrt(p0 * (1 - p0) / n), f"P(no mask) L={seq_len}")
    spans_pmf = np.bincount(spans, minlength=exact.spans_pmf.size)
    assert spans_pmf.size == exact.spans_pmf.size, "more spans than the budget allows"
    assert not (spans_pmf[exact.spans_pmf == 0]).any()


def _check_pmf(counts, exact_pmf, what):
    """Pooled span-length pmf with sequence-clustered standard errors (research notes §7 B.6)."""
    total = counts.sum()
    for k in range(11):
        p_hat = counts[:, k].sum() / total
        if exact_pmf[k] == 0:
            assert p_hat == 0, f"{what}: impossible length {k} drawn"
            continue
        se = np.sqrt(((counts[:, k] - exact_pmf[k] * counts.sum(axis=1)) ** 2).sum()) / total
        _assert_close(p_hat, exact_pmf[k], se, f"{what} p[{k}]")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("seq_len", [5, 16, 32, 64])
def test_span_length_pmf_by_length(source, seq_len):
    masked, inserted = _group(source, f"L{seq_len}")
    _check_pmf(_length_counts(masked, inserted), _exact.statistics(seq_len).span_pmf, f"L={seq_len}")


@pytest.mark.parametrize("source", SOURCES)
def test_long_sequences(source):
    n = 1500
    lengths = (512,) * n + (300,) * n + (283,) * n + (129,) * n
    masked, inserted = _sample(source, lengths, 512, 1)
    for i, seq_len in enumerate([512, 300, 283, 129]):
        m, z = masked[i * n : (i + 1) * n], inserted[i * n : (i + 1) * n]
        exact = _exact.statistics(seq_len)
        assert not m[:, seq_len:].any() and not z[:, seq_len + 1 :].any()
        se_rate, se_spans = exact.sd_rate / np.sqrt(n), exact.sd_spans / np.sqrt(n)
        _assert_close(m.sum(axis=1).mean() / seq_len, exact.mean_rate, se_rate, f"rate L={seq_len}")
        counts = _length_counts(m, z)
        _assert_close(counts.sum(axis=1).mean(), exact.mean_spans, se_spans, f"#spans L={seq_len}")
        _check_pmf(counts, exact.span_pmf, f"L={seq_len}")


def _outcome_codes(masked, inserted):
    """One integer per row identifying its outcome (masked bits, then inserted bits)."""
    bits = np.concatenate([masked, inserted], axis=1).astype(np.int64)
    return bits @ (1 << np.arange(bits.shape[1], dtype=np.int64))


def _scheme_code(scheme, seq_len):
    masked, inserted = scheme_masks(scheme, seq_len)
    return int(_outcome_codes(masked[None], inserted[None])[0])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("seq_len", [2, 3, 4, 5, 6, 9])
def test_exact_small_length_outcomes(source, seq_len):
    masked, inserted = _group(source, f"outcomes{seq_len}")
    n = masked.shape[0]
    codes = _outcome_codes(masked[:, :seq_len], inserted[:, : seq_len + 1])
    exact = {_scheme_code(s, seq_len): p for s, p in _exact.outcomes(seq_len).items()}
    observed = dict(zip(*np.unique(codes, return_counts=True)))
    assert set(observed) <= set(exact), "an outcome the reference can never produce"
    keys = sorted(exact)
    expected = np.array([exact[k] for k in keys]) * n
    counts = np.array([observed.get(k, 0) for k in keys])
    assert scipy.stats.chisquare(counts, expected).pvalue > 1e-4


@pytest.mark.parametrize("source", SOURCES)
def test_position_rates_match_enumeration(source):
    seq_len, (masked, inserted) = 12, _group(source, "sym12")
    n = masked.shape[0]
    exact_masked, exact_inserted = _exact.position_rates(seq_len)
    for observed, exact in [(masked[:, :seq_len], exact_masked), (inserted[:, : seq_len + 1], exact_inserted)]:
        for i, p in enumerate(exact):
            _assert_close(observed[:, i].mean(), p, np.sqrt(p * (1 - p) / n), f"position {i}")
    # Edges are masked about 3.6x less often than the middle, and insertions happen at both ends.
    assert exact_masked[0] < exact_masked[6] / 3
    assert inserted[:, 0].any() and inserted[:, seq_len].any()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("seq_len", [12, 40, 63])
def test_mirror_symmetry(source, seq_len):
    # Paired per-sample statistics: d_i = m_i - m_{L-1-i} and e_j = z_j - z_{L-j} have mean 0.
    masked, inserted = _group(source, f"sym{seq_len}")
    n = masked.shape[0]
    m = masked[:, :seq_len].astype(float)
    z = inserted[:, : seq_len + 1].astype(float)
    for d in [m - m[:, ::-1], z - z[:, ::-1]]:
        mean, sd = d.mean(axis=0), d.std(axis=0)
        assert (np.abs(mean) <= Z * sd / np.sqrt(n) + 1e-12).all()
    # The two shift branches: a span starting at word 0 vs one ending at the last word.
    first = masked[:, 0] | inserted[:, 0]
    last = masked[:, seq_len - 1] | inserted[:, seq_len]
    diff = first.astype(float) - last.astype(float)
    assert abs(diff.mean()) <= Z * diff.std() / np.sqrt(n) + 1e-12


@pytest.mark.parametrize("source", SOURCES)
def test_every_position_maskable_and_gaps_at_least_two(source):
    seq_len, (masked, inserted) = 40, _group(source, "sym40")
    n = masked.shape[0]
    assert (masked[:, :seq_len].sum(axis=0) > 300).all()  # >= ~0.03 * n at the edges
    rows, start, length = _spans(masked, inserted)
    order = np.lexsort((start, rows))
    rows, start, length = rows[order], start[order], length[order]
    same = rows[1:] == rows[:-1]
    gaps = start[1:][same] - (start[:-1] + length[:-1])[same]
    assert gaps.min() == 2  # never adjacent (the article asks for 1; the reference always leaves 2)
    # Budget identity per row: sum(s + 1) is M or M + 1, with M = floor(0.188 L) or one more.
    cost = np.bincount(rows, weights=length + 1, minlength=n)
    assert set(np.unique(cost).astype(int)) <= {7, 8, 9}


@pytest.mark.parametrize("source", SOURCES)
def test_rows_are_independent(source):
    masked, _ = _group(source, "independent")
    n = masked.shape[0]
    rate = masked.sum(axis=1).astype(float)
    r = np.corrcoef(rate[:-1], rate[1:])[0, 1]
    assert abs(r) <= Z / np.sqrt(n)


# --------------------------------------------------------------------------- slow tier: large samples


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_authors_experiment_mixture(source):
    # The article's 15.17%: 200,000 sequences with lengths uniform on [2, 256).
    lengths = tuple(random.Random(42).randrange(2, 256) for _ in range(200_000))
    masked, inserted = _sample(source, lengths, 256, 4)
    rate, pmf = _exact.pooled(lengths)
    assert abs(rate - 0.15170) < 5e-5
    assert abs(masked.sum() / sum(lengths) - rate) <= 2e-4
    counts = _length_counts(masked, inserted)
    _check_pmf(counts, pmf, "mixture")
    p = counts.sum(axis=0) / counts.sum()
    assert np.argmax(p) == 3 and (np.diff(p[:4]) > 0).all() and (np.diff(p[3:]) < 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_long_sequences_large_sample(source):
    for seq_len, n, mode in [(1024, 12_000, 4), (100, 20_000, 3), (2048, 2000, 4), (1250, 3000, 4)]:
        masked, inserted = _sample(source, (seq_len,) * n, 2048, seq_len)
        exact = _exact.statistics(seq_len)
        se = exact.sd_rate / np.sqrt(n)
        _assert_close(masked.sum(axis=1).mean() / seq_len, exact.mean_rate, se, f"L={seq_len}")
        counts = _length_counts(masked, inserted)
        _check_pmf(counts, exact.span_pmf, f"L={seq_len}")
        assert np.argmax(exact.span_pmf) == mode
        if seq_len in (100, 1024):  # margins of ~7 standard errors at these sample sizes
            assert np.argmax(counts.sum(axis=0)) == mode


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("seq_len", [12, 40, 101])
def test_mirror_symmetry_large_sample(source, seq_len):
    n = 400_000 if seq_len == 12 else 200_000
    masked, inserted = _sample(source, (seq_len,) * n, 512, 100 + seq_len)
    m = masked[:, :seq_len].astype(np.float32)
    d = m - m[:, ::-1]
    assert (np.abs(d.mean(axis=0)) <= Z * d.std(axis=0) / np.sqrt(n) + 1e-12).all()


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [2, 3, 4])
def test_exact_small_length_outcomes_large_sample(seq_len):
    n = 400_000
    masked, inserted = _sample("span_mask", (seq_len,) * n, 64, 1000 + seq_len)
    codes = _outcome_codes(masked[:, :seq_len], inserted[:, : seq_len + 1])
    exact = {_scheme_code(s, seq_len): p for s, p in _exact.outcomes(seq_len).items()}
    observed = dict(zip(*np.unique(codes, return_counts=True)))
    keys = sorted(exact)
    counts = np.array([observed.get(k, 0) for k in keys])
    assert scipy.stats.chisquare(counts, np.array([exact[k] for k in keys]) * n).pvalue > 1e-4


# --------------------------------------------------------------------------- the fixed-shape API


def test_shapes_dtypes_and_padding():
    lengths = jnp.array([[0, 1, 2], [30, 64, 17]])
    masked, inserted = jax.jit(wakong.span_mask, static_argnums=2)(jax.random.key(0), lengths, 64)
    assert masked.shape == (2, 3, 64) and inserted.shape == (2, 3, 65)
    assert masked.dtype == jnp.bool_ and inserted.dtype == jnp.bool_
    pos = np.arange(65)
    assert not (np.asarray(masked) & (pos[:64] >= np.asarray(lengths)[..., None])).any()
    assert not (np.asarray(inserted) & (pos > np.asarray(lengths)[..., None])).any()


@pytest.mark.parametrize("source", SOURCES)
def test_fewer_than_two_words_are_never_masked(source):
    for name in ["guard", "empty"]:  # the Wakong guard: 0 and 1 words come back unchanged
        masked, inserted = _group(source, name)
        assert not masked.any() and not inserted.any()


def test_scalar_length_and_tiny_max_len():
    masked, inserted = wakong.span_mask(jax.random.key(0), 1, 1)
    assert masked.shape == (1,) and inserted.shape == (2,) and not masked.any() and not inserted.any()
    masked, inserted = wakong.span_mask(jax.random.key(0), jnp.zeros((3,), jnp.int32), 0)
    assert masked.shape == (3, 0) and inserted.shape == (3, 1) and not inserted.any()
    masked, inserted = wakong.span_mask(jax.random.key(0), jnp.zeros((0,), jnp.int32), 5)
    assert masked.shape == (0, 5) and inserted.shape == (0, 6)


@pytest.mark.parametrize(
    "lengths, max_len, match",
    [
        ([3, 65], 64, "lengths must be <= 64"),
        ([-1, 3], 64, "lengths must be >= 0"),
        ([1.5], 64, "lengths must be an integer"),
        ([True], 64, "lengths must be an integer"),
        ([3], -1, "max_len must be >= 0"),
        ([3], 2.5, "max_len must be a Python int"),
        ([3], True, "max_len must be a Python int"),
    ],
)
def test_invalid_inputs(lengths, max_len, match):
    with pytest.raises(ValueError, match=match):
        wakong.span_mask(jax.random.key(0), np.asarray(lengths), max_len)


def test_bad_key_shape():
    with pytest.raises(ValueError, match="key"):
        wakong.span_mask(jax.random.split(jax.random.key(0), 3), jnp.array([4, 5]), 8)


def test_traced_lengths_and_keys_never_recompile():
    calls = [(jax.random.key(i), jnp.array([i, 64 - i, 2 * i, 64])) for i in range(3)]
    outs = assert_single_trace(lambda k, n: wakong.span_mask(k, n, 64), calls)
    assert not np.array_equal(outs[0][0], outs[1][0])


LENGTHS8 = jnp.array([64, 2, 40, 17, 64, 33, 0, 51])


def test_per_row_keys_batch_invariance_and_fold_in():
    key = jax.random.key(7)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(8, dtype=jnp.uint32))
    masked, inserted = _masks(keys, LENGTHS8, 64)
    # A single key means fold_in(key, row) per row.
    single = _masks(key, LENGTHS8, 64)
    np.testing.assert_array_equal(single[0], masked)
    np.testing.assert_array_equal(single[1], inserted)
    # Rows permuted within the batch: each row keeps its masks.
    perm = jnp.array([5, 0, 3, 7, 1, 6, 2, 4])
    m, z = _masks(keys[perm], LENGTHS8[perm], 64)
    np.testing.assert_array_equal(m, masked[perm])
    np.testing.assert_array_equal(z, inserted[perm])
    # One row alone, with a raw uint32[1, 2] key: the same masks again.
    m, z = _masks(jax.random.key_data(keys[2:3]), LENGTHS8[2:3], 64)
    np.testing.assert_array_equal(m[0], masked[2])
    np.testing.assert_array_equal(z[0], inserted[2])


def test_result_does_not_depend_on_capacity_or_branch():
    # The fast branch holds `capacity` spans; the exact fallback runs when a row needs more. A row's
    # masks must be the same either way, whatever the other rows are.
    key = jax.random.key(5)
    small = jax.jit(lambda k, n: sm._sample(k, n, 64, 2))
    mixed = jnp.array([2, 9, 10, 7, 3, 5, 8, 64] * 16)  # the 64-word rows need the fallback
    short = jnp.where(mixed == 64, 0, mixed)  # at most 2 spans per row: the fast branch suffices
    default = _masks(key, mixed, 64)
    for got, want in zip(small(key, mixed), default):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(small(key, short), _masks(key, short, 64)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_masks(key, short, 64)[0][mixed != 64], default[0][mixed != 64])


@pytest.mark.parametrize("rows", [20, 23])  # tiles of 5 rows; 23 rows pad to 3 tiles of 8
def test_result_does_not_depend_on_tiling(monkeypatch, rows):
    key, lengths = jax.random.key(11), jnp.arange(rows, dtype=jnp.int32) * 3 % 65
    want = _masks(key, lengths, 64)
    monkeypatch.setattr(sm, "_TILE", 8)
    got = jax.jit(lambda k, n: sm._sample.__wrapped__(k, n, 64, sm._capacities(64)[0]))(key, lengths)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_other_prng_implementations_and_eager_calls():
    # Keys of a non-threefry implementation are hashed to row words; a single key still means
    # fold_in(key, row), and an eager call (no outer jit) gives the jitted result.
    key = jax.random.key(3, impl="rbg")
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(8, dtype=jnp.uint32))
    single, per_row = wakong.span_mask(key, LENGTHS8, 64), _masks(keys, LENGTHS8, 64)
    for a, b in zip(single, per_row):
        np.testing.assert_array_equal(a, b)
    assert 0.1 < float(np.asarray(single[0]).sum()) / float(LENGTHS8.sum()) < 0.2


@given(lengths=st.lists(st.integers(0, 64), min_size=12, max_size=12), seed=st.integers(0, 2**31 - 1))
def test_invariants_for_any_lengths(lengths, seed):
    masked, inserted = (np.asarray(a) for a in _masks(jax.random.key(seed), jnp.array(lengths), 64))
    rows, start, length = _spans(masked, inserted)
    for row, seq_len in enumerate(lengths):
        sel = rows == row
        s, l = start[sel], length[sel]
        order = np.argsort(s)
        s, l = s[order], l[order]
        assert (s + l <= seq_len).all() and (s <= seq_len).all() and (l <= 10).all()
        assert (s[1:] - (s[:-1] + l[:-1]) >= 2).all()
        # sum(s + 1) is M or M + 1 with M = floor(0.188 L) or one more; no spans below two words.
        whole = int(seq_len * 0.188) if seq_len >= 2 else 0
        cost = int((l + 1).sum())
        assert cost in ({0} if seq_len < 2 else {whole, whole + 1, whole + 2})


# --------------------------------------------------------------------------- exact building blocks


def test_length_thresholds_are_the_reference_cdfs():
    table = sm._length_thresholds()
    for m, cdf in enumerate(wakong._distribution.span_length_cdfs(), start=1):
        for t in range(m):
            assert abs(table[m - 1, t] / 2**32 - cdf[t] / cdf[-1]) <= 2**-32
        assert (table[m - 1, m:] == 0).all()


def test_budget_table_is_float64():
    whole, thr = sm._budget_table(5000)
    x = np.arange(5001) * 0.188
    np.testing.assert_array_equal(whole[2:], np.floor(x[2:]).astype(np.int32))
    assert np.abs(thr[2:] / 2**32 - (x[2:] - np.floor(x[2:]))).max() <= 2**-32
    assert whole[:2].tolist() == [0, 0] and thr[:2].tolist() == [0, 0]
    # The float32 pitfall: 1250 * 0.188 is exactly 235 in float64 but 234.99998 in float32.
    assert (whole[1250], thr[1250]) == (235, 0)
    assert int(np.float32(1250) * np.float32(0.188)) == 234


def test_exact_slots_rejection_is_exact():
    # With bound = 2**27 + 1, Lemire's method rejects about half of the first (28-bit) draws and of the
    # (32-bit) redraws: exercise the loop and compare with a direct implementation.
    k1, k2 = sm._key_words(jax.random.key(0), (64,))
    b = 2**27 + 1
    bound = jnp.full((5, 64), b, jnp.uint32).at[4].set(1)
    words = jax.random.bits(jax.random.key(1), (5, 64), jnp.uint32) & jnp.uint32(0xFFFFFFF0)
    got = np.asarray(jax.jit(lambda *a: sm._exact_slots(*a, small=False))(k1, k2, words, bound))
    redraw = jax.jit(lambda stream: sm._blocks(k1, k2, stream, 5)[0])
    redraws = [np.asarray(redraw(jnp.uint32(sm._SLOTS + a))).astype(object) for a in range(40)]
    first = np.asarray(words).astype(object) >> 4
    for q in range(4):
        for row in range(64):
            product = first[q, row] * b
            if product % 2**28 >= 2**28 % b:
                assert got[q, row] == product >> 28
                continue
            for attempt in range(40):
                product = redraws[attempt][q, row] * b
                if product % 2**32 >= 2**32 % b:
                    assert got[q, row] == product >> 32
                    break
    assert (got[:4] >= 2**26).mean() > 0.3 and (got[4] == 0).all()


def test_exact_statistics_match_the_research_tables():
    # wakong.md §1.4-1.5 (computed there independently, by the same DP and by enumeration).
    table = {  # L: (E[rate], sd(rate), E[#spans], pooled p[0..4])
        16: (0.15185, 0.0365, 1.20, [0.060, 0.251, 0.298, 0.389, 0.002]),
        64: (0.15176, 0.01235, 2.93, [0.038, 0.161, 0.184, 0.190, 0.166]),
        256: (0.15167, 0.00513, 9.91, [0.022, 0.092, 0.148, 0.1872, 0.1863]),
        1024: (0.15165, 0.00239, 37.8, [0.017, 0.071, 0.137, 0.1863, 0.1929]),
        4096: (0.15164, 0.00116, 149.5, [0.0155, 0.065, 0.134, 0.1860, 0.1946]),
    }
    for seq_len, (rate, sd, spans, pmf) in table.items():
        st = _exact.statistics(seq_len)
        assert round(st.mean_rate, 5) == rate and abs(st.sd_rate - sd) < 6e-5
        assert abs(st.mean_spans - spans) < 0.06 and np.allclose(st.span_pmf[:5], pmf, atol=6e-4)
    assert [round(_exact.statistics(n).p_no_spans, 3) for n in (2, 3, 4, 5, 6)] == [0.624, 0.436, 0.248, 0.06, 0]
    assert {k: round(p, 5) for k, p in _exact.outcomes(3).items()} == {
        (): 0.436, ((1, 1),): 0.22777, ((0, 1),): 0.11388, ((2, 1),): 0.11388,
        ((1, 0),): 0.03615, ((2, 0),): 0.03615, ((0, 0),): 0.01808, ((3, 0),): 0.01808,
    }  # fmt: skip
    modes = [int(np.argmax(_exact.statistics(n).span_pmf)) for n in range(2, 400)]
    runs = [(2 + i, m) for i, m in enumerate(modes) if i == 0 or modes[i - 1] != m]
    assert runs == [(2, 1), (10, 2), (16, 3), (22, 1), (39, 2), (53, 3), (283, 4)]
    rate, pmf = _exact.pooled(range(2, 256))
    assert round(rate, 5) == 0.15170 and round(pmf[0], 4) == 0.0283 and int(np.argmax(pmf)) == 3


def test_capacities_cover_the_span_count():
    for max_len in [64, 512, 2048]:
        fast, full = sm._capacities(max_len)
        exact = _exact.statistics(max_len)
        assert full >= exact.spans_pmf.size - 1
        assert exact.spans_pmf[fast + 1 :].sum() < sm._FAST_MISS <= exact.spans_pmf[fast:].sum()  # the smallest
