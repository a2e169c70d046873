"""Build configuration: nested frozen dataclasses, loaded from YAML with ``section.key=value`` overrides.

Unknown keys and invalid values raise ``ValueError`` naming the offending key, when the config is built.
``configs/wakong/article.yaml`` holds the defaults of the Wakong article's own use (sentences masked at
word level, 256-token BART inputs); ``configs/wakong/bart.yaml`` the BART paper's recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Mapping, Sequence

from wakong.infilling import NoiseConfig, SpanSpec
from wakong.sources import FORMATS, TEXT_SPLITS
from wakong.tokenizer import SpecialTokens


def _choice(name: str, value: Any, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """How raw records are read.

    Attributes:
      format: ``text`` / ``jsonl`` (plain, ``.gz`` or ``.zst`` files), ``array_record``, ``parquet``,
        ``arrow`` (Arrow IPC files or Hugging Face ``datasets`` directories) or ``pydoc`` (Python's docs,
        no files needed).
      split: for ``text``: ``line``, ``paragraph`` or ``file``.
      field: JSON field holding the text (``jsonl``; ``array_record``, ``parquet`` and ``arrow`` records
        are JSON when it is set).
      column: the column holding the text (``parquet``, ``arrow``).
      utf8_errors: ``replace`` (U+FFFD, counted) or ``strict`` (drop the record, counted).
      max_record_bytes: larger records are cut (``oversize: truncate``) or dropped (``drop``), counted.
    """

    format: str = "text"
    split: str = "line"
    field: str | None = None
    column: str = "text"
    utf8_errors: str = "replace"
    max_record_bytes: int = 1 << 24
    oversize: str = "truncate"

    def __post_init__(self):
        _choice("input.format", self.format, FORMATS)
        if not isinstance(self.column, str) or not self.column:
            raise ValueError(f"input.column must be a column name, got {self.column!r}")
        _choice("input.split", self.split, TEXT_SPLITS)
        _choice("input.utf8_errors", self.utf8_errors, ("replace", "strict"))
        _choice("input.oversize", self.oversize, ("truncate", "drop"))
        _positive("input.max_record_bytes", self.max_record_bytes)
        if self.format == "jsonl" and not self.field:
            object.__setattr__(self, "field", "text")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """``path`` to a ``tokenizer.json`` or a SentencePiece ``.model``, or ``None`` to train a byte-level BPE
    on the corpus (``vocab_size``, ``min_frequency``). ``special``: the names of BART's special tokens."""

    path: str | None = None
    vocab_size: int = 8192
    min_frequency: int = 2
    special: SpecialTokens = SpecialTokens()

    def __post_init__(self):
        _positive("tokenizer.vocab_size", self.vocab_size)
        _positive("tokenizer.min_frequency", self.min_frequency)


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
    """How records become examples.

    Attributes:
      unit: ``sentence`` (each sentence one example, as the Wakong author trained) or ``document``
        (consecutive sentences packed into examples that fit, as BART does).
      min_words: shorter sentences (``sentence``) or documents (``document``) are dropped, counted.
      max_source_len, max_target_len: encoder / decoder lengths including BOS and EOS.
      too_long: an example that does not fit is ``split`` into pieces at sentence, then word,
        boundaries; ``truncate`` keeps the first piece; ``drop`` drops it. All counted.
    """

    unit: str = "sentence"
    min_words: int = 1
    max_source_len: int = 256
    max_target_len: int = 256
    too_long: str = "split"

    def __post_init__(self):
        _choice("examples.unit", self.unit, ("sentence", "document"))
        _choice("examples.too_long", self.too_long, ("split", "truncate", "drop"))
        _positive("examples.min_words", self.min_words)
        for name in ("max_source_len", "max_target_len"):
            if int(getattr(self, name)) < 3:
                raise ValueError(f"examples.{name} must be >= 3 (BOS, a token, EOS), got {getattr(self, name)}")


#: What ``wakong build`` writes: noised examples, or tokenized documents for noising on the device.
OUTPUT_MODES = ("noised", "tokenized")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """``num_shards`` ArrayRecord files per host; ``mode``: ``noised`` (examples noised on the host, the
    default) or ``tokenized`` (unnoised documents: token ids, word and sentence starts; the trainer noises
    them on the device, :mod:`wakong.device_noise`, with the config's ``noise`` section as default)."""

    num_shards: int = 1
    mode: str = "noised"

    def __post_init__(self):
        _positive("output.num_shards", self.num_shards)
        _choice("output.mode", self.mode, OUTPUT_MODES)


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything that determines a built dataset (recorded in its manifest)."""

    seed: int = 0
    input: InputConfig = InputConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    examples: ExampleConfig = ExampleConfig()
    noise: NoiseConfig = NoiseConfig()
    output: OutputConfig = OutputConfig()

    def __post_init__(self):
        if int(self.seed) != self.seed or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the settings that change the records (not paths or shards;
        the output mode only when it is not the default, so noised datasets keep their fingerprints)."""
        d = self.to_dict()
        d["tokenizer"].pop("path")
        mode = d.pop("output")["mode"]
        if mode != "noised":
            d["mode"] = mode
        if self.input.format not in ("parquet", "arrow"):  # unused: fingerprints stay those of earlier builds
            d["input"].pop("column")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


#: ``kind`` of build config files.
KIND = "wakong.build"


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> BuildConfig:
    """Reads a YAML config (``None``: defaults) and applies ``section.key=value`` overrides (YAML values).

    >>> config = load_config(overrides=["noise.spans.budget_rate=0.4", "examples.unit=document"])
    >>> config.noise.spans.budget_rate, config.examples.unit
    (0.4, 'document')
    """
    from jaxsample import config as _config  # here: worker processes unpickling a config need not import jax

    data = _config.read(path, overrides, kind=KIND)
    return config_from_dict(data)


def config_from_dict(data: Mapping) -> BuildConfig:
    """Builds a :class:`BuildConfig` from nested mappings (e.g. a manifest's ``config``)."""
    from jaxsample import config as _config

    return _config.build(BuildConfig, data)


__all__ = [
    "BuildConfig",
    "ExampleConfig",
    "InputConfig",
    "NoiseConfig",
    "OUTPUT_MODES",
    "OutputConfig",
    "SpanSpec",
    "TokenizerConfig",
    "config_from_dict",
    "load_config",
]
