"""Inputs and tokenizers of ``wakong build``: compressed text, directories and globs, Parquet, Arrow and
Hugging Face ``datasets`` directories, SentencePiece models; accounting and determinism for each, and
one clear error naming the file for each kind of damage."""

import gzip
import hashlib
import io
import json
import os

import numpy as np
import pytest

from tests.test_pipeline import SMALL, corpus, tokenizer  # noqa: F401  (fixtures)
from wakong import records
from wakong.cli import main
from wakong.config import load_config
from wakong.pipeline import build
from wakong.reader import batches, open_dataset
from wakong.sources import InputError, TextSource, expand_inputs, open_source

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

LINES = [b"First record. It has two sentences.", b"", b"caf\xc3\xa9 na\xc3\xafve \xff bad byte here ok.",
         b"one", b"A literal <mask> and </s> stay text in this line.", b"  \t ", b"Last record with words here."]
CONFIG = SMALL + ["output.num_shards=2", "examples.min_words=2"]


def _digests(path) -> list[str]:
    return [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in records.read_manifests(str(path))["files"]]


def _build(source, out, tokenizer, *extra, workers=0):  # noqa: F811
    return build(source, out, load_config(overrides=CONFIG + list(extra)), tokenizer=tokenizer, workers=workers)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokenizer):  # noqa: F811
    """The plain-text build every other source of the same records must equal, shard for shard."""
    root = tmp_path_factory.mktemp("plain")
    (root / "a.txt").write_bytes(b"\n".join(LINES) + b"\n")
    manifest = _build(TextSource([root / "a.txt"]), root / "out", tokenizer)
    return root, manifest


def _same_records(out, reference) -> None:
    root, manifest = reference
    assert _digests(out) == _digests(root / "out")
    assert records.read_manifests(str(out))["counts"] == manifest["counts"]


# ---------------------------------------------------------------- compressed text, directories, globs


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data[:20]) + gzip.compress(data[20:])  # two members, as concatenated .gz files are


def _zstd(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return compressor.compress(data[:30]) + compressor.compress(data[30:])  # two frames


@pytest.mark.parametrize("suffix,compress", [(".gz", _gzip), (".zst", _zstd)])
def test_compressed_text_gives_the_plain_build(tmp_path, tokenizer, reference, suffix, compress):  # noqa: F811
    path = tmp_path / f"a.txt{suffix}"
    path.write_bytes(compress(b"\n".join(LINES) + b"\n"))
    source = open_source("text", [str(path)])
    assert [source[i] for i in range(len(source))] == LINES
    assert source.describe()["files"][0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    _build(source, tmp_path / "out", tokenizer)
    _same_records(tmp_path / "out", reference)


@pytest.mark.parametrize("damage", ["magic", "truncated", "middle"])
@pytest.mark.parametrize("suffix,compress", [(".gz", _gzip), (".zst", _zstd)])
def test_corrupt_compressed_input_names_the_file(tmp_path, capsys, suffix, compress, damage):
    data = bytearray(compress(b"\n".join(LINES) * 50))
    if damage == "magic":
        data[:4] = b"JUNK"
    elif damage == "truncated":
        data = data[: len(data) - 7]
    else:
        data[len(data) * 3 // 4] ^= 0xFF
    path = tmp_path / f"a.txt{suffix}"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=str(path)):
        open_source("text", [str(path)])
    out = tmp_path / "out"
    assert main(["build", str(path), "--out", str(out), "--vocab-size", "300", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wakong: error: input file") and str(path) in err and "Traceback" not in err
    assert not out.exists() or not os.listdir(out)


def test_directories_and_globs_expand_in_sorted_order(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/b.txt", "d/a.txt.gz", "d/sub/c.txt", "d/notes.md", "d/.hidden.txt"):
        data = name.encode()
        (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    expected = [str(tmp_path / n) for n in ("d/a.txt.gz", "d/b.txt", "d/sub/c.txt")]
    assert expand_inputs([tmp_path / "d"], "text") == expected
    assert expand_inputs([str(tmp_path / "d" / "**" / "*.txt")], "text") == [expected[1], expected[2]]
    source = open_source("text", [str(tmp_path / "d")])
    assert [source[i] for i in range(len(source))] == [b"d/a.txt.gz", b"d/b.txt", b"d/sub/c.txt"]
    with pytest.raises(FileNotFoundError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.parquet")], "parquet")
    with pytest.raises(FileNotFoundError, match="holds no parquet files"):
        expand_inputs([tmp_path / "d"], "parquet")


# ---------------------------------------------------------------- Parquet


def _parquet(path, values, row_group_size=2, column="text", kind=None):
    table = pa.table({"id": list(range(len(values))), column: pa.array(values, kind)})
    pq.write_table(table, path, row_group_size=row_group_size)


def _texts():
    return [line.decode("utf-8", "surrogateescape") for line in LINES]


def test_parquet_column_row_groups_and_nulls(tmp_path, tokenizer, reference):  # noqa: F811
    values = [line for line in LINES]
    values[1] = None  # a null is an empty record
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _parquet(a, values[:4], column="body", kind=pa.binary())
    _parquet(b, values[4:], column="body", kind=pa.binary())
    source = open_source("parquet", [str(tmp_path / "*.parquet")], column="body")
    assert len(source) == len(LINES) and source.describe()["files"][0]["row_groups"] == 2
    assert [source[i] for i in range(len(source))] == LINES
    assert source.read([6, 0, 1, 2, 5, 3]) == [LINES[i] for i in (6, 0, 1, 2, 5, 3)]
    _build(source, tmp_path / "out", tokenizer, "input.format=parquet", "input.column=body")
    _same_records(tmp_path / "out", reference)


def test_parquet_string_column_and_workers(tmp_path, tokenizer):  # noqa: F811
    from pydoc_data.topics import topics

    texts = [" ".join(topics[k].split()) for k in sorted(topics)[:30]]
    _parquet(tmp_path / "docs.parquet", texts, row_group_size=4)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n")
    plain = _build(TextSource([tmp_path / "docs.txt"]), tmp_path / "plain", tokenizer)
    source = open_source("parquet", [str(tmp_path / "docs.parquet")])
    zero = _build(source, tmp_path / "w0", tokenizer, "input.format=parquet")
    _build(source, tmp_path / "w2", tokenizer, "input.format=parquet", workers=2)
    assert _digests(tmp_path / "w0") == _digests(tmp_path / "w2") == _digests(tmp_path / "plain")
    assert zero["counts"] == plain["counts"] and zero["counts"]["records_in"] == 30


def test_parquet_errors_name_the_file(tmp_path, capsys):
    _parquet(tmp_path / "a.parquet", ["x", "y"])
    with pytest.raises(InputError, match="has no column 'body'.*columns: id, text"):
        open_source("parquet", [str(tmp_path / "a.parquet")], column="body")
    with pytest.raises(InputError, match="column 'id' of input file .* holds int64, not text"):
        open_source("parquet", [str(tmp_path / "a.parquet")], column="id")
    (tmp_path / "b.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=f"{tmp_path / 'b.parquet'} is not a valid Parquet file"):
        open_source("parquet", [str(tmp_path / "b.parquet")])
    assert main(["build", str(tmp_path / "b.parquet"), "--format", "parquet", "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 1
    assert "b.parquet is not a valid Parquet file" in capsys.readouterr().err


def test_parquet_damage_found_while_building_names_the_file(tmp_path, tokenizer):  # noqa: F811
    path = tmp_path / "a.parquet"
    _parquet(path, [f"record number {i} has some words" * 20 for i in range(40)], row_group_size=10)
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(2).column(1)  # the text column of the third row group
    start = column.data_page_offset
    data[start + 20 : start + 60] = os.urandom(40)
    path.write_bytes(bytes(data))
    source = open_source("parquet", [str(path)])  # the footer is intact
    for workers in (0, 2):
        with pytest.raises(InputError, match=f"input file {path} is corrupt or unreadable"):
            _build(source, tmp_path / f"out{workers}", tokenizer, "input.format=parquet", workers=workers)
        assert os.listdir(tmp_path / f"out{workers}") == []  # staging removed, nothing committed


# ---------------------------------------------------------------- Arrow and Hugging Face datasets directories


def test_hf_datasets_directory_and_arrow_files(tmp_path, tokenizer, reference):  # noqa: F811
    datasets = pytest.importorskip("datasets")
    values = _texts()
    values[2] = LINES[2].decode("utf-8", "replace")
    ds = datasets.Dataset.from_dict({"text": [v if v else None for v in values], "n": list(range(7))})
    ds.save_to_disk(str(tmp_path / "hf"), max_shard_size=60)  # several arrow files
    assert len([n for n in os.listdir(tmp_path / "hf") if n.endswith(".arrow")]) > 1
    source = open_source("arrow", [str(tmp_path / "hf")])
    got = [source[i] for i in range(len(source))]
    assert got == [v.encode() for v in values]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match="DatasetDict .*splits train, test.*dd/train"):
        open_source("arrow", [str(tmp_path / "dd")])
    assert open_source("arrow", [str(tmp_path / "dd" / "test")]).read(range(7)) == got


def test_arrow_files_without_datasets(tmp_path, tokenizer, reference):  # noqa: F811
    """The save_to_disk layout written with pyarrow alone (stream files + state.json), and a file-format .arrow."""
    table = pa.table({"text": pa.array(LINES, pa.binary())})
    directory = tmp_path / "hf"
    directory.mkdir()
    names = []
    for k, piece in enumerate((table.slice(0, 3), table.slice(3))):
        names.append(f"data-{k:05d}-of-00002.arrow")
        with pa.OSFile(str(directory / names[-1]), "wb") as sink, pa.ipc.new_stream(sink, piece.schema) as writer:
            writer.write_table(piece)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    source = open_source("arrow", [str(directory)])
    assert [source[i] for i in range(len(source))] == LINES
    _build(source, tmp_path / "out", tokenizer, "input.format=arrow")
    _same_records(tmp_path / "out", reference)
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert open_source("arrow", [str(tmp_path / "f.arrow")]).read(range(7)) == LINES
    (tmp_path / "bad.arrow").write_bytes(b"ARROW1" + os.urandom(64))
    with pytest.raises(InputError, match="bad.arrow is not a valid Arrow IPC file"):
        open_source("arrow", [str(tmp_path / "bad.arrow")])
    with pytest.raises(InputError, match="no state.json"):
        open_source("arrow", [str(tmp_path)])


def test_cli_builds_parquet_with_column_flag(tmp_path, capsys):
    from pydoc_data.topics import topics

    _parquet(tmp_path / "a.parquet", [" ".join(topics[k].split()) for k in sorted(topics)[:6]], column="body")
    out = tmp_path / "out"
    assert main(["build", str(tmp_path), "--format", "parquet", "--set", "input.column=body", "--out", str(out),
                 "--vocab-size", "400", "--no-progress", "--no-plots"]) == 0
    info = records.read_manifests(str(out))
    assert info["source"]["type"] == "parquet" and info["source"]["column"] == "body"
    assert info["counts"]["records_in"] == 6 == info["counts"]["records_written"]


# ---------------------------------------------------------------- SentencePiece


def _spm(texts, **options) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    settings = dict(vocab_size=400, model_type="unigram", user_defined_symbols=["<mask>"], bos_id=0, pad_id=1,
                    eos_id=2, unk_id=3, pad_piece="<pad>", minloglevel=2, num_threads=1)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, **{**settings, **options})
    return model.getvalue()


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    from pydoc_data.topics import topics

    texts = [s for k in sorted(topics)[:30] for s in " ".join(topics[k].split()).split(". ")]
    path = tmp_path_factory.mktemp("spm") / "sp.model"
    path.write_bytes(_spm(texts))
    return str(path), texts


def test_sentencepiece_tokenizer(sp_model):
    from wakong.spm import SentencePieceTokenizer
    from wakong.tokenizer import TokenizerError, load_tokenizer

    path, texts = sp_model
    tok = load_tokenizer(path)
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id, tok.mask_id, tok.decoder_start_id) == (0, 1, 2, 3, 4, 2)
    assert not {0, 1, 2, 3, 4} & set(tok.random_ids.tolist())
    words = "a literal <mask> and </s> <pad> stays text".split()
    groups = tok.encode_words(words)
    assert len(groups) == len(words) and all(groups) and not {0, 1, 2, 4} & {t for g in groups for t in g}
    assert tok.sp.encode("<mask>")[-1] == 4  # what the unmodified model would have injected
    assert tok.decode([0, *groups[0], 4, 2]) == "<s>a<mask></s>"
    with pytest.raises(TokenizerError, match="has no piece '<mask>'.*user_defined_symbols"):
        SentencePieceTokenizer(_spm(texts, user_defined_symbols=[]), origin="nomask.model")
    with pytest.raises(TokenizerError, match="not a valid SentencePiece model"):
        SentencePieceTokenizer(b"garbage")


@pytest.mark.parametrize("options", [{}, {"model_type": "bpe"}, {"add_dummy_prefix": False}])
def test_sentencepiece_grouping_matches_the_piece_offsets(sp_model, options):
    from wakong.spm import SentencePieceTokenizer

    _, texts = sp_model
    tok = SentencePieceTokenizer(_spm(texts, **options))
    # "\x01" vanishes in normalisation (its word has no marked piece: that record takes the offsets)
    records_ = [t.split() for t in texts[:200]] + [[], ["a", "\x01", "b"], ["ünï", "你好", "x"]]
    fast = tok.encode_records(records_)
    lengths = np.concatenate([tok._grouped(w, " ".join(w)) for w in records_])
    assert np.array_equal(fast[1], lengths) and len(fast[0]) == lengths.sum()
    assert fast[0].tolist() == [i for w in records_ for i in tok._body.encode(" ".join(w))]


def test_build_with_a_sentencepiece_model(tmp_path, sp_model, corpus):  # noqa: F811
    path, _ = sp_model
    out = tmp_path / "out"
    assert main(["build", corpus, "--split", "paragraph", "--tokenizer", path, "--out", str(out), "--no-progress",
                 "--no-plots", "--set", "examples.max_source_len=64", "--set", "examples.max_target_len=64"]) == 0
    assert sorted(n for n in os.listdir(out) if n.startswith("tokenizer")) == ["tokenizer.model"]
    info, tok = open_dataset(out)
    assert info["tokenizer"]["file"] == "tokenizer.model" and tok.sha256 == info["tokenizer"]["sha256"]
    batch = next(iter(batches(str(out), batch_size=4, process_index=0, process_count=1)))
    assert batch["input_ids"].shape == (4, 64) and (batch["input_ids"] == tok.mask_id).any()
