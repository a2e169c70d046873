"""Prompt-lookup (n-gram) speculative decoding: model-free drafts copied from the context.

HF ``prompt_lookup_num_tokens`` / ``max_matching_ngram_size`` (``PromptLookupCandidateGenerator``)
and vLLM's ``ngram`` proposer (``prompt_lookup_min``, ``prompt_lookup_max``,
``num_speculative_tokens``). Each iteration, per row:

1. **Propose** (:func:`propose`, on device, fixed shapes). The context is ``source ++ prompt ++
   generated`` (``source``: optional extra tokens to copy from, e.g. an encoder-decoder's input).
   Find the longest ``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` such that the last ``n``
   context tokens occur earlier in the context with at least one token after them; among the
   occurrences of that length take the earliest. The drafts are the up to ``k`` tokens that follow
   it (fewer at the end of the context or of ``source``). No match: no drafts this iteration (the
   step is then one plain decoding step). This is vLLM's rule exactly, and HF's with
   ``prompt_lookup_min = 1`` (HF also truncates drafts at EOS, which only changes the draft counts:
   the stopping rules stop a row at an accepted EOS).
2. **Verify**: the target runs ``[last, d_1, .., d_k]`` in one call; its logits go through the full
   chain position by position (as :mod:`jaxsample.decoding.speculative`).
3. **Accept**: at every position the row draws the token plain decoding would draw there (the
   target's selector, with plain decoding's key for that position and the chain state after the
   drafts before it); drafts are accepted while they equal these tokens, and the first draw that
   differs is emitted (HF's rule when the candidates carry no probabilities). This is
   :mod:`~jaxsample.decoding.speculative`'s rejection rule for a point-mass proposal
   ``q = onehot(d)``, realised with one coupling of the randomness: ``d`` is accepted with
   probability ``p(d) = min(1, p(d) / q(d))`` and, when rejected, the emitted token is distributed as
   ``p`` without ``d``, i.e. ``normalize(max(p - q, 0))``. Because every emitted token is the one
   plain decoding draws at its position given the same prefix, the output is **bit-identical** to
   :func:`~jaxsample.decoding.generate`, greedy or sampled (for any chain and seed), and only the
   number of model calls changes.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM, generate
>>> table = jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.2, 0.1, 0.7], [0.5, 0.4, 0.1]]))
>>> prompt = jnp.array([[0, 1, 2, 0, 1]])
>>> out = prompt_lookup_generate(BIGRAM, {"logits": table}, prompt, num_draft_tokens=3, max_new_tokens=6)
>>> out.tokens.tolist() == generate(BIGRAM, {"logits": table}, prompt, max_new_tokens=6).tokens.tolist()
True
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, SamplerState
from jaxsample.decoding import _stopping
from jaxsample.decoding._stopping import Stops, Tracker
from jaxsample.decoding.loop import Config, fill_pad, prepare
from jaxsample.decoding.model import Model, prompt_positions, where_rows
from jaxsample.decoding.options import DecodingOptions
from jaxsample.decoding.speculative import SpeculativeOutput


def propose(context: Array, length: Array, k: int, min_n: Array, max_n: int) -> tuple[Array, Array]:
    """N-gram drafts: ``(drafts int32[B, k], count int32[B])`` (drafts past ``count`` are 0).

    Args:
      context: ``int32[B, C]``, oldest first; negative entries never match and end a draft.
      length: ``int32[B]``: the row's context is ``context[b, :length[b]]``.
      k: static number of draft slots.
      min_n: ``int32[B]`` (or scalar) smallest n-gram to match (``>= 1``).
      max_n: static largest n-gram to match.
    """
    b, c = context.shape
    idx = jnp.arange(c)
    run = jnp.zeros((b, c), jnp.int32)  # run[e]: matched suffix length of a window ending at e
    alive = jnp.ones((b, c), bool)
    for t in range(max_n):
        at = length - 1 - t
        suffix = jnp.where(at >= 0, jnp.take_along_axis(context, jnp.clip(at, 0, c - 1)[:, None], 1)[:, 0], -1)
        shifted = jnp.pad(context, ((0, 0), (t, 0)), constant_values=-1)[:, :c]  # context[e - t]
        alive = alive & (shifted == suffix[:, None]) & (shifted >= 0)
        run = run + alive
    run = jnp.where(idx[None] <= (length - 2)[:, None], run, 0)  # a continuation must exist
    best = jnp.max(run, axis=-1)
    end = jnp.argmax(run == best[:, None], axis=-1)  # earliest window of the longest match
    start = end + 1
    take = start[:, None] + jnp.arange(k)
    drafts = jnp.take_along_axis(context, jnp.clip(take, 0, c - 1), axis=1)
    ok = (take < length[:, None]) & (drafts >= 0)
    count = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    count = jnp.where((best >= jnp.maximum(min_n, 1)) & (best > 0), count, 0).astype(jnp.int32)
    return jnp.where(jnp.arange(k) < count[:, None], drafts, 0).astype(jnp.int32), count


class LookupState(NamedTuple):
    last: Array  # int32[B]: newest token, at position prompt_length - 1 + generated; not yet fed
    cache: Any
    sampler: SamplerState
    prompt_lengths: Array  # int32[B]
    context: Array  # int32[B, C]: source, prompt and generated tokens (-1 = none)
    context_length: Array  # int32[B]
    out: Tracker
    drafted: Array  # int32[B]
    accepted: Array  # int32[B]


class NGram(NamedTuple):
    """The n-gram proposer (static): :func:`propose` on the context, ``extra`` = ``min_n int32[B]``."""

    max_n: int

    def __call__(self, state: LookupState, sampler, sparams, stops, extra, k: int):
        return propose(state.context, state.context_length, k, extra, self.max_n)


def _call(model, params, tokens, positions, cache, width: int):
    """The target over the first ``width`` of ``tokens [B, K]``; logits zero-padded to ``[B, K, V]``."""
    t = model.apply_step(params, tokens[:, :width], positions[:, :width], cache)
    pad = tokens.shape[1] - width
    logits = t.logits.astype(jnp.float32)
    return (jnp.pad(logits, ((0, 0), (0, pad), (0, 0))) if pad else logits), t.cache


def _step(model, sampler, cfg: Config, widths, proposer, params, sparams, extra, min_jump, stops: Stops, state):
    """Drafts from ``proposer``; one target call over ``[last, d_1 .. d_j]`` of the smallest width in
    ``widths`` holding ``1 + max(count)`` tokens (width 1, a plain step, when ``max(count) <
    min_jump``); then verification position by position until every row has emitted its free token."""
    out = state.out
    b = state.last.shape[0]
    k = widths[-1] - 1
    active = ~out.done
    drafts, count = proposer(state, sampler, sparams, stops, extra, k)
    count = jnp.where(active, count, 0)
    pos = state.prompt_lengths - 1 + out.length
    tokens = jnp.concatenate([state.last[:, None], drafts], axis=1)
    positions = jnp.where(active[:, None], pos[:, None] + jnp.arange(k + 1), -1)
    calls = [functools.partial(_call, model, params, tokens, positions, state.cache, w) for w in widths]
    if len(widths) == 1:
        logits, cache = calls[0]()
    else:
        most = jnp.max(count)
        need = jnp.where(most >= min_jump, most + 1, 1)
        width_index = jnp.searchsorted(jnp.asarray(widths), need)
        count = jnp.minimum(count, jnp.asarray(widths)[width_index] - 1)
        logits, cache = lax.switch(width_index, calls)

    def verify(carry):  # position j: plain decoding's step (its draw accepted), for rows still matching drafts
        j, live, n_ok, sst, chosen, final, o, context = carry
        raw = jnp.take(logits, j, axis=1)
        tok, proc, picked = sampler.sample(_stopping.mask_eos(raw, stops, o.length), sst, sparams, active)
        lp = None
        if cfg.top_logprobs is not None:
            lp = _stopping.step_logprobs(raw, proc, tok, cfg.top_logprobs, stops.logprob_ids)
        keep = live & (j < count) & (tok == jnp.take(drafts, jnp.minimum(j, k - 1), axis=1))  # accepted draft
        stop = live & ~keep  # this draw is the row's free token
        o = _stopping.push(o, stops, jnp.where(active, tok, cfg.pad_id), active & live, lp)
        col = jnp.where(live, state.context_length + j, context.shape[1])  # out of range -> dropped
        context = context.at[jnp.arange(b), col].set(tok, mode="drop")
        chosen = where_rows(stop, picked, chosen)  # the state after the row's free token
        sst = where_rows(keep, picked, sst)  # an accepted draft is the token drawn: the same state
        return j + 1, keep, n_ok + keep, sst, chosen, jnp.where(stop, tok, final), o, context

    zeros = jnp.zeros((b,), jnp.int32)
    init = (0, active, zeros, state.sampler, state.sampler, state.last, out, state.context)
    _, _, n_ok, _, chosen, final, new_out, context = lax.while_loop(lambda c: jnp.any(c[1]), verify, init)
    new_sampler = where_rows(active, chosen, state.sampler)
    return LookupState(
        jnp.where(active, final, state.last),
        cache,
        new_sampler,
        state.prompt_lengths,
        context,
        state.context_length + jnp.where(active, n_ok + 1, 0),
        new_out,
        state.drafted + count,
        state.accepted + jnp.where(active, n_ok, 0),
    )


def _decode(model, sampler, cfg, widths, proposer, params, prompt, lengths, source, cache, sparams, extra, min_jump,
            stops):
    """The whole loop; returns ``(Tracker, drafted int32[B], accepted int32[B])``."""
    b, p = prompt.shape
    k = widths[-1] - 1
    if cache is None:
        cache = model.init_cache(b, cfg.cache_len)
    tokens, positions = prompt_positions(prompt, lengths - 1)  # everything but the last prompt token
    t = model.apply_step(params, tokens, positions, cache)
    cache, v = t.cache, t.logits.shape[-1]
    last = jnp.take_along_axis(prompt, (lengths - 1)[:, None], axis=1)[:, 0]
    history = jnp.where(jnp.arange(p) < lengths[:, None], prompt, -1)
    sst = sampler.init(sparams, vocab_size=v, prompt=history, history_size=cfg.history_size)
    # context: [source | -1 | prompt (left-aligned) | room for the generation]
    s = source.shape[1]
    room = jnp.full((b, cfg.max_tokens + k + 1), -1, jnp.int32)
    context = jnp.concatenate([source, jnp.full((b, 1), -1, jnp.int32), history, room], axis=1)
    zeros = jnp.zeros((b,), jnp.int32)
    out = _stopping.tracker(stops, cfg.max_tokens, cfg.pad_id, cfg.top_logprobs)
    state = LookupState(last, cache, sst, lengths, context, s + 1 + lengths, out, zeros, zeros)
    body = functools.partial(_step, model, sampler, cfg, widths, proposer, params, sparams, extra, min_jump, stops)
    state = lax.while_loop(lambda st: ~jnp.all(st.out.done), body, state)
    return state.out, state.drafted, state.accepted


_decode_jit = jax.jit(_decode, static_argnums=(0, 1, 2, 3, 4))


def prompt_lookup_generate(
    model: Model,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    num_draft_tokens: int = 10,
    prompt_lookup_max: int = 2,
    prompt_lookup_min: ArrayLike = 1,
    source: ArrayLike | None = None,
    max_new_tokens: ArrayLike,
    max_tokens: int | None = None,
    sampler: Sampler | None = None,
    sampler_params: Mapping[str, ArrayLike] | None = None,
    eos_ids: ArrayLike | None = None,
    stop_sequences=None,
    min_new_tokens: ArrayLike = 0,
    pad_id: int | None = None,
    cache: Any = None,
    history_size: int | None = None,
    repetition_detection=None,
    attention_mask: ArrayLike | None = None,
) -> SpeculativeOutput:
    """Generates with ``model``'s sampler, verifying up to ``num_draft_tokens`` n-gram drafts per call.

    The defaults are HF's (``prompt_lookup_num_tokens=10``, ``max_matching_ngram_size=2``,
    n-grams down to 1); vLLM's ``ngram`` method is ``num_draft_tokens=num_speculative_tokens``,
    ``prompt_lookup_max``, ``prompt_lookup_min``.

    Args:
      model, params: the target model (a :class:`~jaxsample.decoding.Model`).
      num_draft_tokens: static ``k >= 1`` draft slots per iteration.
      prompt_lookup_max: static largest n-gram matched (``>= 1``).
      prompt_lookup_min: smallest n-gram matched, int or ``int[B]`` (traced, ``1..prompt_lookup_max``).
      source: optional ``int[B, S]`` tokens searched before the prompt (``-1`` padding), e.g. the
        encoder input of an encoder-decoder model, whose output copies it.
      cache: a prebuilt cache holding ``P + N + k + 1`` positions (default ``model.init_cache``).
      repetition_detection: vLLM's repetition stop rule (see :func:`~jaxsample.decoding.generate`).
      Other arguments: as :func:`jaxsample.decoding.generate`.

    Returns:
      :class:`~jaxsample.decoding.SpeculativeOutput` (``num_drafted`` / ``num_accepted`` per row).
    """
    k = _validate.static_int(num_draft_tokens, "num_draft_tokens", lo=1)
    max_n = _validate.static_int(prompt_lookup_max, "prompt_lookup_max", lo=1)
    opts = DecodingOptions(max_new_tokens=max_new_tokens, max_tokens=max_tokens, sampler=sampler,
                           sampler_params=sampler_params, eos_ids=eos_ids, stop_sequences=stop_sequences,
                           min_new_tokens=min_new_tokens, pad_id=pad_id, history_size=history_size,
                           repetition_detection=repetition_detection)
    req = prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask,
                  extra_positions=k + 1)
    b = req.prompt.shape[0]
    _validate.check_range(prompt_lookup_min, "prompt_lookup_min", lo=1, hi=max_n, integer=True)
    min_n = _validate.row_param(prompt_lookup_min, (b,), "prompt_lookup_min", jnp.int32)
    if source is None:
        src = jnp.full((b, 0), -1, jnp.int32)
    else:
        src = _validate.check_tokens(source, "source", (b,))
        if src.ndim != 2:
            raise ValueError(f"source must have shape [B, S], got {src.shape}")
        src = jnp.where(src >= 0, src, -1).astype(jnp.int32)
    o, drafted, accepted = _decode_jit(
        req.model, req.sampler, req.cfg, (k + 1,), NGram(max_n), params, req.prompt, req.lengths, src, req.cache,
        req.sampler_params, min_n, 1, req.stops,
    )
    return fill_pad(SpeculativeOutput(o.tokens, o.length, o.reason, drafted, accepted), req.pad_id)
