"""Raw text handling for the infilling pipeline: UTF-8 decoding with counted repairs, sentences, words.

Decoding policy (``utf8_errors``):

* ``"replace"`` (default): each invalid byte sequence becomes U+FFFD, the record is kept and the number
  of replacements is counted (reported as ``utf8_replacements`` / ``records_utf8_repaired``);
* ``"strict"``: a record with invalid UTF-8 is dropped with reason ``invalid_utf8``.

Words are whitespace-separated (``str.split()``, as the author's ``sentence.split(' ')`` but robust to
runs of whitespace), so a masked span of words is rebuilt as ``' '.join(words)``: whitespace inside a
record is normalised to single spaces.

Sentence splitting is rule based (no model, no download): a sentence ends at ``.``, ``!``, ``?``, ``…``
(optionally followed by closing quotes or brackets) when whitespace and an upper-case letter, digit or
opening quote follow, unless the word before the full stop is a known abbreviation (``e.g.``, ``Dr.``,
``etc.`` ...) or a single letter (initials); CJK full stops (``。！？``) always end a sentence; a blank
line always ends a sentence (paragraph break).
"""

from __future__ import annotations

import re

#: Byte sequence of a valid U+FFFD in UTF-8 (not counted as a repair).
_REPLACEMENT_BYTES = "\ufffd".encode()

_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al approx dept est fig figs eq eqs no nos vol vols p pp ch sec ed eds mr mrs ms dr "
    "prof sr jr st mt jan feb mar apr jun jul aug sep sept oct nov dec inc ltd co corp resp viz".split()
)
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# A candidate boundary: terminator(s), optional closers, whitespace, then something that starts a sentence.
_BOUNDARY = re.compile(
    r"""([.!?\u2026]+)(['"\u2019\u201d)\]]*)\s+(?=[\[(\u2018\u201c'"A-Z0-9\u00c0-\u024f])"""
)
_CJK_STOPS = "\u3002\uff01\uff1f"
_CJK_BOUNDARY = re.compile(r"([\u3002\uff01\uff1f]+)(['\"\u2019\u201d\u300d\u300f)\]]*)")


def decode_utf8(raw: bytes, errors: str = "replace") -> tuple[str | None, int]:
    """Decodes ``raw`` as UTF-8; returns ``(text, n_replaced)``, ``text=None`` if invalid under ``strict``.

    A leading byte-order mark is removed.

    >>> decode_utf8(b"caf\\xc3\\xa9 \\xff!")
    ('café \\ufffd!', 1)
    >>> decode_utf8(b"\\xff", errors="strict")
    (None, 0)
    """
    if errors not in ("replace", "strict"):
        raise ValueError(f"utf8_errors must be 'replace' or 'strict', got {errors!r}")
    try:
        text, replaced = raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        if errors == "strict":
            return None, 0
        text = raw.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd") - raw.count(_REPLACEMENT_BYTES)
    return text.removeprefix("\ufeff"), replaced


def truncate_utf8(raw: bytes, max_bytes: int) -> bytes:
    """Cuts ``raw`` to at most ``max_bytes`` without splitting a UTF-8 character.

    >>> truncate_utf8("aé".encode(), 2)
    b'a'
    """
    if len(raw) <= max_bytes:
        return raw
    cut = max_bytes
    while cut > 0 and cut > max_bytes - 3 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return raw[:cut]


def _ends_with_abbreviation(chunk: str) -> bool:
    last = chunk.rsplit(None, 1)[-1] if chunk.strip() else ""
    word = last.rstrip(".!?\u2026'\"\u2019\u201d)]").lstrip("([\"'\u2018\u201c").lower()
    return len(word) == 1 and word.isalpha() or word in _ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """Splits ``text`` into sentences (see the module docstring); whitespace-only pieces are dropped.

    >>> split_sentences("Dr. Who arrived, e.g. at 5 p.m. today. Then he left!  Why?\\n\\nNew 你好。再见")
    ['Dr. Who arrived, e.g. at 5 p.m. today.', 'Then he left!', 'Why?', 'New 你好。', '再见']
    """
    sentences = []
    for paragraph in _PARAGRAPH.split(text):
        start = 0
        for match in _BOUNDARY.finditer(paragraph):
            end = match.end(2)
            if match.group(1) == "." and _ends_with_abbreviation(paragraph[start : match.start(1) + 1]):
                continue
            sentences.append(paragraph[start:end])
            start = match.end()
        sentences.append(paragraph[start:])
    if any(stop in text for stop in _CJK_STOPS):
        sentences = [piece for sentence in sentences for piece in _split_cjk(sentence)]
    return [stripped for sentence in sentences if (stripped := sentence.strip())]


def _split_cjk(sentence: str):
    start = 0
    for match in _CJK_BOUNDARY.finditer(sentence):
        yield sentence[start : match.end()]
        start = match.end()
    yield sentence[start:]


def split_words(sentence: str) -> list[str]:
    """Whitespace words (the unit Wakong masks at word level).

    >>> split_words("  a\\tb\\n c ")
    ['a', 'b', 'c']
    """
    return sentence.split()
