"""Stages for the history-based processors: penalties, n-gram bans, sequence bias, DRY."""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _validate
from jaxsample._types import Array
from jaxsample import ngram as _ngram
from jaxsample.chain import Param, Stage, StepInfo, cached
from jaxsample.dry import dry as _dry_fn
from jaxsample.penalties import encoder_repetition_penalty as _encoder_repetition_penalty_fn
from jaxsample.penalties import penalties as _penalties_fn

_PENALTY_SCOPES = ("llama", "vllm", "hf")


def _recent(info: StepInfo, w: int):
    """The last ``w`` entries of the history ring (``w < 0``: all of it)."""
    h = info.history
    return h if w < 0 else h[..., h.shape[-1] - min(w, h.shape[-1]) :]


def _generated(history, position):
    """``history`` with everything but the last ``position`` entries (the generated tokens) blanked."""
    t = history.shape[-1]
    return jnp.where(jnp.arange(t) >= t - position[..., None], history, -1)


def _with_prompt(info: StepInfo):
    """Prompt ids, then the history: every token of the request even if the ring dropped the prompt.

    Tokens kept by both appear twice, so this only serves presence-based penalties (repetition).
    """
    if info.prompt is None:
        return info.history
    return jnp.concatenate([info.prompt, info.history], axis=-1)


def _hf_input_ids(info: StepInfo, ignore) -> Array:
    """HF's ``input_ids`` (prompt + generated) with its first ``ignore [B]`` entries blanked (``prompt_ignore_length``).

    A ring entry's index in the request is ``prompt_len + position - W + i`` (prompt left-aligned,
    ``-1`` padding after it); prompt entries repeated by :func:`_with_prompt` keep their own index.
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


def _window_param(name: str, default: int, w: int) -> Param:
    return Param(name, default, jnp.int32, lo=-1, hi=None if w < 0 else w)


@cached
def penalties(
    last_n: int = 64,
    repeat: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
    *,
    scope: str = "llama",
    name: str = "penalties",
) -> Stage:
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
    if scope not in _PENALTY_SCOPES:
        raise ValueError(f"scope must be one of {_PENALTY_SCOPES}, got {scope!r}")
    rep = Param("repetition_penalty", repeat, lo=0.0, lo_open=True)
    freq = Param("frequency_penalty", frequency)
    pres = Param("presence_penalty", presence)
    if scope == "hf":

        def update_hf(x, s, p, info):
            return _penalties_fn(x, _hf_input_ids(info, p["prompt_ignore_length"]), repeat=p["repetition_penalty"]), s

        ignore = Param("prompt_ignore_length", 0, jnp.int32, lo=0)
        return Stage(name, update_hf, params=(rep, ignore), history=-1, nan_free=True)
    if scope == "vllm":

        def update_vllm(x, s, p, info):
            x = _penalties_fn(x, _with_prompt(info), repeat=p["repetition_penalty"])
            out = _generated(info.history, info.position)
            return _penalties_fn(x, out, frequency=p["frequency_penalty"], presence=p["presence_penalty"]), s

        return Stage(name, update_vllm, params=(rep, freq, pres), history=-1, nan_free=True)
    w = _validate.static_int(last_n, "last_n", lo=-1)

    def update_llama(x, s, p, info):
        if w == 0:
            return x, s
        n = p["penalty_last_n"]
        return (
            _penalties_fn(
                x, _recent(info, w), p["repetition_penalty"], p["frequency_penalty"], p["presence_penalty"], n
            ),
            s,
        )

    params = (rep, freq, pres, _window_param("penalty_last_n", w, w))
    return Stage(name, update_llama, params=params, history=w, nan_free=True)


@cached
def encoder_repetition_penalty(penalty: float = 1.0, *, name: str = "encoder_repetition_penalty") -> Stage:
    """HF ``EncoderRepetitionPenaltyLogitsProcessor`` over ``StepInfo.encoder_ids``.

    Falls back to the prompt when the sampler was initialised without ``encoder_ids`` (HF passes
    the prompt for decoder-only models). Param: ``encoder_repetition_penalty`` (``> 0``).
    """

    def update(x, s, p, info):
        ids = info.encoder_ids if info.encoder_ids is not None else info.prompt
        if ids is None:
            raise ValueError(f"stage {name!r} needs encoder_ids= (or prompt=) in Sampler.init")
        return _encoder_repetition_penalty_fn(x, ids, p["encoder_repetition_penalty"]), s

    return Stage(name, update, params=(Param("encoder_repetition_penalty", penalty, lo=0.0, lo_open=True),))


@cached
def no_repeat_ngram(n: int, *, last_n: int = -1, name: str = "no_repeat_ngram") -> Stage:
    """HF ``NoRepeatNGramLogitsProcessor`` over prompt + generated ids.

    ``n`` (HF ``no_repeat_ngram_size``) is static: it fixes the shapes of the n-gram match. Use a
    chain without this stage for rows that should not use it. ``last_n`` is the static window
    (``-1`` = the whole ring, as HF: ``Sampler.init`` then needs a ``history_size`` that holds the
    prompt and every generated token, or the oldest n-grams are forgotten).
    """
    n = _validate.static_int(n, "n", lo=1)
    w = _validate.static_int(last_n, "last_n", lo=-1)

    def update(x, s, p, info):
        return _ngram.no_repeat_ngram(x, _recent(info, w), n), s

    return Stage(name, update, history=w)


@cached
def encoder_no_repeat_ngram(n: int, *, name: str = "encoder_no_repeat_ngram") -> Stage:
    """HF ``EncoderNoRepeatNGramLogitsProcessor``: n-grams of ``StepInfo.encoder_ids``, static ``n``."""
    n = _validate.static_int(n, "n", lo=1)

    def update(x, s, p, info):
        if info.encoder_ids is None:
            raise ValueError(f"stage {name!r} needs encoder_ids= in Sampler.init (HF: encoder-decoder models only)")
        return _ngram.encoder_no_repeat_ngram(x, info.encoder_ids, _recent(info, n - 1), n), s

    return Stage(name, update, history=n - 1)


@cached
def bad_words(sequences, *, scope: str = "vllm", eos_ids=(), name: str = "bad_words") -> Stage:
    """Bans token sequences: ``scope="vllm"`` matches generated tokens only, ``"hf"`` the whole
    ``input_ids`` with HF's rules (a sequence longer than the context is ignored; single-token
    sequences equal to an ``eos_ids`` entry are dropped)."""
    if scope not in ("vllm", "hf"):
        raise ValueError(f"scope must be 'vllm' or 'hf', got {scope!r}")
    seqs = _validate.static_sequences(sequences, "sequences", unique=False)
    longest = max((len(q) for q in seqs), default=1)
    w = longest if scope == "hf" else longest - 1

    def update(x, s, p, info):
        h = _recent(info, w)
        if scope == "vllm":
            h = _generated(h, info.position)
        return _ngram.bad_words(x, h, seqs, eos_ids, skip_longer_than_context=scope == "hf"), s

    return Stage(name, update, history=w)


@cached
def sequence_bias(sequences, biases, *, name: str = "sequence_bias") -> Stage:
    """HF ``SequenceBiasLogitsProcessor`` over prompt + generated ids.

    Each sequence ``i`` reads its bias from the per-row param ``f"{name}_{i}"`` (default
    ``biases[i]``), so biases change per row and per call without recompiling.
    """
    seqs = _validate.static_sequences(sequences, "sequences")
    biases = tuple(float(b) for b in biases)
    if len(biases) != len(seqs):
        raise ValueError(f"biases needs one value per sequence ({len(seqs)}), got {len(biases)}")
    params = tuple(Param(f"{name}_{i}", b) for i, b in enumerate(biases))
    w = max((len(q) for q in seqs), default=1)

    def update(x, s, p, info):
        b = jnp.stack([p[q.name] for q in params], axis=-1)
        return _ngram.sequence_bias(x, _recent(info, w), seqs, b), s

    return Stage(name, update, params=params, history=w)


@cached
def dry(
    multiplier: float = 0.0,
    base: float = 1.75,
    allowed_length: int = 2,
    last_n: int = -1,
    sequence_breakers=(),
    *,
    name: str = "dry",
) -> Stage:
    """llama.cpp DRY over prompt + generated ids, llama's defaults.

    ``last_n`` is the static window ``W`` (``-1`` = the whole ring: ``Sampler.init`` needs
    ``history_size``); ``sequence_breakers`` are static token-id tuples (see
    :func:`jaxsample.dry_sequence_breakers`). Params: ``dry_multiplier`` (``0`` = off),
    ``dry_base``, ``dry_allowed_length`` (int ``>= 0``), ``dry_penalty_last_n`` (``<= W``,
    ``-1`` = ``W``, ``0`` = off; default ``-1``).
    """
    w = _validate.static_int(last_n, "last_n", lo=-1)
    breakers = _validate.static_sequences(sequence_breakers, "sequence_breakers", unique=False)
    params = (
        Param("dry_multiplier", multiplier),
        Param("dry_base", base),
        Param("dry_allowed_length", allowed_length, jnp.int32, lo=0),
        _window_param("dry_penalty_last_n", -1, w),
    )

    def update(x, s, p, info):
        if w == 0:
            return x, s
        out = _dry_fn(
            x,
            _recent(info, w),
            p["dry_multiplier"],
            p["dry_base"],
            p["dry_allowed_length"],
            p["dry_penalty_last_n"],
            breakers,
        )
        return out, s

    return Stage(name, update, params=params, history=w, nan_free=True)
