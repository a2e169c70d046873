"""Detection of the greenlist watermark, as HF ``WatermarkDetector``: green flags, z-score, p-value.

Each scored token is tested against the greenlist its context seeds (the same greenlists as
:func:`jaxsample.watermark`): position ``j`` is scored when the ``n = context_width + 1`` tokens
ending at ``j`` exist (``n = context_width`` for ``selfhash``, whose window includes the token
itself). With ``T`` scored tokens of which ``g`` are green,
``z = (g - gamma T) / sqrt(T gamma (1 - gamma))`` and ``p = P(N(0, 1) > z)``. With
``ignore_repeated_ngrams`` every distinct n-gram counts once. The green flags run under ``jit``;
the counts and statistics are float64 on the host, as HF computes them.

Deviation: HF takes a rectangular batch without padding; here entries ``< 0`` are padding and a
window that touches one is not scored (for unpadded input the results are identical).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample import _validate
from jaxsample.watermark import (
    _green_member,
    _lefthash_seed,
    _self_table,
    _selfhash_seed,
    greenlist_size,
    watermark_config,
)


class WatermarkDetection(NamedTuple):
    """HF ``WatermarkDetectorOutput`` fields (float64 / bool numpy arrays ``[B]``) plus the per-token flags."""

    num_tokens_scored: np.ndarray
    num_green_tokens: np.ndarray
    green_fraction: np.ndarray
    z_score: np.ndarray
    p_value: np.ndarray
    prediction: np.ndarray
    confidence: np.ndarray
    green: np.ndarray  # bool[B, T]: token j is green in the greenlist of its context
    scored: np.ndarray  # bool[B, T]: token j is counted (first occurrences only with ignore_repeated_ngrams)


@functools.partial(jax.jit, static_argnames=("vocab_size", "key", "scheme", "width"))
def _flags(tokens, ratio, *, vocab_size, key, scheme, width):
    """``(green, windowed)`` ``bool[B, T]`` for ``tokens int32[B, T]``."""
    b, t = tokens.shape
    n = width + (scheme == "lefthash")
    pad = jnp.full((b, n - 1), -1, jnp.int32)
    padded = jnp.concatenate([pad, tokens], axis=1)
    windows = jnp.stack([padded[:, i : i + t] for i in range(n)], axis=-1)  # [B, T, n], token j last
    windowed = jnp.all((windows >= 0) & (windows < vocab_size), axis=-1)
    safe = jnp.where(windowed[..., None], windows, 0)
    size = jnp.broadcast_to(greenlist_size(vocab_size, ratio)[:, None], (b, t))
    if scheme == "lefthash":
        seed = _lefthash_seed(safe[..., -2], key)
    else:
        factors = jnp.asarray(_self_table(key, vocab_size))
        seed = _selfhash_seed(safe[..., :-1], safe[..., -1], key, factors)
    return _green_member(seed, vocab_size, size, safe[..., -1]) & windowed, windowed


def _first_occurrences(tokens: np.ndarray, scored: np.ndarray, n: int) -> np.ndarray:
    """``bool[B, T]``: scored positions whose n-gram did not end an earlier scored position."""
    b, t = tokens.shape
    padded = np.concatenate([np.full((b, n - 1), -1, tokens.dtype), tokens], axis=1)
    windows = np.stack([padded[:, i : i + t] for i in range(n)], axis=-1)
    out = np.zeros_like(scored)
    for r in range(b):
        seen = set()
        for j in np.flatnonzero(scored[r]):
            gram = tuple(windows[r, j].tolist())
            out[r, j] = gram not in seen
            seen.add(gram)
    return out


def detect_watermark(
    tokens: Any,
    *,
    vocab_size: int,
    watermarking_config: Any = None,
    greenlist_ratio: Any = None,
    ignore_repeated_ngrams: bool = False,
    z_threshold: float = 3.0,
    bos_token_id: int | None = None,
    **config: Any,
) -> WatermarkDetection:
    """HF ``WatermarkDetector(...)(tokens, z_threshold, return_dict=True)``.

    Args:
      tokens: ``int[B, T]`` generated ids (HF advises removing the prompt), ``-1`` padding.
      vocab_size: ``V`` the text was watermarked with.
      watermarking_config: HF ``WatermarkingConfig`` or dict (else the keywords in ``config``:
        ``hashing_key``, ``seeding_scheme``, ``context_width``).
      greenlist_ratio: overrides the config's ``gamma``; may be one value per row.
      ignore_repeated_ngrams: count each distinct n-gram once (HF's option).
      z_threshold: ``prediction = z_score > z_threshold``.
      bos_token_id: as HF, a leading BOS column is dropped (every row or none must start with it).

    Returns:
      :class:`WatermarkDetection`. Rows with nothing scored get NaN statistics (HF divides by 0).

    Raises:
      ValueError: on inconsistent BOS, too few tokens, or a bad config field (named).
    """
    cfg = watermark_config(watermarking_config, **config)
    tokens = np.asarray(_validate.check_tokens(tokens, "tokens"))
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [B, T], got {tokens.shape}")
    vocab_size = _validate.static_int(vocab_size, "vocab_size", lo=1)
    if bos_token_id is not None:
        has_bos = tokens[:, 0] == bos_token_id
        if has_bos.any() != has_bos.all():
            raise ValueError("Some rows start with bos_token_id and others do not: tokenize them the same way")
        if has_bos.all():
            tokens = tokens[:, 1:]
    if tokens.shape[1] - cfg.context_width < 1:
        raise ValueError(
            f"tokens must hold at least context_width + 1 = {cfg.context_width + 1} tokens per row, "
            f"got {tokens.shape[1]}"
        )
    ratio = cfg.greenlist_ratio if greenlist_ratio is None else greenlist_ratio
    _validate.check_range(ratio, "greenlist_ratio", lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    gamma = np.broadcast_to(np.asarray(ratio, np.float64), tokens.shape[:1])
    green, scored = _flags(
        jnp.asarray(tokens), jnp.asarray(gamma, jnp.float32), vocab_size=vocab_size, key=cfg.hashing_key,
        scheme=cfg.seeding_scheme, width=cfg.context_width,
    )
    green, scored = np.asarray(green), np.asarray(scored)
    if ignore_repeated_ngrams:
        scored = _first_occurrences(tokens, scored, cfg.context_width + (cfg.seeding_scheme == "lefthash"))
    total = scored.sum(axis=1).astype(np.float64)
    count = (green & scored).sum(axis=1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (count - gamma * total) / np.sqrt(total * gamma * (1 - gamma))
        fraction = count / total
    p = np.array([0.5 * math.erfc(v / math.sqrt(2)) if not math.isnan(v) else np.nan for v in z])
    return WatermarkDetection(total, count, fraction, z, p, z > z_threshold, 1 - p, green, scored)
