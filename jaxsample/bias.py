"""Per-token constraints: additive logit bias, whitelists, suppression, ``ignore_eos``.

These are constraints, not truncation filters: a ban may leave a row with no finite logit when
every remaining token is banned (as upstream), and callers can detect such rows.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.processors import _as_ids, _check_broadcast, _mask


def logit_bias(
    logits: ArrayLike,
    bias: ArrayLike | None = None,
    *,
    ids: ArrayLike | None = None,
    values: ArrayLike | None = None,
    clamp: ArrayLike | None = None,
) -> Array:
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
    c = None
    if clamp is not None:
        c = jnp.maximum(_validate.param(clamp, batch, "clamp", lo=0.0), 0.0)[..., None]
    total = jnp.zeros_like(x)
    if bias is not None:
        _validate.check_range(bias, "bias")
        b = jnp.asarray(bias, jnp.float32)
        _check_broadcast(b.shape, x.shape, "bias", "logits")
        total = total + (b if c is None else jnp.clip(b, -c, c))
    if ids is not None:
        idx = _as_ids(ids, batch, vocab, "ids")
        _validate.check_range(values, "values")
        v = jnp.asarray(values, jnp.float32)
        _check_broadcast(v.shape, idx.shape, "values", "ids")
        v = jnp.broadcast_to(v, idx.shape)
        dense = jnp.zeros(idx.shape[:-1] + (vocab,), jnp.float32)
        total = total + _math.scatter(dense, idx, v if c is None else jnp.clip(v, -c, c))
    out = x + total
    return _math.restore(_math.clean(out), dtype)


def allowed_tokens(logits: ArrayLike, ids: ArrayLike | None = None, *, mask: ArrayLike | None = None) -> Array:
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
        allowed = _mask(_as_ids(ids, batch, vocab, "ids"), vocab)
    else:
        allowed = jnp.asarray(mask)
        if allowed.dtype != jnp.bool_:
            raise ValueError(f"mask must be a boolean array, got dtype {allowed.dtype}")
        _check_broadcast(allowed.shape, x.shape, "mask", "logits")
        allowed = jnp.broadcast_to(allowed, x.shape)
    allowed = allowed | ~jnp.any(allowed, axis=-1, keepdims=True)
    return _math.restore(_math.keep(x, allowed), dtype)


def suppress_tokens(logits: ArrayLike, ids: ArrayLike) -> Array:
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
    banned = _mask(_as_ids(ids, x.shape[:-1], x.shape[-1], "ids"), x.shape[-1])
    return _math.restore(_math.keep(x, ~banned), dtype)


def suppress_tokens_at_begin(
    logits: ArrayLike, ids: ArrayLike, position: ArrayLike, begin_index: ArrayLike = 0
) -> Array:
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
    banned = _mask(_as_ids(ids, batch, x.shape[-1], "ids"), x.shape[-1]) & (pos == begin)[..., None]
    return _math.restore(_math.keep(x, ~banned), dtype)


def ignore_eos(logits: ArrayLike, eos_ids: ArrayLike, ignore: ArrayLike = True) -> Array:
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
    banned = _mask(_as_ids(eos_ids, batch, x.shape[-1], "eos_ids"), x.shape[-1]) & (on > 0)[..., None]
    return _math.restore(_math.keep(x, ~banned), dtype)
