"""Classifier-free guidance: combine conditional and unconditional next-token scores.

The decoding loop runs the model twice per step (with and without the conditioning prompt, or as
one doubled batch) and combines the two rows of logits with one of these functions before the
sampler chain. ``scale`` may differ per row and is traced.

Sharding/TPU: rows are independent; shard the batch axis of both inputs alike. Two log-softmaxes
and an elementwise combination per row; no batch-level branch.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike, Float


def _combine(cond: Array, uncond: Array, s: Array) -> Array:
    """``uncond + s * (cond - uncond)``, with infinities resolved as limits and never NaN.

    Finite entries use exactly HF's expression. Otherwise the value is ``(1 - s) * uncond +
    s * cond`` where a zero weight ignores its term; an undefined ``inf - inf`` is ``-inf``.
    """
    finite = s * (cond - uncond) + uncond
    w = 1.0 - s
    limit = jnp.where(w == 0, 0.0, w * uncond) + jnp.where(s == 0, 0.0, s * cond)
    out = jnp.where(jnp.isfinite(cond) & jnp.isfinite(uncond), finite, limit)
    out = jnp.where(s == 1, cond, out)
    # an infinite scale can send every finite score to -inf: keep cond's first maximum (never empty)
    return _math.nonempty(_math.clean(out), cond)


def _inputs(cond: ArrayLike, uncond: ArrayLike | None, scale: ArrayLike):
    x, dtype = _math.prepare(cond)
    if uncond is None:
        if x.ndim < 2 or x.shape[0] % 2:
            raise ValueError(
                f"without `uncond`, cond must stack [conditional; unconditional] rows on an even leading axis, "
                f"got shape {x.shape}"
            )
        x, u = jnp.split(x, 2, axis=0)
    else:
        u, _ = _math.prepare(uncond)
        _validate.check_broadcast(u.shape, x.shape, "uncond", onto="the cond shape", hint="")
    s = _validate.param(scale, x.shape[:-1], "scale")[..., None]
    return x, u, s, dtype


def classifier_free_guidance(cond: Float["*B V"], uncond: Float["*B V"] | None, scale: ArrayLike) -> Float["*B V"]:
    """HF ``UnbatchedClassifierFreeGuidanceLogitsProcessor``: guidance in log-probability space.

    ``s * (log_softmax(cond) - log_softmax(uncond)) + log_softmax(uncond)``; ``s == 1`` returns
    ``log_softmax(cond)`` exactly (HF skips the unconditional pass), ``s == 0`` the unconditional
    log-probabilities. Tokens removed in both inputs stay removed; a token removed in only one of
    them takes the limit of the formula (e.g. removed from ``cond`` and ``s > 0``: removed).

    Args:
      cond: ``[..., V]`` logits of the conditioned sequence.
      uncond: ``[..., V]`` logits of the unconditional (or negative-prompt) sequence, broadcastable
        to ``cond``; ``None`` when ``cond`` stacks ``[conditional; unconditional]`` on axis 0.
      scale: guidance scale ``s``, scalar or per row.

    Returns:
      ``[..., V]`` guided log-scores in the input dtype (not renormalised, as in HF).

    >>> import jax.numpy as jnp
    >>> out = classifier_free_guidance(jnp.array([1.0, 1.0, 1.0]), jnp.array([1.0, 0.0, 1.5]), 1.5)
    >>> [round(v, 4) for v in out.tolist()]
    [-1.0959, -0.5959, -1.3459]
    """
    x, u, s, dtype = _inputs(cond, uncond, scale)
    return _math.restore(_combine(_math.log_softmax(x), _math.log_softmax(u), s), dtype)


def classifier_free_guidance_logits(
    cond: Float["*B V"], uncond: Float["*B V"] | None, scale: ArrayLike
) -> Float["*B V"]:
    """HF ``ClassifierFreeGuidanceLogitsProcessor`` (MusicGen): ``uncond + s * (cond - uncond)`` on raw logits.

    HF feeds a doubled batch (conditional rows first) and returns the first half; pass
    ``uncond=None`` for that layout. ``s == 1`` returns ``cond``; infinities as in
    :func:`classifier_free_guidance`.

    Args:
      cond: ``[..., V]`` conditional logits, or ``[2B, ..., V]`` stacked with ``uncond=None``.
      uncond: ``[..., V]`` unconditional logits broadcastable to ``cond``, or ``None``.
      scale: guidance scale ``s`` (HF requires ``s > 1``), scalar or per row.

    Returns:
      ``[..., V]`` guided logits in the input dtype (``[B, ..., V]`` for stacked input).

    >>> import jax.numpy as jnp
    >>> classifier_free_guidance_logits(jnp.array([[2.0, 0.0], [1.0, 1.0]]), None, 3.0).tolist()
    [[4.0, -2.0]]
    """
    x, u, s, dtype = _inputs(cond, uncond, scale)
    return _math.restore(_combine(x, u, s), dtype)
