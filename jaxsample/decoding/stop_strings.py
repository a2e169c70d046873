"""Stop strings matched inside the jitted decoding loop, from tables precomputed on the host.

A stop string is text, not a token sequence: ``"\\n\\n"`` may be one token, two ``"\\n"`` tokens, or
the end of ``".\\n"`` followed by the start of ``"\\nThe"``. As in HuggingFace's
``StopStringCriteria``, the host precomputes, for every token of the vocabulary and every stop
string, where the token can sit inside the string; the loop then decides with fixed shapes, from
the last ``W`` generated tokens, whether a string has just been completed.

Semantics (those of vLLM's stop checker, in bytes):

* the text is the concatenation of the generated tokens' bytes (``token_bytes``; special tokens
  count as empty), the prompt excluded;
* a row stops at the first token that completes an occurrence of one of its stop strings, i.e. an
  occurrence that ends inside that token (the token may carry more text after it). Occurrences
  that lie entirely in earlier text never stop the row later (they were seen, or were masked by
  ``min_new_tokens``);
* the finish reason is ``STOP_SEQUENCE``; the text is cut on the host by :func:`truncate`.

Tables (:class:`StopStrings`), for ``S`` string slots of at most ``M = 32 * K - 1`` bytes each:

* ``ends[v, s]`` (bit ``m``, ``1 <= m <= L``): the string's last ``m`` bytes start token ``v``
  (``m < L``), or the whole string lies inside ``v`` (``m == L``);
* ``fits[v, s]`` (bit ``p``, ``1 <= p < L``): token ``v`` can precede a matched suffix of ``p``
  bytes: its bytes equal the string's bytes just before that suffix, possibly running off the
  string's start (``"las" + "topper"`` completes ``"stop"``). Empty tokens fit everywhere;
* ``token_len[v]``: bytes of token ``v``;
* ``target[b, s]``: byte length of slot ``s`` for row ``b``, ``0`` where the row does not use it.

:func:`pending` gives the other half of the same computation, the prefixes of each string the text
ends with (which next tokens would complete it): lazy grammars' triggers
(:mod:`jaxsample.structured.triggers`) use it to know, before a token is chosen, where it would
start the grammar.

The shared tables are ``[V, S, K]`` bit words; only ``target`` is per row, so different rows
stop on different strings, and new strings of the same static sizes never recompile. The window
is ``W = M`` tokens: every non-empty token adds at least one byte, so an occurrence spans at most
``M`` non-empty tokens (runs of empty tokens inside an occurrence count against the window).

>>> toks = [b"st", b"op", b"opera", b"s", b"x"]
>>> table = build(toks, [["stop"]])
>>> bool(hits(jnp.array([[-1] * 29 + [0, 2]]), table)[0])  # "st" + "opera"
True
>>> text, reason = truncate(b"xstopera", 3, [b"stop"], include=False)
>>> text, reason
(b'x', b'stop')
"""

from __future__ import annotations

import bisect
import functools
from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample._types import Array

WORD = 32


class StopStrings(NamedTuple):
    """Device tables for stop strings (see the module docstring); every leaf is traced."""

    fits: Array  # uint32[V, S, K]
    ends: Array  # uint32[V, S, K]
    token_len: Array  # int32[V]
    target: Array  # int32[B, S]: byte length of the row's string in slot s, 0 = unused

    @property
    def max_len(self) -> int:
        """Static maximum stop-string length in bytes (also the window width in tokens)."""
        return WORD * self.fits.shape[-1] - 1


def _set_bits(words: np.ndarray, ids, bit: int) -> None:
    ids = np.asarray(ids, np.int64)
    if ids.size:
        words[ids, bit // WORD] |= np.uint32(1 << (bit % WORD))


class _Vocab(NamedTuple):
    """A vocabulary indexed for fast table building."""

    tokens: tuple[bytes, ...]
    first: np.ndarray  # int16[V]: first byte, -1 for empty tokens
    last: np.ndarray  # int16[V]: last byte, -1 for empty tokens
    joined: bytes  # the tokens separated by NUL
    starts: list[int]  # offset of each token in ``joined``
    lengths: np.ndarray  # int32[V]: bytes per token


@functools.lru_cache(maxsize=4)
def _vocab(token_bytes: tuple) -> _Vocab:
    tokens = tuple(b"" if t is None else bytes(t) for t in token_bytes)
    first = np.array([t[0] if t else -1 for t in tokens], np.int16)
    last = np.array([t[-1] if t else -1 for t in tokens], np.int16)
    lengths = np.array([len(t) + 1 for t in tokens], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64).tolist()
    return _Vocab(tokens, first, last, b"\0".join(tokens), starts, (lengths - 1).astype(np.int32))


def _containing(voc: _Vocab, s: bytes) -> list[int]:
    """Ids of the tokens that contain ``s``."""
    if 0 in s:  # NUL separates the tokens in ``joined``: scan them one by one
        return [i for i, t in enumerate(voc.tokens) if s in t]
    out, i = [], voc.joined.find(s)
    while i >= 0:
        tid = bisect.bisect_right(voc.starts, i) - 1
        out.append(tid)
        i = voc.joined.find(s, voc.starts[tid] + len(voc.tokens[tid]) + 1)  # next token
    return out


def _string_columns(voc: _Vocab, s: bytes, k: int):
    """``(fits uint32[V, K], ends uint32[V, K])`` for one stop string."""
    tokens, n = voc.tokens, len(s)
    fits = np.zeros((len(tokens), k), np.uint32)
    ends = np.zeros((len(tokens), k), np.uint32)
    _set_bits(ends, _containing(voc, s), n)
    for m in range(1, n):
        tail = s[n - m :]
        _set_bits(ends, [i for i in np.flatnonzero(voc.first == tail[0]).tolist() if tokens[i].startswith(tail)], m)
    empty = np.flatnonzero(voc.first < 0).tolist()
    for p in range(1, n):
        head = s[: n - p]
        cand = np.flatnonzero(voc.last == head[-1]).tolist()
        ok = [i for i in cand if head.endswith(tokens[i]) or tokens[i].endswith(head)]
        _set_bits(fits, ok + empty, p)
    return fits, ends


def normalise(stop, batch: int) -> list[list[str]]:
    """Per-row lists of stop strings from ``None``, a string, a list of strings (every row) or a
    list of ``batch`` per-row entries (each ``None``, a string or a list of strings)."""
    if stop is None:
        return [[] for _ in range(batch)]
    if isinstance(stop, str):
        stop = [stop]
    stop = list(stop)
    if all(isinstance(s, str) for s in stop):
        rows = [stop] * batch
    else:
        if len(stop) != batch:
            raise ValueError(
                f"stop must be a string, a list of strings, or one entry per row ({batch}), got {len(stop)} entries"
            )
        rows = [[] if r is None else [r] if isinstance(r, str) else list(r) for r in stop]
    for row in rows:
        for s in row:
            if not isinstance(s, str):
                raise ValueError(f"stop strings must be str, got {type(s).__name__}: {s!r}")
            if not s:
                raise ValueError("stop must not contain an empty string")
    return [list(r) for r in rows]


def build(
    token_bytes: Sequence[bytes | None],
    stop_per_row: Sequence[Sequence[str]],
    *,
    max_stop_strings: int | None = None,
    max_len: int | None = None,
) -> StopStrings:
    """Host-side tables for per-row stop strings.

    Args:
      token_bytes: bytes of every logits column (``len == V``); ``None`` = no text (special tokens).
      stop_per_row: ``B`` lists of stop strings (see :func:`normalise`).
      max_stop_strings: static slot count ``S`` (distinct strings over the batch); default: as many
        as needed. Fix it (and ``max_len``) so that new stop strings never recompile.
      max_len: static maximum byte length; rounded up to ``32 * K - 1``; default: the longest string.

    Raises:
      ValueError: a string longer than ``max_len`` bytes or more distinct strings than ``max_stop_strings``.
    """
    voc = _vocab(tuple(token_bytes))
    distinct = sorted({s for row in stop_per_row for s in row})
    encoded = {s: s.encode("utf-8") for s in distinct}
    longest = max((len(b) for b in encoded.values()), default=1)
    if max_len is None:
        max_len = longest
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if longest > max_len:
        raise ValueError(f"stop string of {longest} bytes is longer than max_len={max_len}")
    slots = len(distinct) if max_stop_strings is None else int(max_stop_strings)
    if len(distinct) > slots:
        raise ValueError(f"{len(distinct)} distinct stop strings exceed max_stop_strings={slots}")
    k = (max_len + 1 + WORD - 1) // WORD
    v = len(voc.tokens)
    fits = np.zeros((v, max(slots, 1), k), np.uint32)
    ends = np.zeros((v, max(slots, 1), k), np.uint32)
    for j, s in enumerate(distinct):
        fits[:, j], ends[:, j] = _string_columns(voc, encoded[s], k)
    target = np.zeros((len(stop_per_row), max(slots, 1)), np.int32)
    slot = {s: j for j, s in enumerate(distinct)}
    for b, row in enumerate(stop_per_row):
        for s in row:
            target[b, slot[s]] = len(encoded[s])
    return StopStrings(jnp.asarray(fits), jnp.asarray(ends), jnp.asarray(voc.lengths), jnp.asarray(target))


def _bit(words: Array, index: Array) -> Array:
    """``bool[..., X]``: bits ``index [..., X]`` of the little-endian words ``words [..., K]``."""
    idx = jnp.clip(index, 0, WORD * words.shape[-1] - 1)
    word = jnp.take_along_axis(words, idx // WORD, axis=-1)
    return ((word >> (idx % WORD).astype(jnp.uint32)) & 1).astype(bool)


def _newest_first(window: Array, table: StopStrings):
    """``(tokens, byte counts, valid)`` of the last ``table.max_len`` tokens, newest first (padded with ``-1``)."""
    w = table.max_len
    if window.shape[-1] < w:
        window = jnp.pad(window, [(0, 0)] * (window.ndim - 1) + [(w - window.shape[-1], 0)], constant_values=-1)
    back = window[..., ::-1][..., :w]
    v = table.token_len.shape[0]
    valid = (back >= 0) & (back < v)
    tok = jnp.clip(back, 0, v - 1)
    return tok, jnp.where(valid, table.token_len[tok], 0), valid


def _completed_before(tok: Array, n: Array, valid: Array, start: Array, table: StopStrings) -> Array:
    """``bool[..., S, M]``: for each candidate ``m`` in ``start [..., S, M]`` (the string's last ``m``
    bytes come next), whether the tokens ``tok [..., T]`` (newest first) end with the rest of it."""
    m = jnp.arange(1, table.max_len + 1, dtype=jnp.int32)
    target = table.target[..., None]  # [..., S, 1]
    before = m + (jnp.cumsum(n, axis=-1) - n)[..., None]  # [..., T, M]: bytes matched after each token
    fits = table.fits[tok]  # [..., T, S, K]
    at = before[..., None, :]  # [..., T, 1, M]
    ok = _bit(fits, jnp.broadcast_to(at, fits.shape[:-1] + (m.shape[0],))) & valid[..., None, None]
    ok = ok & (at < target[..., None, :, :])
    alive = start[..., None, :, :] & (jnp.cumsum(~ok, axis=-3) == 0)  # [..., T, S, M]
    reach = (at + n[..., None, None]) >= target[..., None, :, :]
    return jnp.any(alive & reach, axis=-3)


def pending(window: Array, table: StopStrings) -> Array:
    """``bool[..., S, M]``: entry ``[s, m - 1]`` says the text of ``window int32[..., W]`` (oldest
    first, ``-1`` = none) ends with string ``s``'s first ``L - m`` bytes (``1 <= m < L``): a next
    token whose first ``m`` bytes are the string's last ``m`` completes it (its ``ends`` bit ``m``)."""
    tok, n, valid = _newest_first(window, table)
    m = jnp.arange(1, table.max_len + 1, dtype=jnp.int32)
    start = jnp.broadcast_to(m < table.target[..., None], table.target.shape + m.shape)
    return _completed_before(tok[..., :-1], n[..., :-1], valid[..., :-1], start, table)


def hits(window: Array, table: StopStrings) -> Array:
    """``bool[...]``: whether the newest token of ``window int32[..., W]`` completes a stop string.

    ``window`` holds the last tokens, oldest first (``-1`` before the first generated token); only
    the last ``table.max_len`` are read (shorter windows are padded). ``table.target [..., S]``
    broadcasts against ``window.shape[:-1]``.
    """
    tok, n, valid = _newest_first(window, table)
    w = table.max_len
    target = table.target[..., None]  # [..., S, 1]
    m = jnp.arange(1, w + 1, dtype=jnp.int32)  # [M]: bytes of the string inside the newest token
    ends = table.ends[tok[..., 0]]  # [..., S, K]
    start = _bit(ends, jnp.broadcast_to(m, ends.shape[:-1] + (w,))) & valid[..., :1, None] & (m <= target)
    done = jnp.any(start & (m == target), axis=-1)  # [..., S]: inside the newest token alone
    if w > 1:
        done = done | jnp.any(_completed_before(tok[..., 1:], n[..., 1:], valid[..., 1:], start & (m < target), table),
                              axis=-1)
    return jnp.any(done & (table.target > 0), axis=-1)


def truncate(text: bytes, last_start: int, stop: Sequence[bytes], include: bool) -> tuple[bytes, bytes | None]:
    """vLLM's cut of a stopped row's text: ``(text, matched stop string or None)``.

    The stop strings are tried in order; the first one with an occurrence ending after byte
    ``last_start`` (inside the newest token) wins, at its leftmost such occurrence. The text ends
    before the occurrence, or after it with ``include`` (``include_stop_str_in_output``); text after
    the stop string inside the same token is dropped either way.
    """
    for s in stop:
        i = text.find(s, max(0, last_start - len(s) + 1))
        if i >= 0:
            return text[: i + len(s) if include else i], s
    return text, None
