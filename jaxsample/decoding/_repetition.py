"""vLLM's repetition detection (``SamplingParams.repetition_detection``) as a stopping rule.

vLLM (``RepetitionDetectionParams``, checked by the scheduler's ``check_stop`` after each token):
a row stops when its generated tokens end with ``min_count`` consecutive copies of a pattern of
``L`` tokens, for some ``L`` in ``[min_pattern_size, max_pattern_size]`` (``min_pattern_size = 0``
means 1; ``max_pattern_size = 0`` or ``min_count < 2`` disables the rule). Only generated tokens
count, never the prompt; the finish reason is :attr:`FinishReason.REPETITION` (vLLM's stop reason
``"repetition_detected"``), after EOS, stop sequences and length in priority.

On device: for each static ``L <= Lmax`` (``Lmax``: the static largest pattern size, the width of
:attr:`Repetition.sizes`), the last ``L * min_count`` tokens repeat with period ``L`` iff
``tokens[i] == tokens[i + L]`` for every ``i`` in ``[n - L * min_count, n - L)``; one comparison
pass over the buffer per ``L``. Per-row sizes and counts are traced: new values never recompile.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxsample import _validate
from jaxsample._types import Array

_FIELDS = ("max_pattern_size", "min_pattern_size", "min_count")


class Repetition(NamedTuple):
    """Per-row repetition-detection values (traced) and the static pattern-size bound."""

    min_size: Array  # int32[B]: >= 1
    max_size: Array  # int32[B]: 0 = off
    min_count: Array  # int32[B]: < 2 = off
    sizes: Array  # int32[Lmax]: 1..Lmax, its shape is the static bound


def params(batch: int, spec: Mapping[str, Any] | None, bound: int | None = None) -> Repetition | None:
    """Validates ``spec`` (vLLM's fields, ints or ``int[B]``) for ``batch`` rows; ``None`` -> no rule.

    ``bound``: static largest pattern size checked (default: the largest concrete
    ``max_pattern_size``); fix it so that new sizes never recompile.
    """
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        spec = {f: getattr(spec, f) for f in _FIELDS if hasattr(spec, f)}  # a RepetitionDetectionParams
    unknown = sorted(set(spec) - set(_FIELDS) - {"bound"})
    if unknown:
        raise ValueError(f"repetition_detection: unknown field(s) {unknown}; expected {list(_FIELDS)}")
    bound = spec.get("bound", bound)
    values = {}
    for f in _FIELDS:
        v = spec.get(f, 0)
        _validate.check_range(v, f"repetition_detection.{f}", lo=0, integer=True)
        values[f] = _validate.row_param(v, (batch,), f"repetition_detection.{f}", jnp.int32)
    if bound is None:
        if not _validate.is_concrete(spec.get("max_pattern_size", 0)):
            raise ValueError("repetition_detection needs 'bound' (static largest pattern size) for traced sizes")
        bound = int(np.max(np.asarray(spec.get("max_pattern_size", 0))))
    bound = _validate.static_int(bound, "repetition_detection.bound", lo=0)
    lo, hi = np.asarray(spec.get("min_pattern_size", 0)), np.asarray(spec.get("max_pattern_size", 0))
    if _validate.is_concrete(lo) and _validate.is_concrete(hi):
        on = np.broadcast_to(hi > 0, np.broadcast_shapes(lo.shape, hi.shape))
        if np.any(on & (np.maximum(lo, 1) > hi)):
            raise ValueError("repetition_detection.min_pattern_size must be <= max_pattern_size")
        if np.any(hi > bound):
            raise ValueError(f"repetition_detection.max_pattern_size must be <= bound ({bound})")
    min_size = jnp.maximum(values["min_pattern_size"], 1)
    sizes = jnp.arange(1, bound + 1, dtype=jnp.int32)
    return Repetition(min_size, values["max_pattern_size"], values["min_count"], sizes)


def detect(tokens: Array, length: Array, rep: Repetition) -> Array:
    """``bool[B]``: whether row ``b``'s ``tokens[b, :length[b]]`` ends in a repeated pattern (vLLM's rule)."""
    b, n = tokens.shape
    idx = jnp.arange(n)
    on = (rep.max_size > 0) & (rep.min_count >= 2)
    hit = jnp.zeros((b,), bool)
    for size in range(1, rep.sizes.shape[0] + 1):
        if size >= n:
            break
        same = tokens[:, :-size] == tokens[:, size:]  # [B, n - size]: tokens[i] == tokens[i + size]
        lo = length - size * rep.min_count
        window = (idx[None, : n - size] >= lo[:, None]) & (idx[None, : n - size] < (length - size)[:, None])
        periodic = jnp.all(same | ~window, axis=-1) & (lo >= 0)
        hit = hit | (periodic & (size >= rep.min_size) & (size <= rep.max_size))
    return on & hit
