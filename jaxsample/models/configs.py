"""Model configurations: frozen, hashable dataclasses with named sizes ``tiny`` / ``small`` / ``base``.

``tiny`` trains in minutes on two CPU cores (tests, demos); ``small`` is a single-host TPU size;
``base`` has the dimensions of ``facebook/bart-base`` (6+6 layers, d_model 768, 12 heads, FFN 3072,
vocabulary 50265) and of GPT-2 small (12 layers, same widths, vocabulary 50257) for the decoder-only
model. Special ids follow the BART/RoBERTa layout (``<s>=0, <pad>=1, </s>=2, <unk>=3``, ``<mask>`` last);
override them to match your tokenizer:

>>> cfg = get_config("bart", "tiny", vocab_size=300)
>>> (cfg.d_model, cfg.encoder_layers, cfg.decoder_start_id, cfg.mask_id)
(128, 2, 2, 299)

Configs are hashable, so a model built from one can be a static argument of ``jax.jit``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import jax.numpy as jnp

ARCHS = ("decoder", "bart")
SIZES = ("tiny", "small", "base")
_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Common:
    """Fields shared by both architectures (see the subclasses)."""

    vocab_size: int
    d_model: int
    num_heads: int
    d_ff: int
    max_len: int  # longest sequence (positions 0..max_len-1) the model is built for
    dropout_rate: float = 0.0  # residual, embedding and activation dropout (training only)
    attention_dropout_rate: float = 0.0  # dropout on attention probabilities (training only)
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    dtype: str = "float32"  # compute dtype: "float32" or "bfloat16" (params are always float32)
    bos_id: int = 0
    pad_id: int = 1
    eos_id: int = 2
    mask_id: int = -1  # -1: last id of the vocabulary (BART's <mask>)
    decoder_start_id: int = -1  # -1: the architecture's default (eos for BART, bos for the LM)

    arch: ClassVar[str] = ""
    _SIZE_FIELDS: ClassVar[tuple[str, ...]] = ("vocab_size", "d_model", "num_heads", "d_ff", "max_len")
    _POSITIVE_FLOATS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        from jaxsample import config as _config

        _config.check_types(self)
        for name in self._SIZE_FIELDS:
            if not 1 <= getattr(self, name) < 2**31:
                raise ValueError(f"{name} must be in [1, 2**31), got {getattr(self, name)}")
        for name in ("layer_norm_eps", "init_std") + self._POSITIVE_FLOATS:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.mask_id == -1:
            object.__setattr__(self, "mask_id", self.vocab_size - 1)
        if self.decoder_start_id == -1:
            object.__setattr__(self, "decoder_start_id", self._default_start())
        for name in ("bos_id", "pad_id", "eos_id", "mask_id", "decoder_start_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size}), got {getattr(self, name)}")

    def _default_start(self) -> int:
        raise NotImplementedError

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-able dict, including ``arch``."""
        return {"arch": self.arch, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig(_Common):
    """Decoder-only LM: pre-LayerNorm blocks, rotary positions, GELU MLP, tied embeddings."""

    num_layers: int
    rope_theta: float = 10_000.0

    arch: ClassVar[str] = "decoder"
    _SIZE_FIELDS: ClassVar[tuple[str, ...]] = _Common._SIZE_FIELDS + ("num_layers",)
    _POSITIVE_FLOATS: ClassVar[tuple[str, ...]] = ("rope_theta",)

    def _default_start(self) -> int:
        return self.bos_id


@dataclasses.dataclass(frozen=True, kw_only=True)
class BartConfig(_Common):
    """BART encoder-decoder: post-LayerNorm, learned positions, embedding LayerNorm, GELU, tied embeddings.

    ``norm_first=True`` gives mBART's variant: pre-LayerNorm sublayers and a final LayerNorm after
    each stack, which trains from scratch more stably at high learning rates (the demo uses it).
    """

    encoder_layers: int
    decoder_layers: int
    scale_embedding: bool = False  # multiply token embeddings by sqrt(d_model) (False in bart-base)
    norm_first: bool = False  # pre-LN + final stack norms (mBART) instead of post-LN (BART)

    arch: ClassVar[str] = "bart"
    _SIZE_FIELDS: ClassVar[tuple[str, ...]] = _Common._SIZE_FIELDS + ("encoder_layers", "decoder_layers")

    def _default_start(self) -> int:
        return self.eos_id


ModelConfig = DecoderConfig | BartConfig

_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "decoder": {
        "tiny": dict(vocab_size=512, d_model=128, num_heads=4, d_ff=512, num_layers=2, max_len=256),
        "small": dict(vocab_size=16384, d_model=384, num_heads=6, d_ff=1536, num_layers=6, max_len=512),
        "base": dict(vocab_size=50257, d_model=768, num_heads=12, d_ff=3072, num_layers=12, max_len=1024,
                     dropout_rate=0.1, attention_dropout_rate=0.1),
    },
    "bart": {
        "tiny": dict(vocab_size=512, d_model=128, num_heads=4, d_ff=512, encoder_layers=2, decoder_layers=2,
                     max_len=256),
        "small": dict(vocab_size=16384, d_model=384, num_heads=6, d_ff=1536, encoder_layers=4,
                      decoder_layers=4, max_len=512),
        "base": dict(vocab_size=50265, d_model=768, num_heads=12, d_ff=3072, encoder_layers=6,
                     decoder_layers=6, max_len=1024, dropout_rate=0.1, attention_dropout_rate=0.1),
    },
}
_CLASSES = {"decoder": DecoderConfig, "bart": BartConfig}


def get_config(arch: str, size: str, **overrides: Any) -> ModelConfig:
    """The named size ``size`` of architecture ``arch`` (``"decoder"`` or ``"bart"``), with overrides.

    Raises:
      ValueError: on an unknown architecture, size or field, or an invalid value.
    """
    if arch not in _SIZES:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if size not in _SIZES[arch]:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return config_from_dict({"arch": arch, **_SIZES[arch][size], **overrides})


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    """Inverse of ``config.to_dict()``; unknown keys raise ``ValueError`` naming them."""
    d = dict(d)
    arch = d.pop("arch", None)
    if arch not in _CLASSES:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    cls = _CLASSES[arch]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"unknown {arch} config field(s) {unknown}; known: {sorted(fields)}")
    return cls(**d)


#: ``kind`` of model config files.
KIND = "model"


def load_config(path: str, overrides: Sequence[str] = ()) -> ModelConfig:
    """Reads a YAML file written like ``configs/models/*.yaml`` (``arch`` plus fields), with overrides."""
    from jaxsample import config as _config

    data = _config.read(path, overrides, kind=KIND)
    try:
        return config_from_dict(data)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from None


def config_diff(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """Fields that differ between two configs: ``{name: (a_value, b_value)}`` (``arch`` included)."""
    da, db = a.to_dict(), b.to_dict()
    return {k: (da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)}
