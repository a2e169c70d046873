"""Exact statistics of the Wakong algorithm, for tests and documentation.

Two tools, both built on the span-length pmfs the reference actually samples
(:func:`wakong._distribution.span_length_pmfs`, float32 CDFs included):

* a **dynamic program over the budget chain** (remaining budget ``r``; a draw of length ``s`` under cap
  ``min(10, r)`` moves to ``r - s - 1``): the joint law of the number of spans ``n`` and the final
  budget (0 or -1), and the expected number of spans of each length. Everything per sequence follows:
  ``S = M - end - n`` words are masked, so the mask rate ``S / L`` has exact mean and variance;
* **exhaustive enumeration** of every outcome of ``generate_mask_scheme`` for short sequences: budget,
  draw sequences, the ``n!`` shuffles, the ``C(P, n)`` slot sets and the shift, each with its
  probability (including the ``ValueError`` at ``seq_len == 1``).

Statistics concern ``generate_mask_scheme``; :class:`wakong.Wakong` and :func:`wakong.span_mask` add
the guard ``seq_len < 2 -> no spans``.

>>> stats = statistics(512)
>>> round(stats.mean_rate, 5), round(stats.mean_spans, 1)
(0.15165, 19.2)
>>> round(outcomes(1)["ValueError"], 5)
0.15185
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

from wakong._distribution import MAX_SPAN_LEN, PROPOSED_MASK_RATE, span_length_pmfs
from wakong.infilling import SpanSpec


def budget_distribution(seq_len: int, spec: SpanSpec | None = None) -> dict[int, float]:
    """``{M: P(M)}``: ``floor(0.188 L)``, plus one with probability ``frac(0.188 L)`` (float64 arithmetic).

    ``spec``: another rate (:class:`~wakong.infilling.SpanSpec`), with the budget capped at ``L // 2``
    as :func:`~wakong.infilling.span_scheme` caps it (never binding for the reference's rate at ``L >= 2``).
    """
    x = seq_len * (PROPOSED_MASK_RATE if spec is None else spec.budget_rate)
    whole = int(x)
    frac = x - float(whole)
    out = {whole: 1.0 - frac, whole + 1: frac} if frac > 0 else {whole: 1.0}
    if spec is None:
        return out
    capped: dict[int, float] = {}
    for m, p in out.items():
        capped[min(m, seq_len // 2)] = capped.get(min(m, seq_len // 2), 0.0) + p
    return capped


@functools.cache
def _chain(budget: int, spec: SpanSpec | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Spans drawn from remaining budget ``budget`` (span lengths of ``spec``, default the reference's).

    Returns:
      ``(joint, lengths)``: ``joint[n, e]`` = P(``n`` spans and final budget ``-e``), shape
      ``[budget + 1, 2]``; ``lengths[k]`` = expected number of spans of length ``k``.
    """
    pmfs, top = (span_length_pmfs(), MAX_SPAN_LEN) if spec is None else (spec.pmfs(), spec.max_span_len)
    joint = {0: np.array([[1.0, 0.0]]), -1: np.array([[0.0, 1.0]])}
    lengths = {0: np.zeros(top + 1), -1: np.zeros(top + 1)}
    for r in range(1, budget + 1):
        pmf = pmfs[min(top, r) - 1]
        out = np.zeros((r + 1, 2))
        count = np.zeros(top + 1)
        for s in range(min(top, r) + 1):
            rest = joint[r - s - 1]
            out[1 : rest.shape[0] + 1] += pmf[s] * rest
            count += pmf[s] * lengths[r - s - 1]
            count[s] += pmf[s]
        joint[r], lengths[r] = out, count
    return joint[budget], lengths[budget]


class Statistics(NamedTuple):
    """Exact per-sequence statistics of ``generate_mask_scheme(rng, seq_len)``."""

    seq_len: int
    mean_rate: float  # E[S / L], S = number of masked words
    sd_rate: float  # sd of S / L across sequences
    mean_spans: float  # E[n]
    sd_spans: float  # sd of n
    span_pmf: np.ndarray  # float64[11]: E[#spans of length k] / E[n] (the pooled span-length pmf)
    mean_length_counts: np.ndarray  # float64[11]: E[#spans of length k]
    spans_pmf: np.ndarray  # float64[M_max + 1]: P(n = j)
    p_no_spans: float  # P(scheme == []) = P(M == 0)
    p_no_masked_word: float  # P(S == 0): no span or only zero-length spans


@functools.cache
def statistics(seq_len: int, spec: SpanSpec | None = None) -> Statistics:
    """Exact :class:`Statistics` for one length (``seq_len >= 2``; shorter inputs never reach the chain
    in ``Wakong``, and ``seq_len == 1`` can raise, see :func:`outcomes`); ``spec``: the algorithm with
    other constants (:func:`wakong.infilling.span_scheme`), default the reference's."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    budgets = budget_distribution(seq_len, spec)
    top = max(budgets)
    m1 = m2 = n1 = n2 = p_zero_s = 0.0
    counts = np.zeros((MAX_SPAN_LEN if spec is None else spec.max_span_len) + 1)
    spans_pmf = np.zeros(top + 1)
    for budget, p in budgets.items():
        joint, lengths = _chain(budget, spec)
        n = np.arange(joint.shape[0])[:, None]
        masked = budget - np.array([0, -1])[None, :] - n  # S = M - end - n
        m1 += p * float((joint * masked).sum())
        m2 += p * float((joint * masked**2).sum())
        n1 += p * float((joint * n).sum())
        n2 += p * float((joint * n**2).sum())
        p_zero_s += p * float(joint[masked == 0].sum())
        counts += p * lengths
        spans_pmf[: joint.shape[0]] += p * joint.sum(axis=1)
    return Statistics(
        seq_len=seq_len,
        mean_rate=m1 / seq_len,
        sd_rate=math.sqrt(max(m2 - m1**2, 0.0)) / seq_len,
        mean_spans=n1,
        sd_spans=math.sqrt(max(n2 - n1**2, 0.0)),
        span_pmf=counts / counts.sum() if counts.sum() > 0 else counts,
        mean_length_counts=counts,
        spans_pmf=spans_pmf,
        p_no_spans=budgets.get(0, 0.0),
        p_no_masked_word=p_zero_s,
    )


def pooled(seq_lens) -> tuple[float, np.ndarray]:
    """``(sum E[S] / sum L, pooled span pmf)`` over a list of lengths, each weighted by its frequency.

    This is what the author's experiment measures (lengths uniform on ``[2, 256)``): 0.15170.
    """
    lens, freq = np.unique(np.asarray(seq_lens), return_counts=True)
    masked = total = 0.0
    counts = np.zeros(MAX_SPAN_LEN + 1)
    for seq_len, f in zip(lens.tolist(), freq.tolist()):
        st = statistics(seq_len)
        masked += f * st.mean_rate * seq_len
        total += f * seq_len
        counts += f * st.mean_length_counts
    return masked / total, counts / counts.sum()


def _draw_sequences(budget: int):
    """Every sequence of span lengths the chain can draw from ``budget``, with its probability."""
    if budget <= 0:
        yield (), 1.0
        return
    pmf = span_length_pmfs()[min(MAX_SPAN_LEN, budget) - 1]
    for s in range(min(MAX_SPAN_LEN, budget) + 1):
        if pmf[s] > 0:
            for rest, p in _draw_sequences(budget - s - 1):
                yield (s,) + rest, float(pmf[s]) * p


@functools.cache
def outcomes(seq_len: int) -> dict:
    """Every outcome of ``generate_mask_scheme(rng, seq_len)`` with its exact probability.

    Keys are schemes as tuples of ``(insert_pos, span_len)`` pairs, plus ``"ValueError"`` for the
    failure at ``seq_len == 1``. Exhaustive, so meant for short sequences (``seq_len <= ~20``).

    >>> {k: round(p, 5) for k, p in sorted(outcomes(2).items(), key=lambda kv: -kv[1])}
    {(): 0.624, ((0, 1),): 0.15185, ((1, 1),): 0.15185, ((1, 0),): 0.03615, ((0, 0),): 0.01808, ((2, 0),): 0.01808}
    """
    out: dict = {}
    for budget, p_budget in budget_distribution(seq_len).items():
        for draws, p_draws in _draw_sequences(budget):
            n = len(draws)
            slots = seq_len - sum(draws) - n + 1
            if n > slots:
                out["ValueError"] = out.get("ValueError", 0.0) + p_budget * p_draws
                continue
            orders = list(itertools.permutations(draws))
            chosen = list(itertools.combinations(range(slots), n))
            p = p_budget * p_draws / (len(orders) * len(chosen) * 2)
            for order in orders:
                for picks in chosen:
                    scheme, offset = [], 0
                    for slot, length in zip(picks, order):
                        scheme.append((slot + offset, length))
                        offset += length + 1
                    for shift in (0, 1):
                        key = tuple((pos + shift, length) for pos, length in scheme)
                        out[key] = out.get(key, 0.0) + p
    return out


def position_rates(seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``(P(word i masked) [L], P(mask inserted before word i) [L + 1])`` by enumeration."""
    masked, inserted = np.zeros(seq_len), np.zeros(seq_len + 1)
    for scheme, p in outcomes(seq_len).items():
        if scheme == "ValueError":
            continue
        for pos, length in scheme:
            if length:
                masked[pos : pos + length] += p
            else:
                inserted[pos] += p
    return masked, inserted


def markdown_table(seq_lens) -> str:
    """The exact statistics of ``docs/wakong.md`` as a markdown table, one row per length."""
    lines = [
        "| L | E[rate] | sd(rate) | E[#spans] | P(no span) | pooled span-length pmf, s = 0..10 | mode |",
        "|---|---|---|---|---|---|---|",
    ]
    for seq_len in seq_lens:
        st = statistics(seq_len)
        pmf = " ".join(f"{p:.4f}".lstrip("0") if p else "0" for p in st.span_pmf)
        lines.append(
            f"| {seq_len} | {st.mean_rate:.5f} | {st.sd_rate:.5f} | {st.mean_spans:.3f} | {st.p_no_spans:.3f} "
            f"| {pmf} | {int(np.argmax(st.span_pmf))} |"
        )
    return "\n".join(lines)
