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

Sharding/TPU: rows are independent; shard the batch axis. One scatter-add of the history and one
elementwise pass over ``[*B, V]``; skipping neutral batches is a batch-level ``lax.cond`` (an
all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage, StepInfo

_TINY = float(jnp.finfo(jnp.float32).tiny)


# ----------------------------------------------------------------------------------- penalties
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
    logits: Float["*B V"],
    history: Int["*B T"],
    repeat: ArrayLike = 1.0,
    frequency: ArrayLike = 0.0,
    presence: ArrayLike = 0.0,
    last_n: ArrayLike = -1,
) -> Float["*B V"]:
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
    batch = x.shape[:-1]
    history = _validate.check_tokens(history, "history", batch)
    r = _validate.param(repeat, batch, "repeat", lo=0.0, lo_open=True)
    f = _validate.param(frequency, batch, "frequency")
    p = _validate.param(presence, batch, "presence")
    n = _validate.param(last_n, batch, "last_n", dtype=jnp.int32, lo=-1)
    return _math.restore(_penalties(x, history, r, f, p, n), dtype)


def _penalties(x: Array, history: Array, repeat: Array, frequency: Array, presence: Array, last_n: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]`` and ``[*B]`` parameters."""
    # Traced NaN values are off (the nearest meaningful value to "undefined").
    r = jnp.maximum(jnp.nan_to_num(repeat, nan=1.0), _TINY)
    f = jnp.nan_to_num(frequency, nan=0.0, posinf=jnp.inf, neginf=-jnp.inf)
    p = jnp.nan_to_num(presence, nan=0.0, posinf=jnp.inf, neginf=-jnp.inf)

    def apply():  # inf - inf (a +inf logit with an infinite penalty) counts as -inf, like NaN input;
        # infinite penalties on every finite token keep the row's first maximum (never an empty row)
        counts = _counts(history, x.shape[-1], last_n)
        return _math.nonempty(_math.clean(_penalise(x, counts, r[..., None], f[..., None], p[..., None])), x)

    on = ((r != 1) | (f != 0) | (p != 0)) & (last_n != 0)  # neutral values leave every logit unchanged
    return _math.if_any(on, apply, lambda: x)


def encoder_repetition_penalty(logits: Float["*B V"], encoder_ids: Int["*B S"], penalty: ArrayLike) -> Float["*B V"]:
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
    batch = x.shape[:-1]
    encoder_ids = _validate.check_tokens(encoder_ids, "encoder_ids", batch)
    pen = _validate.param(penalty, batch, "penalty", lo=0.0, lo_open=True)
    return _math.restore(_encoder_repetition_penalty(x, encoder_ids, pen), dtype)


def _encoder_repetition_penalty(x: Array, encoder_ids: Array, penalty: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``encoder_ids int32[*B, S]``, ``penalty float32[*B]``."""
    batch = x.shape[:-1]
    pen = jnp.maximum(jnp.nan_to_num(penalty, nan=1.0), _TINY)

    def apply():
        counts = _counts(encoder_ids, x.shape[-1], jnp.full(batch, -1, jnp.int32))
        zero = jnp.zeros(batch + (1,), jnp.float32)
        return _math.nonempty(_math.clean(_penalise(x, counts, (1.0 / pen)[..., None], zero, zero)), x)

    return _math.if_any(pen != 1, apply, lambda: x)


# ----------------------------------------------------------------------------------------- stages
_SCOPES = ("llama", "vllm", "hf")


def _window_param(name: str, default: int, w: int) -> Param:
    """A per-row window ``<= W`` (``-1`` = ``W``) over the static ring window ``w``."""
    return Param(name, default, jnp.int32, lo=-1, hi=None if w < 0 else w)


def _hf_input_ids(info: StepInfo, ignore: Array) -> Array:
    """HF's ``input_ids`` (prompt + generated) with its first ``ignore [B]`` entries blanked (``prompt_ignore_length``).

    A ring entry's index in the request is ``prompt_len + position - W + i`` (prompt left-aligned,
    ``-1`` padding after it); prompt entries repeated by ``StepInfo.with_prompt`` keep their own index.
    """
    h = info.history
    w = h.shape[-1]
    plen = 0 if info.prompt is None else jnp.sum(info.prompt >= 0, axis=-1)
    index = (plen + info.position - w)[..., None] + jnp.arange(w)
    h = jnp.where(index >= ignore[..., None], h, -1)
    if info.prompt is None:
        return h
    prompt = jnp.where(jnp.arange(info.prompt.shape[-1]) >= ignore[..., None], info.prompt, -1)
    return jnp.concatenate([prompt, h], axis=-1)


@dataclasses.dataclass(frozen=True)
class Penalties(Stage):
    """Repetition / frequency / presence penalties with the history scope of one anchor.

    * ``scope="llama"`` (llama.cpp ``penalties``): all three over the last ``penalty_last_n``
      tokens of prompt + generated ids. ``last_n`` is the static window ``W`` (``-1`` = the whole
      ring, then ``Sampler.init`` needs ``history_size``); the per-row ``penalty_last_n``
      (``<= W``, ``-1`` = ``W``, ``0`` = off) defaults to ``last_n``.
    * ``scope="vllm"``: repetition over prompt and every generated token, then frequency and
      presence over generated tokens only. Reads the whole ring (``history_size`` must cover the
      generation; the prompt comes from ``StepInfo.prompt``); ``last_n`` is ignored.
    * ``scope="hf"`` (``RepetitionPenaltyLogitsProcessor``): repetition only, over prompt and
      generated ids except the first ``prompt_ignore_length`` of them (per row, default 0; HF's
      ``generate`` passes the left-padding lengths); ``last_n`` is ignored.

    Params: ``repetition_penalty`` (``> 0``), ``frequency_penalty``, ``presence_penalty``,
    ``penalty_last_n`` (llama scope), ``prompt_ignore_length`` (hf scope, ``>= 0``).
    """

    last_n: int = 64
    repeat: float = dataclasses.field(default=1.0, compare=False)
    frequency: float = dataclasses.field(default=0.0, compare=False)
    presence: float = dataclasses.field(default=0.0, compare=False)
    _: dataclasses.KW_ONLY
    scope: str = "llama"
    name: str = "penalties"

    def __post_init__(self):
        if self.scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {self.scope!r}")
        last_n = _validate.static_int(self.last_n, "last_n", lo=-1) if self.scope == "llama" else -1
        object.__setattr__(self, "last_n", last_n)
        super().__post_init__()

    @property
    def history(self) -> int:
        return self.last_n

    @property
    def params(self) -> tuple[Param, ...]:
        rep = Param("repetition_penalty", self.repeat, lo=0.0, lo_open=True)
        freq, pres = Param("frequency_penalty", self.frequency), Param("presence_penalty", self.presence)
        if self.scope == "hf":
            return (rep, Param("prompt_ignore_length", 0, jnp.int32, lo=0))
        if self.scope == "vllm":
            return (rep, freq, pres)
        return (rep, freq, pres, _window_param("penalty_last_n", self.last_n, self.last_n))

    def update(self, x, state, p, info):
        batch = x.shape[:-1]
        ones, zeros, everything = jnp.ones(batch), jnp.zeros(batch), jnp.full(batch, -1, jnp.int32)
        rep = p["repetition_penalty"]
        if self.scope == "hf":
            return _penalties(x, _hf_input_ids(info, p["prompt_ignore_length"]), rep, zeros, zeros, everything), state
        if self.scope == "vllm":
            x = _penalties(x, info.with_prompt(), rep, zeros, zeros, everything)
            out = info.generated(info.history)
            return _penalties(x, out, ones, p["frequency_penalty"], p["presence_penalty"], everything), state
        if self.last_n == 0:
            return x, state
        freq, pres = p["frequency_penalty"], p["presence_penalty"]
        return _penalties(x, info.recent(self.last_n), rep, freq, pres, p["penalty_last_n"]), state


@dataclasses.dataclass(frozen=True)
class EncoderRepetitionPenalty(Stage):
    """HF ``EncoderRepetitionPenaltyLogitsProcessor`` over ``StepInfo.encoder_ids``.

    Falls back to the prompt when the sampler was initialised without ``encoder_ids`` (HF passes
    the prompt for decoder-only models). Param: ``encoder_repetition_penalty`` (``> 0``).
    """

    penalty: float = dataclasses.field(default=1.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "encoder_repetition_penalty"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("encoder_repetition_penalty", self.penalty, lo=0.0, lo_open=True),)

    def update(self, x, state, params, info):
        ids = info.encoder_ids if info.encoder_ids is not None else info.prompt
        if ids is None:
            raise ValueError(f"stage {self.name!r} needs encoder_ids= (or prompt=) in Sampler.init")
        return _encoder_repetition_penalty(x, ids, params["encoder_repetition_penalty"]), state
