"""Log-probabilities returned with sampled tokens, with vLLM's semantics.

vLLM reports, per generated token, the sampled token's value, its rank and the top-``n``
alternatives, taken from one of four sources (``logprobs_mode``):

* ``raw_logprobs`` (default): ``log_softmax`` of the model's float32 logits, before any processing;
* ``raw_logits``: those logits themselves;
* ``processed_logprobs``: ``log_softmax`` of the logits after the sampler chain (penalties, bias,
  temperature, truncation);
* ``processed_logits``: the processed logits themselves.

A decode loop calls :func:`step_logprobs` once per step with the raw logits, the processed logits
(:meth:`jaxsample.Sampler.sample` returns them) and the sampled tokens: one pass for the
normaliser, one ``lax.top_k`` and one comparison pass, no sort, ``n`` and ``mode`` static.

Sharding/TPU: rows are independent; shard the batch axis. One log-softmax and one ``lax.top_k``
of ``n`` entries over a whole vocabulary row.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
MODES: tuple[str, ...] = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


class TopLogprobs(NamedTuple):
    """Per-token log-probability report (vLLM ``LogprobsTensors`` for one step)."""

    sampled: Array  # float32[...]: value of the sampled token
    rank: Array  # int32[...]: 1-based rank of the sampled token, #{v : value_v >= value_sampled}
    ids: Array  # int32[..., n]: the n largest values' token ids, descending (ties by lower id)
    values: Array  # float32[..., n]: those values

    def vllm_layout(self, sampled_ids: ArrayLike) -> tuple[Array, Array, Array]:
        """vLLM's layout: ``(ids [..., n+1], values [..., n+1], ranks [...])``, sampled token first."""
        sampled_ids = jnp.asarray(sampled_ids, jnp.int32)[..., None]
        return (
            jnp.concatenate([sampled_ids, self.ids], axis=-1),
            jnp.concatenate([self.sampled[..., None], self.values], axis=-1),
            self.rank,
        )


def compute_logprobs(logits: ArrayLike) -> Array:
    """``float32[..., V]`` log-softmax of the float32 logits (vLLM ``compute_logprobs``).

    NaN counts as ``-inf``; an all ``-inf`` row gives all ``-inf`` (never NaN).

    >>> import jax.numpy as jnp
    >>> [round(v, 4) for v in compute_logprobs(jnp.log(jnp.array([1.0, 3.0]))).tolist()]
    [-1.3863, -0.2877]
    """
    x, _ = _math.prepare(logits)
    return _math.log_softmax(x)


def _sampled_ids(sampled: ArrayLike, batch: tuple[int, ...], vocab: int) -> Array:
    ids = _validate.param(sampled, batch, "sampled", dtype=jnp.int32, lo=0, hi=vocab - 1)
    return jnp.clip(ids, 0, vocab - 1)


def top_logprobs(values: ArrayLike, sampled: ArrayLike, n: int) -> TopLogprobs:
    """The sampled token's value and rank, and the top-``n`` values (vLLM ``gather_logprobs``).

    Args:
      values: ``[..., V]`` log-probabilities (or logits, for the ``*_logits`` modes).
      sampled: ``int[...]`` sampled token per row (clamped to ``[0, V)`` under ``jit``).
      n: static number of alternatives, ``0 <= n <= V``.

    Returns:
      :class:`TopLogprobs`. The rank counts every token whose value is ``>=`` the sampled one
      (ties share the worse rank, as in vLLM); a sampled ``-inf`` token has rank ``V``.

    Raises:
      ValueError: if ``n`` is not in ``[0, V]`` or a concrete ``sampled`` is outside ``[0, V)``.

    >>> import jax.numpy as jnp
    >>> r = top_logprobs(jnp.log(jnp.array([0.2, 0.5, 0.3])), sampled=2, n=1)
    >>> int(r.rank), r.ids.tolist()
    (2, [1])
    """
    x, _ = _math.prepare(values)
    batch, vocab = x.shape[:-1], x.shape[-1]
    n = _validate.static_int(n, "n", lo=0)
    if n > vocab:
        raise ValueError(f"n must be <= V = {vocab}, got {n}")
    tok = _sampled_ids(sampled, batch, vocab)
    chosen = jnp.take_along_axis(x, tok[..., None], axis=-1)
    rank = _math.row_count(x >= chosen)
    top_values, top_ids = lax.top_k(x, n)
    return TopLogprobs(chosen[..., 0], rank, top_ids.astype(jnp.int32), top_values)


def gather_logprobs(values: ArrayLike, ids: ArrayLike) -> Array:
    """Values of requested ids (vLLM ``logprob_token_ids``): ``float32[..., m]``, padding (``< 0``) -> ``-inf``.

    >>> import jax.numpy as jnp
    >>> gather_logprobs(jnp.array([-1.0, -2.0, -3.0]), [2, -1]).tolist()
    [-3.0, -inf]
    """
    x, _ = _math.prepare(values)
    vocab = x.shape[-1]
    idx = _validate.check_tokens(ids, "ids", x.shape[:-1])
    if _validate.is_concrete(ids) and idx.size and int(jnp.max(idx)) >= vocab:
        raise ValueError(f"ids must be token ids < vocab size {vocab} (negative = padding)")
    ok = (idx >= 0) & (idx < vocab)
    got = jnp.take_along_axis(x, jnp.clip(idx, 0, vocab - 1), axis=-1)
    return jnp.where(ok, got, -jnp.inf)


def step_logprobs(
    raw_logits: ArrayLike,
    processed_logits: ArrayLike | None,
    sampled: ArrayLike,
    n: int,
    mode: LogprobsMode = "raw_logprobs",
) -> TopLogprobs:
    """One decode step's report: picks the source for ``mode`` and calls :func:`top_logprobs`.

    Args:
      raw_logits: ``[..., V]`` model logits (any float dtype; upcast to float32).
      processed_logits: ``[..., V]`` logits after the sampler chain (needed by ``processed_*``).
      sampled: ``int[...]`` tokens chosen this step.
      n: static number of alternatives.
      mode: static, one of :data:`MODES`.

    Returns:
      :class:`TopLogprobs`.

    >>> import jax.numpy as jnp
    >>> raw = jnp.log(jnp.array([0.2, 0.5, 0.3]))
    >>> processed = jnp.array([-jnp.inf, 0.5, 0.3])          # e.g. after top-k 2
    >>> r = step_logprobs(raw, processed, 1, n=2, mode="processed_logits")
    >>> r.values.tolist(), int(r.rank)
    ([0.5, 0.30000001192092896], 1)
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    source = raw_logits if mode.startswith("raw") else processed_logits
    if source is None:
        raise ValueError(f"mode {mode!r} needs processed_logits")
    values = compute_logprobs(source) if mode.endswith("logprobs") else _math.prepare(source)[0]
    return top_logprobs(values, sampled, n)
