"""Text -> BART infilling examples, written to ArrayRecord shards with a manifest.

A build is one transform and one write loop:

    make_outcomes(source, config, tokenizer, indices)   records -> Outcomes (:mod:`wakong.examples`)
    _write_part                                          Outcomes -> shards, counts, manifest

:func:`make_outcomes` gives record ``i`` everything it draws from a ``random.Random`` seeded by
``(seed, i)`` only (grain's ``random_map`` derivation; the exact Wakong algorithm and the other BART
noises), so a record's examples are the same whatever the batch, the number of hosts, workers or
restarts. Host ``h`` of ``n`` builds the records ``h, h + n, ...`` (its *part*); the part's records are
cut into ``num_shards`` contiguous ranges, one ArrayRecord shard each, built in order in batches of
:data:`BATCH` records -- in this process, or whole shards by each of ``workers`` processes
(:mod:`wakong.shards`; every worker writes its own shards, so nothing funnels through one writer).
The bytes do not depend on the batch size or the worker count.

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

Kills: every finished shard leaves its summary in the staging directory, so rerunning the same
command after a kill keeps the finished shards (sha256 checked) and builds the rest
(:func:`wakong.shards.finished`); ``--runner beam`` (:mod:`wakong.beam`) writes the same files, so
either runner resumes the other's killed build.

Interruptions: Ctrl-C raises ``KeyboardInterrupt`` and is also remembered
(:func:`wakong.records.catching_interrupts`), so one swallowed on the way (Python only prints a
``KeyboardInterrupt`` raised in a garbage-collector callback) still stops the build before it replaces
anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from typing import Any, Callable, Sequence

from wakong import records
from wakong.accounting import Tally
from wakong.config import BuildConfig, load_config
from wakong.examples import DROP_REASONS, Outcome, make_examples, make_outcomes, record_text
from wakong.reader import batches, open_dataset
from wakong.shards import BATCH, ShardJob, build_shards, finished, shard_ranges
from wakong.sources import ArrayRecordSource, PydocSource, TextSource, open_source
from wakong.tokenizer import TextTokenizer, load_tokenizer, train_tokenizer

__all__ = [  # the pipeline's entry points, including those that live in sibling modules
    "ArrayRecordSource",
    "BATCH",
    "BuildConfig",
    "DROP_REASONS",
    "Outcome",
    "PydocSource",
    "TextSource",
    "batches",
    "build",
    "load_config",
    "load_tokenizer",
    "make_examples",
    "make_outcomes",
    "open_dataset",
    "open_source",
    "commit_part",
    "open_staging",
    "prepare_dir",
    "resolve_tokenizer",
    "shard_ranges",
    "train_tokenizer",
    "training_texts",
    "write_progress",
]

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
    return _identity(part_manifest(source, config, tok, process_index, process_count))


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
        tokenizer = find(manifest["tokenizer"].get("file", "tokenizer.json"))
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
            ours = name.startswith("tokenizer.") or (
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

    Removes temporary files and the staging directory of a killed earlier build of this part, unless
    that build was this very part (``identity``; its finished shards are reused). Returns the part's
    manifest when this very part (``identity``: the same settings,
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
        if identity is None or _read_part(os.path.join(staging, _PROGRESS)) != _as_json({"identity": identity}):
            shutil.rmtree(staging)  # else: this part's killed build, whose finished shards the build reuses
    existing = _replaced(out_dir, process_index, process_count)
    if resume and identity is not None and not os.path.exists(os.path.join(out_dir, records.DATASET_MANIFEST)):
        committed = _read_part(os.path.join(out_dir, name))
        if _complete(committed, identity, out_dir):
            return committed  # built; the dataset manifest was not written yet
    if existing and not overwrite:
        first = os.path.basename(existing[0])
        raise FileExistsError(f"{out_dir} already holds a dataset ({first} ...); use overwrite")
    return None


#: In a staging directory: the identity of the part being built (so a rerun may reuse finished shards).
_PROGRESS = "progress.json"


def open_staging(staging: str) -> None:
    """Creates the staging directory, or keeps the one a killed build of this very part left (with its
    finished shards: :func:`prepare_dir` removed any other) without what cut-short writes left there:
    temporary files and hidden files (a Beam run's marker, so that its abandoned tasks stop)."""
    try:
        os.makedirs(staging, exist_ok=True)
        for name in os.listdir(staging):
            path = os.path.join(staging, name)
            if (name.startswith(".") or ".tmp-" in name) and not os.path.isdir(path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
    except OSError as err:
        raise records.write_error(staging, err) from err


def write_progress(staging: str, identity: dict) -> None:
    """Records in ``staging`` which part is built there (``identity``), so that :func:`prepare_dir` keeps it
    for a rerun of the same command, which reuses its finished shards (:func:`wakong.shards.finished`)."""
    records.write_json_atomic(os.path.join(staging, _PROGRESS), {"identity": identity})


def _as_json(data):
    return json.loads(json.dumps(data))


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

    tokenizer = manifest.get("tokenizer", {}).get("file", "tokenizer.json")
    moved = sorted(new) + [tokenizer, records.manifest_name(i, n)]
    try:
        for path in sorted(_replaced(out_dir, i, n), key=order):
            if os.path.basename(path) not in new:
                with contextlib.suppress(FileNotFoundError):  # another host sharing the directory removed it
                    os.remove(path)
        for other in {"tokenizer.json", "tokenizer.model"} - {tokenizer}:  # of a build with the other kind
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, other))
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
      workers: worker processes, each building whole shards (0: in this process; at most
        ``output.num_shards`` are used). The output does not depend on it.
      process_index, process_count: this host's slice of the records (``record_index % count``).
      overwrite: replace an earlier build in ``out_dir`` (otherwise ``FileExistsError``).
      progress: called once per record with its :class:`Outcome` (in record order without workers;
        with workers, as their batches finish, without the serialised ``records``).
      resume: return the part's manifest if ``out_dir`` holds this very part (same settings, tokenizer
        and input) but no dataset manifest yet (:func:`wakong.multihost.build` writes it last).

    Safety: the tokenizer, settings and ``out_dir`` are checked first; the part is then built into a
    staging directory (``out_dir/.staging-part-*``: tokenizer, shards, and the part manifest last) and
    only a complete part replaces what it replaces (:func:`commit_part`). A failure, an interruption
    or a kill before that leaves an earlier dataset untouched; a kill during the replacement (renames
    only) is finished by the next run of the same command (:func:`prepare_dir`).

    Raises:
      records.DatasetWriteError: a write failed (e.g. disk full); nothing is replaced.
      KeyboardInterrupt: Ctrl-C; nothing is replaced.
    """
    with records.catching_interrupts():
        return _build(source, os.fspath(out_dir), config, tokenizer, workers, process_index, process_count,
                      overwrite, progress, resume)


def _build(source, out_dir, config, tokenizer, workers, process_index, process_count, overwrite, progress,
           resume) -> dict:
    start = time.perf_counter()
    check_workers(workers)
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    tok = resolve_tokenizer(config, source, tokenizer)  # everything is checked before out_dir is touched
    manifest = part_manifest(source, config, tok, process_index, process_count)
    reused = prepare_dir(out_dir, process_index, process_count, overwrite, _identity(manifest), resume)
    if reused is not None:
        return reused
    staging = records.staging_dir(out_dir, process_index, process_count)
    open_staging(staging)
    try:
        write_progress(staging, _identity(manifest))
        _phase("staging")
        try:
            tok.save(os.path.join(staging, tok.file_name))
        except OSError as err:
            raise records.write_error(os.path.join(staging, tok.file_name), err) from err
        _write_part(source, staging, config, tok, manifest, workers, progress, start)
        _phase("staged")
        records.check_interrupt()
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


def part_manifest(source, config: BuildConfig, tok: TextTokenizer, process_index: int, process_count: int) -> dict:
    """The part manifest's settings, tokenizer and input (shards, counts and timing come with the build)."""
    tokenizer = {
        "file": tok.file_name,
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
    indices = range(process_index, len(source), process_count)
    prefix = records.part_prefix(process_index, process_count)
    loop_start = time.perf_counter()
    job = ShardJob(source, config, tok, staging, prefix, indices)
    done = finished(staging, config.output.num_shards)  # by a killed build of this very part
    results = build_shards(job, workers, progress, halfway=lambda: _phase("shards"), done=done)
    tally = Tally(config)
    for result in results:
        tally.merge(result["tally"])
    counts = tally.counts
    if counts["records_in"] != len(indices):  # each record in is counted once, as written or dropped
        raise RuntimeError(f"record accounting is off: {counts}, dropped {tally.dropped}, expected {len(indices)}")
    loop_seconds = time.perf_counter() - loop_start
    seconds = time.perf_counter() - start
    manifest.update(
        shards=[file for result in results for file in result["files"]],
        counts=tally.manifest_counts(),
        mask_stats=tally.stats.state(),
        timing={
            "seconds": seconds,
            "loop_seconds": loop_seconds,
            "tokens_per_second": counts["tokens"] / max(seconds, 1e-9),
            "workers": workers,
        },
    )
    records.write_json_atomic(os.path.join(staging, records.manifest_name(process_index, process_count)), manifest)
