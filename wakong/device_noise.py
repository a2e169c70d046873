"""BART noising inside a jitted train step: tokenized documents in, encoder/decoder arrays out.

:func:`wakong.infilling.noise_example` noises one example on the host with ``random.Random``;
:class:`DeviceNoiser` applies the same noises to a fixed-shape batch of documents with explicit JAX
keys, so a data pipeline only has to tokenize (``wakong build`` with ``output.mode: tokenized``,
read with :func:`wakong.reader.batches`) and the accelerator draws fresh masks every step::

    noiser = DeviceNoiser.create(config.noise, tokenizer, max_source_len=512, max_target_len=512)
    params = noiser.params(config.noise, tokenizer.random_ids)       # traced: new values never recompile
    features = jax.jit(noiser)(params, keys, documents)              # input_ids, labels, loss_mask, ...

Each row's output has the joint law of the host path for its document (same order of noises:
sentence permutation -> text infilling -> token masking -> token deletion -> document rotation ->
random-token replacement of masks; the same dropping of trailing inserted masks when the source would
not fit), with probabilities rounded to multiples of ``2**-32`` (span lengths, budget), ``2**-31``
(rotation, replacement) or ``2**-64`` (uniform indices); subsets and orders come from sorting 64-bit
random keys (ties: probability below ``2**-50`` per row). A row's result depends only on its key and
its document, never on its position in the batch or on the other rows.

Static (hashable :class:`DeviceNoiser`, a ``jax.jit`` static argument): shapes, special ids, the
longest span ``K`` and which noises are compiled in. Traced (:class:`NoiseParams`): the span
distribution (budget rate, Poisson rate), the unit (word or token), the ratios of sentence
permutation, token masking and deletion (as exact ``ceil(ratio * n)`` count tables), the rotation and
replacement probabilities, and the replacement vocabulary. A ratio left at 0 costs nothing when its
noise is not compiled in; a non-zero ratio for a noise that is not compiled in is a ``ValueError``.

Layout: a document row holds ``tokens int32[B, L]`` (no BOS/EOS), ``lengths int32[B]`` (0: a padding
row, which comes out all padding with no loss), ``word_starts`` and ``sentence_starts bool[B, L]``.
Noising works on token positions throughout: spans are drawn over units (words or tokens) with
:func:`wakong._span_mask.sample_spans` and mapped to tokens; every unit's fate (kept, one mask for a
span, one mask for a masked word, deleted) is decided in place, and one scatter writes the source.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._noise import threefry2x32
from jaxsample._types import Array, ArrayLike, KeyLike
from wakong import _span_mask as sm
from wakong.infilling import NoiseConfig

_U32 = jnp.uint32
# Purposes: each gets its own threefry key per row (block 2**31 + purpose of the row key), so that no
# stream of one purpose can meet another's (the span sampler's streams are small numbers).
_SPANS, _PERMUTE, _MASK, _DELETE, _ROTATE, _REPLACE = range(6)
DOCUMENT_KEYS = ("tokens", "lengths", "word_starts", "sentence_starts")


class NoiseParams(NamedTuple):
    """The traced values of a :class:`~wakong.infilling.NoiseConfig` (see :meth:`DeviceNoiser.params`)."""

    spans: sm.SpanTables  # budget and span-length tables of the spec, units 0..L
    token_units: ArrayLike  # bool[]: mask single tokens (``unit: token``) instead of whole words
    permute_counts: ArrayLike  # int32[L + 1]: sentences permuted among n, ceil(n * permute_sentences)
    mask_counts: ArrayLike  # int32[L + 1]: units masked among n candidates, ceil(n * mask)
    delete_counts: ArrayLike  # int32[L + 1]: units deleted among n candidates, ceil(n * delete)
    rotate: ArrayLike  # uint32[]: P(rotate) * 2**31
    random_ratio: ArrayLike  # uint32[]: P(a mask becomes a random token) * 2**31
    random_ids: ArrayLike  # int32[V]: replacement ids (non-special)


def _ceil_counts(ratio: float, n: int) -> np.ndarray:
    """``ceil(k * ratio)`` for ``k = 0..n`` in float64, as the host path computes it."""
    return np.array([math.ceil(k * ratio) for k in range(n + 1)], np.int32)


def _threshold31(p: float) -> np.uint32:
    """``p`` as a multiple of ``2**-31`` (``(u >> 1) < t`` happens with probability ``t / 2**31``)."""
    return np.uint32(min(round(p * 2**31), 2**31))


@dataclasses.dataclass(frozen=True)
class DeviceNoiser:
    """Static structure of on-device noising; call it as ``noiser(params, keys, documents)`` (jit-able).

    Attributes:
      max_len: document capacity ``L`` (tokens per row, no BOS/EOS); at most ``min(source_len,
        target_len) - 2`` so every document fits both sides.
      source_len, target_len: encoder / decoder lengths (with BOS and EOS).
      max_span_len: the longest span ``K`` (the span tables' static shape).
      capacity: span entries of the sampler's fast branch (:func:`wakong._span_mask.capacity`).
      infill, permute, mask, delete, rotate, replace: which noises are compiled in.
      bos_id, eos_id, pad_id, mask_id, decoder_start_id: special ids.
    """

    max_len: int
    source_len: int
    target_len: int
    bos_id: int
    eos_id: int
    pad_id: int
    mask_id: int
    decoder_start_id: int
    max_span_len: int = 10
    capacity: int = 1
    infill: bool = True
    permute: bool = False
    mask: bool = False
    delete: bool = False
    rotate: bool = False
    replace: bool = False

    def __post_init__(self):
        for name in ("max_len", "source_len", "target_len", "max_span_len", "capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_len > min(self.source_len, self.target_len) - 2:
            raise ValueError(
                f"max_len {self.max_len} must be <= min(source_len, target_len) - 2 = "
                f"{min(self.source_len, self.target_len) - 2} (BOS and EOS on both sides)"
            )
        if self.max_span_len > sm.DEVICE_SPAN_LIMIT:
            raise ValueError(f"max_span_len must be <= {sm.DEVICE_SPAN_LIMIT} on the device, got {self.max_span_len}")

    @classmethod
    def create(cls, config: NoiseConfig, tokenizer: Any, *, max_source_len: int, max_target_len: int,
               max_len: int | None = None, capacity: int | None = None) -> "DeviceNoiser":
        """The noiser for ``config`` (noises with a non-zero ratio compiled in) and a tokenizer's ids.

        ``max_len`` defaults to ``min(max_source_len, max_target_len) - 2`` (the build's document
        capacity); ``capacity`` to the span sampler's for ``config.noise.spans`` at ``max_len`` units
        (give the one of the largest budget rate you will trace).
        """
        max_len = min(max_source_len, max_target_len) - 2 if max_len is None else max_len
        capacity = sm.capacity(config.spans, max_len) if capacity is None else capacity
        return cls(
            max_len=max_len, source_len=max_source_len, target_len=max_target_len,
            bos_id=int(tokenizer.bos_id), eos_id=int(tokenizer.eos_id), pad_id=int(tokenizer.pad_id),
            mask_id=int(tokenizer.mask_id), decoder_start_id=int(tokenizer.decoder_start_id),
            max_span_len=config.spans.max_span_len, capacity=capacity, infill=config.infill,
            permute=config.permute_sentences > 0, mask=config.mask > 0, delete=config.delete > 0,
            rotate=config.rotate > 0, replace=config.random_ratio > 0,
        )

    def params(self, config: NoiseConfig, random_ids: ArrayLike = ()) -> NoiseParams:
        """The traced :class:`NoiseParams` of ``config`` (numpy arrays; pass them to the jitted call).

        Raises:
          ValueError: ``config`` needs a noise that is not compiled in, a different longest span, or
            replacement ids that are missing or outside ``int32``.
        """
        compiled = {"infill": (config.infill, self.infill),
                    "permute_sentences": (config.permute_sentences, self.permute),
                    "mask": (config.mask, self.mask), "delete": (config.delete, self.delete),
                    "rotate": (config.rotate, self.rotate), "random_ratio": (config.random_ratio, self.replace)}
        missing = [name for name, (value, on) in compiled.items() if value and not on]
        if missing:
            raise ValueError(f"noise {', '.join(missing)} is not compiled into this DeviceNoiser; create it with "
                             "a config that enables it (its ratio can then change without recompiling)")
        if config.spans.max_span_len != self.max_span_len:
            raise ValueError(f"noise.spans.max_span_len {config.spans.max_span_len} differs from the noiser's "
                             f"{self.max_span_len} (a static shape)")
        ids = np.asarray(random_ids, np.int64).reshape(-1)
        if self.replace and ids.size == 0:
            raise ValueError("random_ratio needs a non-empty vocabulary of replacement ids (tokenizer.random_ids)")
        if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
            raise ValueError("random_ids must be non-negative int32 token ids")
        n = self.max_len
        return NoiseParams(
            spans=sm.span_tables(config.spans, n),
            token_units=np.bool_(config.unit == "token"),
            permute_counts=_ceil_counts(config.permute_sentences, n),
            mask_counts=_ceil_counts(config.mask, n),
            delete_counts=_ceil_counts(config.delete, n),
            rotate=_threshold31(config.rotate),
            random_ratio=_threshold31(config.random_ratio),
            random_ids=(ids if ids.size else np.zeros(1)).astype(np.int32),
        )

    def __call__(self, params: NoiseParams, keys: KeyLike, documents: Mapping[str, ArrayLike], *,
                 with_spans: bool = False) -> dict[str, Array]:
        """Noises a batch of documents.

        Args:
          params: :meth:`params` (traced).
          keys: one PRNG key per row (``[B]`` typed or raw ``uint32[B, 2]``; e.g. the reader's
            ``noise_keys``), or one key (row ``b`` then uses ``fold_in(key, b)``).
          documents: ``tokens int[B, L]``, ``lengths int[B]``, ``word_starts``, ``sentence_starts
            bool[B, L]`` (``L == max_len``); other keys are ignored.
          with_spans: also return the unit-level spans (``span_masked bool[B, L]``, ``span_inserted
            bool[B, L + 1]``, ``units int32[B]``), e.g. for mask statistics.

        Returns:
          HF BART features: ``input_ids``, ``attention_mask`` ``int32[B, source_len]``;
          ``decoder_input_ids``, ``decoder_attention_mask``, ``labels`` ``int32[B, target_len]`` and
          ``loss_mask bool[B, target_len]``, as :func:`wakong.infilling.pad_features` builds them.
        """
        missing = [k for k in DOCUMENT_KEYS if k not in documents]
        if missing:
            raise ValueError(f"documents need {list(DOCUMENT_KEYS)}; missing {missing}")
        tokens = jnp.asarray(documents["tokens"], jnp.int32)
        if tokens.ndim != 2 or tokens.shape[1] != self.max_len:
            raise ValueError(f"tokens must be [B, max_len={self.max_len}], got shape {tokens.shape}")
        lengths = documents["lengths"]
        if np.shape(lengths) != tokens.shape[:1]:
            raise ValueError(f"lengths must be [B={tokens.shape[0]}], got shape {np.shape(lengths)}")
        lengths = sm._check_lengths(lengths, self.max_len)
        flags = [jnp.asarray(documents[k], bool) for k in ("word_starts", "sentence_starts")]
        if any(f.shape != tokens.shape for f in flags):
            raise ValueError(f"word_starts and sentence_starts must be [B, L] like tokens {tokens.shape}")
        k1, k2 = sm._key_words(keys, tokens.shape[:1])
        return _noise(self, params, k1, k2, tokens, lengths, *flags, with_spans)


# --------------------------------------------------------------------------- random helpers (rows first)


def _purpose(k1: Array, k2: Array, purpose: int) -> tuple[Array, Array]:
    """The row keys ``uint32[B]`` of one purpose: block ``2**31 + purpose`` of each row key."""
    return threefry2x32(k1, k2, jnp.full_like(k1, 2**31 + purpose), jnp.zeros_like(k1))


def _words(k1: Array, k2: Array, n: int) -> tuple[Array, Array]:
    """``(lo, hi) uint32[B, n]``: blocks ``0..n-1`` of the row keys."""
    i = jnp.arange(n, dtype=_U32)[None, :]
    return threefry2x32(k1[:, None], k2[:, None], jnp.zeros_like(i), i)


def _below(lo: Array, hi: Array, n: Array) -> Array:
    """``floor(x * n / 2**64)`` for the 64-bit uniform ``x = hi * 2**32 + lo`` and ``n < 2**32``: an
    integer in ``[0, n)`` whose probabilities differ from ``1 / n`` by less than ``2**-64 * n``."""
    n = jnp.asarray(n).astype(_U32)
    top, low = sm._mul_wide(hi, n, False)
    carry = (low + sm._mul_wide(lo, n, False)[0]) < low
    return (top + carry).astype(jnp.int32)


def _event(word: Array, threshold: ArrayLike) -> Array:
    """``True`` with probability ``threshold / 2**31`` (see :func:`_threshold31`)."""
    return (word >> 1) < jnp.asarray(threshold, _U32)


def _random_order(k1: Array, k2: Array, candidate: Array) -> Array:
    """``int32[B, n]``: slot indices sorted by 64-bit random keys, candidates first, so the first ``c``
    entries are a uniformly random ordering of the ``c`` candidates."""
    lo, hi = _words(k1, k2, candidate.shape[1])
    index = jnp.broadcast_to(jnp.arange(candidate.shape[1], dtype=jnp.int32), candidate.shape)
    return lax.sort(((~candidate).astype(jnp.int32), hi, lo, index), dimension=1, num_keys=3, is_stable=True)[3]


def _choose(k1: Array, k2: Array, candidate: Array, counts: ArrayLike) -> Array:
    """``bool[B, n]``: a uniform ``counts[#candidates]``-subset of the candidates of each row."""
    order = _random_order(k1, k2, candidate)
    k = jnp.take(jnp.asarray(counts), candidate.sum(axis=1))
    rank = jnp.arange(candidate.shape[1])[None, :]
    return _scatter(jnp.zeros(candidate.shape, bool), order, rank < k[:, None])


def _scatter(out: Array, index: Array, values: Array) -> Array:
    """``out[b, index[b, i]] = values[b, i]`` (indices out of range are dropped)."""
    rows = jnp.arange(out.shape[0])[:, None]
    return out.at[rows, index].set(values, mode="drop")


def _take(x: Array, index: Array) -> Array:
    """``x[b, index[b, i]]`` with the index clipped into range."""
    return jnp.take_along_axis(x, jnp.clip(index, 0, x.shape[1] - 1), axis=1)


def _shift_right(x: Array) -> Array:
    return jnp.pad(x, ((0, 0), (1, 0)))[:, :-1]


# --------------------------------------------------------------------------- the noises


def _permute(k1, k2, counts, tokens, lengths, word_starts, sentence_starts):
    """Sentence permutation (the host's rule): ``counts[#sentences]`` uniformly chosen sentences are
    permuted among themselves uniformly. Returns the permuted ``(tokens, word_starts)``."""
    b, n = tokens.shape
    pos = jnp.arange(n)[None, :]
    sid = jnp.cumsum(sentence_starts, axis=1) - 1
    ns = sentence_starts.sum(axis=1)
    slot = jnp.arange(n)[None, :]
    start = _scatter(jnp.zeros((b, n), jnp.int32), jnp.where(sentence_starts, sid, n), jnp.broadcast_to(pos, (b, n)))
    end = jnp.where(slot + 1 < ns[:, None], jnp.pad(start, ((0, 0), (0, 1)))[:, 1:], lengths[:, None])
    size = jnp.where(slot < ns[:, None], end - start, 0)
    order = _random_order(k1, k2, slot < ns[:, None])  # a uniformly random ordering of the sentences
    chosen = _scatter(jnp.zeros((b, n), bool), order, slot < jnp.take(jnp.asarray(counts), ns)[:, None])
    # The chosen sentences, in position order, receive the first k of the random ordering: a uniformly
    # random permutation of a uniformly random k-subset, as sample() then shuffle() on the host.
    source = jnp.where(chosen, _take(order, jnp.cumsum(chosen, axis=1) - 1), slot)
    new_size = _take(size, source)
    new_start = jnp.cumsum(new_size, axis=1) - new_size
    marks = _scatter(jnp.zeros((b, n + 1), jnp.int32), jnp.where((slot > 0) & (slot < ns[:, None]), new_start, n + 1),
                     jnp.ones((b, n), jnp.int32))
    which = jnp.cumsum(marks[:, :n], axis=1)  # new sentence holding output position p
    at = _take(start, _take(source, which)) + pos - _take(new_start, which)
    valid = pos < lengths[:, None]
    return jnp.where(valid, _take(tokens, at), 0), _take(word_starts, at) & valid


def _noise(noiser: DeviceNoiser, params: NoiseParams, k1, k2, tokens, lengths, word_starts, sentence_starts,
           with_spans: bool) -> dict[str, Array]:
    b, n = tokens.shape
    pos = jnp.arange(n)[None, :]
    valid = pos < lengths[:, None]
    original = jnp.where(valid, tokens, 0)
    sentence_starts = (sentence_starts | (pos == 0)) & valid
    word_starts = (word_starts | sentence_starts | jnp.asarray(params.token_units)) & valid
    if noiser.permute:
        tokens, word_starts = _permute(*_purpose(k1, k2, _PERMUTE), params.permute_counts, original, lengths,
                                       word_starts, sentence_starts)
    else:
        tokens = original
    word = jnp.cumsum(word_starts, axis=1) - 1  # unit of every token
    units = word_starts.sum(axis=1)
    unit_slot = jnp.arange(n)[None, :]
    if noiser.infill:
        span_keys = jnp.stack(_purpose(k1, k2, _SPANS), axis=-1)
        span_masked, span_inserted = sm._sample(span_keys, units, n, noiser.capacity, params.spans)
    else:
        span_masked, span_inserted = jnp.zeros((b, n), bool), jnp.zeros((b, n + 1), bool)
    masked = _take(span_masked, word) & valid
    inserted = jnp.pad(word_starts & _take(span_inserted, word), ((0, 0), (0, 1)))
    inserted = inserted | ((jnp.arange(n + 1)[None, :] == lengths[:, None]) & _take(span_inserted, units[:, None])
                           & (units[:, None] > 0))
    run_start = masked & ~_shift_right(masked)
    # Leave out the last inserted masks when the infilled source would not fit (as the host path).
    n_inserted = inserted.sum(axis=1)
    excess = lengths + run_start.sum(axis=1) + n_inserted - masked.sum(axis=1) - (noiser.source_len - 2)
    keep = n_inserted - jnp.clip(excess, 0, n_inserted)
    inserted = inserted & (jnp.cumsum(inserted, axis=1) <= keep[:, None])

    free = (unit_slot < units[:, None]) & ~span_masked  # units that are not spans: token masking candidates
    masked_units = jnp.zeros((b, n), bool)
    if noiser.mask:
        masked_units = _choose(*_purpose(k1, k2, _MASK), free, params.mask_counts)
    deleted_units = jnp.zeros((b, n), bool)
    if noiser.delete:
        deleted_units = _choose(*_purpose(k1, k2, _DELETE), free & ~masked_units, params.delete_counts)
    unit_masked = _take(masked_units, word) & valid
    first = word_starts
    is_mask = (masked & run_start) | (unit_masked & first)
    emit = valid & ~(masked & ~run_start) & ~(unit_masked & ~first) & ~(_take(deleted_units, word) & valid)
    value = jnp.where(is_mask, noiser.mask_id, tokens)
    # Slots: before token p (an inserted mask), then token p; p = L only has the insertion slot.
    emit2 = jnp.stack([inserted, jnp.pad(emit, ((0, 0), (0, 1)))], axis=-1).reshape(b, -1)
    value2 = jnp.stack([jnp.full((b, n + 1), noiser.mask_id), jnp.pad(value, ((0, 0), (0, 1)))], axis=-1).reshape(b, -1)
    start2 = jnp.stack([inserted, jnp.pad(emit & first, ((0, 0), (0, 1)))], axis=-1).reshape(b, -1)
    body = noiser.source_len - 2
    dest = jnp.where(emit2, jnp.cumsum(emit2, axis=1) - 1, body)
    out = _scatter(jnp.full((b, body), noiser.pad_id, jnp.int32), dest, value2)
    unit_start = _scatter(jnp.zeros((b, body), bool), dest, start2)
    out_len = emit2.sum(axis=1)
    out_pos = jnp.arange(body)[None, :]
    if noiser.rotate:
        r1, r2 = _purpose(k1, k2, _ROTATE)
        lo, hi = _words(r1, r2, 2)
        n_units = unit_start.sum(axis=1)
        turn = _event(lo[:, 0], params.rotate) & (n_units >= 2)
        offset = 1 + _below(lo[:, 1], hi[:, 1], jnp.maximum(n_units - 1, 1))
        at = jnp.argmax(unit_start & (jnp.cumsum(unit_start, axis=1) == offset[:, None] + 1), axis=1)
        rolled = _take(out, (out_pos + at[:, None]) % jnp.maximum(out_len, 1)[:, None])
        out = jnp.where(turn[:, None] & (out_pos < out_len[:, None]), rolled, out)
    if noiser.replace:
        lo, hi = _words(*_purpose(k1, k2, _REPLACE), 2 * body)  # per position: a replacement, an event
        ids = jnp.asarray(params.random_ids)
        pick = jnp.take(ids, _below(lo[:, :body], hi[:, :body], ids.shape[0]))
        swap = (out == noiser.mask_id) & (out_pos < out_len[:, None]) & _event(lo[:, body:], params.random_ratio)
        out = jnp.where(swap, pick, out)
    real = lengths > 0  # a padding row comes out all padding, with no loss
    features = _features(noiser, out, out_len, original, lengths, real)
    if with_spans:
        features.update(span_masked=span_masked, span_inserted=span_inserted, units=units.astype(jnp.int32))
    return features


def _features(noiser: DeviceNoiser, body: Array, body_len: Array, target: Array, target_len: Array,
              real: Array) -> dict[str, Array]:
    """HF BART features (:func:`wakong.infilling.pad_features`) from source / target bodies."""
    b = body.shape[0]

    def framed(x, length, width):
        x = jnp.pad(x, ((0, 0), (1, width - 1 - x.shape[1])), constant_values=noiser.pad_id)
        p = jnp.arange(width)[None, :]
        x = jnp.where(p == 0, noiser.bos_id, jnp.where(p == length[:, None] + 1, noiser.eos_id, x))
        inside = (p < length[:, None] + 2) & real[:, None]
        return jnp.where(inside, x, noiser.pad_id), inside

    input_ids, source_mask = framed(body, body_len, noiser.source_len)
    labels, target_mask = framed(jnp.where(jnp.arange(target.shape[1])[None, :] < target_len[:, None], target,
                                           noiser.pad_id), target_len, noiser.target_len)
    start = jnp.full((b, 1), noiser.decoder_start_id, jnp.int32)
    decoder = jnp.where(target_mask, jnp.concatenate([start, labels[:, :-1]], axis=1), noiser.pad_id)
    return {
        "input_ids": input_ids.astype(jnp.int32),
        "attention_mask": source_mask.astype(jnp.int32),
        "decoder_input_ids": decoder.astype(jnp.int32),
        "decoder_attention_mask": target_mask.astype(jnp.int32),
        "labels": labels.astype(jnp.int32),
        "loss_mask": target_mask,
    }


__all__ = ["DOCUMENT_KEYS", "DeviceNoiser", "NoiseParams"]
