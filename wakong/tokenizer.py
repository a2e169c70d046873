"""HF ``tokenizers`` for the infilling pipeline: load a ``tokenizer.json`` or train a byte-level BPE.

:class:`TextTokenizer` wraps a ``tokenizers.Tokenizer`` with what the pipeline needs: the BART special
ids, the file's sha256 (recorded in the manifest) and :meth:`TextTokenizer.encode_words`, which tokenises
a record once and groups the tokens by whitespace word (by character offsets). Record text is encoded by
a copy of the tokenizer *without* its special added tokens, so a literal ``</s>`` or ``<mask>`` in the
data becomes ordinary tokens and can never inject an EOS or a mask. Nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Iterable, Sequence

import numpy as np

from wakong import records

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


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` plus special ids, sha256 and word-grouped encoding. Picklable."""

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
        self._body = Tokenizer.from_str(json.dumps(spec))

    def __reduce__(self):
        return (TextTokenizer, (self.json_text, self.specials), {"origin": self.origin, "training": self.training})

    def __setstate__(self, state):
        self.origin, self.training = state["origin"], state.get("training")

    def encode_words(self, words: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of ``' '.join(words)`` grouped by word (a word without tokens gives ``()``).

        A token is attributed to the word holding its last character, so leading-space markers (``Ġ``,
        ``▁``) stay with their word.
        """
        if not words:
            return []
        lengths = np.fromiter((len(w) + 1 for w in words), np.int64, len(words))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        enc = self._body.encode(" ".join(words), add_special_tokens=False)
        if not enc.ids:
            return [()] * len(words)
        offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        owner = np.searchsorted(starts, np.maximum(offsets[:, 0], offsets[:, 1] - 1), side="right") - 1
        bounds = np.searchsorted(owner, np.arange(len(words) + 1), side="left")
        ids = enc.ids
        return [tuple(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with special tokens shown."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the tokenizer JSON atomically (the sha256 is of exactly these bytes)."""
        tmp = os.fspath(path) + records.temp_suffix()  # unique across hosts
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.json_text)
        os.replace(tmp, path)


def load_tokenizer(path: str | os.PathLike, specials: SpecialTokens = SpecialTokens()) -> TextTokenizer:
    """Loads a ``tokenizer.json`` (or a directory holding one) with clear errors.

    Raises:
      FileNotFoundError: the file does not exist.
      TokenizerError: the file is not a tokenizers JSON file, or lacks a required special token.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tokenizer file {path} does not exist (train one with `wakong train-tokenizer`)"
        )
    with open(path, "rb") as f:
        raw = f.read()
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
