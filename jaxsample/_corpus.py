"""A real next-word distribution from text every Python install ships: ``pydoc_data.topics``.

A smoothed bigram model over the words of the Python reference documentation gives genuine
long-tailed next-token logits (``V`` about 3.4k) for demos and benchmarks, with no download.
"""

from __future__ import annotations

import collections
import functools
import re

import numpy as np

_WORD = re.compile(r"[a-z_]+|[^\sa-z_]")


@functools.cache
def words() -> tuple[str, ...]:
    """Lower-cased words and punctuation of ``pydoc_data.topics``, in order."""
    from pydoc_data.topics import topics

    return tuple(_WORD.findall(" ".join(topics[k] for k in sorted(topics)).lower()))


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """Distinct words, most frequent first (ties alphabetical)."""
    counts = collections.Counter(words())
    return tuple(sorted(counts, key=lambda w: (-counts[w], w)))


def next_word_logits(context: str, smoothing: float = 0.05) -> np.ndarray:
    """``float32[V]`` log-probabilities of the word following ``context`` (add-``smoothing`` bigram)."""
    vocab = vocabulary()
    index = {w: i for i, w in enumerate(vocab)}
    if context not in index:
        raise ValueError(f"context {context!r} is not a word of the corpus")
    seq = words()
    counts = np.full(len(vocab), smoothing)
    for a, b in zip(seq, seq[1:]):
        if a == context:
            counts[index[b]] += 1.0
    return np.log(counts / counts.sum()).astype(np.float32)
