"""Test vocabularies built without downloads: a byte-level BPE trained here, a SentencePiece-style set."""

from __future__ import annotations

import functools
import json

from jaxsample.structured import Vocabulary

JSON_SNIPPETS = [
    {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry"]},
    {"id": 12, "price": 9.99, "in_stock": True, "dims": {"w": 1.5, "h": 20}, "note": None},
    {"city": "Zürich", "temp": -3, "items": [1, 2, 3], "date": "2024-05-17", "ok": False},
    {"function": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}},
]


@functools.cache
def bpe_tokenizer(vocab_size: int = 1200):
    """Byte-level BPE trained on ``pydoc_data.topics`` plus JSON snippets (pretty and compact)."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = [topics[k] for k in sorted(topics)][:120]
    for s in JSON_SNIPPETS:
        text += [json.dumps(s), json.dumps(s, indent=2), json.dumps(s, separators=(",", ":"))] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    return tok


@functools.cache
def bpe_vocab(size: int | None = None) -> Vocabulary:
    """The BPE as a Vocabulary: EOS ``<|endoftext|>`` (0) and stop ``<|im_end|>`` (2); optional padding."""
    return Vocabulary.from_tokenizer(bpe_tokenizer(), eos_ids=[0, 2], size=size)


@functools.cache
def sentencepiece_pieces() -> tuple[str, ...]:
    """``<unk> <s> </s>``, the 256 ``<0xNN>`` byte pieces, then ``▁``-marked words and fragments."""
    tok = bpe_tokenizer()
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    voc = bpe_vocab()
    seen = set()
    for b in voc.token_bytes:
        if not b:
            continue
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        p = s.replace(" ", "\u2581")
        if p not in seen and len(s) > 1:
            seen.add(p)
            pieces.append(p)
    del tok
    return tuple(pieces)


@functools.cache
def sentencepiece_vocab() -> Vocabulary:
    return Vocabulary.from_pieces(sentencepiece_pieces(), kind="sentencepiece", special_ids=[0, 1, 2], eos_ids=[2])
