"""Tests of the ``wakong`` command line (run in process through ``wakong.cli.main``)."""

import json
import os
import subprocess
import sys

import pytest

from tests._helpers import dataset_records
from wakong import records
from wakong.cli import main
from wakong.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--set", "examples.max_source_len=64", "--set", "examples.max_target_len=64", "--vocab-size", "1000", "--no-progress"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("cli") / "docs.txt"
    lines = [" ".join(topics[name].split()) for name in sorted(topics)[:12]]
    lines[3:3] = ["", "   ", "short", "Non-ASCII is fine: naïve café, 你好。"]
    path.write_bytes(b"\n".join(line.encode() for line in lines) + b"\n\xff\xfe invalid utf-8 line here\n")
    return str(path)


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("build", "train-tokenizer", "inspect", "mask"):
        assert command in out
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    assert "--workers" in capsys.readouterr().out


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "wakong.cli", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "usage: wakong" in done.stdout


def test_build_reports_accounting_rates_and_plots(tmp_path, corpus, capsys):
    out = tmp_path / "data"
    assert main(["build", corpus, "--out", str(out), "--seed", "3", "--num-shards", "2", *SMALL]) == 0
    report = capsys.readouterr().out
    manifest = records.read_manifests(str(out))
    counts = manifest["counts"]
    assert counts["records_in"] == 17
    assert counts["records_written"] == len({r["index"] for r in dataset_records(str(out))})
    assert counts["records_dropped"]["empty"] == 2 and counts["events"]["utf8_replacements"] == 2
    for needle in ("records in                  17", "empty 2", "utf8 replacements", "tokens/s end to end",
                   "mask rate", "exact expectation", "span length", "mask rate by distance", "plots"):
        assert needle in report
    assert len(manifest["files"]) == 2 and manifest["seed"] == 3
    for name in ("span_lengths", "mask_positions"):
        assert (out / "report" / f"{name}.png").read_bytes()[:8] == PNG
    saved = json.loads((out / "report" / "report.json").read_text())
    assert saved["counts"] == counts and 0.13 < saved["mask"]["mask_rate"] < 0.17


def test_build_pydoc_with_the_article_config(tmp_path, capsys):
    out = tmp_path / "pydoc"
    args = ["build", "--corpus", "pydoc", "--config", os.path.join(ROOT, "configs/wakong/article.yaml"), "--out", str(out)]
    assert main(args + ["--set", "tokenizer.vocab_size=1000", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "training a byte-level BPE" in captured.err and "rec" in captured.err  # progress bar on stderr
    manifest = records.read_manifests(str(out))
    assert manifest["counts"]["records_in"] == 79 and manifest["parts"][0]["source"]["type"] == "pydoc"
    assert not (out / "report" / "span_lengths.png").exists()
    assert main(["inspect", str(out), "--examples", "2"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("source: <s>") == 2 and shown.count("target: <s>") == 2


def test_train_tokenizer_then_build_with_it(tmp_path, corpus, capsys):
    path = tmp_path / "tok.json"
    assert main(["train-tokenizer", corpus, "--out", str(path), "--vocab-size", "600"]) == 0
    tok = load_tokenizer(path)
    assert tok.vocab_size == 600 and tok.sha256 in capsys.readouterr().out
    out = tmp_path / "data"
    assert main(["build", corpus, "--tokenizer", str(path), "--out", str(out), "--no-progress", "--no-plots"]) == 0
    assert records.read_manifests(str(out))["tokenizer"]["sha256"] == tok.sha256


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tokenizer", "{tmp}/missing.json"], "does not exist"),
        (["--tokenizer", "{tmp}/corrupt.json"], "not a valid tokenizers JSON"),
        (["--set", "noise.spans.budget_rate=0.9"], "noise.spans.budget_rate must be in (0, 0.5]"),
        (["--set", "nosuch.key=1"], "unknown config key nosuch"),
        (["--corpus", "pydoc"], "not both"),
        (["--config", "{tmp}/none.yaml"], "config file"),
    ],
)
def test_build_errors_are_one_clear_line(tmp_path, corpus, capsys, args, message):
    (tmp_path / "corrupt.json").write_text('{"version": "1.0", "truncated')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["build", corpus, "--out", str(tmp_path / "out"), "--no-progress", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wakong: error:") and message in err and "Traceback" not in err


def test_missing_inputs_and_existing_output(tmp_path, corpus, capsys):
    assert main(["build", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")]) == 1
    assert "nope.txt does not exist" in capsys.readouterr().err
    assert main(["build", "--out", str(tmp_path / "o")]) == 1
    assert "no input files" in capsys.readouterr().err
    out = str(tmp_path / "twice")
    assert main(["build", corpus, "--out", out, *SMALL, "--no-plots"]) == 0
    assert main(["build", corpus, "--out", out, *SMALL, "--no-plots"]) == 1
    assert "already holds a dataset" in capsys.readouterr().err
    assert main(["build", corpus, "--out", out, *SMALL, "--no-plots", "--overwrite"]) == 0
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no manifest" in capsys.readouterr().err


def test_mask_command(capsys):
    assert main(["mask", "a b c d e f g h i j k l m n", "--seed", "1"]) == 0
    masked, picture = capsys.readouterr().out.splitlines()
    assert masked == "a b <mask> f g h i j k l m n"  # the reference package's README example
    assert picture == "..(xxx)........."
