"""Evaluation metrics on token-id sequences (host-side numpy / Python).

Sequences are ``int[N]`` token ids with a length (generated outputs: up to and including EOS;
references: the label row up to its ``loss_mask`` length, BOS and EOS included).

* :func:`exact_match`, :func:`token_accuracy`: against the reference;
* :func:`infill_spans` / :func:`infill_exact_match`: what each ``<mask>`` of the source was filled
  with, read off a sequence by matching it against the source (masks are wildcards), compared span
  by span with the reference's fills; outputs that changed the unmasked text get every span wrong;
* :func:`distinct_n` (Li et al. 2016): distinct n-grams / n-grams over all outputs;
* :func:`self_bleu`: BLEU (``sacrebleu``) of each output of an input against the other outputs of
  the same input, averaged -- diversity among samples (100 = identical);
* :func:`length_stats`, :func:`perplexity`.

>>> exact_match([[0, 5, 2]], [[0, 5, 2]]), token_accuracy([[0, 5, 7]], [[0, 5, 2]])
(1.0, 0.6666666666666666)
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Seq = Sequence[int]


def trim(tokens: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    """Rows of ``tokens [R, N]`` cut to ``lengths [R]``."""
    return [tuple(int(t) for t in row[:n]) for row, n in zip(np.asarray(tokens), np.asarray(lengths))]


def exact_match(hyps: Sequence[Seq], refs: Sequence[Seq]) -> float:
    """Fraction of hypotheses equal to their reference."""
    if not refs:
        return 0.0
    return sum(tuple(h) == tuple(r) for h, r in zip(hyps, refs)) / len(refs)


def token_accuracy(hyps: Sequence[Seq], refs: Sequence[Seq]) -> float:
    """Position-wise accuracy over reference tokens: ``sum_t [h_t == r_t] / sum |r|`` (token-weighted).

    >>> token_accuracy([[1, 2], [3]], [[1, 9, 9], [3]])
    0.5
    """
    total = sum(len(r) for r in refs)
    hits = sum(sum(1 for a, b in zip(h, r) if a == b) for h, r in zip(hyps, refs))
    return hits / total if total else 0.0


def infill_spans(source: Seq, seq: Seq, mask_id: int) -> list[tuple[int, ...]] | None:
    """The tokens ``seq`` puts in place of each ``mask_id`` of ``source``, or ``None`` if it does not fit.

    ``source`` is read as a pattern whose masks match any (possibly empty) run of tokens and whose
    other tokens must appear verbatim. Ambiguities are resolved leftmost-shortest (the classic
    wildcard matcher: each mask takes as few tokens as the rest of the pattern allows).

    >>> infill_spans([0, 7, 4, 9, 2], [0, 7, 5, 6, 9, 2], mask_id=4)
    [(5, 6)]
    >>> infill_spans([0, 4, 8, 4, 2], [0, 8, 8, 2], mask_id=4), infill_spans([0, 4, 2], [0, 5], 4)
    ([(), (8,)], None)
    """
    spans: dict[int, tuple[int, int]] = {}
    p = s = 0
    star = None  # [pattern index of the last mask, where its span starts, its current length]
    while s < len(seq):
        if p < len(source) and source[p] == mask_id:
            star = [p, s, 0]
            spans[p] = (s, s)
            p += 1
        elif p < len(source) and source[p] == seq[s]:
            p += 1
            s += 1
        elif star is not None:  # the last mask takes one more token; retry the rest from there
            star[2] += 1
            p, s = star[0] + 1, star[1] + star[2]
            spans[star[0]] = (star[1], s)
        else:
            return None
    while p < len(source) and source[p] == mask_id:
        spans[p] = (s, s)
        p += 1
    if p != len(source):
        return None
    return [tuple(seq[a:b]) for _, (a, b) in sorted(spans.items())]


def infill_exact_match(
    sources: Sequence[Seq], hyps: Sequence[Seq], refs: Sequence[Seq], mask_id: int
) -> dict[str, float]:
    """Span-level infilling accuracy.

    Returns:
      ``infill_exact_match``: correct fills / masks (over references that match their source);
      ``faithful``: fraction of hypotheses that keep the unmasked text verbatim;
      ``spans``: number of masks scored; ``unaligned_references``: references that do not match
      their source (other noises than infilling), skipped.
    """
    correct = total = faithful = unaligned = 0
    for src, hyp, ref in zip(sources, hyps, refs):
        want = infill_spans(src, ref, mask_id)
        if want is None:
            unaligned += 1
            continue
        got = infill_spans(src, hyp, mask_id)
        faithful += got is not None
        total += len(want)
        if got is not None:
            correct += sum(g == w for g, w in zip(got, want))
    scored = len(refs) - unaligned
    return {
        "infill_exact_match": correct / total if total else 0.0,
        "faithful": faithful / scored if scored else 0.0,
        "spans": total,
        "unaligned_references": unaligned,
    }


def distinct_n(seqs: Sequence[Seq], n: int) -> float:
    """Distinct n-grams over all sequences divided by the number of n-grams (0 when there are none).

    >>> distinct_n([[1, 2, 1, 2], [1, 2]], 2)
    0.5
    """
    grams = [tuple(s[i : i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def self_bleu(groups: Sequence[Sequence[str]]) -> float | None:
    """Mean sentence BLEU of each text against the other texts of its group (``sacrebleu``, 0-100).

    Each group holds the outputs for one input; groups of fewer than two texts are skipped, and
    ``None`` is returned when no group has two. Uses ``sacrebleu``'s default ``13a`` tokenisation and
    ``effective_order`` (as ``sentence_bleu`` recommends for single sentences).

    >>> round(self_bleu([["the cat sat on the mat", "the cat sat on the mat"]]), 1)
    100.0
    """
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    scores = []
    for texts in groups:
        if len(texts) < 2:
            continue
        for i, text in enumerate(texts):
            scores.append(bleu.sentence_score(text, [t for j, t in enumerate(texts) if j != i]).score)
    return float(np.mean(scores)) if scores else None


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Mean, standard deviation, min, median and max of ``lengths``.

    >>> length_stats([1, 2, 6])["mean"]
    3.0
    """
    x = np.asarray(lengths, np.float64)
    if x.size == 0:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "median": 0.0, "max": 0.0}
    return {"mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()),
            "median": float(np.median(x)), "max": float(x.max())}


def perplexity(total_logprob: float, tokens: int) -> float:
    """``exp(-total_logprob / tokens)`` (``inf`` with no tokens).

    >>> round(perplexity(-2 * math.log(4.0), 2), 6)
    4.0
    """
    return math.exp(-total_logprob / tokens) if tokens else math.inf
