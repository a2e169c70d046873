"""Per-token constraints: additive logit bias, whitelists, suppression, ``ignore_eos``.

These are constraints, not truncation filters: a ban may leave a row with no finite logit when
every remaining token is banned (as upstream), and callers can detect such rows. Each function has
its chain stage next to it; stages combine static ids with per-row id lists
(:mod:`jaxsample.token_ids`), so new ids never recompile.

Sharding/TPU: rows are independent; shard the batch axis. Each is one scatter of the id list into
``[*B, V]`` and one elementwise pass; no batch-level branch.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage, static
from jaxsample.token_ids import as_ids, id_mask, ids_param, row_ids, row_mask, static_ids


def _ban(x: Array, banned: Array) -> Array:
    """``x [*B, V]`` with ``-inf`` where ``banned``."""
    return _math.keep(x, ~banned)


def _allow(x: Array, allowed: Array) -> Array:
    """``x [*B, V]`` restricted to ``allowed``; rows that allow nothing have no whitelist."""
    return _math.keep(x, allowed | ~jnp.any(allowed, axis=-1, keepdims=True))


def _logit_bias(x: Array, bias: Array | None, ids: Array | None, values: Array | None, clamp: Array | None) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``: a dense ``bias`` and/or ``values`` at ``ids [*B, n]``."""
    c = None if clamp is None else jnp.maximum(clamp, 0.0)[..., None]
    total = jnp.zeros_like(x)
    if bias is not None:
        total = total + (bias if c is None else jnp.clip(bias, -c, c))
    if ids is not None:
        dense = jnp.zeros(ids.shape[:-1] + (x.shape[-1],), jnp.float32)
        total = total + _math.scatter(dense, ids, values if c is None else jnp.clip(values, -c, c))
    return _math.clean(x + total)


def logit_bias(
    logits: Float["*B V"],
    bias: ArrayLike | None = None,
    *,
    ids: ArrayLike | None = None,
    values: ArrayLike | None = None,
    clamp: ArrayLike | None = None,
) -> Float["*B V"]:
    """Adds a per-token bias: llama.cpp ``logit_bias``, vLLM ``logit_bias``, HF single-token ``sequence_bias``.

    The bias is given densely (``bias``), sparsely (``ids`` + ``values``), or both (summed).
    A ``-inf`` bias bans a token. Removed tokens stay removed, and any ``inf - inf`` (a ``+inf`` bias
    meeting a ``-inf``) counts as a ban.

    Args:
      logits: ``[..., V]`` float32 or bfloat16.
      bias: dense ``[..., V]`` bias broadcastable to ``logits``.
      ids: ``int[..., n]`` token ids (one list for all rows or one per row); ``< 0`` is padding.
        Repeated ids add up. A fixed capacity ``n`` with ``-1`` padding never recompiles.
      values: ``[..., n]`` biases broadcastable to ``ids`` (a scalar biases every listed id).
      clamp: optional bound ``c >= 0`` (scalar or per row): every given bias entry is clipped to
        ``[-c, c]`` first, as vLLM's OpenAI-compatible API does with ``c = 100`` (there ``-inf``
        becomes ``-100``, not a ban).

    Returns:
      ``[..., V]`` biased logits in the input dtype.

    Raises:
      ValueError: if neither form is given, ``ids`` comes without ``values``, a concrete id is
        ``>= V``, a concrete bias is NaN, ``clamp < 0``, or a shape does not broadcast.

    >>> import jax.numpy as jnp
    >>> logit_bias(jnp.zeros(4), ids=[1, 3, 1], values=[0.5, -jnp.inf, 1.0]).tolist()
    [0.0, 1.5, 0.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    if bias is None and ids is None:
        raise ValueError("logit_bias needs a dense `bias` or sparse `ids` and `values`")
    if (ids is None) != (values is None):
        raise ValueError("logit_bias: `ids` and `values` must be given together")
    c = None if clamp is None else _validate.param(clamp, batch, "clamp", lo=0.0)
    b = idx = v = None
    if bias is not None:
        _validate.check_range(bias, "bias")
        b = jnp.asarray(bias, jnp.float32)
        _validate.check_broadcast(b.shape, x.shape, "bias", onto="the logits shape", hint="")
    if ids is not None:
        idx = as_ids(ids, batch, vocab, "ids")
        _validate.check_range(values, "values")
        v = jnp.asarray(values, jnp.float32)
        _validate.check_broadcast(v.shape, idx.shape, "values", onto="the ids shape", hint="")
        v = jnp.broadcast_to(v, idx.shape)
    return _math.restore(_logit_bias(x, b, idx, v, c), dtype)


def allowed_tokens(
    logits: Float["*B V"], ids: Int["*B n"] | ArrayLike | None = None, *, mask: ArrayLike | None = None
) -> Float["*B V"]:
    """Whitelist (vLLM ``allowed_token_ids``): every token outside the allowed set becomes ``-inf``.

    A row whose allowed set is empty (all padding, or an all-False mask) is left unchanged: it has
    no whitelist (vLLM rejects empty lists).

    Args:
      logits: ``[..., V]``.
      ids: ``int[..., n]`` allowed ids, ``< 0`` = padding (give ``ids`` or ``mask``).
      mask: ``bool[..., V]`` allowed tokens, broadcastable to ``logits``.

    Returns:
      ``[..., V]`` logits in the input dtype; allowed tokens keep their values.

    >>> import jax.numpy as jnp
    >>> allowed_tokens(jnp.arange(4.0), [2, 0, -1]).tolist()
    [0.0, -inf, 2.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    if (ids is None) == (mask is None):
        raise ValueError("allowed_tokens needs exactly one of `ids` or `mask`")
    if ids is not None:
        allowed = id_mask(as_ids(ids, batch, vocab, "ids"), vocab)
    else:
        allowed = jnp.asarray(mask)
        if allowed.dtype != jnp.bool_:
            raise ValueError(f"mask must be a boolean array, got dtype {allowed.dtype}")
        _validate.check_broadcast(allowed.shape, x.shape, "mask", onto="the logits shape", hint="")
        allowed = jnp.broadcast_to(allowed, x.shape)
    return _math.restore(_allow(x, allowed), dtype)


def suppress_tokens(logits: Float["*B V"], ids: ArrayLike) -> Float["*B V"]:
    """HF ``SuppressTokensLogitsProcessor``: the listed tokens become ``-inf``.

    Args:
      logits: ``[..., V]``.
      ids: ``int[..., n]`` token ids, ``< 0`` = padding.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> suppress_tokens(jnp.zeros(3), [2]).tolist()
    [0.0, 0.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    banned = id_mask(as_ids(ids, x.shape[:-1], x.shape[-1], "ids"), x.shape[-1])
    return _math.restore(_ban(x, banned), dtype)


def suppress_tokens_at_begin(
    logits: Float["*B V"], ids: ArrayLike, position: Int["*B"] | int, begin_index: ArrayLike = 0
) -> Float["*B V"]:
    """HF ``SuppressTokensAtBeginLogitsProcessor``: ban ``ids`` at the step ``position == begin_index``.

    ``position`` counts generated tokens (0 at the first sampled token), so HF's
    ``begin_index = prompt_length`` is ``begin_index=0`` here, and HF's ``prompt_length + 1`` (forced
    BOS with a one-token decoder prompt) is ``1``.

    Args:
      logits: ``[..., V]``.
      ids: ``int[..., n]`` token ids, ``< 0`` = padding.
      position: tokens generated so far, scalar or ``[...]``.
      begin_index: the step at which to suppress, scalar or ``[...]``.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> suppress_tokens_at_begin(jnp.zeros(3), [0], position=0).tolist()
    [-inf, 0.0, 0.0]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    pos = _validate.param(position, batch, "position", dtype=jnp.int32, lo=0)
    begin = _validate.param(begin_index, batch, "begin_index", dtype=jnp.int32, lo=0)
    banned = id_mask(as_ids(ids, batch, x.shape[-1], "ids"), x.shape[-1]) & (pos == begin)[..., None]
    return _math.restore(_ban(x, banned), dtype)


def ignore_eos(logits: Float["*B V"], eos_ids: ArrayLike, ignore: ArrayLike = True) -> Float["*B V"]:
    """llama.cpp ``ignore_eos``: a ``-inf`` bias on every end-of-generation id in rows where ``ignore``.

    (vLLM's ``ignore_eos`` only disables stopping and leaves EOS sampleable; that is a decoding-loop
    option, not a logits transform.)

    Args:
      logits: ``[..., V]``.
      eos_ids: ``int[..., n]`` end-of-generation ids, ``< 0`` = padding.
      ignore: bool or 0/1, scalar or ``[...]`` per row.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> ignore_eos(jnp.zeros((2, 3)), [2], jnp.array([True, False])).tolist()
    [[0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    if ignore is not None and not isinstance(ignore, str) and jnp.result_type(ignore) == jnp.bool_:
        ignore = jnp.asarray(ignore).astype(jnp.int32)  # bool flags are 0/1 (strings, None: named error)
    on = _validate.param(ignore, batch, "ignore", dtype=jnp.int32, lo=0, hi=1)
    banned = id_mask(as_ids(eos_ids, batch, x.shape[-1], "eos_ids"), x.shape[-1]) & (on > 0)[..., None]
    return _math.restore(_ban(x, banned), dtype)


# ----------------------------------------------------------------------------------------- stages
@dataclasses.dataclass(frozen=True)
class LogitBias(Stage):
    """:func:`logit_bias` with static ``ids``/``values`` plus per-row sparse lists.

    ``capacity > 0`` declares ``f"{name}_ids"`` and ``f"{name}_values"`` (``[B, capacity]``);
    ``vocab_size`` declares a dense per-row bias ``f"{name}_dense"`` (``[B, V]``, default 0).
    ``clamp`` (e.g. 100 as vLLM's API) clips every bias to ``[-clamp, clamp]``.
    """

    ids: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    _: dataclasses.KW_ONLY
    capacity: int = 0
    vocab_size: int | None = None
    clamp: float | None = None
    name: str = "logit_bias"

    def __post_init__(self):
        ids = static_ids(self.ids, "ids")
        object.__setattr__(self, "ids", ids)
        values = np.broadcast_to(np.asarray(self.values, np.float64), (len(ids),))
        object.__setattr__(self, "values", tuple(float(v) for v in values))
        super().__post_init__()

    @property
    def params(self) -> tuple[Param, ...]:
        params = ids_param(self.name, self.capacity)
        if self.capacity:
            params += (Param(f"{self.name}_values", 0.0, capacity=self.capacity),)
        if self.vocab_size is not None:
            params += (Param(f"{self.name}_dense", 0.0, capacity=self.vocab_size),)
        return params

    def update(self, x, state, params, info):
        batch = x.shape[:-1]
        vals = [jnp.broadcast_to(jnp.asarray(self.values, jnp.float32), batch + (len(self.ids),))]
        if self.capacity:
            vals.append(params[f"{self.name}_values"])
        dense = params[f"{self.name}_dense"] if self.vocab_size is not None else None
        clamp = None if self.clamp is None else jnp.full(batch, self.clamp, jnp.float32)
        ids = row_ids(params, self.name, self.ids, batch)
        return _logit_bias(x, dense, ids, jnp.concatenate(vals, axis=-1), clamp), state


@dataclasses.dataclass(frozen=True)
class _IdList(Stage):
    """A stage over static ``ids`` plus per-row ids (``capacity > 0``: ``f"{name}_ids"``)."""

    ids: tuple[int, ...] = static(static_ids, ())
    _: dataclasses.KW_ONLY
    capacity: int = 0

    @property
    def params(self) -> tuple[Param, ...]:
        return ids_param(self.name, self.capacity)


@dataclasses.dataclass(frozen=True)
class AllowedTokens(_IdList):
    """:func:`allowed_tokens` over static ``ids`` plus per-row ids; rows whose whitelist is empty are unchanged."""

    _: dataclasses.KW_ONLY
    name: str = "allowed_tokens"

    def update(self, x, state, params, info):
        return _allow(x, row_mask(params, self.name, self.ids, x)), state


@dataclasses.dataclass(frozen=True)
class SuppressTokens(_IdList):
    """:func:`suppress_tokens` over static ``ids`` plus per-row ids."""

    _: dataclasses.KW_ONLY
    name: str = "suppress_tokens"

    def update(self, x, state, params, info):
        return _ban(x, row_mask(params, self.name, self.ids, x)), state


@dataclasses.dataclass(frozen=True)
class SuppressTokensAtBegin(Stage):
    """:func:`suppress_tokens_at_begin` reading ``begin_index`` (per row) and the stage's ids."""

    ids: tuple[int, ...] = static(static_ids, ())
    begin_index: int = dataclasses.field(default=0, compare=False)
    _: dataclasses.KW_ONLY
    capacity: int = 0
    name: str = "suppress_tokens_at_begin"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("begin_index", self.begin_index, jnp.int32, lo=0),) + ids_param(self.name, self.capacity)

    def update(self, x, state, params, info):
        at = (info.position == params["begin_index"])[..., None]
        return _ban(x, row_mask(params, self.name, self.ids, x) & at), state


@dataclasses.dataclass(frozen=True)
class IgnoreEos(Stage):
    """llama.cpp ``ignore_eos`` (:func:`ignore_eos`), switched per row by ``ignore_eos`` (0 / 1)."""

    eos_ids: tuple[int, ...] = static(static_ids, ())
    default: bool = dataclasses.field(default=False, compare=False)
    _: dataclasses.KW_ONLY
    capacity: int = 0
    name: str = "ignore_eos"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("ignore_eos", int(self.default), jnp.int32, lo=0, hi=1),) + ids_param(self.name, self.capacity)

    def update(self, x, state, params, info):
        return _ban(x, row_mask(params, self.name, self.eos_ids, x) & (params["ignore_eos"] > 0)[..., None]), state
