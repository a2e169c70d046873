"""Records -> noised BART examples, a batch of records at a time: the per-record step of a build.

:func:`make_outcomes` is the whole transform: records ``indices`` of a source in, one :class:`Outcome`
per record out (serialised examples, or a drop reason; events, token counts, span schemes). A record's
outcome depends only on its index, its content and the seed -- never on the batch it comes in, the
worker or host that makes it, or restarts -- so any runner may split the records as it likes.

For a batch of records:

1. decode (:func:`record_text`: UTF-8 repairs, JSON field, size policy), split sentences and words
   (:func:`wakong.text.sentence_words`, the whole batch at once);
2. tokenise every record at once (:meth:`wakong.tokenizer.TextTokenizer.encode_records`);
3. pack examples under the length policies (:func:`_batch_examples`, on token counts: an example is a
   contiguous range of the record's tokens, in pieces of words); sentence examples are chosen in NumPy
   over the batch, documents and records with a sentence too long for one example by :func:`_examples`;
4. noise: record ``i`` draws from ``random.Random(record_seeds(seed, [i]))`` -- every random choice of
   its examples, in order, exactly as :func:`wakong.infilling.noise_example` draws them (the exact
   ``wakong==1.1.1`` algorithm for the default span constants). Only the draws run per example (per
   span, not per token); building the sources from the drawn schemes runs vectorised over the batch.
   Noises other than infilling, sentence permutation and random-token replacement (token masking,
   deletion, rotation) take :func:`~wakong.infilling.noise_example` itself, per example. With
   ``output.mode: tokenized`` nothing is drawn: the examples are written unnoised (labels, word and
   sentence starts, no ``input_ids``) for :mod:`wakong.device_noise`;
5. serialise (:func:`wakong.records.encode_records`, vectorised).

:func:`record_seeds` reproduces grain's ``random_map`` generator (``Philox(seed)`` with counter
``[0, 0, 0, i]``, then ``integers(2**63)``), vectorised, so builds write the same records, byte for
byte, as the earlier grain pipeline.

Accounting: every record ends as written (one or more examples) or dropped with one reason
(:data:`DROP_REASONS`); content changes short of a drop are counted as events (see
:mod:`wakong.pipeline`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from typing import NamedTuple, Sequence

import numpy as np

from wakong import records
from wakong.config import BuildConfig
from wakong.infilling import _scheme, noise_example, permute_sentences
from wakong.records import _starts
from wakong.text import decode_utf8, sentence_words, truncate_utf8
from wakong.tokenizer import TextTokenizer

__all__ = ["DROP_REASONS", "Outcome", "make_examples", "make_outcomes", "read_records", "record_seeds",
           "record_text"]

#: Reasons a record can be dropped for.
DROP_REASONS = ("empty", "too_short", "too_long", "invalid_utf8", "invalid_json", "oversize")


@dataclasses.dataclass
class Outcome:
    """What became of one input record."""

    index: int
    records: list[bytes]  # serialised examples (empty when dropped)
    dropped: str | None = None  # reason, when no example was written
    events: dict[str, int] = dataclasses.field(default_factory=dict)
    tokens: int = 0  # target tokens written (without BOS/EOS)
    source_tokens: int = 0  # encoder tokens written (without BOS/EOS)
    schemes: list[tuple[int, list]] = dataclasses.field(default_factory=list)  # (units, scheme) per example


def _count(events: dict, key: str, n: int = 1) -> None:
    if n:
        events[key] = events.get(key, 0) + n


def _ranges(starts, lengths) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each ``(s, n)``."""
    lengths = np.asarray(lengths, np.int64)
    return np.repeat(np.asarray(starts, np.int64) - _starts(lengths), lengths) + np.arange(int(lengths.sum()))


# ---------------------------------------------------------------- per-record seeds

_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)  # Philox4x64 multipliers and key increments
_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _mulhilo(m: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """High and low 64-bit words of ``m * x`` (uint64 arrays, exact)."""
    m0, m1 = np.uint64(m & 0xFFFFFFFF), np.uint64(m >> 32)
    x0, x1 = x & _LOW, x >> _32
    p00, p01, p10 = m0 * x0, m0 * x1, m1 * x0
    mid = (p00 >> _32) + (p01 & _LOW) + (p10 & _LOW)
    return m1 * x1 + (p01 >> _32) + (p10 >> _32) + (mid >> _32), np.uint64(m) * x


def record_seeds(seed: int, indices: Sequence[int]) -> np.ndarray:
    """``uint64[n]``: the ``random.Random`` seed of each record (what grain's ``random_map`` gives).

    >>> int(record_seeds(0, [5])[0])
    2111681714185103491
    """
    k0, k1 = (int(k) for k in np.random.SeedSequence(seed).generate_state(2, np.uint64))
    c3 = np.asarray(indices, np.uint64).reshape(-1)
    c0, c1, c2 = np.ones_like(c3), np.zeros_like(c3), np.zeros_like(c3)
    with np.errstate(over="ignore"):
        for r in range(10):  # Philox4x64-10 of counter [1, 0, 0, i] (numpy increments before drawing)
            if r:
                k0, k1 = (k0 + _W[0]) % 2**64, (k1 + _W[1]) % 2**64
            hi0, lo0 = _mulhilo(_M[0], c0)
            hi1, lo1 = _mulhilo(_M[1], c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return c0 >> np.uint64(1)


# ---------------------------------------------------------------- text


def record_text(raw: bytes, config: BuildConfig, events: dict) -> tuple[str | None, str | None]:
    """Decodes one raw record: ``(text, None)`` or ``(None, drop reason)``."""
    cfg = config.input
    if len(raw) > cfg.max_record_bytes:
        if cfg.oversize == "drop":
            return None, "oversize"
        raw = truncate_utf8(raw, cfg.max_record_bytes)
        _count(events, "oversize_truncated_records")
    text, replaced = decode_utf8(bytes(raw), cfg.utf8_errors)
    if text is None:
        return None, "invalid_utf8"
    if replaced:
        _count(events, "utf8_repaired_records")
        _count(events, "utf8_replacements", replaced)
    if cfg.field:
        if not text.strip():
            return None, "empty"
        try:
            obj = json.loads(text)
        except ValueError:
            return None, "invalid_json"
        if not isinstance(obj, dict) or not isinstance(obj.get(cfg.field), str):
            return None, "invalid_json"
        text = obj[cfg.field]
    return text, None


def read_records(source: Sequence[bytes], indices: Sequence[int]) -> list[bytes]:
    """``source[i]`` for each index (through ``source.read(indices)`` when the source batches reads)."""
    read = getattr(source, "read", None)
    return list(read(indices)) if read is not None else [source[i] for i in indices]


# ---------------------------------------------------------------- examples under the length policies

#: A piece of an example: ``(first token, token lengths of its words)``; an example is a list of pieces
#: (its sentences, or pieces of a sentence too long for one example) covering a contiguous token range.
Piece = tuple[int, list[int]]


def _pieces(start: int, words: list[int], budget: int, events: dict) -> list[Piece]:
    """Splits a sentence that does not fit ``budget`` tokens at word boundaries (cutting longer words)."""
    if sum(words) <= budget:
        return [(start, words)]
    pieces, current, size, at = [], [], 0, start
    for word in words:
        parts = [word]
        if word > budget:
            parts = [min(budget, word - k) for k in range(0, word, budget)]
            _count(events, "words_cut")
        for part in parts:
            if current and size + part > budget:
                pieces.append((at, current))
                at, current, size = at + size, [], 0
            current.append(part)
            size += part
    pieces.append((at, current))
    return pieces


def _tokens(example: list[Piece]) -> int:
    return sum(sum(words) for _, words in example)


def _examples(sentences: list[Piece], config: BuildConfig, events: dict) -> tuple[list[list[Piece]], str | None]:
    """Examples of one record (its sentences' pieces) under the length policies, or a drop reason."""
    cfg = config.examples
    budget = min(cfg.max_source_len, cfg.max_target_len) - 2
    if cfg.unit == "document":
        if sum(len(words) for _, words in sentences) < cfg.min_words:
            return [], "too_short"
        chunks, current, size = [], [], 0
        for start, words in sentences:
            for piece in _pieces(start, words, budget, events):
                n = sum(piece[1])
                if current and size + n > budget:
                    chunks.append(current)
                    current, size = [], 0
                current.append(piece)
                size += n
        chunks.append(current)
        if len(chunks) > 1:
            if cfg.too_long == "drop":
                return [], "too_long"
            if cfg.too_long == "truncate":
                _count(events, "truncated_records")
                _count(events, "tokens_dropped", sum(map(_tokens, chunks[1:])))
                chunks = chunks[:1]
            else:
                _count(events, "split_records")
        return chunks, None
    out, short, long = [], 0, 0
    for start, words in sentences:
        if len(words) < cfg.min_words:
            short += 1
            continue
        pieces = _pieces(start, words, budget, events)
        if len(pieces) > 1:
            if cfg.too_long == "drop":
                long += 1
                continue
            if cfg.too_long == "truncate":
                _count(events, "truncated_sentences")
                _count(events, "tokens_dropped", _tokens(pieces[1:]))
                pieces = pieces[:1]
            else:
                _count(events, "split_sentences")
        out.extend([piece] for piece in pieces)
    if out:
        _count(events, "short_sentences_dropped", short)
        _count(events, "long_sentences_dropped", long)
        return out, None
    return [], "too_long" if long > short else "too_short"


# ---------------------------------------------------------------- the batch


def make_outcomes(
    source: Sequence[bytes], config: BuildConfig, tokenizer: TextTokenizer, indices: Sequence[int]
) -> list[Outcome]:
    """The :class:`Outcome` of each record ``indices`` of ``source`` (global indices), in order.

    Deterministic: a record's outcome depends only on its index, its bytes, ``config`` and the
    tokenizer, whatever the batch (the tests compare batches of 1 and of many).
    """
    indices = [int(i) for i in indices]
    rngs = [random.Random(int(s)) for s in record_seeds(config.seed, indices)]
    return _outcomes(indices, read_records(source, indices), rngs, config, tokenizer)


def make_examples(
    index: int, raw: bytes, rng: random.Random, config: BuildConfig, tokenizer: TextTokenizer
) -> Outcome:
    """Everything that happens to record ``index`` (deterministic given ``rng``)."""
    return _outcomes([index], [raw], [rng], config, tokenizer)[0]


def _outcomes(indices, raws, rngs, config: BuildConfig, tok: TextTokenizer) -> list[Outcome]:
    outcomes = [Outcome(i, []) for i in indices]
    texts = []
    for outcome, raw in zip(outcomes, raws):
        text, outcome.dropped = record_text(raw, config, outcome.events)
        texts.append(text or "")
    words, sizes, per_record = sentence_words(texts)  # per record: its words; the words of each sentence
    ids, lengths = tok.encode_records(words)
    batch = _batch_examples(_sentences(lengths, sizes, per_record, outcomes), outcomes, config)
    if len(batch.record):
        _noise_and_encode([(outcomes[r], rngs[r]) for r in batch.record.tolist()], ids, batch, config, tok)
    return outcomes


class _Sentences(NamedTuple):
    """A batch's sentences with tokens: record (in the batch), first token, words with tokens, tokens,
    where its words start in ``lengths`` (the token counts of the words with tokens)."""

    record: np.ndarray
    first: np.ndarray
    words: np.ndarray
    tokens: np.ndarray
    word_at: np.ndarray
    lengths: np.ndarray


def _sentences(lengths: np.ndarray, sizes: np.ndarray, per_record: np.ndarray, outcomes: list[Outcome]) -> _Sentences:
    """The sentences with tokens of a batch from its words' token counts ``lengths``, the words of each
    sentence ``sizes`` and the sentences of each record ``per_record``; counts ``words_without_tokens``."""
    kept = lengths > 0
    word_at = _starts(sizes)
    words, tokens = (np.add.reduceat(x.astype(np.int64), word_at) if len(sizes) else np.zeros(0, np.int64)
                     for x in (kept, lengths))
    record = np.repeat(np.arange(len(per_record)), per_record)
    without = np.bincount(record, sizes - words, len(outcomes)).astype(np.int64).tolist()
    for outcome, n in zip(outcomes, without):
        _count(outcome.events, "words_without_tokens", n)
    has = words > 0
    return _Sentences(record[has], _starts(tokens)[has], words[has], tokens[has], _starts(words)[has],
                      lengths[kept].astype(np.int64))


class _Batch(NamedTuple):
    """A batch's examples, in record order: each example's record (in the batch) and number of pieces,
    each piece's first token and number of words, each word's number of tokens."""

    record: np.ndarray
    per_example: np.ndarray
    piece_start: np.ndarray
    piece_words: np.ndarray
    word_lengths: np.ndarray


def _batch_examples(table: _Sentences, outcomes: list[Outcome], config: BuildConfig) -> _Batch:
    """Every example of a batch under the length policies; a record without one gets its drop reason.

    Sentence examples: records whose sentences all fit or are too short are taken in NumPy (each
    sentence with ``min_words`` words one example); the other records go through :func:`_examples`.
    """
    cfg, n = config.examples, len(outcomes)
    live = np.fromiter((outcome.dropped is None for outcome in outcomes), bool, n)
    count = np.bincount(table.record, minlength=n)
    slow, fast = live, np.zeros(0, np.int64)
    if cfg.unit == "sentence":
        short = table.words < cfg.min_words
        whole = ~short & (table.tokens <= min(cfg.max_source_len, cfg.max_target_len) - 2)
        slow = live & (np.bincount(table.record, ~short & ~whole, n) > 0)
        fast = np.flatnonzero(whole & (live & ~slow)[table.record])
        shorts, taken = np.bincount(table.record[short], minlength=n), np.bincount(table.record[fast], minlength=n)
        here = (live & ~slow).tolist()
        for outcome, ours, sentences, dropped, kept in zip(outcomes, here, count.tolist(), shorts.tolist(),
                                                           taken.tolist()):
            if ours and kept:
                _count(outcome.events, "short_sentences_dropped", dropped)
            elif ours:
                outcome.dropped = "too_short" if sentences else "empty"
    rows = np.append(_starts(count), len(table.record)).tolist()
    record, per_example, piece_start, piece_words, word_lengths = [], [], [], [], []
    for r in np.flatnonzero(slow).tolist():
        outcome, (a, b) = outcomes[r], rows[r : r + 2]
        ends = np.cumsum(table.words[a:b]).tolist()
        lengths = table.lengths[table.word_at[a] : table.word_at[a] + ends[-1]].tolist() if b > a else []
        sentences = [(t, lengths[i:j]) for t, i, j in zip(table.first[a:b].tolist(), [0, *ends], ends)]
        chunks, reason = _examples(sentences, config, outcome.events) if sentences else ([], "empty")
        outcome.dropped = None if chunks else reason
        for chunk in chunks:
            record.append(r)
            per_example.append(len(chunk))
            for start, piece in chunk:
                piece_start.append(start)
                piece_words.append(len(piece))
                word_lengths.extend(piece)
    slow = _Batch(*(np.asarray(x, np.int64) for x in (record, per_example, piece_start, piece_words, word_lengths)))
    fast = _Batch(table.record[fast], np.ones(len(fast), np.int64), table.first[fast], table.words[fast],
                  table.lengths[_ranges(table.word_at[fast], table.words[fast])])
    if not len(fast.record) or not len(slow.record):
        return slow if len(slow.record) else fast
    both = _Batch(*map(np.concatenate, zip(fast, slow)))  # in record order (a record's examples come from one)
    order = np.argsort(both.record, kind="stable")
    pieces = _ranges(_starts(both.per_example)[order], both.per_example[order])
    return _Batch(both.record[order], both.per_example[order], both.piece_start[pieces], both.piece_words[pieces],
                  both.word_lengths[_ranges(_starts(both.piece_words)[pieces], both.piece_words[pieces])])


# ---------------------------------------------------------------- noising and serialising


def _fast(noise) -> bool:
    """Whether the vectorised noiser covers these settings (else ``noise_example`` per example)."""
    return not (noise.mask or noise.delete or noise.rotate)


def _noise_and_encode(examples, ids: np.ndarray, batch: _Batch, config: BuildConfig, tok: TextTokenizer) -> None:
    """Draws, builds and serialises every example of a batch (``examples``: its outcome and generator
    each); fills the outcomes in place."""
    noise = config.noise
    _, per_example, piece_start, piece_words, word_lengths = batch
    word_at = _starts(word_lengths)  # the first token of each word, in the batch's token ids:
    word_first = np.repeat(piece_start - word_at[_starts(piece_words)], piece_words) + word_at
    piece_tokens = np.add.reduceat(word_lengths, _starts(piece_words))
    n_tokens = np.add.reduceat(piece_tokens, _starts(per_example))
    n_words = np.add.reduceat(piece_words, _starts(per_example))
    layout = (piece_start, per_example, piece_words, word_first, word_lengths, n_tokens, n_words)
    if config.output.mode == "tokenized":  # unnoised documents (no input_ids), noised on the device
        _encode(examples, ids, None, None, layout, tok)
        return
    # random replacement treats a mask id inside the text (a tokenizer whose mask is ordinary text) as a mask
    if _fast(noise) and not (noise.random_ratio and (ids == tok.mask_id).any()):
        order, schemes, values = _draws(examples, layout, config, tok)
        source, source_lengths = _sources(ids, order, schemes, values, layout, noise.unit == "word", tok.mask_id)
    else:
        source, source_lengths = _noised(examples, ids.tolist(), layout, config, tok)
    _encode(examples, ids, source, source_lengths, layout, tok)


def _chunks(layout, examples: Sequence[int] | None = None) -> list[list[Piece]]:
    """The pieces (first token, token counts of its words) of ``examples`` (default: all), as lists."""
    piece_start, per_example, piece_words, _, word_lengths, _, _ = layout
    piece_at, word_at = _starts(per_example), _starts(piece_words)
    out = []
    for e in range(len(per_example)) if examples is None else examples:
        first, last = int(piece_at[e]), int(piece_at[e] + per_example[e])
        at, ends = int(word_at[first]), np.cumsum(piece_words[first:last]).tolist()
        lengths = word_lengths[at : at + ends[-1]].tolist()
        out.append([(start, lengths[a:b]) for start, a, b in zip(piece_start[first:last].tolist(), [0, *ends], ends)])
    return out


def _draws(examples, layout, config: BuildConfig, tok: TextTokenizer):
    """Every example's random choices, in order (:func:`~wakong.infilling.noise_example`'s draws):
    the permuted order of the batch's pieces (``None``: nothing permuted), each example's span scheme
    and the ids its masks become (``None``: all ``mask_id``). Records schemes and dropped insertions in
    the outcomes."""
    noise, spec = config.noise, config.noise.spans
    _, per_example, _, _, _, n_tokens, n_words = layout
    body, word_unit, permute, ratio = (config.examples.max_source_len - 2, noise.unit == "word",
                                       noise.permute_sentences, noise.random_ratio)
    infill, rate, top, cdfs = noise.infill, spec.budget_rate, spec.max_span_len, spec.cdfs()
    order, schemes, values = ([] if permute else None), [], ([] if ratio else None)
    at = 0
    for e, ((outcome, rng), count, n, n_unit) in enumerate(zip(examples, per_example.tolist(), n_tokens.tolist(),
                                                               (n_words if word_unit else n_tokens).tolist())):
        local = range(count)
        if permute:
            if count > 1:
                local = permute_sentences(list(local), rng, permute)
            order.extend([at + k for k in local])
            at += count
        scheme = _scheme(rng, n_unit, rate, top, cdfs) if infill and n_unit >= 2 else []
        if n + len(scheme) > body:
            pieces = _chunks(layout, [e])[0] if word_unit else None
            scheme, dropped = _fit(scheme, n, body, [pieces[k] for k in local] if word_unit else None)
            _count(outcome.events, "inserted_masks_dropped", dropped)
        schemes.append(scheme)
        if ratio:
            values.extend(_replacements(len(scheme), rng, ratio, tok))
        if infill:
            outcome.schemes.append((n_unit, scheme))
    return order, schemes, values


def _noised(examples, flat: list[int], layout, config: BuildConfig,
            tok: TextTokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Sources from :func:`~wakong.infilling.noise_example`, example by example (any noise settings)."""
    options = dict(mask_id=tok.mask_id, vocab=tok.random_ids, max_source=config.examples.max_source_len - 2)
    sources = []
    for (outcome, rng), chunk in zip(examples, _chunks(layout)):
        sentences = [[tuple(flat[a : a + n]) for a, n in zip(itertools.accumulate(w, initial=s), w)]
                     for s, w in chunk]
        noised = noise_example(sentences, rng, config.noise, **options)
        sources.append(noised.source)
        _count(outcome.events, "inserted_masks_dropped", noised.dropped_inserts)
        if config.noise.infill:
            outcome.schemes.append((noised.n_units, noised.scheme))
    lengths = np.fromiter(map(len, sources), np.int64, len(sources))
    return np.fromiter(itertools.chain.from_iterable(sources), np.int64, int(lengths.sum())), lengths


def _fit(scheme: list, n_tokens: int, body: int, units: list[Piece] | None) -> tuple[list, int]:
    """Leaves out the last inserted masks (zero-length spans) while the source would exceed ``body``
    tokens, as :func:`~wakong.infilling.noise_example` does; ``units``: the permuted pieces (word units),
    or ``None`` (token units)."""
    inserts = [k for k, (_, s) in enumerate(scheme) if s == 0]
    if n_tokens + len(inserts) <= body:  # else the masks standing for spans may make up for them
        return scheme, 0
    if units is None:
        covered = sum(s for _, s in scheme)
    else:
        lengths = list(itertools.chain.from_iterable(words for _, words in units))
        covered = sum(sum(lengths[p : p + s]) for p, s in scheme)
    excess = n_tokens + len(scheme) - covered - body
    if excess <= 0:
        return scheme, 0
    dropped = set(inserts[len(inserts) - min(excess, len(inserts)) :])
    return [span for k, span in enumerate(scheme) if k not in dropped], len(dropped)


def _replacements(n_masks: int, rng: random.Random, ratio: float, tok: TextTokenizer) -> list[int]:
    """The id each mask of the source becomes: ``mask_id``, or with probability ``ratio`` a random
    non-special id (the draws of :func:`~wakong.infilling.replace_random`)."""
    if not ratio:
        return [tok.mask_id] * n_masks
    vocab, mask_id = tok.random_ids, tok.mask_id
    if not len(vocab):
        raise ValueError("random_ratio > 0 needs a non-empty vocabulary of replacement ids")
    uniform, bits, size = rng.random, rng.getrandbits, len(vocab)
    b = size.bit_length()
    out = []
    for _ in range(n_masks):
        if uniform() < ratio:
            j = bits(b)  # rng.randrange(size), inlined
            while j >= size:
                j = bits(b)
            out.append(int(vocab[j]))
        else:
            out.append(mask_id)
    return out


def _sources(ids, order, schemes, values, layout, word_unit: bool, mask_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Infilled sources of a batch from the drawn schemes: ``(ids, length per example)``.

    The units (words or tokens) of each example, its pieces in ``order`` (``None``: as they come),
    then one empty unit closing the example (where an insertion at the end goes); a span ``(p, s)`` of
    example ``e`` puts a mask (``mask_id``, or its entry of ``values``) before unit ``p`` of ``e`` and
    hides the tokens of units ``p .. p + s - 1``.
    """
    _, per_example, piece_words, word_first, word_lengths, _, _ = layout
    sel = np.arange(len(piece_words)) if order is None else np.asarray(order, np.int64)
    owner = np.repeat(np.arange(len(per_example)), per_example)[sel]
    words = _ranges(_starts(piece_words)[sel], piece_words[sel])
    first, length = word_first[words], word_lengths[words]
    per_piece = piece_words[sel]
    if not word_unit:
        per_piece = np.add.reduceat(word_lengths, _starts(piece_words))[sel]
        first, length = _ranges(first, length), np.ones(int(length.sum()), np.int64)
    example_of = np.repeat(owner, per_piece)
    n_units = np.bincount(example_of, minlength=len(per_example)) + 1
    unit_at = _starts(n_units)
    position = np.arange(len(first)) + example_of  # past the closing units of the examples before
    unit_first, unit_len = np.zeros(int(n_units.sum()), np.int64), np.zeros(int(n_units.sum()), np.int64)
    unit_first[position], unit_len[position] = first, length
    counts = np.fromiter(map(len, schemes), np.int64, len(schemes))
    flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(schemes)), np.int64,
                       2 * int(counts.sum()))
    p, s = flat[0::2], flat[1::2]
    v = np.full(len(p), mask_id, np.int64) if values is None else np.asarray(values, np.int64)
    where = np.repeat(unit_at, counts) + p
    masks = np.zeros(len(unit_len), np.int64)
    masks[where] = 1
    cover = np.zeros(len(unit_len) + 1, np.int64)
    hides = (s > 0).astype(np.int64)
    np.add.at(cover, where, hides)
    np.add.at(cover, where + s, -hides)
    emitted = np.where(np.cumsum(cover)[:-1] > 0, 0, unit_len)
    out_at = _starts(masks + emitted)
    source = np.empty(int((masks + emitted).sum()), np.int64)
    source[out_at[where]] = v
    source[_ranges(out_at + masks, emitted)] = ids[_ranges(unit_first, emitted)]
    ends = np.append(out_at, len(source))[unit_at + n_units]
    return source, ends - out_at[unit_at]


def _encode(examples, ids, source, source_lengths, layout, tok: TextTokenizer) -> None:
    """Serialises the batch (BOS/EOS added; word and sentence starts over the labels); ``source=None``:
    documents without ``input_ids`` (``output.mode: tokenized``)."""
    piece_start, per_example, piece_words, word_first, _, n_tokens, _ = layout
    n = len(examples)
    first = piece_start[_starts(per_example)]
    labels = _with_specials(ids[_ranges(first, n_tokens)], n_tokens, tok)
    if source is None:
        inputs, input_lengths, source_lengths = np.zeros(0, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    else:
        inputs, input_lengths = _with_specials(source, source_lengths, tok), source_lengths + 2
    owner = np.repeat(np.arange(n), per_example)
    body_at = _starts(n_tokens) + 2 * np.arange(n) + 1 - first  # label position of token ``t`` of ``e``: t + body_at[e]
    word_starts = np.zeros(len(labels), bool)
    word_starts[word_first + np.repeat(body_at[owner], piece_words)] = True
    sentence_starts = np.zeros(len(labels), bool)
    sentence_starts[piece_start + body_at[owner]] = True
    parts, count = [], {}
    for outcome, _ in examples:  # an example's number within its record
        parts.append(count.setdefault(id(outcome), len(outcome.records)))
        count[id(outcome)] += 1
    data = records.encode_records(
        [outcome.index for outcome, _ in examples], parts, inputs, input_lengths, labels,
        n_tokens + 2, word_starts, sentence_starts, wide=tok.vocab_size > 65536,
    )
    for (outcome, _), record, t, s in zip(examples, data, n_tokens.tolist(), source_lengths.tolist()):
        outcome.records.append(record)
        outcome.tokens += t
        outcome.source_tokens += s


def _with_specials(body: np.ndarray, lengths: np.ndarray, tok: TextTokenizer) -> np.ndarray:
    """``[bos, *body_e, eos]`` for each example ``e`` of the concatenated ``body``."""
    n = len(lengths)
    out = np.empty(len(body) + 2 * n, np.int64)
    at = _starts(lengths + 2)
    out[at] = tok.bos_id
    out[at + lengths + 1] = tok.eos_id
    out[np.repeat(np.arange(n), lengths) * 2 + np.arange(len(body)) + 1] = body
    return out
