"""Teacher-forced scoring: log-probabilities of given tokens under a model, in one jitted call.

Two questions, one forward pass over right-padded rows (any :class:`jaxsample.decoding.Model`):

* :func:`score_tokens`: vLLM's ``prompt_logprobs``. For every token ``t >= start`` of a row (the
  first token has no prediction, so ``start >= 1``), ``log p(tokens[t] | tokens[:t])``, its rank
  (vLLM's ``#{v : logprob_v >= logprob_token}``: 1 = most likely, ties count against the token)
  and the top-``n`` alternatives (:func:`jaxsample.logprobs.top_logprobs`). ``temperature`` gives vLLM's
  ``processed_logprobs`` for prompts: ``log_softmax(logits / temperature)``; by default the
  log-probs are raw (``log_softmax`` of the model's float32 logits).
* :func:`score_continuations`: the log-probs of given continuation / label tokens after ragged
  prompts, their sum and count: what perplexity (``exp(-total / length)``) and reranking need.

Rows are independent (one row alone gives the same numbers as in a batch), shapes are fixed
(``T = P + C``), and lengths, ``start`` and ``temperature`` are traced: new values never
recompile. The model is called once with ``positions = 0..length-1`` (``-1`` on padding) on a
fresh cache (``model.init_cache(B, T)``) or the ``cache`` given (encoder-decoder models).

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]]))
>>> s = score_tokens(BIGRAM, {"logits": table}, jnp.array([[0, 1, 1]]), top_n=1)
>>> [round(v, 4) for v in s.logprobs[0].tolist()], s.ranks[0].tolist(), s.top_ids[0, :, 0].tolist()
([0.0, -0.6931, -0.2877], [0, 2, 1], [0, 0, 1])
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.decoding import _request
from jaxsample.decoding.model import Model, prompt_positions
from jaxsample.logprobs import top_logprobs


class TokenScores(NamedTuple):
    """Per-token scores (entries with ``scored == False`` are 0)."""

    logprobs: Array  # float32[B, T]: log p(tokens[b, t] | tokens[b, :t])
    scored: Array  # bool[B, T]: start[b] <= t < length[b]
    ranks: Array  # int32[B, T]: #{v : logprob_v >= logprob of the token}
    top_ids: Array  # int32[B, T, n]: the n most likely tokens at position t
    top_logprobs: Array  # float32[B, T, n]: their log-probs


class ContinuationScores(NamedTuple):
    """Log-probs of the continuation tokens (entries past ``lengths`` are 0)."""

    logprobs: Array  # float32[B, C]
    total: Array  # float32[B]: sum over the continuation
    lengths: Array  # int32[B]: continuation tokens scored


@functools.partial(jax.jit, static_argnums=(0, 4))
def _score(model: Model, params, tokens, lengths, top_n: int, start, temperature, cache) -> TokenScores:
    b, t = tokens.shape
    if cache is None:
        cache = model.init_cache(b, t)
    ids, positions = prompt_positions(tokens, lengths)
    logits = model.apply_step(params, ids, positions, cache).logits.astype(jnp.float32)  # [B, T, V]
    logits = logits / temperature[:, None, None]
    lp = _math.log_softmax(logits[:, :-1])  # [B, T-1, V]: predicts tokens[:, 1:]
    nxt = ids[:, 1:]
    report = top_logprobs(lp, nxt, top_n)
    pad = lambda x: jnp.pad(x, [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
    pos = jnp.arange(t)
    scored = (pos >= start[:, None]) & (pos < lengths[:, None])
    keep = lambda x: jnp.where(scored.reshape(scored.shape + (1,) * (x.ndim - 2)), x, 0)  # noqa: E731
    return TokenScores(
        keep(pad(report.sampled)),
        scored,
        keep(pad(report.rank)),
        keep(pad(report.ids)),
        keep(pad(report.values)),
    )


def _checked_model(model: Model, cache: Any) -> None:
    if not isinstance(model, Model):
        raise ValueError(f"model must be a jaxsample.decoding.Model(apply_step, init_cache), got {type(model)}")
    if cache is None and model.init_cache is None:
        raise ValueError("pass a cache (encoder-decoder models) or a model with init_cache")


def _temperature(temperature: ArrayLike | None, b: int) -> Array:
    if temperature is None:
        return jnp.ones((b,), jnp.float32)
    if _validate.is_concrete(temperature) and bool(jnp.any(jnp.asarray(temperature) <= 0)):
        raise ValueError(f"temperature must be > 0 for processed log-probs, got {temperature}")
    t = _validate.row_param(temperature, (b,), "temperature", jnp.float32)
    return jnp.maximum(t, 1e-6)


def score_tokens(
    model: Model,
    params: Any,
    tokens: ArrayLike,
    lengths: ArrayLike | None = None,
    *,
    start: ArrayLike = 1,
    top_n: int = 0,
    temperature: ArrayLike | None = None,
    cache: Any = None,
) -> TokenScores:
    """Log-probs of every token of ``tokens`` from ``start`` on (vLLM ``prompt_logprobs``).

    Args:
      model, params: a :class:`jaxsample.decoding.Model` and its parameters.
      tokens: ``int[B, T]`` right-padded rows (``-1`` padding, or see ``lengths``).
      lengths: ``int[B]`` valid lengths; default: entries ``>= 0`` per row.
      start: int or ``int[B]``, first position scored (``>= 1``).
      top_n: static number of alternatives per position (``0 <= n <= V``).
      temperature: ``None`` (raw log-probs) or ``> 0`` per row (processed: ``logits / temperature``).
      cache: a prebuilt cache holding ``T`` positions; default ``model.init_cache(B, T)``.

    Returns:
      :class:`TokenScores` with ``[B, T]`` leading axes.
    """
    _checked_model(model, cache)
    tokens, lengths = _request.prompt_inputs(tokens, lengths)
    b = tokens.shape[0]
    _validate.check_range(start, "start", lo=1, integer=True)
    start = jnp.maximum(_validate.row_param(start, (b,), "start", jnp.int32), 1)
    n = _validate.static_int(top_n, "top_n", lo=0)
    return _score(model, params, tokens, lengths, n, start, _temperature(temperature, b), cache)


@jax.jit
def _join(prompt, plen, cont, clen):
    """``[B, P + C]`` rows ``prompt[:plen] + cont[:clen]``, ``-1`` after."""
    p = prompt.shape[1]
    t = jnp.arange(p + cont.shape[1])
    from_prompt = jnp.take_along_axis(prompt, jnp.clip(t, 0, p - 1)[None].repeat(prompt.shape[0], 0), axis=1)
    ci = jnp.clip(t[None] - plen[:, None], 0, cont.shape[1] - 1)
    from_cont = jnp.take_along_axis(cont, ci, axis=1)
    seq = jnp.where(t < plen[:, None], from_prompt, from_cont)
    return jnp.where(t < (plen + clen)[:, None], seq, -1)


def score_continuations(
    model: Model,
    params: Any,
    prompts: ArrayLike,
    continuations: ArrayLike,
    *,
    prompt_lengths: ArrayLike | None = None,
    continuation_lengths: ArrayLike | None = None,
    temperature: ArrayLike | None = None,
    cache: Any = None,
) -> ContinuationScores:
    """Teacher-forced log-probs of ``continuations`` after ``prompts`` (ragged, batched).

    Args:
      model, params: a :class:`jaxsample.decoding.Model` and its parameters.
      prompts: ``int[B, P]`` right-padded (``-1``), at least one token per row (e.g. BOS).
      continuations: ``int[B, C]`` right-padded label tokens (``-1``; a row may be empty).
      prompt_lengths, continuation_lengths: ``int[B]``; default: entries ``>= 0`` per row.
      temperature, cache: as in :func:`score_tokens` (the cache must hold ``P + C`` positions).

    Returns:
      :class:`ContinuationScores`; perplexity is ``exp(-total / lengths)``.
    """
    prompts, plen = _request.prompt_inputs(prompts, prompt_lengths)
    cont = _validate.check_tokens(continuations, "continuations")
    b = prompts.shape[0]
    if cont.ndim != 2 or cont.shape[0] != b:
        raise ValueError(f"continuations must have shape [B={b}, C], got {cont.shape}")
    if continuation_lengths is None:
        clen = jnp.sum(cont >= 0, axis=-1).astype(jnp.int32)
    else:
        _validate.check_range(continuation_lengths, "continuation_lengths", lo=0, hi=cont.shape[1], integer=True)
        clen = jnp.clip(_validate.row_param(continuation_lengths, (b,), "continuation_lengths", jnp.int32), 0, cont.shape[1])
    seq = _join(prompts, plen, jnp.maximum(cont, 0), clen)
    s = score_tokens(model, params, seq, jnp.maximum(plen + clen, 1), start=plen, temperature=temperature, cache=cache)
    idx = jnp.clip(plen[:, None] + jnp.arange(cont.shape[1]), 0, seq.shape[1] - 1)
    lp = jnp.where(jnp.arange(cont.shape[1]) < clen[:, None], jnp.take_along_axis(s.logprobs, idx, axis=1), 0.0)
    return ContinuationScores(lp, jnp.sum(lp, axis=-1), clen)
