"""Strings in, strings out: any decoding strategy driven through a tokenizer.

:func:`generate_text` encodes the prompts, builds the stop-string tables
(:mod:`jaxsample.decoding.stop_strings`) and calls a strategy of :mod:`jaxsample.decoding`
(``generate`` by default; ``beam_search``, ``sample_and_rank``, ``contrastive_search``,
``speculative_generate`` take the same route), then decodes the tokens. :func:`stream_text`
streams :func:`jaxsample.decoding.stream` through :class:`~jaxsample.text.detokenize.IncrementalText`.

Per request, with vLLM's meanings:

* ``max_tokens`` / ``min_tokens``: int or one per prompt. They are the strategies' per-row
  ``max_new_tokens`` / ``min_new_tokens`` (traced: new values never recompile within the static
  ``output_width``). Before ``min_tokens`` tokens neither EOS nor a stop string ends a row;
* ``stop``: a string, a list of strings (every prompt) or one entry per prompt. A row stops on the
  token that completes one of its strings (matched on the device); the text ends before the stop
  string, or after it with ``include_stop_str_in_output=True``; text following the stop string in
  the same token is dropped. With several strings completed by the same token, the first in the
  row's list wins (vLLM's order);
* ``finish_reason``: ``"stop"`` (EOS or a stop string) or ``"length"``; ``stop_reason`` is the
  matched stop string, else ``None``.

``token_ids`` are all generated tokens (the one completing a stop string and EOS included).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from jaxsample.decoding import stop_strings
from jaxsample.decoding._stopping import FinishReason
from jaxsample.decoding.generate import generate
from jaxsample.decoding.stream import stream
from jaxsample.text.detokenize import IncrementalText
from jaxsample.text.tokenizer import TextTokenizer, as_tokenizer


class TextOutput(NamedTuple):
    """One completion."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None  # the stop string that ended it


class TextChunk(NamedTuple):
    """One streaming step, on the host (``B`` entries each)."""

    text: list[str]  # new text per prompt ("" when none is ready)
    finish_reason: list[str | None]  # None while running


def _rows(value, batch: int, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an int or a list of ints (one per prompt), got {value!r}")
    if arr.ndim == 0:
        arr = np.full((batch,), int(arr))
    if arr.shape != (batch,):
        raise ValueError(f"{name} must be an int or have one value per prompt ({batch}), got shape {arr.shape}")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0, got {arr.tolist()}")
    return arr.astype(np.int32)


class _Prepared(NamedTuple):
    tok: TextTokenizer
    prompt: np.ndarray
    stops: list[list[str]]
    kwargs: dict


def _prepare(tokenizer, prompts, max_tokens, min_tokens, stop, output_width, max_stop_strings, max_stop_len, kwargs):
    tok = as_tokenizer(tokenizer)
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    ids = [tok.encode(p) for p in prompts]
    b = len(ids)
    if b == 0:
        raise ValueError("prompts must not be empty")
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise ValueError(f"prompts {empty} encode to no tokens (every row needs at least one)")
    prompt = np.full((b, max(map(len, ids))), -1, np.int32)
    for i, row in enumerate(ids):
        prompt[i, : len(row)] = row
    max_new = _rows(max_tokens, b, "max_tokens")
    min_new = _rows(min_tokens, b, "min_tokens")
    rows = stop_strings.normalise(stop, b)
    for name in ("eos_ids", "stop_sequences", "max_new_tokens", "min_new_tokens"):
        if name in kwargs:
            raise ValueError(f"{name} is set by the text layer (use max_tokens, min_tokens, stop, output_width)")
    kw = dict(kwargs)
    kw.update(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        max_tokens=int(max_new.max()) if output_width is None else output_width,
        eos_ids=list(tok.eos_ids) or None,
    )
    if any(rows) or max_stop_strings:
        kw["stop_sequences"] = stop_strings.build(
            tok.token_bytes, rows, max_stop_strings=max_stop_strings, max_len=max_stop_len
        )
    return _Prepared(tok, prompt, rows, kw)


def _finish(tok: TextTokenizer, ids: list[int], reason: int, stop: list[str], include: bool) -> TextOutput:
    """Decodes one finished sequence the way :func:`stream_text` shows it."""
    inc = IncrementalText(tok, stop, include)
    stopped = reason == FinishReason.STOP_SEQUENCE
    text = "".join(inc.push(t, stopped and i == len(ids) - 1) for i, t in enumerate(ids)) + inc.finish()
    kind = "length" if reason == FinishReason.LENGTH else "stop"
    return TextOutput(text, ids, kind, inc.stop_reason)


def generate_text(
    model,
    params: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_tokens: int | Sequence[int] = 16,
    min_tokens: int | Sequence[int] = 0,
    stop: str | Sequence[Any] | None = None,
    include_stop_str_in_output: bool = False,
    output_width: int | None = None,
    max_stop_strings: int | None = None,
    max_stop_len: int | None = None,
    strategy: Callable = generate,
    **kwargs,
) -> list:
    """Generates text for each prompt (see the module docstring for the semantics).

    Args:
      model, params: as for the strategy (a :class:`jaxsample.decoding.Model`, decoder-only).
      tokenizer: anything :func:`jaxsample.text.as_tokenizer` accepts.
      prompts: ``B`` strings.
      max_tokens, min_tokens: per-request budgets (int or ``B`` ints).
      stop, include_stop_str_in_output: stop strings (vLLM semantics).
      output_width: static token buffer ``N >= max(max_tokens)``; fix it (and ``max_stop_strings``,
        ``max_stop_len``, the stop tables' static sizes) so new requests never recompile.
      strategy: a function of :mod:`jaxsample.decoding` (default :func:`~jaxsample.decoding.generate`).
      **kwargs: passed to the strategy (``sampler``, ``sampler_params``, ``num_beams``, ...).

    Returns:
      ``B`` :class:`TextOutput`; for strategies returning several sequences per prompt
      (``beam_search``, ``sample_and_rank``) ``B`` lists of them, best first.
    """
    prep = _prepare(
        tokenizer, prompts, max_tokens, min_tokens, stop, output_width, max_stop_strings, max_stop_len, kwargs
    )
    out = strategy(model, params, prep.prompt, **prep.kwargs)
    tokens, lengths, reasons = (np.asarray(x) for x in (out.tokens, out.lengths, out.finish_reason))
    several = tokens.ndim == 3  # [B, R, N]: several sequences per prompt
    if not several:
        tokens, lengths, reasons = tokens[:, None], lengths[:, None], reasons[:, None]
    results = []
    for b in range(tokens.shape[0]):
        per = [
            _finish(
                prep.tok,
                tokens[b, r, : lengths[b, r]].tolist(),
                int(reasons[b, r]),
                prep.stops[b],
                include_stop_str_in_output,
            )
            for r in range(tokens.shape[1])
        ]
        results.append(per if several else per[0])
    return results


def stream_text(
    model,
    params: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_tokens: int | Sequence[int] = 16,
    min_tokens: int | Sequence[int] = 0,
    stop: str | Sequence[Any] | None = None,
    include_stop_str_in_output: bool = False,
    output_width: int | None = None,
    max_stop_strings: int | None = None,
    max_stop_len: int | None = None,
    **kwargs,
) -> Iterator[TextChunk]:
    """Streams :func:`jaxsample.decoding.stream` as text; arguments as :func:`generate_text`.

    Each prompt's deltas, concatenated, equal its :func:`generate_text` text (same tokens): no
    delta ends inside a UTF-8 character or shows the start of a stop string that is later cut.
    """
    prep = _prepare(
        tokenizer, prompts, max_tokens, min_tokens, stop, output_width, max_stop_strings, max_stop_len, kwargs
    )
    rows = [IncrementalText(prep.tok, s, include_stop_str_in_output) for s in prep.stops]
    done = [False] * len(rows)
    for chunk in stream(model, params, prep.prompt, **prep.kwargs):
        text, finish = [], []
        for b, inc in enumerate(rows):
            delta, why = "", None
            if not done[b]:
                reason = int(chunk.finish_reason[b])
                if chunk.emitted[b]:
                    delta = inc.push(int(chunk.tokens[b]), reason == FinishReason.STOP_SEQUENCE)
                if reason != FinishReason.NOT_FINISHED:
                    delta += inc.finish()
                    why = "length" if reason == FinishReason.LENGTH else "stop"
                    done[b] = True
            text.append(delta)
            finish.append(why)
        yield TextChunk(text, finish)
    if not all(done):  # rows with max_tokens == 0 (or a stream that never started)
        yield TextChunk(
            [inc.finish() if not d else "" for inc, d in zip(rows, done)],
            ["length" if not d else None for d in done],
        )
