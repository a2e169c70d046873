"""vLLM: ``SamplingParams`` fields -> the V1 sampler pipeline.

Order (``vllm/v1/sample/sampler.py``): allowed token ids -> bad words -> min tokens -> logit bias ->
penalties (repetition over prompt and output, frequency / presence over output) -> temperature
(``< 1e-5`` is greedy) -> min-p -> top-k -> top-p -> sample. Every configuration shares one structure
(unused stages get their "off" values), so a batch can mix requests freely (:func:`vllm_batch`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

from jaxsample import stages
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import chain
from jaxsample.presets._preset import Preset, check_bias, check_fields, stack

_SAMPLING_EPS = 1e-5
_MIN_TEMP = 0.01


def _check(cond: bool, field: str, message: str, value) -> None:
    if not cond:
        raise ValueError(f"{field} {message}, got {value!r}")


def vllm(
    *,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int | None = None,
    stop_token_ids: Sequence[int] | None = None,
    min_tokens: int = 0,
    max_tokens: int | None = 16,
    logit_bias: dict[int, float] | None = None,
    allowed_token_ids: Sequence[int] | None = None,
    bad_words_ids: Sequence[Sequence[int]] = (),
    eos_token_ids: Sequence[int] = (),
    list_capacity: int = 64,
    candidates: int = DEFAULT_CANDIDATES,
) -> Preset:
    """The vLLM V1 sampler for one ``SamplingParams`` configuration, validated as vLLM does.

    Field names, defaults and ranges are vLLM's. Token-level inputs: ``bad_words_ids`` are token
    sequences (vLLM tokenises ``bad_words`` strings; do that with your tokenizer), ``eos_token_ids``
    are the model's EOS ids (stop ids for ``min_tokens``). ``logit_bias`` is clamped to
    ``[-100, 100]`` as vLLM's API does. ``list_capacity`` is the static size of the per-row id lists
    (logit bias, allowed ids, stop ids). The penalties stage reads the whole history: pass
    ``history_size`` (prompt + max tokens) to ``Sampler.init``.

    >>> vllm(temperature=0.0).values["temperature"]
    0.0
    """
    check_fields(vllm, locals())
    check_bias(logit_bias or {}, "logit_bias", allow=(-math.inf, math.inf))  # infinities clamp to +-100
    _check(-2.0 <= presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]", presence_penalty)
    _check(-2.0 <= frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]", frequency_penalty)
    _check(repetition_penalty > 0.0, "repetition_penalty", "must be > 0", repetition_penalty)
    _check(temperature >= 0.0, "temperature", "must be non-negative", temperature)
    _check(0.0 < top_p <= 1.0, "top_p", "must be in (0, 1]", top_p)
    _check(top_k >= -1, "top_k", "must be -1 (disable), 0 (disable) or at least 1", top_k)
    _check(0.0 <= min_p <= 1.0, "min_p", "must be in [0, 1]", min_p)
    _check(min_tokens >= 0, "min_tokens", "must be >= 0", min_tokens)
    if max_tokens is not None:
        _check(max_tokens >= 1, "max_tokens", "must be at least 1", max_tokens)
        _check(min_tokens <= max_tokens, "min_tokens", f"must be <= max_tokens={max_tokens}", min_tokens)
    if allowed_token_ids is not None:
        _check(len(allowed_token_ids) > 0, "allowed_token_ids", "must not be empty", allowed_token_ids)
    stop = list(dict.fromkeys(int(t) for t in (stop_token_ids or ())))
    bias = {int(k): max(-100.0, min(100.0, float(v))) for k, v in (logit_bias or {}).items()}
    for field, n in (("logit_bias", len(bias)), ("allowed_token_ids", len(allowed_token_ids or ())),
                     ("stop_token_ids", len(stop))):
        _check(n <= list_capacity, field, f"has more than list_capacity={list_capacity} entries", n)

    if temperature < _SAMPLING_EPS:
        temperature, top_p, top_k, min_p = 0.0, 1.0, 0, 0.0  # greedy: vLLM resets the filters
    elif temperature < _MIN_TEMP:
        warnings.warn(f"temperature {temperature} is below {_MIN_TEMP}; vLLM raises it to {_MIN_TEMP}")
        temperature = _MIN_TEMP

    parts = [stages.allowed_tokens(capacity=list_capacity)]
    if bad_words_ids:
        parts.append(stages.bad_words(tuple(tuple(int(t) for t in w) for w in bad_words_ids), scope="vllm"))
    parts += [
        stages.min_tokens(stop_ids=tuple(int(i) for i in eos_token_ids), capacity=list_capacity),
        stages.logit_bias(capacity=list_capacity, clamp=100.0),
        stages.penalties(scope="vllm"),
        stages.temperature(),
        stages.min_p(),
        stages.top_k(candidates=candidates),
        stages.top_p(candidates=candidates),
    ]
    values: dict[str, Any] = {
        "seed": 0 if seed is None or seed == -1 else seed,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "repetition_penalty": repetition_penalty,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": 0 if top_k == -1 else top_k,
        "min_p": min_p,
        "min_tokens": min_tokens,
        "min_tokens_ids": stop,
        "logit_bias_ids": list(bias),
        "logit_bias_values": list(bias.values()),
        "allowed_tokens_ids": [int(t) for t in (allowed_token_ids or ())],
    }
    return Preset(chain(*parts, select=stages.categorical(candidates=candidates)), values)


def vllm_batch(requests: Sequence[dict[str, Any]], **shared) -> Preset:
    """One preset for a batch of vLLM requests (row ``i`` follows ``requests[i]``).

    ``shared`` fields (e.g. ``eos_token_ids``, ``list_capacity``) apply to every request.
    Requests must agree on ``bad_words_ids`` (a static stage); everything else may differ per row.
    """
    return stack([vllm(**{**shared, **r}) for r in requests])
