"""Streaming generation: a jitted single decode step with a donated state, driven from Python.

:func:`stream` yields one :class:`StreamChunk` per step, as soon as the step's tokens reach the host.
Each step is the ``step`` function of :mod:`jaxsample.decoding.generate` (the body of :func:`generate`'s
``lax.while_loop``) compiled on its own with ``donate_argnums`` on the decode state, so the KV cache
is updated in place and the tokens equal :func:`generate`'s for the same inputs and seeds.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.1, 0.2, 0.7], [0.8, 0.1, 0.1]]))
>>> [c.tokens.tolist() for c in stream(BIGRAM, {"logits": table}, jnp.array([[0], [1]]), max_new_tokens=2)]
[[1, 2], [2, 0]]
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample._types import ArrayLike
from jaxsample.chain import Sampler
from jaxsample.decoding.generate import DecodeState, prepare, start, step
from jaxsample.decoding.model import Model


class StreamChunk(NamedTuple):
    """What one step produced, on the host."""

    tokens: np.ndarray  # int32[B]: the token each row emitted this step (pad_id where none)
    emitted: np.ndarray  # bool[B]: whether the row emitted a token this step
    finish_reason: np.ndarray  # int32[B]: FinishReason so far (NOT_FINISHED while running)


_start = jax.jit(start, static_argnums=(0, 1, 2))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(6,))
def _step(model, sampler, cfg, params, sparams, stops, state: DecodeState):
    new = step(model, sampler, cfg, params, sparams, stops, state)
    emitted = new.out.length > state.out.length
    col = jnp.clip(state.out.length, 0, cfg.max_tokens - 1)
    token = jnp.take_along_axis(new.out.tokens, col[:, None], axis=-1)[:, 0]
    token = jnp.where(emitted, token, cfg.pad_id)
    return new, token, emitted, new.out.reason, jnp.all(new.out.done)


def stream(
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
    history_size: int | None = None,
) -> Iterator[StreamChunk]:
    """Generates like :func:`jaxsample.decoding.generate`, yielding each step's tokens.

    Arguments are those of :func:`~jaxsample.decoding.generate` (log-probs are not streamed). The
    generator stops after the step in which the last row finished; a row's tokens are the
    ``tokens[b]`` of the chunks where ``emitted[b]`` is True.
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
        logprobs=False,
        top_logprobs=0,
        history_size=history_size,
    )
    state = _start(
        model, req.sampler, req.cfg, params, req.prompt, req.lengths, cache, req.sampler_params, req.stops
    )
    if bool(jnp.all(state.out.done)):
        return
    while True:
        state, token, emitted, reason, done = _step(
            model, req.sampler, req.cfg, params, req.sampler_params, req.stops, state
        )
        yield StreamChunk(np.asarray(token), np.asarray(emitted), np.asarray(reason))
        if bool(done):
            return
