"""Incremental detokenization for streaming: text deltas that never split a UTF-8 character.

:class:`IncrementalText` receives one row's generated tokens as they arrive and returns the text
that is safe to show. It holds back

* an incomplete UTF-8 sequence at the end (as HF's ``TextStreamer`` and vLLM's incremental
  detokenizer do: a character split over byte-level or ``<0xNN>`` tokens appears whole, once);
* a tail that could be the start of one of the row's stop strings (as vLLM does), so that a
  stop string never reaches the stream when it is cut from the output.

The token that completes a stop string is pushed with ``stopped=True``: the text is then cut by
:func:`jaxsample.decoding.stop_strings.truncate`. A row that ends otherwise calls
:meth:`IncrementalText.finish` for the rest (a dangling incomplete sequence becomes U+FFFD). The concatenated deltas always equal the final
text of :func:`jaxsample.text.generate_text` for the same tokens.

>>> from jaxsample.text.tokenizer import TextTokenizer
>>> tok = TextTokenizer(None, (b"a", b"\\xc3", b"\\xa9", b"<", b"/b>"), (), "demo")
>>> inc = IncrementalText(tok, stop=["</b>"])
>>> [inc.push(t) for t in (0, 1, 2, 3)], inc.finish()
(['a', '', 'é', ''], '<')
"""

from __future__ import annotations

from typing import Sequence

from jaxsample.decoding.stop_strings import truncate
from jaxsample.text.tokenizer import TextTokenizer


def complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: complete
        if b >= 0xC0:  # lead byte: complete only if all its continuation bytes are there
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n  # only continuation bytes (invalid anyway): nothing to wait for


class IncrementalText:
    """One row's streaming detokenizer (see the module docstring)."""

    def __init__(self, tokenizer: TextTokenizer, stop: Sequence[str] = (), include_stop_str_in_output: bool = False):
        self._tok = tokenizer
        self._stop = [s.encode("utf-8") for s in stop]
        self._include = include_stop_str_in_output
        self.data = b""  # all bytes so far
        self.last_start = 0  # where the newest token's bytes begin
        self.emitted = 0  # bytes already returned as text
        self.stop_reason: str | None = None

    def _held(self) -> int:
        """Bytes at the end that could begin a stop string (proper prefixes only)."""
        held = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.data)), held, -1):
                if self.data.endswith(s[:k]):
                    held = k
                    break
        return held

    def _emit(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        out = self.data[self.emitted : end].decode("utf-8", errors="replace")
        self.emitted = end
        return out

    def push(self, token: int, stopped: bool = False) -> str:
        """Adds one generated token; returns the new text that is safe to show.

        ``stopped``: this token completed a stop string (the device said so); the text is then cut
        as vLLM does and the row is over.
        """
        self.last_start = len(self.data)
        self.data += self._tok.decode_bytes([token])
        if stopped and self._stop:
            cut, s = truncate(self.data, self.last_start, self._stop, self._include)
            self.stop_reason = None if s is None else s.decode("utf-8")
            return self._emit(len(cut))
        safe = complete_prefix(self.data[: len(self.data) - self._held()])
        return self._emit(safe)

    def finish(self) -> str:
        """The rest of the text, for a row that ended on EOS or its length (or was cut already)."""
        if self.stop_reason is not None:
            return ""
        return self._emit(len(self.data))
