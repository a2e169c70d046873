"""BART text infilling with Wakong span schemes, BART's other noising functions, fixed-shape encoding.

Everything here is pure Python/NumPy and deterministic given a ``random.Random`` (the pipeline seeds one
per record from grain's per-element generator, so results depend only on ``(seed, record index)``).

A *unit* is whatever the caller masks: a word (``str``), a token id, or a whole word given as a tuple of
token ids (``(mask_id,)`` is then the mask unit). Masking on words before tokenisation, as the author of
Wakong did, is :func:`infill` on ``str`` words; the pipeline masks tokenised whole words (tuples), which
gives the same spans with an exact source/target token correspondence.

Noising order in :func:`noise_example` (fairseq's ``DenoisingDataset`` order): sentence permutation ->
text infilling -> token masking -> token deletion -> document rotation -> random-token replacement of
mask tokens. The target is always the original, unpermuted text.

Span schemes come from :func:`span_scheme`: with the default :class:`SpanSpec` it draws exactly what
``wakong.generate_mask_scheme`` draws (same ``random.Random`` calls, same output; the tests pin it bit for
bit); other specs (the BART-paper recipe: 30% masked, ``Poisson(3)``) run the same algorithm with
float64 tables. Sequences shorter than two units are never masked (``Wakong``'s guard).

Fixed shapes: :func:`pad_features` builds BART encoder/decoder arrays; :func:`apply_span_masks` turns
``(masked, inserted)`` position masks -- the output of ``wakong.span_mask`` or of :func:`scheme_masks` --
into fixed-shape encoder token ids, the swap-in point for on-device masking.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import random
from typing import Any, NamedTuple, Sequence

import numpy as np

from wakong._distribution import (
    MAX_SPAN_LEN,
    POISSON_RATE,
    PROPOSED_MASK_RATE,
    pmfs_from_cdfs,
    span_length_cdfs,
)
from wakong._reference import MaskScheme, apply_mask_scheme

#: Longest ``max_span_len`` accepted by :class:`SpanSpec`.
SPAN_LEN_LIMIT = 64


@dataclasses.dataclass(frozen=True)
class SpanSpec:
    """Parameters of the Wakong span algorithm (defaults: the reference package, bit-exact).

    Attributes:
      budget_rate: budget per unit; each span of length ``s`` costs ``s + 1``, so the masked fraction is
        about ``budget_rate * E[s] / (E[s] + 1)`` (0.1516 for the defaults). At most ``0.5``; the budget
        is capped at ``n // 2`` so placement never fails (never binding for the defaults).
      poisson_rate: rate of the span-length Poisson before truncation.
      max_span_len: longest span (the distribution is truncated at ``min(max_span_len, budget left)``).
    """

    budget_rate: float = PROPOSED_MASK_RATE
    poisson_rate: float = POISSON_RATE
    max_span_len: int = MAX_SPAN_LEN

    def __post_init__(self):
        if not 0.0 < self.budget_rate <= 0.5:
            raise ValueError(f"budget_rate must be in (0, 0.5], got {self.budget_rate}")
        if not 0.0 < self.poisson_rate < 1e3:
            raise ValueError(f"poisson_rate must be in (0, 1000), got {self.poisson_rate}")
        if int(self.max_span_len) != self.max_span_len or not 1 <= self.max_span_len <= SPAN_LEN_LIMIT:
            raise ValueError(
                f"max_span_len must be an integer in [1, {SPAN_LEN_LIMIT}], got {self.max_span_len}"
            )

    def cdfs(self) -> tuple[tuple[float, ...], ...]:
        """``cdfs[m - 1]``: CDF over ``0..m`` of the span length when at most ``m`` units are left."""
        return _cdfs(self.poisson_rate, self.max_span_len)

    def pmfs(self) -> np.ndarray:
        """``float64[max_span_len, max_span_len + 1]``: the exact pmfs :func:`span_scheme` samples."""
        return pmfs_from_cdfs(self.cdfs())


@functools.cache
def _cdfs(rate: float, max_span_len: int) -> tuple[tuple[float, ...], ...]:
    """Span-length CDF tables: the shipped reference tables for the defaults, else float64 Poisson."""
    if (rate, max_span_len) == (POISSON_RATE, MAX_SPAN_LEN):
        return span_length_cdfs()
    k = np.arange(max_span_len + 1)
    log_pmf = k * math.log(rate) - rate - np.array([math.lgamma(x + 1.0) for x in k])
    pmf = np.exp(log_pmf - log_pmf.max())
    return tuple(tuple(float(c) for c in np.cumsum(pmf[: m + 1] / pmf[: m + 1].sum())) for m in k[1:])


def span_scheme(rng: random.Random, n: int, spec: SpanSpec = SpanSpec()) -> MaskScheme:
    """Wakong mask scheme for ``n`` units: sorted ``[(start, length), ...]``, ``[]`` when ``n < 2``.

    With the default ``spec`` this is ``wakong.generate_mask_scheme`` (same draws, same output, pinned
    by the tests); other specs change only the constants.

    >>> span_scheme(random.Random(42), 40)
    [(3, 2), (9, 1), (33, 1)]
    >>> span_scheme(random.Random(0), 20, SpanSpec(budget_rate=0.4, poisson_rate=3.0))
    [(8, 4), (14, 2)]
    """
    if n < 2:
        return []
    return _scheme(rng, n, spec.budget_rate, spec.max_span_len, spec.cdfs())


def _scheme(rng: random.Random, n: int, rate: float, max_span_len: int, cdfs) -> MaskScheme:
    """The reference algorithm with its constants as arguments: the same draws, in the same order.

    ``random.Random``'s ``choices``, ``shuffle`` and ``sample`` are inlined (the same ``random()`` /
    ``getrandbits`` calls and arithmetic, :func:`_shuffle`, :func:`_sample`; the tests compare outputs
    and generator states with ``wakong.generate_mask_scheme`` and ``random.Random``): about three
    times as fast.
    """
    uniform, bits = rng.random, rng.getrandbits
    whole = int(n * rate)
    budget = min(whole + (uniform() < n * rate - float(whole)), n // 2)
    lengths = []
    top = cdfs[max_span_len - 1]
    top_total = top[-1] + 0.0
    while budget >= max_span_len:  # choices(range(cap + 1), cum_weights=cdfs[cap - 1]), cap = max_span_len
        length = bisect.bisect_right(top, uniform() * top_total, 0, max_span_len)
        lengths.append(length)
        budget -= length + 1
    while budget > 0:  # the cap is the budget left
        cdf = cdfs[budget - 1]
        length = bisect.bisect_right(cdf, uniform() * (cdf[-1] + 0.0), 0, budget)
        lengths.append(length)
        budget -= length + 1
    if len(lengths) <= 1:  # most short sequences: nothing to shuffle, one pick (or none) from the slots
        if not lengths:
            uniform()  # the shift, drawn for nothing
            return []
        (length,) = lengths
        slots = n - length  # n - sum(lengths) - len(lengths) + 1
        if slots < 1:
            raise ValueError("Sample larger than population or is negative")
        b = slots.bit_length()
        j = bits(b)
        while j >= slots:
            j = bits(b)
        return [(j + (uniform() < 0.5), length)]
    _shuffle(bits, lengths)
    slots = sorted(_sample(bits, n - sum(lengths) - len(lengths) + 1, len(lengths)))
    offset = uniform() < 0.5
    scheme = []
    for slot, length in zip(slots, lengths):
        scheme.append((slot + offset, length))
        offset += length + 1
    return scheme


# ``random.Random._randbelow(n)`` is ``k = n.bit_length(); r = getrandbits(k)`` until ``r < n``; the
# helpers below inline it (a Python call per draw is most of their cost).


def _shuffle(bits, x: list) -> None:
    """``random.Random.shuffle(x)`` given the generator's ``getrandbits``: the same draws, in place."""
    for i in range(len(x) - 1, 0, -1):
        k = (i + 1).bit_length()
        j = bits(k)
        while j > i:
            j = bits(k)
        x[i], x[j] = x[j], x[i]


def _sample(bits, n: int, k: int) -> list[int]:
    """``random.Random.sample(range(n), k)`` given the generator's ``getrandbits``: the same draws and
    the same picks, in order."""
    if not 0 <= k <= n:
        raise ValueError("Sample larger than population or is negative")
    setsize = 21  # sample's choice between a pool and a set of picks
    if k > 5:
        setsize += 4 ** math.ceil(math.log(k * 3, 4))
    out = []
    if n <= setsize:
        pool = list(range(n))
        for left in range(n, n - k, -1):
            b = left.bit_length()
            j = bits(b)
            while j >= left:
                j = bits(b)
            out.append(pool[j])
            pool[j] = pool[left - 1]
        return out
    picked: set[int] = set()
    b = n.bit_length()
    for _ in range(k):
        j = bits(b)
        while j >= n or j in picked:
            j = bits(b)
        picked.add(j)
        out.append(j)
    return out


def scheme_masks(
    scheme: MaskScheme, length: int, max_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``wakong.span_mask`` representation of a scheme.

    Returns:
      ``masked: bool[max_len]`` (positions covered by spans) and ``inserted: bool[max_len + 1]``
      (zero-length spans: a mask goes before position ``i``; ``i == length`` appends one).

    >>> m, i = scheme_masks([(0, 0), (2, 2)], 5)
    >>> m.astype(int).tolist(), i.astype(int).tolist()
    ([0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0])
    """
    max_len = length if max_len is None else max_len
    if length > max_len:
        raise ValueError(f"length {length} exceeds max_len {max_len}")
    masked, inserted = np.zeros(max_len, bool), np.zeros(max_len + 1, bool)
    for start, span in scheme:
        if span:
            masked[start : start + span] = True
        else:
            inserted[start] = True
    return masked, inserted


def infill(units: Sequence, scheme: MaskScheme, mask: Any = "<mask>") -> list:
    """Replaces each span by one ``mask`` (a zero-length span inserts one); always a new list.

    >>> infill("a b c d e".split(), [(0, 0), (2, 2)])
    ['<mask>', 'a', 'b', '<mask>', 'e']
    """
    return list(apply_mask_scheme(list(units), scheme, mask_token=mask))


def _check_ratio(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def permute_sentences(sentences: Sequence, rng: random.Random, ratio: float = 1.0) -> list:
    """Permutes ``ceil(len * ratio)`` randomly chosen sentences among themselves (fairseq's rule).

    >>> permute_sentences(["s0", "s1", "s2", "s3"], random.Random(1))
    ['s2', 's3', 's0', 's1']
    """
    _check_ratio("permute_sentences", ratio)
    chosen = _sample(rng.getrandbits, len(sentences), math.ceil(len(sentences) * ratio))
    moved = chosen[:]
    _shuffle(rng.getrandbits, moved)
    order = list(range(len(sentences)))
    for dst, src in zip(chosen, moved):
        order[dst] = src
    return [sentences[i] for i in order]


def rotate(units: Sequence, rng: random.Random) -> list:
    """Document rotation: starts at a uniformly chosen unit other than the first (identity if < 2 units).

    >>> rotate(list("abcde"), random.Random(0))
    ['e', 'a', 'b', 'c', 'd']
    """
    if len(units) < 2:
        return list(units)
    offset = rng.randrange(1, len(units))
    return list(units[offset:]) + list(units[:offset])


def _pick(units: Sequence, rng: random.Random, ratio: float, protect: Any) -> list[int]:
    candidates = [i for i, u in enumerate(units) if u != protect]
    return rng.sample(candidates, min(len(candidates), math.ceil(len(candidates) * ratio)))


def mask_units(units: Sequence, rng: random.Random, ratio: float, mask: Any = "<mask>") -> list:
    """Token masking (BERT-style): ``ceil(ratio * n)`` units other than ``mask`` each become ``mask``.

    >>> mask_units(list("abcdef"), random.Random(0), 0.3, "_")
    ['a', 'b', 'c', '_', 'e', '_']
    """
    _check_ratio("mask", ratio)
    out = list(units)
    for i in _pick(units, rng, ratio, mask):
        out[i] = mask
    return out


def delete_units(units: Sequence, rng: random.Random, ratio: float, protect: Any = "<mask>") -> list:
    """Token deletion: removes ``ceil(ratio * n)`` uniformly chosen units (never ``protect``, the mask).

    >>> delete_units(list("abcdef"), random.Random(0), 0.3)
    ['a', 'b', 'c', 'e']
    """
    _check_ratio("delete", ratio)
    drop = set(_pick(units, rng, ratio, protect))
    return [u for i, u in enumerate(units) if i not in drop]


def replace_random(
    ids: Sequence[int], rng: random.Random, ratio: float, mask_id: int, vocab: Sequence[int]
) -> list:
    """Replaces each ``mask_id`` by a uniform draw from ``vocab`` with probability ``ratio``.

    >>> replace_random([5, 4, 6, 4], random.Random(4), 0.5, mask_id=4, vocab=range(10, 20))
    [5, 11, 6, 4]
    """
    _check_ratio("random_ratio", ratio)
    if ratio and not len(vocab):
        raise ValueError("random_ratio > 0 needs a non-empty vocabulary of replacement ids")
    out = list(ids)
    for i, token in enumerate(out):
        if token == mask_id and rng.random() < ratio:
            out[i] = int(vocab[rng.randrange(len(vocab))])
    return out


@dataclasses.dataclass(frozen=True)
class NoiseConfig:
    """Which BART noising functions :func:`noise_example` applies (all off except Wakong infilling).

    Attributes:
      spans: span-scheme parameters (:class:`SpanSpec`); used when ``infill``.
      infill: apply text infilling.
      unit: ``"word"`` masks whole words (the author's setting), ``"token"`` masks single token ids.
      permute_sentences: fraction of sentences permuted (BART paper: 1.0).
      rotate: probability of rotating the document.
      delete: fraction of units deleted.
      mask: fraction of units replaced one-for-one by the mask (BERT-style token masking).
      random_ratio: probability that a mask token becomes a random vocabulary token (fairseq recipe 0.1).
    """

    spans: SpanSpec = SpanSpec()
    infill: bool = True
    unit: str = "word"
    permute_sentences: float = 0.0
    rotate: float = 0.0
    delete: float = 0.0
    mask: float = 0.0
    random_ratio: float = 0.0

    def __post_init__(self):
        if self.unit not in ("word", "token"):
            raise ValueError(f"unit must be 'word' or 'token', got {self.unit!r}")
        for name in ("permute_sentences", "rotate", "delete", "mask", "random_ratio"):
            _check_ratio(name, getattr(self, name))


class Noised(NamedTuple):
    """Output of :func:`noise_example` (bodies without BOS/EOS)."""

    source: list[int]  # noised token ids
    target: list[int]  # original token ids
    n_units: int  # units the span scheme was drawn for
    scheme: MaskScheme  # the infilling scheme over the (permuted) units, as applied
    dropped_inserts: int = 0  # zero-length spans left out so the source fits ``max_source``


def noise_example(
    sentences: Sequence[Sequence[tuple[int, ...]]],
    rng: random.Random,
    config: NoiseConfig,
    *,
    mask_id: int,
    vocab: Sequence[int] = (),
    max_source: int | None = None,
) -> Noised:
    """Applies the configured BART noises to one example.

    Only zero-length spans (inserted masks) make the source longer than the target. If the source would
    exceed ``max_source`` tokens, the last inserted masks are left out until it fits (an inserted mask
    stands for no target content, so nothing is lost and every other mask keeps its span); the random
    draws are the same either way.

    Args:
      sentences: the example's sentences, each a list of words, each word a tuple of token ids.
      rng: the example's generator (all draws come from it, in the documented order).
      config: which noises to apply.
      mask_id: id of the mask token.
      vocab: replacement ids for ``random_ratio`` (non-special ids).
      max_source: longest source body wanted (``None``: no limit).

    >>> out = noise_example([[(7,), (8, 9)], [(10,), (11,), (12,)]], random.Random(1), NoiseConfig(), mask_id=4)
    >>> out.source, out.target, out.scheme   # the two-token word (8, 9) became one mask
    ([7, 4, 10, 11, 12], [7, 8, 9, 10, 11, 12], [(1, 1)])
    """
    target = [t for sentence in sentences for word in sentence for t in word]
    if config.permute_sentences and len(sentences) > 1:
        sentences = permute_sentences(sentences, rng, config.permute_sentences)
    words = [word for sentence in sentences for word in sentence]
    units = words if config.unit == "word" else [(t,) for word in words for t in word]
    mask = (mask_id,)
    scheme = span_scheme(rng, len(units), config.spans) if config.infill else []
    inserts = [k for k, (_, s) in enumerate(scheme) if s == 0]
    dropped: set[int] = set()
    if max_source is not None and len(target) + len(inserts) > max_source:  # else it surely fits
        excess = len(target) + sum(1 - sum(map(len, units[p : p + s])) for p, s in scheme) - max_source
        dropped = set(inserts[len(inserts) - min(excess, len(inserts)) :]) if excess > 0 else set()
        scheme = [span for k, span in enumerate(scheme) if k not in dropped]
    units = infill(units, scheme, mask)
    if config.mask:
        units = mask_units(units, rng, config.mask, mask)
    if config.delete:
        units = delete_units(units, rng, config.delete, mask)
    if config.rotate and rng.random() < config.rotate:
        units = rotate(units, rng)
    source = [t for unit in units for t in unit]
    if config.random_ratio:
        source = replace_random(source, rng, config.random_ratio, mask_id, vocab)
    return Noised(source, target, len(words) if config.unit == "word" else len(target), scheme, len(dropped))


def with_specials(body: Sequence[int], bos: int, eos: int, max_len: int) -> list[int]:
    """``[bos] + body + [eos]``, the body cut so the result fits ``max_len`` (EOS is always kept).

    >>> with_specials([5, 6, 7, 8], bos=0, eos=2, max_len=4)
    [0, 5, 6, 2]
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (BOS and EOS), got {max_len}")
    return [bos, *body[: max_len - 2], eos]


def pad_features(
    input_ids: Sequence[int],
    labels: Sequence[int],
    *,
    pad_id: int,
    decoder_start_id: int,
    max_source_len: int,
    max_target_len: int,
) -> dict[str, np.ndarray]:
    """Fixed-shape BART features for one example (``input_ids``/``labels`` already carry BOS/EOS).

    Returns ``input_ids``/``attention_mask`` int32 ``[max_source_len]``; ``decoder_input_ids`` (the labels
    shifted right behind ``decoder_start_id``), ``labels`` (``pad_id`` past the end),
    ``decoder_attention_mask`` int32 and ``loss_mask`` bool ``[max_target_len]``. The loss covers exactly
    the real label tokens (BOS .. EOS), never padding.

    >>> f = pad_features([0, 4, 2], [0, 7, 8, 2], pad_id=1, decoder_start_id=2,
    ...                  max_source_len=4, max_target_len=5)
    >>> [f[k].tolist() for k in ("input_ids", "decoder_input_ids", "labels", "loss_mask")]
    [[0, 4, 2, 1], [2, 0, 7, 8, 1], [0, 7, 8, 2, 1], [True, True, True, True, False]]
    """
    if len(input_ids) > max_source_len or len(labels) > max_target_len:
        raise ValueError(
            f"example of source/target length {len(input_ids)}/{len(labels)} does not fit "
            f"max_source_len/max_target_len {max_source_len}/{max_target_len}"
        )
    src = np.full(max_source_len, pad_id, np.int32)
    src[: len(input_ids)] = input_ids
    tgt = np.full(max_target_len, pad_id, np.int32)
    tgt[: len(labels)] = labels
    dec = np.full(max_target_len, pad_id, np.int32)
    dec[0] = decoder_start_id
    dec[1 : len(labels)] = labels[:-1]
    real_src = np.arange(max_source_len) < len(input_ids)
    real_tgt = np.arange(max_target_len) < len(labels)
    return {
        "input_ids": src,
        "attention_mask": real_src.astype(np.int32),
        "decoder_input_ids": dec,
        "decoder_attention_mask": real_tgt.astype(np.int32),
        "labels": tgt,
        "loss_mask": real_tgt,
    }


def apply_span_masks(
    ids: np.ndarray,
    lengths: np.ndarray,
    masked: np.ndarray,
    inserted: np.ndarray,
    *,
    mask_id: int,
    pad_id: int,
    out_len: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-shape text infilling from position masks (e.g. ``wakong.span_mask``'s output).

    Each maximal run of ``masked`` positions becomes one ``mask_id`` and every ``inserted[i]`` puts a
    ``mask_id`` before position ``i`` -- equal to :func:`infill` for Wakong schemes, whose spans are
    separated by at least two unmasked positions. Positions ``>= lengths`` are ignored.

    Args:
      ids: ``int[B, L]`` token ids (bodies, no BOS/EOS).
      lengths: ``int[B]`` valid lengths.
      masked: ``bool[B, L]``; inserted: ``bool[B, L + 1]``.
      mask_id, pad_id: special ids.
      out_len: output length; longer outputs are cut (their lengths say by how much).

    Returns:
      ``(out int32[B, out_len], out_lengths int32[B])``, ``out_lengths`` before cutting.

    >>> m, i = scheme_masks([(0, 0), (2, 2)], 5)
    >>> out, n = apply_span_masks(np.array([[5, 6, 7, 8, 9]]), np.array([5]), m[None], i[None],
    ...                           mask_id=4, pad_id=1, out_len=6)
    >>> out.tolist(), n.tolist()
    ([[4, 5, 6, 4, 9, 1]], [5])
    """
    ids, lengths = np.asarray(ids), np.asarray(lengths)
    b, l = ids.shape
    pos = np.arange(l + 1)
    valid = pos[None, :] < lengths[:, None]  # [B, L + 1]
    run_start = masked & ~np.pad(masked, ((0, 0), (1, 0)))[:, :-1]
    keep = np.pad((~masked | run_start), ((0, 0), (0, 1))) & valid
    token = np.where(np.pad(masked, ((0, 0), (0, 1))), mask_id, np.pad(ids, ((0, 0), (0, 1))))
    ins = inserted & (pos[None, :] <= lengths[:, None])
    emit = np.stack([ins, keep], axis=-1).reshape(b, 2 * (l + 1))  # insertion before token, per position
    value = np.stack([np.full_like(token, mask_id), token], axis=-1).reshape(b, 2 * (l + 1))
    where = np.cumsum(emit, axis=1) - 1
    out = np.full((b, out_len), pad_id, np.int32)
    rows, cols = np.nonzero(emit & (where < out_len))
    out[rows, where[rows, cols]] = value[rows, cols]
    return out, emit.sum(axis=1).astype(np.int32)
