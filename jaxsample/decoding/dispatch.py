"""One request -> the right strategy call: :class:`DecodeRequest` and :func:`run_request`.

A vLLM ``SamplingParams`` or an HF ``GenerationConfig`` describes a whole request: the sampler,
the strategy (``n`` / ``best_of``, ``num_beams``, ``penalty_alpha`` ...), budgets, EOS / pad ids,
log-probs and stop strings. :func:`jaxsample.presets.vllm` / :func:`jaxsample.presets.hf` read it
into a :class:`~jaxsample.presets.Preset` whose ``request`` holds those fields;
:meth:`DecodeRequest.from_preset` maps them to a strategy name and its keywords exactly once, and
:func:`run_request` calls the strategy, so a user never re-maps fields by hand::

    req = DecodeRequest.from_vllm({"n": 2, "best_of": 4, "max_tokens": 64, "temperature": 0.8},
                                  eos_token_ids=[tok.eos_id])
    out = run_request(req, model, params, prompt)  # sample_and_rank(n=2, best_of=4, max_new_tokens=64, ...)

Strategy choice (HF's ``generate`` rules; vLLM's ``n`` / ``best_of``):

============================================== =========================================
request                                        strategy
============================================== =========================================
vLLM ``n == best_of == 1``                     ``generate`` (greedy when temperature 0)
vLLM ``n > 1`` or ``best_of > n``              ``sample_and_rank(n, best_of)``
HF ``num_beams > 1``, ``num_beam_groups > 1``  ``group_beam_search``
HF ``num_beams > 1``                           ``beam_search`` (``do_sample``: beam sampling)
HF ``penalty_alpha > 0``, ``top_k > 1``        ``contrastive_search``
HF ``num_return_sequences = R > 1`` (sampling) ``sample_and_rank(n=R, best_of=R)``
otherwise                                      ``generate`` (greedy, or sampling)
============================================== =========================================

Fields that act on text (``stop`` strings, ``include_stop_str_in_output``, detokenization
options) are kept in :attr:`DecodeRequest.text` for the text layer, which owns the tokenizer;
scoring fields (``prompt_logprobs`` ...) in :attr:`DecodeRequest.scoring`. :func:`run_request` works on
token ids and refuses a request whose stop strings or scoring fields it would otherwise drop.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from jaxsample.decoding.beam import beam_search, group_beam_search
from jaxsample.decoding.constrained import constrained_beam_search
from jaxsample.decoding.contrastive import contrastive_search
from jaxsample.decoding.dola import dola_generate
from jaxsample.decoding.generate import generate
from jaxsample.decoding.rank import sample_and_rank

#: The strategy functions :func:`run_request` dispatches to, by name.
STRATEGIES = {
    "generate": generate,
    "beam_search": beam_search,
    "group_beam_search": group_beam_search,
    "sample_and_rank": sample_and_rank,
    "contrastive_search": contrastive_search,
    "dola_generate": dola_generate,
    "constrained_beam_search": constrained_beam_search,
}
_TEXT = ("stop", "include_stop_str_in_output", "detokenize", "skip_special_tokens",
         "spaces_between_special_tokens", "output_kind", "stream_interval")
_SCORING = ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start")


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
    """A whole decoding request: which strategy, with which sampler, keywords and text options.

    Attributes:
      strategy: a key of :data:`STRATEGIES`.
      preset: the sampler chain and its values (``None``: no processors, greedy).
      options: keywords of the strategy function (``max_new_tokens``, ``eos_ids``, ``pad_id``,
        ``num_beams``, ``n``, ``best_of``, ``logprobs`` ...). ``max_new_tokens`` may be ``None``
        (vLLM ``max_tokens=None``): :func:`run_request` then needs it as an override.
      text: text-level fields (``stop`` strings, ``include_stop_str_in_output``,
        ``skip_special_tokens`` ...) for the text layer; they need a tokenizer.
      scoring: prompt log-prob fields (vLLM ``prompt_logprobs`` ...) for the scoring API.
      max_length: HF ``max_length`` (counts the prompt): ``max_new_tokens = max_length - P`` at run.
      start_id: the token to start from when :func:`run_request` gets no prompt (HF
        ``decoder_start_token_id``, else ``bos_token_id``).
    """

    strategy: str = "generate"
    preset: Any = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    text: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    scoring: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_length: int | None = None
    start_id: int | None = None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")

    @classmethod
    def from_preset(cls, preset, **options: Any) -> "DecodeRequest":
        """The request a preset's config describes; ``options`` override the strategy keywords.

        A preset without request fields (llama.cpp, scenarios built by hand) decodes with
        ``generate``; give it ``max_new_tokens`` here or at :func:`run_request`.
        """
        r = dict(preset.request or {}) if preset is not None else {}
        source = r.get("source")
        opts: dict[str, Any] = {"max_new_tokens": r.get("max_new_tokens")}
        if r.get("min_new_tokens"):
            opts["min_new_tokens"] = r["min_new_tokens"]
        if r.get("eos_ids"):
            opts["eos_ids"] = _eos(r["eos_ids"])
        if r.get("pad_id") is not None:
            opts["pad_id"] = r["pad_id"]
        logprobs = r.get("logprobs")
        if source == "vllm":
            n, best_of = r["n"], r.get("best_of") or r["n"]
            strategy = "sample_and_rank" if n > 1 or best_of > 1 else "generate"
            if strategy == "sample_and_rank":
                opts.update(n=n, best_of=best_of)
        elif source == "hf":
            strategy, more = _hf_strategy(r, getattr(preset, "strategy", {}))
            opts.update(more)
        else:
            strategy = "generate"
        if r.get("logprob_token_ids") is not None:
            if strategy != "generate":
                raise ValueError(f"logprob_token_ids: recorded by generate only, not by {strategy}")
            opts["logprob_token_ids"] = list(r["logprob_token_ids"])
        if r.get("repetition_detection") is not None:
            if strategy != "generate":
                raise ValueError(f"repetition_detection: supported by generate only, not by {strategy}")
            opts["repetition_detection"] = r["repetition_detection"]
        if logprobs is not None:
            if strategy != "generate":
                raise ValueError(f"logprobs: log-probs are returned by generate only, not by {strategy} "
                                 "(sample_and_rank ranks by them internally)")
            opts.update(logprobs=True, top_logprobs=logprobs)
        opts.update(options)
        text = {k: r[k] for k in _TEXT if k in r and r[k] not in (None, ())}
        scoring = {k: r[k] for k in _SCORING if r.get(k) is not None}
        return cls(strategy, preset, opts, text, scoring, r.get("max_length"), r.get("start_id"))

    @classmethod
    def from_vllm(cls, config: Any = None, /, **fields: Any) -> "DecodeRequest":
        """``from_preset(jaxsample.presets.vllm(config, **fields))``."""
        from jaxsample import presets

        return cls.from_preset(presets.vllm(config, **fields))

    @classmethod
    def from_hf(cls, config: Any = None, /, **fields: Any) -> "DecodeRequest":
        """``from_preset(jaxsample.presets.hf(config, **fields))``."""
        from jaxsample import presets

        return cls.from_preset(presets.hf(config, **fields))


def _eos(eos) -> Any:
    """A tuple of ids, or one tuple per row (stacked presets) padded with -1 to ``int32[B, E]``."""
    if isinstance(eos, list):
        width = max(1, max(len(e) for e in eos))
        return np.asarray([list(e) + [-1] * (width - len(e)) for e in eos], np.int32)
    return list(eos)


def _hf_strategy(r: Mapping[str, Any], chosen: Mapping[str, Any]) -> tuple[str, dict]:
    beams, groups, returns = r["num_beams"], r["num_beam_groups"], r["num_return_sequences"]
    if "dola_layers" in chosen:  # HF runs DoLa only as a one-beam search
        if beams > 1:
            raise ValueError("dola_layers needs num_beams=1 (DoLa is a greedy or sampling strategy, as in HF)")
        return "dola_generate", dict(chosen)
    if "constraints" in chosen:
        if beams < 2:
            raise ValueError("constraints / force_words_ids need num_beams > 1 (constrained beam search, as in HF)")
        return "constrained_beam_search", dict(chosen, num_beams=beams, length_penalty=r["length_penalty"],
                                               early_stopping=r["early_stopping"], num_return_sequences=returns)
    if beams > 1:
        opts = dict(num_beams=beams, length_penalty=r["length_penalty"], early_stopping=r["early_stopping"],
                    num_return_sequences=returns)
        if groups > 1:
            return "group_beam_search", {**opts, "num_beam_groups": groups, "diversity_penalty": r["diversity_penalty"]}
        return "beam_search", {**opts, "do_sample": r["do_sample"]}
    if not r["do_sample"] and r["penalty_alpha"] > 0 and r["top_k"] > 1:
        return "contrastive_search", dict(top_k=r["top_k"], penalty_alpha=r["penalty_alpha"])
    if returns > 1:
        return "sample_and_rank", dict(n=returns, best_of=returns)
    return "generate", {}


def run_request(request: DecodeRequest, model, params, prompt=None, prompt_lengths=None, *, batch_size: int = 1,
        vocab_size: int | None = None, tokenizer: Any = None, **overrides: Any):
    """Runs ``request`` with its strategy on token ids; returns that strategy's output.

    Args:
      request: a :class:`DecodeRequest`.
      model, params, prompt, prompt_lengths: as in :func:`jaxsample.decoding.generate`. Without a
        prompt, every row starts from ``request.start_id`` (``batch_size`` rows).
      vocab_size: needed only for vLLM ``logprobs=-1`` (every token's log-prob).
      tokenizer: needed only for ``stop`` strings (anything :func:`jaxsample.text.as_tokenizer`
        takes): they are matched on the device (:mod:`jaxsample.decoding.stop_strings`) and a row
        stops on the token that completes one; the returned ids include that token (cut the text
        with :func:`jaxsample.decoding.stop_strings.truncate`, or decode through
        :func:`jaxsample.text.generate_text`, which applies ``include_stop_str_in_output``).
      overrides: strategy keywords that replace the request's (e.g. ``max_new_tokens``,
        ``sampler_params`` entries go through ``sampler_params=``).

    Raises:
      ValueError: stop strings without a tokenizer, scoring fields (prompt log-probs come from
        :func:`jaxsample.scoring.score_tokens`), a missing token budget, or no prompt and no start token.
    """
    stop = list(request.text.get("stop") or ())
    if stop and tokenizer is None:
        raise ValueError(f"stop: stop strings {stop!r} are matched on text: pass tokenizer= (or decode through "
                         "jaxsample.text.generate_text, or give token-id stop_sequences)")
    if request.scoring:
        name = next(iter(request.scoring))
        raise ValueError(f"{name}: prompt log-probs come from the scoring API (jaxsample.scoring.score_tokens), "
                         "not from a decoding strategy")
    if prompt is None:
        if request.start_id is None:
            raise ValueError("no prompt and no start token (decoder_start_token_id / bos_token_id) in the request")
        prompt = np.full((batch_size, 1), request.start_id, np.int32)
    opts = {**request.options, **overrides}
    if opts.get("max_new_tokens") is None:
        if request.max_length is None:
            raise ValueError("max_new_tokens: the request sets no token budget (vLLM max_tokens=None): pass "
                             "max_new_tokens=")
        width = np.shape(prompt)[-1]
        if request.max_length <= width:
            raise ValueError(f"max_length={request.max_length} leaves no new token after a prompt of width {width} "
                             "(HF counts the prompt in max_length): set max_new_tokens")
        opts["max_new_tokens"] = request.max_length - width
    if opts.get("top_logprobs") == -1:
        if vocab_size is None:
            raise ValueError("logprobs=-1 (every token) needs vocab_size=")
        opts["top_logprobs"] = vocab_size
    if stop:
        if opts.get("stop_sequences") is not None:
            raise ValueError("stop: stop strings and token-id stop_sequences cannot be combined in one call")
        from jaxsample.decoding import stop_strings
        from jaxsample.text import as_tokenizer

        rows = np.shape(prompt)[0]
        opts["stop_sequences"] = stop_strings.build(as_tokenizer(tokenizer, eos_ids=()).token_bytes, [stop] * rows)
    preset = request.preset
    if preset is not None and "sampler" not in overrides:
        rows = np.shape(prompt)[0]
        opts["sampler"] = preset.sampler
        opts["sampler_params"] = preset.params((rows,), **dict(opts.get("sampler_params") or {}))
    return _call(request.strategy, model, params, prompt, prompt_lengths, opts)


def _call(strategy: str, model, params, prompt, prompt_lengths, options: dict):
    """The one place that calls a strategy function (retarget it at a unified ``generate`` here)."""
    return STRATEGIES[strategy](model, params, prompt, prompt_lengths, **options)
