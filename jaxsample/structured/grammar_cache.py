"""Compiled grammars deduplicated by content: a bounded LRU cache keyed by what changes the output.

Compiling the same constraint twice (equal regex / schema / GBNF text or choice list, the same
vocabulary *content*, the same options) returns the same :class:`~jaxsample.structured.tokens.TokenGrammar`
object, whose arrays are then read-only (it is shared). A key holds:

* the front end (``"regex"``, ``"json_schema"``, ``"gbnf"``, ``"choice"``);
* the source, canonically: JSON schemas as compact JSON text *in their key order* (property order
  is part of the output), given either as an object or as JSON text; regex / GBNF text as is;
* every argument of the compile function bound to its signature with defaults applied (so
  ``whitespace="bounded"`` and the default are one key), as canonical JSON;
* the vocabulary's content hash (BLAKE2b over its token bytes, EOS ids and every other field),
  computed once per vocabulary object;
* the state budgets (``automaton.MAX_NFA_STATES`` / ``MAX_DFA_STATES``: a larger budget can
  give another result, e.g. any property order where a smaller one fell back to schema order).

Sources or options that are not JSON-serialisable are compiled without the cache (never keyed by
something that could miss a difference). Bounds: :data:`MAX_ENTRIES` grammars and
:data:`MAX_BYTES` of host arrays (least recently used dropped first; a grammar larger than the
byte bound is returned uncached); :func:`set_limits` changes them, :func:`clear` empties the
cache, :func:`info` reports hits, misses, entries and bytes.

**On disk** (opt-in): with :func:`set_directory` (or the environment variable
``JAXSAMPLE_GRAMMAR_CACHE_DIR``, read at import) every compiled grammar is also written to that
directory, and a grammar missing from memory is read from there before it is compiled: a restarted
server, or every host of a pod sharing one directory, compiles each schema once.

* One file per key, named by a hash of the key text, which adds a digest of this package's
  compiler sources (a changed compiler never reads an older result); the file holds the key text
  and is used only if it matches.
* Format: a JSON header naming each integer or boolean array's dtype, shape and place, with a
  CRC-32 of the data, then the raw data: nothing is unpickled. Besides the grammar, a file holds
  the device-table parts :func:`~jaxsample.structured.tables.stack` prepares from it (packed
  ``next``, mask blocks: most of a large grammar's stacking time). Grammars kept on disk are
  read-only, as shared ones are.
* Files are written to a temporary name and renamed (concurrent writers are safe); a file that
  cannot be read or does not hold a whole grammar is reported with a warning naming it and
  compiled again; a directory that cannot be written warns once and the compile goes on.
* Nothing is ever evicted from the directory: delete it (or any file in it) at any time.
* The directory also keeps each vocabulary's analysis (``*.vocab`` files: its byte trie with unary
  paths, each quotient trie and the suffix ids as first built; see :mod:`~jaxsample.structured.trie`),
  keyed by the token bytes' digest: the first grammar of a new process skips it (at V=128k most of
  that first compile; :func:`load_vocab_part`, :func:`store_vocab_part`).

:func:`same_grammar` compares two compiled grammars by content; :func:`~jaxsample.structured.grammar_params`
uses it so equal grammars share one table slot even when compiled separately.

>>> from jaxsample.structured import Vocabulary, compile_regex
>>> v = Vocabulary.from_pieces(["<eos>", "a", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> w = Vocabulary.from_pieces(["<eos>", "a", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> compile_regex("ab*", v) is compile_regex("ab*", w)   # equal vocabularies, distinct objects
True
"""

from __future__ import annotations

import collections
import functools
import hashlib
import inspect
import json
import os
import pickle
import tempfile
import threading
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

#: Default bound on the number of cached grammars.
MAX_ENTRIES = 128
#: Default bound on the host bytes of cached grammars (256 MiB).
MAX_BYTES = 256 << 20

_lock = threading.Lock()
_entries: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_sizes: dict[tuple, int] = {}
_stats = {"hits": 0, "misses": 0, "uncacheable": 0, "disk_hits": 0, "disk_writes": 0, "disk_errors": 0,
          "vocab_disk_hits": 0, "vocab_disk_writes": 0, "vocab_disk_errors": 0}
_limits = {"max_entries": MAX_ENTRIES, "max_bytes": MAX_BYTES}
_vocab_digests: "collections.OrderedDict[int, tuple[Any, str]]" = collections.OrderedDict()
_VOCAB_MEMO = 16
#: Environment variable naming the on-disk cache directory (read at import; :func:`set_directory` overrides it).
ENV_DIRECTORY = "JAXSAMPLE_GRAMMAR_CACHE_DIR"
_FORMAT = 1  # of the files; part of every key
_MAGIC = b"jaxsample-grammar\n"
_disk: dict = {"directory": os.environ.get(ENV_DIRECTORY) or None, "warned": set()}


def vocab_digest(vocab: Any) -> str:
    """Content hash of a vocabulary (memoised per object; the memo holds the object, so ids stay valid)."""
    with _lock:
        hit = _vocab_digests.get(id(vocab))
        if hit is not None and hit[0] is vocab:
            _vocab_digests.move_to_end(id(vocab))
            return hit[1]
    fields = tuple(vocab) if isinstance(vocab, tuple) else vocab
    digest = type(vocab).__qualname__ + ":" + hashlib.blake2b(pickle.dumps(fields, protocol=5), digest_size=20).hexdigest()
    with _lock:
        _vocab_digests[id(vocab)] = (vocab, digest)
        while len(_vocab_digests) > _VOCAB_MEMO:
            _vocab_digests.popitem(last=False)
    return digest


def _canonical(value: Any) -> str:
    """Compact JSON keeping key order (raises TypeError/ValueError when not JSON data)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def _nbytes(grammar: Any) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(grammar)))


def _freeze(grammar: Any) -> None:
    for x in jax.tree.leaves(grammar):
        if isinstance(x, np.ndarray):
            x.flags.writeable = False


def _evict() -> None:
    while _entries and (
        len(_entries) > _limits["max_entries"] or sum(_sizes.values()) > _limits["max_bytes"]
    ):
        key, _ = _entries.popitem(last=False)
        _sizes.pop(key, None)


def _budgets() -> tuple[int, int]:
    from jaxsample.structured import automaton

    return automaton.MAX_NFA_STATES, automaton.MAX_DFA_STATES


# --------------------------------------------------------------------------------------------- disk
def set_directory(path: "str | os.PathLike | None") -> None:
    """Keeps compiled grammars in directory ``path`` (created if missing) as well; ``None`` stops it.

    Raises:
      ValueError: if ``path`` exists and is not a directory.
    """
    if path is not None:
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"path: {str(path)!r} exists and is not a directory")
    with _lock:
        _disk["directory"] = None if path is None else str(path)
        _disk["warned"].clear()


def directory() -> Path | None:
    """The on-disk cache directory, or ``None`` when grammars are kept in memory only."""
    d = _disk["directory"]
    return None if d is None else Path(d)


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """Digest of this package's compiler sources (``jaxsample/structured/*.py``) and version."""
    from jaxsample import __version__

    h = hashlib.blake2b(__version__.encode(), digest_size=16)
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _disk_key(key: tuple, suffix: str = ".grammar") -> tuple[str, str]:
    """The key's text (stored in the file) and the file name."""
    text = json.dumps([_FORMAT, _code_digest(), *key], separators=(",", ":"))
    return text, hashlib.blake2b(text.encode(), digest_size=20).hexdigest() + suffix


def _warn(what: str) -> None:
    with _lock:
        if what in _disk["warned"]:
            return
        _disk["warned"].add(what)
    warnings.warn(f"grammar cache: {what}", RuntimeWarning, stacklevel=4)


def _arrays(grammar) -> dict | None:
    """A read-only token grammar and its prepared device-table parts as named numpy arrays (``None``
    for anything else)."""
    from jaxsample.structured import tables
    from jaxsample.structured.tokens import TokenGrammar

    if type(grammar) is not TokenGrammar:
        return None
    out = {f"g.{k}": np.asarray(v) for k, v in grammar._asdict().items() if k not in ("pushdown", "eos_ids")}
    out["g.eos_ids"] = np.asarray(grammar.eos_ids, np.int64)
    if grammar.pushdown is not None:
        out.update({f"p.{k}": np.asarray(v) for k, v in grammar.pushdown._asdict().items()})
    parts = tables.prepared(grammar)  # kept for the stack that usually follows
    for name, arrays in parts._asdict().items():
        out.update({f"t.{name}.{i}": a for i, a in enumerate(arrays)})
    return out


def _grammar(arrays) -> Any:
    """The token grammar of :func:`_arrays`, read-only, its prepared parts kept (``KeyError`` if a
    field is missing)."""
    from jaxsample.structured import tables
    from jaxsample.structured.tokens import PushdownTables, TokenGrammar

    scalars = ("start", "bottom", "max_depth", "max_pops")
    pushdown = None
    if "p.effect" in arrays:
        pushdown = PushdownTables(**{k: int(arrays[f"p.{k}"]) if k in scalars else arrays[f"p.{k}"]
                                     for k in PushdownTables._fields})  # fmt: skip
    fields = {k: int(arrays[f"g.{k}"]) if k in scalars else arrays[f"g.{k}"]
              for k in TokenGrammar._fields if k not in ("pushdown", "eos_ids")}  # fmt: skip
    grammar = TokenGrammar(**fields, pushdown=pushdown, eos_ids=tuple(int(i) for i in arrays["g.eos_ids"]))
    parts = tables.Prepared(*(tuple(arrays[f"t.{name}.{i}"] for i in range(count))
                              for name, count in (("packed", 6), ("blocked", 2))))  # fmt: skip
    _freeze(grammar)
    tables.remember(grammar, parts)
    return grammar


def _pack(text: str, arrays: dict) -> bytes:
    """One file: magic, header length, JSON header (key, arrays' dtype / shape / place, CRC-32), data."""
    parts, table, at = [], [], 0
    for name, a in arrays.items():
        data = np.ascontiguousarray(a).tobytes()
        table.append([name, a.dtype.str, list(a.shape), at, len(data)])
        parts.append(data)
        at += len(data)
    payload = b"".join(parts)
    header = json.dumps({"key": text, "arrays": table, "crc32": zlib.crc32(payload)}).encode()
    return _MAGIC + len(header).to_bytes(8, "little") + header + payload


def _unpack(blob: bytes, text: str) -> dict | None:
    """The arrays of :func:`_pack` (``None`` if the file holds another key; ``ValueError`` if damaged)."""
    if blob[: len(_MAGIC)] != _MAGIC:
        raise ValueError("not a grammar cache file")
    n = int.from_bytes(blob[len(_MAGIC) : len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8 + n
    header = json.loads(blob[len(_MAGIC) + 8 : start])
    if header["key"] != text:  # a hash collision, or a file copied there by hand
        return None
    payload = memoryview(blob)[start:]
    if zlib.crc32(payload) != header["crc32"]:
        raise ValueError("checksum mismatch")
    out = {}
    for name, dtype, shape, at, size in header["arrays"]:
        dtype = np.dtype(dtype)
        if dtype.kind not in "biu" or at + size > len(payload):
            raise ValueError(f"bad entry {name!r}")
        out[name] = np.frombuffer(payload[at : at + size], dtype).reshape(shape)  # read-only views
    return out


def _read(d: Path, stored: tuple[str, str], convert: Callable | None = None, stat: str = "disk") -> Any:
    """``convert`` (default: the token grammar) of the arrays stored in directory ``d`` under ``stored``
    (:func:`_disk_key`), or ``None``; counted in ``{stat}_hits`` / ``{stat}_errors``."""
    text, name = stored
    path = d / name
    try:
        arrays = _unpack(path.read_bytes(), text)
        out = None if arrays is None else (convert or _grammar)(arrays)
    except (FileNotFoundError, NotADirectoryError):  # not there (yet)
        return None
    except Exception as err:  # unreadable, truncated or foreign: compile again (and overwrite it)
        with _lock:
            _stats[f"{stat}_errors"] += 1
        _warn(f"cannot read {str(path)!r} ({type(err).__name__}: {err}); compiling again")
        return None
    if out is not None:
        with _lock:
            _stats[f"{stat}_hits"] += 1
    return out


def _write(d: Path, stored: tuple[str, str], arrays: dict | None, stat: str = "disk") -> None:
    """Stores ``arrays`` in directory ``d`` under ``stored`` (:func:`_disk_key`), atomically."""
    if arrays is None:
        return
    text, name = stored
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_pack(text, arrays))
            os.replace(tmp, d / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as err:
        with _lock:
            _stats[f"{stat}_errors"] += 1
        _warn(f"cannot write to {str(d)!r} ({err}); grammars are not kept on disk")
        return
    with _lock:
        _stats[f"{stat}_writes"] += 1


def load_vocab_part(key: tuple, convert: Callable) -> Any:
    """``convert(arrays)`` of a vocabulary analysis (:mod:`~jaxsample.structured.trie`) stored in the
    directory under ``key`` (JSON data), or ``None``: no directory, not stored yet, or unreadable
    (warned; ``convert`` raising ``KeyError`` on a missing field counts as unreadable)."""
    d = directory()
    return None if d is None else _read(d, _disk_key(key, ".vocab"), convert, "vocab_disk")


def store_vocab_part(key: tuple, arrays: Callable[[], dict]) -> None:
    """Stores ``arrays()`` (integer / boolean numpy arrays by name) under ``key`` when a directory is set."""
    d = directory()
    if d is not None:
        _write(d, _disk_key(key, ".vocab"), arrays(), "vocab_disk")


def cached_compile(kind: str, source: str, *, source_is_json: bool = False, options_of: Callable | None = None) -> Callable:
    """Decorator: cache a compile function ``f(source, vocab, ...)`` by content (see the module docstring).

    Args:
      kind: the front end's name (part of the key).
      source: the parameter holding the constraint (canonicalised; ``source_is_json``: JSON text
        or objects, canonicalised as compact JSON in key order).
      options_of: the function ``f``'s ``**options`` are passed to (``options_of(source, **options)``);
        its defaults are applied to them, so an option given at its default value is the same key.
    """

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        inner = None if options_of is None else inspect.signature(options_of)

        @functools.wraps(fn)
        def compile_cached(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            vocab = arguments.pop("vocab")
            try:
                src = arguments.pop(source)
                if inner is not None:
                    extra = inner.bind(src, **arguments.pop("options"))
                    extra.apply_defaults()
                    arguments.update(list(extra.arguments.items())[1:])
                if source_is_json and isinstance(src, (str, bytes)):
                    src = json.loads(src)
                options = json.dumps(arguments, sort_keys=True, separators=(",", ":"), allow_nan=True)
                key = (kind, _canonical(src), options, vocab_digest(vocab), _budgets())
            except (TypeError, ValueError):  # not JSON data, or unknown options: compile (and raise) uncached
                with _lock:
                    _stats["uncacheable"] += 1
                return fn(*args, **kwargs)
            with _lock:
                if key in _entries:
                    _entries.move_to_end(key)
                    _stats["hits"] += 1
                    return _entries[key]
                _stats["misses"] += 1
            d = directory()
            stored = None if d is None else _disk_key(key)
            grammar = None if d is None else _read(d, stored)
            if grammar is None:
                grammar = fn(*args, **kwargs)
                if d is not None:
                    _freeze(grammar)  # shared with the directory from now on
                    _write(d, stored, _arrays(grammar))
            size = _nbytes(grammar)
            if size <= _limits["max_bytes"]:
                _freeze(grammar)
                with _lock:
                    grammar = _entries.setdefault(key, grammar)  # a concurrent compile may have won
                    _sizes[key] = size
                    _entries.move_to_end(key)
                    _evict()
            return grammar

        return compile_cached

    return wrap


def info() -> dict:
    """``{"hits", "misses", "uncacheable", "disk_hits", "disk_writes", "disk_errors", "vocab_disk_hits",
    "vocab_disk_writes", "vocab_disk_errors", "entries", "bytes", "max_entries", "max_bytes", "directory"}``
    (``disk_*``: grammar files; ``vocab_disk_*``: vocabulary analyses; ``directory``: ``None`` or a path string)."""
    with _lock:
        return {**_stats, "entries": len(_entries), "bytes": sum(_sizes.values()), **_limits,
                "directory": _disk["directory"]}


def clear() -> None:
    """Drops every grammar cached in memory (and the device-table parts prepared from them) and resets
    the counters (the directory is left as it is). Vocabularies' content hashes stay memoised, as their
    tries do (:mod:`~jaxsample.structured.trie`): a vocabulary is immutable, and a grammar never seen
    before, compiled for a vocabulary used before, pays for neither."""
    from jaxsample.structured import tables

    tables.forget_prepared()
    with _lock:
        _entries.clear()
        _sizes.clear()
        for k in _stats:
            _stats[k] = 0


def set_limits(*, max_entries: int | None = None, max_bytes: int | None = None) -> None:
    """Changes the bounds (``0`` disables caching); entries over the new bounds are dropped.

    Raises:
      ValueError: on a negative bound.
    """
    for name, value in (("max_entries", max_entries), ("max_bytes", max_bytes)):
        if value is not None:
            if int(value) < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            with _lock:
                _limits[name] = int(value)
    with _lock:
        _evict()


def same_grammar(a: Any, b: Any) -> bool:
    """Whether two compiled grammars are equal in content (identity first, then every array)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if ta != tb:
        return False
    return all(np.shape(x) == np.shape(y) and np.array_equal(x, y) for x, y in zip(la, lb))
