"""Greedy and sampled generation: one ``jax.jit``-compiled ``lax.while_loop`` over a model callback.

:func:`generate` prefills the right-padded prompts in one model call (ragged lengths, per-row
positions), then runs a ``lax.while_loop`` whose body is :func:`step`: mask EOS until
``min_new_tokens``, run the sampler chain (``process -> select -> accept``, finished rows frozen
with ``active=False``), append the token (``pad_id`` for finished rows), apply the stopping rules,
and feed the token back to the model (skipped once every row has finished). Every per-row value
(sampling parameters, seeds, ``max_new_tokens``, EOS ids, stop sequences) is a traced array: new
values never recompile. A row's tokens depend only on its prompt, its parameters and its seed.

The same :func:`start` / :func:`step` functions drive :mod:`jaxsample.decoding.stream` (a jitted,
state-donating step called from Python) and :mod:`jaxsample.decoding.rank` (``best_of`` samples
per prompt), so all three produce identical tokens.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM, generate
>>> table = jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.1, 0.2, 0.7], [0.8, 0.1, 0.1]]))
>>> out = generate(BIGRAM, {"logits": table}, jnp.array([[0, -1], [1, 2]]), max_new_tokens=4, eos_ids=0)
>>> out.tokens.tolist(), out.lengths.tolist(), out.finish_reason.tolist()
([[1, 2, 0, 0], [0, 0, 0, 0]], [3, 1], [1, 1])
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
from jaxsample.decoding import _request, _stopping
from jaxsample.decoding._stopping import Logprobs, Stops, Tracker
from jaxsample.decoding.model import Model, last_valid, prompt_positions, repeat_rows


class GenerateOutput(NamedTuple):
    """Result of :func:`generate` (and of the other single-sequence strategies)."""

    tokens: Array  # int32[B, N]: generated tokens (EOS / stop sequence included), pad_id after
    lengths: Array  # int32[B]
    finish_reason: Array  # int32[B]: FinishReason (EOS, STOP_SEQUENCE or LENGTH)
    logprobs: Logprobs | None  # when requested


class Config(NamedTuple):
    """Static decode configuration (part of the jit cache key)."""

    max_tokens: int  # output width N
    pad_id: int
    top_logprobs: int | None  # None: no log-probs; n >= 0: log-probs with top-n
    history_size: int | None  # sampler ring size (None: what the chain declares)
    cache_len: int  # positions the cache must hold (used when the cache is built here)


class DecodeState(NamedTuple):
    """The loop state of :func:`step` (every leaf has the batch as leading axis)."""

    logits: Array  # float32[B, V]: raw model logits for each row's next token
    cache: Any
    sampler: SamplerState
    prompt_lengths: Array  # int32[B]
    out: Tracker


def prefill(model: Model, params: Any, prompt: Array, lengths: Array, cache: Any, cache_len: int):
    """One model call over the right-padded prompt; builds the cache if ``cache`` is None.

    Returns:
      ``(logits float32[B, V] at each row's last prompt token, cache, hidden [B, P, D] or None)``.
    """
    if cache is None:
        cache = model.init_cache(prompt.shape[0], cache_len)
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
    logits, cache, _ = prefill(model, params, prompt, lengths, cache, cfg.cache_len)
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
        lp = _stopping.step_logprobs(state.logits, processed, token, cfg.top_logprobs)
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


def _decode(model, sampler, cfg, expand, params, prompt, lengths, cache, sparams, stops) -> GenerateOutput:
    state = start(model, sampler, cfg, params, prompt, lengths, cache, sparams, stops, expand)
    body = functools.partial(step, model, sampler, cfg, params, sparams, stops)
    state = lax.while_loop(lambda s: ~jnp.all(s.out.done), body, state)
    return finish(state)


decode = jax.jit(_decode, static_argnums=(0, 1, 2, 3))


class Request(NamedTuple):
    """Validated inputs of a generation call (see :func:`prepare`)."""

    cfg: Config
    sampler: Sampler
    prompt: Array
    lengths: Array
    sampler_params: dict
    stops: Stops


def prepare(
    model: Model,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None,
    *,
    max_new_tokens: ArrayLike,
    max_tokens: int | None,
    sampler: Sampler | None,
    sampler_params: Mapping[str, ArrayLike] | None,
    eos_ids,
    stop_sequences,
    min_new_tokens: ArrayLike,
    pad_id: int,
    cache: Any,
    logprobs: bool,
    top_logprobs: int,
    history_size: int | None,
    extra_positions: int = 0,
    repetition_detection=None,
) -> Request:
    """Host-side validation shared by the strategies (``ValueError`` names the culprit)."""
    if not isinstance(model, Model):
        raise ValueError(
            f"model must be a jaxsample.decoding.Model(apply_step, init_cache), got {type(model)}"
        )
    if cache is None and model.init_cache is None:
        raise ValueError("pass a cache (encoder-decoder models) or a model with init_cache")
    prompt, lengths = _request.prompt_inputs(prompt, prompt_lengths)
    b, p = prompt.shape
    stops, n = _stopping.stops(
        b,
        max_new_tokens=max_new_tokens,
        max_tokens=max_tokens,
        eos_ids=eos_ids,
        stop_sequences=stop_sequences,
        min_new_tokens=min_new_tokens,
        repetition_detection=repetition_detection,
    )
    sampler, sparams = _request.sampler_inputs(sampler, sampler_params, b)
    top = _validate.static_int(top_logprobs, "top_logprobs", lo=0)
    cfg = Config(
        max_tokens=n,
        pad_id=_validate.static_int(pad_id, "pad_id"),
        top_logprobs=top if (logprobs or top) else None,
        history_size=_request.history_size(sampler, history_size, p + n + extra_positions),
        cache_len=p + n + extra_positions,
    )
    return Request(cfg, sampler, prompt, lengths, sparams, stops)


def generate(
    model: Model,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    max_new_tokens: ArrayLike,
    max_tokens: int | None = None,
    sampler: Sampler | None = None,
    sampler_params: Mapping[str, ArrayLike] | None = None,
    eos_ids: ArrayLike | None = None,
    stop_sequences=None,
    min_new_tokens: ArrayLike = 0,
    pad_id: int = 0,
    cache: Any = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    history_size: int | None = None,
    repetition_detection=None,
) -> GenerateOutput:
    """Generates up to ``max_new_tokens`` tokens per row with any sampler chain (greedy by default).

    Args:
      model: :class:`Model` (``apply_step`` and, unless ``cache`` is given, ``init_cache``).
      params: model parameters (any pytree), passed to ``apply_step``.
      prompt: ``int[B, P]`` right-padded prompts (``-1`` padding, or see ``prompt_lengths``).
      prompt_lengths: ``int[B]`` valid prompt lengths (``>= 1``); default: entries ``>= 0`` per row.
      max_new_tokens: int or ``int[B]`` per-row limit (traced: new values never recompile).
      max_tokens: static output width ``N >= max(max_new_tokens)``; defaults to that maximum.
      sampler: a :class:`jaxsample.Sampler`; default greedy.
      sampler_params: per-row values for the sampler (``sampler.params`` keywords, e.g. ``seed``,
        ``temperature``); missing ones take the chain's defaults. Each row's randomness is
        ``fold_in(key(seed), position)``, so rows are independent of the batch.
      eos_ids: EOS id(s): an int, a list, ``int[E]`` or ``int[B, E]`` (``-1`` = unused).
      stop_sequences: list of token-id lists, or ``int[S, L]`` / ``int[B, S, L]`` right-aligned
        (``-1`` padding on the left). Matched against generated tokens only.
      min_new_tokens: int or ``int[B]``: EOS is masked (before the sampler chain) and no stop rule
        applies until a row has generated this many tokens.
      pad_id: token written after a row has finished.
      cache: a prebuilt cache (encoder-decoder models: built by the encoder; the prompt is then the
        decoder start token). Default: ``model.init_cache(B, P + N)``.
      logprobs: also return the raw and processed log-probabilities of the chosen tokens.
      top_logprobs: static ``n``: also return the ``n`` most likely tokens under the raw model.
      history_size: static sampler history window; default: what the chain's stages declare, or
        ``P + N`` when a stage reads the whole history.
      repetition_detection: vLLM's ``RepetitionDetectionParams`` (a mapping of
        ``max_pattern_size``, ``min_pattern_size``, ``min_count``, per row or not): a row whose
        output ends in ``min_count`` copies of a pattern stops (``FinishReason.REPETITION``).

    Returns:
      :class:`GenerateOutput`.
    """
    req = prepare(
        model,
        prompt,
        prompt_lengths,
        max_new_tokens=max_new_tokens,
        max_tokens=max_tokens,
        sampler=sampler,
        sampler_params=sampler_params,
        eos_ids=eos_ids,
        stop_sequences=stop_sequences,
        min_new_tokens=min_new_tokens,
        pad_id=pad_id,
        cache=cache,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        history_size=history_size,
        repetition_detection=repetition_detection,
    )
    return decode(
        model, req.sampler, req.cfg, 1, params, req.prompt, req.lengths, cache, req.sampler_params, req.stops
    )
