"""Host-side normalisation of what every strategy takes: prompts, sampler and its per-row params."""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np

from jaxsample import _validate, stages
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler, chain

#: The sampler used when none is given: no processors, greedy selection.
GREEDY = chain(select=stages.greedy())


def prompt_inputs(prompt: ArrayLike, prompt_lengths: ArrayLike | None) -> tuple[Array, Array]:
    """``(prompt int32[B, P], lengths int32[B])`` from a right-padded prompt.

    Without ``prompt_lengths`` a row's length is its number of entries ``>= 0`` (padding is ``-1``).
    Every row needs at least one token (decoder-only: BOS; encoder-decoder: the decoder start
    token); traced lengths are clipped to ``[1, P]``.
    """
    prompt = _validate.check_tokens(prompt, "prompt")
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must have shape [B, P] with P >= 1, got {prompt.shape}")
    b, p = prompt.shape
    if prompt_lengths is None:
        lengths = jnp.sum(prompt >= 0, axis=-1).astype(jnp.int32)
        if _validate.is_concrete(prompt) and np.any(np.asarray(lengths) == 0):
            raise ValueError("every prompt row needs at least one token (entries >= 0)")
    else:
        _validate.check_range(prompt_lengths, "prompt_lengths", lo=1, hi=p, integer=True)
        lengths = _validate.row_param(prompt_lengths, (b,), "prompt_lengths", jnp.int32)
    return prompt, jnp.clip(lengths, 1, p)


def sampler_inputs(
    sampler: Sampler | None, sampler_params: Mapping[str, ArrayLike] | None, batch: int
) -> tuple[Sampler, dict[str, Array]]:
    """The sampler (greedy by default) and its validated ``[B]`` parameters (defaults filled in)."""
    sampler = GREEDY if sampler is None else sampler
    if not isinstance(sampler, Sampler):
        raise ValueError(
            f"sampler must be a jaxsample.Sampler (built with jaxsample.chain), got {type(sampler)}"
        )
    return sampler, sampler.params((batch,), **dict(sampler_params or {}))


def history_size(sampler: Sampler, history: int | None, longest: int) -> int | None:
    """Ring size for the sampler: the caller's, else what the chain needs (``longest`` if it reads all)."""
    if history is not None:
        return _validate.static_int(history, "history_size", lo=0)
    return longest if sampler.history_size() == -1 else None
