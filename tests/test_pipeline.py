"""Tests of the wakong data pipeline: text, sources, tokenizer, records, build, reader, failures."""

import errno
import glob
import hashlib
import json
import os
import pickle
import random
import sys

import numpy as np
import pytest

from tests._helpers import dataset_records as _records
from tests._helpers import failing_writer
from wakong import records
from wakong.config import load_config
from wakong.infilling import NoiseConfig, infill
from wakong.pipeline import build, make_examples, training_texts
from wakong.reader import batches, open_dataset, record_example
from wakong.sources import ArrayRecordSource, PydocSource, TextSource, open_source
from wakong.text import decode_utf8, sentence_words, split_sentences, split_words, truncate_utf8
from wakong.tokenizer import TextTokenizer, TokenizerError, load_tokenizer, train_tokenizer

SMALL = [
    "examples.max_source_len=64",
    "examples.max_target_len=64",
    "examples.min_words=3",
    "output.num_shards=3",
    "tokenizer.vocab_size=1000",
]


@pytest.fixture(scope="session")
def tokenizer() -> TextTokenizer:
    config = load_config(overrides=["input.format=pydoc"])
    return train_tokenizer(training_texts(PydocSource(), config), vocab_size=1000)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A small real-English corpus: 24 Python doc topics, one paragraph per record."""
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    texts = [topics[name] for name in sorted(topics)[:24]]
    path.write_text("\n\n".join(" ".join(t.split()) for t in texts) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def built(tmp_path_factory, corpus, tokenizer) -> str:
    """A dataset built once for the reader tests (sentence examples, word-level Wakong)."""
    out = tmp_path_factory.mktemp("built")
    config = load_config(overrides=SMALL + ["input.split=paragraph"])
    build(TextSource([corpus], "paragraph"), out, config, tokenizer=tokenizer)
    return str(out)


def _check_example(rec: dict, tok: TextTokenizer, max_source_len: int, max_target_len: int) -> None:
    special = {tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id}
    src, tgt = rec["input_ids"].tolist(), rec["labels"].tolist()
    assert src[0] == tgt[0] == tok.bos_id and src[-1] == tgt[-1] == tok.eos_id
    assert len(src) <= max_source_len and len(tgt) <= max_target_len
    assert not special & set(tgt[1:-1]) and not (special - {tok.mask_id}) & set(src[1:-1])
    assert rec["word_starts"][1] and not rec["word_starts"][0] and not rec["word_starts"][-1]


# ---------------------------------------------------------------- text


def test_decode_utf8_counts_repairs():
    assert decode_utf8(b"ok \xef\xbf\xbd") == ("ok \ufffd", 0)  # a real U+FFFD is not a repair
    assert decode_utf8(b"\xef\xbb\xbfhi \xff\xfe x \xc3 y") == ("hi \ufffd\ufffd x \ufffd y", 3)
    assert decode_utf8(b"\xff", "strict") == (None, 0)
    with pytest.raises(ValueError, match="utf8_errors"):
        decode_utf8(b"", "ignore")


def test_truncate_utf8_never_splits_a_character():
    raw = "aé你😀".encode()
    for cut in range(len(raw) + 1):
        assert decode_utf8(truncate_utf8(raw, cut), "strict")[0] is not None


def test_split_sentences():
    assert split_sentences("") == []
    assert split_sentences("One. Two? Three! \"Four.\" (Five.) Six. seven") == ["One.", "Two?", "Three!", '"Four."', "(Five.)", "Six. seven"]
    assert split_sentences("See e.g. Fig. 3 and J. R. R. Tolkien. Next one.") == [
        "See e.g. Fig. 3 and J. R. R. Tolkien.",
        "Next one.",
    ]
    assert split_sentences("version 3.11 is out. pi is 3.14") == ["version 3.11 is out. pi is 3.14"]
    assert split_sentences("first line\nsame sentence\n\nnew paragraph") == ["first line\nsame sentence", "new paragraph"]
    assert split_sentences("你好。再见！好") == ["你好。", "再见！", "好"]


def test_sentence_words_matches_split_sentences():
    """The batch splitter gives each text's words and sentence sizes exactly as split_sentences + split_words,
    over texts built from what the rules look at (terminators, closers, openers, abbreviations, initials,
    paragraph breaks, Unicode whitespace, CJK stops, a lone surrogate)."""
    pieces = ["a", "B", "7", "\u00c9", "\u0250", "e.g.", "Dr.", "x.", "X.", "(e.g.", "i.e.)", "etc.", "p.m.", ".", "..",
              "!", "?", "\u2026", '"', "'", ")", "]", "(", "[", "\u2018", "\u201c", "\u2019", "\u201d", " ", "  ", "\n",
              "\n\n", "\n \t\n", "\t", "\r", "\u00a0", "\u3000", "\u2028", "\x1c", "\x85", "\u3002", "\uff01", "\u300d",
              "\ud800", "\ufeff", "word"]
    rng = random.Random(0)
    for _ in range(1500):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.choice([0, 2, 8, 40]))) for _ in range(rng.randrange(4))]
        words, sizes, per_text = sentence_words(texts)
        expected = [[w for w in map(split_words, split_sentences(t)) if w] for t in texts]
        assert words == [[w for s in e for w in s] for e in expected], texts
        assert sizes.tolist() == [len(s) for e in expected for s in e], texts
        assert per_text.tolist() == [len(e) for e in expected], texts
    assert not any(chr(c).isspace() for c in range(0x3001, sys.maxunicode + 1))  # the splitter's whitespace table


# ---------------------------------------------------------------- sources


def test_text_source_splits(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"l1\r\n\n  \nl4\nl5")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    src = TextSource([path, empty, path])
    assert [src[i] for i in range(len(src))] == [b"l1", b"", b"  ", b"l4", b"l5"] * 2
    assert src.describe()["files"][1]["records"] == 0
    assert pickle.loads(pickle.dumps(src))[3] == b"l4"
    paragraphs = TextSource([path], "paragraph")
    assert [paragraphs[i] for i in range(len(paragraphs))] == [b"l1\r", b"l4\nl5"]
    assert TextSource([path], "file")[0] == path.read_bytes()
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        TextSource([tmp_path / "missing.txt"])
    with pytest.raises(ValueError, match="split"):
        TextSource([path], "sentence")


def test_array_record_and_pydoc_sources(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    path = str(tmp_path / "in.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    for text in (b"first record", b"", b"third"):
        writer.write(text)
    writer.close()
    src = open_source("array_record", [path])
    assert isinstance(src, ArrayRecordSource) and len(src) == 3 and src[2] == b"third"
    assert pickle.loads(pickle.dumps(src))[0] == b"first record"
    docs = open_source("pydoc", repeat=2)
    assert len(docs) == 2 * len(PydocSource()) and docs[0] == docs[len(docs) // 2]
    with pytest.raises(ValueError, match="input format"):
        open_source("csv", ["x"])


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_training_is_deterministic_with_bart_specials(tokenizer):
    config = load_config(overrides=["input.format=pydoc"])
    again = train_tokenizer(training_texts(PydocSource(), config), vocab_size=1000)
    assert again.sha256 == tokenizer.sha256
    ids = [tokenizer.bos_id, tokenizer.pad_id, tokenizer.eos_id, tokenizer.unk_id, tokenizer.mask_id]
    assert ids == [0, 1, 2, 3, 4] and tokenizer.decoder_start_id == 2
    assert not set(ids) & set(tokenizer.random_ids.tolist()) and len(tokenizer.random_ids) == 995


def test_encode_words_groups_tokens_and_never_injects_specials(tokenizer):
    words = "Hello wörld, </s> <mask> <s>x 你好 a".split()
    groups = tokenizer.encode_words(words)
    assert len(groups) == len(words) and all(groups)
    ids = [t for g in groups for t in g]
    assert not {0, 1, 2, 3, 4} & set(ids)
    assert tokenizer.decode(ids) == " " + " ".join(words)
    assert tokenizer.tokenizer.encode("<mask>", add_special_tokens=False).ids == [4]  # the vocabulary keeps it


def test_tokenizer_load_errors(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    for content in (b"{not json", tokenizer.json_text.encode()[:500], b"\xff\xfe", b"{}"):
        bad.write_bytes(content)
        with pytest.raises(TokenizerError, match="not a valid tokenizers JSON"):
            load_tokenizer(bad)
    spec = json.loads(tokenizer.json_text)
    del spec["model"]["vocab"]["<mask>"]
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<mask>"]
    bad.write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="no token '<mask>'"):
        load_tokenizer(bad)
    good = tmp_path / "dir"
    good.mkdir()
    tokenizer.save(good / "tokenizer.json")
    loaded = load_tokenizer(good)
    assert loaded.sha256 == tokenizer.sha256 == hashlib.sha256((good / "tokenizer.json").read_bytes()).hexdigest()
    assert pickle.loads(pickle.dumps(loaded)).encode_words(["hi"]) == loaded.encode_words(["hi"])


# ---------------------------------------------------------------- records


@pytest.mark.parametrize("wide", [False, True])
def test_record_round_trip(wide):
    data = records.encode_record(2**40, 3, [0, 70000 if wide else 65535, 2], [0, 9, 2], [0, 1, 0], [0, 1, 0], wide=wide)
    rec = records.decode_record(data)
    assert rec["index"] == 2**40 and rec["part"] == 3
    assert rec["input_ids"].tolist() == [0, 70000 if wide else 65535, 2] and rec["input_ids"].dtype == np.int32
    assert rec["sentence_starts"].tolist() == [False, True, False]
    with pytest.raises(records.DatasetError):
        records.decode_record(b"XXXX" + data[4:])


# ---------------------------------------------------------------- building: accounting


def _messy(tmp_path) -> str:
    lines = [
        b"Hello world. This is a normal line with several words in it.",
        b"",
        b"   \t ",
        "café naïve — résumé ok. 你好。 Ünïcödé words here".encode(),
        b"bad bytes \xff\xfe here and \xc3 there ok",
        b"one",
        b" ".join(b"word%d" % i for i in range(3000)) + b".",
        b"a literal </s> and <mask> and <s> in text stays text",
        b"Two words. Three words here.",
    ]
    path = tmp_path / "messy.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_messy_corpus_accounting(tmp_path, tokenizer):
    config = load_config(overrides=SMALL)
    m = build(TextSource([_messy(tmp_path)]), tmp_path / "out", config, tokenizer=tokenizer)
    c = m["counts"]
    assert c["records_in"] == 9
    assert c["records_dropped"] == {"empty": 2, "too_short": 1, "too_long": 0, "invalid_utf8": 0, "invalid_json": 0, "oversize": 0}
    ev = c["events"]
    assert ev["utf8_repaired_records"] == 1 and ev["utf8_replacements"] == 3
    assert ev["split_sentences"] == 1  # the 3000-word sentence
    assert ev["short_sentences_dropped"] == 2  # "你好。" and "Two words."
    recs = _records(str(tmp_path / "out"))
    assert len(recs) == c["examples"] == sum(s["records"] for s in m["shards"])
    assert sorted({r["index"] for r in recs}) == [0, 3, 4, 6, 7, 8]
    assert c["records_written"] == len({r["index"] for r in recs})  # written: the records in the shards
    for rec in recs:
        _check_example(rec, tokenizer, 64, 64)
    long_words = [f"word{i}" for i in range(2999)] + ["word2999."]
    pieces = sorted((r for r in recs if r["index"] == 6), key=lambda r: r["part"])
    assert len(pieces) > 1 and [t for r in pieces for t in r["labels"][1:-1]] == [
        t for w in tokenizer.encode_words(long_words) for t in w
    ]  # split at word boundaries: nothing lost, nothing reordered
    assert c["tokens"] == sum(len(r["labels"]) - 2 for r in recs)


def test_messy_corpus_strict_and_size_policies(tmp_path, tokenizer):
    messy = TextSource([_messy(tmp_path)])
    strict = load_config(overrides=SMALL + ["input.utf8_errors=strict", "input.max_record_bytes=1000", "input.oversize=drop", "examples.too_long=drop"])
    c = build(messy, tmp_path / "a", strict, tokenizer=tokenizer)["counts"]
    assert c["records_dropped"]["invalid_utf8"] == 1 and c["records_dropped"]["oversize"] == 1
    assert c["records_written"] == len({r["index"] for r in _records(str(tmp_path / "a"))})
    cut = load_config(overrides=SMALL + ["input.max_record_bytes=1000", "examples.too_long=truncate"])
    c = build(messy, tmp_path / "b", cut, tokenizer=tokenizer)["counts"]
    assert c["events"]["oversize_truncated_records"] == 1 and c["events"]["truncated_sentences"] == 1
    assert c["events"]["tokens_dropped"] > 0 and c["records_dropped"]["oversize"] == 0


def test_document_examples_and_too_long_policies(tmp_path, corpus, tokenizer):
    source = TextSource([corpus], "paragraph")
    totals = {}
    for policy in ("split", "truncate", "drop"):
        config = load_config(overrides=SMALL + ["examples.unit=document", f"examples.too_long={policy}"])
        m = build(source, tmp_path / policy, config, tokenizer=tokenizer)
        c = m["counts"]
        assert c["records_in"] == 24
        recs = _records(str(tmp_path / policy))
        assert c["records_written"] == len({r["index"] for r in recs})
        for rec in recs:
            _check_example(rec, tokenizer, 64, 64)
        totals[policy] = c
    assert totals["split"]["events"]["split_records"] == totals["truncate"]["events"]["truncated_records"] > 0
    assert totals["drop"]["records_dropped"]["too_long"] == totals["split"]["events"]["split_records"]
    assert totals["truncate"]["examples"] == 24 == totals["truncate"]["records_written"]
    assert totals["split"]["tokens"] == totals["truncate"]["tokens"] + totals["truncate"]["events"]["tokens_dropped"]


def test_jsonl_accounting(tmp_path, tokenizer):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([
        json.dumps({"text": "A valid record with words."}).encode(),
        b"{broken json",
        json.dumps({"other": "no text field"}).encode(),
        json.dumps({"text": 5}).encode(),
        b"",
        json.dumps({"text": "Caf\u00e9 is fine. Another sentence here."}).encode(),
    ]) + b"\n")
    config = load_config(overrides=SMALL + ["input.format=jsonl"])
    c = build(open_source("jsonl", [str(path)]), tmp_path / "out", config, tokenizer=tokenizer)["counts"]
    assert c["records_written"] == 2 and c["records_dropped"]["invalid_json"] == 3 and c["records_dropped"]["empty"] == 1


def test_examples_round_trip_to_their_schemes(corpus, tokenizer):
    """Every mask of a written source stands for exactly its span of the target (word level)."""
    config = load_config(overrides=SMALL)
    source = TextSource([corpus], "paragraph")
    mask = (tokenizer.mask_id,)
    for index in range(6):
        outcome = make_examples(index, source[index], random.Random(index), config, tokenizer)
        assert len(outcome.records) == len(outcome.schemes) > 0
        for data, (n_units, scheme) in zip(outcome.records, outcome.schemes):
            rec = records.decode_record(data)
            words = [w for s in record_example(rec) for w in s]
            assert n_units == len(words)
            assert rec["input_ids"][1:-1].tolist() == [t for w in infill(words, scheme, mask) for t in w]


# ---------------------------------------------------------------- building: determinism


def _shard_digests(path: str) -> list[str]:
    return [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in records.read_manifests(path)["files"]]


def _without_timing(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k != "timing"}


def test_build_is_deterministic_and_host_count_independent(tmp_path, corpus, tokenizer):
    source = TextSource([corpus], "paragraph")
    config = load_config(overrides=SMALL + ["seed=7"])
    one = build(source, tmp_path / "one", config, tokenizer=tokenizer)
    again = build(source, tmp_path / "again", config, tokenizer=tokenizer)
    assert _shard_digests(str(tmp_path / "one")) == _shard_digests(str(tmp_path / "again"))
    assert _without_timing(one) == _without_timing(again)
    for host in (0, 1):  # two simulated hosts writing their parts into one directory
        build(source, tmp_path / "two", config, tokenizer=tokenizer, process_index=host, process_count=2)
    single, double = _records(str(tmp_path / "one")), _records(str(tmp_path / "two"))
    key = lambda r: (r["index"], r["part"])  # noqa: E731
    assert [key(r) for r in sorted(single, key=key)] == [key(r) for r in sorted(double, key=key)]
    for a, b in zip(sorted(single, key=key), sorted(double, key=key)):
        assert a["input_ids"].tolist() == b["input_ids"].tolist() and a["labels"].tolist() == b["labels"].tolist()
    combined = records.read_manifests(str(tmp_path / "two"))
    assert combined["counts"] == records.read_manifests(str(tmp_path / "one"))["counts"]
    other_seed = build(source, tmp_path / "seed8", load_config(overrides=SMALL + ["seed=8"]), tokenizer=tokenizer)
    assert other_seed["counts"]["tokens"] == one["counts"]["tokens"]  # same text, other masks
    assert _shard_digests(str(tmp_path / "seed8")) != _shard_digests(str(tmp_path / "one"))


def test_build_output_does_not_depend_on_worker_count(tmp_path, corpus, tokenizer):
    source = TextSource([corpus], "paragraph")
    config = load_config(overrides=SMALL + ["examples.unit=document", "noise.permute_sentences=1.0", "noise.random_ratio=0.1"])
    build(source, tmp_path / "w0", config, tokenizer=tokenizer)
    m = build(source, tmp_path / "w2", config, tokenizer=tokenizer, workers=2)
    assert m["timing"]["workers"] == 2
    assert _shard_digests(str(tmp_path / "w0")) == _shard_digests(str(tmp_path / "w2"))


def test_overwrite_and_leftovers(tmp_path, corpus, tokenizer):
    source = TextSource([corpus], "paragraph")
    config = load_config(overrides=SMALL)
    build(source, tmp_path, config, tokenizer=tokenizer)
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        build(source, tmp_path, config, tokenizer=tokenizer)
    fewer = load_config(overrides=SMALL[:-2] + ["output.num_shards=1"])
    build(source, tmp_path, fewer, tokenizer=tokenizer, overwrite=True)
    assert len(records.read_manifests(str(tmp_path))["files"]) == 1
    assert len(glob.glob(str(tmp_path / "part-*"))) == 1


# ---------------------------------------------------------------- write failures


def test_full_disk_raises_and_commits_nothing(tmp_path, corpus, tokenizer, monkeypatch):
    from array_record.python.array_record_module import ArrayRecordWriter

    def on_full_disk(path):  # the shard's temporary file is /dev/full: every flush fails with ENOSPC
        os.symlink("/dev/full", path)
        return ArrayRecordWriter(path, "group_size:1")

    monkeypatch.setattr(records, "_array_record_writer", on_full_disk)
    with pytest.raises(records.DatasetWriteError, match="No space left on device"):
        build(TextSource([corpus], "paragraph"), tmp_path, load_config(overrides=SMALL), tokenizer=tokenizer)
    assert os.listdir(tmp_path) == []  # no manifest, no shard, no tokenizer, no temporary file


def test_write_error_midway_raises_and_commits_nothing(tmp_path, corpus, tokenizer, monkeypatch):
    full = failing_writer(OSError(errno.ENOSPC, "No space left on device"), 5)
    monkeypatch.setattr(records, "_array_record_writer", full)
    with pytest.raises(records.DatasetWriteError) as info:
        build(TextSource([corpus], "paragraph"), tmp_path, load_config(overrides=SMALL), tokenizer=tokenizer)
    assert info.value.errno == errno.ENOSPC and "(the disk is full)" in str(info.value)
    assert os.listdir(tmp_path) == []
    with pytest.raises(records.DatasetError, match="no manifest"):
        batches(str(tmp_path), batch_size=2, process_index=0, process_count=1)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path, corpus, tokenizer):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(records.DatasetWriteError):
            build(TextSource([corpus], "paragraph"), out, load_config(overrides=SMALL), tokenizer=tokenizer)
    finally:
        out.chmod(0o755)


def test_incomplete_or_tampered_datasets_are_refused(tmp_path, corpus, tokenizer):
    source = TextSource([corpus], "paragraph")
    config = load_config(overrides=SMALL)
    build(source, tmp_path / "half", config, tokenizer=tokenizer, process_index=1, process_count=2)
    with pytest.raises(records.DatasetError, match=r"parts \[0\] of 2 are missing"):
        records.read_manifests(str(tmp_path / "half"))
    build(source, tmp_path / "full", config, tokenizer=tokenizer)
    shard = records.read_manifests(str(tmp_path / "full"))["files"][0]
    with open(shard, "ab") as f:
        f.write(b"junk")
    with pytest.raises(records.DatasetError, match="size differs"):
        records.read_manifests(str(tmp_path / "full"))
    build(source, tmp_path / "tok", config, tokenizer=tokenizer)
    with open(tmp_path / "tok" / "tokenizer.json", "a") as f:
        f.write(" ")
    with pytest.raises(records.DatasetError, match="sha256"):
        open_dataset(tmp_path / "tok")


# ---------------------------------------------------------------- reading


def _rows(batch_list) -> list[tuple[int, int]]:
    return [(int(i), int(p)) for b in batch_list for i, p in zip(b["index"], b["part"]) if i >= 0]


def test_batches_have_fixed_shapes_and_lose_nothing(built, tokenizer):
    n = records.read_manifests(built)["counts"]["examples"]
    out = list(batches(built, batch_size=16, process_index=0, process_count=1))
    assert len(out) == -(-n // 16)
    for b in out:
        assert {k: v.shape for k, v in b.items()} == {
            "input_ids": (16, 64), "attention_mask": (16, 64), "decoder_input_ids": (16, 64),
            "decoder_attention_mask": (16, 64), "labels": (16, 64), "loss_mask": (16, 64), "index": (16,), "part": (16,),
        }
        np.testing.assert_array_equal(b["decoder_input_ids"][:, 1:][b["loss_mask"][:, 1:]], b["labels"][:, :-1][b["loss_mask"][:, 1:]])
        assert np.all(b["decoder_input_ids"][:, 0][b["index"] >= 0] == tokenizer.eos_id)
        assert np.all(b["labels"][~b["loss_mask"]] == tokenizer.pad_id)
        ends = b["loss_mask"].sum(1)
        rows = np.flatnonzero(b["index"] >= 0)
        assert np.all(b["labels"][rows, ends[rows] - 1] == tokenizer.eos_id)
    padding = out[-1]["index"] < 0
    assert padding.sum() == 16 * len(out) - n and not out[-1]["loss_mask"][padding].any()
    rows = _rows(out)
    assert len(rows) == len(set(rows)) == n
    assert len(list(batches(built, batch_size=16, process_index=0, process_count=1, drop_remainder=True))) == n // 16


def test_hosts_partition_the_examples(built):
    n = records.read_manifests(built)["counts"]["examples"]
    parts = [_rows(batches(built, batch_size=8, seed=3, process_index=h, process_count=3)) for h in range(3)]
    union = [r for p in parts for r in p]
    assert len(union) == len(set(union)) == n


def test_resume_from_saved_state_gives_exactly_the_rest(built):
    make = lambda: batches(built, batch_size=8, seed=5, num_epochs=2, process_index=0, process_count=1)  # noqa: E731
    full = list(make())
    for stop in (0, 1, 7, len(full) - 1):
        it = iter(make())
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(it.get_state()))  # states are small JSON-able dicts
        resumed = iter(make())
        resumed.set_state(state)
        tail = list(resumed)
        assert _rows(head + tail) == _rows(full)
        for a, b in zip(tail, full[stop:]):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    epochs = _rows(full)
    half = len(epochs) // 2
    assert sorted(epochs[:half]) == sorted(epochs[half:]) and epochs[:half] != epochs[half:]


def test_grain_checkpoint_helper(built):
    from grain.experimental import LimitIterDataset, assert_equal_output_after_checkpoint

    ds = batches(built, batch_size=16, seed=1, num_epochs=None, renoise=NoiseConfig(), process_index=0, process_count=1)
    assert_equal_output_after_checkpoint(LimitIterDataset(ds, count=4))


def test_renoise_is_fresh_per_epoch_and_host_independent(built):
    stored = {(r["index"], r["part"]): r for r in _records(built)}

    def collect(host, count):
        out = {}
        n = len(stored)
        for b in batches(built, batch_size=8, seed=9, num_epochs=2, renoise=NoiseConfig(), process_index=host, process_count=count):
            for row in np.flatnonzero(b["index"] >= 0):
                key = (int(b["index"][row]), int(b["part"][row]))
                out.setdefault(key, []).append(b["input_ids"][row][b["attention_mask"][row] == 1].tolist())
                labels = b["labels"][row][b["loss_mask"][row]].tolist()
                assert labels == stored[key]["labels"].tolist()
        assert all(len(v) == 2 for v in out.values()) or count > 1
        return out

    one = collect(0, 1)
    two = collect(0, 2)
    for key, sources in collect(1, 2).items():
        two.setdefault(key, []).extend(sources)
    assert {k: sorted(v) for k, v in one.items()} == {k: sorted(v) for k, v in two.items()}
    changed = sum(v[0] != v[1] for v in one.values())
    assert changed > len(one) // 3  # fresh masks in the second epoch
    assert sum(v[0] != stored[k]["input_ids"].tolist() for k, v in one.items()) > len(one) // 3


def test_reader_validation(built):
    with pytest.raises(ValueError, match="below the build"):
        batches(built, batch_size=4, max_source_len=32, process_index=0, process_count=1)
    with pytest.raises(ValueError, match="batch_size"):
        batches(built, batch_size=0, process_index=0, process_count=1)
    with pytest.raises(ValueError, match="process_index"):
        batches(built, batch_size=4, process_index=2, process_count=2)
    wide = next(iter(batches(built, batch_size=4, max_source_len=80, max_target_len=96, process_index=0, process_count=1)))
    assert wide["input_ids"].shape == (4, 80) and wide["labels"].shape == (4, 96)


def test_reader_defaults_to_the_jax_process(built):
    b = next(iter(batches(built, batch_size=4)))
    assert b["input_ids"].shape == (4, 64)


@pytest.mark.slow
def test_end_to_end_bart_recipe_on_pydoc(tmp_path, tokenizer):
    config = load_config("configs/wakong/bart.yaml", ["input.format=pydoc", "tokenizer.vocab_size=1000"])
    m = build(PydocSource(repeat=2), tmp_path, config, tokenizer=tokenizer, workers=2)
    c = m["counts"]
    assert c["records_in"] == 2 * len(PydocSource()) == c["records_written"]
    from wakong.report import MaskStats

    summary = MaskStats(config.noise.spans).merge(m["mask_stats"]).summary()
    assert summary["mask_rate"] == pytest.approx(0.30, abs=0.01)
    assert summary["mask_rate"] == pytest.approx(summary["expected_mask_rate"], abs=0.005)
    n = c["examples"]
    rows = _rows(batches(tmp_path, batch_size=32, process_index=0, process_count=1, workers=2))
    assert len(rows) == len(set(rows)) == n


def test_write_many_writes_what_write_writes(tmp_path):
    data = [bytes([k % 251]) * (k % 37 + 1) for k in range(300)]
    files = {}
    for how in ("one", "many"):
        os.makedirs(tmp_path / how)
        with records.ShardWriter(str(tmp_path / how), "part", 2) as writer:
            if how == "one":
                for k, d in enumerate(data):
                    writer.write(k % 2, d)
            else:
                writer.write_many(0, data[0::2])
                writer.write_many(1, data[1::2])
            files[how] = writer.commit()
    assert files["one"] == files["many"] and [f["records"] for f in files["many"]] == [150, 150]
