"""``make_outcomes``, the build's per-record transform: grain's per-record seeds, independence from the
batch, the vectorised noiser equal to ``noise_example`` draw for draw, and word-cached tokenisation
equal to encoding whole texts for every kind of tokenizer it is used for."""

import dataclasses
import json
import random

import numpy as np
import pytest

from tests.test_pipeline import SMALL, corpus, tokenizer  # noqa: F401  (fixtures)
from wakong import examples
from wakong.config import load_config
from wakong.examples import make_examples, make_outcomes, record_seeds
from wakong.sources import TextSource
from wakong.tokenizer import TextTokenizer, word_local


def test_record_seeds_are_grains_random_map():
    import grain

    for seed in (0, 7, 2**62 + 3):
        indices = [0, 1, 5, 1000, 123456789]
        ds = grain.MapDataset.range(max(indices) + 1).random_map(lambda i, rng: int(rng.integers(2**63)), seed=seed)
        assert record_seeds(seed, indices).tolist() == [ds[i] for i in indices]


def _same(a, b) -> None:
    assert [(o.index, o.records, o.dropped, o.events, o.tokens, o.source_tokens, o.schemes) for o in a] == [
        (o.index, o.records, o.dropped, o.events, o.tokens, o.source_tokens, o.schemes) for o in b]


CONFIGS = {
    "article": ["examples.min_words=3"],
    "bart": ["examples.unit=document", "noise.unit=token", "noise.spans.budget_rate=0.4",
             "noise.spans.poisson_rate=3.0", "noise.permute_sentences=1.0", "noise.random_ratio=0.1"],
    "words_documents": ["examples.unit=document", "noise.permute_sentences=0.5", "noise.random_ratio=0.5",
                        "examples.max_source_len=24", "examples.max_target_len=40"],
    "tight_inserts": ["noise.unit=token", "noise.spans.budget_rate=0.5", "noise.spans.poisson_rate=0.3",
                      "examples.max_source_len=12", "examples.max_target_len=12", "examples.too_long=truncate"],
    "no_infill": ["noise.infill=false", "noise.permute_sentences=1.0", "examples.unit=document"],
    "drop_long": ["examples.too_long=drop", "examples.max_source_len=10", "examples.min_words=1"],
}


@pytest.fixture(scope="module")
def messy(tmp_path_factory, corpus):  # noqa: F811
    """The corpus paragraphs plus messy records (empty, bad bytes, a literal mask, long words, CJK)."""
    path = tmp_path_factory.mktemp("messy") / "m.txt"
    extra = [b"", b"  ", b"x", "Ünïcödé 你好。再见！ ok".encode(), b"bad \xff\xfe bytes. Here.",
             b"a literal <mask> and </s> here. " * 3, b"w" * 300 + b" tail words.", b"Dr. Who? Yes! No."]
    path.write_bytes(open(corpus, "rb").read() + b"\n\n" + b"\n\n".join(extra) + b"\n")
    return TextSource([path], "paragraph")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_outcomes_do_not_depend_on_the_batch(messy, tokenizer, name):  # noqa: F811
    config = load_config(overrides=SMALL + ["seed=3"] + CONFIGS[name])
    n = len(messy)
    whole = make_outcomes(messy, config, tokenizer, range(n))
    assert [o.index for o in whole] == list(range(n))
    assert any(o.records for o in whole) and any(o.dropped for o in whole)
    _same(whole, [o for i in range(n) for o in make_outcomes(messy, config, tokenizer, [i])])
    _same(whole[::-1], make_outcomes(messy, config, tokenizer, range(n - 1, -1, -1)))
    one = make_examples(5, messy[5], random.Random(int(record_seeds(3, [5])[0])), config, tokenizer)
    _same([whole[5]], [one])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vectorised_noiser_is_noise_example(messy, tokenizer, monkeypatch, name):  # noqa: F811
    """The draws, schemes and sources of the batch noiser are those of ``noise_example``, example by example."""
    config = load_config(overrides=SMALL + ["seed=11"] + CONFIGS[name])
    fast = make_outcomes(messy, config, tokenizer, range(len(messy)))
    monkeypatch.setattr(examples, "_fast", lambda noise: False)
    _same(fast, make_outcomes(messy, config, tokenizer, range(len(messy))))


def test_random_replacement_meets_a_mask_id_in_the_text(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    """With a mask token that text can produce, replacement treats it as a mask, as noise_example does."""
    from wakong.records import decode_record

    tok = TextTokenizer(tokenizer.json_text, dataclasses.replace(tokenizer.specials, mask="\u0120the"))
    path = tmp_path / "t.txt"
    path.write_bytes(b"the cat saw the dog near the house and the tree in the park today.\n" * 4)
    config = load_config(overrides=SMALL + ["noise.infill=false", "noise.random_ratio=0.5"])
    got = make_outcomes(TextSource([path]), config, tok, range(4))
    decoded = [decode_record(r) for o in got for r in o.records]
    assert any((d["input_ids"] != d["labels"]).any() for d in decoded)  # no span, yet replaced " the"s
    monkeypatch.setattr(examples, "_fast", lambda noise: False)
    _same(got, make_outcomes(TextSource([path]), config, tok, range(4)))


# ---------------------------------------------------------------- word-cached tokenisation


def _tokenizers(texts):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    out = {}
    wordpiece = Tokenizer(models.WordPiece(unk_token="<unk>"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=600, special_tokens=specials))
    out["wordpiece"] = wordpiece
    unigram = Tokenizer(models.Unigram())
    unigram.normalizer = normalizers.NFKC()
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=600, special_tokens=specials,
                                                                unk_token="<unk>"))
    out["unigram_metaspace"] = unigram
    level = Tokenizer(models.WordLevel(unk_token="<unk>"))
    level.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits()])
    level.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=600, special_tokens=specials))
    out["wordlevel_digits"] = level
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out["bytelevel_no_prefix"] = bpe
    split = Tokenizer(models.BPE())
    split.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_next")
    split.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials))
    out["split_not_local"] = split
    return {name: TextTokenizer(tok.to_str()) for name, tok in out.items()}


def test_word_cache_equals_whole_text_encoding(messy, tokenizer):  # noqa: F811
    texts = [messy[i].decode("utf-8", "replace") for i in range(len(messy))]
    records_ = [t.split() for t in texts] + [["*****", "x", "**"], ["a", "\x00", "b"], [], ["°F", "'s", "don't"]]
    tokenizers = {"trained": tokenizer, **_tokenizers(texts)}
    for name, tok in tokenizers.items():
        local = word_local(json.loads(tok.json_text))
        assert local == (name != "split_not_local"), name
        if not local:
            continue
        cached = tok.encode_records(records_)
        again = tok.encode_records(records_)  # from the cache
        cache, tok._cache = tok._cache, None
        try:
            whole = tok.encode_records(records_)
        finally:
            tok._cache = cache
        for got in (cached, again):
            assert np.array_equal(got[0], whole[0]) and np.array_equal(got[1], whole[1]), name


def test_word_cache_tables_grow_and_clear_without_changing_results(messy, tokenizer, monkeypatch):  # noqa: F811
    """Batches that add words to the flat tables, batches of empty records, and clearing at the limit
    mid-stream (a tiny LIMIT) all give the whole-text encoding."""
    from wakong.tokenizer import WordCache

    texts = [messy[i].decode("utf-8", "replace") for i in range(len(messy))]
    records_ = [t.split() for t in texts] + [[], ["x"], [], ["'s", "don't", "x"]]
    cache, tokenizer._cache = tokenizer._cache, None
    try:
        whole = [tokenizer.encode_records([r]) for r in records_]
    finally:
        tokenizer._cache = cache
    monkeypatch.setattr(WordCache, "LIMIT", 7)
    fresh = TextTokenizer(tokenizer.json_text)
    for batch in ([records_[-4:]] + [records_[k : k + 3] for k in range(0, len(records_), 3)] + [[[], []]]):
        ids, lengths = fresh.encode_records(batch)
        expected = [whole[records_.index(r)] for r in batch]
        assert np.array_equal(ids, np.concatenate([np.zeros(0, np.int32)] + [e[0] for e in expected]))
        assert np.array_equal(lengths, np.concatenate([np.zeros(0, np.int32)] + [e[1] for e in expected]))
        assert ids.dtype == np.int32 and lengths.dtype == np.int32
