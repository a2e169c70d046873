"""Bit-exact port of ``wakong==1.1.1`` (the algorithm of https://arp.shn.hk/1/).

Same ``random.Random`` calls in the same order as the reference, so the same generator state gives
the same mask schemes: ``random()`` for the budget, one ``choices`` per span, ``shuffle``,
``sample`` for the slots, ``random()`` for the symmetric shift. Quirks kept on purpose for drop-in
parity (docs/wakong.md discusses each):

* consecutive spans are separated by at least **two** unmasked words (the article asks for one);
* ``generate_mask_scheme(rng, 1)`` raises ``ValueError`` with probability ~0.152 (as the reference
  does); :class:`Wakong` guards ``seq_len < 2`` by returning a copy of the words;
* ``apply_mask_scheme`` returns the input list object itself when the scheme is empty, and skips
  spans given out of order;
* the budget ``seq_len * 0.188`` is computed in float64 (float32 changes it at e.g. ``seq_len=1250``).
"""

from __future__ import annotations

import random
from typing import Sequence

from wakong._distribution import MAX_SPAN_LEN, PROPOSED_MASK_RATE, span_length_cdfs

#: A sorted list of ``(insert_pos, span_len)``: span ``(p, s)`` covers words ``[p, p + s)``;
#: ``s == 0`` inserts a mask before word ``p`` (``p == seq_len`` appends one).
MaskScheme = list[tuple[int, int]]


def _mask_budget(rng: random.Random, seq_len: int) -> int:
    """``floor(0.188 L)``, plus one with probability ``frac(0.188 L)`` (one ``random()`` draw)."""
    budget = seq_len * PROPOSED_MASK_RATE
    whole = int(budget)
    return whole + (rng.random() < budget - float(whole))


def _span_lengths(rng: random.Random, budget: int) -> list[int]:
    """Draws truncated-Poisson lengths until the budget (each span costs ``s + 1``) is spent."""
    cdfs = span_length_cdfs()
    lengths = []
    while budget > 0:
        cap = min(MAX_SPAN_LEN, budget)
        length = rng.choices(range(cap + 1), cum_weights=cdfs[cap - 1])[0]
        lengths.append(length)
        budget -= length + 1
    rng.shuffle(lengths)
    return lengths


def generate_mask_scheme(rng: random.Random, seq_len: int) -> MaskScheme:
    """Mask scheme for a sequence of ``seq_len`` words, drawn with ``rng``.

    Args:
      rng: the generator; its state advances exactly as in the reference package.
      seq_len: number of words.

    Returns:
      Sorted ``[(insert_pos, span_len), ...]``.

    Raises:
      ValueError: for ``seq_len == 1`` when a one-word span is drawn (as the reference does).

    >>> generate_mask_scheme(random.Random(42), 40)
    [(3, 2), (9, 1), (33, 1)]
    """
    lengths = _span_lengths(rng, _mask_budget(rng, seq_len))
    n_slots = seq_len - sum(lengths) - len(lengths) + 1
    slots = sorted(rng.sample(range(n_slots), len(lengths)))
    scheme, offset = [], 0
    for slot, length in zip(slots, lengths):
        scheme.append((slot + offset, length))
        offset += length + 1
    if rng.random() < 0.5:
        scheme = [(pos + 1, length) for pos, length in scheme]
    return scheme


def apply_mask_scheme(words: list, mask_scheme: MaskScheme, mask_token="<mask>") -> list:
    """Replaces each span of ``words`` by one ``mask_token`` (zero-length spans insert one).

    >>> apply_mask_scheme(list("abcdefgh"), [(0, 0), (1, 3), (6, 1), (8, 0)])
    ['<mask>', 'a', '<mask>', 'e', 'f', '<mask>', 'h', '<mask>']
    """
    if not mask_scheme:
        return words
    spans = iter(mask_scheme)
    start, length = next(spans)
    out, i = [], 0
    while i < len(words):
        if i != start:
            out.append(words[i])
            i += 1
            continue
        out.append(mask_token)
        i += length
        start, length = next(spans, (-1, 0))
    if i == start:
        out.append(mask_token)
    return out


def pretty_print_mask_scheme(seq_len: int, mask_scheme: MaskScheme) -> None:
    """Prints ``.`` for kept words, ``x`` for masked ones and parentheses around each span.

    >>> pretty_print_mask_scheme(12, [(0, 0), (2, 3), (8, 1), (12, 0)])
    ()..(xxx)...(x)...()
    """
    cells = ["."] * seq_len
    for start, length in mask_scheme:
        cells[start : start + length] = ["x"] * length
    for k, (start, length) in enumerate(mask_scheme):
        cells.insert(start + 2 * k, "(")
        cells.insert(start + length + 2 * k + 1, ")")
    print("".join(cells))


class Wakong:
    """Stateful masker: ``Wakong(seed)(words)`` masks a word list with its own ``random.Random``.

    >>> Wakong(1)("a b c d e f g h i j k l m n".split())
    ['a', 'b', '<mask>', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n']
    """

    def __init__(self, seed) -> None:
        self.rng = random.Random(seed)

    def __call__(self, words: Sequence, mask_token="<mask>") -> list:
        if len(words) < 2:
            return words[:]
        return apply_mask_scheme(words, generate_mask_scheme(self.rng, len(words)), mask_token=mask_token)
