"""Text -> BART infilling examples with grain, written to ArrayRecord shards with a manifest.

The build pipeline (see :func:`build_dataset`) is a grain ``MapDataset``::

    source[i]                          raw bytes of record i (its global index)
      .map_with_index                  (i, raw)
      .random_map(ExampleMaker, seed)  decode -> sentences -> words -> tokens -> examples -> noise
      [process_index::process_count]   this host's records

``random_map`` hands each record a generator that depends only on ``(seed, i)``; :class:`ExampleMaker`
seeds one ``random.Random`` from it and draws every random choice of the record (the exact Wakong
algorithm and the other BART noises) from that. Slicing by host comes *after* the random map, so the
examples of record ``i`` are the same whatever the number of hosts, workers or restarts.

Accounting: every record ends as written (one or more examples) or dropped with one reason --
``empty``, ``too_short``, ``too_long``, ``invalid_utf8`` (only with ``utf8_errors: strict``; the default
replaces bad bytes by U+FFFD and counts them), ``invalid_json``, ``oversize`` (only with
``oversize: drop``). Content changes short of a drop (repaired bytes, split or truncated documents,
dropped short/long sentences, cut words) are counted as events. :func:`build` checks that
``records_in == records_written + sum(dropped)`` before it writes the manifest.

Truncation: examples are packed to fit ``min(max_source_len, max_target_len) - 2`` tokens *before*
noising (sentences, then words, are never split unless one alone is too long), so the target always
ends with EOS and every mask in the source has its span in the target. Noising can only lengthen the
source by inserted masks (zero-length spans); if that overflows ``max_source_len``, the last inserted
masks are left out (counted as ``inserted_masks_dropped``; no text is lost).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import time
from typing import Any, Callable, Sequence

import grain
import numpy as np

from wakong import records
from wakong.config import BuildConfig, load_config
from wakong.infilling import Noised, noise_example
from wakong.reader import batches, mp_prefetch, open_dataset
from wakong.report import MaskStats
from wakong.sources import ArrayRecordSource, PydocSource, TextSource, open_source
from wakong.text import decode_utf8, split_sentences, split_words, truncate_utf8
from wakong.tokenizer import TextTokenizer, load_tokenizer, train_tokenizer

__all__ = [  # the pipeline's entry points, including those that live in sibling modules
    "ArrayRecordSource",
    "BuildConfig",
    "DROP_REASONS",
    "ExampleMaker",
    "Outcome",
    "PydocSource",
    "TextSource",
    "batches",
    "build",
    "build_dataset",
    "load_config",
    "load_tokenizer",
    "make_examples",
    "open_dataset",
    "open_source",
    "prepare_dir",
    "resolve_tokenizer",
    "train_tokenizer",
    "training_texts",
]

#: Reasons a record can be dropped for.
DROP_REASONS = ("empty", "too_short", "too_long", "invalid_utf8", "invalid_json", "oversize")

Example = list[list[tuple[int, ...]]]  # sentences -> words -> token ids


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


def _pieces(sentence: list[tuple[int, ...]], budget: int, events: dict) -> list[list[tuple[int, ...]]]:
    """Splits a sentence that does not fit ``budget`` tokens at word boundaries (cutting longer words)."""
    if sum(map(len, sentence)) <= budget:
        return [sentence]
    pieces, current, size = [], [], 0
    for word in sentence:
        parts = [word]
        if len(word) > budget:
            parts = [word[k : k + budget] for k in range(0, len(word), budget)]
            _count(events, "words_cut")
        for part in parts:
            if current and size + len(part) > budget:
                pieces.append(current)
                current, size = [], 0
            current.append(part)
            size += len(part)
    pieces.append(current)
    return pieces


def _pack(sentences: list[list[tuple[int, ...]]], budget: int, events: dict) -> list[Example]:
    """Greedily packs consecutive sentences (split if one alone is too long) into examples."""
    chunks, current, size = [], [], 0
    for sentence in sentences:
        for piece in _pieces(sentence, budget, events):
            n = sum(map(len, piece))
            if current and size + n > budget:
                chunks.append(current)
                current, size = [], 0
            current.append(piece)
            size += n
    if current:
        chunks.append(current)
    return chunks


def _tokens(example: Example) -> int:
    return sum(len(word) for sentence in example for word in sentence)


def _examples(
    sentences: list[list[tuple[int, ...]]], config: BuildConfig, events: dict
) -> tuple[list[Example], str | None]:
    """Examples of one record under the length policies, or a drop reason."""
    cfg = config.examples
    budget = min(cfg.max_source_len, cfg.max_target_len) - 2
    if cfg.unit == "document":
        if sum(map(len, sentences)) < cfg.min_words:
            return [], "too_short"
        chunks = _pack(sentences, budget, events)
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
    for sentence in sentences:
        if len(sentence) < cfg.min_words:
            short += 1
            continue
        pieces = _pieces(sentence, budget, events)
        if len(pieces) > 1:
            if cfg.too_long == "drop":
                long += 1
                continue
            if cfg.too_long == "truncate":
                _count(events, "truncated_sentences")
                _count(events, "tokens_dropped", sum(map(len, (w for p in pieces[1:] for w in p))))
                pieces = pieces[:1]
            else:
                _count(events, "split_sentences")
        out.extend([[piece] for piece in pieces])
    if out:
        _count(events, "short_sentences_dropped", short)
        _count(events, "long_sentences_dropped", long)
        return out, None
    return [], "too_long" if long > short else "too_short"


def encode_example(
    index: int, part: int, example: Example, noised: Noised, tokenizer: TextTokenizer
) -> bytes:
    """Serialises a noised example (BOS/EOS added; word and sentence starts over the labels)."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    n = len(noised.target) + 2
    word_starts, sentence_starts = np.zeros(n, bool), np.zeros(n, bool)
    word_starts[list(itertools.accumulate((len(w) for s in example for w in s), initial=1))[:-1]] = True
    sentence_starts[list(itertools.accumulate((sum(map(len, s)) for s in example), initial=1))[:-1]] = True
    return records.encode_record(
        index,
        part,
        [bos, *noised.source, eos],
        [bos, *noised.target, eos],
        word_starts,
        sentence_starts,
        wide=tokenizer.vocab_size > 65536,
    )


def make_examples(
    index: int, raw: bytes, rng: random.Random, config: BuildConfig, tokenizer: TextTokenizer
) -> Outcome:
    """Everything that happens to record ``index`` (deterministic given ``rng``)."""
    outcome = Outcome(index, [])
    text, reason = record_text(raw, config, outcome.events)
    if reason is None:
        words = [split_words(s) for s in split_sentences(text)]
        words = [w for w in words if w]
        if not words:
            reason = "empty"
    if reason is not None:
        outcome.dropped = reason
        return outcome
    tokens, sentences, at = tokenizer.encode_words([w for sentence in words for w in sentence]), [], 0
    for sentence in words:
        kept = [t for t in tokens[at : at + len(sentence)] if t]
        _count(outcome.events, "words_without_tokens", len(sentence) - len(kept))
        at += len(sentence)
        if kept:
            sentences.append(kept)
    examples, reason = _examples(sentences, config, outcome.events) if sentences else ([], "empty")
    body = config.examples.max_source_len - 2
    options = dict(mask_id=tokenizer.mask_id, vocab=tokenizer.random_ids, max_source=body)
    for example in examples:
        noised = noise_example(example, rng, config.noise, **options)
        _count(outcome.events, "inserted_masks_dropped", noised.dropped_inserts)
        outcome.records.append(encode_example(index, len(outcome.records), example, noised, tokenizer))
        outcome.tokens += len(noised.target)
        outcome.source_tokens += len(noised.source)
        if config.noise.infill:
            outcome.schemes.append((noised.n_units, noised.scheme))
    if not outcome.records:
        outcome.dropped = reason
    return outcome


def _with_index(index: int, raw: bytes) -> tuple[int, bytes]:
    return index, raw


class ExampleMaker(grain.transforms.RandomMap):
    """``(index, raw) -> Outcome``, every draw from a ``random.Random`` seeded by grain's generator."""

    def __init__(self, config: BuildConfig, tokenizer: TextTokenizer):
        self.config, self.tokenizer = config, tokenizer

    def random_map(self, element: tuple[int, bytes], rng: np.random.Generator) -> Outcome:
        index, raw = element
        return make_examples(index, raw, random.Random(int(rng.integers(2**63))), self.config, self.tokenizer)


def build_dataset(
    source: Sequence[bytes],
    config: BuildConfig,
    tokenizer: TextTokenizer,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """The grain ``MapDataset`` of this host's :class:`Outcome` s (see the module docstring)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    ds = grain.MapDataset.source(source).map_with_index(_with_index)
    ds = ds.random_map(ExampleMaker(config, tokenizer), seed=config.seed)
    return ds[process_index::process_count]


def training_texts(source: Sequence[bytes], config: BuildConfig):
    """The normalised text of every usable record (what the tokenizer is trained on)."""
    for i in range(len(source)):
        text, reason = record_text(source[i], config, {})
        if reason is None:
            yield " ".join(text.split())


def resolve_tokenizer(
    config: BuildConfig, source: Sequence[bytes], tokenizer: TextTokenizer | None = None
) -> TextTokenizer:
    """The given tokenizer, the one at ``config.tokenizer.path``, or a BPE trained on ``source``."""
    cfg = config.tokenizer
    if tokenizer is not None:
        return tokenizer
    if cfg.path:
        return load_tokenizer(cfg.path, cfg.special)
    texts = training_texts(source, config)
    return train_tokenizer(
        texts, vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, specials=cfg.special
    )


_PART_FILE = re.compile(r"(?:part|manifest)-(\d+)-of-(\d+)\b")


def prepare_dir(out_dir: str, process_index: int = 0, process_count: int = 1, overwrite: bool = False):
    """Makes ``out_dir`` ready for one part: refuses to mix with an earlier build unless ``overwrite``.

    What the part replaces -- its own manifest and shards, the dataset manifest, and every file of a
    build with another number of parts -- raises ``FileExistsError``, or with ``overwrite`` is removed
    (manifests first). The other parts of the same layout are left alone (other hosts write them).
    """
    os.makedirs(out_dir, exist_ok=True)

    def replaced(path: str) -> bool:
        match = _PART_FILE.match(os.path.basename(path))
        return match is None or int(match[2]) != process_count or int(match[1]) == process_index

    existing = [p for p in records.existing_parts(out_dir) if replaced(p)]
    if existing and not overwrite:
        first = os.path.basename(existing[0])
        raise FileExistsError(f"{out_dir} already holds a dataset ({first} ...); use overwrite")

    def order(path: str) -> tuple[bool, bool]:  # the dataset manifest, part manifests, then shards
        name = os.path.basename(path)
        return name != records.DATASET_MANIFEST, not name.startswith("manifest")

    for path in sorted(existing, key=order):
        with contextlib.suppress(FileNotFoundError):  # another host sharing the directory removed it
            os.remove(path)
    prefix = records.part_prefix(process_index, process_count)
    for name in os.listdir(out_dir):
        if name.startswith(f".{prefix}") and ".tmp-" in name:  # left by a crashed build
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))


def _outcomes(ds: grain.MapDataset, workers: int):
    if workers <= 0:
        return (ds[j] for j in range(len(ds)))
    return iter(mp_prefetch(ds.to_iter_dataset(), workers, per_worker_buffer_size=16))


def build(
    source: Sequence[bytes],
    out_dir: str | os.PathLike,
    config: BuildConfig,
    *,
    tokenizer: TextTokenizer | None = None,
    workers: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    overwrite: bool = False,
    progress: Callable[[Outcome], Any] | None = None,
) -> dict:
    """Builds this process's part of a dataset in ``out_dir`` and returns the part's manifest.

    :func:`wakong.multihost.build` runs this on every process of a job and merges the parts.

    Args:
      source: raw records (:mod:`wakong.sources`).
      out_dir: dataset directory (created if needed).
      config: the build settings.
      tokenizer: overrides ``config.tokenizer`` (else loaded from its path, or trained on ``source``).
      workers: grain worker processes (0: in this process). The output does not depend on it.
      process_index, process_count: this host's slice of the records (``record_index % count``).
      overwrite: replace an earlier build in ``out_dir`` (otherwise ``FileExistsError``).
      progress: called with every :class:`Outcome`, in record order.

    Raises:
      records.DatasetWriteError: a write failed (e.g. disk full); no manifest is written.
    """
    start = time.perf_counter()
    out_dir = os.fspath(out_dir)
    prepare_dir(out_dir, process_index, process_count, overwrite)
    tok = resolve_tokenizer(config, source, tokenizer)
    try:
        tok.save(os.path.join(out_dir, "tokenizer.json"))
    except OSError as err:
        raise records.DatasetWriteError(err.errno or 0, f"writing the tokenizer failed: {err}") from err
    ds = build_dataset(source, config, tok, process_index=process_index, process_count=process_count)
    n_local, num_shards = len(ds), config.output.num_shards
    dropped = dict.fromkeys(DROP_REASONS, 0)
    counts = {"records_in": 0, "records_written": 0, "examples": 0, "tokens": 0, "source_tokens": 0}
    events: dict[str, int] = {}
    stats = MaskStats(config.noise.spans)
    loop_start = time.perf_counter()
    prefix = records.part_prefix(process_index, process_count)
    with records.ShardWriter(out_dir, prefix, num_shards) as writer:
        for j, outcome in enumerate(_outcomes(ds, workers)):
            shard = j * num_shards // n_local
            for data in outcome.records:
                writer.write(shard, data)
            counts["records_in"] += 1
            if outcome.dropped is None:
                counts["records_written"] += 1
            else:
                dropped[outcome.dropped] += 1
            counts["examples"] += len(outcome.records)
            counts["tokens"] += outcome.tokens
            counts["source_tokens"] += outcome.source_tokens
            for key, value in outcome.events.items():
                _count(events, key, value)
            for n, scheme in outcome.schemes:
                stats.add(n, scheme)
            if progress is not None:
                progress(outcome)
        if counts["records_in"] != n_local:  # each record in is counted once, as written or dropped
            raise RuntimeError(f"record accounting is off: {counts}, dropped {dropped}, expected {n_local}")
        shards = writer.commit()
    loop_seconds = time.perf_counter() - loop_start
    seconds = time.perf_counter() - start
    manifest = {
        "version": records.MANIFEST_VERSION,
        "process_index": process_index,
        "process_count": process_count,
        "seed": config.seed,
        "config": config.to_dict(),
        "config_fingerprint": config.fingerprint(),
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": tok.sha256,
            "origin": tok.origin,
            "vocab_size": tok.vocab_size,
            "ids": {
                "bos": tok.bos_id,
                "pad": tok.pad_id,
                "eos": tok.eos_id,
                "unk": tok.unk_id,
                "mask": tok.mask_id,
                "decoder_start": tok.decoder_start_id,
            },
        },
        "source": {**getattr(source, "describe", dict)(), "records": len(source)},
        "shards": shards,
        "counts": {**counts, "records_dropped": dropped, "events": dict(sorted(events.items()))},
        "mask_stats": stats.state(),
        "timing": {
            "seconds": seconds,
            "loop_seconds": loop_seconds,
            "tokens_per_second": counts["tokens"] / max(seconds, 1e-9),
            "workers": workers,
        },
    }
    manifest_path = os.path.join(out_dir, records.manifest_name(process_index, process_count))
    records.write_json_atomic(manifest_path, manifest)
    return manifest
