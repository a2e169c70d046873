"""The ``train`` job: held-out evaluation in the loop, metrics files, exact resume after SIGKILL, and two
real processes (loopback coordinator) training exactly like one."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxsample.evaluation import data as _data
from jaxsample.evaluation.configs import DatasetConfig
from jaxsample.jobs import train as train_job
from jaxsample.models.train import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1, "max_len": 64,
         "dropout_rate": 0.0, "attention_dropout_rate": 0.0}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The demo's train / held-out pydoc datasets, built once for the module."""
    root = tmp_path_factory.mktemp("data")
    train = DatasetConfig(path=str(root / "train"), corpus="pydoc", build="demo", split="train")
    _data.prepare(train)
    heldout = DatasetConfig(path=str(root / "heldout"), corpus="pydoc", build="demo", split="heldout",
                            tokenizer=str(root / "train" / "tokenizer.json"))
    _data.prepare(heldout)
    return train, heldout


def _job(out, datasets, **over) -> train_job.TrainJobConfig:
    train, heldout = datasets
    base = dict(out=str(out), seed=1, data=train, heldout=heldout, batch_size=8, eval_every=4, checkpoint_every=3,
                model=train_job.ModelSection(overrides=MODEL),
                train=TrainConfig(num_steps=8, learning_rate=3e-3, warmup_steps=2, log_every=1))
    return train_job.TrainJobConfig(**{**base, **over})


def _yaml(job: train_job.TrainJobConfig, path) -> str:
    import yaml

    from jaxsample import config

    path.write_text(yaml.safe_dump(json.loads(json.dumps(config.dump(job, "train")))))
    return str(path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, datasets):
    out = tmp_path_factory.mktemp("full")
    return train_job.run(_job(out, datasets, train=TrainConfig(num_steps=40, learning_rate=3e-3, warmup_steps=2,
                                                                 log_every=1)), progress=False, log=lambda _: None), out


def test_heldout_evaluation_metrics_and_plot(uninterrupted):
    done, out = uninterrupted
    assert done.step == 40 and not done.reused
    evals = done.history["eval"]
    assert [e["step"] for e in evals] == list(range(4, 41, 4))
    assert evals[-1]["loss"] < evals[0]["loss"] and 0 < evals[-1]["accuracy"] < 1 and evals[0]["tokens"] > 100
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "heldout"] == [e["step"] for e in evals]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 41))
    assert os.path.getsize(out / "loss.png") > 10_000
    pytest.importorskip("tensorboardX")
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "tensorboard"))
    from jaxsample.models import checkpoint as ckpt

    meta = ckpt.restore(str(out / "checkpoint"), step=39).metadata
    assert len(meta["data_state"]) == 1 and meta["best_eval"] == min(e["loss"] for e in evals if e["step"] <= 36)


@pytest.mark.multiprocess
def test_a_killed_run_resumes_to_the_same_batches_and_losses(tmp_path, datasets, uninterrupted):
    """SIGKILL after the first checkpoint, rerun the same command: steps 3.. equal the uninterrupted run."""
    full, _ = uninterrupted
    job = _job(tmp_path / "run", datasets, train=TrainConfig(num_steps=40, learning_rate=3e-3, warmup_steps=2,
                                                             log_every=1))
    config = _yaml(job, tmp_path / "train.yaml")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxsample", "train", "--config", config, "--no-progress"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = tmp_path / "run" / "checkpoint" / "3" / "commit_success.txt"
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), proc.stderr.read()[-2000:]
    from jaxsample.models import checkpoint as ckpt

    killed_at = ckpt.latest_step(str(tmp_path / "run" / "checkpoint"))
    assert killed_at is not None and killed_at < 40, "the run finished before it was killed"
    resumed = train_job.run(job, progress=False, log=lambda _: None)
    assert resumed.step == 40
    steps = resumed.history["step"]
    assert steps[0] == killed_at and steps[-1] == 39
    np.testing.assert_array_equal(resumed.history["loss"], np.asarray(full.history["loss"])[killed_at:])
    assert [e["loss"] for e in resumed.history["eval"]] == [e["loss"] for e in full.history["eval"]
                                                          if e["step"] > killed_at]


@pytest.mark.multiprocess
def test_two_processes_train_exactly_like_one(tmp_path, datasets):
    from tests.test_multihost import _free_port, _run_processes, _settings

    job = _job(tmp_path / "one", datasets, checkpoint_every=0)
    one = train_job.run(job, progress=False, log=lambda _: None)
    config = _yaml(dataclasses.replace(job, out=str(tmp_path / "two")), tmp_path / "train.yaml")
    (code0, out0, err0), (code1, out1, err1) = _run_processes(
        tmp_path, lambda i: ["jaxsample.__main__", "train", "--config", config, "--no-progress"],
        _settings(_free_port()), "train")
    assert code0 == 0 and code1 == 0, err0[-2000:] + err1[-2000:]
    assert "checkpoint step 8" in out0 and "checkpoint step" not in out1  # process 0 reports
    two = json.load(open(tmp_path / "two" / "train_history.json"))
    # Each host feeds half of every global batch: the same examples, so the same token-weighted losses.
    np.testing.assert_allclose(two["loss"], one.history["loss"], rtol=2e-5)
    np.testing.assert_allclose([e["loss"] for e in two["eval"]], [e["loss"] for e in one.history["eval"]], rtol=2e-5)
    assert sorted(os.listdir(tmp_path / "two" / "checkpoint")) == ["8"]


def test_bad_job_settings_name_the_field(datasets, tmp_path):
    with pytest.raises(ValueError, match="early_stopping needs heldout"):
        _job(tmp_path, datasets, heldout=None, early_stopping=2)
    with pytest.raises(ValueError, match=r"batch_size 6 must be divisible"):
        train_job.run(_job(tmp_path, datasets, batch_size=6,
                           parallel=train_job.ParallelConfig(grad_accum=4)), progress=False, log=lambda _: None)
