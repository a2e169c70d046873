"""SynthID-Text watermark (Dathathri et al., Nature 2024) as HF ``SynthIDTextWatermarkLogitsProcessor``.

Generation (tournament sampling in its vectorised "update the distribution" form): for the context
``c`` (the last ``ngram_len - 1`` *generated* tokens, zeros before the first ones, as HF's state)
and each token ``v``, a g-value per depth ``d`` is ``g[v, d] = table[h(c, v, keys[d]) mod S]`` with
``h`` HF's int64 linear-congruential hash (``h <- (h + x) * 6364136223846793005 + 1`` from ``h = 1``
over the context, then ``v``, then the key) and ``table`` = ``torch.randint(0, 2, (S,))`` seeded
with ``sampling_table_seed`` (torch's generator reproduced, :mod:`jaxsample._torch_rng`). Then
``p <- softmax(logits)`` and, for each depth, ``p <- p * (1 + g_d - sum(g_d * p))``; the output is
``log p``. A row whose context hash is among its last ``context_history_size`` ones (a ring that
starts all zeros, as HF's) keeps its logits; with ``skip_first_ngram_calls`` the first
``ngram_len - 1`` steps are skipped (and not recorded). ``debug_mode`` replaces the logits with
ones first (HF's test mode).

Detection: :func:`synthid_g_values` (``g`` of each n-gram of a text), :func:`synthid_mask` (HF's
context-repetition and EOS masks) and the Mean / Weighted-Mean scores of the paper
(:func:`synthid_mean_score`, :func:`synthid_weighted_mean_score`, as DeepMind's ``synthid-text``).

Deviation: tokens whose probability becomes 0 get ``-inf`` (the project's convention), where HF
writes ``finfo(float32).min``; sampling is the same.

Sharding/TPU: rows are independent; shard the batch axis (and the state's, ``[*B, H]``). One hash per
token and depth, elementwise over ``[*B, V]``; no batch-level branch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _torch_rng, _validate
from jaxsample._types import NEG_INF, Array, ArrayLike, Float, Int
from jaxsample.chain import Stage

_MULTIPLIER = tuple(np.uint32(w) for w in _torch_rng.split64(6364136223846793005))


class SynthIDConfig(NamedTuple):
    """HF ``SynthIDTextWatermarkingConfig`` (all static: they fix shapes and tables)."""

    ngram_len: int
    keys: tuple[int, ...]
    context_history_size: int = 1024
    sampling_table_seed: int = 0
    sampling_table_size: int = 2**16
    skip_first_ngram_calls: bool = False
    debug_mode: bool = False


class SynthIDState(NamedTuple):
    """Hashes of the contexts already watermarked, newest first (HF's ``context_history``)."""

    hi: Array  # uint32[..., H]: high words of the int64 hashes
    lo: Array  # uint32[..., H]: low words


def synthid_config(config: Any = None, **overrides) -> SynthIDConfig:
    """Validated :class:`SynthIDConfig` from HF's ``SynthIDTextWatermarkingConfig``, a dict, or keywords."""
    fields = {} if config is None else (dict(config) if isinstance(config, Mapping) else dict(config.to_dict()))
    fields.update(overrides)
    unknown = sorted(set(fields) - set(SynthIDConfig._fields))
    if unknown:
        raise ValueError(
            f"watermarking_config: unknown SynthID field(s) {unknown}; expected {list(SynthIDConfig._fields)}"
        )
    missing = [f for f in ("ngram_len", "keys") if f not in fields]
    if missing:
        raise ValueError(f"watermarking_config: SynthID needs {missing}")
    cfg = SynthIDConfig(**fields)
    keys = tuple(int(k) for k in cfg.keys)
    if not keys or any(not -(2**63) <= k < 2**63 for k in keys):
        raise ValueError(f"keys must be a non-empty list of int64 values, got {cfg.keys!r}")
    size = _validate.static_int(cfg.sampling_table_size, "sampling_table_size", lo=1)
    if size > 2**24:
        raise ValueError(f"sampling_table_size has to be <= 2**24 (HF's limit), got {size}")
    return cfg._replace(
        ngram_len=_validate.static_int(cfg.ngram_len, "ngram_len", lo=1),
        keys=keys,
        context_history_size=_validate.static_int(cfg.context_history_size, "context_history_size", lo=1),
        sampling_table_seed=_validate.static_int(cfg.sampling_table_seed, "sampling_table_seed", lo=0),
        sampling_table_size=size,
        skip_first_ngram_calls=bool(cfg.skip_first_ngram_calls),
        debug_mode=bool(cfg.debug_mode),
    )


@functools.lru_cache(maxsize=8)
def _sampling_table(seed: int, size: int) -> np.ndarray:
    return _torch_rng.randint_numpy(seed, 2, size).astype(np.int32)


def _absorb(h: tuple[Array, Array], x: tuple[Array, Array]) -> tuple[Array, Array]:
    """One step of HF's ``accumulate_hash``: ``(h + x) * multiplier + 1`` (int64, wrapping)."""
    h = _torch_rng.mul64(_torch_rng.add64(h, x), _MULTIPLIER)
    return _torch_rng.add64(h, (jnp.zeros_like(h[0]), jnp.ones_like(h[1])))


def _token(t: Array) -> tuple[Array, Array]:
    t = t.astype(jnp.int32)
    return jnp.where(t < 0, np.uint32(0xFFFFFFFF), np.uint32(0)), t.astype(jnp.uint32)


def _context_hash(context: Array) -> tuple[Array, Array]:
    """HF's hash of ``context int32[..., n-1]``, from ``h = 1``."""
    h = (jnp.zeros(context.shape[:-1], jnp.uint32), jnp.ones(context.shape[:-1], jnp.uint32))
    for j in range(context.shape[-1]):
        h = _absorb(h, _token(context[..., j]))
    return h


def _g(h: tuple[Array, Array], key: int, table: Array) -> Array:
    """int32 g-values of hashes ``h`` (context + token already absorbed) at one depth ``key``."""
    kh, kl = _torch_rng.split64(key)
    k = (jnp.full(h[0].shape, kh, jnp.uint32), jnp.full(h[0].shape, kl, jnp.uint32))
    return table[_torch_rng.mod64_signed(_absorb(h, k), table.shape[0])]


def synthid_init(batch_shape: tuple[int, ...], config: SynthIDConfig) -> SynthIDState:
    """Empty context history (HF's zeros)."""
    shape = tuple(batch_shape) + (config.context_history_size,)
    return SynthIDState(jnp.zeros(shape, jnp.uint32), jnp.zeros(shape, jnp.uint32))


def synthid_watermark(
    logits: Float["*B V"], state: SynthIDState, history: Int["*B T"], position: Int["*B"] | int, config: SynthIDConfig
) -> tuple[Array, SynthIDState]:
    """One step of HF ``SynthIDTextWatermarkLogitsProcessor``.

    Args:
      logits: ``[..., V]``.
      state: :class:`SynthIDState` from :func:`synthid_init` (or the previous step).
      history: ``int32[..., T]`` ending with the generated tokens (only the last ``ngram_len - 1``
        generated ones are read; a prompt before them is ignored, as in HF).
      position: ``int32[...]``: tokens generated so far (HF's call count minus one).
      config: static :class:`SynthIDConfig` (see :func:`synthid_config`).

    Returns:
      ``(log-probabilities [..., V] in the input dtype, new state)``.
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    history = _validate.check_tokens(history, "history", batch)
    position = _validate.row_param(position, batch, "position", jnp.int32)
    out, state = _synthid_watermark(x, state, history, position, config)
    return _math.restore(out, dtype), state


def _synthid_watermark(x: Array, state: SynthIDState, history: Array, position: Array, config: SynthIDConfig):
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]``, ``position int32[*B]``."""
    batch, vocab = x.shape[:-1], x.shape[-1]
    if config.debug_mode:
        x = jnp.ones_like(x)
    n1 = config.ngram_len - 1
    t = history.shape[-1]
    if t < n1:
        history = jnp.concatenate([jnp.zeros(batch + (n1 - t,), jnp.int32), history], axis=-1)
    context = history[..., history.shape[-1] - n1 :]
    context = jnp.where(jnp.arange(n1) >= n1 - position[..., None], jnp.maximum(context, 0), 0)
    ctx = _context_hash(context)
    table = jnp.asarray(_sampling_table(config.sampling_table_seed, config.sampling_table_size))
    ids = jnp.arange(vocab, dtype=jnp.int32)
    h = _absorb(tuple(w[..., None] for w in ctx), _token(jnp.broadcast_to(ids, x.shape)))
    p = _math.softmax(x)
    for key in config.keys:
        g = _g(h, key, table).astype(jnp.float32)
        p = p * (1.0 + g - _math.row_sum(g * p, keepdims=True))
    marked = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), NEG_INF)
    repeated = jnp.any((state.hi == ctx[0][..., None]) & (state.lo == ctx[1][..., None]), axis=-1)
    out = jnp.where(repeated[..., None], x, marked)
    pushed = SynthIDState(*(jnp.concatenate([c[..., None], s[..., :-1]], axis=-1) for c, s in zip(ctx, state)))
    if config.skip_first_ngram_calls:
        skip = position < n1
        out = jnp.where(skip[..., None], x, out)
        pushed = SynthIDState(*(jnp.where(skip[..., None], s, q) for s, q in zip(state, pushed)))
    return out, pushed


@dataclasses.dataclass(frozen=True)
class SynthIDWatermark(Stage):
    """HF ``SynthIDTextWatermarkLogitsProcessor`` (:func:`synthid_watermark`).

    Every field is static (HF's config). The context is the last ``ngram_len - 1`` generated tokens;
    the state is the ring of the last ``context_history_size`` context hashes.
    """

    ngram_len: int
    keys: tuple[int, ...]
    context_history_size: int = 1024
    sampling_table_seed: int = 0
    sampling_table_size: int = 2**16
    skip_first_ngram_calls: bool = False
    debug_mode: bool = False
    _: dataclasses.KW_ONLY
    name: str = "synthid_watermark"

    def __post_init__(self):
        cfg = synthid_config(
            ngram_len=self.ngram_len, keys=tuple(self.keys), context_history_size=self.context_history_size,
            sampling_table_seed=self.sampling_table_seed, sampling_table_size=self.sampling_table_size,
            skip_first_ngram_calls=self.skip_first_ngram_calls, debug_mode=self.debug_mode,
        )
        for field, value in cfg._asdict().items():
            object.__setattr__(self, field, value)
        super().__post_init__()

    @property
    def config(self) -> SynthIDConfig:
        return SynthIDConfig(*(getattr(self, f) for f in SynthIDConfig._fields))

    @property
    def history(self) -> int:
        return self.ngram_len - 1

    def init(self, info):
        return synthid_init(info.batch_shape, self.config)

    def update(self, x, state, params, info):
        return _synthid_watermark(x, state, info.history, info.position, self.config)


# ------------------------------------------------------------------------------------ detection
def _windows(tokens: Array, n: int) -> Array:
    """``[..., T - n + 1, n]`` sliding windows."""
    t = tokens.shape[-1]
    return jnp.stack([tokens[..., i : t - n + 1 + i] for i in range(n)], axis=-1)


def synthid_g_values(tokens: ArrayLike, config: SynthIDConfig) -> Array:
    """HF ``compute_g_values``: ``int32[..., T - ngram_len + 1, depth]`` for every n-gram of ``tokens [..., T]``."""
    tokens = _validate.check_tokens(tokens, "tokens")
    if tokens.shape[-1] < config.ngram_len:
        raise ValueError(f"tokens must hold at least ngram_len = {config.ngram_len} tokens, got {tokens.shape[-1]}")
    table = jnp.asarray(_sampling_table(config.sampling_table_seed, config.sampling_table_size))
    h = _context_hash(_windows(tokens, config.ngram_len))
    return jnp.stack([_g(h, key, table) for key in config.keys], axis=-1)


def synthid_mask(tokens: ArrayLike, config: SynthIDConfig, eos_token_id: int | None = None) -> Array:
    """``bool[..., T - ngram_len + 1]``: the n-grams a detector should score (HF's masks combined).

    An n-gram is dropped when its context (first ``ngram_len - 1`` tokens) hashes like one of the
    previous ``context_history_size`` contexts (HF ``compute_context_repetition_mask``, whose history
    starts with zeros), or when it ends at or after the first ``eos_token_id``
    (``compute_eos_token_mask``).
    """
    tokens = _validate.check_tokens(tokens, "tokens")
    n, hsize = config.ngram_len, config.context_history_size
    t = tokens.shape[-1]
    if t < n:
        raise ValueError(f"tokens must hold at least ngram_len = {n} tokens, got {t}")
    hi, lo = _context_hash(_windows(tokens[..., :-1], n - 1))  # [..., C]
    c = t - n + 1
    i, j = np.arange(c)[:, None], np.arange(c)[None, :]
    near = jnp.asarray((j < i) & (j >= i - hsize))
    same = (hi[..., :, None] == hi[..., None, :]) & (lo[..., :, None] == lo[..., None, :])
    zero = (hi == 0) & (lo == 0) & jnp.asarray(np.arange(c) < hsize)
    keep = ~(jnp.any(same & near, axis=-1) | zero)
    if eos_token_id is not None:
        before_eos = jnp.cumsum(tokens == int(eos_token_id), axis=-1) == 0
        keep &= before_eos[..., n - 1 :]
    return keep


def synthid_mean_score(g_values: ArrayLike, mask: ArrayLike) -> Array:
    """Mean score: the mean of the unmasked g-values. ``g_values [B, L, D]``, ``mask [B, L]`` -> ``float32[B]``."""
    g = jnp.asarray(g_values, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    return jnp.sum(g * m[..., None], axis=(-2, -1)) / (g.shape[-1] * jnp.sum(m, axis=-1))


def synthid_weighted_mean_score(
    g_values: ArrayLike, mask: ArrayLike, weights: Sequence[float] | ArrayLike | None = None
) -> Array:
    """Weighted-mean score: depth ``d`` weighted by ``weights[d]`` (default ``linspace(10, 1, D)``),
    normalised to sum to ``D``. Shapes as :func:`synthid_mean_score`."""
    g = jnp.asarray(g_values, jnp.float32)
    depth = g.shape[-1]
    w = jnp.linspace(10.0, 1.0, depth) if weights is None else jnp.asarray(weights, jnp.float32)
    if w.shape != (depth,):
        raise ValueError(f"weights must have shape ({depth},) (one per depth), got {w.shape}")
    w = w * depth / jnp.sum(w)
    return synthid_mean_score(g * w, mask)
