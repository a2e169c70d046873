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
import shutil
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
    "commit_part",
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
    index: int, part: int, example: Example, noised: Noised | None, tokenizer: TextTokenizer
) -> bytes:
    """Serialises a noised example (BOS/EOS added; word and sentence starts over the labels), or, with
    ``noised=None`` (``output.mode: tokenized``), the unnoised document with no ``input_ids``."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    target = [t for s in example for w in s for t in w] if noised is None else noised.target
    n = len(target) + 2
    word_starts, sentence_starts = np.zeros(n, bool), np.zeros(n, bool)
    word_starts[list(itertools.accumulate((len(w) for s in example for w in s), initial=1))[:-1]] = True
    sentence_starts[list(itertools.accumulate((sum(map(len, s)) for s in example), initial=1))[:-1]] = True
    return records.encode_record(
        index,
        part,
        [] if noised is None else [bos, *noised.source, eos],
        [bos, *target, eos],
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
        if config.output.mode == "tokenized":  # unnoised documents, noised at training time
            outcome.records.append(encode_example(index, len(outcome.records), example, None, tokenizer))
            outcome.tokens += _tokens(example)
            continue
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


#: Longest piece of a word fed to tokenizer training: BPE training time grows with the square of a
#: word's length (a 256 KiB word took minutes), so longer words are cut into pieces (counted).
MAX_TRAINING_PIECE = 256


def training_texts(source: Sequence[bytes], config: BuildConfig, stats: dict | None = None):
    """The normalised text of every usable record (what the tokenizer is trained on).

    Words longer than :data:`MAX_TRAINING_PIECE` characters are cut into pieces of that length.
    ``stats`` (if given) receives the counts ``records`` (texts yielded), ``records_skipped`` (dropped
    by :func:`record_text`) and ``long_words_cut``.
    """
    stats = {} if stats is None else stats
    stats.update(records=0, records_skipped=0, long_words_cut=0)
    n = MAX_TRAINING_PIECE
    for i in range(len(source)):
        text, reason = record_text(source[i], config, {})
        if reason is not None:
            stats["records_skipped"] += 1
            continue
        words = text.split()
        if len(text) > n and max(map(len, words), default=0) > n:
            long = [w for w in words if len(w) > n]
            stats["long_words_cut"] += len(long)
            words = [" ".join(w[k : k + n] for k in range(0, len(w), n)) if len(w) > n else w for w in words]
        stats["records"] += 1
        yield " ".join(words)


def resolve_tokenizer(
    config: BuildConfig,
    source: Sequence[bytes],
    tokenizer: TextTokenizer | None = None,
    *,
    progress: Callable[[], Any] | None = None,
) -> TextTokenizer:
    """The given tokenizer, the one at ``config.tokenizer.path``, or a BPE trained on ``source``.

    A trained tokenizer carries its training counts (:func:`training_texts`) as ``.training``;
    ``progress`` is called once per record read for training (and turns on the trainer's own bars).
    """
    cfg = config.tokenizer
    if tokenizer is not None:
        return tokenizer
    if cfg.path:
        return load_tokenizer(cfg.path, cfg.special)
    stats: dict = {}
    texts = training_texts(source, config, stats)
    if progress is not None:
        texts = _calling(texts, progress)
    tok = train_tokenizer(
        texts,
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        specials=cfg.special,
        show_progress=progress is not None,
    )
    tok.training = stats
    return tok


def _calling(items, fn: Callable[[], Any]):
    for item in items:
        fn()
        yield item


_PART_FILE = re.compile(r"\.?(?:part|manifest)-(\d+)-of-(\d+)\b")


def _replaced(out_dir: str, process_index: int, process_count: int) -> list[str]:
    """Files of ``out_dir`` that a build of this part replaces: its own manifest and shards, the
    dataset manifest, and every file of a build with another number of parts."""

    def replaced(path: str) -> bool:
        match = _PART_FILE.match(os.path.basename(path))
        return match is None or int(match[2]) != process_count or int(match[1]) == process_index

    return [p for p in records.existing_parts(out_dir) if replaced(p)]


def part_identity(source, config: BuildConfig, tok: TextTokenizer, process_index: int = 0,
                  process_count: int = 1) -> dict:
    """What identifies the part a build command makes (for :func:`prepare_dir`)."""
    return _identity(_part_manifest(source, config, tok, process_index, process_count))


def _identity(manifest: dict) -> dict:
    """What makes two part manifests the output of the same command (not the timing)."""
    keys = ("version", "process_index", "process_count", "seed", "config_fingerprint")
    source = records._source_identity(manifest["source"])
    return {**{k: manifest.get(k) for k in keys}, "tokenizer": manifest["tokenizer"]["sha256"], "source": source}


def _try_identity(manifest) -> dict | None:
    try:
        return _identity(manifest)
    except (KeyError, TypeError, AttributeError):
        return None


def _read_part(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _complete(manifest: dict | None, identity: dict, where: str, moved_to: str | None = None) -> bool:
    """``manifest`` is this command's part and every file it lists is in ``where`` (shards with their
    size), or in ``moved_to`` for a staged part whose commit was interrupted."""

    def find(name: str) -> str:
        path = os.path.join(where, name)
        return path if moved_to is None or os.path.exists(path) else os.path.join(moved_to, name)

    try:
        if _identity(manifest) != identity or "counts" not in manifest:
            return False
        for shard in manifest["shards"]:
            file = find(shard["file"])
            if not os.path.isfile(file) or os.path.getsize(file) != shard["bytes"]:
                return False
        tokenizer = find("tokenizer.json")
        return os.path.isfile(tokenizer) and records.file_sha256(tokenizer) == manifest["tokenizer"]["sha256"]
    except (KeyError, TypeError, AttributeError):  # not a part manifest (None, damaged, another format)
        return False


def _remove_temporaries(out_dir: str, process_index: int, process_count: int) -> None:
    """Temporary files a killed build of this part (or, for process 0, of the dataset manifest) left."""
    for name in os.listdir(out_dir):
        if ".tmp-" not in name:
            continue
        match = _PART_FILE.match(name)
        if match is not None:
            ours = int(match[2]) != process_count or int(match[1]) == process_index
        else:
            ours = name.startswith("tokenizer.json") or (
                name.startswith(f".{records.DATASET_MANIFEST}") and process_index == 0
            )
        if ours:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))


def prepare_dir(
    out_dir: str,
    process_index: int = 0,
    process_count: int = 1,
    overwrite: bool = False,
    identity: dict | None = None,
    resume: bool = False,
) -> dict | None:
    """Makes ``out_dir`` ready for one part, touching no file of an earlier build.

    Removes temporary files and the staging directory of an earlier build of this part that was
    killed. Returns the part's manifest when this very part (``identity``: the same settings,
    tokenizer and input) is already complete there: staged by a build killed while committing it
    (the commit is finished now), or, with ``resume``, committed by a build that stopped before the
    dataset manifest was written.
    Otherwise raises ``FileExistsError`` if ``out_dir`` holds what the part would replace (see
    :func:`commit_part`) and ``overwrite`` is not set, and returns ``None``.
    """
    os.makedirs(out_dir, exist_ok=True)
    _remove_temporaries(out_dir, process_index, process_count)
    staging = records.staging_dir(out_dir, process_index, process_count)
    name = records.manifest_name(process_index, process_count)
    if os.path.isdir(staging):
        staged = _read_part(os.path.join(staging, name))
        if identity is not None and _complete(staged, identity, staging, out_dir):
            commit_part(out_dir, staging, staged)
            return staged
        if _complete(staged, _try_identity(staged), staging, out_dir) and not overwrite:
            raise FileExistsError(
                f"{out_dir} holds a build with other settings that was killed while replacing the dataset; "
                "rerun that command to finish it, or use overwrite"
            )
        shutil.rmtree(staging)
    existing = _replaced(out_dir, process_index, process_count)
    if resume and identity is not None and not os.path.exists(os.path.join(out_dir, records.DATASET_MANIFEST)):
        committed = _read_part(os.path.join(out_dir, name))
        if _complete(committed, identity, out_dir):
            return committed  # built; the dataset manifest was not written yet
    if existing and not overwrite:
        first = os.path.basename(existing[0])
        raise FileExistsError(f"{out_dir} already holds a dataset ({first} ...); use overwrite")
    return None


def commit_part(out_dir: str, staging: str, manifest: dict) -> None:
    """Replaces what the part replaces in ``out_dir`` by the complete part in ``staging``.

    Order: the dataset manifest and replaced part manifests are removed first (the old dataset is then
    no longer readable as one), replaced shards not overwritten next, then the staged shards, the
    tokenizer and last the part manifest are renamed into place. Every step can be repeated, so a build
    killed in between is finished by :func:`prepare_dir` on the next run of the same command.
    """
    i, n = manifest["process_index"], manifest["process_count"]
    new = {shard["file"] for shard in manifest["shards"]}

    def order(path: str) -> tuple[bool, bool]:  # the dataset manifest, part manifests, then shards
        name = os.path.basename(path)
        return name != records.DATASET_MANIFEST, not name.startswith("manifest")

    moved = sorted(new) + ["tokenizer.json", records.manifest_name(i, n)]
    try:
        for path in sorted(_replaced(out_dir, i, n), key=order):
            if os.path.basename(path) not in new:
                with contextlib.suppress(FileNotFoundError):  # another host sharing the directory removed it
                    os.remove(path)
        for name in moved:
            if os.path.exists(os.path.join(staging, name)):
                os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
                _phase("replacing")
        _fsync_dir(out_dir)
        shutil.rmtree(staging)
    except OSError as err:
        raise records.DatasetWriteError(err.errno or 0, f"replacing the dataset in {out_dir} failed: {err}") from err


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    resume: bool = False,
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
      resume: return the part's manifest if ``out_dir`` holds this very part (same settings, tokenizer
        and input) but no dataset manifest yet (:func:`wakong.multihost.build` writes it last).

    Safety: the tokenizer, settings and ``out_dir`` are checked first; the part is then built into a
    staging directory (``out_dir/.staging-part-*``: tokenizer, shards, and the part manifest last) and
    only a complete part replaces what it replaces (:func:`commit_part`). A failure, an interruption
    or a kill before that leaves an earlier dataset untouched; a kill during the replacement (renames
    only) is finished by the next run of the same command (:func:`prepare_dir`).

    Raises:
      records.DatasetWriteError: a write failed (e.g. disk full); nothing is replaced.
    """
    start = time.perf_counter()
    out_dir = os.fspath(out_dir)
    check_workers(workers)
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    tok = resolve_tokenizer(config, source, tokenizer)  # everything is checked before out_dir is touched
    manifest = _part_manifest(source, config, tok, process_index, process_count)
    reused = prepare_dir(out_dir, process_index, process_count, overwrite, _identity(manifest), resume)
    if reused is not None:
        return reused
    staging = records.staging_dir(out_dir, process_index, process_count)
    try:
        os.makedirs(staging)
    except OSError as err:
        raise records._write_error(staging, err) from err
    try:
        _phase("staging")
        try:
            tok.save(os.path.join(staging, "tokenizer.json"))
        except OSError as err:
            raise records._write_error(os.path.join(staging, "tokenizer.json"), err) from err
        _write_part(source, staging, config, tok, manifest, workers, progress, start)
        _phase("staged")
    except BaseException:  # a failure or an interruption: the old dataset is untouched
        shutil.rmtree(staging, ignore_errors=True)
        raise
    commit_part(out_dir, staging, manifest)
    _phase("committed")
    return manifest


def check_workers(workers: int) -> None:
    """``workers`` must be an int >= 0 (``ValueError`` naming it)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0 (0: in process), got {workers!r}")


def _phase(name: str) -> None:
    """Marks a phase of :func:`build` (tests replace it to inject failures and kills)."""


def _part_manifest(source, config: BuildConfig, tok: TextTokenizer, process_index: int, process_count: int) -> dict:
    """The part manifest's settings, tokenizer and input (shards, counts and timing come with the build)."""
    tokenizer = {
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
    }
    if getattr(tok, "training", None) is not None:
        tokenizer["training"] = tok.training
    return {
        "version": records.MANIFEST_VERSION,
        "process_index": process_index,
        "process_count": process_count,
        "seed": config.seed,
        "config": config.to_dict(),
        "config_fingerprint": config.fingerprint(),
        "tokenizer": tokenizer,
        "source": {**getattr(source, "describe", dict)(), "records": len(source)},
    }


def _write_part(source, staging: str, config: BuildConfig, tok: TextTokenizer, manifest: dict, workers: int,
                progress, start: float) -> None:
    """Builds the part's shards in ``staging``, completes ``manifest`` and writes it there last."""
    process_index, process_count = manifest["process_index"], manifest["process_count"]
    ds = build_dataset(source, config, tok, process_index=process_index, process_count=process_count)
    n_local, num_shards = len(ds), config.output.num_shards
    dropped = dict.fromkeys(DROP_REASONS, 0)
    counts = {"records_in": 0, "records_written": 0, "examples": 0, "tokens": 0, "source_tokens": 0}
    events: dict[str, int] = {}
    stats = MaskStats(config.noise.spans)
    loop_start = time.perf_counter()
    prefix = records.part_prefix(process_index, process_count)
    with records.ShardWriter(staging, prefix, num_shards) as writer:
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
            if j == n_local // 2:
                _phase("shards")
        if counts["records_in"] != n_local:  # each record in is counted once, as written or dropped
            raise RuntimeError(f"record accounting is off: {counts}, dropped {dropped}, expected {n_local}")
        shards = writer.commit()
    loop_seconds = time.perf_counter() - loop_start
    seconds = time.perf_counter() - start
    manifest.update(
        shards=shards,
        counts={**counts, "records_dropped": dropped, "events": dict(sorted(events.items()))},
        mask_stats=stats.state(),
        timing={
            "seconds": seconds,
            "loop_seconds": loop_seconds,
            "tokens_per_second": counts["tokens"] / max(seconds, 1e-9),
            "workers": workers,
        },
    )
    records.write_json_atomic(os.path.join(staging, records.manifest_name(process_index, process_count)), manifest)
