"""HuggingFace transformers: ``GenerationConfig`` fields -> the ``LogitsProcessorList`` ``generate`` builds.

Order (``_get_logits_processor``): sequence bias -> encoder repetition penalty -> repetition penalty
-> no-repeat n-gram -> encoder no-repeat n-gram -> bad words -> min length / min new tokens ->
forced BOS -> forced EOS -> inf/nan removal -> exponential decay -> suppress tokens -> suppress at
begin -> (sampling only) temperature -> top-h -> top-k -> top-p -> min-p -> typical -> epsilon -> eta
-> watermark (``watermarking_config``) -> log-softmax renormalisation. As in HF, a processor exists
only when its field enables it.

:func:`hf` takes a ``transformers.GenerationConfig``, a dict of its fields (``to_dict()``, where
transformers 5 writes ``None`` for "unset") or a path to ``generation_config.json``. Metadata
(``transformers_version``, ``_from_model_config``) is ignored; token ids keep their meaning
(``eos_token_id`` int or list, ``pad_token_id``, ``bos_token_id`` / ``decoder_start_token_id`` as
the start token, ``forced_*``); strategy fields (``num_beams``, ``max_new_tokens`` ...) land in
``Preset.request`` for :class:`jaxsample.decoding.DecodeRequest`.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from jaxsample import stages
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import chain
from jaxsample.presets import _fields
from jaxsample.presets._preset import Preset, check_bias, check_fields
from jaxsample.synthid import synthid_config
from jaxsample.watermark import watermark_config

_UNSUPPORTED = {
    "guidance_scale": "classifier-free guidance needs a second (unconditional) model pass: combine the two "
    "logits with jaxsample.classifier_free_guidance before the chain",
    "prefix_allowed_tokens_fn": "a Python callback cannot run inside jit: use jaxsample.structured",
}


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in ([value] if isinstance(value, int) else value))


def _positive(name: str, value, *, open_lo=True, hi=None, open_hi=False) -> None:
    bad = value <= 0 if open_lo else value < 0
    if hi is not None:
        bad |= value >= hi if open_hi else value > hi
    if bad:
        lo = "(0" if open_lo else "[0"
        rng = f"{lo}, {hi}{')' if open_hi else ']'}" if hi is not None else ("> 0" if open_lo else ">= 0")
        raise ValueError(f"`{name}` has to be {'in ' + rng if hi is not None else rng}, got {value!r}")


def _sampler(
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 50,
    top_p: float = 1.0,
    min_p: float | None = None,
    typical_p: float = 1.0,
    epsilon_cutoff: float = 0.0,
    eta_cutoff: float = 0.0,
    top_h: float | None = None,
    repetition_penalty: float = 1.0,
    encoder_repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    encoder_no_repeat_ngram_size: int = 0,
    bad_words_ids: Sequence[Sequence[int]] | None = None,
    sequence_bias: dict[tuple[int, ...], float] | Sequence | None = None,
    min_length: int = 0,
    min_new_tokens: int = 0,
    prompt_length: int | Sequence[int] | None = None,
    max_new_tokens: int | None = None,
    forced_bos_token_id: int | None = None,
    forced_eos_token_id: int | Sequence[int] | None = None,
    remove_invalid_values: bool = False,
    exponential_decay_length_penalty: tuple[int, float] | None = None,
    suppress_tokens: Sequence[int] | None = None,
    begin_suppress_tokens: Sequence[int] | None = None,
    renormalize_logits: bool = False,
    eos_token_id: int | Sequence[int] | None = None,
    watermarking_config: Any = None,
    dola_layers: str | Sequence[int] | None = None,
    constraints: Sequence | None = None,
    force_words_ids: Sequence | None = None,
    seed: int = 0,
    candidates: int = DEFAULT_CANDIDATES,
) -> Preset:
    """The logits processors (and warpers when ``do_sample``) of validated fields (see :func:`hf`).

    ``dola_layers`` and ``constraints`` / ``force_words_ids`` select a strategy: they land in
    ``Preset.strategy`` for :func:`jaxsample.decoding.dola_generate` (which warns, as HF, when
    ``repetition_penalty < 1.2``) and :func:`jaxsample.decoding.constrained_beam_search` (HF order,
    constraints first; no sampling).
    """
    check_fields(_sampler, locals())
    eos = _ids(eos_token_id)
    strategy: dict[str, Any] = {}
    if dola_layers is not None:
        if constraints or force_words_ids:
            raise ValueError("dola_layers does not combine with constraints / force_words_ids (DoLa needs num_beams=1)")
        strategy["dola_layers"] = dola_layers if isinstance(dola_layers, str) else [int(i) for i in dola_layers]
        if repetition_penalty < 1.2:
            warnings.warn(
                f"`repetition_penalty` is set to a value of {repetition_penalty}, which could induce unwanted "
                "repetition. The recommended value for DoLa decoding is `repetition_penalty>=1.2`.",
                stacklevel=2,
            )
    if constraints or force_words_ids:
        if do_sample:
            raise ValueError("constraints / force_words_ids select constrained beam search, which does not support "
                             "sampling (do_sample=True), as in HF")
        from jaxsample.decoding.constraints import as_constraints

        strategy["constraints"] = as_constraints(constraints, force_words_ids)
    _positive("top_p", top_p, open_lo=False, hi=1.0)
    if min_p is not None:
        _positive("min_p", min_p, open_lo=False, hi=1.0)
    if typical_p != 1.0:
        _positive("typical_p", typical_p, hi=1.0, open_hi=True)
    for name, value in (("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff)):
        if value != 0.0:
            _positive(name, value, hi=1.0, open_hi=True)
    parts, values = [], {"seed": seed}
    if sequence_bias:
        items = list(sequence_bias.items()) if isinstance(sequence_bias, dict) else [tuple(x) for x in sequence_bias]
        check_bias({i: b for i, (_, b) in enumerate(items)}, "sequence_bias")
        seqs = tuple(tuple(int(t) for t in s) for s, _ in items)
        parts.append(stages.sequence_bias(seqs, tuple(0.0 for _ in seqs)))
        values.update({f"sequence_bias_{i}": float(b) for i, (_, b) in enumerate(items)})
    if encoder_repetition_penalty != 1.0:
        _positive("encoder_repetition_penalty", encoder_repetition_penalty)
        parts.append(stages.encoder_repetition_penalty())
        values["encoder_repetition_penalty"] = encoder_repetition_penalty
    if repetition_penalty != 1.0:
        _positive("repetition_penalty", repetition_penalty)
        parts.append(stages.penalties(scope="hf"))
        values["repetition_penalty"] = repetition_penalty
    if no_repeat_ngram_size:
        _positive("no_repeat_ngram_size", no_repeat_ngram_size)
        parts.append(stages.no_repeat_ngram(int(no_repeat_ngram_size)))
    if encoder_no_repeat_ngram_size:
        _positive("encoder_no_repeat_ngram_size", encoder_no_repeat_ngram_size)
        parts.append(stages.encoder_no_repeat_ngram(int(encoder_no_repeat_ngram_size)))
    if bad_words_ids:
        parts.append(stages.bad_words(tuple(tuple(int(t) for t in w) for w in bad_words_ids), scope="hf", eos_ids=eos))
    min_tokens = min_new_tokens
    if min_length:
        if prompt_length is None:
            raise ValueError("min_length counts the prompt (HF semantics): pass prompt_length too")
        min_tokens = np.maximum(np.maximum(int(min_length) - np.asarray(prompt_length), 0), min_new_tokens)
    if np.any(min_tokens):
        if not eos:
            raise ValueError("min_new_tokens / min_length mask the EOS token: they need eos_token_id")
        parts.append(stages.min_tokens(stop_ids=eos))
        values["min_tokens"] = min_tokens
    if forced_bos_token_id is not None:
        parts.append(stages.forced_bos(int(forced_bos_token_id)))
    if forced_eos_token_id is not None:
        if max_new_tokens is None:
            raise ValueError("forced_eos_token_id needs max_new_tokens (EOS is forced at the last position)")
        parts.append(stages.forced_eos(int(max_new_tokens), _ids(forced_eos_token_id)))
    if remove_invalid_values:
        parts.append(stages.remove_inf_nan())
    if exponential_decay_length_penalty is not None:
        start, factor = exponential_decay_length_penalty
        parts.append(stages.exponential_decay_length_penalty(int(start), float(factor), eos))
    if suppress_tokens:
        parts.append(stages.suppress_tokens(_ids(suppress_tokens)))
    if begin_suppress_tokens:
        begin = 1 if forced_bos_token_id is not None else 0
        parts.append(stages.suppress_tokens_at_begin(_ids(begin_suppress_tokens), begin))
    if do_sample:
        if temperature != 1.0:
            _positive("temperature", temperature)
            parts.append(stages.temperature())
            values["temperature"] = temperature
        if top_h is not None:
            _positive("top_h", top_h, hi=1.0)
            parts.append(stages.top_h())
            values["top_h"] = top_h
        if top_k:
            _positive("top_k", top_k)
            parts.append(stages.top_k(candidates=candidates))
            values["top_k"] = int(top_k)
        filters = [
            (top_p < 1.0, "top_p", top_p, stages.top_p(candidates=candidates)),
            (min_p is not None, "min_p", min_p, stages.min_p()),
            (typical_p < 1.0, "typical_p", typical_p, stages.typical(candidates=candidates)),
            (0.0 < epsilon_cutoff, "epsilon_cutoff", epsilon_cutoff, stages.epsilon_cutoff()),
            (0.0 < eta_cutoff, "eta_cutoff", eta_cutoff, stages.eta_cutoff()),
        ]
        for enabled, name, value, stage in filters:
            if enabled:
                parts.append(stage)
                values[name] = value
    if watermarking_config is not None:
        stage, extra = _watermark_stage(watermarking_config)
        parts.append(stage)
        values.update(extra)
    if renormalize_logits:
        parts.append(stages.log_softmax())
    select = stages.categorical(candidates=candidates) if do_sample else stages.greedy()
    return Preset(chain(*parts, select=select), values, strategy=strategy)


#: ``GenerationConfig`` fields that build the logits processors (plus this module's ``seed``,
#: ``prompt_length`` and ``candidates``): what a sampler config (:mod:`jaxsample.evaluation`) takes.
SAMPLER_FIELDS = (
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h",
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "sequence_bias", "min_length", "min_new_tokens", "prompt_length", "max_new_tokens",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "renormalize_logits", "eos_token_id", "watermarking_config",
    "dola_layers", "constraints", "force_words_ids", "seed", "candidates",
)
#: Strategy and token-id fields: they go to ``Preset.request``.
REQUEST_FIELDS = (
    "num_beams", "num_beam_groups", "diversity_penalty", "length_penalty", "early_stopping",
    "num_return_sequences", "penalty_alpha", "max_length", "pad_token_id", "bos_token_id",
    "decoder_start_token_id", "output_scores", "output_logits", "stop_strings",
)
#: Metadata written by transformers: ignored.
METADATA_FIELDS = ("transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash")
#: Fields that change speed or memory, or configure an assistant model that ``generate`` is not
#: given here, but never the tokens: accepted and ignored.
INERT_FIELDS = (
    "use_cache", "return_dict_in_generate", "low_memory", "cache_implementation", "cache_config",
    "compile_config", "disable_compile", "max_cache_len", "prefill_chunk_size", "continuous_batching_config",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "is_assistant", "assistant_early_exit",
    "max_matching_ngram_size", "assistant_ensemble_weight",
)
_OFF = {  # unavailable features: accepted only at these "off" values
    "guidance_scale": (None, 1.0), "prefix_allowed_tokens_fn": (None,),
    "max_time": (None,),
    "token_healing": (None, False), "output_attentions": (None, False), "output_hidden_states": (None, False),
    "prompt_lookup_num_tokens": (None,), "use_mtp": (None, False), "speculation_type": (None,),
}
_MORE_REASONS = {
    "max_time": "a wall-clock limit cannot stop a compiled loop: use max_new_tokens",
    "token_healing": "token healing rewrites the prompt: not implemented",
    "output_attentions": "attention weights are not returned",
    "output_hidden_states": "hidden states are not returned",
    "prompt_lookup_num_tokens": "prompt-lookup decoding: use jaxsample.decoding.speculative_generate with a draft",
    "use_mtp": "multi-token-prediction drafting is not implemented",
    "speculation_type": "assisted generation: use jaxsample.decoding.speculative_generate",
}
_FLOATS = ("temperature", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h",
           "repetition_penalty", "encoder_repetition_penalty", "diversity_penalty", "length_penalty",
           "penalty_alpha")
_INTS = ("top_k", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length", "min_new_tokens",
         "max_new_tokens", "max_length", "num_beams", "num_beam_groups", "num_return_sequences", "seed",
         "candidates")
_FLAGS = ("do_sample", "remove_invalid_values", "renormalize_logits", "output_scores", "output_logits")
_TOKEN_IDS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id",
              "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens")
#: HF's values for unset (``None``) fields.
_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0,
             "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
             "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0,
             "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0, "length_penalty": 1.0,
             "early_stopping": False, "num_return_sequences": 1, "penalty_alpha": 0.0, "remove_invalid_values": False,
             "renormalize_logits": False, "output_scores": False, "output_logits": False, "seed": 0,
             "candidates": DEFAULT_CANDIDATES}
_MAX_LENGTH = 20  # HF's default max_length when neither max_length nor max_new_tokens is set


def hf(config: Any = None, /, **fields: Any) -> Preset:
    """The logits processors (and warpers) and the request of a HuggingFace ``GenerationConfig``.

    ``config`` is a ``transformers.GenerationConfig`` (or any object with ``to_dict()``), a dict of
    its fields, or a path to ``generation_config.json`` (or to the model directory holding it);
    keyword ``fields`` override it. ``None`` means "unset" (HF's default), as in transformers 5.

    * Field names, defaults and validation are HF's (``top_k=50`` is active whenever
      ``do_sample``); NaN or a wrong type is a ``ValueError`` naming the field, and so is an
      unknown field. Metadata (``transformers_version``, ``_from_model_config``) is ignored, and so
      are fields that only change speed or memory (``use_cache``, ``cache_implementation`` ...).
    * ``eos_token_id`` (int or list) is the EOS set of the processors *and* of the stopping rule;
      ``min_new_tokens`` / ``min_length`` without it is an error, not a silent no-op.
      ``pad_token_id`` (default: the first EOS id, as HF) fills finished rows;
      ``decoder_start_token_id`` (else ``bos_token_id``) starts generation without a prompt.
    * ``min_length`` counts the prompt as HF does, so it needs ``prompt_length`` (an int or one per
      row); ``max_length`` is turned into new tokens against the prompt width at run time;
      ``forced_eos_token_id`` needs ``max_new_tokens``. ``do_sample=False`` selects greedy.
    * Strategy fields (``num_beams``, ``num_beam_groups``, ``penalty_alpha``,
      ``num_return_sequences`` ...), ``stop_strings`` and ``output_scores`` go to
      ``Preset.request``: :meth:`jaxsample.decoding.DecodeRequest.from_preset` picks the strategy
      as ``generate`` does (``num_beams=1`` is greedy or sampling).

    >>> [s.name for s in hf(do_sample=True, top_p=0.9).sampler.stages]
    ['top_k', 'top_p']
    >>> p = hf({"transformers_version": "4.46.0", "eos_token_id": [1, 2], "num_beams": 4, "max_new_tokens": 32})
    >>> p.request["num_beams"], p.request["eos_ids"], p.request["pad_id"], p.request["max_new_tokens"]
    (4, (1, 2), 1, 32)
    """
    what = "GenerationConfig"
    data = _fields.read(config, fields, what=what)
    data = {k: v for k, v in data.items() if k not in METADATA_FIELDS}
    _fields.unknown(data, SAMPLER_FIELDS + REQUEST_FIELDS + INERT_FIELDS + tuple(_OFF), what)
    for name, off in _OFF.items():
        value = data.get(name)
        if value is not None and not any(value is o or value == o for o in off):
            raise ValueError(f"{name}: {_MORE_REASONS.get(name) or _UNSUPPORTED[name]}")
    f = {k: v for k, v in data.items() if v is not None and k not in INERT_FIELDS and k not in _OFF}
    for names, convert in (
        (_FLOATS, _fields.number), (_INTS, _fields.integer), (_FLAGS, _fields.flag), (_TOKEN_IDS, _fields.ids)
    ):
        for name in names:
            if name in f:
                f[name] = convert(name, f[name])
    for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id"):
        if name in f and len(f[name]) != 1:
            raise ValueError(f"{name} must be one token id, got {data[name]!r}")
    get = lambda name: f.get(name, _DEFAULTS.get(name))  # noqa: E731
    early = get("early_stopping")
    if early not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early!r}")
    beams, groups, returns = get("num_beams"), get("num_beam_groups"), get("num_return_sequences")
    for name, value in (("num_beams", beams), ("num_beam_groups", groups), ("num_return_sequences", returns)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if "max_new_tokens" in f and f["max_new_tokens"] < 1:
        raise ValueError(f"max_new_tokens must be greater than 0, got {f['max_new_tokens']}")
    if "max_length" in f and f["max_length"] < 1:
        raise ValueError(f"max_length must be greater than 0, got {f['max_length']}")
    if beams % groups:
        raise ValueError(f"num_beams ({beams}) must be divisible by num_beam_groups ({groups})")
    if groups > 1 and get("diversity_penalty") <= 0.0:
        raise ValueError("diversity_penalty must be > 0 with num_beam_groups > 1 (else the groups are identical)")
    if groups > 1 and get("do_sample"):
        raise ValueError("num_beam_groups > 1 (diverse beam search) does not sample: set do_sample=False")
    if beams == 1 and not get("do_sample") and returns > 1:
        raise ValueError("num_return_sequences > 1 needs num_beams >= num_return_sequences or do_sample=True "
                         "(greedy search returns one sequence)")
    if beams > 1 and returns > beams:
        raise ValueError(f"num_return_sequences ({returns}) must be <= num_beams ({beams})")
    penalty_alpha = get("penalty_alpha")
    if penalty_alpha < 0 or penalty_alpha > 1:
        raise ValueError(f"penalty_alpha must be in [0, 1], got {penalty_alpha}")
    eos = f.get("eos_token_id", ())
    stop = _fields.strings("stop_strings", data.get("stop_strings"))
    sampler_kwargs = {k: f[k] for k in SAMPLER_FIELDS if k in f}
    for name in ("forced_bos_token_id",):
        if name in sampler_kwargs:
            sampler_kwargs[name] = sampler_kwargs[name][0]
    if "forced_eos_token_id" in sampler_kwargs:
        sampler_kwargs["forced_eos_token_id"] = list(sampler_kwargs["forced_eos_token_id"])
    if "eos_token_id" in sampler_kwargs:
        sampler_kwargs["eos_token_id"] = list(eos)
    preset = _sampler(**sampler_kwargs)
    pad = f.get("pad_token_id", eos[:1])
    start = f.get("decoder_start_token_id", f.get("bos_token_id", ()))
    request = {
        "source": "hf",
        "do_sample": get("do_sample"),
        "num_beams": beams,
        "num_beam_groups": groups,
        "diversity_penalty": get("diversity_penalty"),
        "length_penalty": get("length_penalty"),
        "early_stopping": early,
        "num_return_sequences": returns,
        "penalty_alpha": penalty_alpha,
        "top_k": get("top_k"),
        "max_new_tokens": f.get("max_new_tokens"),
        "max_length": None if "max_new_tokens" in f else f.get("max_length", _MAX_LENGTH),
        "min_new_tokens": 0,  # the min-length processors mask EOS (they are in the chain)
        "eos_ids": eos,
        "pad_id": pad[0] if pad else None,
        "start_id": start[0] if start else None,
        "logprobs": 0 if (get("output_scores") or get("output_logits")) else None,
        "seed": get("seed"),
        "stop": stop,
    }
    return Preset(preset.sampler, preset.values, request, preset.strategy)


def _watermark_stage(config) -> tuple:
    """The stage (and its per-row values) for HF's ``watermarking_config``."""
    if isinstance(config, dict):
        fields = dict(config)
    elif hasattr(config, "to_dict"):
        fields = dict(config.to_dict())
    else:
        raise ValueError(
            f"watermarking_config must be a WatermarkingConfig, a SynthIDTextWatermarkingConfig or a dict, "
            f"got {type(config).__name__}"
        )
    if "keys" in fields or "ngram_len" in fields:
        cfg = synthid_config(fields)
        return stages.synthid_watermark(**cfg._asdict()), {}
    cfg = watermark_config(fields)
    stage = stages.watermark(
        hashing_key=cfg.hashing_key, seeding_scheme=cfg.seeding_scheme, context_width=cfg.context_width
    )
    return stage, {"greenlist_ratio": cfg.greenlist_ratio, "watermark_bias": cfg.bias}
