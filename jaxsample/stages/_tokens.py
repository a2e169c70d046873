"""Stages for token constraints, length processors and llama.cpp infill.

Token-id lists: a stage combines the static ids given to its factory (model-level, e.g. the EOS
ids) with optional per-row ids. With ``capacity > 0`` the stage declares the list parameter
``f"{name}_ids"`` (``int32[B, capacity]``, ``-1`` padding; ``Sampler.params`` takes ragged lists),
so changing the ids never recompiles.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxsample.bias import allowed_tokens as _allowed_tokens
from jaxsample.bias import ignore_eos as _ignore_eos
from jaxsample.bias import logit_bias as _logit_bias
from jaxsample.bias import suppress_tokens as _suppress_tokens
from jaxsample.bias import suppress_tokens_at_begin as _suppress_tokens_at_begin
from jaxsample.chain import Param, Stage, cached, stateless
from jaxsample.infill import InfillTable
from jaxsample.infill import infill as _infill
from jaxsample.lengths import exponential_decay_length_penalty as _exp_decay
from jaxsample.lengths import forced_bos as _forced_bos
from jaxsample.lengths import forced_eos as _forced_eos
from jaxsample.lengths import min_tokens as _min_tokens
from jaxsample.processors import log_softmax as _log_softmax
from jaxsample.processors import remove_inf_nan as _remove_inf_nan


def _static_ids(ids, name: str) -> tuple[int, ...]:
    ids = tuple(int(i) for i in np.asarray(ids, np.int64).reshape(-1))
    if any(i < 0 for i in ids):
        raise ValueError(f"{name} must be non-negative token ids, got {ids}")
    return ids


def _ids_param(name: str, capacity: int) -> tuple[Param, ...]:
    """The per-row id list parameter of a stage (none when ``capacity == 0``)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    return (Param(f"{name}_ids", -1, jnp.int32, lo=0, capacity=capacity),) if capacity else ()


def _row_ids(p, name: str, static: tuple[int, ...], batch_shape: tuple[int, ...]):
    """The stage's static ids followed by its per-row ids (if declared): ``int32[B, n]``."""
    parts = [jnp.broadcast_to(jnp.asarray(static, jnp.int32).reshape(-1), batch_shape + (len(static),))]
    if f"{name}_ids" in p:
        parts.append(jnp.asarray(p[f"{name}_ids"], jnp.int32))
    return jnp.concatenate(parts, axis=-1)


@cached
def logit_bias(
    ids=(), values=(), *, capacity: int = 0, vocab_size: int | None = None, clamp: float | None = None,
    name: str = "logit_bias",
) -> Stage:
    """:func:`jaxsample.logit_bias` with static ``ids``/``values`` plus per-row sparse lists.

    ``capacity > 0`` declares ``f"{name}_ids"`` and ``f"{name}_values"`` (``[B, capacity]``);
    ``vocab_size`` declares a dense per-row bias ``f"{name}_dense"`` (``[B, V]``, default 0).
    ``clamp`` (e.g. 100 as vLLM's API) clips every bias to ``[-clamp, clamp]``.
    """
    static = _static_ids(ids, "ids")
    static_values = tuple(float(v) for v in np.broadcast_to(np.asarray(values, np.float64), (len(static),)))
    params = _ids_param(name, capacity)
    if capacity:
        params += (Param(f"{name}_values", 0.0, capacity=capacity),)
    if vocab_size is not None:
        params += (Param(f"{name}_dense", 0.0, capacity=vocab_size),)

    def update(x, s, p, info):
        batch = x.shape[:-1]
        idx = _row_ids(p, name, static, batch)
        vals = [jnp.broadcast_to(jnp.asarray(static_values, jnp.float32), batch + (len(static),))]
        if capacity:
            vals.append(p[f"{name}_values"])
        dense = p[f"{name}_dense"] if vocab_size is not None else None
        return _logit_bias(x, dense, ids=idx, values=jnp.concatenate(vals, axis=-1), clamp=clamp), s

    return Stage(name=name, update=update, params=params)


@cached
def allowed_tokens(ids=(), *, capacity: int = 0, name: str = "allowed_tokens") -> Stage:
    """:func:`jaxsample.allowed_tokens` over static ``ids`` plus per-row ids (``capacity > 0``).

    Rows whose whitelist is empty are left unchanged (no restriction).
    """
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        return _allowed_tokens(x, _row_ids(p, name, static, x.shape[:-1])), s

    return Stage(name=name, update=update, params=_ids_param(name, capacity))


@cached
def suppress_tokens(ids=(), *, capacity: int = 0, name: str = "suppress_tokens") -> Stage:
    """:func:`jaxsample.suppress_tokens` over static ``ids`` plus per-row ids (``capacity > 0``)."""
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        return _suppress_tokens(x, _row_ids(p, name, static, x.shape[:-1])), s

    return Stage(name=name, update=update, params=_ids_param(name, capacity))


@cached
def suppress_tokens_at_begin(
    ids=(), begin_index: int = 0, *, capacity: int = 0, name: str = "suppress_tokens_at_begin"
) -> Stage:
    """:func:`jaxsample.suppress_tokens_at_begin` reading ``begin_index`` (per row) and the stage's ids."""
    static = _static_ids(ids, "ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _suppress_tokens_at_begin(x, idx, info.position, p["begin_index"]), s

    params = (Param("begin_index", begin_index, jnp.int32, lo=0),) + _ids_param(name, capacity)
    return Stage(name=name, update=update, params=params)


@cached
def min_tokens(default: int = 0, stop_ids=(), *, capacity: int = 0, name: str = "min_tokens") -> Stage:
    """:func:`jaxsample.min_tokens` reading ``min_tokens`` (per row); stop ids = static ``stop_ids``
    (e.g. the model's EOS ids) plus per-row ``f"{name}_ids"`` (vLLM ``stop_token_ids``)."""
    static = _static_ids(stop_ids, "stop_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _min_tokens(x, info.position, p["min_tokens"], idx), s

    params = (Param("min_tokens", default, jnp.int32, lo=0),) + _ids_param(name, capacity)
    return Stage(name=name, update=update, params=params)


@cached
def forced_bos(bos_id: int, *, name: str = "forced_bos") -> Stage:
    """:func:`jaxsample.forced_bos` at the first generated position, reading ``bos_id`` (per row)."""

    def update(x, s, p, info):
        return _forced_bos(x, info.position, p["bos_id"]), s

    return Stage(name=name, update=update, params=(Param("bos_id", bos_id, jnp.int32, lo=0),))


@cached
def forced_eos(max_new_tokens: int, eos_ids=(), *, capacity: int = 0, name: str = "forced_eos") -> Stage:
    """:func:`jaxsample.forced_eos` reading ``max_new_tokens`` (per row); EOS ids static + per row."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _forced_eos(x, info.position, p["max_new_tokens"], idx), s

    params = (Param("max_new_tokens", max_new_tokens, jnp.int32, lo=1),) + _ids_param(name, capacity)
    return Stage(name=name, update=update, params=params)


@cached
def exponential_decay_length_penalty(
    start: int, factor: float, eos_ids=(), *, capacity: int = 0, name: str = "exponential_decay_length_penalty"
) -> Stage:
    """:func:`jaxsample.exponential_decay_length_penalty` reading ``exp_decay_start`` and
    ``exp_decay_factor`` (per row); EOS ids static + per row."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        idx = _row_ids(p, name, static, x.shape[:-1])
        return _exp_decay(x, info.position, p["exp_decay_start"], p["exp_decay_factor"], idx), s

    params = (Param("exp_decay_start", start, jnp.int32), Param("exp_decay_factor", factor))
    return Stage(name=name, update=update, params=params + _ids_param(name, capacity))


@cached
def ignore_eos(eos_ids=(), default: bool = False, *, capacity: int = 0, name: str = "ignore_eos") -> Stage:
    """llama.cpp ``ignore_eos`` (:func:`jaxsample.ignore_eos`), switched per row by ``ignore_eos`` (0 / 1)."""
    static = _static_ids(eos_ids, "eos_ids")

    def update(x, s, p, info):
        return _ignore_eos(x, _row_ids(p, name, static, x.shape[:-1]), p["ignore_eos"]), s

    params = (Param("ignore_eos", int(default), jnp.int32, lo=0, hi=1),) + _ids_param(name, capacity)
    return Stage(name=name, update=update, params=params)


@cached
def remove_inf_nan(*, name: str = "remove_inf_nan") -> Stage:
    """HF ``InfNanRemoveLogitsProcessor`` (:func:`jaxsample.remove_inf_nan`)."""
    return stateless(name, _remove_inf_nan, ())


@cached
def log_softmax(*, name: str = "log_softmax") -> Stage:
    """HF ``LogitNormalization`` (:func:`jaxsample.log_softmax`)."""
    return stateless(name, _log_softmax, ())


def infill(table: InfillTable, *, name: str = "infill") -> Stage:
    """llama.cpp ``infill`` (:func:`jaxsample.infill`) with a vocabulary table fixed at build time."""
    return stateless(name, lambda x: _infill(x, table), ())
