"""Stage factories: every functional sampler as a chain stage, same name as the function.

Each factory fixes static configuration and the *default* of each per-row parameter; actual values
are passed per call through ``params`` (see :class:`jaxsample.chain.Sampler`).
"""

from __future__ import annotations

from jaxsample import selection
from jaxsample import temperature as _temperature
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import Param, Selector, Stage, stateless


def temperature(default: float = 1.0, *, name: str = "temperature") -> Stage:
    """:func:`jaxsample.temperature` reading ``params['temperature']``."""
    return stateless(name, _temperature.temperature, (Param("temperature", default),))


def dynamic_temperature(
    default: float = 1.0, delta: float = 0.0, exponent: float = 1.0, *, name: str = "temperature"
) -> Stage:
    """llama.cpp ``temp_ext`` reading ``temperature``, ``dynatemp_range``, ``dynatemp_exponent``."""
    return stateless(
        name,
        _temperature.dynamic_temperature,
        (
            Param("temperature", default),
            Param("dynatemp_range", delta),
            Param("dynatemp_exponent", exponent, lo=0.0),
        ),
    )


def greedy() -> Selector:
    """Selector taking the first maximal logit."""
    return Selector("greedy", lambda x, s, p, info: (selection.greedy(x), s))


def categorical(*, candidates: int = DEFAULT_CANDIDATES) -> Selector:
    """Selector drawing from ``softmax(logits)`` with the row's per-step key (llama.cpp ``dist``)."""
    return Selector("dist", lambda x, s, p, info: (selection.categorical(info.key, x, candidates=candidates), s))


# --- processors: token constraints, lengths, infill (branch `processors`) ------------------------------------
# Token-id lists: a stage combines the static ids given to its factory (model-level, e.g. EOS ids)
# with optional per-row ids read from ``params[f"{name}_ids"]`` (``int32[B, capacity]``, -1 padding;
# build them with :func:`token_params`). A fixed capacity means changing the ids never recompiles.

import jax.numpy as _jnp  # noqa: E402
import numpy as _np  # noqa: E402

from jaxsample import _validate as _val  # noqa: E402
from jaxsample.bias import allowed_tokens as _allowed_tokens  # noqa: E402
from jaxsample.bias import ignore_eos as _ignore_eos  # noqa: E402
from jaxsample.bias import logit_bias as _logit_bias  # noqa: E402
from jaxsample.bias import suppress_tokens as _suppress_tokens  # noqa: E402
from jaxsample.bias import suppress_tokens_at_begin as _suppress_tokens_at_begin  # noqa: E402
from jaxsample.infill import InfillTable as _InfillTable  # noqa: E402
from jaxsample.infill import infill as _infill  # noqa: E402
from jaxsample.lengths import exponential_decay_length_penalty as _exp_decay  # noqa: E402
from jaxsample.lengths import forced_bos as _forced_bos  # noqa: E402
from jaxsample.lengths import forced_eos as _forced_eos  # noqa: E402
from jaxsample.lengths import min_tokens as _min_tokens  # noqa: E402
from jaxsample.processors import log_softmax as _log_softmax  # noqa: E402
from jaxsample.processors import remove_inf_nan as _remove_inf_nan  # noqa: E402


def _padded(rows, batch_shape: tuple[int, ...], capacity: int, fill, dtype, name: str) -> _np.ndarray:
    """A ragged list (one list per row, or one list for all rows) or an array, padded to ``capacity``."""
    if isinstance(rows, (list, tuple)) and rows and isinstance(rows[0], (list, tuple, _np.ndarray)):
        n = int(_np.prod(batch_shape, dtype=_np.int64))
        if len(rows) != n:
            raise ValueError(f"{name}: got {len(rows)} per-row lists for a batch of {n} rows")
        longest = max((len(r) for r in rows), default=0)
        if longest > capacity:
            raise ValueError(f"{name}: a row lists {longest} entries, more than capacity={capacity}")
        out = _np.full((n, capacity), fill, dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = _np.asarray(r, dtype)
        return out.reshape(tuple(batch_shape) + (capacity,))
    arr = _np.asarray(rows, dtype)
    arr = arr.reshape(1) if arr.ndim == 0 else arr
    if arr.shape[-1] > capacity:
        raise ValueError(f"{name}: {arr.shape[-1]} entries, more than capacity={capacity}")
    pad = [(0, 0)] * (arr.ndim - 1) + [(0, capacity - arr.shape[-1])]
    arr = _np.pad(arr, pad, constant_values=fill)
    try:
        return _np.broadcast_to(arr, tuple(batch_shape) + (capacity,)).copy()
    except ValueError:
        raise ValueError(
            f"{name} has shape {arr.shape[:-1]}, which does not broadcast to the batch shape {batch_shape}"
        ) from None


def token_params(
    name: str,
    batch_shape: tuple[int, ...],
    ids,
    capacity: int,
    *,
    values=None,
    vocab_size: int | None = None,
) -> dict:
    """Per-row token-id lists for the stage called ``name``, padded to a static ``capacity``.

    Merge the result into the params of a chain: ``params = {**sampler.params(...), **token_params(...)}``.
    Same capacity, new ids or values: no recompilation.

    Args:
      name: the stage name (``"logit_bias"``, ``"allowed_tokens"``, ``"min_tokens"``...).
      batch_shape: the batch shape of the params.
      ids: one list per row (ragged), one list for all rows, or an int array ``[..., n]``;
        entries ``< 0`` are padding.
      capacity: static list length per row (``>=`` the longest list).
      values: per-id values of the same layout (``logit_bias`` only).
      vocab_size: when given, ids ``>= vocab_size`` raise ``ValueError``.

    Returns:
      ``{f"{name}_ids": int32[*batch_shape, capacity]}`` (+ ``f"{name}_values"`` float32).

    >>> p = token_params("logit_bias", (2,), [[5], [1, 2]], 3, values=[[-1.0], [2.0, 0.5]])
    >>> p["logit_bias_ids"].tolist(), p["logit_bias_values"].tolist()
    ([[5, -1, -1], [1, 2, -1]], [[-1.0, 0.0, 0.0], [2.0, 0.5, 0.0]])
    """
    batch_shape = tuple(batch_shape)
    capacity = _val.static_int(capacity, "capacity", lo=0)
    idx = _padded(ids, batch_shape, capacity, -1, _np.int32, "ids")
    if vocab_size is not None and idx.size and idx.max() >= vocab_size:
        raise ValueError(f"ids must be token ids < vocab size {vocab_size} (negative = padding), got {idx.max()}")
    out = {f"{name}_ids": _jnp.asarray(idx)}
    if values is not None:
        vals = _padded(values, batch_shape, capacity, 0.0, _np.float32, "values")
        _val.check_range(vals, "values")
        out[f"{name}_values"] = _jnp.asarray(vals)
    return out


def _row_ids(p, name: str, static: tuple[int, ...], batch_shape: tuple[int, ...]):
    """The stage's static ids followed by the per-row ids from ``params`` (if any): ``int32[B, n]``."""
    parts = [_jnp.broadcast_to(_jnp.asarray(static, _jnp.int32).reshape(-1), batch_shape + (len(static),))]
    if f"{name}_ids" in p:
        parts.append(_jnp.asarray(p[f"{name}_ids"], _jnp.int32))
    return _jnp.concatenate(parts, axis=-1)


def _static_ids(ids, name: str) -> tuple[int, ...]:
    ids = tuple(int(i) for i in _np.asarray(ids, _np.int64).reshape(-1))
    if any(i < 0 for i in ids):
        raise ValueError(f"{name} must be non-negative token ids, got {ids}")
    return ids


def logit_bias(ids=(), values=(), *, clamp: float | None = None, name: str = "logit_bias") -> Stage:
    """:func:`jaxsample.logit_bias`: static ``ids``/``values`` plus per-row sparse ``params[f"{name}_ids"]``
    and ``params[f"{name}_values"]`` (see :func:`token_params`) and dense ``params[f"{name}_dense"]`` ``[B, V]``.
    """
    static = _static_ids(ids, "ids")
    static_values = tuple(float(v) for v in _np.broadcast_to(_np.asarray(values, _np.float64), (len(static),)))

    def update(x, s, p, info):
        batch = x.shape[:-1]
        idx = _row_ids(p, name, static, batch)
        vals = [_jnp.broadcast_to(_jnp.asarray(static_values, _jnp.float32), batch + (len(static),))]
        if f"{name}_ids" in p:
            if f"{name}_values" not in p:
                raise ValueError(f"params has {name}_ids but no {name}_values (see token_params(values=))")
            vals.append(_jnp.broadcast_to(_jnp.asarray(p[f"{name}_values"], _jnp.float32), p[f"{name}_ids"].shape))
        dense = p.get(f"{name}_dense")
        return _logit_bias(x, dense, ids=idx, values=_jnp.concatenate(vals, axis=-1), clamp=clamp), s

    return Stage(name=name, update=update)


def allowed_tokens(ids=(), *, name: str = "allowed_tokens") -> Stage:
    """:func:`jaxsample.allowed_tokens` over static ``ids`` plus per-row ``params[f"{name}_ids"]``, or a
    per-row ``bool[B, V]`` ``params[f"{name}_mask"]``. Rows with an empty whitelist are unchanged."""
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        if f"{name}_mask" in p:
            if static or f"{name}_ids" in p:
                raise ValueError(f"stage {name!r}: give allowed tokens as ids or as a {name}_mask param, not both")
            return _allowed_tokens(x, mask=p[f"{name}_mask"]), s
        return _allowed_tokens(x, _row_ids(p, name, static, x.shape[:-1])), s

    return Stage(name=name, update=update)


def suppress_tokens(ids=(), *, name: str = "suppress_tokens") -> Stage:
    """:func:`jaxsample.suppress_tokens` over static ``ids`` plus per-row ``params[f"{name}_ids"]``."""
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        return _suppress_tokens(x, _row_ids(p, name, static, x.shape[:-1])), s

    return Stage(name=name, update=update)


def suppress_tokens_at_begin(ids=(), begin_index: int = 0, *, name: str = "suppress_tokens_at_begin") -> Stage:
    """:func:`jaxsample.suppress_tokens_at_begin` reading ``begin_index`` (per row) and the stage's ids."""
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _suppress_tokens_at_begin(x, idx, info.position, p["begin_index"]), s

    return Stage(name=name, update=update, params=(Param("begin_index", begin_index, _jnp.int32, lo=0),))


def min_tokens(default: int = 0, stop_ids=(), *, name: str = "min_tokens") -> Stage:
    """:func:`jaxsample.min_tokens` reading ``min_tokens`` (per row); stop ids = static ``stop_ids``
    (e.g. the model's EOS ids) plus per-row ``params[f"{name}_ids"]`` (vLLM ``stop_token_ids``)."""
    static = _static_ids(stop_ids, "stop_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _min_tokens(x, info.position, p["min_tokens"], idx), s

    return Stage(name=name, update=update, params=(Param("min_tokens", default, _jnp.int32, lo=0),))


def forced_bos(bos_id: int, *, name: str = "forced_bos") -> Stage:
    """:func:`jaxsample.forced_bos` at the first generated position, reading ``bos_id`` (per row)."""

    def update(x, s, p, info):
        return _forced_bos(x, info.position, p["bos_id"]), s

    return Stage(name=name, update=update, params=(Param("bos_id", bos_id, _jnp.int32, lo=0),))


def forced_eos(max_new_tokens: int, eos_ids=(), *, name: str = "forced_eos") -> Stage:
    """:func:`jaxsample.forced_eos` reading ``max_new_tokens`` (per row); EOS ids static + per row."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _forced_eos(x, info.position, p["max_new_tokens"], idx), s

    return Stage(name=name, update=update, params=(Param("max_new_tokens", max_new_tokens, _jnp.int32, lo=1),))


def exponential_decay_length_penalty(
    start: int, factor: float, eos_ids=(), *, name: str = "exponential_decay_length_penalty"
) -> Stage:
    """:func:`jaxsample.exponential_decay_length_penalty` reading ``exp_decay_start`` and
    ``exp_decay_factor`` (per row); EOS ids static + per row."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _exp_decay(x, info.position, p["exp_decay_start"], p["exp_decay_factor"], idx), s

    params = (Param("exp_decay_start", start, _jnp.int32), Param("exp_decay_factor", factor))
    return Stage(name=name, update=update, params=params)


def ignore_eos(eos_ids=(), default: bool = False, *, name: str = "ignore_eos") -> Stage:
    """llama.cpp ``ignore_eos`` (:func:`jaxsample.ignore_eos`), switched per row by ``ignore_eos`` (0 / 1)."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        return _ignore_eos(x, _row_ids(p, name, static, x.shape[:-1]), p["ignore_eos"]), s

    return Stage(name=name, update=update, params=(Param("ignore_eos", int(default), _jnp.int32, lo=0, hi=1),))


def remove_inf_nan(*, name: str = "remove_inf_nan") -> Stage:
    """HF ``InfNanRemoveLogitsProcessor`` (:func:`jaxsample.remove_inf_nan`)."""
    return stateless(name, _remove_inf_nan, ())


def log_softmax(*, name: str = "log_softmax") -> Stage:
    """HF ``LogitNormalization`` (:func:`jaxsample.log_softmax`)."""
    return stateless(name, _log_softmax, ())


def infill(table: _InfillTable, *, name: str = "infill") -> Stage:
    """llama.cpp ``infill`` (:func:`jaxsample.infill`) with a vocabulary table fixed at build time."""
    return stateless(name, lambda x: _infill(x, table), ())


# --- end processors ------------------------------------------------------------------------------------------
# ===================================================================== penalties / n-grams / DRY
# History-based processors (branch ``penalties``): jaxsample.penalties, jaxsample.ngram, jaxsample.dry.
import jax.numpy as jnp  # noqa: E402

from jaxsample import _validate  # noqa: E402
from jaxsample import ngram as _ngram  # noqa: E402
from jaxsample.chain import StepInfo  # noqa: E402
from jaxsample.dry import _normalise as _dry_breakers  # noqa: E402
from jaxsample.dry import dry as _dry_fn  # noqa: E402
from jaxsample.penalties import encoder_repetition_penalty as _encoder_repetition_penalty_fn  # noqa: E402
from jaxsample.penalties import penalties as _penalties_fn  # noqa: E402

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


def _window_param(name: str, default: int, w: int) -> Param:
    return Param(name, default, jnp.int32, lo=-1, hi=None if w < 0 else w)


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
      generated ids; reads only ``repetition_penalty``; ``last_n`` is ignored.

    Params: ``repetition_penalty`` (``> 0``), ``frequency_penalty``, ``presence_penalty``,
    ``penalty_last_n`` (llama scope).
    """
    if scope not in _PENALTY_SCOPES:
        raise ValueError(f"scope must be one of {_PENALTY_SCOPES}, got {scope!r}")
    rep = Param("repetition_penalty", repeat, lo=0.0, lo_open=True)
    freq = Param("frequency_penalty", frequency)
    pres = Param("presence_penalty", presence)
    if scope == "hf":

        def update_hf(x, s, p, info):
            return _penalties_fn(x, _with_prompt(info), repeat=p["repetition_penalty"]), s

        return Stage(name, update_hf, params=(rep,), history=-1)
    if scope == "vllm":

        def update_vllm(x, s, p, info):
            x = _penalties_fn(x, _with_prompt(info), repeat=p["repetition_penalty"])
            out = _generated(info.history, info.position)
            return _penalties_fn(x, out, frequency=p["frequency_penalty"], presence=p["presence_penalty"]), s

        return Stage(name, update_vllm, params=(rep, freq, pres), history=-1)
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

    return Stage(name, update_llama, params=(rep, freq, pres, _window_param("penalty_last_n", w, w)), history=w)


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


def encoder_no_repeat_ngram(n: int, *, name: str = "encoder_no_repeat_ngram") -> Stage:
    """HF ``EncoderNoRepeatNGramLogitsProcessor``: n-grams of ``StepInfo.encoder_ids``, static ``n``."""
    n = _validate.static_int(n, "n", lo=1)

    def update(x, s, p, info):
        if info.encoder_ids is None:
            raise ValueError(f"stage {name!r} needs encoder_ids= in Sampler.init (HF: encoder-decoder models only)")
        return _ngram.encoder_no_repeat_ngram(x, info.encoder_ids, _recent(info, n - 1), n), s

    return Stage(name, update, history=n - 1)


def bad_words(sequences, *, scope: str = "vllm", eos_ids=(), name: str = "bad_words") -> Stage:
    """Bans token sequences: ``scope="vllm"`` matches generated tokens only, ``"hf"`` the whole
    ``input_ids`` with HF's rules (a sequence longer than the context is ignored; single-token
    sequences equal to an ``eos_ids`` entry are dropped)."""
    if scope not in ("vllm", "hf"):
        raise ValueError(f"scope must be 'vllm' or 'hf', got {scope!r}")
    seqs = _ngram._normalise(sequences, "sequences", unique=False)
    longest = max((len(q) for q in seqs), default=1)
    w = longest if scope == "hf" else longest - 1

    def update(x, s, p, info):
        h = _recent(info, w)
        if scope == "vllm":
            h = _generated(h, info.position)
        return _ngram.bad_words(x, h, seqs, eos_ids, skip_longer_than_context=scope == "hf"), s

    return Stage(name, update, history=w)


def sequence_bias(sequences, biases, *, name: str = "sequence_bias") -> Stage:
    """HF ``SequenceBiasLogitsProcessor`` over prompt + generated ids.

    Each sequence ``i`` reads its bias from the per-row param ``f"{name}_{i}"`` (default
    ``biases[i]``), so biases change per row and per call without recompiling.
    """
    seqs = _ngram._normalise(sequences, "sequences")
    biases = tuple(float(b) for b in biases)
    if len(biases) != len(seqs):
        raise ValueError(f"biases needs one value per sequence ({len(seqs)}), got {len(biases)}")
    params = tuple(Param(f"{name}_{i}", b) for i, b in enumerate(biases))
    w = max((len(q) for q in seqs), default=1)

    def update(x, s, p, info):
        b = jnp.stack([p[q.name] for q in params], axis=-1)
        return _ngram.sequence_bias(x, _recent(info, w), seqs, b), s

    return Stage(name, update, params=params, history=w)


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
    breakers = _dry_breakers(sequence_breakers)
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

    return Stage(name, update, params=params, history=w)
# ---------------------------------------------------------------------------------------------------
# truncation filters and adaptive selectors (branch `truncation`)
# ---------------------------------------------------------------------------------------------------
import functools as _functools  # noqa: E402

import jax.numpy as _jnp  # noqa: E402

from jaxsample import cutoffs as _cutoffs  # noqa: E402
from jaxsample import mirostat as _mirostat  # noqa: E402
from jaxsample import truncation as _truncation  # noqa: E402

#: Shared by every filter that keeps a minimum number of tokens (llama.cpp ``min_keep``).
MIN_KEEP = Param("min_keep", 1, _jnp.int32, lo=0)


def top_k(
    default: int = 0, *, exact: bool = False, candidates: int = DEFAULT_CANDIDATES, name: str = "top_k"
) -> Stage:
    """:func:`jaxsample.top_k` reading ``top_k`` (``<= 0`` off); ``exact=True`` is llama.cpp's exactly-k."""
    fn = _functools.partial(_truncation.top_k, exact=exact, candidates=candidates)
    return stateless(name, fn, (Param("top_k", default, _jnp.int32),))


def top_p(default: float = 1.0, *, candidates: int = DEFAULT_CANDIDATES, name: str = "top_p") -> Stage:
    """:func:`jaxsample.top_p` reading ``top_p`` (``>= 1`` off) and ``min_keep``."""
    fn = _functools.partial(_truncation.top_p, candidates=candidates)
    return stateless(name, fn, (Param("top_p", default, lo=0.0), MIN_KEEP))


def min_p(default: float = 0.0, *, name: str = "min_p") -> Stage:
    """:func:`jaxsample.min_p` reading ``min_p`` (``<= 0`` off) and ``min_keep``."""
    return stateless(name, _truncation.min_p, (Param("min_p", default, lo=0.0), MIN_KEEP))


def typical(default: float = 1.0, *, candidates: int = DEFAULT_CANDIDATES, name: str = "typical") -> Stage:
    """:func:`jaxsample.typical` reading ``typical_p`` (``>= 1`` off) and ``min_keep``."""
    fn = _functools.partial(_truncation.typical, candidates=candidates)
    return stateless(name, fn, (Param("typical_p", default, lo=0.0), MIN_KEEP))


def top_n_sigma(default: float = -1.0, *, name: str = "top_n_sigma") -> Stage:
    """:func:`jaxsample.top_n_sigma` reading ``top_n_sigma`` (``<= 0`` off)."""
    return stateless(name, _truncation.top_n_sigma, (Param("top_n_sigma", default),))


def top_h(default: float = 0.0, *, top_n: int = 100, name: str = "top_h") -> Stage:
    """:func:`jaxsample.top_h` reading ``top_h`` (``0`` off, at most 1)."""
    fn = _functools.partial(_truncation.top_h, top_n=top_n)
    return stateless(name, fn, (Param("top_h", default, lo=0.0, hi=1.0),))


def epsilon_cutoff(default: float = 0.0, *, name: str = "epsilon_cutoff") -> Stage:
    """:func:`jaxsample.epsilon_cutoff` reading ``epsilon_cutoff`` (``0`` off) and ``min_keep``."""
    return stateless(name, _cutoffs.epsilon_cutoff, (Param("epsilon_cutoff", default, lo=0.0), MIN_KEEP))


def eta_cutoff(default: float = 0.0, *, name: str = "eta_cutoff") -> Stage:
    """:func:`jaxsample.eta_cutoff` reading ``eta_cutoff`` (``0`` off) and ``min_keep``."""
    return stateless(name, _cutoffs.eta_cutoff, (Param("eta_cutoff", default, lo=0.0), MIN_KEEP))


def p_less(*, name: str = "p_less") -> Stage:
    """:func:`jaxsample.p_less` (no off value: include the stage only when wanted) reading ``min_keep``."""
    return stateless(name, _cutoffs.p_less, (MIN_KEEP,))


def xtc(probability: float = 0.0, threshold: float = 0.1, *, name: str = "xtc") -> Stage:
    """:func:`jaxsample.xtc` reading ``xtc_probability`` (``<= 0`` off), ``xtc_threshold``, ``min_keep``."""
    params = (Param("xtc_probability", probability, lo=0.0), Param("xtc_threshold", threshold), MIN_KEEP)
    return stateless(name, _cutoffs.xtc, params, keyed=True)


def mirostat(
    tau: float = 5.0,
    eta: float = 0.1,
    *,
    m: int = 100,
    n_vocab: int | None = None,
    candidates: int = DEFAULT_CANDIDATES,
    name: str = "mirostat",
) -> Selector:
    """Mirostat v1 selector reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]`` starts at ``2 * tau``."""

    def select(x, mu, p, info):
        return _mirostat.mirostat(
            info.key, x, mu, p["mirostat_tau"], p["mirostat_eta"], m, n_vocab, candidates=candidates
        )

    return Selector(
        name, select, (Param("mirostat_tau", tau), Param("mirostat_eta", eta)),
        init=lambda info: 2.0 * info.params["mirostat_tau"],
    )


def mirostat_v2(
    tau: float = 5.0, eta: float = 0.1, *, candidates: int = DEFAULT_CANDIDATES, name: str = "mirostat_v2"
) -> Selector:
    """Mirostat v2 selector reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]`` starts at ``2 * tau``."""

    def select(x, mu, p, info):
        return _mirostat.mirostat_v2(info.key, x, mu, p["mirostat_tau"], p["mirostat_eta"], candidates=candidates)

    return Selector(
        name, select, (Param("mirostat_tau", tau), Param("mirostat_eta", eta)),
        init=lambda info: 2.0 * info.params["mirostat_tau"],
    )


def adaptive_p(
    target: float = -1.0, decay: float = 0.9, *, candidates: int = DEFAULT_CANDIDATES, name: str = "adaptive_p"
) -> Selector:
    """Adaptive-p selector reading ``adaptive_p_target`` (``< 0`` off: plain ``dist``), ``adaptive_p_decay``.

    State: :class:`jaxsample.mirostat.AdaptivePState` ``[B]``, initialised at the converged EMA.
    """

    def select(x, state, p, info):
        return _mirostat.adaptive_p(
            info.key, x, *state, p["adaptive_p_target"], p["adaptive_p_decay"], candidates=candidates
        )

    def init(info):
        return _mirostat.adaptive_p_init(info.params["adaptive_p_target"], info.params["adaptive_p_decay"])

    params = (Param("adaptive_p_target", target), Param("adaptive_p_decay", decay, lo=0.0, hi=0.99))
    return Selector(name, select, params, init=init)
