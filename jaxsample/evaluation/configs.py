"""Config kinds of the evaluation runner: ``sampler``, ``decoding`` and ``eval`` (versioned YAML).

A **sampler** config names an ecosystem and that ecosystem's own field names; it is built with
:mod:`jaxsample.presets`::

    version: 1
    kind: sampler
    ecosystem: llama.cpp        # llama.cpp | vllm | hf | scenario
    settings: {temp: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05}

A **decoding** config picks a strategy (``greedy``, ``sample``, ``beam``, ``beam_sample``,
``group_beam``, ``contrastive``, ``best_of``), its settings, and a sampler (a name from
``configs/samplers/``, a path, or an inline mapping). An **eval** config names a checkpoint, a
dataset and a list of decoding configs (names, paths or inline mappings with a ``name``).

Names resolve to ``configs/<samplers|decoding>/<name>.yaml`` next to the referring file's
``configs`` directory first, then to the ``configs`` directory of this checkout. Every error names
the field (``decoding[2].num_beams``) and the file.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, Callable, Mapping, Sequence

from jaxsample import config as _config
from jaxsample import presets
from jaxsample.decoding.options import DecodingOptions

ECOSYSTEMS = ("llama.cpp", "vllm", "hf", "scenario")
STRATEGIES = ("greedy", "sample", "beam", "beam_sample", "group_beam", "contrastive", "best_of")
METRICS = ("reference", "exact_match", "infill", "token_accuracy", "distinct", "self_bleu", "length", "logprob")
PARALLEL = ("mesh", "pmap")

#: The shipped configs directory (sampler / decoding / eval files; see :func:`jaxsample.config.shipped_configs`).
CONFIGS_DIR = _config.shipped_configs()

_BUILDERS: dict[str, Callable] = {
    "llama.cpp": presets.llama_cpp,
    "vllm": presets.vllm,
    "hf": presets.hf,
}
# token-id fields filled in from the tokenizer when a config leaves them out
_EOS_FIELDS = {"llama.cpp": "eos_ids", "vllm": "eos_token_ids", "hf": "eos_token_id"}


def _fields(builder: Callable) -> list[str]:
    return [p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY]


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """A sampler chain in one ecosystem's vocabulary.

    Attributes:
      ecosystem: ``llama.cpp`` (``common_params_sampling`` fields: ``temp``, ``top_k``, ``mirostat``,
        ``dry_multiplier`` ...), ``vllm`` (``SamplingParams`` fields), ``hf`` (``GenerationConfig``
        fields, ``do_sample`` included) or ``scenario`` (``settings.name``: one of
        :data:`jaxsample.presets.SCENARIOS`, other settings are vLLM fields overriding it).
      settings: the ecosystem's field names and values. llama.cpp ``dry_sequence_breakers`` may be
        given as strings (llama's defaults are ``["\\n", ":", "\\"", "*"]``); they are turned into
        token ids with the evaluation tokenizer.
    """

    ecosystem: str = "vllm"
    settings: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.ecosystem not in ECOSYSTEMS:
            raise ValueError(f"ecosystem must be one of {', '.join(ECOSYSTEMS)}; got {self.ecosystem!r}")
        if self.ecosystem == "scenario":
            name = self.settings.get("name")
            if name not in presets.SCENARIOS:
                raise ValueError(f"settings.name must be one of {sorted(presets.SCENARIOS)}; got {name!r}")
        known = self._known()
        unknown = sorted(set(self.settings) - set(known))
        if unknown:
            raise ValueError(
                f"settings.{unknown[0]} is not a {self.ecosystem} field (known: {', '.join(sorted(known))})"
            )
        self.build()  # validates the values as the ecosystem does (errors name the field)

    def _known(self) -> list[str]:
        if self.ecosystem == "scenario":
            return ["name"] + list(presets.VLLM_SAMPLER_FIELDS)
        if self.ecosystem == "vllm":
            return list(presets.VLLM_SAMPLER_FIELDS)
        if self.ecosystem == "hf":
            return list(presets.HF_SAMPLER_FIELDS)
        return _fields(_BUILDERS[self.ecosystem])

    def build(self, *, eos_ids: Sequence[int] = (), tokenizer: Any = None) -> presets.Preset:
        """The :class:`~jaxsample.presets.Preset`; ``eos_ids`` fill the ecosystem's EOS field if unset.

        Args:
          eos_ids: the model's end-of-sequence ids (llama.cpp ``eos_ids``, vLLM ``eos_token_ids``,
            HF ``eos_token_id``), used unless ``settings`` gives them.
          tokenizer: a ``tokenizers.Tokenizer`` to turn string DRY breakers into token ids.

        Raises:
          ValueError: naming the ``settings.<field>`` the ecosystem rejects.
        """
        settings = dict(self.settings)
        ecosystem = "vllm" if self.ecosystem == "scenario" else self.ecosystem
        field = _EOS_FIELDS[ecosystem]
        if eos_ids and field not in settings:
            settings[field] = list(eos_ids)
        if ecosystem == "vllm":
            settings.setdefault("seed", 0)  # the runner sets every row's key from the eval seed
        breakers = settings.get("dry_sequence_breakers")
        if breakers and any(isinstance(b, str) for b in breakers):
            if tokenizer is None:  # validation without a tokenizer: strings are checked later
                settings.pop("dry_sequence_breakers")
            else:
                from jaxsample.dry import dry_sequence_breakers

                settings["dry_sequence_breakers"] = dry_sequence_breakers([str(b) for b in breakers], tokenizer)
        try:
            if self.ecosystem == "scenario":
                return presets.scenario(settings.pop("name"), **settings)
            return _BUILDERS[ecosystem](**settings)
        except (ValueError, TypeError) as err:
            message = str(err).lstrip("`")
            raise ValueError(f"settings.{message}" if not message.startswith("settings.") else message) from None


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """A decoding strategy, its settings and its sampler.

    Attributes:
      strategy: ``greedy`` | ``sample`` | ``beam`` | ``beam_sample`` | ``group_beam`` |
        ``contrastive`` | ``best_of`` (see :mod:`jaxsample.decoding`).
      sampler: a sampler config name (``configs/samplers/<name>.yaml``), a path, or an inline
        mapping. Required for ``sample``/``best_of``; optional elsewhere (beam strategies and
        contrastive search use its stages as logits processors; greedy uses the whole chain, whose
        selector should then be greedy).
      num_return: outputs per input: independent samples (``sample``), returned hypotheses
        (beam strategies) or ranked samples (``best_of``). Must be 1 for ``greedy``/``contrastive``.
        Self-BLEU is measured among the outputs of each input.
      num_beams, length_penalty, early_stopping, length_normalization: beam strategies.
      num_beam_groups, diversity_penalty: ``group_beam``.
      top_k, penalty_alpha: ``contrastive``.
      best_of, rank_by: ``best_of`` (samples drawn; ranking by ``raw`` or ``processed`` log-probs).
      min_new_tokens: EOS is masked before this many tokens (every strategy).
    """

    strategy: str = "greedy"
    sampler: Any = None
    num_return: int = 1
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: Any = False
    length_normalization: str = "hf"
    num_beam_groups: int = 2
    diversity_penalty: float = 0.5
    top_k: int = 4
    penalty_alpha: float = 0.6
    best_of: int = 4
    rank_by: str = "raw"
    min_new_tokens: int = 0

    #: fields each strategy reads (others must keep their defaults)
    USES = {
        "greedy": (),
        "sample": (),
        "beam": ("num_beams", "length_penalty", "early_stopping", "length_normalization"),
        "beam_sample": ("num_beams", "length_penalty", "early_stopping", "length_normalization"),
        "group_beam": ("num_beams", "length_penalty", "early_stopping", "length_normalization",
                       "num_beam_groups", "diversity_penalty"),
        "contrastive": ("top_k", "penalty_alpha"),
        "best_of": ("best_of", "rank_by", "length_penalty"),
    }

    def __post_init__(self):
        _config.check_types(self)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        for f in dataclasses.fields(self):
            if f.name in ("strategy", "sampler", "num_return", "min_new_tokens"):
                continue
            if getattr(self, f.name) != f.default and f.name not in self.USES[self.strategy]:
                raise ValueError(f"{f.name} is not a setting of strategy {self.strategy!r}")
        for name in ("num_return", "num_beams", "num_beam_groups", "top_k", "best_of"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.strategy in ("greedy", "contrastive") and self.num_return != 1:
            raise ValueError(f"num_return must be 1 for strategy {self.strategy!r} (it has one output)")
        if self.strategy in ("sample", "best_of") and self.sampler is None:
            raise ValueError(f"sampler is required for strategy {self.strategy!r}")
        if self.strategy == "group_beam" and self.num_beam_groups < 2:
            raise ValueError(
                f"num_beam_groups must be >= 2 and divide num_beams={self.num_beams}, got {self.num_beam_groups}"
            )
        try:  # every other rule (divisibility, ranges, early_stopping ...) is DecodingOptions'
            self.options(max_new_tokens=1)
        except ValueError as err:
            message = str(err).replace("num_return_sequences", "num_return")
            if "divisible by num_beam_groups" in message:
                message = f"num_beam_groups must be >= 2 and divide num_beams={self.num_beams}: {message}"
            raise ValueError(message) from None
        if self.sampler is not None and not isinstance(self.sampler, (str, Mapping, SamplerConfig)):
            raise ValueError(f"sampler must be a name, a path or a mapping, got {self.sampler!r}")

    def options(self, **values: Any) -> DecodingOptions:
        """The :class:`~jaxsample.decoding.DecodingOptions` of this strategy (``values``: ``max_new_tokens``,
        ``eos_ids``, ``sampler``, traced penalties ... override the config's fields).

        ``sample`` and ``greedy`` map to plain generation (``sample`` draws its ``num_return`` samples as
        independent rows in the runner), ``beam*`` to beam search, ``contrastive`` to contrastive
        search, ``best_of`` to sample-and-rank.
        """
        s = self.strategy
        o: dict[str, Any] = {"min_new_tokens": self.min_new_tokens}
        if s in ("beam", "beam_sample", "group_beam"):
            o.update(num_beams=self.num_beams, num_return_sequences=self.num_return, length_penalty=self.length_penalty,
                     early_stopping=self.early_stopping, length_normalization=self.length_normalization,
                     do_sample=s == "beam_sample")
            if s == "group_beam":
                o.update(num_beam_groups=self.num_beam_groups, diversity_penalty=self.diversity_penalty)
        elif s == "contrastive":
            o.update(top_k=self.top_k, penalty_alpha=self.penalty_alpha)
        elif s == "best_of":
            o.update(n=self.num_return, best_of=self.best_of, rank_by=self.rank_by, length_penalty=self.length_penalty)
        o.update(values)
        return DecodingOptions(**o)


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """Where the evaluation rows come from.

    Attributes:
      path: a dataset directory built by ``wakong build`` (or by this spec, see ``corpus``).
      corpus: ``pydoc`` builds Python's documentation topics into ``path`` when it holds no dataset
        (or one built with other settings); ``None`` requires an existing dataset.
      build: the ``wakong.build`` config file used to build ``corpus``; ``build_set`` overrides it.
      tokenizer: ``tokenizer.json`` to build with (it must be the model's); ``None`` trains one.
      split: ``all`` records of the corpus, or ``train`` / ``heldout``: record ``i`` is held out
        when ``i % holdout_every == 0`` (pydoc: one topic in ``holdout_every``).
      max_rows: evaluate the first ``max_rows`` examples (in dataset order); ``None``: all.
    """

    path: str = ""
    corpus: str | None = None
    build: str | None = None
    build_set: tuple[str, ...] = ()
    tokenizer: str | None = None
    split: str = "all"
    holdout_every: int = 10
    max_rows: int | None = None

    def __post_init__(self):
        if not self.path:
            raise ValueError("dataset.path is required (a built dataset, or where to build corpus)")
        if self.corpus not in (None, "pydoc"):
            raise ValueError(f"dataset.corpus must be pydoc or null, got {self.corpus!r}")
        if self.split not in ("all", "train", "heldout"):
            raise ValueError(f"dataset.split must be all, train or heldout, got {self.split!r}")
        if self.holdout_every < 2:
            raise ValueError(f"dataset.holdout_every must be >= 2, got {self.holdout_every}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"dataset.max_rows must be >= 1 or null, got {self.max_rows}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """An evaluation run: checkpoint x dataset x decoding configs -> metrics.

    Attributes:
      checkpoint: orbax checkpoint directory (:mod:`jaxsample.models.checkpoint`); ``step``: which
        step (``None``: the latest).
      dataset: see :class:`DatasetConfig`.
      decoding: decoding configs: names (``configs/decoding/<name>.yaml``), paths, or inline
        mappings with a ``name`` key plus :class:`DecodingConfig` fields.
      per_device_batch_size: rows each device decodes per step. Every block of this many
        consecutive rows is decoded as one per-device batch whatever the device count, so outputs
        are bit-identical for 1 or N devices (and for the mesh and pmap paths).
      max_source_len, max_target_len: padded lengths (``None``: the dataset's).
      max_new_tokens: generated tokens per output (``None``: ``max_target_len``).
      metrics: which metric groups to compute (all by default).
      seed: row ``i`` samples with ``fold_in(key(seed), i)`` (a sampler's own seed is replaced).
      parallel: ``mesh`` (``jax.jit`` + ``shard_map`` over a ``NamedSharding`` mesh) or ``pmap``.
      output_dir: where ``results.json``, ``summary.md`` and ``outputs.jsonl`` go (``None``: nowhere).
      examples: decoded examples shown in the summary.
    """

    checkpoint: str = ""
    step: int | None = None
    dataset: DatasetConfig = DatasetConfig(path="data")
    decoding: tuple[Any, ...] = ("greedy",)
    per_device_batch_size: int = 16
    max_source_len: int | None = None
    max_target_len: int | None = None
    max_new_tokens: int | None = None
    metrics: tuple[str, ...] = METRICS
    seed: int = 0
    parallel: str = "mesh"
    output_dir: str | None = None
    examples: int = 3

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("checkpoint is required (a directory written by jaxsample train)")
        if not self.decoding:
            raise ValueError("decoding must list at least one decoding config")
        for i, item in enumerate(self.decoding):
            if isinstance(item, Mapping):
                if not isinstance(item.get("name"), str) or not item["name"]:
                    raise ValueError(f"decoding[{i}].name is required for an inline decoding config")
            elif not isinstance(item, str):
                raise ValueError(f"decoding[{i}] must be a name, a path or a mapping, got {item!r}")
        if self.per_device_batch_size < 1:
            raise ValueError(f"per_device_batch_size must be >= 1, got {self.per_device_batch_size}")
        for name in ("max_source_len", "max_target_len", "max_new_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {getattr(self, name)}")
        unknown = sorted(set(self.metrics) - set(METRICS))
        if unknown:
            raise ValueError(f"metrics: unknown metric {unknown[0]!r} (known: {', '.join(METRICS)})")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be mesh or pmap, got {self.parallel!r}")
        if self.examples < 0:
            raise ValueError(f"examples must be >= 0, got {self.examples}")


# ------------------------------------------------------------------------------------------ loading
def resolve(ref: str, folder: str, relative_to: str | None = None) -> str:
    """The file a config reference names: a path (``.yaml`` or containing ``/``) or a bare name.

    Paths are tried as given, then relative to ``relative_to``'s directory. Bare names resolve to
    ``<configs>/<folder>/<name>.yaml``, ``<configs>`` being the ``configs`` directory that holds
    ``relative_to`` (if any) and then :data:`CONFIGS_DIR`.
    """
    base = os.path.dirname(os.path.abspath(relative_to)) if relative_to else None
    if ref.endswith((".yaml", ".yml")) or os.sep in ref or "/" in ref:
        candidates = [ref] + ([os.path.join(base, ref)] if base else [])
    else:
        roots = [os.path.dirname(base)] if base else []
        candidates = [os.path.join(root, folder, f"{ref}.yaml") for root in roots + [CONFIGS_DIR]]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"no {folder} config {ref!r} (looked for {', '.join(dict.fromkeys(candidates))})")


def _build(cls, data: Mapping, where: str | None, prefix: str = ""):
    try:
        return _config.build(cls, data)
    except ValueError as err:
        message = f"{prefix}{err}"
        raise ValueError(f"{where}: {message}" if where else message) from None


def load_sampler(ref: str | Mapping | SamplerConfig, overrides: Sequence[str] = (), *,
                 relative_to: str | None = None) -> SamplerConfig:
    """A :class:`SamplerConfig` from a name, a path (kind ``sampler``) or an inline mapping."""
    if isinstance(ref, SamplerConfig):
        return ref
    if isinstance(ref, Mapping):  # inline: overrides apply to the file that holds it
        return _build(SamplerConfig, dict(ref), relative_to, "sampler.")
    path = resolve(ref, "samplers", relative_to)
    return _config.load(SamplerConfig, path, overrides, kind="sampler")


def load_decoding(ref: str | Mapping, overrides: Sequence[str] = (), *,
                  relative_to: str | None = None) -> tuple[str, DecodingConfig, SamplerConfig | None, str | None]:
    """``(name, decoding config, sampler config or None, file)`` from a name, a path or a mapping."""
    if isinstance(ref, Mapping):
        data = {k: v for k, v in ref.items() if k != "name"}  # inline: overrides apply to its file
        name, path = str(ref["name"]), relative_to
        cfg = _build(DecodingConfig, data, relative_to)
    else:
        path = resolve(ref, "decoding", relative_to)
        name = os.path.splitext(os.path.basename(path))[0] if ref.endswith((".yaml", ".yml")) else ref
        cfg = _config.load(DecodingConfig, path, overrides, kind="decoding")
    sampler = None
    if cfg.sampler is not None:
        try:
            sampler = load_sampler(cfg.sampler, relative_to=path)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"decoding {name!r}: sampler: {err}") from None
    return name, cfg, sampler, path


def load_eval(path: str | None, overrides: Sequence[str] = ()) -> EvalConfig:
    """An :class:`EvalConfig` (kind ``eval``) with ``--set`` overrides; errors name file and field."""
    return _config.load(EvalConfig, path, overrides, kind="eval")


def load_decodings(config: EvalConfig, relative_to: str | None = None) -> list[tuple[str, DecodingConfig, Any]]:
    """Every decoding config of an eval config, resolved: ``[(name, DecodingConfig, SamplerConfig|None)]``.

    Raises:
      ValueError: on a repeated name or an invalid entry (``decoding[i]`` named).
    """
    out, seen = [], set()
    for i, item in enumerate(config.decoding):
        try:
            name, cfg, sampler, _ = load_decoding(item, relative_to=relative_to)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"decoding[{i}]: {err}") from None
        if name in seen:
            raise ValueError(f"decoding[{i}]: the name {name!r} is used twice")
        seen.add(name)
        out.append((name, cfg, sampler))
    return out


#: Loaders by ``kind`` (for tests and tools that validate every shipped file).
LOADERS = {
    "sampler": lambda path: load_sampler(path),
    "decoding": lambda path: load_decoding(path),
    "eval": lambda path: (lambda c: (c, load_decodings(c, relative_to=path)))(load_eval(path)),
}
