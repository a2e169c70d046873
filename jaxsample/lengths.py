"""Length-dependent processors: minimum length, forced first / last tokens, exponential EOS decay.

``position`` is the number of tokens generated so far (0 when the first new token is sampled), so
HF's ``cur_len - prompt_length`` is ``position`` here; in an encoder-decoder, HF's ``cur_len == 1``
(only the decoder start token) is ``position == 0`` as well. Every argument may differ per row and
is traced: one compiled step serves all values.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import NEG_INF, Array, ArrayLike
from jaxsample.processors import _as_ids, _mask


def _force(x: Array, mask: Array, where: Array) -> Array:
    """Rows where ``where``: 0 at ``mask`` and ``-inf`` elsewhere; other rows unchanged."""
    forced = jnp.where(mask, 0.0, NEG_INF)
    return jnp.where(where[..., None], forced, x)


def min_tokens(logits: ArrayLike, position: ArrayLike, min_tokens: ArrayLike, stop_ids: ArrayLike) -> Array:
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
    banned = _mask(_as_ids(stop_ids, batch, vocab, "stop_ids"), vocab) & (pos < n)[..., None]
    return _math.restore(_math.keep(x, ~banned), dtype)


def forced_bos(logits: ArrayLike, position: ArrayLike, bos_id: ArrayLike) -> Array:
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
    bos = jnp.clip(_validate.param(bos_id, batch, "bos_id", dtype=jnp.int32, lo=0, hi=vocab - 1), 0, vocab - 1)
    return _math.restore(_force(x, jnp.arange(vocab) == bos[..., None], pos == 0), dtype)


def forced_eos(logits: ArrayLike, position: ArrayLike, max_new_tokens: ArrayLike, eos_ids: ArrayLike) -> Array:
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
    eos = _mask(_as_ids(eos_ids, batch, vocab, "eos_ids"), vocab)
    last = (pos == budget - 1) & jnp.any(eos, axis=-1)
    return _math.restore(_force(x, eos, last), dtype)


def exponential_decay_length_penalty(
    logits: ArrayLike, position: ArrayLike, start: ArrayLike, factor: ArrayLike, eos_ids: ArrayLike
) -> Array:
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
    f = jnp.nan_to_num(_validate.param(factor, batch, "factor"), nan=1.0)  # traced NaN: off
    eos = _mask(_as_ids(eos_ids, batch, vocab, "eos_ids"), vocab)
    steps = (pos - begin).astype(jnp.float32)
    scale = (jnp.power(f, steps) - 1.0)[..., None]
    hit = eos & (pos > begin)[..., None] & jnp.isfinite(x)
    return _math.restore(_math.clean(jnp.where(hit, x + jnp.abs(x) * scale, x)), dtype)
