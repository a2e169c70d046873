"""Tests of wakong.report: exact expectations (against exhaustive enumeration), statistics, plots."""

import itertools
import math
import random

import numpy as np
import pytest

from wakong.infilling import SpanSpec, span_scheme
from wakong.report import (
    MaskStats,
    _budgets,
    expected_mask_rate,
    expected_position_rates,
    expected_span_counts,
    plot_positions,
    plot_span_lengths,
)

SPECS = [SpanSpec(), SpanSpec(0.4, 3.0, 10), SpanSpec(0.5, 1.0, 3)]


def _enumerate(n: int, spec: SpanSpec):
    """Every outcome of the algorithm with its exact probability: (scheme, probability)."""
    pmfs = spec.pmfs()

    def chains(left, lengths, p):
        if left <= 0:
            yield lengths, p
            return
        cap = min(spec.max_span_len, left)
        for s in range(cap + 1):
            if pmfs[cap - 1, s]:
                yield from chains(left - s - 1, lengths + [s], p * pmfs[cap - 1, s])

    for budget, weight in _budgets(n, spec):
        for lengths, p in chains(budget, [], weight):
            orders = list(itertools.permutations(lengths))  # shuffle: every order equally likely
            slots = list(itertools.combinations(range(n - sum(lengths) - len(lengths) + 1), len(lengths)))
            for order in orders:
                for chosen in slots:
                    for shift in (0, 1):
                        offsets = np.cumsum([0] + [s + 1 for s in order[:-1]])
                        scheme = [(a + int(o) + shift, s) for a, o, s in zip(chosen, offsets, order)]
                        yield scheme, p / len(orders) / len(slots) / 2


@pytest.mark.parametrize("spec", SPECS)
def test_exact_expectations_equal_exhaustive_enumeration(spec):
    for n in range(0, 12):
        positions, spans = np.zeros(n), np.zeros(spec.max_span_len + 1)
        for scheme, p in _enumerate(n, spec):
            for start, s in scheme:
                positions[start : start + s] += p
                spans[s] += p
        np.testing.assert_allclose(expected_position_rates(n, spec), positions, atol=1e-14)
        np.testing.assert_allclose(expected_span_counts(n, spec), spans, atol=1e-14)
        np.testing.assert_allclose(expected_position_rates(n, spec, 3), positions[:3], atol=1e-14)


def test_known_values_from_the_specification():
    assert expected_position_rates(2).round(5).tolist() == [0.15185, 0.15185]
    assert expected_position_rates(4).round(5).tolist() == [0.10123, 0.20246, 0.20246, 0.10123]
    for n, rate in [(16, 0.15185), (64, 0.15176), (128, 0.15170), (512, 0.15165), (4096, 0.15164)]:
        assert round(expected_mask_rate(n), 5) == rate
    assert round(float(expected_span_counts(256).sum()), 2) == 9.91


def test_position_profile_is_symmetric_and_sums_to_the_mask_rate():
    for spec in SPECS:
        for n in (13, 31, 40):
            p = expected_position_rates(n, spec)
            np.testing.assert_allclose(p, p[::-1], atol=1e-12)
            assert p.sum() / n == pytest.approx(expected_mask_rate(n, spec), abs=1e-12)


def test_edge_profile_matches_simulation():
    n, count, rng = 40, 20000, random.Random(5)
    hits = np.zeros(n)
    for _ in range(count):
        for start, s in span_scheme(rng, n):
            hits[start : start + s] += 1
    p = expected_position_rates(n)
    z = (hits / count - p) / np.sqrt(p * (1 - p) / count)
    assert np.abs(z).max() < 4.5


def test_mask_stats_against_exact_expectations():
    stats, rng, lengths = MaskStats(), random.Random(1), random.Random(2)
    rates = []
    for _ in range(6000):
        n = lengths.randrange(2, 80)
        scheme = span_scheme(rng, n)
        stats.add(n, scheme)
        rates.append(sum(s for _, s in scheme))
    summary = stats.summary()
    assert summary["schemes"] == 6000 and summary["masked_units"] == sum(rates)
    assert summary["mask_rate"] == pytest.approx(summary["expected_mask_rate"], abs=0.004)
    spans = summary["spans"]
    pmf, expected = np.array(summary["span_pmf"]), np.array(summary["expected_span_pmf"])
    assert np.all(np.abs(pmf - expected) <= 4.5 * np.sqrt(expected * (1 - expected) / spans) + 1e-4)
    edge = summary["edge"]
    for side in ("from_start", "from_end"):
        got, want = np.array(edge[side]), np.array(edge["expected"])
        assert np.all(np.abs(got - want) <= 4.5 * np.sqrt(want * (1 - want) / edge["records"]))
    assert edge["interior_rate"] == pytest.approx(edge["expected_interior_rate"], abs=0.006)


def test_state_round_trip_and_merge():
    a, b, both = MaskStats(), MaskStats(), MaskStats()
    rng = random.Random(3)
    for i in range(300):
        n = 2 + i % 50
        scheme = span_scheme(rng, n)
        (a if i % 2 else b).add(n, scheme)
        both.add(n, scheme)
    merged = MaskStats().merge(a.state()).merge(b.state())
    assert merged.state() == both.state()
    with pytest.raises(ValueError, match="different settings"):
        MaskStats(edge=4).merge(a.state())


def test_plots_are_written(tmp_path):
    stats, rng = MaskStats(), random.Random(0)
    for _ in range(200):
        stats.add(30, span_scheme(rng, 30))
    summary = stats.summary()
    for plot, name in ((plot_span_lengths, "spans.png"), (plot_positions, "positions.png")):
        plot(summary, str(tmp_path / name))
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_of_nothing():
    summary = MaskStats().summary()
    assert summary["spans"] == 0 and summary["mask_rate"] == 0 and math.isfinite(summary["expected_mask_rate"])


def test_batched_counts_equal_a_direct_count():
    """add_many (vectorised) against counting every masked unit of every scheme one by one."""
    from wakong.infilling import SpanSpec

    for spec in (SpanSpec(), SpanSpec(0.4, 3.0, 10)):
        rng = random.Random(5)
        lengths = [rng.randrange(0, 60) for _ in range(2000)]
        schemes = [span_scheme(rng, n, spec) for n in lengths]
        stats = MaskStats(spec)
        stats.add_many(lengths[:700], schemes[:700])
        stats.add_many(lengths[700:], schemes[700:])
        hist, start, end, near = np.zeros(11, int), np.zeros(8, int), np.zeros(8, int), 0
        for n, scheme in zip(lengths, schemes):
            for p, s in scheme:
                hist[s] += 1
                for i in range(p, p + s):
                    if n >= 16 and i < 8:
                        start[i] += 1
                    if n >= 16 and i >= n - 8:
                        end[n - 1 - i] += 1
                    near += n >= 16 and (i < 8 or i >= n - 8)
        state = stats.state()
        assert state["span_histogram"] == hist.tolist() and state["units"] == sum(lengths)
        assert state["edge"]["from_start"] == start.tolist() and state["edge"]["from_end"] == end.tolist()
        masked_profiled = sum(s for n, sc in zip(lengths, schemes) if n >= 16 for _, s in sc)
        assert state["edge"]["interior_masked"] == masked_profiled - near
        assert state["edge"]["records"] == sum(n >= 16 for n in lengths)
