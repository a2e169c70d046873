"""Length-dependent processors: minimum length, forced first / last tokens, exponential EOS decay.

``position`` is the number of tokens generated so far (0 when the first new token is sampled), so
HF's ``cur_len - prompt_length`` is ``position`` here; in an encoder-decoder, HF's ``cur_len == 1``
(only the decoder start token) is ``position == 0`` as well. Every argument may differ per row and
is traced: one compiled step serves all values. Each function has its chain stage next to it (the
stages read ``position`` from the step).

Sharding/TPU: rows are independent; shard the batch axis. One scatter of the id list and one
elementwise pass; no batch-level branch.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import NEG_INF, Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage, static
from jaxsample.token_ids import as_ids, id_mask, ids_param, row_mask, static_ids


def _force(x: Array, mask: Array, where: Array) -> Array:
    """Rows where ``where``: 0 at ``mask`` and ``-inf`` elsewhere; other rows unchanged."""
    forced = jnp.where(mask, 0.0, NEG_INF)
    return jnp.where(where[..., None], forced, x)


def _min_tokens(x: Array, position: Array, n: Array, stop: Array) -> Array:
    """The core: ``x [*B, V]`` with the ``stop [*B, V]`` ids banned while ``position < n``."""
    return _math.keep(x, ~(stop & (position < n)[..., None]))


def _forced_bos(x: Array, position: Array, bos: Array) -> Array:
    """The core: at ``position == 0`` only ``bos [*B]`` (clamped to ``[0, V)``) is left, at 0."""
    vocab = x.shape[-1]
    return _force(x, jnp.arange(vocab) == jnp.clip(bos, 0, vocab - 1)[..., None], position == 0)


def _forced_eos(x: Array, position: Array, budget: Array, eos: Array) -> Array:
    """The core: at ``position == budget - 1`` only the ``eos [*B, V]`` ids are left, at 0."""
    return _force(x, eos, (position == budget - 1) & jnp.any(eos, axis=-1))


def _exp_decay(x: Array, position: Array, start: Array, factor: Array, eos: Array) -> Array:
    """The core: ``eos += |eos| * (factor ** (position - start) - 1)`` after ``start`` (NaN factor: off)."""
    f = jnp.nan_to_num(factor, nan=1.0)
    scale = (jnp.power(f, (position - start).astype(jnp.float32)) - 1.0)[..., None]
    hit = eos & (position > start)[..., None] & jnp.isfinite(x)
    return _math.clean(jnp.where(hit, x + jnp.abs(x) * scale, x))


def min_tokens(
    logits: Float["*B V"], position: Int["*B"] | int, min_tokens: Int["*B"] | int, stop_ids: Int["*B n"] | ArrayLike
) -> Float["*B V"]:
    """Bans every stop id while ``position < min_tokens``.

    vLLM ``min_tokens`` (all stop ids: ``stop_token_ids`` and the EOS ids) and HF
    ``MinNewTokensLengthLogitsProcessor`` (EOS ids). HF ``MinLengthLogitsProcessor`` counts the
    prompt too: pass ``min_length - prompt_length`` per row.

    Args:
      logits: ``[..., V]``.
      position: tokens generated so far, scalar or ``[...]``.
      min_tokens: minimum number of generated tokens (``>= 0``), scalar or ``[...]``.
      stop_ids: ``int[..., n]`` stop / EOS ids, ``< 0`` = padding.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> min_tokens(jnp.zeros(4), position=1, min_tokens=2, stop_ids=[3, 0]).tolist()
    [-inf, 0.0, 0.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    pos = _validate.param(position, batch, "position", dtype=jnp.int32, lo=0)
    n = _validate.param(min_tokens, batch, "min_tokens", dtype=jnp.int32, lo=0)
    return _math.restore(_min_tokens(x, pos, n, id_mask(as_ids(stop_ids, batch, vocab, "stop_ids"), vocab)), dtype)


def forced_bos(logits: Float["*B V"], position: Int["*B"] | int, bos_id: ArrayLike) -> Float["*B V"]:
    """HF ``ForcedBOSTokenLogitsProcessor``: at ``position == 0`` every logit is ``-inf`` except ``bos_id`` -> 0.

    Args:
      logits: ``[..., V]``.
      position: tokens generated so far, scalar or ``[...]``.
      bos_id: the forced token, scalar or ``[...]`` in ``[0, V)`` (clamped under ``jit``).

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> forced_bos(jnp.ones(3), position=0, bos_id=1).tolist()
    [-inf, 0.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    pos = _validate.param(position, batch, "position", dtype=jnp.int32, lo=0)
    bos = _validate.param(bos_id, batch, "bos_id", dtype=jnp.int32, lo=0, hi=vocab - 1)
    return _math.restore(_forced_bos(x, pos, bos), dtype)


def forced_eos(
    logits: Float["*B V"], position: Int["*B"] | int, max_new_tokens: Int["*B"] | int, eos_ids: Int["*B n"] | ArrayLike
) -> Float["*B V"]:
    """HF ``ForcedEOSTokenLogitsProcessor``: at the last step every logit is ``-inf``, the EOS ids 0.

    The last step is ``position == max_new_tokens - 1`` (HF: ``cur_len == max_length - 1``). Rows
    whose EOS list is empty are left unchanged.

    Args:
      logits: ``[..., V]``.
      position: tokens generated so far, scalar or ``[...]``.
      max_new_tokens: generation budget (``>= 1``), scalar or ``[...]``.
      eos_ids: ``int[..., n]`` EOS ids, ``< 0`` = padding.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> forced_eos(jnp.ones(3), position=4, max_new_tokens=5, eos_ids=[2]).tolist()
    [-inf, -inf, 0.0]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    pos = _validate.param(position, batch, "position", dtype=jnp.int32, lo=0)
    budget = _validate.param(max_new_tokens, batch, "max_new_tokens", dtype=jnp.int32, lo=1)
    return _math.restore(_forced_eos(x, pos, budget, id_mask(as_ids(eos_ids, batch, vocab, "eos_ids"), vocab)), dtype)


def exponential_decay_length_penalty(
    logits: Float["*B V"], position: Int["*B"] | int, start: ArrayLike, factor: ArrayLike, eos_ids: ArrayLike
) -> Float["*B V"]:
    """HF ``ExponentialDecayLengthPenalty``: raises the EOS logits exponentially after ``start`` tokens.

    Where ``position > start``: ``eos += |eos| * (factor ** (position - start) - 1)`` (HF's
    ``regulation_start = start + prompt_length`` and ``cur_len`` give the same ``position - start``).
    A removed (``-inf``) EOS stays removed; repeated EOS ids are penalised once.

    Args:
      logits: ``[..., V]``.
      position: tokens generated so far, scalar or ``[...]``.
      start: number of generated tokens after which the penalty starts, scalar or ``[...]``.
      factor: decay factor (``> 1`` makes EOS more likely as the text grows), scalar or ``[...]``.
      eos_ids: ``int[..., n]`` EOS ids, ``< 0`` = padding.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> exponential_decay_length_penalty(jnp.array([1.0, -2.0]), 3, 1, 2.0, [1]).tolist()
    [1.0, 4.0]
    """
    x, dtype = _math.prepare(logits)
    batch, vocab = x.shape[:-1], x.shape[-1]
    pos = _validate.param(position, batch, "position", dtype=jnp.int32, lo=0)
    begin = _validate.param(start, batch, "start", dtype=jnp.int32)
    f = _validate.param(factor, batch, "factor")
    eos = id_mask(as_ids(eos_ids, batch, vocab, "eos_ids"), vocab)
    return _math.restore(_exp_decay(x, pos, begin, f, eos), dtype)


# ----------------------------------------------------------------------------------------- stages
@dataclasses.dataclass(frozen=True)
class MinTokens(Stage):
    """:func:`min_tokens` reading ``min_tokens`` (per row); stop ids = static ``stop_ids`` (e.g. the
    model's EOS ids) plus per-row ``f"{name}_ids"`` (vLLM ``stop_token_ids``)."""

    default: int = dataclasses.field(default=0, compare=False)
    stop_ids: tuple[int, ...] = static(static_ids, ())
    _: dataclasses.KW_ONLY
    capacity: int = 0
    name: str = "min_tokens"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("min_tokens", self.default, jnp.int32, lo=0),) + ids_param(self.name, self.capacity)

    def update(self, x, state, params, info):
        return _min_tokens(x, info.position, params["min_tokens"], row_mask(params, self.name, self.stop_ids, x)), state


@dataclasses.dataclass(frozen=True)
class ForcedBos(Stage):
    """:func:`forced_bos` at the first generated position, reading ``bos_id`` (per row)."""

    bos_id: int = dataclasses.field(compare=False)
    _: dataclasses.KW_ONLY
    name: str = "forced_bos"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("bos_id", self.bos_id, jnp.int32, lo=0),)

    def update(self, x, state, params, info):
        return _forced_bos(x, info.position, params["bos_id"]), state


@dataclasses.dataclass(frozen=True)
class ForcedEos(Stage):
    """:func:`forced_eos` reading ``max_new_tokens`` (per row); EOS ids static + per row."""

    max_new_tokens: int = dataclasses.field(compare=False)
    eos_ids: tuple[int, ...] = static(static_ids, ())
    _: dataclasses.KW_ONLY
    capacity: int = 0
    name: str = "forced_eos"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("max_new_tokens", self.max_new_tokens, jnp.int32, lo=1),) + ids_param(self.name, self.capacity)

    def update(self, x, state, params, info):
        eos = row_mask(params, self.name, self.eos_ids, x)
        return _forced_eos(x, info.position, params["max_new_tokens"], eos), state


@dataclasses.dataclass(frozen=True)
class ExponentialDecayLengthPenalty(Stage):
    """:func:`exponential_decay_length_penalty` reading ``exp_decay_start`` and ``exp_decay_factor``
    (per row); EOS ids static + per row."""

    start: int = dataclasses.field(compare=False)
    factor: float = dataclasses.field(compare=False)
    eos_ids: tuple[int, ...] = static(static_ids, ())
    _: dataclasses.KW_ONLY
    capacity: int = 0
    name: str = "exponential_decay_length_penalty"

    @property
    def params(self) -> tuple[Param, ...]:
        decay = (Param("exp_decay_start", self.start, jnp.int32), Param("exp_decay_factor", self.factor))
        return decay + ids_param(self.name, self.capacity)

    def update(self, x, state, params, info):
        eos = row_mask(params, self.name, self.eos_ids, x)
        return _exp_decay(x, info.position, params["exp_decay_start"], params["exp_decay_factor"], eos), state
