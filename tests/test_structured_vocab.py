"""Token -> bytes for byte-level BPE, SentencePiece and raw vocabularies; padding; EOS validation."""

import json

import pytest

from jaxsample.structured import Vocabulary
from jaxsample.structured.vocab import detect_kind, piece_bytes
from tests._structured_vocab import JSON_SNIPPETS, bpe_tokenizer, bpe_vocab, sentencepiece_vocab


def test_byte_level_bpe_bytes_concatenate_to_the_text():
    tok, voc = bpe_tokenizer(), bpe_vocab()
    for text in ["def f(x):\n    return x  # ok", json.dumps(JSON_SNIPPETS[2], ensure_ascii=False), "naïve 😀 \t\r\n"]:
        ids = tok.encode(text).ids
        assert b"".join(voc.token_bytes[i] for i in ids) == text.encode("utf-8")


def test_byte_level_table_and_specials():
    assert piece_bytes("\u0120hello", "byte_level") == b" hello"
    assert piece_bytes("\u010a", "byte_level") == b"\n"
    assert piece_bytes("\u00c3\u00a9", "byte_level") == "é".encode()
    with pytest.raises(ValueError, match="byte-level"):
        piece_bytes("\u4e00", "byte_level")
    voc = bpe_vocab()
    assert voc.token_bytes[:3] == (None, None, None) and voc.eos_ids == (0, 2)
    assert detect_kind(json.loads(bpe_tokenizer().to_str())) == "byte_level"


def test_padded_logits_width():
    voc = bpe_vocab(size=1280)
    assert voc.size == 1280 and all(b is None for b in voc.token_bytes[1200:])
    with pytest.raises(ValueError, match="smaller"):
        Vocabulary.from_tokenizer(bpe_tokenizer(), eos_ids=[0], size=100)


def test_sentencepiece_pieces():
    voc = Vocabulary.from_pieces(
        ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "▁the", "▁", "▁▁", "é", "<0x0a>x"],
        kind="sentencepiece",
        special_ids=[0, 1, 2],
        eos_ids=[2],
        size=12,
    )
    assert voc.token_bytes == (None, None, None, b"\n", b"\xc3", b" the", b" ", b"  ", "é".encode(), b"<0x0a>x", None, None)
    sp = sentencepiece_vocab()
    assert sp.token_bytes[3 + 0x41] == b"A" and sp.eos_ids == (2,)


def test_raw_and_validation_errors():
    assert piece_bytes("a b", "raw") == b"a b"
    with pytest.raises(ValueError, match="kind"):
        Vocabulary.from_pieces(["a"], kind="wordpiece", eos_ids=[0])
    with pytest.raises(ValueError, match="eos_ids"):
        Vocabulary.from_pieces(["a"], kind="raw")
    with pytest.raises(ValueError, match="outside"):
        Vocabulary.from_pieces(["a"], kind="raw", eos_ids=[3])
    voc = Vocabulary.from_pieces(["", "a"], kind="raw", eos_ids=[1])
    assert voc.token_bytes == (None, None)  # empty pieces and EOS ids never carry text


def test_sentencepiece_tokenizer_json_is_detected():
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.BPE(vocab={"<unk>": 0, "</s>": 1, "<0x41>": 2, "\u2581a": 3}, merges=[], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(["<unk>", "</s>"])
    voc = Vocabulary.from_tokenizer(tok, eos_ids=[1])
    assert voc.token_bytes == (None, None, b"A", b" a")
