"""Contrastive search (Su et al. 2022) with HuggingFace's in-tree semantics.

Each step: the sampler's stages process the logits; the ``k`` most probable tokens ``c`` (with
probabilities ``p_c``) are run through the model in one call (``B * k`` rows, the cache holding
``k`` copies of every row); each candidate's last-layer hidden state ``h_c`` is compared with the
hidden states of every previous token of its row (prompt included, padding excluded), and the
token maximising ``(1 - alpha) * p_c - alpha * max_j cos(h_c, h_j)`` is kept, together with its
cache row and its logits for the next step. Stopping rules, log-probs and outputs are those of
:func:`jaxsample.decoding.generate`. The model must return ``StepOutput.hidden``.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> params = {"logits": jnp.log(jnp.array([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])),
...           "hidden": jnp.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])}
>>> out = contrastive_search(BIGRAM, params, jnp.array([[0]]), top_k=2, penalty_alpha=0.6, max_new_tokens=3)
>>> out.tokens.tolist()
[[2, 1, 2]]
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import SamplerState
from jaxsample.decoding import _stopping, sharding
from jaxsample.decoding._stopping import Stops, Tracker
from jaxsample.decoding.loop import GenerateOutput, begin, fill_pad, prefill, prepare
from jaxsample.decoding.model import repeat_rows, take_rows
from jaxsample.decoding.options import DecodingOptions


class ContrastiveState(NamedTuple):
    logits: Array  # float32[B, V]
    cache: Any  # rows B * k (k copies of each row)
    sampler: SamplerState
    prompt_lengths: Array  # int32[B]
    out: Tracker
    context: Array  # float32[B, P + N, D]: hidden states of prompt and generated tokens
    context_valid: Array  # bool[B, P + N]


def _unit(x: Array) -> Array:
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.where(norm > 0, norm, 1.0)


def _step(model, sampler, cfg, k, params, sparams, stops: Stops, alpha, state: ContrastiveState):
    out = state.out
    b, v = state.logits.shape
    active = ~out.done
    x = _stopping.mask_eos(state.logits, stops, out.length)
    processed, sst = sampler.process(x, state.sampler, sparams)
    top_p, top_ids = lax.top_k(_math.softmax(processed), k)  # [B, k]
    position = jnp.repeat(jnp.where(active, state.prompt_lengths + out.length, -1), k)
    o = model.apply_step(params, top_ids.reshape(b * k, 1), position[:, None], state.cache)
    hidden = o.hidden[:, 0].reshape(b, k, -1).astype(jnp.float32)
    cos = jnp.einsum("btd,bkd->bkt", _unit(state.context), _unit(hidden))
    cos = jnp.where(state.context_valid[:, None, :], cos, jnp.finfo(jnp.float32).min)
    score = (1.0 - alpha[:, None]) * top_p - alpha[:, None] * jnp.max(cos, axis=-1)
    sel = jnp.argmax(score, axis=-1)
    token = jnp.where(active, jnp.take_along_axis(top_ids, sel[:, None], axis=1)[:, 0], cfg.pad_id)
    lp = None
    if cfg.top_logprobs is not None:
        lp = _stopping.step_logprobs(state.logits, processed, token, cfg.top_logprobs, stops.logprob_ids)
    new_out = _stopping.push(out, stops, token, active, lp)
    sst = sampler.accept(token, sst, sparams, active)
    cache = take_rows(o.cache, jnp.repeat(jnp.arange(b) * k + sel, k))
    chosen = jnp.take_along_axis(hidden, sel[:, None, None], axis=1)[:, 0]
    slot = jnp.where(
        active, state.context.shape[1] - cfg.max_tokens + out.length, -1
    )  # after the P prompt slots
    rows = jnp.arange(b)
    context = state.context.at[rows, slot].set(chosen, mode="drop")
    context_valid = state.context_valid.at[rows, slot].set(True, mode="drop")
    logits = jnp.where(
        active[:, None],
        jnp.take_along_axis(o.logits[:, 0].reshape(b, k, v), sel[:, None, None], axis=1)[:, 0],
        state.logits,
    ).astype(jnp.float32)
    return ContrastiveState(logits, cache, sst, state.prompt_lengths, new_out, context, context_valid)


def _search(model, sampler, cfg, k, params, prompt, lengths, cache, sparams, stops, alpha) -> GenerateOutput:
    logits, cache, hidden = prefill(model, params, prompt, lengths, cache, cfg.cache_len, cfg.batch_sharding)
    if hidden is None:
        raise ValueError("contrastive search needs a model whose apply_step returns StepOutput.hidden")
    b, p, d = hidden.shape
    if k > logits.shape[-1]:
        raise ValueError(f"top_k ({k}) must be <= the vocabulary size ({logits.shape[-1]})")
    base = begin(sampler, cfg, logits, repeat_rows(cache, k), prompt, lengths, sparams, stops)
    context = jnp.zeros((b, p + cfg.max_tokens, d), jnp.float32).at[:, :p].set(hidden.astype(jnp.float32))
    valid = jnp.arange(p + cfg.max_tokens) < lengths[:, None]
    state = ContrastiveState(*base, context, valid)
    step = functools.partial(_step, model, sampler, cfg, k, params, sparams, stops, alpha)
    keep = lambda s: sharding.constrain(sharding.constrain(s, cfg.batch_sharding, b), cfg.batch_sharding, b * k)  # noqa: E731
    state = lax.while_loop(lambda s: ~jnp.all(s.out.done), lambda s: keep(step(s)), keep(state))
    o = state.out
    return GenerateOutput(o.tokens, o.length, o.reason, o.logprobs)


_search_jit = jax.jit(_search, static_argnums=(0, 1, 2, 3))


def search(model, params, prompt, prompt_lengths, opts: DecodingOptions, *, cache=None, attention_mask=None,
           mesh=None) -> GenerateOutput:
    """Contrastive search from validated options (``top_k``, ``penalty_alpha``; see :func:`contrastive_search`)."""
    if opts.top_k is None or opts.penalty_alpha is None:
        raise ValueError("contrastive search needs top_k and penalty_alpha")
    req = prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask, mesh=mesh)
    alpha = jnp.clip(
        _validate.param(opts.penalty_alpha, (req.prompt.shape[0],), "penalty_alpha", lo=0.0, hi=1.0), 0.0, 1.0
    )
    out = _search_jit(
        req.model,
        req.sampler,
        req.cfg,
        opts.top_k,
        sharding.replicate(params, req.cfg.batch_sharding),
        req.prompt,
        req.lengths,
        req.cache,
        req.sampler_params,
        req.stops,
        sharding.place_rows(alpha, req.cfg.batch_sharding),
    )
    return fill_pad(out, req.pad_id)


def contrastive_search(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    top_k: int,
    penalty_alpha: ArrayLike,
    max_new_tokens: ArrayLike,
    attention_mask: ArrayLike | None = None,
    cache: Any = None,
    mesh: Any = None,
    **kwargs: Any,
) -> GenerateOutput:
    """Contrastive search (HF ``penalty_alpha > 0, top_k > 1``).

    Args:
      top_k: static number of candidates ``k``.
      penalty_alpha: degeneration penalty weight ``alpha`` in ``[0, 1]`` per row (traced).
      sampler: its stages process the logits before the top-k (its selector is unused).
      Other arguments: as :func:`jaxsample.decoding.generate` (``max_tokens``, ``sampler_params``,
        ``eos_ids``, ``stop_sequences``, ``min_new_tokens``, ``pad_id``, ``logprobs``,
        ``top_logprobs``, ``history_size``, ``options``).
    """
    from jaxsample.decoding.generate import options_from

    opts = options_from(
        kwargs.pop("options", None), dict(kwargs, top_k=top_k, penalty_alpha=penalty_alpha, max_new_tokens=max_new_tokens)
    )
    return search(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask, mesh=mesh)
