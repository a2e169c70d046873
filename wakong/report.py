"""Mask statistics of a build, their exact expectations, and the report's plots.

The expectations are exact (no simulation) for the algorithm :func:`wakong.infilling.span_scheme` runs,
computed per sequence length ``n`` and pooled with the observed lengths:

* :func:`expected_span_counts` -- ``E[#spans of length s]``, a dynamic program over the budget chain
  (remaining budget ``r``; each span ``s`` is drawn from the pmf truncated at ``min(max_span_len, r)``).
* :func:`expected_position_rates` -- ``P(unit i masked)``. Given the spans, the unshifted layout is a
  uniformly random arrangement of ``F`` free cells and the blocks ``[s masked cells, 2 guard cells]``
  over ``n + 1`` cells (the last one virtual); the shift moves it right by one. For one block, the
  units before it are a uniformly random subset whose size is uniform, so the block starts at ``x``
  with probability ``sum_p [w^p z^x] (1 + w z)^F prod_other (1 + w z^(s_j + 2)) / (N C(N - 1, p))``
  with ``N`` units in all. The expectation of that product over the budget chain is computed by one
  backward recursion over the budget left, shared by every length, truncated at the positions asked
  for -- exact and cheap near the edges, where the algorithm under-masks. Chain states less likely
  than 1e-18 are skipped (error below 1e-12).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from typing import Sequence

import numpy as np

from wakong._reference import MaskScheme
from wakong.infilling import SpanSpec

#: Positions from each end whose mask rate the report profiles.
EDGE = 8
#: Chain states less likely than this are dropped (their total effect is far below float64 resolution).
_NEGLIGIBLE = 1e-18


def _budgets(n: int, spec: SpanSpec) -> list[tuple[int, float]]:
    if n < 2:
        return []
    x = n * spec.budget_rate
    whole, frac = int(x), x - float(int(x))
    out = collections.defaultdict(float)  # the cap n // 2 never binds for the reference constants
    out[min(whole, n // 2)] += 1.0 - frac
    out[min(whole + 1, n // 2)] += frac
    return [(m, p) for m, p in out.items() if p > 0]


@functools.lru_cache(maxsize=4096)
def expected_span_counts(n: int, spec: SpanSpec = SpanSpec()) -> np.ndarray:
    """``float64[max_span_len + 1]``: expected number of spans of each length for ``n`` units.

    >>> c = expected_span_counts(2)
    >>> round(float(c[1]), 5), round(float(c.sum()), 3)   # budget 1 w.p. 0.376, then s = 1 w.p. 0.8077
    (0.30369, 0.376)
    """
    pmfs = spec.pmfs()
    counts = np.zeros(spec.max_span_len + 1)
    for budget, weight in _budgets(n, spec):
        prob = np.zeros(budget + 1)
        prob[budget] = weight
        for r in range(budget, 0, -1):
            cap = min(spec.max_span_len, r)
            mass = prob[r] * pmfs[cap - 1, : cap + 1]
            counts[: cap + 1] += mass
            nxt = r - 1 - np.arange(cap + 1)
            prob[nxt[nxt > 0]] += mass[nxt > 0]
    return counts


def expected_mask_rate(n: int, spec: SpanSpec = SpanSpec()) -> float:
    """Exact ``E[masked units] / n``.

    >>> round(expected_mask_rate(16), 5)
    0.15185
    """
    return float(expected_span_counts(n, spec) @ np.arange(spec.max_span_len + 1)) / n if n else 0.0


@functools.lru_cache(maxsize=4096)
def expected_position_rates(n: int, spec: SpanSpec = SpanSpec(), k: int | None = None) -> np.ndarray:
    """``float64[min(k, n)]``: exact probability that unit ``i`` is masked, for ``i < k`` (default all).

    The profile is symmetric: ``P(n - 1 - i) == P(i)``.

    >>> np.round(expected_position_rates(3), 5).tolist()
    [0.11388, 0.22777, 0.11388]
    """
    return expected_position_profiles([n], spec, n if k is None else k)[n]


def expected_position_profiles(lengths, spec: SpanSpec = SpanSpec(), k: int = EDGE) -> dict[int, np.ndarray]:
    """:func:`expected_position_rates` for many lengths at once (one pass of the chain for all)."""
    wanted: dict[int, list[tuple[int, float]]] = collections.defaultdict(list)
    for n in set(lengths):
        for budget, weight in _budgets(n, spec):
            if budget:
                wanted[budget].append((n, weight))
    covers = _chain_covers(spec, k, sorted(wanted))
    unshifted = {n: np.zeros(min(k, n)) for n in set(lengths)}
    for budget, items in wanted.items():
        for n, weight in items:
            unshifted[n] += weight * _terminal_rates(n, budget, covers[budget], min(k, n))
    return {n: 0.5 * u + 0.5 * np.concatenate([[0.0], u[:-1]]) for n, u in unshifted.items()}


def _chain_covers(spec: SpanSpec, k: int, budgets: list[int]) -> dict[int, np.ndarray]:
    """For each budget: ``[stop, spans, w, z]`` sums over the chain of ``P(path) * cover_T * prod_other``.

    Backward over the budget left ``r``: ``V(r) = sum_s q_r(s) y (1 + w z^(s + 2)) V(r - s - 1)`` and
    ``C(r) = sum_s q_r(s) y [(1 + w z^(s + 2)) C(r - s - 1) + (1 + ... + z^(s - 1)) V(r - s - 1)]``
    (``y`` counts spans; ``stop`` is whether the chain ended with 0 or -1 budget left).
    """
    if not budgets:
        return {}
    pmfs, top, m = spec.pmfs(), max(budgets), spec.max_span_len
    shape = (2, top + 2, k, k)
    ring = {}  # r -> (V, C, live span counts)
    for stop in (0, -1):
        v = np.zeros(shape)
        v[-stop, 0, 0, 0] = 1.0
        ring[stop] = (v, np.zeros(shape), slice(0, 1))
    out, wanted = {}, set(budgets)
    for r in range(1, top + 1):
        v_new, c_new, lo, hi = np.zeros(shape), np.zeros(shape), top + 2, 0
        cap = min(m, r)
        for s in range(cap + 1):
            q = pmfs[cap - 1, s]
            if q == 0.0:
                continue
            v, c, live = ring[r - s - 1]
            a, b = v[:, live], c[:, live]
            dst = slice(live.start + 1, live.stop + 1)  # one more span
            lo, hi = min(lo, dst.start), max(hi, dst.stop)
            v_new[:, dst] += q * a
            c_new[:, dst] += q * b
            if s + 2 < k:  # times w z^(s + 2): this block comes before the tagged one
                v_new[:, dst, 1:, s + 2 :] += q * a[:, :, :-1, : k - s - 2]
                c_new[:, dst, 1:, s + 2 :] += q * b[:, :, :-1, : k - s - 2]
            if s:  # this block is the tagged one: it covers z^0 .. z^(s - 1) past its start
                csum = q * np.cumsum(a, axis=-1)
                c_new[:, dst] += csum
                if s < k:
                    c_new[:, dst, :, s:] -= csum[..., : k - s]
        mass = v_new[:, lo:hi, 0, 0].sum(axis=0)  # P(spans from here | r)
        keep = np.flatnonzero(mass > _NEGLIGIBLE)
        ring[r] = (v_new, c_new, slice(lo + keep[0], lo + keep[-1] + 1))
        ring.pop(r - m - 2, None)
        if r in wanted:
            out[r] = c_new
    return out


def _terminal_rates(n: int, budget: int, cover: np.ndarray, k: int) -> np.ndarray:
    """Unshifted ``P(cell i masked)``, ``i < k``: adds the free cells and averages over the units before."""
    rates = np.zeros(k)
    spans = np.arange(cover.shape[1])
    for stop in (0, -1):
        units = n + 1 - budget + stop
        free = units - spans  # free cells when the chain drew ``spans`` spans and stopped at ``stop``
        weights = np.array([1.0 / (units * math.comb(units - 1, p)) if p < units else 0.0 for p in range(k)])
        full, coef = np.zeros((len(spans), k, k)), np.ones(len(spans))
        for j in range(k):  # times (1 + w z)^free
            if j:
                coef = coef * np.maximum(free - j + 1, 0) / j
            full[:, j:, j:] += coef[:, None, None] * cover[-stop, :, : k - j, : k - j]
        rates += np.einsum("p,spz->z", weights, full[1:])
    return rates


class MaskStats:
    """Accumulates span schemes: lengths, span-length histogram, masked units, edge profile."""

    def __init__(self, spec: SpanSpec = SpanSpec(), edge: int = EDGE):
        self.spec, self.edge = spec, edge
        self.lengths: collections.Counter = collections.Counter()
        self.span_hist = np.zeros(spec.max_span_len + 1, np.int64)
        self.masked = self.units = 0
        self.edge_records = 0
        self.edge_start = np.zeros(edge, np.int64)
        self.edge_end = np.zeros(edge, np.int64)
        self.interior_masked = self.interior_units = 0

    def add(self, n: int, scheme: MaskScheme) -> None:
        """Adds the scheme drawn for a sequence of ``n`` units."""
        self.add_many([n], [scheme])

    def add_many(self, lengths: Sequence[int], schemes: Sequence[MaskScheme]) -> None:
        """Adds the schemes drawn for sequences of ``lengths`` units (vectorised over all of them)."""
        self.lengths.update(lengths)
        n = np.asarray(lengths, np.int64)
        self.units += int(n.sum())
        counts = np.fromiter(map(len, schemes), np.int64, len(schemes))
        flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(schemes)), np.int64,
                           2 * int(counts.sum()))
        starts, spans, owner = flat[0::2], flat[1::2], np.repeat(n, counts)
        self.span_hist += np.bincount(spans, minlength=len(self.span_hist))
        self.masked += int(spans.sum())
        edge, profiled = self.edge, n >= 2 * self.edge
        self.edge_records += int(profiled.sum())
        self.interior_units += int((n[profiled] - 2 * edge).sum())
        keep = owner >= 2 * edge
        position = np.repeat(starts[keep] - np.cumsum(spans[keep]) + spans[keep], spans[keep]) + np.arange(
            int(spans[keep].sum()))  # every masked unit of the profiled sequences
        length = np.repeat(owner[keep], spans[keep])
        head, tail = position < edge, position >= length - edge
        self.edge_start += np.bincount(position[head], minlength=edge)[:edge]
        self.edge_end += np.bincount((length - 1 - position)[tail], minlength=edge)[:edge]
        self.interior_masked += len(position) - int(head.sum()) - int(tail.sum())

    def state(self) -> dict:
        """The raw counts (JSON-able; what a manifest stores)."""
        return {
            "lengths": {str(n): c for n, c in sorted(self.lengths.items())},
            "span_histogram": self.span_hist.tolist(),
            "masked_units": self.masked,
            "units": self.units,
            "edge": {
                "positions": self.edge,
                "records": self.edge_records,
                "from_start": self.edge_start.tolist(),
                "from_end": self.edge_end.tolist(),
                "interior_masked": self.interior_masked,
                "interior_units": self.interior_units,
            },
        }

    def merge(self, state: dict) -> "MaskStats":
        """Adds the counts of another :meth:`state` (e.g. another host's part)."""
        edge = state["edge"]
        if edge["positions"] != self.edge or len(state["span_histogram"]) != len(self.span_hist):
            raise ValueError("cannot merge statistics gathered with different settings")
        self.lengths.update({int(n): c for n, c in state["lengths"].items()})
        self.span_hist += np.asarray(state["span_histogram"], np.int64)
        self.masked += state["masked_units"]
        self.units += state["units"]
        self.edge_records += edge["records"]
        self.edge_start += np.asarray(edge["from_start"], np.int64)
        self.edge_end += np.asarray(edge["from_end"], np.int64)
        self.interior_masked += edge["interior_masked"]
        self.interior_units += edge["interior_units"]
        return self

    def summary(self) -> dict:
        """Empirical statistics next to their exact expectations (JSON-able)."""
        spec, kmax = self.spec, self.spec.max_span_len
        exp_counts, exp_masked, exp_edge, exp_near = np.zeros(kmax + 1), 0.0, np.zeros(self.edge), 0.0
        long_enough = [n for n in self.lengths if n >= 2 * self.edge]
        profiles = expected_position_profiles(long_enough, spec, self.edge)
        for n, count in self.lengths.items():
            c = expected_span_counts(n, spec)
            exp_counts += count * c
            exp_masked += count * float(c @ np.arange(kmax + 1))
            if n in profiles:
                exp_edge += count * profiles[n]
                exp_near += count * (float(c @ np.arange(kmax + 1)) - 2 * profiles[n].sum())
        spans = int(self.span_hist.sum())
        records = max(self.edge_records, 1)
        return {
            "schemes": sum(self.lengths.values()),
            "units": self.units,
            "masked_units": self.masked,
            "mask_rate": self.masked / max(self.units, 1),
            "expected_mask_rate": exp_masked / max(self.units, 1),
            "spans": spans,
            "span_histogram": self.span_hist.tolist(),
            "span_pmf": (self.span_hist / max(spans, 1)).tolist(),
            "expected_span_pmf": (exp_counts / max(exp_counts.sum(), 1e-300)).tolist(),
            "expected_spans": float(exp_counts.sum()),
            "edge": {
                "positions": self.edge,
                "records": self.edge_records,
                "from_start": (self.edge_start / records).tolist(),
                "from_end": (self.edge_end / records).tolist(),
                "expected": (exp_edge / records).tolist(),
                "interior_rate": self.interior_masked / max(self.interior_units, 1),
                "expected_interior_rate": exp_near / max(self.interior_units, 1),
            },
        }


def plot_span_lengths(summary: dict, path: str) -> None:
    """Bar chart of the observed span-length pmf with the exact expectation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pmf, expected = np.asarray(summary["span_pmf"]), np.asarray(summary["expected_span_pmf"])
    x = np.arange(len(pmf))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x, pmf, color="tab:blue", alpha=0.7, label=f"observed ({summary['spans']} spans)")
    ax.plot(x, expected, "o-", color="tab:red", label="exact expectation")
    ax.set_xticks(x)
    ax.set_xlabel("span length (units); 0 = inserted mask")
    ax.set_ylabel("fraction of spans")
    ax.set_title(
        f"Span lengths -- mask rate {summary['mask_rate']:.4f} (exact {summary['expected_mask_rate']:.4f})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_positions(summary: dict, path: str) -> None:
    """Mask rate by distance from the start and from the end of a sequence, with the exact expectation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edge = summary["edge"]
    x = np.arange(edge["positions"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, edge["from_start"], "s-", color="tab:blue", label="observed, from the start")
    ax.plot(x, edge["from_end"], "^-", color="tab:green", label="observed, from the end")
    ax.plot(x, edge["expected"], "o--", color="tab:red", label="exact expectation (both ends)")
    interior, exact = edge["interior_rate"], edge["expected_interior_rate"]
    ax.axhline(interior, color="tab:gray", lw=0.8, label=f"observed interior {interior:.4f}")
    ax.axhline(exact, color="tab:red", ls=":", label=f"exact interior {exact:.4f}")
    ax.set_xlabel("position counted from the start / from the end (units)")
    ax.set_ylabel("P(unit masked)")
    ax.set_title(f"Mask rate by position ({edge['records']} sequences of >= {2 * edge['positions']} units)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
