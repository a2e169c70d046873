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
  computed once per vocabulary object.

Sources or options that are not JSON-serialisable are compiled without the cache (never keyed by
something that could miss a difference). Bounds: :data:`MAX_ENTRIES` grammars and
:data:`MAX_BYTES` of host arrays (least recently used dropped first; a grammar larger than the
byte bound is returned uncached); :func:`set_limits` changes them, :func:`clear` empties the
cache, :func:`info` reports hits, misses, entries and bytes.

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
import pickle
import threading
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
_stats = {"hits": 0, "misses": 0, "uncacheable": 0}
_limits = {"max_entries": MAX_ENTRIES, "max_bytes": MAX_BYTES}
_vocab_digests: "collections.OrderedDict[int, tuple[Any, str]]" = collections.OrderedDict()
_VOCAB_MEMO = 16


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
                key = (kind, _canonical(src), options, vocab_digest(vocab))
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
            grammar = fn(*args, **kwargs)
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
    """``{"hits", "misses", "uncacheable", "entries", "bytes", "max_entries", "max_bytes"}``."""
    with _lock:
        return {**_stats, "entries": len(_entries), "bytes": sum(_sizes.values()), **_limits}


def clear() -> None:
    """Drops every cached grammar and resets the counters."""
    with _lock:
        _entries.clear()
        _sizes.clear()
        _vocab_digests.clear()
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
