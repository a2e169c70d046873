"""vLLM: a ``SamplingParams`` (object, dict or fields) -> the V1 sampler pipeline plus the request.

Order (``vllm/v1/sample/sampler.py``): allowed token ids -> bad words -> min tokens -> logit bias ->
penalties (repetition over prompt and output, frequency / presence over output) -> temperature
(``< 1e-5`` is greedy) -> min-p -> top-k -> top-p -> sample. Every configuration shares one structure
(unused stages get their "off" values), so a batch can mix requests freely (:func:`vllm_batch`).

Fields and validation follow vLLM's ``vllm/sampling_params.py`` (``SamplingParams._verify_args``,
checked against vLLM main at commit 00388f6): the request-level fields (``n``, ``best_of``,
``max_tokens``, ``stop``, ``stop_token_ids``, ``ignore_eos``, ``logprobs`` ...) land in
``Preset.request`` for :class:`jaxsample.decoding.DecodeRequest`, which picks the strategy.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Sequence

from jaxsample import stages
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import chain
from jaxsample.presets import _fields
from jaxsample.presets._preset import Preset, check_bias, stack

_SAMPLING_EPS = 1e-5
_MIN_TEMP = 0.01


def _check(cond: bool, field: str, message: str, value) -> None:
    if not cond:
        raise ValueError(f"{field} {message}, got {value!r}")


#: Every ``SamplingParams`` field vLLM accepts (plus ``best_of``, kept by older versions), by role.
SAMPLING_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
                   "min_p", "seed", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
                   "thinking_token_budget")
REQUEST_FIELDS = ("n", "best_of", "max_tokens", "stop_token_ids", "ignore_eos", "logprobs", "repetition_detection")
#: Fields that act on text or on output formatting (the text layer reads them from ``Preset.request``).
TEXT_FIELDS = ("stop", "include_stop_str_in_output", "detokenize", "skip_special_tokens",
               "spaces_between_special_tokens", "output_kind", "stream_interval")
#: Scoring fields (prompt log-probs, log-probs of given token ids): recorded for the scoring API.
SCORING_FIELDS = ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids",
                  "flat_logprobs")
#: Engine-only or derived fields with no effect on the tokens (accepted and ignored).
INERT_FIELDS = ("skip_clone", "skip_reading_prefix_cache", "extra_args", "routed_experts_prompt_start",
                "output_text_buffer_length")  # the last one: derived by vLLM from `stop`
#: Fields whose feature is not available here: accepted only at their "off" value.
_UNAVAILABLE = {
    "structured_outputs": (None, "compile the constraint with jaxsample.structured (regex / JSON schema / GBNF) "
                                 "and add its stage to the chain"),
    "trace_decode_token_ids": (None, "forced decoding of given ids is teacher forcing: use the scoring API"),
}
#: Extra keywords of this function (not SamplingParams fields).
OWN_FIELDS = ("bad_words_ids", "eos_token_ids", "list_capacity", "candidates", "tokenizer", "think_start_token_ids",
              "think_end_token_ids")
#: The fields a sampler config (no request) takes: what :mod:`jaxsample.evaluation` accepts.
SAMPLER_FIELDS = SAMPLING_FIELDS + ("bad_words_ids", "eos_token_ids", "list_capacity", "candidates",
                                    "think_start_token_ids", "think_end_token_ids")
_VLLM_MAX_N = 16384  # VLLM_MAX_N_SEQUENCES default


def vllm(config: Any = None, /, **fields: Any) -> Preset:
    """The vLLM V1 sampler and request for one ``SamplingParams`` (an object, a dict, or keyword fields).

    ``config`` is a ``vllm.SamplingParams`` (read through its attributes: vLLM need not be
    installed, any object with those attributes works) or a dict of its fields; keyword ``fields``
    override it. Every field vLLM accepts is taken and validated with vLLM's own rules (errors name
    the field); an unknown field is a ``ValueError``. Defaults are vLLM's (``max_tokens=16``).

    * Sampling fields build the chain; ``seed=None`` (or ``-1``) draws a fresh seed from the OS
      entropy (recorded in ``values["seed"]`` and ``request["seed"]`` so the run can be replayed).
    * ``bad_words`` strings need ``tokenizer=`` (anything with ``encode(text,
      add_special_tokens=False)``); they are tokenised as vLLM does (with and without a leading
      space). ``bad_words_ids`` gives token sequences directly.
    * ``eos_token_ids`` are the model's EOS ids: they stop generation (unless ``ignore_eos``) and,
      with ``stop_token_ids``, are masked until ``min_tokens`` tokens exist.
    * Request fields (``n``, ``best_of``, ``max_tokens``, ``stop_token_ids``, ``ignore_eos``,
      ``logprobs``) and text fields (``stop`` strings, ``include_stop_str_in_output``,
      ``skip_special_tokens`` ...) go to ``Preset.request``; stop *strings* need a tokenizer and
      are matched by the text layer (see ``docs/migrating.md``).
      :meth:`jaxsample.decoding.DecodeRequest.from_preset` turns the preset into a strategy call.

    ``list_capacity`` is the static size of the per-row id lists (logit bias, allowed ids, stop
    ids). The penalties stage reads the whole history: pass ``history_size`` (prompt + max tokens)
    to ``Sampler.init`` when driving the sampler yourself.

    >>> vllm(temperature=0.0, seed=1).values["temperature"]
    0.0
    >>> p = vllm({"n": 2, "best_of": 3, "max_tokens": 8, "stop": ["\\n\\n"], "seed": 5})
    >>> p.request["n"], p.request["best_of"], p.request["max_new_tokens"], p.request["stop"]
    (2, 3, 8, ('\\n\\n',))
    """
    what = "vllm.SamplingParams"
    data = _fields.read(config, fields, what=what)
    known = SAMPLING_FIELDS + REQUEST_FIELDS + TEXT_FIELDS + SCORING_FIELDS + INERT_FIELDS + tuple(_UNAVAILABLE)
    _fields.unknown(data, known + OWN_FIELDS, what)
    for name, (off, reason) in _UNAVAILABLE.items():
        value = data.get(name)
        if value is not None and value not in (off if isinstance(off, tuple) else (off,)):
            raise ValueError(f"{name}: {reason}")
    get = data.get
    num, integer, flag = _fields.number, _fields.integer, _fields.flag

    n = integer("n", get("n", 1))
    _check(1 <= n <= _VLLM_MAX_N, "n", f"must be in [1, {_VLLM_MAX_N}]", n)
    best_of = get("best_of")
    if best_of is not None:
        best_of = integer("best_of", best_of)
        _check(best_of >= n, "best_of", f"must be greater than or equal to n={n}", best_of)
    presence = num("presence_penalty", get("presence_penalty", 0.0))
    frequency = num("frequency_penalty", get("frequency_penalty", 0.0))
    repetition = num("repetition_penalty", get("repetition_penalty", 1.0))
    temperature = num("temperature", get("temperature", 1.0))
    top_p = num("top_p", get("top_p", 1.0))
    top_k = integer("top_k", get("top_k", 0))
    min_p = num("min_p", get("min_p", 0.0))
    _check(-2.0 <= presence <= 2.0, "presence_penalty", "must be in [-2, 2]", presence)
    _check(-2.0 <= frequency <= 2.0, "frequency_penalty", "must be in [-2, 2]", frequency)
    _check(repetition > 0.0, "repetition_penalty", "must be greater than zero", repetition)
    _check(0.0 <= temperature <= 2.0, "temperature", "must be in [0, 2]", temperature)
    _check(0.0 < top_p <= 1.0, "top_p", "must be in (0, 1]", top_p)
    _check(top_k >= -1, "top_k", "must be 0 (disable), or at least 1", top_k)
    _check(0.0 <= min_p <= 1.0, "min_p", "must be in [0, 1]", min_p)
    max_tokens = get("max_tokens", 16)
    if max_tokens is not None:
        max_tokens = integer("max_tokens", max_tokens)
        _check(max_tokens >= 1, "max_tokens", "must be at least 1", max_tokens)
    min_tokens = integer("min_tokens", get("min_tokens", 0))
    _check(min_tokens >= 0, "min_tokens", "must be greater than or equal to 0", min_tokens)
    if max_tokens is not None:
        _check(min_tokens <= max_tokens, "min_tokens", f"must be less than or equal to max_tokens={max_tokens}",
               min_tokens)
    stream_interval = get("stream_interval")
    if stream_interval is not None:
        _check(integer("stream_interval", stream_interval) >= 1, "stream_interval", "must be at least 1",
               stream_interval)
    logprobs = _logprobs("logprobs", get("logprobs"))
    prompt_logprobs = _logprobs("prompt_logprobs", get("prompt_logprobs"))
    stop_ids = _fields.ids("stop_token_ids", get("stop_token_ids"))
    stop = _fields.strings("stop", get("stop"))
    detokenize = flag("detokenize", get("detokenize", True))
    if stop and not detokenize:
        raise ValueError("stop: stop strings are only supported when detokenize is True")
    ignore_eos = flag("ignore_eos", get("ignore_eos", False))
    for name in ("include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
                 "flat_logprobs"):
        flag(name, get(name, name in ("skip_special_tokens", "spaces_between_special_tokens")))
    eos = _fields.ids("eos_token_ids", get("eos_token_ids"))
    seed = get("seed")
    if seed is not None:
        seed = integer("seed", seed)
    seed = _fields.fresh_seed() if seed is None or seed == -1 else seed
    if temperature < _SAMPLING_EPS:
        _check(n == 1, "n", "must be 1 when using greedy sampling (temperature 0)", n)
        _check(best_of in (None, 1), "best_of", "must be 1 when using greedy sampling (temperature 0)", best_of)
    allowed = get("allowed_token_ids")
    if allowed is not None:
        allowed = _fields.ids("allowed_token_ids", allowed)
        _check(len(allowed) > 0, "allowed_token_ids", "must not be empty", allowed)
    bias = get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}")
        try:
            bias = {int(k): num(f"logit_bias[{k!r}]", v, finite=False) for k, v in bias.items()}  # inf: +-100
        except (TypeError, ValueError) as err:
            if "logit_bias[" in str(err):
                raise
            raise ValueError(f"logit_bias contains key(s) that cannot be converted to integer token ids: "
                             f"{[k for k in bias if not _int_like(k)]!r}") from None
    bad_ids = [tuple(_fields.ids(f"bad_words_ids[{i}]", w)) for i, w in enumerate(get("bad_words_ids") or ())]
    words = _fields.strings("bad_words", get("bad_words"))
    if words:
        tokenizer = get("tokenizer")
        if tokenizer is None:
            raise ValueError("bad_words: strings need a tokenizer: pass tokenizer= (or token sequences as bad_words_ids)")
        bad_ids += _bad_words_ids(words, tokenizer)
    preset = _sampler(
        presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, stop_token_ids=stop_ids,
        min_tokens=min_tokens, logit_bias=bias, allowed_token_ids=allowed, bad_words_ids=tuple(bad_ids),
        eos_token_ids=eos, list_capacity=integer("list_capacity", get("list_capacity", 64)),
        candidates=integer("candidates", get("candidates", DEFAULT_CANDIDATES)),
        thinking_token_budget=None if get("thinking_token_budget") is None
        else integer("thinking_token_budget", get("thinking_token_budget")),
        think_start_token_ids=None if get("think_start_token_ids") is None
        else _fields.ids("think_start_token_ids", get("think_start_token_ids")),
        think_end_token_ids=None if get("think_end_token_ids") is None
        else _fields.ids("think_end_token_ids", get("think_end_token_ids")),
    )
    request = {
        "source": "vllm",
        "n": n,
        "best_of": best_of,
        "max_new_tokens": max_tokens,
        "min_new_tokens": min_tokens,
        "eos_ids": tuple(dict.fromkeys(stop_ids + (() if ignore_eos else eos))),
        "ignore_eos": ignore_eos,
        "logprobs": logprobs,
        "seed": seed,
        "stop": stop,
        "prompt_logprobs": prompt_logprobs,
        "repetition_detection": get("repetition_detection"),
        **{k: get(k) for k in ("prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids")
           if get(k) is not None},
        "include_stop_str_in_output": get("include_stop_str_in_output", False),
        "detokenize": detokenize,
        "skip_special_tokens": get("skip_special_tokens", True),
        "spaces_between_special_tokens": get("spaces_between_special_tokens", True),
        "output_kind": _output_kind(get("output_kind")),
        "stream_interval": stream_interval,
    }
    return Preset(preset.sampler, preset.values, request)


def _logprobs(name: str, value: Any) -> int | None:
    """vLLM: ``None``, ``True`` (= 1), ``-1`` (whole vocabulary) or ``>= 0``."""
    if value is None:
        return None
    if value is True:
        return 1
    value = _fields.integer(name, value)
    _check(value == -1 or value >= 0, name, "must be non-negative or -1", value)
    return value


_OUTPUT_KINDS = ("CUMULATIVE", "DELTA", "FINAL_ONLY")  # vLLM's RequestOutputKind, by value


def _output_kind(value: Any) -> str:
    """vLLM ``RequestOutputKind`` (an enum, its value or its name) -> its name; ``None`` -> CUMULATIVE."""
    if value is None:
        return "CUMULATIVE"
    name = getattr(value, "name", None)
    if name is None:
        name = _OUTPUT_KINDS[value] if isinstance(value, int) and 0 <= value < 3 else str(value).upper()
    if name not in _OUTPUT_KINDS:
        raise ValueError(f"output_kind must be one of {', '.join(_OUTPUT_KINDS)}, got {value!r}")
    return name


def _int_like(key: Any) -> bool:
    try:
        int(key)
    except (TypeError, ValueError):
        return False
    return True


def _bad_words_ids(words: Sequence[str], tokenizer: Any) -> list[tuple[int, ...]]:
    """vLLM's ``update_from_tokenizer``: each word without and (when it tokenises to a new first
    token of the same length) with a leading space."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(_fields.encode(tokenizer, word.lstrip()))
        if not plain:
            raise ValueError(f"bad_words: {word!r} must tokenize to at least one token")
        out.append(plain)
        spaced = tuple(_fields.encode(tokenizer, " " + word.lstrip()))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def _sampler(
    *,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int,
    stop_token_ids: Sequence[int] | None = None,
    min_tokens: int = 0,
    logit_bias: dict[int, float] | None = None,
    allowed_token_ids: Sequence[int] | None = None,
    bad_words_ids: Sequence[Sequence[int]] = (),
    eos_token_ids: Sequence[int] = (),
    thinking_token_budget: int | None = None,
    think_start_token_ids: Sequence[int] | None = None,
    think_end_token_ids: Sequence[int] | None = None,
    list_capacity: int = 64,
    candidates: int = DEFAULT_CANDIDATES,
) -> Preset:
    """The sampler chain of validated sampling fields (see :func:`vllm`).

    With ``think_start_token_ids`` and ``think_end_token_ids`` (vLLM's ``ReasoningConfig``) the chain
    gets vLLM's thinking-token budget (:func:`jaxsample.stages.reasoning_budget`, after the logit
    bias; ``thinking_token_budget`` ``None`` = no budget, the per-row value stays traced).
    """
    check_bias(logit_bias or {}, "logit_bias", allow=(-math.inf, math.inf))  # infinities clamp to +-100
    stop = list(dict.fromkeys([int(t) for t in (stop_token_ids or ())] + [int(t) for t in eos_token_ids]))
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
        stages.min_tokens(capacity=list_capacity),
        stages.logit_bias(capacity=list_capacity, clamp=100.0),
    ]
    thinking = think_start_token_ids is not None and think_end_token_ids is not None
    if thinking:
        parts.append(stages.reasoning_budget(tuple(think_start_token_ids), tuple(think_end_token_ids)))
    elif thinking_token_budget not in (None, -1):  # -1: no budget (vLLM's "off")
        _check(False, "thinking_token_budget", "needs think_start_token_ids and think_end_token_ids",
               thinking_token_budget)
    if thinking_token_budget is not None:
        _check(thinking_token_budget >= -1, "thinking_token_budget", "must be -1 or >= 0", thinking_token_budget)
    parts += [
        stages.penalties(scope="vllm"),
        stages.temperature(),
        stages.min_p(),
        stages.top_k(candidates=candidates),
        stages.top_p(candidates=candidates),
    ]
    values: dict[str, Any] = {
        "seed": seed,
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
    if thinking:
        values["thinking_token_budget"] = -1 if thinking_token_budget is None else thinking_token_budget
    return Preset(chain(*parts, select=stages.categorical(candidates=candidates)), values)


def vllm_batch(requests: Sequence[dict[str, Any]], **shared) -> Preset:
    """One preset for a batch of vLLM requests (row ``i`` follows ``requests[i]``).

    Each request is a ``SamplingParams`` object or a dict; ``shared`` fields (e.g.
    ``eos_token_ids``, ``list_capacity``) apply to every request.
    Requests must agree on ``bad_words_ids`` (a static stage); everything else may differ per row.
    """
    return stack([vllm({**shared, **_fields.read(r, {}, what=f"requests[{i}]")}) for i, r in enumerate(requests)])
