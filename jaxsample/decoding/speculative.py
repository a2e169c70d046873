"""Speculative decoding: a draft model proposes ``k`` tokens, the target verifies them in one call.

Each iteration, per row (``last`` = the newest token, at position ``pos``):

1. The draft model proposes ``d_1 .. d_k`` autoregressively with its own sampler chain (its first
   call also feeds ``d_k`` of the previous iteration when all of those drafts were accepted, so its
   cache never has holes). ``q_i`` is the distribution ``d_i`` was drawn from: ``softmax`` of the
   draft's processed logits, or a point mass when the draft's selector is greedy.
2. The target runs ``[last, d_1, .., d_k]`` at positions ``pos .. pos + k`` in one call. Its logits
   go through the **full** target chain position by position (each position's history includes the
   drafts before it), giving ``p_0 .. p_k``.
3. vLLM's rejection sampler: with a greedy target selector a draft is accepted while it equals the
   argmax; otherwise ``d_i`` is accepted with probability ``min(1, p(d_i) / q(d_i))``. At the first
   rejection the row takes a token from ``normalize(max(p - q, 0))``; when all ``k`` are accepted it
   takes a bonus token from ``p_k`` with the target's own selector (the token plain sampling would
   draw there). The result is distributed exactly as sampling from the target alone, and with a
   greedy target it equals greedy decoding of the target.

The accepted tokens go through the usual stopping rules (EOS, stop sequences, min/max new tokens),
so a row can stop in the middle of an accepted run. Randomness is per row and position:
acceptance and residual draws use the target's ``seed``, the draft draws with its own seeds salted
so that they never share noise with the target. The model caches must be position-masked (see
:mod:`jaxsample.decoding.model`): slots written for rejected drafts are overwritten later.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM, generate
>>> target = {"logits": jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.2, 0.1, 0.7], [0.5, 0.4, 0.1]]))}
>>> draft = {"logits": jnp.log(jnp.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.8, 0.1]]))}
>>> prompt = jnp.array([[0]])
>>> out = speculative_generate(BIGRAM, target, BIGRAM, draft, prompt, num_draft_tokens=3, max_new_tokens=6)
>>> out.tokens.tolist() == generate(BIGRAM, target, prompt, max_new_tokens=6).tokens.tolist()
True
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _math, _noise
from jaxsample.samplers.categorical import categorical
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, SamplerState, request_keys
from jaxsample.decoding import _request, _stopping, adapters, sharding
from jaxsample.decoding._stopping import Stops, Tracker
from jaxsample.decoding.loop import Config, fill_pad, prepare
from jaxsample.decoding.model import prompt_positions, where_rows
from jaxsample.decoding.options import DecodingOptions

_DRAFT_SEED_SALT = 0x5BD1E995
_ACCEPT_SALT = 0x0ACCE97
_RESIDUAL_SALT = 0x7E51D0A


class SpeculativeOutput(NamedTuple):
    """Generated tokens (as :class:`~jaxsample.decoding.GenerateOutput`) and acceptance counts."""

    tokens: Array  # int32[B, N]
    lengths: Array  # int32[B]
    finish_reason: Array  # int32[B]
    num_drafted: Array  # int32[B]: draft tokens proposed to the row
    num_accepted: Array  # int32[B]: draft tokens the target accepted


class SpecState(NamedTuple):
    last: Array  # int32[B]: newest token, at position prompt_length - 1 + generated; not yet fed
    extra: Array  # int32[B]: token before `last` the draft has not seen yet (-1: none)
    target_cache: Any
    draft_cache: Any
    target_sampler: SamplerState
    draft_sampler: SamplerState
    prompt_lengths: Array  # int32[B]
    out: Tracker
    drafted: Array  # int32[B]
    accepted: Array  # int32[B]


def _proposal(sampler: Sampler) -> str | None:
    """``"greedy"`` or ``"softmax"``: the distribution the chain's selector draws from; ``None`` if neither.

    Decided by the selector's type, not its name: only :func:`stages.greedy` and
    :func:`stages.categorical` qualify, the rule of this module being exact for them alone.
    """
    from jaxsample import stages

    return {stages.greedy: "greedy", stages.categorical: "softmax"}.get(type(sampler.selector))


def _keys(sparams, position: Array, salt: int) -> Array:
    return _noise.fold_in(_noise.fold_in(request_keys(sparams), position), salt)


def _pick(stacked, index: Array):
    """Row ``b`` of ``stacked[index[b]]`` for a pytree with leading axes ``[T, B, ...]``."""

    def one(x):
        return jnp.take_along_axis(x, index.reshape((1, -1) + (1,) * (x.ndim - 2)), axis=0)[0]

    return jax.tree.map(one, stacked)


def _step(
    target,
    draft,
    sampler,
    draft_sampler,
    cfg: Config,
    k,
    tparams,
    dparams,
    sparams,
    dsparams,
    stops: Stops,
    state,
):
    out = state.out
    b = state.last.shape[0]
    active = ~out.done
    pos = state.prompt_lengths - 1 + out.length
    run_pos = jnp.where(active, pos, -1)
    greedy_target = _proposal(sampler) == "greedy"
    greedy_draft = _proposal(draft_sampler) == "greedy"

    # 1. draft k tokens
    first = jnp.stack([jnp.maximum(state.extra, 0), state.last], axis=1)
    first_pos = jnp.stack([jnp.where(active & (state.extra >= 0), pos - 1, -1), run_pos], axis=1)
    o = draft.apply_step(dparams, first, first_pos, state.draft_cache)

    def draft_one(carry, i):
        logits, cache, sst = carry
        x = _stopping.mask_eos(logits, stops, out.length + i)
        proc, sst = draft_sampler.process(x, sst, dsparams)
        tok, sst = draft_sampler.select(proc, sst, dsparams)
        q = jax.nn.one_hot(tok, proc.shape[-1]) if greedy_draft else _math.softmax(proc)
        sst = draft_sampler.accept(tok, sst, dsparams, active)

        def call():
            d = draft.apply_step(dparams, tok[:, None], jnp.where(active, pos + 1 + i, -1)[:, None], cache)
            return d.logits[:, 0].astype(jnp.float32), d.cache

        logits, cache = lax.cond(i < k - 1, call, lambda: (logits, cache))
        return (logits, cache, sst), (tok, q, sst)

    init = (o.logits[:, 1].astype(jnp.float32), o.cache, state.draft_sampler)
    (_, draft_cache, _), (drafts, q, draft_states) = lax.scan(draft_one, init, jnp.arange(k))
    # drafts int32[k, B]; q float32[k, B, V]; draft_states: state after accepting d_1..d_i, [k, B, ...]

    # 2. target verification: one call over k + 1 tokens, then the full chain position by position
    tokens = jnp.concatenate([state.last[:, None], drafts.T], axis=1)
    positions = jnp.where(active[:, None], pos[:, None] + jnp.arange(k + 1), -1)
    t = target.apply_step(tparams, tokens, positions, state.target_cache)

    def verify_one(sst, xs):
        logits, nxt, j = xs
        x = _stopping.mask_eos(logits.astype(jnp.float32), stops, out.length + j)
        proc, sst = sampler.process(x, sst, sparams)
        return sampler.accept(nxt, sst, sparams, active), (proc, sst)

    nexts = jnp.concatenate([drafts, jnp.zeros((1, b), jnp.int32)], axis=0)  # the last one is never used
    xs = (jnp.swapaxes(t.logits, 0, 1), nexts, jnp.arange(k + 1))
    _, (procs, target_states) = lax.scan(verify_one, state.target_sampler, xs)
    # procs float32[k + 1, B, V]: processed target logits; target_states: chain state after process j

    # 3. rejection sampling
    if greedy_target:
        ok = drafts == jnp.argmax(procs[:k], axis=-1)
    else:
        p = _math.softmax(procs[:k])
        p_d = jnp.take_along_axis(p, drafts[..., None], axis=-1)[..., 0]  # [k, B]
        q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
        u = jax.vmap(lambda i: _noise.uniform(_keys(sparams, out.length + i, _ACCEPT_SALT)))(
            jnp.arange(k)
        )
        ok = (p_d > 0) & (u * q_d <= p_d)
    n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=0), axis=0)  # [B] in 0..k

    proc_a = _pick(procs, n_ok)
    state_a = _pick(target_states, n_ok)
    bonus, selected = sampler.select(proc_a, state_a, sparams)
    final = bonus
    if not greedy_target:
        rejected = n_ok < k
        q_a = _pick(q, jnp.minimum(n_ok, k - 1))
        resid = jnp.maximum(_math.softmax(proc_a) - q_a, 0.0)
        resid_logits = jnp.where(jnp.any(resid > 0, axis=-1, keepdims=True), jnp.log(resid), proc_a)
        recovered = categorical(
            _keys(sparams, out.length + n_ok, _RESIDUAL_SALT), resid_logits
        )
        final = jnp.where(rejected, recovered, bonus)
        selected = where_rows(rejected, state_a, selected)
    target_sampler = where_rows(
        active, sampler.accept(final, selected, sparams, active), state.target_sampler
    )
    all_draft_states = jax.tree.map(
        lambda s0, s: jnp.concatenate([s0[None], s], axis=0), state.draft_sampler, draft_states
    )
    draft_a = draft_sampler.accept(final, _pick(all_draft_states, n_ok), dsparams, active)
    draft_sampler_state = where_rows(active, draft_a, state.draft_sampler)

    # 4. emit d_1..d_{n_ok} and the final token, through the stopping rules
    new_out = out
    for j in range(k + 1):
        tok = jnp.where(j < n_ok, drafts[min(j, k - 1)], final)
        new_out = _stopping.push(new_out, stops, jnp.where(active, tok, cfg.pad_id), active & (j <= n_ok))
    extra = jnp.where(n_ok == k, drafts[k - 1], -1)
    return SpecState(
        jnp.where(active, final, state.last),
        jnp.where(active, extra, state.extra),
        t.cache,
        draft_cache,
        target_sampler,
        draft_sampler_state,
        state.prompt_lengths,
        new_out,
        state.drafted + jnp.where(active, k, 0),
        state.accepted + jnp.where(active, n_ok, 0),
    )


def _decode(
    target,
    draft,
    sampler,
    draft_sampler,
    cfg,
    k,
    tparams,
    dparams,
    prompt,
    lengths,
    tcache,
    dcache,
    sparams,
    dsparams,
    stops,
):
    b, p = prompt.shape
    if tcache is None:
        tcache = target.init_cache(b, cfg.cache_len)
    if dcache is None:
        dcache = draft.init_cache(b, cfg.cache_len)
    tokens, positions = prompt_positions(prompt, lengths - 1)  # everything but the last prompt token
    t = target.apply_step(tparams, tokens, positions, tcache)
    tcache, v = t.cache, t.logits.shape[-1]
    dcache = draft.apply_step(dparams, tokens, positions, dcache).cache
    last = jnp.take_along_axis(prompt, (lengths - 1)[:, None], axis=1)[:, 0]
    history = jnp.where(jnp.arange(p) < lengths[:, None], prompt, -1)
    tsst = sampler.init(sparams, vocab_size=v, prompt=history, history_size=cfg.history_size)
    dsst = draft_sampler.init(dsparams, vocab_size=v, prompt=history, history_size=cfg.history_size)
    out = _stopping.tracker(stops, cfg.max_tokens, cfg.pad_id, None)
    zeros = jnp.zeros((b,), jnp.int32)
    state = SpecState(
        last, jnp.full((b,), -1, jnp.int32), tcache, dcache, tsst, dsst, lengths, out, zeros, zeros
    )
    body = functools.partial(
        _step, target, draft, sampler, draft_sampler, cfg, k, tparams, dparams, sparams, dsparams, stops
    )
    state = lax.while_loop(lambda s: ~jnp.all(s.out.done), body, state)
    o = state.out
    return SpeculativeOutput(o.tokens, o.length, o.reason, state.drafted, state.accepted)


_decode_jit = jax.jit(_decode, static_argnums=(0, 1, 2, 3, 4, 5))


def speculate(
    target, target_params, draft, draft_params, prompt, prompt_lengths, opts: DecodingOptions, *,
    target_cache=None, draft_cache=None, draft_sampler=None, draft_sampler_params=None, attention_mask=None,
    mesh=None,
) -> SpeculativeOutput:
    """Speculative decoding from validated options (``num_draft_tokens``; see :func:`speculative_generate`)."""
    if opts.num_draft_tokens is None:
        raise ValueError("speculative decoding needs num_draft_tokens")
    k = opts.num_draft_tokens
    draft = adapters.as_model(draft, "draft")
    for name, m in (("target", adapters.as_model(target, "target")), ("draft", draft)):
        if m.lockstep:
            raise ValueError(
                f"{name} is a shared-index model (one cache write index for the batch): speculative decoding "
                "advances rows by different numbers of tokens and rewinds, which such a cache cannot do"
            )
    if draft_cache is None and draft.init_cache is None:
        raise ValueError("pass draft_cache or a draft model with init_cache")
    req = prepare(target, target_params, prompt, prompt_lengths, opts.replace(logprobs=False, top_logprobs=0),
                  cache=target_cache, attention_mask=attention_mask, mesh=mesh, extra_positions=k + 1, name="target")
    b = req.prompt.shape[0]
    adapters.check_model(draft, draft_params, req.prompt, draft_cache, req.cfg.cache_len, "draft")
    if draft_sampler is None:
        draft_sampler = req.sampler
        draft_sampler_params = req.sampler_params if draft_sampler_params is None else draft_sampler_params
    draft_sampler, dsparams = _request.sampler_inputs(draft_sampler, draft_sampler_params, b)
    for role, chain in (("sampler", req.sampler), ("draft_sampler", draft_sampler)):
        if _proposal(chain) is None:
            raise ValueError(
                f"{role}: speculative decoding is exact only for the selectors stages.greedy() and "
                f"stages.categorical() (tokens drawn from softmax of the processed logits); selector "
                f"{chain.selector.name!r} (e.g. mirostat, adaptive-p) draws from another distribution"
            )
    dsparams = dict(dsparams, seed=dsparams["seed"] ^ jnp.int32(_DRAFT_SEED_SALT))
    cfg = req.cfg
    if draft_sampler.history_size() == -1 and cfg.history_size is None:
        cfg = cfg._replace(history_size=cfg.cache_len)
    s = cfg.batch_sharding
    out = _decode_jit(
        req.model,
        draft,
        req.sampler,
        draft_sampler,
        cfg,
        k,
        sharding.replicate(target_params, s),
        sharding.replicate(draft_params, s),
        req.prompt,
        req.lengths,
        req.cache,
        sharding.place_rows(draft_cache, s) if draft_cache is not None else None,
        req.sampler_params,
        sharding.place_rows(dsparams, s),
        req.stops,
    )
    return fill_pad(out, req.pad_id)


def speculative_generate(
    target: Any,
    target_params: Any,
    draft: Any,
    draft_params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    num_draft_tokens: int,
    max_new_tokens: ArrayLike,
    draft_sampler: Sampler | None = None,
    draft_sampler_params: Mapping[str, ArrayLike] | None = None,
    target_cache: Any = None,
    draft_cache: Any = None,
    attention_mask: ArrayLike | None = None,
    mesh: Any = None,
    **kwargs: Any,
) -> SpeculativeOutput:
    """Generates with the target's sampler, drafting ``num_draft_tokens`` tokens per target call.

    Args:
      target, target_params: the model whose distribution is sampled.
      draft, draft_params: the proposal model (same vocabulary).
      num_draft_tokens: static ``k >= 1``.
      sampler, sampler_params: the target chain (greedy by default) and its per-row values.
      draft_sampler, draft_sampler_params: the draft chain (default: the target's) and values
        (default: the target's; seeds are salted either way).
      target_cache, draft_cache: prebuilt caches (default ``init_cache(B, P + N + k + 1)``).
      Other arguments: as :func:`jaxsample.decoding.generate`. Shared-index models (one cache write
      index for the batch) are refused: rows advance by different numbers of tokens.

    Returns:
      :class:`SpeculativeOutput`.
    """
    from jaxsample.decoding.generate import options_from

    opts = options_from(kwargs.pop("options", None),
                        dict(kwargs, num_draft_tokens=num_draft_tokens, max_new_tokens=max_new_tokens))
    return speculate(target, target_params, draft, draft_params, prompt, prompt_lengths, opts,
                     target_cache=target_cache, draft_cache=draft_cache, draft_sampler=draft_sampler,
                     draft_sampler_params=draft_sampler_params, attention_mask=attention_mask, mesh=mesh)
