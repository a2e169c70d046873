"""Beam search, beam sampling and diverse (group) beam search with HuggingFace semantics.

Beams are part of the batch: ``B`` prompts with ``K`` beams are ``B * K`` model rows (beam ``k`` of
prompt ``b`` is row ``b * K + k``), shapes never change, and after each step every cache leaf and
the sampler state are gathered by parent beam (``leaf[rows]``). One step, per prompt:

1. ``log_softmax`` of the model logits; EOS masked until ``min_new_tokens``; the sampler's stages run
   on these **log-probabilities** (HF: "processors receive log-probs in beam methods"; the chain's
   selector is not used).
2. Accumulated scores ``[K * V]``; ``C = max(2, 1 + E) * K`` candidates (``E`` EOS slots): the top
   ``C`` (search) or ``C`` draws without replacement from ``softmax(accumulated)`` by Gumbel-top-k
   (``beam_sample``, HF's ``multinomial`` over the accumulated scores after warpers).
3. Candidates ending in EOS / a stop sequence, or reaching ``max_new_tokens``, leave the running set
   (``-1e9``); the ``K`` best others run on. Finished candidates among the first ``K`` are scored
   ``sum_logprobs / pen(generated_len)`` (EOS included) and merged into the ``K`` best finished.
4. Early stopping per prompt, HF's rules: ``True`` stops once ``K`` hypotheses are finished;
   ``False`` once the best running score, normalised at the current length, cannot beat the worst
   finished one; ``"never"`` uses ``max_new_tokens`` as that length when ``length_penalty > 0``.

``pen(L)`` is HF's ``L ** length_penalty``, GNMT's ``((5 + L) / 6) ** length_penalty`` (t5x), or
vLLM's ``(P + L - e) ** length_penalty`` (``get_beam_search_score``: the prompt length ``P`` counts
and a final EOS does not, ``e = 1`` for a hypothesis ending in EOS).
Finished prompts are frozen (no cache writes); the loop ends when every prompt is done.

:func:`group_beam_search` splits the beams into ``G`` groups processed one after another each step;
group ``g`` subtracts ``diversity_penalty * count`` from the log-probs of tokens chosen at this step
by groups ``< g`` (HF ``HammingDiversityLogitsProcessor``), and each group keeps its own finished
hypotheses with HF's in-tree ``BeamSearchScorer`` rules (transformers <= 4.55): EOS among the first
``group_size`` candidates finishes a hypothesis, the first ``group_size`` other candidates run on, a
group is done once full and unable to improve (judged on the best candidate score), and at
``max_new_tokens`` the running beams of unfinished groups are added as hypotheses.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4]]))
>>> out = beam_search(BIGRAM, {"logits": table}, jnp.array([[2]]), num_beams=2, max_new_tokens=3,
...                   eos_ids=0, num_return_sequences=2, length_penalty=0.0)
>>> out.tokens.tolist(), out.lengths.tolist()
([[[0, 0, 0], [1, 0, 0]]], [[1, 2]])
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _math, _noise, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, SamplerState, request_keys
from jaxsample.decoding import _stopping, sharding
from jaxsample.decoding._stopping import FinishReason, Stops
from jaxsample.decoding.loop import Config, fill_pad, prefill, prepare
from jaxsample.decoding.model import Model, repeat_params, repeat_rows, take_rows, where_rows
from jaxsample.decoding.options import DecodingOptions

_BIG = -1.0e9  # HF's "impossible" score (used instead of -inf so that arithmetic matches HF)
_SAMPLE_SALT = 0x0BEA5A3


class BeamOutput(NamedTuple):
    """The best ``R`` finished hypotheses per prompt, best first."""

    tokens: Array  # int32[B, R, N]: generated tokens (EOS / stop sequence included), pad_id after
    lengths: Array  # int32[B, R]
    scores: Array  # float32[B, R]: sum of log-probs / pen(length) (HF ``sequences_scores``)
    finish_reason: Array  # int32[B, R]: FinishReason
    beam_indices: Array  # int32[B, R, N]: HF ``beam_indices``: the row ``b * K + k`` whose logits chose token t; -1 after


class BeamConfig(NamedTuple):
    """Static configuration."""

    decode: Config
    num_beams: int
    num_groups: int
    num_return: int
    early_stopping: bool | str
    normalization: str  # "hf" | "gnmt" | "vllm"
    do_sample: bool
    num_eos: int  # EOS slots E: C = max(2, 1 + E) * group_size candidates


class Finished(NamedTuple):
    """Finished hypotheses of one group (``S`` slots per prompt)."""

    scores: Array  # float32[B, S] (-1e9 while empty)
    tokens: Array  # int32[B, S, N]
    length: Array  # int32[B, S]
    reason: Array  # int32[B, S]
    flag: Array  # bool[B, S]: slot holds a finished hypothesis (HF is_sent_finished)
    beams: Array  # int32[B, S, N]: beam index (b * K + k) of each token's parent row, -1 after the length


class BeamState(NamedTuple):
    step: Array  # int32[]: tokens generated so far (same for every beam)
    logits: Array  # float32[B * K, V]
    cache: Any  # rows B * K
    sampler: SamplerState  # rows B * K
    run_scores: Array  # float32[B, K]: accumulated processed log-probs of the running beams
    run_tokens: Array  # int32[B, K, N]
    run_beams: Array  # int32[B, K, N]: beam_indices of the running beams
    finished: Finished  # [B, K] slots, group-major (group g owns slots g*S .. (g+1)*S - 1)
    done: Array  # bool[B, G]: the group of this prompt takes no more hypotheses
    prompt_lengths: Array  # int32[B]


def _penalty(length: Array, alpha: Array, normalization: str, prompt_len=0, eos=False) -> Array:
    """``pen(L)`` of ``length`` generated tokens (vLLM: ``prompt_len + length - eos``)."""
    if normalization == "vllm":
        length = prompt_len + length - jnp.asarray(eos, jnp.int32)
    length = jnp.asarray(length).astype(jnp.float32)
    base = (5.0 + length) / 6.0 if normalization == "gnmt" else length
    return jnp.power(base, alpha)


def _merge(fin: Finished, new: Finished) -> Finished:
    """Keeps the ``S`` best of the finished slots and new entries ``[B, C, ...]`` (ties: old first)."""
    both = Finished(*(jnp.concatenate([o, n], axis=1) for o, n in zip(fin, new)))
    _, j = lax.top_k(both.scores, fin.scores.shape[1])
    return Finished(*(jnp.take_along_axis(x, j.reshape(j.shape + (1,) * (x.ndim - 2)), axis=1) for x in both))


def _finish_at_length(fin: Finished, ended: Array, scores: Array, tokens: Array, gen, beams: Array) -> Finished:
    """``fin`` with the running beams ``ended [B, S]`` added as ``gen``-token hypotheses cut by length.

    ``scores [B, S]`` are already divided by the length penalty; ``tokens``, ``beams``: ``[B, S, N]``.
    """
    shape = ended.shape
    length = jnp.full(shape, gen, jnp.int32)
    reason = jnp.full(shape, int(FinishReason.LENGTH))
    return _merge(fin, Finished(jnp.where(ended, scores, -jnp.inf), tokens, length, reason, ended, beams))


def _is_done(fin: Finished, best, gen, alpha, stops: Stops, early_stopping, normalization: str, plen=0,
             legacy: bool = True) -> Array:
    """``bool[B]``: no running beam can beat the finished ones (HF ``BeamHypotheses.is_done`` if
    ``legacy``, else ``_check_early_stop_heuristic``); ``best [B]`` is the best running score."""
    hyp_len = gen
    if early_stopping == "never":
        hyp_len = jnp.where(alpha > 0, stops.max_new_tokens, gen)
    best_possible = best / _penalty(hyp_len, alpha, normalization, plen)
    full = jnp.all(fin.flag, axis=1)
    if legacy:
        cannot_improve = full & (jnp.min(fin.scores, axis=1) >= best_possible)
    else:
        worst = jnp.where(fin.flag, jnp.min(fin.scores, axis=1, keepdims=True), _BIG)
        cannot_improve = ~jnp.any(best_possible[:, None] > worst, axis=1)
    return cannot_improve | (full & (early_stopping is True))


def _expand(run_tokens: Array, run_beams: Array, idx: Array, v: int, row0: Array, t, stops: Stops):
    """The candidates ``idx [B, C]`` (``parent * V + token``) of the running beams ``[B, S, N]`` at step ``t``.

    Returns ``parent, token int32[B, C]``, the candidates' ``tokens`` and ``beam_indices [B, C, N]``
    (``row0 [B]``: each prompt's first row), and ``eos, stop bool[B, C]``: the candidate ends with
    an EOS id / a stop sequence (never before ``min_new_tokens``; ``stop`` excludes ``eos``).
    """
    b, c = idx.shape
    n = run_tokens.shape[-1]
    parent, token = (idx // v).astype(jnp.int32), (idx % v).astype(jnp.int32)
    now = jnp.arange(n) == t
    seqs = jnp.where(now, token[..., None], jnp.take_along_axis(run_tokens, parent[..., None], axis=1))
    beams = jnp.take_along_axis(run_beams, parent[..., None], axis=1)
    beams = jnp.where(now, (row0[:, None] + parent)[..., None], beams)
    gen = t + 1
    may_stop = (gen >= stops.min_new_tokens)[:, None]
    eos = may_stop & _stopping.is_eos(token, stops.eos_ids[:, None, :])
    width = _stopping.window_width(stops)
    window = _stopping.last_tokens(seqs.reshape(b * c, n), jnp.full((b * c,), gen), width).reshape(b, c, width)
    stop = may_stop & ~eos & _stopping.stop_hits(window, stops, stops.stop_sequences[:, None], target_axis=True)
    return parent, token, seqs, beams, eos, stop


def _start(model, sampler, dc: Config, params, prompt: Array, lengths: Array, cache, sparams, k: int):
    """Prefills ``prompt [B, P]`` and repeats each prompt's row for its ``k`` beams (rows ``b * k + i``).

    Returns ``(logits float32[B * K, V], cache, sampler params, sampler state)``, all ``B * K`` rows.
    """
    logits, cache, _ = prefill(model, params, prompt, lengths, cache, dc.cache_len, dc.batch_sharding)
    logits, cache, rows_prompt, rows_len = repeat_rows((logits, cache, prompt, lengths), k)
    rows_params = repeat_params(sampler, sparams, k)
    history = jnp.where(jnp.arange(prompt.shape[1]) < rows_len[:, None], rows_prompt, -1)
    sst = sampler.init(rows_params, vocab_size=logits.shape[-1], prompt=history, history_size=dc.history_size)
    return logits, cache, rows_params, sst


def _no_hypotheses(b: int, k: int, n: int, pad_id: int) -> Finished:
    """``k`` empty hypothesis slots ``[B, K]`` per prompt, for ``n``-token sequences."""
    return Finished(
        jnp.full((b, k), _BIG),
        jnp.full((b, k, n), pad_id, jnp.int32),
        jnp.zeros((b, k), jnp.int32),
        jnp.zeros((b, k), jnp.int32),
        jnp.zeros((b, k), bool),
        jnp.full((b, k, n), -1, jnp.int32),
    )


def _best(fin: Finished, r: int) -> BeamOutput:
    """The ``r`` best hypotheses ``[B, R]`` of each prompt, best first (empty slots: ``NOT_FINISHED``)."""
    scores, j = lax.top_k(fin.scores, r)
    pick = lambda x: jnp.take_along_axis(x, j.reshape(j.shape + (1,) * (x.ndim - 2)), axis=1)  # noqa: E731
    reason = jnp.where(pick(fin.flag), pick(fin.reason), int(FinishReason.NOT_FINISHED))
    length = pick(fin.length)
    beams = jnp.where(jnp.arange(fin.tokens.shape[-1]) < length[..., None], pick(fin.beams), -1)
    return BeamOutput(pick(fin.tokens), length, scores, reason, beams)


class _GroupStep(NamedTuple):
    parent: Array  # int32[B, S]: parent beam (within the group) of each new running beam
    token: Array  # int32[B, S]
    run_scores: Array  # float32[B, S]
    run_tokens: Array  # int32[B, S, N]
    run_beams: Array  # int32[B, S, N]
    finished: Finished
    done: Array  # bool[B]


def _group_step(
    cfg: BeamConfig, legacy: bool, t, logp, run_scores, run_tokens, run_beams, row0, fin, stops: Stops, alpha, key,
    plen,
):
    """One beam step of one group: ``logp [B, S, V]`` processed log-probs of its running beams."""
    b, s, v = logp.shape
    c = min(max(2, 1 + cfg.num_eos) * s, s * v)  # HF: (1 + n_eos) * S candidates, at least 2 * S
    acc = (logp + run_scores[..., None]).reshape(b, s * v)
    if key is None:
        cand, idx = lax.top_k(acc, c)
    else:  # Gumbel-top-k: C draws without replacement, in draw order
        noisy = jnp.where(acc > -jnp.inf, acc + _noise.gumbel_all(key, s * v), -jnp.inf)
        _, idx = lax.top_k(noisy, c)
        cand = jnp.take_along_axis(acc, idx, axis=1)
    parent, token, seqs, beams, eos, stop = _expand(run_tokens, run_beams, idx, v, row0, t, stops)
    gen = t + 1
    terminal = eos | stop
    at_last = (gen >= stops.max_new_tokens)[:, None]
    reason = jnp.where(
        eos, int(FinishReason.EOS), jnp.where(stop, int(FinishReason.STOP_SEQUENCE), int(FinishReason.LENGTH))
    )
    first = jnp.arange(c) < s  # only the first S candidates may finish
    pen_now = _penalty(gen, alpha[:, None], cfg.normalization, plen[:, None], eos)  # [B, C]
    pen_run = _penalty(gen, alpha[:, None], cfg.normalization, plen[:, None])  # [B, 1]: no EOS
    gen_c = jnp.full((b, c), gen, jnp.int32)

    if legacy:
        _, j = lax.top_k(jnp.where(terminal, -jnp.inf, cand), s)
        new_scores = jnp.take_along_axis(cand, j, axis=1)
        add = terminal & first
        fin = _merge(fin, Finished(jnp.where(add, cand / pen_now, -jnp.inf), seqs, gen_c, reason, add, beams))
        best = cand[:, 0] if key is None else jnp.max(cand, axis=1)
    else:
        hits = terminal | at_last
        masked = cand + hits.astype(jnp.float32) * _BIG
        new_scores, j = lax.top_k(masked, s)
        just = hits & first
        fin = _merge(
            fin, Finished(cand / pen_now + (~just).astype(jnp.float32) * _BIG, seqs, gen_c, reason, just, beams)
        )
        best = new_scores[:, 0]

    done = _is_done(fin, best, gen, alpha, stops, cfg.early_stopping, cfg.normalization, plen, legacy)
    new_parent = jnp.take_along_axis(parent, j, axis=1)
    new_token = jnp.take_along_axis(token, j, axis=1)
    new_tokens = jnp.take_along_axis(seqs, j[..., None], axis=1)
    new_beams = jnp.take_along_axis(beams, j[..., None], axis=1)
    if legacy:  # at max length the running beams of groups still open become hypotheses
        ended = jnp.broadcast_to(at_last & ~done[:, None], (b, s))
        fin = _finish_at_length(fin, ended, new_scores / pen_run, new_tokens, gen, new_beams)
        done = done | at_last[:, 0]
    else:
        done = done | jnp.all(hits, axis=1)
    return _GroupStep(new_parent.astype(jnp.int32), new_token, new_scores, new_tokens, new_beams, fin, done)


def _split(tree, b: int, groups: int, g: int):
    """Rows of group ``g`` from a ``[B * K, ...]`` pytree, as ``[B * S, ...]``."""

    def one(x):
        s = x.shape[0] // (b * groups)
        return x.reshape((b, groups, s) + x.shape[1:])[:, g].reshape((b * s,) + x.shape[1:])

    return jax.tree.map(one, tree)


def _join(trees: list, b: int):
    """Inverse of :func:`_split` over all groups: ``G`` pytrees ``[B * S, ...]`` -> ``[B * K, ...]``."""

    def one(*xs):
        y = jnp.concatenate([x.reshape((b, x.shape[0] // b) + x.shape[1:]) for x in xs], axis=1)
        return y.reshape((b * y.shape[1],) + y.shape[2:])

    return jax.tree.map(one, *trees)


def _step(
    model: Model, sampler: Sampler, cfg: BeamConfig, params, sparams, stops: Stops, alpha, diversity, state
):
    b, k = state.run_scores.shape
    g_count = cfg.num_groups
    s = k // g_count
    legacy = g_count > 1
    t = state.step
    logp = _math.log_softmax(state.logits).reshape(b, k, -1)
    v = logp.shape[-1]
    eos_hot = jnp.any(jnp.arange(v) == stops.eos_ids[:, :, None], axis=1)  # [B, V]
    logp = jnp.where((eos_hot & (t < stops.min_new_tokens)[:, None])[:, None], _math.NEG_INF, logp)
    key = None
    if cfg.do_sample:
        keys = request_keys(sparams).reshape(b, k)[:, 0]
        key = _noise.fold_in(_noise.fold_in(keys, t), _SAMPLE_SALT)

    chosen = jnp.zeros((b, 0), jnp.int32)  # tokens picked at this step by earlier groups (Hamming)
    outs, states, flat_parent = [], [], []
    for g in range(g_count):
        lo = g * s
        lp_g = logp[:, lo : lo + s]
        if g > 0:
            counts = jnp.zeros((b, v)).at[jnp.arange(b)[:, None], chosen].add(1.0)
            lp_g = lp_g - diversity[:, None, None] * counts[:, None, :]
        sst = _split(state.sampler, b, g_count, g)
        sp = _split(sparams, b, g_count, g)
        x, new_sst = sampler.process(lp_g.reshape(b * s, v), sst, sp)
        fin_g = Finished(*(f[:, lo : lo + s] for f in state.finished))
        out = _group_step(
            cfg,
            legacy,
            t,
            x.reshape(b, s, v),
            state.run_scores[:, lo : lo + s],
            state.run_tokens[:, lo : lo + s],
            state.run_beams[:, lo : lo + s],
            jnp.arange(b) * k + lo,
            fin_g,
            stops,
            alpha,
            key,
            state.prompt_lengths,
        )
        was_done = state.done[:, g]
        keep = lambda new, old: jnp.where(was_done.reshape((b,) + (1,) * (new.ndim - 1)), old, new)  # noqa: E731
        out = _GroupStep(
            keep(out.parent, jnp.broadcast_to(jnp.arange(s), (b, s))),
            keep(out.token, jnp.full((b, s), cfg.decode.pad_id)),
            keep(out.run_scores, state.run_scores[:, lo : lo + s]),
            keep(out.run_tokens, state.run_tokens[:, lo : lo + s]),
            keep(out.run_beams, state.run_beams[:, lo : lo + s]),
            Finished(*(keep(n, o) for n, o in zip(out.finished, fin_g))),
            was_done | out.done,
        )
        chosen = jnp.concatenate([chosen, out.token], axis=1)
        rows = (jnp.arange(b)[:, None] * s + out.parent).reshape(-1)
        active = jnp.repeat(~was_done, s)
        new_sst = sampler.accept(out.token.reshape(-1), take_rows(new_sst, rows), sp, active)
        states.append(where_rows(active, new_sst, sst))
        flat_parent.append(jnp.arange(b)[:, None] * k + lo + out.parent)
        outs.append(out)

    cat = lambda xs: jnp.concatenate(xs, axis=1)  # noqa: E731
    run_tokens = cat([o.run_tokens for o in outs])
    done = jnp.stack([o.done for o in outs], axis=1)
    finished = Finished(*(cat(list(f)) for f in zip(*(o.finished for o in outs))))
    cache = take_rows(state.cache, cat(flat_parent).reshape(-1))
    token = cat([o.token for o in outs]).reshape(-1)
    running = jnp.repeat(~done, s, axis=1)  # [B, K]
    position = jnp.where(running, state.prompt_lengths[:, None] + t, -1).reshape(-1)

    def call():
        o = model.apply_step(params, token[:, None], position[:, None], cache)
        return o.logits[:, 0].astype(jnp.float32), o.cache

    logits, cache = lax.cond(jnp.any(running), call, lambda: (state.logits, cache))
    return BeamState(
        t + 1,
        logits,
        cache,
        _join(states, b),
        cat([o.run_scores for o in outs]),
        run_tokens,
        cat([o.run_beams for o in outs]),
        finished,
        done,
        state.prompt_lengths,
    )


def _search(
    model, sampler, cfg: BeamConfig, params, prompt, lengths, cache, sparams, stops, alpha, diversity
):
    dc = cfg.decode
    k, s = cfg.num_beams, cfg.num_beams // cfg.num_groups
    b = prompt.shape[0]
    logits, cache, rows_params, sst = _start(model, sampler, dc, params, prompt, lengths, cache, sparams, k)
    n = dc.max_tokens
    # only the first beam of each group starts alive, so the group's beams do not all pick the same tokens
    run_scores = jnp.where(jnp.arange(k) % s == 0, 0.0, _BIG) * jnp.ones((b, 1))
    finished = _no_hypotheses(b, k, n, dc.pad_id)
    empty = jnp.broadcast_to((stops.max_new_tokens <= 0)[:, None], (b, cfg.num_groups))
    state = BeamState(
        jnp.int32(0),
        logits,
        cache,
        sst,
        run_scores,
        jnp.full((b, k, n), dc.pad_id, jnp.int32),
        jnp.full((b, k, n), -1, jnp.int32),
        finished,
        empty,
        lengths,
    )
    step = functools.partial(_step, model, sampler, cfg, params, rows_params, stops, alpha, diversity)
    # prompt-leading ([B, ...]) and row-leading ([B * K, ...]) leaves both split along the batch
    keep = lambda st: sharding.constrain(sharding.constrain(st, dc.batch_sharding, b), dc.batch_sharding, b * k)  # noqa: E731
    state = lax.while_loop(lambda st: ~jnp.all(st.done), lambda st: keep(step(st)), keep(state))
    return _best(state.finished, cfg.num_return)


_search_jit = jax.jit(_search, static_argnums=(0, 1, 2))


def search(model, params, prompt, prompt_lengths, opts: DecodingOptions, *, cache=None, attention_mask=None,
           mesh=None) -> BeamOutput:
    """Beam search from validated options (``num_beams``, groups, ``do_sample`` ...; see :func:`beam_search`)."""
    if opts.num_return_sequences > opts.num_beams:
        raise ValueError(f"num_return_sequences ({opts.num_return_sequences}) must be <= num_beams ({opts.num_beams})")
    req = prepare(model, params, prompt, prompt_lengths, opts.replace(logprobs=False, top_logprobs=0), cache=cache,
                  attention_mask=attention_mask, mesh=mesh)
    b = req.prompt.shape[0]
    alpha = _validate.param(opts.beam_length_penalty(), (b,), "length_penalty")
    diversity = _validate.param(opts.diversity_penalty, (b,), "diversity_penalty", lo=0.0)
    cfg = BeamConfig(
        req.cfg,
        opts.num_beams,
        opts.num_beam_groups,
        opts.num_return_sequences,
        opts.early_stopping,
        opts.length_normalization,
        bool(opts.do_sample),
        int(req.stops.eos_ids.shape[-1]),
    )
    if req.cfg.batch_sharding is not None:
        alpha, diversity = sharding.place_rows((alpha, diversity), req.cfg.batch_sharding)
    out = _search_jit(
        req.model,
        req.sampler,
        cfg,
        sharding.replicate(params, req.cfg.batch_sharding),
        req.prompt,
        req.lengths,
        req.cache,
        req.sampler_params,
        req.stops,
        alpha,
        diversity,
    )
    return fill_pad(out, req.pad_id)


def beam_search(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    num_beams: int,
    max_new_tokens: ArrayLike,
    attention_mask: ArrayLike | None = None,
    cache: Any = None,
    mesh: Any = None,
    **kwargs: Any,
) -> BeamOutput:
    """Beam search (HF ``num_beams > 1``), one ``jit``-compiled ``while_loop``.

    Unlike :func:`jaxsample.decoding.generate` (where ``num_beams=1`` is greedy, as in HF), this
    always runs a beam search, one beam included.

    Args:
      model, params, prompt, prompt_lengths, attention_mask, cache, mesh: as in
        :func:`jaxsample.decoding.generate`.
      num_beams: static ``K``.
      max_new_tokens, max_tokens, eos_ids, stop_sequences, min_new_tokens, pad_id, history_size:
        as in :func:`~jaxsample.decoding.generate` (per-row values are per prompt).
      length_penalty: ``alpha`` per prompt (traced, default 1.0): scores are ``sum_logprobs / pen(L)``.
      early_stopping: ``True``, ``False`` or ``"never"`` (HF semantics, see the module docstring).
      num_return_sequences: static ``R <= K`` hypotheses returned per prompt, best first.
      length_normalization: ``"hf"`` (``pen(L) = L ** alpha``), ``"gnmt"`` (``((5 + L) / 6) ** alpha``)
        or ``"vllm"`` (``(P + L - e) ** alpha``: prompt-inclusive, a final EOS not counted).
      do_sample: beam sampling (see :func:`beam_sample`).
      num_beam_groups, diversity_penalty: diverse beam search (see :func:`group_beam_search`).
      sampler: its stages process the per-step log-probs (its selector is unused); default none.
      sampler_params: per-prompt values ``[B]``, shared by the prompt's beams; ``seed`` drives
        beam sampling.
      options: a :class:`~jaxsample.decoding.options.DecodingOptions` the keywords override.

    Returns:
      :class:`BeamOutput` with ``[B, R]`` leading axes.
    """
    from jaxsample.decoding.generate import options_from

    opts = options_from(kwargs.pop("options", None), dict(kwargs, num_beams=num_beams, max_new_tokens=max_new_tokens))
    if opts.penalty_alpha is not None or opts.n > 1 or opts.best_of is not None:
        raise ValueError("beam_search takes no penalty_alpha / n / best_of")
    return search(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask, mesh=mesh)


def beam_sample(
    model: Any, params: Any, prompt: ArrayLike, prompt_lengths: ArrayLike | None = None, **kwargs
) -> BeamOutput:
    """Beam sampling (HF ``num_beams > 1, do_sample=True``): :func:`beam_search` with ``do_sample=True``.

    The sampler's stages (warpers such as temperature or top-k) process each step's log-probs; the
    ``C`` candidates are then drawn without replacement from ``softmax`` of the accumulated scores
    over all ``K * V`` continuations, with the prompt's key ``fold_in(key(seed), step)``.
    """
    return beam_search(model, params, prompt, prompt_lengths, do_sample=True, **kwargs)


def group_beam_search(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    num_beam_groups: int,
    diversity_penalty: ArrayLike,
    **kwargs,
) -> BeamOutput:
    """Diverse beam search (HF ``num_beam_groups > 1``): :func:`beam_search` with groups.

    ``num_beams`` must be divisible by the static ``num_beam_groups``; ``diversity_penalty`` is per
    prompt (traced, ``>= 0``). The returned hypotheses are the best ``R`` over all groups.
    """
    return beam_search(
        model,
        params,
        prompt,
        prompt_lengths,
        num_beam_groups=num_beam_groups,
        diversity_penalty=diversity_penalty,
        **kwargs,
    )
