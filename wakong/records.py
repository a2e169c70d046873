"""On-disk format of a built dataset: example records in ArrayRecord shards, plus JSON manifests.

Layout of a dataset directory (one part per host that built it)::

    tokenizer.json
    part-00000-of-00001-shard-00000-of-00004.array_record
    ...
    manifest-00000-of-00001.json

A record is ``encode_record``'s compact binary form of one example: its global record index, its part
number within the record, ``input_ids`` and ``labels`` with BOS/EOS (uint16 when the vocabulary fits,
else int32), and bitmaps of word and sentence starts over ``labels`` (for dynamic re-noising).

Writes are atomic: shards are written under temporary names and renamed only after every shard closed
without error, and the manifest is written last (also atomically). Any write error -- a full disk, a
read-only directory -- raises :class:`DatasetWriteError` and removes the temporary files, so a manifest
never claims records that are not on disk.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Any, Callable

import numpy as np

MANIFEST_VERSION = 1
_MAGIC = b"WKR1"
_HEADER = struct.Struct("<4sBxxxqiII")  # magic, id width (2 or 4), index, part, n_input, n_labels


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
    dtype = np.int32 if wide else np.uint16
    src, tgt = np.asarray(input_ids, dtype), np.asarray(labels, dtype)
    return b"".join(
        (
            _HEADER.pack(_MAGIC, 4 if wide else 2, index, part, len(src), len(tgt)),
            src.tobytes(),
            tgt.tobytes(),
            np.packbits(np.asarray(word_starts, bool)).tobytes(),
            np.packbits(np.asarray(sentence_starts, bool)).tobytes(),
        )
    )


def decode_record(data: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode_record`; ids come back as int32."""
    magic, width, index, part, n_src, n_tgt = _HEADER.unpack_from(data)
    if magic != _MAGIC or width not in (2, 4):
        raise DatasetError(f"not a wakong example record (header {data[:8]!r})")
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


def part_prefix(process_index: int, process_count: int) -> str:
    return f"part-{process_index:05d}-of-{process_count:05d}"


def manifest_name(process_index: int, process_count: int) -> str:
    return f"manifest-{process_index:05d}-of-{process_count:05d}.json"


def _array_record_writer(path: str):
    from array_record.python.array_record_module import ArrayRecordWriter

    return ArrayRecordWriter(path, "group_size:1")


def _write_error(path: str, err: BaseException) -> DatasetWriteError:
    errno = getattr(err, "errno", None)
    hint = " (is the disk full or the directory read-only?)"
    return DatasetWriteError(errno or 0, f"writing {path} failed: {err}{hint}")


class ShardWriter:
    """Writes records to ``num_shards`` ArrayRecord files of one part, atomically.

    Use as a context manager: leaving the block with an exception aborts (temporary files removed);
    :meth:`commit` renames the shards into place and returns their descriptions.
    """

    def __init__(
        self,
        out_dir: str,
        prefix: str,
        num_shards: int,
        opener: Callable[[str], Any] | None = None,
    ):
        opener = opener or _array_record_writer  # looked up at call time (tests replace it)
        self.out_dir, self.num_shards = out_dir, num_shards
        self.names = [f"{prefix}-shard-{k:05d}-of-{num_shards:05d}.array_record" for k in range(num_shards)]
        self._tmp = [os.path.join(out_dir, f".{name}.tmp-{os.getpid()}") for name in self.names]
        self.counts = [0] * num_shards
        self._writers: list = []
        try:
            for path in self._tmp:
                self._writers.append(opener(path))
        except BaseException as err:
            self.abort()
            raise _write_error(path, err) from err

    def write(self, shard: int, data: bytes) -> None:
        try:
            self._writers[shard].write(data)
        except BaseException as err:
            self.abort()
            raise _write_error(self._tmp[shard], err) from err
        self.counts[shard] += 1

    def commit(self) -> list[dict]:
        for k, writer in enumerate(self._writers):
            try:
                writer.close()
            except BaseException as err:
                self.abort()
                raise _write_error(self._tmp[k], err) from err
        shards = []
        for tmp, name, count in zip(self._tmp, self.names, self.counts):
            os.replace(tmp, os.path.join(self.out_dir, name))
            size = os.path.getsize(os.path.join(self.out_dir, name))
            shards.append({"file": name, "records": count, "bytes": size})
        self._writers = []
        return shards

    def abort(self) -> None:
        for writer in self._writers:
            try:
                writer.close()
            except BaseException:  # already failing; the temporary file is removed below
                pass
        self._writers = []
        for path in self._tmp:
            if os.path.lexists(path):
                os.remove(path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def write_json_atomic(path: str, data: dict) -> None:
    """Writes ``data`` as JSON under a temporary name, fsyncs, then renames (raises DatasetWriteError)."""
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise _write_error(path, err) from err


def existing_parts(out_dir: str) -> list[str]:
    """Manifests and shards already in ``out_dir``."""
    names = glob.glob(os.path.join(out_dir, "manifest-*-of-*.json"))
    names += glob.glob(os.path.join(out_dir, "part-*-of-*-shard-*.array_record"))
    return sorted(names)


def read_manifests(path: str) -> dict:
    """Loads and checks every part manifest of a dataset directory; returns the combined description.

    The result holds ``config``, ``tokenizer``, ``files`` (shard paths, in part then shard order),
    ``counts`` (summed over parts) and ``parts`` (the manifests themselves).

    Raises:
      DatasetError: no manifest, a missing part, parts built with different settings, or a shard whose
        size does not match its manifest.
    """
    names = sorted(glob.glob(os.path.join(path, "manifest-*-of-*.json")))
    if not names:
        raise DatasetError(
            f"{path} holds no manifest-*.json: not a dataset directory, or its build did not finish"
        )
    parts = []
    for name in names:
        try:
            with open(name, encoding="utf-8") as f:
                parts.append(json.load(f))
        except (OSError, ValueError) as err:
            raise DatasetError(f"cannot read manifest {name}: {err}") from None
    first = parts[0]
    if first.get("version") != MANIFEST_VERSION:
        version = first.get("version")
        raise DatasetError(f"{names[0]} has manifest version {version}, expected {MANIFEST_VERSION}")
    count = first["process_count"]
    for name, part in zip(names, parts):
        for key in ("config_fingerprint", "seed", "process_count"):
            if part[key] != first[key]:
                raise DatasetError(f"{name} differs from {names[0]} in {key}: built with different settings")
        if part["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]:
            raise DatasetError(f"{name} was built with a different tokenizer than {names[0]}")
    indices = sorted(p["process_index"] for p in parts)
    if indices != list(range(count)):
        missing = sorted(set(range(count)) - set(indices))
        raise DatasetError(f"{path}: parts {missing} of {count} are missing (their builds did not finish)")
    parts.sort(key=lambda p: p["process_index"])
    files = []
    for part in parts:
        for shard in part["shards"]:
            file = os.path.join(path, shard["file"])
            if not os.path.isfile(file) or os.path.getsize(file) != shard["bytes"]:
                raise DatasetError(f"shard {file} is missing or its size differs from the manifest")
            files.append(file)
    counts: dict = {}
    for part in parts:
        _add_counts(counts, part["counts"])
    return {
        "config": first["config"],
        "seed": first["seed"],
        "tokenizer": first["tokenizer"],
        "files": files,
        "counts": counts,
        "parts": parts,
    }


def _add_counts(total: dict, counts: dict) -> None:
    for key, value in counts.items():
        if isinstance(value, dict):
            _add_counts(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value
