"""Columnar record sources: Parquet files, and Arrow IPC files or Hugging Face ``datasets`` directories.

A record is the value of one column (``input.column``, a string or binary column) of one row; rows are
numbered across the files in the order given. A null value is an empty record (dropped as ``empty``,
counted). Only that column is read, lazily: a Parquet source decodes one row group at a time (the one
holding the records asked for; :meth:`read` takes a batch of indices), an Arrow file is memory-mapped
and sliced without a copy. A Hugging Face ``datasets`` directory (``Dataset.save_to_disk``: Arrow
stream files listed in ``state.json``) is read with pyarrow alone -- ``datasets`` is not imported.

Needs ``pyarrow`` (``pip install 'jaxsample[data]'``). A file that is not of its format, lacks the
column, holds another type there, or fails to decode raises :class:`wakong.sources.InputError`
naming it.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import Sequence

import numpy as np

from wakong.sources import InputError, _file_sha256


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError("Parquet and Arrow inputs need pyarrow: pip install 'jaxsample[data]'") from None
    return pyarrow


def _check_column(schema, column: str, path: str) -> None:
    pa = _pyarrow()
    if column not in schema.names:
        raise InputError(f"input file {path} has no column {column!r} (columns: {', '.join(schema.names)}); "
                         "set input.column")
    kind = schema.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not any(f(kind) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                 pa.types.is_large_binary)):
        raise InputError(f"column {column!r} of input file {path} holds {kind}, not text (string or binary)")


class _ColumnSource:
    """Rows numbered across *units* (Parquet row groups, Arrow files); the last unit read is cached."""

    kind = ""

    def __init__(self, column: str):
        self.column, self.files, self._units = column, [], []  # units: (file number, unit number, rows)
        self._cache: tuple[int, object] | None = None

    def _finish(self) -> None:
        self._ends = np.cumsum([rows for _, _, rows in self._units], dtype=np.int64).tolist()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> bytes:
        return self.read([index])[0]

    def _array(self, unit: int):
        if self._cache is None or self._cache[0] != unit:
            k, part, _ = self._units[unit]
            try:
                array = self._load(k, part)
            except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowIOError
                raise InputError(f"input file {self.files[k]['path']} is corrupt or unreadable "
                                 f"({self.kind} part {part}): {' '.join(str(err).split())[:300]}") from None
            self._cache = (unit, array.cast(_pyarrow().large_binary()))
        return self._cache[1]

    def read(self, indices: Sequence[int]) -> list[bytes]:
        """The records ``indices`` (any order; consecutive indices of one unit are read together)."""
        out: list = []
        indices = list(indices)
        at = 0
        while at < len(indices):
            index = indices[at]
            if not 0 <= index < len(self):
                raise IndexError(f"record {index} out of range ({len(self)} records)")
            unit = bisect.bisect_right(self._ends, index)
            start = self._ends[unit - 1] if unit else 0
            end = at
            while end < len(indices) and start <= indices[end] < self._ends[unit]:
                end += 1
            local = np.asarray(indices[at:end], np.int64) - start
            array = self._array(unit)
            if len(local) and np.all(np.diff(local) == 1):
                values = array.slice(int(local[0]), len(local))
            else:
                values = array.take(local)
            out += [b"" if v is None else v for v in values.to_pylist()]
            at = end
        return out

    def __getstate__(self):
        return {**self.__dict__, "_cache": None}

    def describe(self) -> dict:
        """What the manifest records about this source."""
        return {"type": self.kind, "column": self.column, "files": self.files}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.files)} files, column {self.column!r}, {len(self)} records)"


class ParquetSource(_ColumnSource):
    """Records of one column of Parquet files, read a row group at a time."""

    kind = "parquet"

    def __init__(self, paths: Sequence[str | os.PathLike], column: str = "text"):
        pq = _pyarrow().parquet
        super().__init__(column)
        if not paths:
            raise ValueError("no input files given")
        for k, path in enumerate(map(os.fspath, paths)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"input file {path} does not exist")
            try:
                meta = pq.ParquetFile(path).metadata
            except (OSError, ValueError) as err:
                raise InputError(f"input file {path} is not a valid Parquet file: {err}") from None
            _check_column(meta.schema.to_arrow_schema(), column, path)
            groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self._units += [(k, g, rows) for g, rows in enumerate(groups)]
            self.files.append({"path": path, "bytes": os.path.getsize(path), "sha256": _file_sha256(path),
                               "records": meta.num_rows, "row_groups": meta.num_row_groups})
        self._finish()

    def _load(self, k: int, group: int):
        pq = _pyarrow().parquet
        return pq.ParquetFile(self.files[k]["path"]).read_row_group(group, columns=[self.column]).column(0)


def _arrow_files(path: str) -> list[str]:
    """The Arrow files of an input: itself, or those a ``datasets`` directory's ``state.json`` lists."""
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"input file {path} does not exist")
        return [path]
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json"), encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        raise InputError(f"{path} is a DatasetDict (splits {', '.join(splits)}): give one split's directory, "
                         f"e.g. {os.path.join(path, splits[0] if splits else 'train')}")
    state = os.path.join(path, "state.json")
    if not os.path.isfile(state):
        raise InputError(f"{path} is not a Hugging Face datasets directory (no state.json; saved with save_to_disk?)")
    try:
        with open(state, encoding="utf-8") as f:
            names = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"{state} is damaged: {err}") from None
    return [os.path.join(path, name) for name in names]


class ArrowSource(_ColumnSource):
    """Records of one column of Arrow IPC files (stream or file format) or ``datasets`` directories."""

    kind = "arrow"

    def __init__(self, paths: Sequence[str | os.PathLike], column: str = "text"):
        super().__init__(column)
        if not paths:
            raise ValueError("no input files given")
        files = [file for path in map(os.fspath, paths) for file in _arrow_files(path)]
        self._tables: dict = {}
        for k, path in enumerate(files):
            table = self._table(path)
            _check_column(table.schema, column, path)
            self._units.append((k, 0, table.num_rows))
            self.files.append({"path": path, "bytes": os.path.getsize(path), "sha256": _file_sha256(path),
                               "records": table.num_rows})
        self._finish()

    @staticmethod
    def _table(path: str):
        pa = _pyarrow()
        try:
            source = pa.memory_map(path)
            try:
                reader = pa.ipc.open_file(source)
                table = reader.read_all()
            except pa.ArrowInvalid:  # not the file format: the stream format (what datasets writes)
                source.seek(0)
                table = pa.ipc.open_stream(source).read_all()
            table.validate()
            return table
        except FileNotFoundError:
            raise FileNotFoundError(f"input file {path} does not exist") from None
        except (OSError, ValueError) as err:
            raise InputError(f"input file {path} is not a valid Arrow IPC file: {err}") from None

    def _load(self, k: int, part: int):
        if k not in self._tables:
            self._tables[k] = self._table(self.files[k]["path"])
        return self._tables[k].column(self.column)

    def __getstate__(self):
        return {**super().__getstate__(), "_tables": {}}
