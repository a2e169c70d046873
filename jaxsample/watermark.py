"""Greenlist watermark (Kirchenbauer et al. 2023) exactly as HF ``WatermarkLogitsProcessor`` / ``WatermarkDetector``.

Generation adds ``bias`` to the logits of a *greenlist*: the first ``G = int(V * greenlist_ratio)``
entries of ``torch.randperm(V)`` drawn from torch's CPU generator seeded by a hash of the context.
The seeds, the permutation and hence the greenlists are HF's bit for bit (:mod:`jaxsample._torch_rng`):

* ``seeding_scheme="lefthash"``: ``seed = hashing_key * previous_token``. As in HF, only the last
  token enters the hash whatever ``context_width`` is; ``context_width`` only sets how many tokens
  a row needs before it is watermarked.
* ``"selfhash"``: for each of the 40 highest logits' tokens ``c`` (HF's fixed rejection budget),
  ``seed = min_j(hashing_key * (T[w_j] + 1) * (T[c] + 1))`` in wrapping int64 over the window
  ``w`` = the last ``context_width - 1`` tokens and ``c``, with ``T = randperm(1_000_003)`` seeded by
  ``hashing_key``; ``c`` is biased iff it lies in its own greenlist.

torch's generator keeps ``seed mod 2**64 - 1`` and then its low 32 bits; both are reproduced.

Deviations, on purpose:

* ``greenlist_ratio`` is a traced per-row float32, so ``G = floor(V * ratio)`` is computed in float32:
  equal to HF's float64 ``int(V * ratio)`` except where ``V * ratio`` lies within float32 rounding
  of an integer for a ratio float32 cannot hold exactly (``V=10, ratio=0.7``: 6 here, 7 in HF).
  Ratios with short binary expansions (0.25, 0.5, 0.125, ...) are always exact.
* A row with fewer than ``context_width`` tokens is left unchanged; HF skips the whole batch when
  the (padded) ``input_ids`` are shorter. Padding (``-1``) is skipped, not hashed.
* ``V`` is the width of the logits (HF: the model config's ``vocab_size``, normally the same).

Sharding/TPU: rows are independent; shard the batch axis. Each row runs torch's ``randperm`` prefix
test (a ``lax.map`` over rows in batches of 64); no batch-level branch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _torch_rng, _validate
from jaxsample._history import compact
from jaxsample._types import Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage

SCHEMES = ("lefthash", "selfhash")
#: HF's defaults (``WatermarkingConfig``).
DEFAULT_HASHING_KEY = 15485863
#: Size of HF's fixed hashing table for ``selfhash``.
TABLE_SIZE = 1_000_003
#: HF's rejection budget for ``selfhash``: only the 40 best tokens are tested against their greenlist.
SELFHASH_CANDIDATES = 40


class WatermarkConfig(NamedTuple):
    """The static part of HF's ``WatermarkingConfig`` (``greenlist_ratio`` and ``bias`` are per-row values)."""

    greenlist_ratio: float = 0.25
    bias: float = 2.0
    hashing_key: int = DEFAULT_HASHING_KEY
    seeding_scheme: str = "lefthash"
    context_width: int = 1


def watermark_config(config: Any = None, **overrides) -> WatermarkConfig:
    """Validated :class:`WatermarkConfig` from HF's ``WatermarkingConfig``, a dict, or keywords.

    Raises:
      ValueError: naming the field, on a value HF rejects (or that cannot be reproduced exactly).
    """
    fields = {} if config is None else _fields(config)
    fields.update(overrides)
    unknown = sorted(set(fields) - set(WatermarkConfig._fields))
    if unknown:
        raise ValueError(f"watermarking_config: unknown field(s) {unknown}; expected {list(WatermarkConfig._fields)}")
    cfg = WatermarkConfig(**fields)
    if cfg.seeding_scheme not in SCHEMES:
        raise ValueError(f"seeding_scheme has to be one of {list(SCHEMES)}, got {cfg.seeding_scheme!r}")
    if not 0.0 < float(cfg.greenlist_ratio) < 1.0:
        raise ValueError(f"greenlist_ratio has to be in (0, 1), got {cfg.greenlist_ratio!r}")
    if not math.isfinite(float(cfg.bias)):
        raise ValueError(f"bias has to be finite, got {cfg.bias!r}")
    key = _validate.static_int(cfg.hashing_key, "hashing_key", lo=0)
    if key >= 2**63:
        raise ValueError(f"hashing_key has to be < 2**63 (HF multiplies it in int64), got {key}")
    width = _validate.static_int(cfg.context_width, "context_width", lo=1)
    return cfg._replace(hashing_key=key, context_width=width, greenlist_ratio=float(cfg.greenlist_ratio),
                        bias=float(cfg.bias))


def _fields(config: Any) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise ValueError(f"watermarking_config must be a WatermarkingConfig or a dict, got {type(config).__name__}")


@functools.lru_cache(maxsize=8)
def _self_table(hashing_key: int, vocab_size: int) -> np.ndarray:
    """``uint32[V]``: ``fixed_table[t % TABLE_SIZE] + 1`` for every token ``t`` (HF's selfhash factors)."""
    table = _torch_rng.randperm_numpy(hashing_key, TABLE_SIZE)
    return (table[np.arange(vocab_size) % TABLE_SIZE] + 1).astype(np.uint32)


def _lefthash_seed(previous: Array, key: int) -> Array:
    """uint32 generator seed of HF's lefthash: ``(key * previous) mod (2**64 - 1)``, low 32 bits."""
    kh, kl = _torch_rng.split64(key)
    t = previous.astype(jnp.uint32)
    h1, l1 = _torch_rng.mul32(jnp.uint32(kl), t)
    h2, l2 = _torch_rng.mul32(jnp.uint32(kh), t)
    mid = h1 + l2
    top = h2 + (mid < h1).astype(jnp.uint32)  # key * t = top * 2**64 + (mid, l1); 2**64 = 1 mod 2**64 - 1
    hi, lo = _torch_rng.add64((mid, l1), (jnp.zeros_like(top), top))
    wrapped = (hi < mid) | ((hi == mid) & (lo < l1))
    hi, lo = _torch_rng.add64((hi, lo), (jnp.zeros_like(lo), wrapped.astype(jnp.uint32)))
    full = (hi == np.uint32(0xFFFFFFFF)) & (lo == np.uint32(0xFFFFFFFF))
    return jnp.where(full, jnp.uint32(0), lo)


def _selfhash_seed(window: Array, candidate: Array, key: int, factors: Array) -> Array:
    """uint32 seed of HF's selfhash for ``window int32[..., W-1]`` + ``candidate int32[...]``."""
    k = tuple(jnp.uint32(w) for w in _torch_rng.split64(key))
    b = factors[candidate]
    best = None
    for a in [factors[window[..., j]] for j in range(window.shape[-1])] + [b]:
        p = _torch_rng.mul64(_torch_rng.mul64(k, (jnp.zeros_like(a), a)), (jnp.zeros_like(b), b))
        best = p if best is None else tuple(jnp.where(_torch_rng.less64_signed(p, best), x, y) for x, y in zip(p, best))
    negative = best[0] >= np.uint32(0x80000000)
    return jnp.where(negative, best[1] - 1, best[1])  # Python's seed % (2**64 - 1), low 32 bits


def greenlist_size(vocab_size: int, greenlist_ratio: ArrayLike) -> Array:
    """``int32[...]``: ``floor(V * ratio)`` in float32, the number of green tokens."""
    size = jnp.floor(jnp.float32(vocab_size) * jnp.asarray(greenlist_ratio, jnp.float32))
    return jnp.clip(size, 0, vocab_size).astype(jnp.int32)


def greenlist(seed: ArrayLike, vocab_size: int, size: ArrayLike) -> Array:
    """``bool[..., V]``: HF's greenlist (``randperm(V)[:size]`` under ``manual_seed(seed)``) as a mask.

    ``seed``: uint32 ``[...]`` (torch keeps the low 32 bits of a seed); ``size``: int ``[...]``.
    """
    seed = jnp.asarray(seed, jnp.uint32)
    size = jnp.broadcast_to(jnp.asarray(size, jnp.int32), seed.shape)
    fn = lambda s, g: _torch_rng.randperm_prefix_mask(s, vocab_size, g)  # noqa: E731
    flat = jax.vmap(fn)(seed.reshape(-1), size.reshape(-1))
    return flat.reshape(seed.shape + (vocab_size,))


def _green_member(seed: Array, vocab_size: int, size: Array, token: Array) -> Array:
    """``bool[...]``: whether ``token`` is in the greenlist of ``seed``, ``lax.map``-chunked over rows."""
    shape = seed.shape
    args = (seed.reshape(-1), jnp.broadcast_to(size, shape).reshape(-1), token.reshape(-1))
    fn = lambda a: _torch_rng.randperm_prefix_mask(a[0], vocab_size, a[1])[a[2]]  # noqa: E731
    return jax.lax.map(fn, args, batch_size=64).reshape(shape)


def watermark(
    logits: Float["*B V"],
    history: Int["*B T"],
    greenlist_ratio: ArrayLike = 0.25,
    bias: ArrayLike = 2.0,
    *,
    hashing_key: int = DEFAULT_HASHING_KEY,
    seeding_scheme: str = "lefthash",
    context_width: int = 1,
) -> Float["*B V"]:
    """HF ``WatermarkLogitsProcessor``: ``+bias`` on the greenlist seeded by the context.

    Args:
      logits: ``[..., V]``.
      history: ``int32[..., T]`` prompt + generated ids, oldest first (``-1`` padding skipped);
        only the last ``context_width`` tokens matter.
      greenlist_ratio: ``gamma`` in ``(0, 1)``, per row (traced).
      bias: ``delta``, per row (traced).
      hashing_key: static int in ``[0, 2**63)``.
      seeding_scheme: static ``"lefthash"`` or ``"selfhash"``.
      context_width: static int ``>= 1``.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> out = watermark(jnp.zeros(8), jnp.array([3]), 0.5, 1.0)
    >>> int(out.sum())  # 4 of 8 tokens are green
    4
    """
    cfg = watermark_config(hashing_key=hashing_key, seeding_scheme=seeding_scheme, context_width=context_width)
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    history = _validate.check_tokens(history, "history", batch)
    gamma = _validate.param(greenlist_ratio, batch, "greenlist_ratio", lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    delta = _validate.param(bias, batch, "bias")
    return _math.restore(_watermark(x, history, gamma, delta, cfg), dtype)


def _watermark(x: Array, history: Array, gamma: Array, delta: Array, cfg: WatermarkConfig) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]``, ``[*B]`` ratio and bias."""
    vocab = x.shape[-1]
    gamma = jnp.where(jnp.isnan(gamma), 0.0, jnp.clip(gamma, 0.0, 1.0))  # traced out-of-range values: clamped
    delta = jnp.where(jnp.isnan(delta), 0.0, jnp.clip(delta, -1e30, 1e30))  # NaN: off; infinities: clamped
    w = cfg.context_width
    if history.shape[-1] < w:
        return x
    c, m = compact(history[..., history.shape[-1] - w :], vocab)
    size = greenlist_size(vocab, gamma)
    if cfg.seeding_scheme == "lefthash":
        green = greenlist(_lefthash_seed(jnp.maximum(c[..., -1], 0), cfg.hashing_key), vocab, size)
    else:
        k = min(SELFHASH_CANDIDATES, vocab)
        _, cand = jax.lax.top_k(x, k)
        factors = jnp.asarray(_self_table(cfg.hashing_key, vocab))
        window = jnp.broadcast_to(jnp.maximum(c[..., 1:], 0)[..., None, :], cand.shape + (w - 1,))
        seed = _selfhash_seed(window, cand, cfg.hashing_key, factors)
        hit = _green_member(seed, vocab, jnp.broadcast_to(size[..., None], cand.shape), cand)
        green = _math.scatter(jnp.zeros(x.shape, bool), jnp.where(hit, cand, vocab), hit, "max")
    on = green & (m >= w)[..., None]
    return x + jnp.where(on, delta[..., None], 0.0)


@dataclasses.dataclass(frozen=True)
class Watermark(Stage):
    """HF ``WatermarkLogitsProcessor`` (:func:`watermark`) over prompt + generated ids.

    ``hashing_key``, ``seeding_scheme`` and ``context_width`` are static (they fix the hash and
    the window). Params: ``greenlist_ratio`` (``gamma`` in ``(0, 1)``), ``watermark_bias`` (``delta``).
    """

    greenlist_ratio: float = dataclasses.field(default=0.25, compare=False)
    bias: float = dataclasses.field(default=2.0, compare=False)
    _: dataclasses.KW_ONLY
    hashing_key: int = DEFAULT_HASHING_KEY
    seeding_scheme: str = "lefthash"
    context_width: int = 1
    name: str = "watermark"

    def __post_init__(self):
        cfg = watermark_config(
            greenlist_ratio=self.greenlist_ratio, bias=self.bias, hashing_key=self.hashing_key,
            seeding_scheme=self.seeding_scheme, context_width=self.context_width,
        )
        for field, value in cfg._asdict().items():
            object.__setattr__(self, field, value)
        super().__post_init__()

    @property
    def config(self) -> WatermarkConfig:
        return WatermarkConfig(*(getattr(self, f) for f in WatermarkConfig._fields))

    @property
    def params(self) -> tuple[Param, ...]:
        return (
            Param("greenlist_ratio", self.greenlist_ratio, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
            Param("watermark_bias", self.bias),
        )

    @property
    def history(self) -> int:
        return self.context_width

    def update(self, x, state, params, info):
        return _watermark(x, info.history, params["greenlist_ratio"], params["watermark_bias"], self.config), state
