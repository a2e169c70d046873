"""Random-access record sources: text files (plain, ``.gz``, ``.zst``), JSONL, ArrayRecord, Parquet and
Arrow / Hugging Face ``datasets`` directories (:mod:`wakong.columnar`), and Python's own docs.

Every source is a sequence of raw ``bytes`` records (decoding, JSON parsing and their failures are the
pipeline's job, so they are counted rather than raised). A record's *global index* is its position in
the concatenation of the source's files, in the order given (directories and glob patterns expand to
their files in sorted order: :func:`expand_inputs`); masks depend on it, so the manifest lists the
files with their record counts and sha256.

Text files are memory-mapped and indexed once (record boundaries only), so any record is read in
O(1) and worker processes share the pages. Compressed text (``.gz``, ``.zst``) is decompressed once
into a temporary file (under ``TMPDIR``; removed with the source) and indexed the same way. A file
that cannot be read or decompressed raises :class:`InputError` naming it.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import mmap
import os
import re
import shutil
import tempfile
import weakref
import zlib
from typing import Sequence

import numpy as np

#: Text splitting modes: one record per line, per blank-line separated paragraph, or per file.
TEXT_SPLITS = ("line", "paragraph", "file")
#: Input formats (``input.format``).
FORMATS = ("text", "jsonl", "array_record", "parquet", "arrow", "pydoc")
#: File name endings a directory given as input contributes, per format (compressed text included).
SUFFIXES = {
    "text": (".txt", ".txt.gz", ".txt.zst"),
    "jsonl": (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst"),
    "array_record": (".array_record",),
    "parquet": (".parquet",),
    "arrow": (".arrow",),
}
_BLANK_RUN = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")
_CHUNK = 1 << 20


class InputError(ValueError):
    """An input file that cannot be read: corrupt, truncated, or not of its format (names the file)."""


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def expand_inputs(paths: Sequence[str | os.PathLike], kind: str) -> list[str]:
    """Input files in order: each path as given, a directory's files (recursively; those ending in
    :data:`SUFFIXES` of ``kind``; an ``arrow`` directory is a dataset itself), a glob pattern's matches,
    both sorted.

    Raises:
      FileNotFoundError: a path that does not exist, a pattern or directory without matching files.
    """
    out = []
    for path in map(os.fspath, paths):
        if os.path.isdir(path) and kind != "arrow":
            found = sorted(
                os.path.join(root, name)
                for root, dirs, names in os.walk(path)
                for name in names
                if name.endswith(SUFFIXES.get(kind, ())) and not name.startswith(".")
            )
            if not found:
                raise FileNotFoundError(f"input directory {path} holds no {kind} files ({', '.join(SUFFIXES[kind])})")
            out += found
        elif glob.has_magic(path):
            found = sorted(glob.glob(path, recursive=True))
            if not found:
                raise FileNotFoundError(f"input pattern {path} matches no file")
            out += found
        elif not os.path.exists(path):
            raise FileNotFoundError(f"input file {path} does not exist")
        else:
            out.append(path)
    return out


def _decompressed(path: str, into: str) -> str:
    """Decompresses a ``.gz`` / ``.zst`` file into directory ``into``; returns the new file's path."""
    target = os.path.join(into, f"{len(os.listdir(into)):06d}-{os.path.basename(path)}")
    kind = "gzip" if path.endswith(".gz") else "zstd"
    try:
        with open(path, "rb") as raw, open(target, "wb") as out:
            if kind == "gzip":
                with gzip.GzipFile(fileobj=raw) as f:
                    shutil.copyfileobj(f, out, _CHUNK)
            else:
                _unzstd(raw, out)
    except OSError as err:
        if isinstance(err, gzip.BadGzipFile) or err.errno is None:
            raise InputError(f"input file {path} is not a valid {kind} file: {err}") from None
        raise
    except (EOFError, zlib.error) as err:
        raise InputError(f"input file {path} is corrupt or truncated ({kind}: {err})") from None
    except ImportError:
        raise ImportError(f"reading {path} needs zstandard: pip install 'jaxsample[data]'") from None
    except Exception as err:  # zstandard.ZstdError
        if type(err).__name__ != "ZstdError":
            raise
        raise InputError(f"input file {path} is corrupt or not zstd ({err})") from None
    return target


def _unzstd(raw, out) -> None:
    """Decompresses every zstd frame of ``raw`` into ``out``; ``EOFError`` if the last one is cut short."""
    import zstandard

    context = zstandard.ZstdDecompressor()
    frame, pending = context.decompressobj(), False
    for chunk in iter(lambda: raw.read(_CHUNK), b""):
        while chunk:
            out.write(frame.decompress(chunk))
            pending, chunk = True, b""
            if frame.eof:
                chunk, frame, pending = frame.unused_data, context.decompressobj(), False
    if pending:
        raise EOFError("the data ends inside a frame")


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class TextSource:
    """Records of UTF-8 (or not) text files, plain or compressed (``.gz``, ``.zst``).

    Args:
      paths: files, read in this order.
      split: ``"line"`` (each line a record, ``\\r\\n`` handled; a final newline ends the last record),
        ``"paragraph"`` (records separated by blank lines; blank lines themselves are not records) or
        ``"file"`` (each file one record).

    Raises:
      FileNotFoundError: a missing file; InputError: a corrupt or truncated compressed file.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], split: str = "line"):
        if split not in TEXT_SPLITS:
            raise ValueError(f"split must be one of {TEXT_SPLITS}, got {split!r}")
        if not paths:
            raise ValueError("no input files given")
        self.paths = [os.fspath(p) for p in paths]
        self.split = split
        spans, self.files, self._data, self._tmp = [], [], [], None
        for k, path in enumerate(self.paths):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"input file {path} does not exist")
            info = {"path": path, "bytes": os.path.getsize(path)}
            data_path = path
            if path.endswith((".gz", ".zst")):
                data_path = _decompressed(path, self._scratch())
                info.update(sha256=_file_sha256(path), decompressed_bytes=os.path.getsize(data_path))
            self._data.append(data_path)
            with open(data_path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(data_path) else b""
                try:
                    bounds = self._bounds(data)
                    info.setdefault("sha256", _sha256(data))
                    self.files.append({**info, "records": len(bounds)})
                finally:
                    if isinstance(data, mmap.mmap):
                        data.close()
            spans.append(np.column_stack([np.full(len(bounds), k, np.int64), bounds.reshape(-1, 2)]))
        self._spans = np.concatenate(spans) if spans else np.zeros((0, 3), np.int64)
        self._maps = None

    def _scratch(self) -> str:
        """The temporary directory of decompressed files (removed with this object)."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="wakong-input-")
            weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        return self._tmp

    def _bounds(self, data) -> np.ndarray:
        """``int64[n, 2]`` byte ranges of the records of one file."""
        n = len(data)
        if self.split == "file":
            return np.array([[0, n]], np.int64)
        if self.split == "line":
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10) if n else np.zeros(0, np.int64)
            if n and (not len(ends) or ends[-1] != n - 1):
                ends = np.append(ends, n)
            starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
            return np.column_stack([starts, ends]) if len(ends) else np.zeros((0, 2), np.int64)
        out, start = [], 0
        for match in _BLANK_RUN.finditer(data):
            if data[start : match.start()].strip():
                out.append((start, match.start()))
            start = match.end()
        if data[start:n].strip():
            out.append((start, n))
        return np.array(out, np.int64).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, index: int) -> bytes:
        if self._maps is None:
            self._maps = [self._open(p) for p in self._data]
        k, a, b = self._spans[index]
        raw = self._maps[k][a:b]
        return raw[:-1] if self.split == "line" and raw.endswith(b"\r") else raw

    @staticmethod
    def _open(path):
        if not os.path.getsize(path):
            return b""
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def __getstate__(self):
        state = {**self.__dict__, "_maps": None}
        if len(self._spans) > 4096:  # the record index goes through a file the workers memory-map
            path = os.path.join(self._scratch(), "records.npy")
            if not os.path.exists(path):
                np.save(path, self._spans)
            state["_spans"] = path
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if isinstance(self._spans, str):
            self._spans = np.load(self._spans, mmap_mode="r")

    def describe(self) -> dict:
        """What the manifest records about this source."""
        return {"type": "text", "split": self.split, "files": self.files}

    def __repr__(self) -> str:
        return f"TextSource({len(self.paths)} files, split={self.split!r}, {len(self)} records)"


class ArrayRecordSource:
    """Records of ArrayRecord files (each record is raw text, or JSON when the pipeline sets a field)."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        from array_record.python.array_record_module import ArrayRecordReader

        if not paths:
            raise ValueError("no input files given")
        self.paths = [os.fspath(p) for p in paths]
        self.files = []
        for path in self.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"input file {path} does not exist")
            try:
                reader = ArrayRecordReader(path)
            except Exception as err:  # ArrayRecord raises RuntimeError/ValueError for damaged files
                raise InputError(f"input file {path} is not a valid ArrayRecord file: {err}") from None
            self.files.append({"path": path, "bytes": os.path.getsize(path), "records": reader.num_records()})
            reader.close()
        self._ends = np.cumsum([f["records"] for f in self.files]).tolist()
        self._source = None

    def _open(self):
        import grain

        self._source = grain.sources.ArrayRecordDataSource(self.paths)
        return self._source

    def __len__(self) -> int:
        return sum(f["records"] for f in self.files)

    def __getitem__(self, index: int) -> bytes:
        try:
            return (self._source or self._open())[index]
        except Exception as err:  # a damaged chunk
            path = self.paths[min(int(np.searchsorted(self._ends, index, side="right")), len(self.paths) - 1)]
            reason = " ".join(str(err).split())[:300]
            raise InputError(f"input file {path} is corrupt or unreadable: {reason}") from None

    def __getstate__(self):
        return {**self.__dict__, "_source": None}

    def describe(self) -> dict:
        return {"type": "array_record", "files": self.files}

    def __repr__(self) -> str:
        return f"ArrayRecordSource({len(self.paths)} files, {len(self)} records)"


class PydocSource:
    """Python's own documentation topics (``pydoc_data.topics``): real English on every machine.

    One record per topic, sorted by topic name; ``repeat`` concatenates that many copies (benchmarks).
    """

    def __init__(self, repeat: int = 1):
        from pydoc_data.topics import topics

        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        self.repeat = repeat
        self._names = sorted(topics)
        self._texts = [topics[name].encode("utf-8") for name in self._names]

    def __len__(self) -> int:
        return len(self._texts) * self.repeat

    def __getitem__(self, index: int) -> bytes:
        return self._texts[index % len(self._texts)]

    def describe(self) -> dict:
        import sys

        data = b"\0".join(self._texts)
        return {
            "type": "pydoc",
            "python": sys.version.split()[0],
            "topics": len(self._texts),
            "repeat": self.repeat,
            "bytes": len(data) * self.repeat,
            "sha256": _sha256(data),
        }

    def __repr__(self) -> str:
        return f"PydocSource({len(self._texts)} topics x {self.repeat})"


def open_source(kind: str, paths: Sequence[str] = (), *, split: str = "line", repeat: int = 1,
                column: str = "text"):
    """Source by name (:data:`FORMATS`): ``"text"``, ``"jsonl"`` (one JSON object per line), ``"array_record"``,
    ``"parquet"`` and ``"arrow"`` (``column``; :mod:`wakong.columnar`), ``"pydoc"``.

    ``paths`` may hold directories and glob patterns (:func:`expand_inputs`).
    """
    if kind == "pydoc":
        if paths:
            raise ValueError("the pydoc corpus takes no input files")
        return PydocSource(repeat)
    if repeat != 1:
        raise ValueError("repeat is only supported for the pydoc corpus")
    if kind not in FORMATS:
        raise ValueError(f"input format must be one of {', '.join(FORMATS)}; got {kind!r}")
    files = expand_inputs(paths, kind)
    if kind in ("text", "jsonl"):
        return TextSource(files, split if kind == "text" else "line")
    if kind == "array_record":
        return ArrayRecordSource(files)
    from wakong.columnar import ArrowSource, ParquetSource

    return (ParquetSource if kind == "parquet" else ArrowSource)(files, column)
