"""The shared decode kernel: host-side :func:`prepare`, then :func:`start` / :func:`step` / :func:`finish`.

:func:`prepare` validates a request once for every strategy (the model is coerced with
:func:`jaxsample.decoding.adapters.as_model` and its cache and output shapes are checked, the
prompt is normalised to right padding, the options come from one
:class:`~jaxsample.decoding.options.DecodingOptions`). :func:`start` prefills the right-padded
prompts in one model call (ragged lengths, per-row positions); :func:`step` is the body of the
``lax.while_loop``: mask EOS until ``min_new_tokens``, run the sampler chain (``process -> select
-> accept``, finished rows frozen with ``active=False``), append the token (``pad_id`` for finished
rows), apply the stopping rules, and feed the token back to the model (skipped once every row has
finished). Every per-row value (sampling parameters, seeds, ``max_new_tokens``, EOS ids, stop
sequences) is a traced array: new values never recompile. A row's tokens depend only on its
prompt, its parameters and its seed.

The same functions drive :func:`~jaxsample.decoding.generate` (:func:`run`, one jitted
``while_loop``), :mod:`jaxsample.decoding.stream` (a jitted, state-donating step called from
Python) and :mod:`jaxsample.decoding.rank` (``best_of`` samples per prompt), so all three produce
identical tokens; beam, contrastive and speculative decoding reuse :func:`prepare` and
:func:`prefill`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, SamplerState
from jaxsample.decoding import _request, _stopping, adapters, sharding
from jaxsample.decoding._stopping import Logprobs, Stops, Tracker
from jaxsample.decoding.model import Model, last_valid, prompt_positions, repeat_rows
from jaxsample.decoding.options import DecodingOptions


class GenerateOutput(NamedTuple):
    """Result of :func:`generate` (and of the other single-sequence strategies)."""

    tokens: Array  # int32[B, N]: generated tokens (EOS / stop sequence included), pad_id after
    lengths: Array  # int32[B]
    finish_reason: Array  # int32[B]: FinishReason (EOS, STOP_SEQUENCE or LENGTH)
    logprobs: Logprobs | None  # when requested


#: What the loops write after a row has finished; outputs map it to the request's ``pad_id`` on the way
#: out (:func:`fill_pad`), so a new ``pad_id`` never recompiles.
INTERNAL_PAD = -1


class Config(NamedTuple):
    """Static decode configuration (part of the jit cache key)."""

    max_tokens: int  # output width N
    pad_id: int  # always INTERNAL_PAD inside the loops
    top_logprobs: int | None  # None: no log-probs; n >= 0: log-probs with top-n
    history_size: int | None  # sampler ring size (None: what the chain declares)
    cache_len: int  # positions the cache must hold (used when the cache is built here)
    batch_sharding: Any = None  # NamedSharding of batch-leading arrays over a mesh (data parallel), or None


class DecodeState(NamedTuple):
    """The loop state of :func:`step` (every leaf has the batch as leading axis)."""

    logits: Array  # float32[B, V]: raw model logits for each row's next token
    cache: Any
    sampler: SamplerState
    prompt_lengths: Array  # int32[B]
    out: Tracker


def prefill(
    model: Model, params: Any, prompt: Array, lengths: Array, cache: Any, cache_len: int, batch_sharding: Any = None
):
    """One model call over the right-padded prompt; builds the cache if ``cache`` is None.

    Returns:
      ``(logits float32[B, V] at each row's last prompt token, cache, hidden [B, P, D] or None)``.
    """
    if cache is None:
        cache = model.init_cache(prompt.shape[0], cache_len)
    cache = sharding.constrain(cache, batch_sharding)
    tokens, positions = prompt_positions(prompt, lengths)
    out = model.apply_step(params, tokens, positions, cache)
    return last_valid(out.logits, lengths).astype(jnp.float32), out.cache, out.hidden


def begin(
    sampler: Sampler, cfg: Config, logits, cache, prompt, lengths, sparams, stops: Stops
) -> DecodeState:
    """Decode state after prefill: the sampler sees the prompt as its first history."""
    history = jnp.where(jnp.arange(prompt.shape[1]) < lengths[:, None], prompt, -1)
    sst = sampler.init(sparams, vocab_size=logits.shape[-1], prompt=history, history_size=cfg.history_size)
    out = _stopping.tracker(stops, cfg.max_tokens, cfg.pad_id, cfg.top_logprobs)
    return DecodeState(logits, cache, sst, lengths, out)


def start(
    model, sampler, cfg, params, prompt, lengths, cache, sparams, stops, expand: int = 1
) -> DecodeState:
    """Prefill, then (``expand > 1``) repeat every row ``expand`` times for independent samples."""
    logits, cache, _ = prefill(model, params, prompt, lengths, cache, cfg.cache_len, cfg.batch_sharding)
    logits, cache, prompt, lengths = repeat_rows((logits, cache, prompt, lengths), expand)
    return begin(sampler, cfg, logits, cache, prompt, lengths, sparams, stops)


def step(
    model: Model, sampler: Sampler, cfg: Config, params, sparams, stops: Stops, state: DecodeState
) -> DecodeState:
    """Chooses one token per unfinished row and feeds it to the model."""
    out = state.out
    active = ~out.done
    x = _stopping.mask_eos(state.logits, stops, out.length)
    token, processed, sst = sampler.sample(x, state.sampler, sparams, active)
    token = jnp.where(active, token, cfg.pad_id)
    lp = None
    if cfg.top_logprobs is not None:
        lp = _stopping.step_logprobs(state.logits, processed, token, cfg.top_logprobs, stops.logprob_ids)
    new_out = _stopping.push(out, stops, token, active, lp)
    run = ~new_out.done
    position = jnp.where(run, state.prompt_lengths + out.length, -1)

    def call():
        o = model.apply_step(params, token[:, None], position[:, None], state.cache)
        return o.logits[:, 0].astype(jnp.float32), o.cache

    logits, cache = lax.cond(jnp.any(run), call, lambda: (state.logits, state.cache))
    return DecodeState(logits, cache, sst, state.prompt_lengths, new_out)


def finish(state: DecodeState) -> GenerateOutput:
    o = state.out
    return GenerateOutput(o.tokens, o.length, o.reason, o.logprobs)


def run(model, sampler, cfg, expand, params, prompt, lengths, cache, sparams, stops) -> GenerateOutput:
    """The whole decode: :func:`start`, a ``while_loop`` of :func:`step`, :func:`finish`."""
    state = start(model, sampler, cfg, params, prompt, lengths, cache, sparams, stops, expand)
    rows = state.prompt_lengths.shape[0]
    state = sharding.constrain(state, cfg.batch_sharding, rows)

    def body(s):
        return sharding.constrain(step(model, sampler, cfg, params, sparams, stops, s), cfg.batch_sharding, rows)

    state = lax.while_loop(lambda s: ~jnp.all(s.out.done), body, state)
    return finish(state)


decode = jax.jit(run, static_argnums=(0, 1, 2, 3))


class Request(NamedTuple):
    """Validated inputs of a decoding call (see :func:`prepare`)."""

    model: Model
    cfg: Config
    sampler: Sampler
    prompt: Array  # int32[B, P], right-padded with -1
    lengths: Array  # int32[B]
    sampler_params: dict
    stops: Stops
    cache: Any
    pad_id: int  # the caller's pad id (see fill_pad)


def fill_pad(out: Any, pad_id: int) -> Any:
    """``out`` with the internal padding of its ``tokens`` replaced by ``pad_id`` (outside ``jit``: no recompile)."""
    if pad_id == INTERNAL_PAD:
        return out
    return out._replace(tokens=jnp.where(out.tokens == INTERNAL_PAD, jnp.int32(pad_id), out.tokens))


def prepare(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None,
    opts: DecodingOptions,
    *,
    cache: Any = None,
    attention_mask: ArrayLike | None = None,
    extra_positions: int = 0,
    mesh: Any = None,
    name: str = "model",
) -> Request:
    """Host-side validation shared by the strategies (``ValueError`` names the culprit).

    ``model`` is coerced with :func:`~jaxsample.decoding.adapters.as_model`; the prompt is
    normalised to right padding (:func:`jaxsample.decoding._request.prompt_inputs`); the cache
    (given, or the shape ``init_cache`` would build) and one model call on the prompt are checked
    abstractly (:func:`~jaxsample.decoding.adapters.check_model`); with a mesh (given, or the one
    ``prompt`` is sharded over) every batch-leading input is placed data-parallel over it.
    """
    model = adapters.as_model(model, name)
    if cache is None and model.init_cache is None:
        raise ValueError(
            f"pass a cache (encoder-decoder models: model.encode(...)) or a {name} with init_cache"
        )
    mesh = sharding.find_mesh(mesh, prompt)
    if opts.pad_id is not None and attention_mask is None and prompt_lengths is None:
        _request.check_pad_prefix(prompt, opts.pad_id)
    prompt, lengths = _request.prompt_inputs(prompt, prompt_lengths, attention_mask)
    b, p = prompt.shape
    stops, n = _stopping.stops(
        b,
        max_new_tokens=opts.max_new_tokens,
        max_tokens=opts.max_tokens,
        eos_ids=opts.eos_ids,
        stop_sequences=opts.stop_sequences,
        min_new_tokens=opts.min_new_tokens,
        repetition_detection=opts.repetition_detection,
        logprob_token_ids=opts.logprob_token_ids,
    )
    sampler = _request.pick_sampler(opts.sampler, opts.do_sample)
    sampler, sparams = _request.sampler_inputs(sampler, opts.sampler_params, b)
    if not model.ragged and _validate.is_concrete(lengths) and len(set(np.asarray(lengths).tolist())) > 1:
        raise ValueError(
            f"{name} takes no attention mask (a shared-index adapter built with masks=False, or from_nnx "
            f"without call=), so prompts of different lengths {sorted(set(np.asarray(lengths).tolist()))} "
            "cannot share a batch: give the adapter a masked call, or decode equal-length prompts together"
        )
    top = opts.top_logprobs
    cache_len = p + n + extra_positions
    adapters.check_model(model, params, prompt, cache, cache_len, name)
    cfg = Config(
        max_tokens=n,
        pad_id=INTERNAL_PAD,
        top_logprobs=top if (opts.logprobs or top or opts.logprob_token_ids is not None) else None,
        history_size=_request.history_size(sampler, opts.history_size, cache_len),
        cache_len=cache_len,
        batch_sharding=sharding.batch_sharding(mesh, b),
    )
    req = Request(model, cfg, sampler, prompt, lengths, sparams, stops, cache, 0 if opts.pad_id is None else opts.pad_id)
    return sharding.place(req) if mesh is not None else req
