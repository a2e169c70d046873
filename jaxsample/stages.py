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
