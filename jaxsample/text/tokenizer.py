"""One tokenizer interface for the text layer, over the three kinds users bring.

:func:`as_tokenizer` accepts a ``tokenizers.Tokenizer``, a ``transformers`` fast tokenizer
(``PreTrainedTokenizerFast``), a ``sentencepiece.SentencePieceProcessor``, or a path to a
``tokenizer.json`` / SentencePiece ``.model`` file, checks it, and returns a :class:`TextTokenizer`:

* ``encode(text) -> list[int]`` (the tokenizer's own special-token rules: BOS where it adds one);
* ``token_bytes``: the bytes every logits column appends to the output (``None`` for special
  tokens, which decode to nothing, as with ``skip_special_tokens=True``). Generated text is the
  concatenation of these bytes decoded as UTF-8: what vLLM's incremental detokenizer produces for
  a continuation (SentencePiece's ``▁`` is a space, also on the first generated token; byte-level
  and ``<0xNN>`` byte-fallback pieces are raw bytes). ``clean_up_tokenization_spaces`` is not applied;
* ``eos_ids``: the ids that end generation.

Tokenizers whose pieces do not spell their text (WordPiece ``##``, ``BPEDecoder`` suffixes, CTC)
are refused with a ``ValueError``, as is a tokenizer without an EOS token unless ``eos_ids`` is
given (``eos_ids=()`` generates without one).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, NamedTuple, Sequence

from jaxsample.structured.vocab import hf_vocab, piece_bytes

_UNSUPPORTED_DECODERS = ("WordPiece", "BPEDecoder", "CTC")


class TextTokenizer(NamedTuple):
    """What the text layer needs from a tokenizer (see the module docstring)."""

    encode: Callable[[str], list[int]]
    token_bytes: tuple[bytes | None, ...]  # len == V (the logits width)
    eos_ids: tuple[int, ...]
    source: str  # what it was built from, for messages

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The concatenated bytes of ``ids`` (ids outside the vocabulary and special tokens add nothing)."""
        tb, v = self.token_bytes, len(self.token_bytes)
        return b"".join(tb[i] or b"" for i in ids if 0 <= i < v)

    def decode(self, ids: Sequence[int]) -> str:
        """``decode_bytes`` as text (invalid UTF-8 becomes U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _eos(eos_ids, found: int | None, source: str) -> tuple[int, ...]:
    if eos_ids is None:
        if found is None or found < 0:
            raise ValueError(
                f"the tokenizer ({source}) has no EOS token: pass eos_ids=[...] (its end-of-sequence ids), "
                "or eos_ids=() to generate without one"
            )
        return (int(found),)
    ids = (int(eos_ids),) if isinstance(eos_ids, int) else tuple(int(i) for i in eos_ids)
    if any(i < 0 for i in ids):
        raise ValueError(f"eos_ids must be token ids >= 0, got {list(ids)}")
    return ids


def _sized(token_bytes: list, size: int | None, eos: tuple[int, ...], source: str) -> tuple:
    v = len(token_bytes) if size is None else int(size)
    if v < len(token_bytes):
        raise ValueError(f"vocab_size={v} is smaller than the tokenizer ({source}: {len(token_bytes)} ids)")
    bad = [i for i in eos if i >= v]
    if bad:
        raise ValueError(f"eos_ids {bad} are outside the vocabulary [0, {v})")
    out = list(token_bytes) + [None] * (v - len(token_bytes))
    for i in eos:
        out[i] = None
    return tuple(out)


def _from_hf(tok: Any, eos_ids, size, add_special_tokens: bool) -> TextTokenizer:
    backend = getattr(tok, "backend_tokenizer", tok)
    source = type(tok).__name__
    hf = hf_vocab(backend)
    decoder_types = json.dumps(hf.spec.get("decoder"))
    for name in _UNSUPPORTED_DECODERS:
        if f'"type": "{name}"' in decoder_types:
            raise ValueError(
                f"tokenizer ({source}) uses a {name} decoder, whose pieces do not spell their text; "
                "the text layer supports byte-level BPE, SentencePiece/Metaspace and plain-text vocabularies"
            )
    tb: list[bytes | None] = []
    for i, p in enumerate(hf.pieces):
        if p is None or i in hf.special:
            tb.append(None)
        elif i in hf.added:
            tb.append(hf.added[i].encode("utf-8"))
        else:
            tb.append(piece_bytes(p, hf.kind))
    eos = _eos(eos_ids, getattr(tok, "eos_token_id", None), source)
    if backend is tok:  # tokenizers.Tokenizer

        def encode(text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)

    else:

        def encode(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    return TextTokenizer(encode, _sized(tb, size, eos, source), eos, source)


def _from_sentencepiece(sp: Any, eos_ids, size, add_special_tokens: bool) -> TextTokenizer:
    source = "SentencePieceProcessor"
    tb: list[bytes | None] = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            tb.append(None)  # <unk> decodes to " ⁇ " in SentencePiece; here it adds no text
        else:
            tb.append(piece_bytes(sp.id_to_piece(i), "sentencepiece"))
    eos = _eos(eos_ids, sp.eos_id(), source)
    add_bos = add_special_tokens and sp.bos_id() >= 0

    def encode(text: str) -> list[int]:
        return list(sp.encode(text, add_bos=add_bos))

    return TextTokenizer(encode, _sized(tb, size, eos, source), eos, source)


def as_tokenizer(
    tokenizer: Any,
    *,
    eos_ids: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    add_special_tokens: bool = True,
) -> TextTokenizer:
    """Adapts and checks a tokenizer (see the module docstring).

    Args:
      tokenizer: a :class:`TextTokenizer`, ``tokenizers.Tokenizer``, ``transformers`` fast
        tokenizer, ``sentencepiece.SentencePieceProcessor``, or a path to ``tokenizer.json`` / ``.model``.
      eos_ids: end-of-sequence ids; default: the tokenizer's EOS token (``ValueError`` without one).
      vocab_size: the model's logits width when it exceeds the tokenizer's (padded embeddings).
      add_special_tokens: let the tokenizer add its special tokens (BOS) when encoding.

    Raises:
      ValueError: an unsupported object or decoder, a missing EOS, ``vocab_size`` too small.
    """
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer file {path!r} does not exist")
        if path.endswith(".model"):
            import sentencepiece

            tokenizer = sentencepiece.SentencePieceProcessor(model_file=path)
        elif path.endswith(".json"):
            import tokenizers

            tokenizer = tokenizers.Tokenizer.from_file(path)
        else:
            raise ValueError(f"tokenizer path {path!r}: expected a SentencePiece .model or a tokenizer.json")
    cls = type(tokenizer)
    mod = cls.__module__.split(".")[0]
    if mod == "sentencepiece":
        return _from_sentencepiece(tokenizer, eos_ids, vocab_size, add_special_tokens)
    if mod == "tokenizers" or hasattr(tokenizer, "backend_tokenizer"):
        return _from_hf(tokenizer, eos_ids, vocab_size, add_special_tokens)
    if mod == "transformers":
        raise ValueError(
            f"tokenizer {cls.__name__} is a slow transformers tokenizer: load the fast one (use_fast=True)"
        )
    raise ValueError(
        f"tokenizer must be a tokenizers.Tokenizer, a transformers fast tokenizer, a "
        f"sentencepiece.SentencePieceProcessor or a path to one, got {cls.__module__}.{cls.__name__}"
    )
