"""Stopping rules and the per-row output buffer shared by every decoding strategy.

:class:`Stops` holds the per-row rules as traced arrays (changing them never recompiles):
several EOS ids, multi-token stop sequences or stop strings (:mod:`jaxsample.decoding.stop_strings`),
min and max new tokens, and optionally vLLM's repetition detection (:mod:`jaxsample.decoding._repetition`).
:func:`stops` builds it on the host from Python values and validates them. :class:`Tracker` is the
fixed-shape output buffer; :func:`push` appends one token per row and applies the rules, in the order
vLLM checks them: nothing stops a row before ``min_new_tokens`` tokens, then EOS, then a stop
sequence or string, then length, then repetition.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.decoding import stop_strings as _stop_strings
from jaxsample.decoding import _repetition
from jaxsample.decoding._repetition import Repetition


class FinishReason(enum.IntEnum):
    """Why a row stopped (values of the ``finish_reason`` arrays)."""

    NOT_FINISHED = 0
    EOS = 1
    STOP_SEQUENCE = 2
    LENGTH = 3
    REPETITION = 4


class Stops(NamedTuple):
    """Per-row stopping rules (all traced)."""

    eos_ids: Array  # int32[B, E]; -1 = unused slot
    stop_sequences: Array  # int32[B, S, L]; right-aligned, -1 = padding on the left
    min_new_tokens: Array  # int32[B]
    max_new_tokens: Array  # int32[B], clipped to the static buffer width
    stop_strings: _stop_strings.StopStrings | None = None  # text stop strings (shared tables)
    repetition: Repetition | None = None  # vLLM repetition detection (None: off, no cost)
    logprob_ids: Array | None = None  # int32[B, M]: ids whose log-probs the buffer records (vLLM logprob_token_ids)


def map_rows(stops: Stops, fn) -> Stops:
    """``fn`` applied to every batch-leading array of ``stops``; shared tables (the stop-string
    vocabulary tables, repetition's pattern sizes) are left as they are."""
    table = stops.stop_strings
    if table is not None:
        table = table._replace(target=fn(table.target))
    repetition = stops.repetition
    if repetition is not None:
        repetition = repetition._replace(**{k: fn(getattr(repetition, k)) for k in ("min_size", "max_size",
                                                                                   "min_count")})
    eos, seqs, lo, hi = (fn(x) for x in stops[:4])
    ids = None if stops.logprob_ids is None else fn(stops.logprob_ids)
    return Stops(eos, seqs, lo, hi, table, repetition, ids)


def repeat(stops: Stops, n: int) -> Stops:
    """Every row's rules ``n`` times (``[B] -> [B * n]``, row-major)."""
    return stops if n == 1 else map_rows(stops, lambda x: jnp.repeat(x, n, axis=0))


def stop_hits(window: Array, stops_: Stops, stop_sequences: Array, target_axis: bool = False) -> Array:
    """``bool[...]``: ``window [..., W]`` (last tokens) ends with a stop sequence or completes a stop string."""
    hit = matches_stop(window[..., window.shape[-1] - stop_sequences.shape[-1] :], stop_sequences)
    table = stops_.stop_strings
    if table is not None:
        if target_axis:
            table = table._replace(target=table.target[:, None])
        hit = hit | _stop_strings.hits(window, table)
    return hit


def window_width(stops_: Stops) -> int:
    """Static number of last tokens the stop rules read."""
    width = stops_.stop_sequences.shape[-1]
    if stops_.stop_strings is not None:
        width = max(width, stops_.stop_strings.max_len)
    return width


def _int_rows(value, batch: int, name: str, lo: int | None, hi: int | None) -> Array:
    _validate.check_range(value, name, lo=lo, hi=hi, integer=True)
    return _validate.row_param(value, (batch,), name, jnp.int32)


def _pack_sequences(seqs, name: str) -> np.ndarray:
    """A list of token-id lists -> ``int32[S, L]``, right-aligned and left-padded with -1."""
    seqs = [list(np.asarray(s, np.int64).reshape(-1)) for s in seqs]
    if any(len(s) == 0 for s in seqs):
        raise ValueError(f"{name} must not contain empty sequences")
    if any(t < 0 for s in seqs for t in s):
        raise ValueError(f"{name} must contain token ids >= 0")
    width = max((len(s) for s in seqs), default=1)
    out = np.full((len(seqs), width), -1, np.int32)
    for i, s in enumerate(seqs):
        out[i, width - len(s) :] = s
    return out


def stops(
    batch: int,
    *,
    max_new_tokens: ArrayLike,
    max_tokens: int | None,
    eos_ids: ArrayLike | None = None,
    stop_sequences=None,
    min_new_tokens: ArrayLike = 0,
    repetition_detection=None,
    logprob_token_ids: ArrayLike | None = None,
) -> tuple[Stops, int]:
    """Validates the stopping rules for ``batch`` rows; returns them and the static buffer width ``N``.

    Args:
      batch: number of rows.
      max_new_tokens: int or ``int[B]`` (traced values are clipped to ``[0, N]``).
      max_tokens: static output width ``N``; defaults to the largest concrete ``max_new_tokens``.
        Fix it explicitly so that new ``max_new_tokens`` values never recompile.
      eos_ids: ``None``, an id, a list of ids, or an ``int[E]`` / ``int[B, E]`` array (``-1`` = unused).
      stop_sequences: ``None``, a list of token-id lists, or an ``int[S, L]`` / ``int[B, S, L]`` array,
        right-aligned with ``-1`` padding on the left; or a
        :class:`~jaxsample.decoding.stop_strings.StopStrings` table (text stop strings, ``B`` rows).
      min_new_tokens: int or ``int[B]``; EOS is masked and no rule stops a row before this many tokens.
      repetition_detection: ``None`` or vLLM's ``RepetitionDetectionParams`` fields as a mapping
        (``max_pattern_size``, ``min_pattern_size``, ``min_count``; ints or ``int[B]``; optional
        static ``bound``) or an object with those attributes.
      logprob_token_ids: ``None``, a list of ids, or ``int[M]`` / ``int[B, M]`` (``-1`` = unused
        slot): the buffer records their raw log-probs at every step (vLLM ``logprob_token_ids``).
    """
    if max_tokens is None:
        if not _validate.is_concrete(max_new_tokens):
            raise ValueError("max_tokens (the static output width) is required when max_new_tokens is traced")
        max_tokens = int(np.max(np.asarray(max_new_tokens)))
    n = _validate.static_int(max_tokens, "max_tokens", lo=0)
    max_new = jnp.clip(_int_rows(max_new_tokens, batch, "max_new_tokens", 0, n), 0, n)
    min_new = jnp.maximum(_int_rows(min_new_tokens, batch, "min_new_tokens", 0, None), 0)

    if eos_ids is None:
        eos = jnp.full((batch, 1), -1, jnp.int32)
    else:
        eos = jnp.asarray(eos_ids)
        if not jnp.issubdtype(eos.dtype, jnp.integer):
            raise ValueError(f"eos_ids must be integer token ids, got dtype {eos.dtype}")
        eos = eos.astype(jnp.int32)
        if eos.ndim == 0:
            eos = eos[None]
        if eos.shape[-1] == 0:
            eos = jnp.full((batch, 1), -1, jnp.int32)
        eos = _validate.check_tokens(eos, "eos_ids", (batch,))

    table = None
    if isinstance(stop_sequences, _stop_strings.StopStrings):
        table, stop_sequences = stop_sequences, None
        if table.target.ndim != 2 or table.target.shape[0] != batch:
            raise ValueError(
                f"stop_sequences: the StopStrings table was built for {table.target.shape[0]} rows, the batch has {batch}"
            )
    if stop_sequences is None or (isinstance(stop_sequences, (list, tuple)) and len(stop_sequences) == 0):
        seqs = jnp.full((batch, 0, 1), -1, jnp.int32)
    else:
        if isinstance(stop_sequences, (list, tuple)):
            stop_sequences = _pack_sequences(stop_sequences, "stop_sequences")
        seqs = jnp.asarray(stop_sequences)
        if not jnp.issubdtype(seqs.dtype, jnp.integer) or seqs.ndim not in (2, 3):
            raise ValueError(
                "stop_sequences must be a list of token-id lists or an int array [S, L] / [B, S, L]"
            )
        seqs = jnp.broadcast_to(seqs.astype(jnp.int32), (batch,) + seqs.shape[-2:])
    ids = None
    if logprob_token_ids is not None:
        ids = _validate.check_tokens(jnp.atleast_1d(jnp.asarray(logprob_token_ids)), "logprob_token_ids", (batch,))
        ids = jnp.broadcast_to(ids.astype(jnp.int32), (batch, ids.shape[-1]))
    return Stops(eos, seqs, min_new, max_new, table, _repetition.params(batch, repetition_detection), ids), n


# ------------------------------------------------------------------------------------ traced rules
def is_eos(tokens: Array, eos_ids: Array) -> Array:
    """``bool[...]``: whether ``tokens [...]`` is one of the row's EOS ids (``eos_ids [..., E]``)."""
    return jnp.any((tokens[..., None] == eos_ids) & (eos_ids >= 0), axis=-1)


def matches_stop(window: Array, stop_sequences: Array) -> Array:
    """``bool[...]``: whether ``window [..., L]`` (the last tokens) ends with one of ``stop_sequences [..., S, L]``.

    Stop sequences are right-aligned; ``-1`` entries are padding and match anything.
    """
    if stop_sequences.shape[-2] == 0:
        return jnp.zeros(window.shape[:-1], bool)
    seq = stop_sequences
    ok = (seq < 0) | (window[..., None, :] == seq)
    return jnp.any(jnp.all(ok, axis=-1) & jnp.any(seq >= 0, axis=-1), axis=-1)


def mask_eos(logits: Array, stops: Stops, generated: Array) -> Array:
    """Masks every EOS id to ``-inf`` in rows with fewer than ``min_new_tokens`` generated tokens.

    ``logits [B, V]`` (logits or log-probs), ``generated int32[B]``. This is HF's
    ``MinNewTokensLengthLogitsProcessor`` / vLLM's min-tokens rule, applied before the sampler chain.
    """
    v = logits.shape[-1]
    ids = jnp.arange(v)
    hit = jnp.any((ids[None, None, :] == stops.eos_ids[:, :, None]), axis=1)  # [B, V]
    return jnp.where(hit & (generated < stops.min_new_tokens)[:, None], _math.NEG_INF, logits)


def last_tokens(buffer: Array, length: Array, width: int) -> Array:
    """``int32[B, width]``: the last ``width`` tokens of each row's buffer (``-1`` before the start)."""
    idx = length[:, None] - width + jnp.arange(width)
    got = jnp.take_along_axis(buffer, jnp.clip(idx, 0, buffer.shape[-1] - 1), axis=-1)
    return jnp.where(idx >= 0, got, -1)


# ------------------------------------------------------------------------------------ output buffer
class Logprobs(NamedTuple):
    """Log-probabilities of the chosen tokens (entries past a row's length are 0)."""

    raw: Array  # float32[B, N]: log_softmax(model logits)[token]
    processed: Array  # float32[B, N]: log_softmax(processed logits)[token] (what was sampled from)
    top_ids: Array  # int32[B, N, n]: the n most likely tokens under the raw model distribution
    top_raw: Array  # float32[B, N, n]: their raw log-probabilities
    requested: Array | None = None  # float32[B, N, M]: raw log-probs of Stops.logprob_ids (-inf: unused slot)


class Tracker(NamedTuple):
    """Fixed-shape output of a decode: tokens, lengths, finish state and optional log-probs."""

    tokens: Array  # int32[B, N], pad_id past the length
    length: Array  # int32[B]: tokens generated (EOS / stop sequence included)
    done: Array  # bool[B]
    reason: Array  # int32[B]: FinishReason
    logprobs: Logprobs | None


def tracker(stops: Stops, width: int, pad_id: int, top_logprobs: int | None) -> Tracker:
    """An empty buffer; rows with ``max_new_tokens == 0`` start finished (reason LENGTH).

    ``top_logprobs=None`` records no log-probs; an int ``n >= 0`` records them with top-``n``.
    """
    b = stops.max_new_tokens.shape[0]
    lp = None
    if top_logprobs is not None:
        n = top_logprobs
        lp = Logprobs(
            jnp.zeros((b, width)),
            jnp.zeros((b, width)),
            jnp.zeros((b, width, n), jnp.int32),
            jnp.zeros((b, width, n)),
            None if stops.logprob_ids is None else jnp.zeros((b, width, stops.logprob_ids.shape[-1])),
        )
    empty = stops.max_new_tokens <= 0
    return Tracker(
        tokens=jnp.full((b, width), pad_id, jnp.int32),
        length=jnp.zeros((b,), jnp.int32),
        done=empty,
        reason=jnp.where(empty, int(FinishReason.LENGTH), int(FinishReason.NOT_FINISHED)).astype(jnp.int32),
        logprobs=lp,
    )


def step_logprobs(raw_logits: Array, processed: Array, tokens: Array, top_n: int, ids: Array | None = None) -> tuple:
    """``(raw [B], processed [B], top_ids [B, n], top_raw [B, n], requested [B, M] or None)`` for chosen
    ``tokens [B]`` (``requested``: raw log-probs of ``ids [B, M]``, ``-inf`` where an id is ``< 0``)."""
    raw_lp = _math.log_softmax(raw_logits)
    proc_lp = _math.log_softmax(processed)
    pick = lambda lp: jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]  # noqa: E731
    if top_n:
        top_raw, top_ids = _top_n(raw_lp, top_n)
    else:
        top_raw, top_ids = jnp.zeros(tokens.shape + (0,)), jnp.zeros(tokens.shape + (0,), jnp.int32)
    requested = None
    if ids is not None:
        got = jnp.take_along_axis(raw_lp, jnp.maximum(ids, 0), axis=-1)
        requested = jnp.where(ids >= 0, got, -jnp.inf)
    return pick(raw_lp), pick(proc_lp), top_ids, top_raw, requested


def _top_n(x: Array, k: int) -> tuple[Array, Array]:
    """``lax.top_k`` padded with ``(-inf, -1)`` when ``k > V``."""
    vals, ids = lax.top_k(x, min(k, x.shape[-1]))
    pad = k - vals.shape[-1]
    if pad:
        vals = jnp.pad(vals, [(0, 0)] * (vals.ndim - 1) + [(0, pad)], constant_values=-jnp.inf)
        ids = jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(0, pad)], constant_values=-1)
    return vals, ids.astype(jnp.int32)


def push(state: Tracker, stops: Stops, token: Array, active: Array, logprobs: tuple | None = None) -> Tracker:
    """Appends ``token int32[B]`` to rows that are ``active`` and not finished, then applies the rules."""
    b, n = state.tokens.shape
    write = active & ~state.done
    rows = jnp.arange(b)
    col = jnp.where(write, state.length, n)  # out of range -> dropped
    tokens = state.tokens.at[rows, col].set(token, mode="drop")
    length = state.length + write.astype(jnp.int32)
    lp = state.logprobs
    if lp is not None and logprobs is not None:
        raw, proc, top_ids, top_raw, requested = logprobs
        lp = Logprobs(
            lp.raw.at[rows, col].set(raw, mode="drop"),
            lp.processed.at[rows, col].set(proc, mode="drop"),
            lp.top_ids.at[rows, col].set(top_ids, mode="drop"),
            lp.top_raw.at[rows, col].set(top_raw, mode="drop"),
            None if requested is None else lp.requested.at[rows, col].set(requested, mode="drop"),
        )
    may_stop = write & (length >= stops.min_new_tokens)
    eos = may_stop & is_eos(token, stops.eos_ids)
    stop = may_stop & stop_hits(last_tokens(tokens, length, window_width(stops)), stops, stops.stop_sequences)
    full = write & (length >= stops.max_new_tokens)
    repeated = jnp.zeros_like(full)
    if stops.repetition is not None:
        repeated = may_stop & ~(eos | stop | full) & _repetition.detect(tokens, length, stops.repetition)
    reason = jnp.where(repeated, int(FinishReason.REPETITION), state.reason)
    reason = jnp.where(
        eos,
        int(FinishReason.EOS),
        jnp.where(
            stop, int(FinishReason.STOP_SEQUENCE), jnp.where(full, int(FinishReason.LENGTH), reason)
        ),
    ).astype(jnp.int32)
    return Tracker(tokens, length, state.done | eos | stop | full | repeated, reason, lp)
