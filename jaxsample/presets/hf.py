"""HuggingFace transformers: ``GenerationConfig`` fields -> the ``LogitsProcessorList`` ``generate`` builds.

Order (``_get_logits_processor``): sequence bias -> encoder repetition penalty -> repetition penalty
-> no-repeat n-gram -> encoder no-repeat n-gram -> bad words -> min length / min new tokens ->
forced BOS -> forced EOS -> inf/nan removal -> exponential decay -> suppress tokens -> suppress at
begin -> (sampling only) temperature -> top-h -> top-k -> top-p -> min-p -> typical -> epsilon -> eta
-> log-softmax renormalisation. As in HF, a processor exists only when its field enables it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxsample import stages
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import chain
from jaxsample.presets._preset import Preset, check_bias, check_fields

_UNSUPPORTED = {
    "guidance_scale": "classifier-free guidance needs a second (unconditional) model pass: combine the two "
    "logits with jaxsample.classifier_free_guidance before the chain",
    "watermarking_config": "watermarking is not implemented",
    "prefix_allowed_tokens_fn": "a Python callback cannot run inside jit: use jaxsample.structured",
    "constraints": "constrained beam search is not implemented",
    "force_words_ids": "constrained beam search is not implemented",
    "dola_layers": "DoLa needs intermediate-layer logits",
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


def hf(
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
    seed: int = 0,
    candidates: int = DEFAULT_CANDIDATES,
    **unsupported: Any,
) -> Preset:
    """The logits processors (and warpers when ``do_sample``) of ``GenerationConfig`` fields.

    Field names, defaults and validation are HF's (``top_k=50`` is active whenever ``do_sample``).
    Lengths: ``min_length`` counts the prompt as HF does, so it needs ``prompt_length`` (an int or
    one per row); ``forced_eos_token_id`` needs ``max_new_tokens``. ``do_sample=False`` selects greedy.
    Decoding-strategy fields (``num_beams``...) belong to :mod:`jaxsample.decoding`.

    >>> [s.name for s in hf(do_sample=True, top_p=0.9).sampler.stages]
    ['top_k', 'top_p']
    """
    for field in unsupported:
        reason = _UNSUPPORTED.get(field, "not a sampling field of GenerationConfig (decoding settings go to "
                                          "jaxsample.decoding)")
        raise ValueError(f"{field}: {reason}")
    check_fields(hf, locals())
    eos = _ids(eos_token_id)
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
    if np.any(min_tokens) and eos:
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
    if renormalize_logits:
        parts.append(stages.log_softmax())
    select = stages.categorical(candidates=candidates) if do_sample else stages.greedy()
    return Preset(chain(*parts, select=select), values)
