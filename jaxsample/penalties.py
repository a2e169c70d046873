"""Repetition, frequency and presence penalties over a token history (llama.cpp, vLLM, HF).

A history is ``int32[..., T]``, oldest first. An entry is a token iff ``0 <= id < V``: negative
entries are padding and ids outside the vocabulary (vLLM pads prompts with ``V``) are ignored
alike, wherever they sit. The window of ``last_n`` covers the last ``last_n`` *tokens*, padding
not counted.

Counting cost: occurrences are counted by one scatter-add of the ``T`` history entries into a
``[..., V]`` int32 array (vLLM's ``bincount``), then the penalty is a dense elementwise pass over
the logits. That is ``O(T + V)`` work and memory per row, needs no sort, and applies the
repetition penalty once per distinct token by construction. The alternative, comparing every
window entry with every other (``O(T^2)``) and scattering penalised values back, only wins for
tiny windows and still needs a scatter, so it is not used. Batches whose rows all have neutral
values (``repeat = 1``, ``frequency = presence = 0``, or ``last_n = 0``) skip both passes.

The private helpers below (:func:`_compact`, ``_NEVER``) are shared by
:mod:`jaxsample.ngram` and :mod:`jaxsample.dry`.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike

_TINY = float(jnp.finfo(jnp.float32).tiny)
#: Fill value for shifted histories: matches no token and no :func:`_compact` sentinel.
_NEVER = -(2**31)


# --------------------------------------------------------------------------- history helpers
def _in_window(history: Array, vocab_size: int, last_n: Array) -> Array:
    """``bool[..., T]``: tokens among the last ``last_n`` tokens (``last_n < 0``: all).

    Args:
      history: ``int32[..., T]``.
      vocab_size: ``V``.
      last_n: ``int32[...]`` window size per row.
    """
    valid = _math.valid_ids(history, vocab_size)
    # Number of tokens at or after each position (1 for the most recent token).
    from_end = jnp.flip(jnp.cumsum(jnp.flip(valid, -1), axis=-1), -1)
    n = last_n[..., None]
    return valid & ((n < 0) | (from_end <= n))


def _compact(history: Array, vocab_size: int) -> tuple[Array, Array]:
    """Moves the tokens of each row to the end, in order; fills the front with unique negatives.

    Args:
      history: ``int32[..., T]``.
      vocab_size: ``V``; entries outside ``[0, V)`` are dropped.

    Returns:
      ``(c int32[..., T], m int32[...])``: ``c[..., T-m:]`` are the row's ``m`` tokens oldest
      first and ``c[..., p] = -(p + 1)`` for ``p < T - m``. The sentinels are distinct from each
      other and from every token, so position-wise comparisons never match padding.
    """
    t = history.shape[-1]
    valid = _math.valid_ids(history, vocab_size)
    m = jnp.sum(valid, axis=-1, dtype=jnp.int32)
    dest = jnp.where(valid, t - m[..., None] + jnp.cumsum(valid, axis=-1, dtype=jnp.int32) - 1, t)
    sentinels = jnp.broadcast_to(-(1 + jnp.arange(t, dtype=jnp.int32)), history.shape)
    return _math.scatter(sentinels, dest, history, "set"), m


# ----------------------------------------------------------------------------------- penalties
def _counts(history: Array, vocab_size: int, last_n: Array) -> Array:
    """``int32[..., V]`` occurrences of each token among the last ``last_n`` tokens."""
    window = _in_window(history, vocab_size, last_n)
    zeros = jnp.zeros(history.shape[:-1] + (vocab_size,), jnp.int32)
    return _math.scatter(zeros, jnp.where(window, history, vocab_size), window.astype(jnp.int32))


def _penalise(x: Array, counts: Array, repeat: Array, frequency: Array, presence: Array) -> Array:
    """llama.cpp's formula on float32 ``x [..., V]``; parameters are ``[..., 1]``."""
    seen = counts > 0
    y = jnp.where(x <= 0, x * repeat, x / repeat) - (counts.astype(jnp.float32) * frequency + presence)
    return jnp.where(seen, y, x)  # tokens absent from the window stay exactly as they were


def penalties(
    logits: ArrayLike,
    history: ArrayLike,
    repeat: ArrayLike = 1.0,
    frequency: ArrayLike = 0.0,
    presence: ArrayLike = 0.0,
    last_n: ArrayLike = -1,
) -> Array:
    """Repetition, frequency and presence penalties over the last ``last_n`` history tokens.

    For every token with ``c > 0`` occurrences in the window (llama.cpp ``penalties``)::

        logit = logit * repeat if logit <= 0 else logit / repeat      # once per distinct token
        logit -= c * frequency + presence

    vLLM's scopes (repetition over prompt and output, frequency/presence over the output only)
    are two calls on the corresponding histories (see ``stages.penalties(scope="vllm")``); HF's
    ``RepetitionPenaltyLogitsProcessor`` is ``penalties(logits, input_ids, repeat=penalty)``.

    Args:
      logits: ``[..., V]`` float32 or bfloat16.
      history: ``int32[..., T]`` token ids, oldest first; entries outside ``[0, V)`` are ignored.
      repeat: repetition penalty ``> 0`` (``1`` = off), scalar or ``[...]``. Traced values
        ``<= 0`` are clamped to the smallest positive float.
      frequency: subtracted once per occurrence (``0`` = off), scalar or ``[...]``.
      presence: subtracted once per distinct token (``0`` = off), scalar or ``[...]``.
      last_n: window size in tokens, scalar or ``[...]``: ``-1`` (any negative when traced) =
        the whole history, ``0`` = no penalty.

    Returns:
      ``[..., V]`` logits in the input dtype.

    Raises:
      ValueError: ``repeat <= 0``, ``last_n < -1``, a non-integer ``last_n``, NaN parameters, or
        shapes that do not broadcast to ``logits.shape[:-1]``.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([2.0, -1.0, 0.5, 1.0])
    >>> penalties(x, jnp.array([0, 1, 1, -1]), repeat=2.0, frequency=0.5).tolist()
    [0.5, -3.0, 0.5, 1.0]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    history = _validate.check_tokens(history, "history", batch)
    r = _validate.param(repeat, batch, "repeat", lo=0.0, lo_open=True)
    f = _validate.param(frequency, batch, "frequency")
    p = _validate.param(presence, batch, "presence")
    n = _validate.param(last_n, batch, "last_n", dtype=jnp.int32, lo=-1)
    # Traced NaN values are off (the nearest meaningful value to "undefined").
    r = jnp.maximum(jnp.nan_to_num(r, nan=1.0), _TINY)
    f, p = jnp.nan_to_num(f, nan=0.0, posinf=jnp.inf, neginf=-jnp.inf), jnp.nan_to_num(p, nan=0.0, posinf=jnp.inf, neginf=-jnp.inf)

    def apply():  # inf - inf (a +inf logit with an infinite penalty) counts as -inf, like NaN input;
        # infinite penalties on every finite token keep the row's first maximum (never an empty row)
        out = _math.clean(_penalise(x, _counts(history, vocab, n), r[..., None], f[..., None], p[..., None]))
        return _math.nonempty(out, x)

    on = ((r != 1) | (f != 0) | (p != 0)) & (n != 0)  # neutral values leave every logit unchanged
    return _math.restore(_math.if_any(on, apply, lambda: x), dtype)


def encoder_repetition_penalty(logits: ArrayLike, encoder_ids: ArrayLike, penalty: ArrayLike) -> Array:
    """HF ``EncoderRepetitionPenaltyLogitsProcessor``: the repetition penalty with ``1 / penalty``.

    Tokens present in ``encoder_ids`` have positive logits multiplied by ``penalty`` and
    non-positive ones divided by it, so ``penalty > 1`` *rewards* copying from the source.

    Args:
      logits: ``[..., V]``.
      encoder_ids: ``int32[..., S]`` encoder input ids; entries outside ``[0, V)`` are ignored.
      penalty: ``> 0`` (``1`` = off), scalar or ``[...]``; traced values ``<= 0`` are clamped to the
        smallest positive float.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> encoder_repetition_penalty(jnp.array([1.0, -1.0, 1.0]), jnp.array([0, 1]), 2.0).tolist()
    [2.0, -0.5, 1.0]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    encoder_ids = _validate.check_tokens(encoder_ids, "encoder_ids", batch)
    pen = _validate.param(penalty, batch, "penalty", lo=0.0, lo_open=True)
    pen = jnp.maximum(jnp.nan_to_num(pen, nan=1.0), _TINY)
    def apply():
        counts = _counts(encoder_ids, vocab, jnp.full(batch, -1, jnp.int32))
        zero = jnp.zeros(batch + (1,), jnp.float32)
        return _math.nonempty(_math.clean(_penalise(x, counts, (1.0 / pen)[..., None], zero, zero)), x)

    return _math.restore(_math.if_any(pen != 1, apply, lambda: x), dtype)
