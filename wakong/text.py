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

import itertools
import re
from typing import Sequence

import numpy as np

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


_LONGEST = max(map(len, _ABBREVIATIONS))  # lower() never shortens a word


def _abbreviation(word: str) -> bool:
    """Whether ``word`` (a whitespace word ending with a full stop) is a known abbreviation or a single
    letter, quotes and brackets aside."""
    word = word.rstrip(".!?\u2026'\"\u2019\u201d)]").lstrip("([\"'\u2018\u201c").lower()
    return len(word) == 1 and word.isalpha() or word in _ABBREVIATIONS


def _spans(text: str):
    """``(start, end)`` of each sentence of ``text`` before CJK splitting and stripping (paragraphs,
    then the boundaries within each); at least one."""
    at = 0
    for stop, after in [*((m.start(), m.end()) for m in _PARAGRAPH.finditer(text)), (len(text), len(text))]:
        start = at
        for match in _BOUNDARY.finditer(text, at, stop):
            if match.group(1) == "." and _abbreviation(text[start : match.start(1) + 1].rsplit(None, 1)[-1]):
                continue
            yield start, match.end(2)
            start = match.end()
        yield start, stop
        at = after


def split_sentences(text: str) -> list[str]:
    """Splits ``text`` into sentences (see the module docstring); whitespace-only pieces are dropped.

    >>> split_sentences("Dr. Who arrived, e.g. at 5 p.m. today. Then he left!  Why?\\n\\nNew 你好。再见")
    ['Dr. Who arrived, e.g. at 5 p.m. today.', 'Then he left!', 'Why?', 'New 你好。', '再见']
    """
    sentences = [text[start:end] for start, end in _spans(text)]
    if any(stop in text for stop in _CJK_STOPS):
        sentences = [piece for sentence in sentences for piece in _split_cjk(sentence)]
    return [stripped for sentence in sentences if (stripped := sentence.strip())]


# Classes of the code points up to U+3001 (none above U+3000 is whitespace; a test checks): bit 1
# ``str.isspace``, 2 a terminator, 4 a closer, 8 what may start a sentence (:data:`_BOUNDARY`'s classes),
# 16 what :func:`_abbreviation` strips from a word's start.
_CLASSES = np.array([chr(c).isspace() for c in range(0x3002)], np.uint8)
for _bit, _chars in ((2, ".!?\u2026"), (4, "'\"\u2019\u201d)]"), (8, "[(\u2018\u201c'\"" + "".join(map(chr, [
        *range(65, 91), *range(48, 58), *range(0xC0, 0x250)]))), (16, "([\"'\u2018\u201c")):
    _CLASSES[[ord(c) for c in _chars]] |= _bit


def sentence_words(texts: Sequence[str]) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """Each text's words and how many fall in each of its sentences, for a batch: ``(words, sizes
    int64[S], per_text int64[len(texts)])``; ``words[k]`` is ``[w for s in split_sentences(texts[k])
    for w in split_words(s)]``, ``sizes`` the word counts of the non-empty sentences of all texts in
    order, ``per_text`` how many of them each text has.

    Outside CJK text every sentence ends where whitespace starts, so the batch is split into words once
    and :data:`_BOUNDARY` is found from the words' ends in NumPy: a boundary follows a word that ends
    in terminators and closers when the next word starts a sentence (a single full stop: unless the
    word is an abbreviation); paragraph breaks are boundaries too.

    >>> words, sizes, per_text = sentence_words(["One two. Three!", "", "Four\\n\\nfive e.g. Six"])
    >>> words, sizes.tolist(), per_text.tolist()
    ([['One', 'two.', 'Three!'], [], ['Four', 'five', 'e.g.', 'Six']], [2, 1, 1, 3], [2, 0, 2])
    """
    cjk = {k: [s for s in map(str.split, split_sentences(text)) if s]  # a sentence may end inside a word
           for k, text in enumerate(texts) if any(stop in text for stop in _CJK_STOPS)}
    joined = "\n\n".join("" if k in cjk else text for k, text in enumerate(texts))  # a paragraph break between
    points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
    kind = _CLASSES[np.minimum(points, len(_CLASSES) - 1)]
    space = np.append(kind & 1 == 1, True)
    starts = np.flatnonzero(~space[:-1] & np.concatenate([[True], space[:-2]]))
    ends = np.flatnonzero(~space[:-1] & space[1:])  # the last character of each word
    tail = ends.copy()  # the last terminator of each word that ends in terminators and closers
    back = np.flatnonzero(kind[tail] & 4 == 4)
    while len(back):  # step back over the closers
        tail[back] -= 1
        back = back[(tail[back] >= 0) & (kind[tail[back]] & 4 == 4)]
    following = np.append(kind[starts[1:]], 0)  # the class of the next word's first character
    candidate = np.flatnonzero((tail >= 0) & (kind[tail] & 2 == 2) & (following & 8 == 8))
    tail = tail[candidate]
    single = (points[tail] == 46) & ((kind[np.maximum(tail - 1, 0)] & 2 == 0) | (tail == 0))
    word_at = starts[candidate]  # a word with nothing to strip and more letters than any abbreviation is none:
    long = (tail - word_at > _LONGEST) & (kind[tail - 1] & 6 == 0) & (kind[word_at] & 16 == 0)
    word_at, tails = word_at.tolist(), tail.tolist()
    check = np.flatnonzero(single & ~long).tolist()
    candidate[[k for k in check if _abbreviation(joined[word_at[k] : tails[k] + 1])]] = -1
    cuts = np.concatenate([ends[candidate[candidate >= 0]] + 1, [m.start() for m in _PARAGRAPH.finditer(joined)],
                           [len(joined)]])
    cuts.sort()
    first = np.searchsorted(starts, cuts)  # the first word after each cut
    counts = np.diff(first, prepend=0)
    kept = counts > 0
    sizes = counts[kept]
    text_at = np.cumsum([0, *(len(t) + 2 if k not in cjk else 2 for k, t in enumerate(texts[:-1]))])
    owner = np.searchsorted(text_at, starts[first[kept] - counts[kept]], "right") - 1
    per_text = np.bincount(owner, minlength=len(texts)).astype(np.int64)
    flat = joined.split()
    word_at = np.cumsum(np.append(0, np.bincount(owner, sizes, len(texts)).astype(np.int64))).tolist()
    words = [flat[a:b] for a, b in zip(word_at, word_at[1:])]
    if cjk:
        parts = np.split(sizes, np.cumsum(per_text)[:-1])
        for k, sentences in cjk.items():
            words[k] = list(itertools.chain.from_iterable(sentences))
            parts[k] = np.fromiter(map(len, sentences), np.int64, len(sentences))
            per_text[k] = len(sentences)
        sizes = np.concatenate(parts) if parts else sizes
    return words, sizes, per_text


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
