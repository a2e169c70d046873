"""Streaming generation: a jitted single decode step with a donated state, driven from Python.

:func:`stream` yields one :class:`StreamChunk` per step, as soon as the step's tokens reach the host.
Each step is the ``step`` function of :mod:`jaxsample.decoding.loop` (the body of :func:`generate`'s
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
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample._types import ArrayLike
from jaxsample.decoding import sharding
from jaxsample.decoding.loop import INTERNAL_PAD, DecodeState, prepare, start, step


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
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    max_new_tokens: ArrayLike,
    attention_mask: ArrayLike | None = None,
    cache: Any = None,
    mesh: Any = None,
    **kwargs: Any,
) -> Iterator[StreamChunk]:
    """Generates like :func:`jaxsample.decoding.generate`, yielding each step's tokens.

    Arguments are those of :func:`~jaxsample.decoding.generate` for greedy and sampled generation
    (log-probs are not streamed). The generator stops after the step in which the last row
    finished; a row's tokens are the ``tokens[b]`` of the chunks where ``emitted[b]`` is True.
    """
    from jaxsample.decoding.generate import options_from

    opts = options_from(kwargs.pop("options", None), dict(kwargs, max_new_tokens=max_new_tokens))
    if opts.strategy() != "generate":
        raise ValueError(f"stream runs greedy or sampled generation only; these options ask for {opts.strategy()}")
    req = prepare(model, params, prompt, prompt_lengths, opts.replace(logprobs=False, top_logprobs=0), cache=cache,
                  attention_mask=attention_mask, mesh=mesh)
    params = sharding.replicate(params, req.cfg.batch_sharding)
    state = _start(
        req.model, req.sampler, req.cfg, params, req.prompt, req.lengths, req.cache, req.sampler_params, req.stops
    )
    if bool(jnp.all(state.out.done)):
        return
    while True:
        state, token, emitted, reason, done = _step(
            req.model, req.sampler, req.cfg, params, req.sampler_params, req.stops, state
        )
        token = np.asarray(token)
        yield StreamChunk(np.where(token == INTERNAL_PAD, req.pad_id, token), np.asarray(emitted), np.asarray(reason))
        if bool(done):
            return
