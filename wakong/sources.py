"""Random-access record sources for grain: text files, JSONL, ArrayRecord, and Python's own docs.

Every source is a sequence of raw ``bytes`` records (decoding, JSON parsing and their failures are the
pipeline's job, so they are counted rather than raised). A record's *global index* is its position in
the concatenation of the source's files, in the order given; masks depend on it, so the manifest lists
the files with their record counts and sha256.

Text files are memory-mapped and indexed once (record boundaries only), so a source pickles cheaply
to grain worker processes and any record is read in O(1).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from typing import Sequence

import numpy as np

#: Text splitting modes: one record per line, per blank-line separated paragraph, or per file.
TEXT_SPLITS = ("line", "paragraph", "file")
_BLANK_RUN = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


class TextSource:
    """Records of UTF-8 (or not) text files.

    Args:
      paths: files, read in this order.
      split: ``"line"`` (each line a record, ``\\r\\n`` handled; a final newline ends the last record),
        ``"paragraph"`` (records separated by blank lines; blank lines themselves are not records) or
        ``"file"`` (each file one record).
    """

    def __init__(self, paths: Sequence[str | os.PathLike], split: str = "line"):
        if split not in TEXT_SPLITS:
            raise ValueError(f"split must be one of {TEXT_SPLITS}, got {split!r}")
        if not paths:
            raise ValueError("no input files given")
        self.paths = [os.fspath(p) for p in paths]
        self.split = split
        spans, self.files = [], []
        for k, path in enumerate(self.paths):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"input file {path} does not exist")
            with open(path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(path) else b""
                try:
                    bounds = self._bounds(data)
                    self.files.append(
                        {"path": path, "bytes": len(data), "sha256": _sha256(data), "records": len(bounds)}
                    )
                finally:
                    if isinstance(data, mmap.mmap):
                        data.close()
            spans.append(np.column_stack([np.full(len(bounds), k, np.int64), bounds.reshape(-1, 2)]))
        self._spans = np.concatenate(spans) if spans else np.zeros((0, 3), np.int64)
        self._maps = None

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
            self._maps = [self._open(p) for p in self.paths]
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
        return {**self.__dict__, "_maps": None}

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
            reader = ArrayRecordReader(path)
            self.files.append({"path": path, "bytes": os.path.getsize(path), "records": reader.num_records()})
            reader.close()
        self._source = None

    def _open(self):
        import grain

        self._source = grain.sources.ArrayRecordDataSource(self.paths)
        return self._source

    def __len__(self) -> int:
        return sum(f["records"] for f in self.files)

    def __getitem__(self, index: int) -> bytes:
        return (self._source or self._open())[index]

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


def open_source(kind: str, paths: Sequence[str] = (), *, split: str = "line", repeat: int = 1):
    """Source by name: ``"text"``, ``"jsonl"`` (one JSON object per line), ``"array_record"``, ``"pydoc"``."""
    if kind == "pydoc":
        if paths:
            raise ValueError("the pydoc corpus takes no input files")
        return PydocSource(repeat)
    if repeat != 1:
        raise ValueError("repeat is only supported for the pydoc corpus")
    if kind == "text":
        return TextSource(paths, split)
    if kind == "jsonl":
        return TextSource(paths, "line")
    if kind == "array_record":
        return ArrayRecordSource(paths)
    raise ValueError(f"input format must be one of text, jsonl, array_record, pydoc; got {kind!r}")
