"""``python -m jaxsample``: help everywhere, one-line errors with exit code 2, showcase, demo smoke runs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxsample import _corpus
from jaxsample.__main__ import COMMANDS, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in COMMANDS])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m jaxsample" in out
    if argv[0] == "configs":
        assert "--path" in out
    elif argv[0] != "--help":
        assert "--config" in out and "--set KEY=VALUE" in out and "--no-compile-cache" in out
    else:
        assert all(c in out for c in COMMANDS)


def test_module_entry_point_runs_with_the_distributed_flag():
    env = {**os.environ, "JAXSAMPLE_DISTRIBUTED": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "jaxsample", "eval", "--help"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--parallel" in proc.stdout


@pytest.mark.parametrize(
    "argv,message",
    [
        (["eval", "--config", "{bad}"], "{bad}: dataset.split must be all, train or heldout"),
        (["eval", "--config", "missing.yaml"], "config file missing.yaml does not exist"),
        (["train", "--set", "batch_size=0"], "batch_size must be >= 1"),
        (["train", "--set", "model.overrides={d_modl: 3}"], "unknown bart config field"),
        (["demo", "--set", "trian.num_steps=3"], "unknown config key trian"),
        (["showcase", "--context", "qqqzzz"], "'qqqzzz' is not a word of the corpus"),
        (["showcase", "--set", "samplers=[nope]"], "samplers: nope: no samplers config 'nope'"),
        (["eval", "--set", "seed=[1"], "invalid YAML: while parsing a flow sequence"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nkind: eval\ncheckpoint: c\ndataset: {path: d, split: test}\n")
    argv = [a.replace("{bad}", str(bad)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"jaxsample {argv[0]}: error:")
    assert message.replace("{bad}", str(bad)) in err


def test_argparse_errors_exit_2_and_the_default_command_is_demo(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--steps", "many"])  # no command: the demo's options
    assert exit_.value.code == 2
    assert "demo: error: argument --steps: invalid int value" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate"])
    assert exit_.value.code == 2


def test_showcase_reports_kept_tokens_entropy_and_samples(capsys):
    assert main(["showcase", "--set", "samplers=[hf, code]", "--set", "samples=3", "--context", "the value of the"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("next word after 'the value of the': V = 3,")
    hf = next(line for line in out if line.startswith("hf "))
    logits = _corpus.next_word_logits("the")
    tied_50 = int((logits >= np.sort(logits)[-50]).sum())  # HF's top_k=50 keeps ties with the 50th word
    assert f"kept {tied_50:>5,}" in hf and tied_50 >= 50
    code = next(line for line in out if line.startswith("code "))
    assert "kept     1" in code and "entropy  0.00" in code  # temperature 0: greedy
    samples = out[out.index(code) + 1].split()
    assert samples[0] == "samples:" and len(set(samples[1:])) == 1 and len(samples) == 4


TINY = ["--set", "model.overrides={d_model: 32, num_heads: 2, d_ff: 64, encoder_layers: 1, decoder_layers: 1, "
        "max_len: 128}", "--set", "batch_size=8",
        "--set", "eval_set=[dataset.max_rows=4, per_device_batch_size=4, examples=1, "
        "'decoding=[greedy, {name: s, strategy: sample, sampler: hf, num_return: 2}]']"]


def test_demo_smoke_run_then_reuse(tmp_path, capsys):
    """A few training steps, then a second run that reuses data and checkpoint and only evaluates."""
    out = str(tmp_path / "demo")
    assert main(["demo", "--out", out, "--steps", "3", "--no-progress"] + TINY) == 0
    first = capsys.readouterr().out
    assert "| greedy | greedy |" in first and "| s | sample |" in first and "source:" in first
    for name in ("loss.png", "train_history.json", "eval/results.json", "eval/summary.md", "eval/outputs.jsonl",
                 "checkpoint/3", "data/train/tokenizer.json", "data/heldout/tokenizer.json"):
        assert os.path.exists(os.path.join(out, name)), name
    manifests = {p: os.path.getmtime(os.path.join(out, "data", p, "manifest-00000-of-00001.json"))
                 for p in ("train", "heldout")}
    first_results = json.load(open(os.path.join(out, "eval", "results.json")))

    assert main(["demo", "--out", out, "--steps", "3", "--no-progress"] + TINY) == 0
    second = capsys.readouterr().out
    assert "reusing the checkpoint at step 3" in second
    assert "building pydoc" not in second and "training bart" not in second
    for p, mtime in manifests.items():
        assert os.path.getmtime(os.path.join(out, "data", p, "manifest-00000-of-00001.json")) == mtime
    again = json.load(open(os.path.join(out, "eval", "results.json")))
    for name in ("greedy", "s"):  # deterministic for a seed
        a, b = first_results["configs"][name], again["configs"][name]
        assert {k: v for k, v in a.items() if k != "timing"} == {k: v for k, v in b.items() if k != "timing"}
    history = json.load(open(os.path.join(out, "train_history.json")))
    assert history["step"] == [0, 1, 2]


@pytest.mark.slow
def test_full_demo_from_a_cold_process(tmp_path):
    """The README's main job end to end (default settings), in a fresh process; then a warm rerun."""
    out = str(tmp_path / "demo")
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "jaxsample", "--out", out, "--no-progress"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| mirostat | sample |" in proc.stdout and os.path.isfile(os.path.join(out, "loss.png"))
    results = json.load(open(os.path.join(out, "eval", "results.json")))
    greedy = results["configs"]["greedy"]
    assert greedy["faithful"] > 0.1 and greedy["token_accuracy"] > 0.3  # the model learned to copy (some)
    assert greedy["infill_exact_match"] > 0.05  # ... and fills some masks right
    top_p = results["configs"]["top_p"]
    assert top_p["self_bleu"] < results["configs"]["beam"]["self_bleu"]  # sampled returns differ more than beams
    warm = subprocess.run([sys.executable, "-m", "jaxsample", "--out", out, "--no-progress"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert warm.returncode == 0 and "reusing the checkpoint" in warm.stdout
