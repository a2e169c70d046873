"""On-disk format of a built dataset: example records in ArrayRecord shards, plus JSON manifests.

Layout of a dataset directory (one part per process that built it)::

    tokenizer.json
    part-00000-of-00002-shard-00000-of-00004.array_record
    ...
    manifest-00000-of-00002.json     a part's manifest: its settings, input, shards, counts
    manifest-00001-of-00002.json
    manifest.json                    the dataset manifest (wakong build): every part, checked and summed
    .staging-part-00000-of-00002/    only while part 0 is built: its files before they replace the old ones

A record is ``encode_record``'s compact binary form of one example: its global record index, its part
number within the record, ``input_ids`` and ``labels`` with BOS/EOS (uint16 when the vocabulary fits,
else int32), and bitmaps of word and sentence starts over ``labels`` (for dynamic re-noising).

Writes are atomic: shards are written under temporary names and renamed only after every shard closed
without error, and the manifest is written last (also atomically). Any write error -- a full disk, a
read-only directory -- raises :class:`DatasetWriteError` naming the file and the real cause, and
removes the temporary files, so a manifest never claims records that are not on disk; an interruption
(``KeyboardInterrupt``) removes them too and is re-raised as it is. Temporary names are unique across
hosts, so processes on several hosts may share the directory. The manifest records each shard's size
and sha256; :func:`verify_shards` checks them.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import glob
import hashlib
import json
import os
import secrets
import signal
import struct
import threading
from typing import Any, Callable, Sequence

import numpy as np

MANIFEST_VERSION = 1
#: The manifest of a whole dataset, written by process 0 once every part is built.
DATASET_MANIFEST = "manifest.json"
_MAGIC = b"WKR1"
_HEADER = struct.Struct("<4sBxxxqiII")  # magic, id width (2 or 4), index, part, n_input, n_labels


class _Interrupt:
    seen = False  # a Ctrl-C arrived since the handler was installed


def _on_interrupt(signum, frame):
    _Interrupt.seen = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def catching_interrupts():
    """Within the block, Ctrl-C raises ``KeyboardInterrupt`` *and is remembered*: an interruption
    swallowed on the way (Python only prints a ``KeyboardInterrupt`` raised in a garbage-collector
    callback, a ``__del__`` or a thread) is still seen by :func:`check_interrupt`.

    Installed only over Python's default handler, in the main thread (an enclosing block keeps its
    own); :func:`wakong.pipeline.build` checks before it replaces anything, the ``wakong`` command
    installs it first thing.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _Interrupt.seen = False
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def check_interrupt() -> None:
    """Raises ``KeyboardInterrupt`` if Ctrl-C was pressed inside :func:`catching_interrupts`."""
    if _Interrupt.seen:
        raise KeyboardInterrupt


class DatasetWriteError(OSError):
    """Writing a dataset failed (disk full, permissions, ...); nothing was committed."""


class DatasetError(ValueError):
    """A dataset directory is incomplete or inconsistent."""


def encode_record(
    index: int,
    part: int,
    input_ids: np.ndarray,
    labels: np.ndarray,
    word_starts: np.ndarray,
    sentence_starts: np.ndarray,
    *,
    wide: bool = False,
) -> bytes:
    """Serialises one example (``wide``: int32 ids, else uint16).

    >>> rec = decode_record(encode_record(7, 0, [0, 4, 2], [0, 9, 9, 2], [0, 1, 0, 0], [0, 1, 0, 0]))
    >>> rec["index"], rec["input_ids"].tolist(), rec["word_starts"].tolist()
    (7, [0, 4, 2], [False, True, False, False])
    """
    src, tgt = np.asarray(input_ids), np.asarray(labels)
    return encode_records(
        [index], [part], src, [len(src)], tgt, [len(tgt)], np.asarray(word_starts, bool),
        np.asarray(sentence_starts, bool), wide=wide,
    )[0]


def encode_records(
    index: Sequence[int],
    part: Sequence[int],
    input_ids: np.ndarray,
    input_lengths: Sequence[int],
    labels: np.ndarray,
    label_lengths: Sequence[int],
    word_starts: np.ndarray,
    sentence_starts: np.ndarray,
    *,
    wide: bool = False,
) -> list[bytes]:
    """:func:`encode_record` for a batch: ids concatenated, ``*_lengths`` per example.

    ``word_starts`` / ``sentence_starts`` are ``bool`` arrays aligned with the concatenated ``labels``.
    """
    dtype, width = (np.int32, 4) if wide else (np.uint16, 2)
    bound = np.iinfo(dtype)
    ids = [np.asarray(input_ids), np.asarray(labels)]
    if any(len(a) and (a.min() < max(bound.min, 0) or a.max() > bound.max) for a in ids):
        raise ValueError(f"token ids outside [0, {bound.max}] do not fit {np.dtype(dtype).name} records (wide={wide})")
    src, tgt = (a.astype(dtype, copy=False).tobytes() for a in ids)
    n_src, n_tgt = np.asarray(input_lengths, np.int64), np.asarray(label_lengths, np.int64)
    nbytes = (n_tgt + 7) // 8
    pad = np.repeat(8 * _starts(nbytes) - _starts(n_tgt), n_tgt) + np.arange(int(n_tgt.sum()))
    bits = []
    for flags in (word_starts, sentence_starts):
        padded = np.zeros(8 * int(nbytes.sum()), bool)
        padded[pad] = flags
        bits.append(np.packbits(padded).tobytes())
    out = []
    s0, t0, b0 = (_starts(n).tolist() for n in (n_src * width, n_tgt * width, nbytes))
    rows = zip(index, part, n_src.tolist(), n_tgt.tolist(), nbytes.tolist(), s0, t0, b0)
    for i, k, ns, nt, nb, s, t, b in rows:
        header = _HEADER.pack(_MAGIC, width, i, k, ns, nt)
        out.append(b"".join((header, src[s : s + ns * width], tgt[t : t + nt * width], bits[0][b : b + nb],
                             bits[1][b : b + nb])))
    return out


def _starts(lengths) -> np.ndarray:
    """Exclusive cumulative sum (int64): where each of consecutive pieces of ``lengths`` starts."""
    lengths = np.asarray(lengths, np.int64)
    out = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out


def decode_record(data: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode_record`; ids come back as int32 (``DatasetError`` for damaged bytes)."""
    if len(data) < _HEADER.size:
        raise DatasetError(f"not a wakong example record ({len(data)} bytes, shorter than its header)")
    magic, width, index, part, n_src, n_tgt = _HEADER.unpack_from(data)
    if magic != _MAGIC or width not in (2, 4):
        raise DatasetError(f"not a wakong example record (header {data[:8]!r})")
    size = _HEADER.size + (n_src + n_tgt) * width + 2 * ((n_tgt + 7) // 8)  # the counts are unsigned
    if size != len(data):
        raise DatasetError(f"damaged wakong example record: {len(data)} bytes, its header describes {size}")
    dtype, at = (np.int32 if width == 4 else np.uint16), _HEADER.size
    src = np.frombuffer(data, dtype, n_src, at).astype(np.int32)
    at += n_src * width
    tgt = np.frombuffer(data, dtype, n_tgt, at).astype(np.int32)
    at += n_tgt * width
    nbits = (n_tgt + 7) // 8
    words = np.unpackbits(np.frombuffer(data, np.uint8, nbits, at), count=n_tgt).astype(bool)
    sentences = np.unpackbits(np.frombuffer(data, np.uint8, nbits, at + nbits), count=n_tgt).astype(bool)
    return {
        "index": index,
        "part": part,
        "input_ids": src,
        "labels": tgt,
        "word_starts": words,
        "sentence_starts": sentences,
    }


def temp_suffix() -> str:
    """A temporary-file suffix unique across processes and hosts (hosts sharing a directory share pids)."""
    return f".tmp-{os.getpid()}-{secrets.token_hex(4)}"


def part_prefix(process_index: int, process_count: int) -> str:
    return f"part-{process_index:05d}-of-{process_count:05d}"


def manifest_name(process_index: int, process_count: int) -> str:
    return f"manifest-{process_index:05d}-of-{process_count:05d}.json"


def staging_dir(out_dir: str, process_index: int, process_count: int) -> str:
    """Where a part is built before it replaces anything in ``out_dir`` (see :func:`wakong.pipeline.build`)."""
    return os.path.join(out_dir, f".staging-{part_prefix(process_index, process_count)}")


#: ArrayRecord writer options: a chunk per record (a random access reads one record), compressed with
#: snappy: ArrayRecord's default zstd cost most of a write for examples of ~50-1,500 bytes (a chunk per
#: ~23-token article example cost ~3x the CPU of a snappy one), and snappy's shards are 5% smaller than
#: zstd's for article examples, 23% larger for 512-token documents.
WRITER_OPTIONS = "group_size:1,snappy"


def _array_record_writer(path: str):
    from array_record.python.array_record_module import ArrayRecordWriter

    return ArrayRecordWriter(path, WRITER_OPTIONS)


_CAUSES = {  # errno -> what it means for a dataset write
    _errno.ENOSPC: "the disk is full",
    _errno.EDQUOT: "the disk quota is exceeded",
    _errno.EROFS: "the file system is read-only",
    _errno.EACCES: "no permission to write there",
    _errno.EPERM: "no permission to write there",
}


def write_error(path: str, err: Exception) -> BaseException:
    """A :class:`DatasetWriteError` naming ``path`` and the real cause of ``err`` (an ``Exception``).

    The errno comes from ``err`` (``OSError``) or, for ArrayRecord's ``RuntimeError``, from the
    system message it carries ("No space left on device", ...). A write cut short by a signal
    (``EINTR``: Ctrl-C arriving inside a system call) is an interruption, not a disk error: that
    gives a ``KeyboardInterrupt``.
    """
    code = err.errno if isinstance(err, OSError) else None
    if code is None:
        code = next((c for c in (*_CAUSES, _errno.EINTR) if os.strerror(c) in str(err)), None)
    if code == _errno.EINTR:
        return KeyboardInterrupt(f"interrupted while writing {path}")
    cause = f" ({_CAUSES[code]})" if code in _CAUSES else ""
    return DatasetWriteError(code or 0, f"writing {path} failed: {err}{cause}")


class ShardWriter:
    """Writes records to the ``num_shards`` ArrayRecord files of one part (or to some of them:
    ``shards``), atomically.

    Use as a context manager: leaving the block with an exception aborts (temporary files removed);
    :meth:`commit` renames the shards into place and returns their descriptions. ``shards`` (default:
    all) are the shard numbers this writer writes, for builds that write each shard in its own task
    (:mod:`wakong.beam`). Temporary names are unique per writer, so two attempts at the same shard
    (a retried or duplicated task) never share a file; the last rename leaves one complete shard.
    """

    def __init__(
        self,
        out_dir: str,
        prefix: str,
        num_shards: int,
        opener: Callable[[str], Any] | None = None,
        shards: Sequence[int] | None = None,
    ):
        opener = opener or _array_record_writer  # looked up at call time (tests replace it)
        self.out_dir, self.num_shards = out_dir, num_shards
        self.shards = list(range(num_shards) if shards is None else shards)
        self.names = {k: f"{prefix}-shard-{k:05d}-of-{num_shards:05d}.array_record" for k in self.shards}
        self._tmp = {k: os.path.join(out_dir, f".{name}{temp_suffix()}") for k, name in self.names.items()}
        self.counts = dict.fromkeys(self.shards, 0)
        self._writers: dict = {}
        try:
            for k, path in self._tmp.items():
                self._writers[k] = opener(path)
        except Exception as err:
            self.abort()
            raise write_error(path, err) from err
        except BaseException:  # an interruption: clean up, re-raise as is
            self.abort()
            raise

    def write(self, shard: int, data: bytes) -> None:
        self.write_many(shard, (data,))

    def write_many(self, shard: int, data: Sequence[bytes]) -> None:
        """Writes the records ``data`` to ``shard``, in order."""
        written = 0
        try:
            write = self._writers[shard].write
            for record in data:
                write(record)
                written += 1
        except Exception as err:
            self.abort()
            raise write_error(self._tmp[shard], err) from err
        except BaseException:
            self.abort()
            raise
        finally:
            self.counts[shard] += written

    def commit(self) -> list[dict]:
        for k, writer in self._writers.items():
            try:
                writer.close()
            except Exception as err:
                self.abort()
                raise write_error(self._tmp[k], err) from err
            except BaseException:
                self.abort()
                raise
        self._writers = {}
        shards = []
        try:
            for k in self.shards:
                path = os.path.join(self.out_dir, self.names[k])
                os.replace(self._tmp[k], path)
                size, digest = os.path.getsize(path), file_sha256(path)
                shards.append({"file": self.names[k], "records": self.counts[k], "bytes": size, "sha256": digest})
        except OSError as err:
            raise write_error(path, err) from err
        return shards

    def abort(self) -> None:
        for writer in self._writers.values():
            try:
                writer.close()
            except BaseException:  # already failing (or interrupted); the temporary file is removed below
                pass
        self._writers = {}
        for path in self._tmp.values():
            if os.path.lexists(path):
                os.remove(path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: str, data: dict) -> None:
    """Writes ``data`` as JSON under a temporary name, fsyncs, then renames (raises DatasetWriteError)."""
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}{temp_suffix()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(err, OSError):
            raise write_error(path, err) from err
        raise


def existing_parts(out_dir: str) -> list[str]:
    """Manifests (the dataset's and its parts') and shards already in ``out_dir``."""
    names = glob.glob(os.path.join(out_dir, "manifest-*-of-*.json"))
    names += glob.glob(os.path.join(out_dir, "part-*-of-*-shard-*.array_record"))
    names += glob.glob(os.path.join(out_dir, DATASET_MANIFEST))
    return sorted(names)


def _source_identity(source: dict) -> dict:
    """A source description without file paths (hosts may name the same files differently)."""
    files = [{k: v for k, v in f.items() if k != "path"} for f in source.get("files", [])]
    return {**source, "files": files} if "files" in source else source


def _check_parts(parts: list[dict]) -> None:
    """Same version, settings, tokenizer and input in every part; each accounts for its own records."""
    first = parts[0]
    other = f"part {first.get('process_index')}"
    for part in parts:
        name = f"part {part.get('process_index')}"
        if part.get("version") != MANIFEST_VERSION:
            raise DatasetError(f"{name} has manifest version {part.get('version')}, expected {MANIFEST_VERSION}")
        for key in ("config_fingerprint", "seed", "process_count"):
            if part[key] != first[key]:
                raise DatasetError(f"{name} differs from {other} in {key}: built with different settings")
        if part["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]:
            raise DatasetError(f"{name} was built with a different tokenizer than {other}")
        if _source_identity(part["source"]) != _source_identity(first["source"]):
            raise DatasetError(f"{name} read other input than {other} (file contents differ)")
        c, i, n = part["counts"], part["process_index"], part["source"]["records"]
        expected = len(range(i, n, part["process_count"]))
        out = c["records_written"] + sum(c["records_dropped"].values())
        if c["records_in"] != expected or out != expected:
            raise DatasetError(
                f"{name} accounts for {c['records_in']:,} records ({c['records_written']:,} written, "
                f"{sum(c['records_dropped'].values()):,} dropped), expected {expected:,} of {n:,}"
            )


def combine_parts(parts: list[dict]) -> dict:
    """Checks that part manifests make one complete build and sums their counts.

    Every part must have the same manifest version, settings (config fingerprint, seed, part count),
    tokenizer and input (file hashes and record count); the parts must be exactly ``0..count-1``; and
    part ``i`` must have read exactly the input records ``i, i + count, ...`` and written or dropped
    each once. So every input record is accounted for exactly once across the parts.

    Returns:
      ``process_count``, ``seed``, ``config``, ``config_fingerprint``, ``tokenizer``, ``source``,
      ``counts`` (summed) and ``parts`` (sorted by process index).

    Raises:
      DatasetError: naming the part and what differs or is missing.
    """
    if not parts:
        raise DatasetError("no part manifests")
    _check_parts(parts)
    count = parts[0]["process_count"]
    indices = sorted(p["process_index"] for p in parts)
    if len(set(indices)) != len(indices):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        raise DatasetError(f"parts {twice} appear more than once")
    if indices != list(range(count)):
        missing = sorted(set(range(count)) - set(indices))
        raise DatasetError(f"parts {missing} of {count} are missing (their builds did not finish)")
    parts = sorted(parts, key=lambda p: p["process_index"])
    counts: dict = {}
    for part in parts:
        add_counts(counts, part["counts"])
    return {**_summary(parts[0]), "counts": counts, "parts": parts}


def _summary(part: dict) -> dict:
    keys = ("process_count", "seed", "config", "config_fingerprint", "tokenizer", "source")
    return {key: part[key] for key in keys}


def _load_json(name: str) -> dict:
    try:
        with open(name, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read manifest {name}: {err}") from None


def read_manifests(path: str, part: int | None = None) -> dict:
    """Loads and checks the manifests of a dataset directory; returns the combined description.

    Args:
      path: the dataset directory.
      part: read only this part (the one process ``part`` built: hosts without a shared filesystem
        each hold their own part); default: every part, which must all be in ``path``.

    The result holds :func:`combine_parts`'s keys plus ``files`` (shard paths, in part then shard
    order). When ``path`` holds the dataset manifest of a finished build (``manifest.json``), every
    part manifest read must be the one it lists.

    Raises:
      DatasetError: no manifest, a missing part, parts built with different settings, a part that
        does not match the dataset manifest, or a shard whose size does not match its manifest.
    """
    pattern = "manifest-*-of-*.json" if part is None else f"manifest-{part:05d}-of-*.json"
    names = sorted(glob.glob(os.path.join(path, pattern)))
    dataset_file = os.path.join(path, DATASET_MANIFEST)
    dataset = _load_json(dataset_file) if os.path.isfile(dataset_file) else None
    if not names:
        if glob.glob(os.path.join(path, ".staging-*", "manifest-*-of-*.json")):
            raise DatasetError(
                f"{path}: its build was interrupted while replacing the dataset; run the same `wakong build` "
                "again to finish it"
            )
        what = "no manifest-*.json" if part is None else f"no manifest of part {part}"
        raise DatasetError(f"{path} holds {what}: not a dataset directory, or its build did not finish")
    parts = [_load_json(name) for name in names]
    if dataset is not None:
        listed = {p["process_index"]: p for p in dataset["parts"]}
        for name, p in zip(names, parts):
            if listed.get(p["process_index"]) != p or p["process_count"] != dataset["process_count"]:
                raise DatasetError(f"{name} is not the part listed in {dataset_file} (left by another build?)")
    if part is None:
        count = parts[0]["process_count"]
        missing = sorted(set(range(count)) - {p["process_index"] for p in parts})
        if missing and dataset is not None:
            raise DatasetError(
                f"{path}: parts {missing} of {count} are not here: the build finished (manifest.json) on "
                "hosts without a shared filesystem; read this host's own part with part=process_index"
            )
        info = combine_parts(parts)
    else:
        if len(parts) > 1:
            found = ", ".join(map(os.path.basename, names))
            raise DatasetError(f"{path} holds part {part} of several builds: {found}")
        _check_parts(parts)
        info = {**_summary(parts[0]), "counts": parts[0]["counts"], "parts": parts}
    files = []
    for p in info["parts"]:
        for shard in p["shards"]:
            file = os.path.join(path, shard["file"])
            if not os.path.isfile(file) or os.path.getsize(file) != shard["bytes"]:
                raise DatasetError(f"shard {file} is missing or its size differs from the manifest")
            files.append(file)
    return {**info, "files": files}


def verify_shards(info: dict) -> int:
    """Checks every shard of :func:`read_manifests`' result against the sha256 in its manifest.

    Returns the number of bytes checked.

    Raises:
      DatasetError: naming the first shard whose bytes differ, or that its manifest holds no sha256
        (datasets built before hashes were recorded: rebuild them to verify).
    """
    shards = [shard for p in info["parts"] for shard in p["shards"]]
    checked = 0
    for file, shard in zip(info["files"], shards):
        if "sha256" not in shard:
            raise DatasetError(f"{file}: its manifest records no sha256 (built by an older wakong); rebuild to verify")
        try:
            digest = file_sha256(file)
        except OSError as err:
            raise DatasetError(f"shard {file} cannot be read: {err}") from None
        if digest != shard["sha256"]:
            raise DatasetError(f"shard {file} is corrupt: its sha256 differs from the manifest's")
        checked += shard["bytes"]
    return checked


def read_shard(file: str, limit: int | None = None) -> list[dict]:
    """The first ``limit`` (default: all) decoded records of a shard.

    Raises:
      DatasetError: naming the file, when it cannot be read or a record does not decode (corruption).
    """
    from array_record.python.array_record_module import ArrayRecordReader

    try:
        reader = ArrayRecordReader(file)
        try:
            n = reader.num_records() if limit is None else min(reader.num_records(), limit)
            data = reader.read(list(range(n))) if n else []
        finally:
            reader.close()
        return [decode_record(d) for d in data]
    except Exception as err:  # ArrayRecord raises RuntimeError/ValueError, decoding struct.error/ValueError
        reason = " ".join(str(err).split())[:300]
        raise DatasetError(f"shard {file} is corrupt or unreadable: {reason}") from None


def add_counts(total: dict, counts: dict) -> None:
    """Adds ``counts`` (nested dicts of numbers) into ``total``, key by key, in place."""
    for key, value in counts.items():
        if isinstance(value, dict):
            add_counts(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value
