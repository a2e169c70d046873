"""Evaluation metrics: hand-computed cases, edge cases, and sacrebleu agreement for self-BLEU."""

import math

import numpy as np
import pytest

from jaxsample.evaluation import metrics as M

MASK = 4


def test_trim_cuts_rows_to_their_lengths():
    assert M.trim(np.array([[1, 2, 3], [4, 5, 6]]), np.array([2, 0])) == [(1, 2), ()]


def test_exact_match_and_token_accuracy_by_hand():
    refs = [(0, 10, 11, 2), (0, 12, 2)]
    hyps = [(0, 10, 11, 2), (0, 13, 2, 2)]
    assert M.exact_match(hyps, refs) == 0.5
    # 4 + 2 of 7 reference positions agree (the extra hypothesis token is not a reference position)
    assert M.token_accuracy(hyps, refs) == pytest.approx(6 / 7)
    assert M.token_accuracy([(0,)], [(0, 9, 9, 9)]) == 0.25  # a short hypothesis misses the rest
    assert M.exact_match([], []) == 0.0 and M.token_accuracy([], []) == 0.0


@pytest.mark.parametrize(
    "source,seq,fills",
    [
        ([0, 7, MASK, 9, 2], [0, 7, 5, 6, 9, 2], [(5, 6)]),
        ([0, 7, MASK, 9, 2], [0, 7, 9, 2], [()]),  # an empty fill
        ([0, MASK, 8, MASK, 2], [0, 8, 8, 2], [(), (8,)]),  # leftmost-shortest
        ([0, MASK, 9, 2], [0, 9, 3, 9, 2], [(9, 3)]),  # backtracking past a literal that occurs in the span
        ([0, MASK, MASK, 2], [0, 5, 6, 2], [(), (5, 6)]),
        ([0, MASK, 2], [0, 5], None),  # the literal end is missing
        ([0, 7, 2], [0, 8, 2], None),  # unmasked text changed
        ([0, 7, 2], [0, 7, 2], []),  # nothing masked
        ([MASK], [], [()]),
    ],
)
def test_infill_spans(source, seq, fills):
    assert M.infill_spans(source, seq, MASK) == fills


def test_infill_exact_match_scores_spans_and_faithfulness():
    sources = [(0, 7, MASK, 9, MASK, 2), (0, MASK, 2), (0, 1, 2)]
    refs = [(0, 7, 5, 9, 6, 6, 2), (0, 8, 2), (0, 3, 2)]  # the last reference does not match its source
    hyps = [(0, 7, 5, 9, 6, 2), (0, 1, 1, 2), (0, 3, 2)]
    got = M.infill_exact_match(sources, hyps, refs, MASK)
    assert got == {"infill_exact_match": 1 / 3, "faithful": 1.0, "spans": 3, "unaligned_references": 1}
    unfaithful = M.infill_exact_match(sources[:1], [(0, 8, 5, 9, 6, 6, 2)], refs[:1], MASK)
    assert unfaithful["infill_exact_match"] == 0.0 and unfaithful["faithful"] == 0.0


def test_distinct_n_by_hand():
    seqs = [(1, 2, 3, 1, 2), (1, 2)]
    assert M.distinct_n(seqs, 1) == pytest.approx(3 / 7)
    assert M.distinct_n(seqs, 2) == pytest.approx(3 / 5)  # (1,2) x3, (2,3), (3,1)
    assert M.distinct_n([(1,)], 2) == 0.0


def test_self_bleu_matches_sacrebleu_sentence_scores():
    from sacrebleu.metrics import BLEU

    a, b, c = "the cat sat on the mat", "the cat sat on a mat", "a dog ran in the park today"
    bleu = BLEU(effective_order=True)
    want = np.mean([bleu.sentence_score(a, [b, c]).score, bleu.sentence_score(b, [a, c]).score,
                    bleu.sentence_score(c, [a, b]).score])
    assert M.self_bleu([[a, b, c], ["alone"]]) == pytest.approx(want)
    assert M.self_bleu([[a, a]]) == pytest.approx(100.0)
    assert M.self_bleu([["x"], ["y"]]) is None  # no group has two outputs
    assert 0 < M.self_bleu([[a, b]]) < 100


def test_length_stats_and_perplexity():
    s = M.length_stats([2, 4, 9])
    assert s == {"mean": 5.0, "std": pytest.approx(math.sqrt(26 / 3)), "min": 2.0, "median": 4.0, "max": 9.0}
    assert M.length_stats([])["mean"] == 0.0
    assert M.perplexity(3 * math.log(0.5), 3) == pytest.approx(2.0)
    assert M.perplexity(0.0, 0) == math.inf
