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
#: The sampler of ``do_sample=True`` when none is given: plain sampling from the model's softmax.
SAMPLE = chain(select=stages.categorical())


def prompt_inputs(
    prompt: ArrayLike, prompt_lengths: ArrayLike | None, attention_mask: ArrayLike | None = None
) -> tuple[Array, Array]:
    """``(prompt int32[B, P], lengths int32[B])``, right-padded with ``-1``, from any accepted padding.

    Accepted: right padding with ``-1`` (the project's convention) or ``prompt_lengths``; left
    padding with ``-1``; HF's ``attention_mask`` (``1`` on real tokens, on either side, the padded
    ids may be anything). Left-padded rows are shifted left, so row ``b``'s tokens sit at positions
    ``0 .. n_b - 1`` whatever the padding. Concrete inputs with padding on both sides or inside a
    row, or a row without tokens, raise ``ValueError``; traced lengths are clipped to ``[1, P]``.
    """
    prompt = _validate.check_tokens(prompt, "prompt")
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must have shape [B, P] with P >= 1, got {prompt.shape}")
    b, p = prompt.shape
    t = jnp.arange(p, dtype=jnp.int32)
    if prompt_lengths is not None:
        if attention_mask is not None:
            raise ValueError("pass prompt_lengths or attention_mask, not both")
        _validate.check_range(prompt_lengths, "prompt_lengths", lo=1, hi=p, integer=True)
        lengths = _validate.row_param(prompt_lengths, (b,), "prompt_lengths", jnp.int32)
        return prompt, jnp.clip(lengths, 1, p)
    if attention_mask is None:
        valid, what = prompt >= 0, "prompt (entries >= 0 are tokens, -1 is padding)"
    else:
        mask = jnp.asarray(attention_mask)
        if mask.shape != prompt.shape:
            raise ValueError(f"attention_mask must have the prompt's shape {prompt.shape}, got {mask.shape}")
        if _validate.is_concrete(mask) and not np.all(np.isin(np.asarray(mask), (0, 1))):
            raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
        valid, what = mask.astype(bool), "attention_mask"
        if _validate.is_concrete(prompt) and _validate.is_concrete(mask) and np.any(np.asarray(prompt)[np.asarray(valid)] < 0):
            raise ValueError("attention_mask marks -1 entries of prompt as tokens")
    lengths = jnp.sum(valid, axis=-1).astype(jnp.int32)
    first = jnp.argmax(valid, axis=-1).astype(jnp.int32)
    if _validate.is_concrete(valid):
        v = np.asarray(valid)
        _check_contiguous(v, what)
        if not np.any(np.asarray(first)):  # already right-padded: nothing to move
            return jnp.where(v, prompt, -1), jnp.clip(lengths, 1, p)
    idx = jnp.clip(first[:, None] + t, 0, p - 1)
    shifted = jnp.take_along_axis(prompt, idx, axis=1)
    return jnp.where(t < lengths[:, None], shifted, -1), jnp.clip(lengths, 1, p)


def check_pad_prefix(prompt: ArrayLike, pad_id: int) -> None:
    """HF's ambiguous case: rows starting with the explicit ``pad_id`` and no ``attention_mask``.

    Some rows starting with ``pad_id`` while others do not looks like left padding with a pad id
    that is also a token; decoding it as tokens would silently change those rows' continuations.
    """
    if pad_id < 0 or not _validate.is_concrete(prompt):
        return
    p = np.asarray(prompt)
    if p.ndim != 2 or p.shape[1] < 2:
        return
    starts = p[:, 0] == pad_id
    if starts.any() and not starts.all():
        b = int(np.flatnonzero(starts)[0])
        raise ValueError(
            f"prompt row {b} starts with pad_id={pad_id} and no attention_mask was given: if that is left "
            "padding, pass attention_mask (HF) or pad with -1; if it is a token, pass attention_mask of ones"
        )


def _check_contiguous(valid: np.ndarray, what: str) -> None:
    """Each row's tokens must form one run: padding on the left or on the right, not both, not inside."""
    for b, row in enumerate(valid):
        idx = np.flatnonzero(row)
        if idx.size == 0:
            raise ValueError(f"every prompt row needs at least one token; row {b} has none ({what})")
        if idx[-1] - idx[0] + 1 != idx.size:
            raise ValueError(f"prompt row {b} has padding between its tokens ({what}): padding must be on one side")
        if idx[0] > 0 and idx[-1] < row.size - 1:
            raise ValueError(
                f"prompt row {b} is padded on both sides ({what}): pad on the left (HF) or on the right, not both"
            )


def pick_sampler(sampler: Sampler | None, do_sample: bool | None) -> Sampler | None:
    """HF's ``do_sample``: ``True`` with no chain samples plainly; ``False`` swaps the selector for greedy."""
    if sampler is None:
        return SAMPLE if do_sample else None
    if do_sample is False and sampler.selector.name != "greedy":
        return chain(*sampler.stages, select=stages.greedy())
    if do_sample and sampler.selector.name == "greedy":
        raise ValueError("do_sample=True with a sampler whose selector is greedy: give the chain a sampling selector")
    return sampler


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
