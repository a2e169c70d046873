"""Token id -> bytes for any tokenizer, sized to the model's logits width.

Grammars are compiled over bytes, so every token needs the exact bytes it appends to the output:

* **byte-level BPE** (GPT-2, Llama-3, Qwen, ...): piece characters map back to bytes through the
  GPT-2 ``bytes_to_unicode`` table (``Ġ`` -> space, ``Ċ`` -> newline, ...);
* **SentencePiece** (Llama-2, Mistral, Gemma, T5): ``▁`` is a space and ``<0xNN>`` byte-fallback
  pieces are the byte ``NN``;
* **raw**: pieces are plain UTF-8 text.

Special tokens (BOS, PAD, chat markers) and the padding columns of a logits width larger than the
tokenizer (``size``) carry ``None``: a grammar never allows them. EOS/stop ids (several allowed) are
kept apart; a grammar allows them exactly in accepting states.

>>> v = Vocabulary.from_pieces(["<s>", "▁hi", "<0x0A>", "!"], kind="sentencepiece", special_ids=[0], eos_ids=[0], size=6)
>>> v.token_bytes
(None, b' hi', b'\\n', b'!', None, None)
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, NamedTuple, Sequence

from jaxsample._byte_level import unicode_to_byte

_SP_SPACE = "\u2581"
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
KINDS = ("byte_level", "sentencepiece", "raw")


def piece_bytes(piece: str, kind: str) -> bytes:
    """Bytes a tokenizer piece stands for.

    Raises:
      ValueError: for a byte-level piece with characters outside the GPT-2 byte alphabet.
    """
    if kind == "byte_level":
        table = unicode_to_byte()
        try:
            return bytes(table[c] for c in piece)
        except KeyError as e:
            raise ValueError(f"piece {piece!r} is not byte-level BPE (character {e.args[0]!r})") from None
    if kind == "sentencepiece":
        m = _SP_BYTE.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace(_SP_SPACE, " ").encode("utf-8")
    if kind == "raw":
        return piece.encode("utf-8")
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


class Vocabulary(NamedTuple):
    """Bytes of every logits column.

    Attributes:
      token_bytes: ``len == size`` (the logits width ``V``); ``None`` for special tokens, padding
        columns and tokens with no bytes (never allowed by a grammar).
      eos_ids: ids that end generation; allowed exactly in accepting grammar states.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_ids: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_pieces(
        cls,
        pieces: Sequence[str],
        *,
        kind: str,
        special_ids: Iterable[int] = (),
        eos_ids: Iterable[int] = (),
        size: int | None = None,
    ) -> "Vocabulary":
        """Builds from the piece strings of ids ``0..len(pieces)-1``.

        Args:
          pieces: piece text per id (``None`` entries are allowed for unused ids).
          kind: ``"byte_level"``, ``"sentencepiece"`` or ``"raw"``.
          special_ids: ids that are never text (mapped to ``None``).
          eos_ids: ids that end generation (may also be special ids).
          size: the logits width ``V >= len(pieces)``; extra columns are padding.

        Raises:
          ValueError: on an unknown kind, ``size < len(pieces)``, an EOS id outside ``[0, size)``,
            or no EOS id at all.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        size = len(pieces) if size is None else int(size)
        if size < len(pieces):
            raise ValueError(f"size={size} is smaller than the tokenizer ({len(pieces)} pieces)")
        special = set(int(i) for i in special_ids)
        eos = tuple(sorted(set(int(i) for i in eos_ids)))
        if not eos:
            raise ValueError("eos_ids must name at least one end-of-sequence token")
        bad = [i for i in eos if not 0 <= i < size]
        if bad:
            raise ValueError(f"eos_ids {bad} are outside the vocabulary [0, {size})")
        out: list[bytes | None] = [None] * size
        for i, p in enumerate(pieces):
            if p is None or i in special or i in eos:
                continue
            b = piece_bytes(p, kind)
            out[i] = b or None
        return cls(tuple(out), eos)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, eos_ids: Iterable[int] | None = None, size: int | None = None) -> "Vocabulary":
        """Builds from a HuggingFace ``tokenizers.Tokenizer`` (or a fast ``transformers`` tokenizer).

        The kind is detected from the tokenizer's decoder (``ByteLevel`` -> byte-level;
        ``Metaspace`` or ``ByteFallback``/``▁`` replacement -> SentencePiece; otherwise raw). Added
        tokens flagged ``special`` are special.

        Args:
          tokenizer: the tokenizer.
          eos_ids: end-of-sequence/stop ids; defaults to the tokenizer's ``eos_token_id`` when it has one.
          size: the model's logits width when it is larger than the tokenizer (padded vocabularies).
        """
        hf = hf_vocab(tokenizer)
        if eos_ids is None:
            eid = getattr(tokenizer, "eos_token_id", None)
            eos_ids = [] if eid is None else [eid]
        voc = cls.from_pieces(hf.pieces, kind=hf.kind, special_ids=hf.special, eos_ids=eos_ids, size=size)
        if hf.added:  # added (non-special) tokens are stored as plain text whatever the model kind
            tb = list(voc.token_bytes)
            for i, content in hf.added.items():
                if i not in voc.eos_ids:
                    tb[i] = content.encode("utf-8") or None
            voc = voc._replace(token_bytes=tuple(tb))
        return voc


class HFVocab(NamedTuple):
    """The ids of a HuggingFace tokenizer, as its ``tokenizer.json`` lists them."""

    spec: dict  # the parsed tokenizer.json
    kind: str  # one of KINDS (detect_kind)
    pieces: list  # [str | None] * (largest id + 1): each id's piece, None for ids without one
    special: set  # ids of the added tokens flagged special
    added: dict  # id -> text of the other added tokens (plain text, whatever the kind)


def hf_vocab(tokenizer: Any) -> HFVocab:
    """Reads a ``tokenizers.Tokenizer`` or a fast ``transformers`` tokenizer (its backend)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    spec = json.loads(backend.to_str())
    vocab = backend.get_vocab(with_added_tokens=True)
    pieces: list[str | None] = [None] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    added = spec.get("added_tokens", [])
    special = {t["id"] for t in added if t.get("special")}
    plain = {t["id"]: t["content"] for t in added if not t.get("special")}
    return HFVocab(spec, detect_kind(spec), pieces, special, plain)


def detect_kind(spec: dict) -> str:
    """Vocabulary kind from a ``tokenizer.json`` dict (see :meth:`Vocabulary.from_tokenizer`)."""

    def types(node) -> list[str]:
        if not node:
            return []
        found = [node.get("type", "")]
        for sub in node.get("decoders", []) or node.get("pretokenizers", []) or []:
            found += types(sub)
        if node.get("type") == "Replace" and node.get("pattern", {}).get("String") == _SP_SPACE:
            found.append("Metaspace")
        return found

    t = types(spec.get("decoder")) + types(spec.get("pre_tokenizer"))
    if "ByteLevel" in t:
        return "byte_level"
    if "Metaspace" in t or "ByteFallback" in t or (spec.get("model") or {}).get("byte_fallback"):
        return "sentencepiece"
    return "raw"
