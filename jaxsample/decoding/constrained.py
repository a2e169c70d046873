"""Constrained beam search (HF ``force_words_ids`` / ``constraints``): phrasal and disjunctive
constraints with the bank-based beam allocation of HuggingFace's ``ConstrainedBeamSearchScorer``.

Each beam carries HF's ``ConstraintListState`` as fixed-shape integers
(:mod:`jaxsample.decoding.constraints`, exact to HF, quirks included); the prompt's tokens count
(HF resets the state from ``input_ids``).

One step, per prompt (``K`` beams, all shapes static):

1. processed log-probs as in :func:`jaxsample.decoding.beam_search`; the ``C = max(2, 1 + E) * K``
   best continuations; EOS among the first ``K`` finishes a hypothesis only if its beam has
   fulfilled every constraint; the ``K`` best non-EOS continuations are the "top-k" candidates;
2. every beam proposes its "advance" tokens (the next tokens of the constraint in progress, else
   the first tokens of every pending constraint), scored from the full accumulated scores;
   proposals that duplicate a candidate sequence (or an earlier proposal) are dropped;
3. every candidate's bank is ``complete * max_len + (max_len - remaining)`` (in progress); the
   candidates are sorted by ``bank * 100 + score``, and the new beams are taken round-robin over
   runs of equal banks (HF's ``increments`` / mergesort), best first, ``K`` of them;
4. HF's ``BeamHypotheses`` rules (those of :func:`group_beam_search`) decide when a prompt is done;
   at ``max_new_tokens`` the beams that fulfil the constraints become hypotheses, and, if fewer than
   ``num_return_sequences`` do, all the other beams too (HF's ``finalize`` fallback).

Proposals get HF's banks, including the aliasing of ``DisjunctiveConstraint.copy(stateful=True)``
(:func:`jaxsample.decoding.constraints.proposal_states`). Deliberate differences from HF: ties in
step 3 are broken stably (top-k candidates first, then proposals in beam order; torch's unstable
sort leaves them unspecified); stop sequences are supported (a hypothesis ending in one must fulfil
the constraints including its last token).

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.1, 0.5, 0.3, 0.1], [0.6, 0.2, 0.1, 0.1], [0.5, 0.2, 0.2, 0.1],
...                            [0.7, 0.1, 0.1, 0.1]]))
>>> out = constrained_beam_search(BIGRAM, {"logits": table}, jnp.array([[1]]), num_beams=2,
...                               force_words_ids=[[3]], max_new_tokens=4, eos_ids=0)
>>> out.tokens[0, 0].tolist()
[3, 0, 0, 0]
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, SamplerState
from jaxsample.decoding._stopping import FinishReason, Stops
from jaxsample.decoding.constraints import (
    ConstraintState,
    Tries,
    add,
    advance,
    as_constraints,
    bank,
    build_tries,
    completed,
    init_state,
    proposal_states,
)
from jaxsample.decoding.beam import (
    _BIG,
    BeamOutput,
    Finished,
    _best,
    _expand,
    _finish_at_length,
    _is_done,
    _merge,
    _no_hypotheses,
    _penalty,
    _start,
)
from jaxsample.decoding.loop import Config, fill_pad, prepare
from jaxsample.decoding.options import DecodingOptions
from jaxsample.decoding.model import Model, take_rows, where_rows

class ConstrainedConfig(NamedTuple):
    decode: Config
    num_beams: int
    num_return: int
    early_stopping: bool | str
    normalization: str
    num_eos: int
    tables: Tries


class ConstrainedState(NamedTuple):
    step: Array
    logits: Array  # float32[B * K, V]
    cache: Any
    sampler: SamplerState
    run_scores: Array  # float32[B, K]
    run_tokens: Array  # int32[B, K, N]
    run_beams: Array  # int32[B, K, N]: HF beam_indices of each running hypothesis
    constraint: ConstraintState  # [B, K]
    finished: Finished  # [B, K]
    done: Array  # bool[B]
    prompt_lengths: Array


def _take(x: Array, idx: Array) -> Array:
    """``x[b, idx[b, j]]`` for ``x [B, M, ...]`` and ``idx [B, J]``."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def _take_cols(x: Array, idx: Array) -> Array:
    """``x[b, i, idx[b, j]]`` for ``x [B, I, M]`` and ``idx [B, J]`` -> ``[B, I, J]``."""
    return jnp.take_along_axis(x, jnp.broadcast_to(idx[:, None, :], (x.shape[0], x.shape[1], idx.shape[1])), axis=2)


def _take_state(st: ConstraintState, idx: Array) -> ConstraintState:
    return ConstraintState(*(_take(x, idx) for x in st))


def _allocate(tb: Tries, scores, tokens, parents, states, valid, k: int):
    """HF ``step_sentence_constraint``'s selection over ``M`` candidates ``[B, M]`` in HF order."""
    b, m = scores.shape
    banks = bank(tb, states)
    zipped = banks.astype(jnp.float32) * 100.0 + scores
    pos = jnp.broadcast_to(jnp.arange(m), (b, m))
    order = jnp.lexsort((pos, -zipped, ~valid), axis=-1)  # valid first, zipped descending, stable
    s_bank, s_valid = _take(banks, order), _take(valid, order)
    change = jnp.concatenate([jnp.ones((b, 1), bool), s_bank[:, 1:] != s_bank[:, :-1]], axis=1)
    run_start = lax.cummax(jnp.where(change, pos, 0), axis=1)
    inc = jnp.where(s_valid, pos - run_start, m)
    pick = _take(order, jnp.lexsort((pos, inc), axis=-1)[:, :k])
    return _take(scores, pick), _take(tokens, pick), _take(parents, pick), _take_state(states, pick)


def _step(model: Model, sampler: Sampler, cfg: ConstrainedConfig, params, sparams, stops: Stops, alpha, state):
    tb = cfg.tables
    b, k = state.run_scores.shape
    n = state.run_tokens.shape[-1]
    t = state.step
    logp = _math.log_softmax(state.logits)
    v = logp.shape[-1]
    eos_hot = jnp.any(jnp.arange(v) == stops.eos_ids[:, :, None], axis=1)  # [B, V]
    logp = jnp.where(jnp.repeat(eos_hot & (t < stops.min_new_tokens)[:, None], k, axis=0), _math.NEG_INF, logp)
    x, sst = sampler.process(logp, state.sampler, sparams)
    acc = x.reshape(b, k, v) + state.run_scores[..., None]

    # 1. the C best continuations; EOS among the first K finishes a hypothesis if constraints are met
    c = min(max(2, 1 + cfg.num_eos) * k, k * v)
    cand, idx = lax.top_k(acc.reshape(b, k * v), c)
    row0 = jnp.arange(b) * k
    parent, token, seqs, beams, eos, stop = _expand(state.run_tokens, state.run_beams, idx, v, row0, t, stops)
    gen = t + 1
    terminal = eos | stop
    parent_state = _take_state(state.constraint, parent)
    child_state = add(tb, parent_state, token)
    fulfilled = jnp.where(eos, completed(parent_state), completed(child_state))
    pen_now = _penalty(gen, alpha, cfg.normalization)[:, None]
    gen_c = jnp.full((b, c), gen, jnp.int32)
    reason = jnp.where(eos, int(FinishReason.EOS), int(FinishReason.STOP_SEQUENCE))
    finishing = terminal & (jnp.arange(c) < k) & fulfilled
    fin = _merge(
        state.finished,
        Finished(jnp.where(finishing, cand / pen_now, -jnp.inf), seqs, gen_c, reason, finishing, beams),
    )
    _, j = lax.top_k(jnp.where(terminal, -jnp.inf, cand), k)
    top = (_take(cand, j), _take(token, j), _take(parent, j), _take_state(child_state, j))

    # 2. advance proposals of every beam, without duplicates of candidates or earlier proposals
    valid, key = advance(tb, state.constraint)  # [B, K, E]
    e = valid.shape[-1]
    a_tok = jnp.broadcast_to(jnp.asarray(tb.token), (b, k, e))
    a_score = jnp.take_along_axis(acc, a_tok, axis=2)
    a_parent = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :, None], (b, k, e))
    same = jnp.all(state.run_tokens[:, :, None] == state.run_tokens[:, None, :], axis=-1)  # [B, K, K]
    flat = lambda x: x.reshape(b, k * e)  # noqa: E731
    a_tok, a_score, a_parent, valid, key = flat(a_tok), flat(a_score), flat(a_parent), flat(valid), flat(key)
    same_seq = _take(same, a_parent)  # [B, KE, K]: proposal's beam has the same sequence as beam k'
    dup_top = jnp.any((top[1][:, None, :] == a_tok[:, :, None]) & _take_cols(same_seq, top[2]), axis=2)
    before = (a_parent[:, None, :] < a_parent[:, :, None]) | (
        (a_parent[:, None, :] == a_parent[:, :, None]) & (key[:, None, :] < key[:, :, None])
    )  # [B, i, j]: proposal j comes before proposal i
    earlier = valid[:, None, :] & (a_tok[:, None, :] == a_tok[:, :, None]) & _take_cols(same_seq, a_parent) & before
    valid = valid & ~dup_top & ~jnp.any(earlier, axis=2)
    a_state = proposal_states(tb, state.constraint, jnp.broadcast_to(jnp.asarray(tb.token), (b, k, e)))
    a_state = ConstraintState(*(x.reshape((b, k * e) + x.shape[3:]) for x in a_state))

    # 3. banks: HF order (top-k candidates, then proposals by beam and advance order)
    prop = jnp.lexsort((key, a_parent, ~valid), axis=-1)
    cat = lambda x, y: jnp.concatenate([x, _take(y, prop)], axis=1)  # noqa: E731
    new_scores, new_token, new_parent, new_state = _allocate(
        tb,
        cat(top[0], a_score),
        cat(top[1], a_tok),
        cat(top[2], a_parent),
        ConstraintState(*(cat(x, y) for x, y in zip(top[3], a_state))),
        cat(jnp.ones((b, k), bool), valid),
        k,
    )
    new_tokens = jnp.where(jnp.arange(n) == t, new_token[..., None], _take(state.run_tokens, new_parent))
    new_beams = jnp.where(
        jnp.arange(n) == t, (row0[:, None] + new_parent)[..., None], _take(state.run_beams, new_parent)
    )

    # 4. HF BeamHypotheses.is_done, then finalize at max_new_tokens
    done = _is_done(fin, cand[:, 0], gen, alpha, stops, cfg.early_stopping, cfg.normalization)
    ok = completed(new_state)
    at_last = (gen >= stops.max_new_tokens) & ~done
    ended = at_last[:, None] & (ok | (jnp.sum(ok, axis=1, keepdims=True) < cfg.num_return))
    fin = _finish_at_length(fin, ended, new_scores / pen_now, new_tokens, gen, new_beams)
    done = done | (gen >= stops.max_new_tokens)

    # frozen prompts keep everything
    was = state.done
    keep = lambda new, old: jnp.where(was.reshape((b,) + (1,) * (new.ndim - 1)), old, new)  # noqa: E731
    new_parent = keep(new_parent, jnp.broadcast_to(jnp.arange(k), (b, k)))
    new_token = keep(new_token, jnp.full((b, k), cfg.decode.pad_id))
    fin = Finished(*(keep(x, y) for x, y in zip(fin, state.finished)))
    run_scores = keep(new_scores, state.run_scores)
    run_tokens = keep(new_tokens, state.run_tokens)
    run_beams = keep(new_beams, state.run_beams)
    cstate = ConstraintState(*(keep(x, y) for x, y in zip(new_state, state.constraint)))
    done = was | done

    rows = (jnp.arange(b)[:, None] * k + new_parent).reshape(-1)
    active = jnp.repeat(~was, k)
    flat_token = new_token.reshape(-1)
    sst = where_rows(active, sampler.accept(flat_token, take_rows(sst, rows), sparams, active), state.sampler)
    cache = take_rows(state.cache, rows)
    running = jnp.repeat(~done, k)
    position = jnp.where(running, jnp.repeat(state.prompt_lengths, k) + t, -1)

    def call():
        o = model.apply_step(params, flat_token[:, None], position[:, None], cache)
        return o.logits[:, 0].astype(jnp.float32), o.cache

    logits, cache = lax.cond(jnp.any(running), call, lambda: (state.logits, cache))
    return ConstrainedState(t + 1, logits, cache, sst, run_scores, run_tokens, run_beams, cstate, fin, done,
                            state.prompt_lengths)


def _prompt_state(tb: Tries, prompt: Array, lengths: Array) -> ConstraintState:
    """HF resets each beam's state from ``input_ids``: the prompt's tokens count."""

    def body(st, i):
        new = add(tb, st, jnp.maximum(prompt[:, i], 0))
        return where_rows(i < lengths, new, st), None

    st, _ = lax.scan(body, init_state(tb, (prompt.shape[0],)), jnp.arange(prompt.shape[1]))
    return st


def _search(model, sampler, cfg: ConstrainedConfig, params, prompt, lengths, cache, sparams, stops, alpha):
    dc, k = cfg.decode, cfg.num_beams
    b = prompt.shape[0]
    logits, cache, rows_params, sst = _start(model, sampler, dc, params, prompt, lengths, cache, sparams, k)
    n = dc.max_tokens
    cst = _prompt_state(cfg.tables, prompt, lengths)
    cst = ConstraintState(*(jnp.repeat(x[:, None], k, axis=1) for x in cst))
    finished = _no_hypotheses(b, k, n, dc.pad_id)
    state = ConstrainedState(
        jnp.int32(0),
        logits,
        cache,
        sst,
        jnp.where(jnp.arange(k) == 0, 0.0, _BIG) * jnp.ones((b, 1)),
        jnp.full((b, k, n), dc.pad_id, jnp.int32),
        jnp.full((b, k, n), -1, jnp.int32),
        cst,
        finished,
        stops.max_new_tokens <= 0,
        lengths,
    )
    body = functools.partial(_step, model, sampler, cfg, params, rows_params, stops, alpha)
    state = lax.while_loop(lambda st: ~jnp.all(st.done), body, state)
    return _best(state.finished, cfg.num_return)


_search_jit = jax.jit(_search, static_argnums=(0, 1, 2))


def constrained_beam_search(
    model: Model,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    num_beams: int,
    max_new_tokens: ArrayLike,
    constraints=None,
    force_words_ids=None,
    max_tokens: int | None = None,
    length_penalty: ArrayLike = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    length_normalization: str = "hf",
    sampler: Sampler | None = None,
    sampler_params: Mapping[str, ArrayLike] | None = None,
    eos_ids: ArrayLike | None = None,
    stop_sequences=None,
    min_new_tokens: ArrayLike = 0,
    pad_id: int | None = None,
    cache: Any = None,
    history_size: int | None = None,
    attention_mask: ArrayLike | None = None,
) -> BeamOutput:
    """Constrained beam search (HF ``constraints`` / ``force_words_ids``), one jitted ``while_loop``.

    Args:
      constraints, force_words_ids: see :func:`as_constraints` (static: new words recompile).
      num_beams: static ``K >= 2`` (as HF).
      Other arguments: as :func:`jaxsample.decoding.beam_search` (no sampling, no groups, as HF).

    Returns:
      :class:`BeamOutput` ``[B, R]``: the hypotheses that fulfil every constraint, unless too few
      exist at ``max_new_tokens`` (then HF's fallback adds the unconstrained beams).
    """
    cons = as_constraints(constraints, force_words_ids)
    if not cons:
        raise ValueError("constrained_beam_search needs at least one constraint (constraints or force_words_ids)")
    k = _validate.static_int(num_beams, "num_beams", lo=2)
    r = _validate.static_int(num_return_sequences, "num_return_sequences", lo=1)
    if r > k:
        raise ValueError(f"num_return_sequences ({r}) must be <= num_beams ({k})")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if length_normalization not in ("hf", "gnmt"):
        raise ValueError(f"length_normalization must be 'hf' or 'gnmt', got {length_normalization!r}")
    opts = DecodingOptions(max_new_tokens=max_new_tokens, max_tokens=max_tokens, sampler=sampler,
                           sampler_params=sampler_params, eos_ids=eos_ids, stop_sequences=stop_sequences,
                           min_new_tokens=min_new_tokens, pad_id=pad_id, history_size=history_size)
    req = prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask)
    alpha = _validate.param(length_penalty, (req.prompt.shape[0],), "length_penalty")
    cfg = ConstrainedConfig(
        req.cfg, k, r, early_stopping, length_normalization, int(req.stops.eos_ids.shape[-1]), build_tries(cons)
    )
    out = _search_jit(
        req.model, req.sampler, cfg, params, req.prompt, req.lengths, req.cache, req.sampler_params, req.stops, alpha
    )
    return fill_pad(out, req.pad_id)
