"""Tokenizers for the infilling pipeline: HF ``tokenizer.json`` (load, or train a byte-level BPE) and
SentencePiece ``.model`` files (:mod:`wakong.spm`).

:class:`TextTokenizer` wraps a ``tokenizers.Tokenizer`` with what the pipeline needs: the BART special
ids, the file's sha256 (recorded in the manifest) and :meth:`TextTokenizer.encode_records`, which
tokenises a batch of records (each a list of whitespace words) and groups the tokens by word. Record
text is encoded by a copy of the tokenizer *without* its special added tokens (and without truncation
or padding), so a literal ``</s>`` or ``<mask>`` in the data becomes ordinary tokens and can never
inject an EOS or a mask. Nothing is ever downloaded.

Grouping rule: the tokens of ``' '.join(words)`` are grouped by character offsets, a token belonging
to the word that holds its last character (so a leading-space marker merged into a token, ``Ġ`` or
``▁``, stays with its word; a lone space token, rare, goes with the word before it).

Speed: when the tokenizer encodes every whitespace word on its own -- its pre-tokenizer splits at
spaces and nothing before it looks across one (:func:`word_local`; true for byte-level BPE such as
the trained one, WordPiece/BERT and Metaspace/SentencePiece-style files) -- words are encoded once
and cached (:class:`WordCache`): the first word of a text, and any later word after its space, each
map to the same ids and grouping as inside the whole text (the tests compare both ways on messy
text). Other tokenizers encode whole records with ``encode_batch``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
from typing import Iterable, Sequence

import numpy as np

from wakong import records
from wakong.records import _starts

#: BART's special tokens, in the id order a trained tokenizer gives them.
BART_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Names of the special tokens (BART's by default; BART starts decoding with ``</s>``)."""

    bos: str = "<s>"
    pad: str = "<pad>"
    eos: str = "</s>"
    unk: str = "<unk>"
    mask: str = "<mask>"
    decoder_start: str = "</s>"


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used (corrupt, or missing a required special token)."""


#: Normalizers and pre-tokenizers that never look across a space (see :func:`word_local`).
_LOCAL_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "BertNormalizer"})
_LOCAL_PRE_TOKENIZERS = frozenset({"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Metaspace", "ByteLevel",
                                   "Punctuation", "Digits"})


def _splits_at_spaces(pre: dict) -> bool:
    kind = pre.get("type")
    if kind == "ByteLevel":
        return bool(pre.get("use_regex", True))
    if kind == "Metaspace":
        return bool(pre.get("split", True))
    return kind in ("Whitespace", "WhitespaceSplit", "BertPreTokenizer")


def word_local(spec: dict) -> bool:
    """Whether a tokenizer (its JSON ``spec``) encodes each whitespace word of a text independently.

    True when the normalizer is absent or per character (Unicode normal forms, lowercasing, accents,
    BERT's), the pre-tokenizer splits at spaces (byte-level regex, whitespace, BERT, Metaspace with
    ``split``; in a ``Sequence`` with only such steps, digits and punctuation) and no added token
    holds whitespace or swallows the space after it (``rstrip``). Then the tokens of a word inside a
    text are those of the word alone (first word) or of ``' ' + word`` (later words).
    """
    norm = spec.get("normalizer")
    norms = [] if norm is None else norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
    pre = spec.get("pre_tokenizer") or {}
    pres = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    added = spec.get("added_tokens", [])
    return (
        all(n.get("type") in _LOCAL_NORMALIZERS for n in norms)
        and all(p.get("type") in _LOCAL_PRE_TOKENIZERS for p in pres)
        and any(map(_splits_at_spaces, pres))
        and not any(t.get("rstrip") or any(c.isspace() for c in t["content"]) for t in added)
    )


class WordCache:
    """Token ids of whitespace words, encoded once (bounded memory; never changes results).

    ``encode_first(words) -> [ids]`` encodes words that start a text; ``encode_next(words) -> [(ids,
    lead)]`` words that follow a space, ``lead`` being how many of the leading ids belong to the word
    before (see the grouping rule in the module docstring). Every encoding is an *entry* of flat
    tables (its ids in ``flat``, where they start, how many, its lead); ``first`` and ``next`` map a
    word to its entry, so a batch is one dictionary pass over its words and NumPy gathers.
    """

    #: Entries per table before it is cleared (about 200 bytes each: some 100 MB per process at most;
    #: the most frequent words, which carry nearly all tokens, come back at once).
    LIMIT = 1 << 18

    def __init__(self, encode_first, encode_next):
        self._encode_first, self._encode_next = encode_first, encode_next
        self._clear()

    def _clear(self) -> None:
        self.first: dict[str, int] = {}  # word -> entry, as a text's first word
        self.next: dict[str, int] = {}  # word -> entry, after a space
        self.flat = np.zeros(0, np.int32)  # the ids of every entry
        self.at, self.size, self.lead = (np.zeros(0, np.int64) for _ in range(3))  # per entry

    def _add(self, table: dict, words: list[str], encoded: list[tuple[Sequence[int], int]]) -> None:
        ids = [np.asarray(i, np.int32) for i, _ in encoded]
        size = np.fromiter(map(len, ids), np.int64, len(ids))
        table.update(zip(words, range(len(self.size), len(self.size) + len(words))))
        self.at = np.concatenate([self.at, len(self.flat) + _starts(size)])
        self.flat = np.concatenate([self.flat, *ids])
        self.size = np.concatenate([self.size, size])
        self.lead = np.concatenate([self.lead, np.fromiter((lead for _, lead in encoded), np.int64, len(encoded))])

    def encode(self, records: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int32[T], word_lengths int32[W])`` of every word of every record, in order."""
        words = list(itertools.chain.from_iterable(records))
        if len(self.next) > self.LIMIT or len(self.first) > self.LIMIT:
            self._clear()
        try:
            entry = np.fromiter(map(self.next.__getitem__, words), np.int64, len(words))
        except KeyError:
            missing = [w for w in dict.fromkeys(words) if w not in self.next]
            self._add(self.next, missing, self._encode_next(missing))
            entry = np.fromiter(map(self.next.__getitem__, words), np.int64, len(words))
        counts = np.fromiter(map(len, records), np.int64, len(records))
        firsts = [r[0] for r in records if len(r)]
        missing = [w for w in dict.fromkeys(firsts) if w not in self.first]
        if missing:
            self._add(self.first, missing, [(ids, 0) for ids in self._encode_first(missing)])
        entry[_starts(counts)[counts > 0]] = np.fromiter(map(self.first.__getitem__, firsts), np.int64,
                                                                 len(firsts))
        size, lead = self.size[entry], self.lead[entry]  # a first word has no lead
        ids = self.flat[np.repeat(self.at[entry] - _starts(size), size) + np.arange(int(size.sum()))]
        lengths = size - lead
        lengths[:-1] += lead[1:]
        return ids, lengths.astype(np.int32)


def group_by_words(ids: Sequence[int], offsets: np.ndarray, words: Sequence[str]) -> np.ndarray:
    """``int32[len(words)]``: tokens per word of ``' '.join(words)`` from the tokens' character offsets."""
    if not len(ids):
        return np.zeros(len(words), np.int32)
    lengths = np.fromiter((len(w) + 1 for w in words), np.int64, len(words))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owner = np.searchsorted(starts, np.maximum(offsets[:, 0], offsets[:, 1] - 1), side="right") - 1
    return np.diff(np.searchsorted(owner, np.arange(len(words) + 1), side="left")).astype(np.int32)


def split_groups(ids: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    """Per-word tuples from :meth:`TextTokenizer.encode_records`' flat arrays."""
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    flat = ids.tolist()
    return [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` plus special ids, sha256 and word-grouped encoding. Picklable."""

    #: Name of the tokenizer file in a dataset directory.
    file_name = "tokenizer.json"

    def __init__(
        self, json_text: str, specials: SpecialTokens = SpecialTokens(), *, origin: str = "<memory>"
    ):
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_str(json_text)
            spec = json.loads(json_text)
        except Exception as err:  # tokenizers raises a bare Exception for malformed files
            raise TokenizerError(f"{origin} is not a valid tokenizers JSON file: {err}") from None
        self.json_text, self.specials, self.origin = json_text, specials, origin
        self.training: dict | None = None  # training counts of a trained tokenizer (wakong.pipeline)
        self.sha256 = hashlib.sha256(json_text.encode()).hexdigest()
        ids = {}
        for role, token in dataclasses.asdict(specials).items():
            ids[role] = self.tokenizer.token_to_id(token)
            if ids[role] is None:
                raise TokenizerError(
                    f"{origin} has no token {token!r} (needed as {role}); give a tokenizer with the BART "
                    f"special tokens {' '.join(BART_SPECIAL_TOKENS)} or set tokenizer.special.{role}"
                )
        self.bos_id, self.pad_id, self.eos_id = ids["bos"], ids["pad"], ids["eos"]
        self.unk_id, self.mask_id, self.decoder_start_id = ids["unk"], ids["mask"], ids["decoder_start"]
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")} | set(ids.values())
        #: Ids random-token replacement draws from (every id that is not special).
        self.random_ids = np.setdiff1d(np.arange(self.vocab_size), np.fromiter(special, int)).astype(np.int32)
        spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if not t.get("special")]
        spec["truncation"] = spec["padding"] = None
        self._body = Tokenizer.from_str(json.dumps(spec))
        self._cache = WordCache(self._encode_first, self._encode_next) if word_local(spec) else None

    def __reduce__(self):
        return (TextTokenizer, (self.json_text, self.specials), {"origin": self.origin, "training": self.training})

    def __setstate__(self, state):
        self.origin, self.training = state["origin"], state.get("training")

    def _encode_first(self, words: list[str]) -> list[tuple[int, ...]]:
        return [tuple(e.ids) for e in self._body.encode_batch(words, add_special_tokens=False)]

    def _encode_next(self, words: list[str]) -> list[tuple[tuple[int, ...], int]]:
        out = []
        for enc in self._body.encode_batch([" " + w for w in words], add_special_tokens=False):
            offsets, lead = enc.offsets, 0  # lead: the leading tokens on the space
            while lead < len(offsets) and max(offsets[lead][0], offsets[lead][1] - 1) < 1:
                lead += 1
            out.append((enc.ids, lead))
        return out

    def encode_records(self, records: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of ``' '.join(words)`` for each record (a list of whitespace words), grouped by word.

        Returns ``(ids int32[T], word_lengths int32[W])``: the ids of all records in order and the
        number of ids of each word (``0`` for a word without tokens), ``W`` the number of words.
        """
        if self._cache is not None:
            return self._cache.encode(records)
        texts = [" ".join(words) for words in records]
        encodings = self._body.encode_batch(texts, add_special_tokens=False) if texts else []
        ids, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
        for words, enc in zip(records, encodings):
            ids.append(np.asarray(enc.ids, np.int32))
            lengths.append(group_by_words(enc.ids, np.asarray(enc.offsets, np.int64).reshape(-1, 2), words))
        return np.concatenate(ids), np.concatenate(lengths)

    def encode_words(self, words: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of ``' '.join(words)`` grouped by word (a word without tokens gives ``()``)."""
        return split_groups(*self.encode_records([list(words)])) if words else []

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with special tokens shown."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the tokenizer JSON atomically (the sha256 is of exactly these bytes)."""
        tmp = os.fspath(path) + records.temp_suffix()  # unique across hosts
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.json_text)
        os.replace(tmp, path)


def load_tokenizer(path: str | os.PathLike, specials: SpecialTokens = SpecialTokens()):
    """Loads a ``tokenizer.json``, a SentencePiece ``.model`` (:class:`wakong.spm.SentencePieceTokenizer`)
    or a directory holding either, with clear errors.

    Raises:
      FileNotFoundError: the file does not exist.
      TokenizerError: the file is not a tokenizer of its kind, or lacks a required special token.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        model = os.path.join(path, "tokenizer.model")
        path = model if os.path.isfile(model) and not os.path.isfile(os.path.join(path, "tokenizer.json")) else (
            os.path.join(path, "tokenizer.json"))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tokenizer file {path} does not exist (train one with `wakong train-tokenizer`)"
        )
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".model"):
        from wakong.spm import SentencePieceTokenizer

        return SentencePieceTokenizer(raw, specials, origin=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerError(f"{path} is not a valid tokenizers JSON file: not UTF-8 ({err})") from None
    return TextTokenizer(text, specials, origin=path)


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 8192,
    min_frequency: int = 2,
    specials: SpecialTokens = SpecialTokens(),
    show_progress: bool = False,
) -> TextTokenizer:
    """Trains a byte-level BPE (GPT-2/BART style) on ``texts``; special tokens get ids ``0..4``.

    The mask token strips the space before it (as BART's does); a template post-processor adds
    ``<s> ... </s>`` for users calling the tokenizer directly (the pipeline adds them itself).
    Training is deterministic for a given text order. ``show_progress``: the trainer's own progress
    bars (on a terminal).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 256 + 5:
        raise ValueError(f"vocab_size must be at least 261 (256 bytes + 5 special tokens), got {vocab_size}")
    names = [specials.bos, specials.pad, specials.eos, specials.unk, specials.mask]
    if len(set(names)) != len(names):
        raise ValueError(f"special tokens must be distinct, got {names}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, lstrip=t == specials.mask) for t in names]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{specials.bos} $A {specials.eos}",
        pair=f"{specials.bos} $A {specials.eos} {specials.eos} $B {specials.eos}",
        special_tokens=[(t, tok.token_to_id(t)) for t in (specials.bos, specials.eos)],
    )
    return TextTokenizer(tok.to_str(), specials, origin="<trained>")
