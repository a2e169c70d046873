"""Reliability of training and evaluation under faults: truncated or corrupt checkpoints give one line
naming them, and a checkpoint is refused on data built with another tokenizer (same special ids,
smaller vocabulary) by ``train`` (reuse/resume) and ``eval``, with a message naming both."""

import json
import os

import jax
import pytest

from jaxsample.__main__ import main
from jaxsample.evaluation import DatasetConfig, EvalConfig, evaluate
from jaxsample.evaluation import data as eval_data
from jaxsample.jobs import train as train_job
from jaxsample.models import checkpoint as ckpt
from jaxsample.models import make_model
from jaxsample.models import train as T
from wakong.reader import open_dataset

MODEL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1, "max_len": 32}


def _dataset(root: str, vocab: int) -> str:
    spec = DatasetConfig(path=os.path.join(root, f"data{vocab}"), corpus="pydoc", build="demo", split="heldout",
                         build_set=(f"tokenizer.vocab_size={vocab}", "examples.max_source_len=24",
                                    "examples.max_target_len=24"))
    return eval_data.prepare(spec)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two datasets of the same records: 300- and 280-token tokenizers with the same special ids."""
    root = str(tmp_path_factory.mktemp("faults"))
    big, small = _dataset(root, 300), _dataset(root, 280)
    tok_big, tok_small = open_dataset(big)[1], open_dataset(small)[1]
    assert tok_big.mask_id == tok_small.mask_id and tok_big.vocab_size > tok_small.vocab_size
    return {"root": root, "big": big, "small": small, "tok_big": tok_big, "tok_small": tok_small}


def _job(data, out: str, steps: int = 4) -> str:
    config = {"version": 1, "kind": "train", "out": out, "data": {"path": data["big"]},
              "model": {"arch": "bart", "size": "tiny", "overrides": MODEL},
              "train": {"num_steps": steps, "learning_rate": 0.003, "warmup_steps": 1, "log_every": 1},
              "batch_size": 2}
    path = os.path.join(os.path.dirname(out), os.path.basename(out) + ".yaml")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def _saved_step(data, out: str, tokenizer, step: int = 2) -> str:
    """A checkpoint at ``step`` in the run ``out`` (as the train job would resume it), trained on ``tokenizer``."""
    job = train_job.load(_job(data, out))
    config = train_job.model_config(job, data["tok_big"])
    params = make_model(config).init(jax.random.key(0))
    opt_state = T.make_optimizer(job.train).init(params)
    directory = os.path.join(out, "checkpoint")
    ckpt.save(directory, step, params, config, opt_state=opt_state,
              metadata={"tokenizer": ckpt.tokenizer_metadata(tokenizer)})
    return directory


def _largest(directory: str) -> str:
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    return max(files, key=os.path.getsize)


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _one_line(capsys, command: str, *needles) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"jaxsample {command}: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ---------------------------------------------------------------- corrupt checkpoints


@pytest.mark.parametrize("damaged", ["params data", "params/_METADATA", "opt_state data", "config/metadata"])
def test_resuming_from_a_corrupt_checkpoint_is_one_line_naming_it(data, tmp_path, capsys, damaged):
    out = str(tmp_path / "run")
    directory = _saved_step(data, out, data["tok_big"])
    item, _, name = damaged.partition(" ") if " " in damaged else damaged.partition("/")
    target = os.path.join(directory, "2", item)
    _truncate(_largest(target) if name == "data" else os.path.join(target, name))
    assert main(["train", "--config", _job(data, out), "--no-progress"]) == 2
    err = _one_line(capsys, "train", os.path.join(os.path.abspath(directory), "2", item), "truncated or corrupt")
    other = {"params": "opt_state", "opt_state": "params"}.get(item)
    assert other is None or os.path.join("2", other) not in err  # only the damaged item is named


def test_restore_raises_checkpoint_error(data, tmp_path):
    directory = _saved_step(data, str(tmp_path / "run"), data["tok_big"])
    _truncate(_largest(os.path.join(directory, "2", "params")))
    with pytest.raises(ckpt.CheckpointError, match=r"2/params is truncated or corrupt"):
        ckpt.restore(directory)
    assert issubclass(ckpt.CheckpointError, ValueError)


# ---------------------------------------------------------------- another tokenizer


def test_checkpoints_record_the_tokenizer(data, tmp_path):
    directory = _saved_step(data, str(tmp_path / "run"), data["tok_big"])
    saved = ckpt.restore(directory).metadata["tokenizer"]
    assert saved == {"sha256": data["tok_big"].sha256, "vocab_size": 300}
    assert ckpt.read_metadata(directory) == {"tokenizer": saved}
    ckpt.check_tokenizer({"tokenizer": saved}, data["tok_big"], directory, data["big"])  # the same: no error
    ckpt.check_tokenizer({}, data["tok_small"], directory, data["small"])  # saved without a record: not checked


def test_eval_refuses_data_built_with_another_tokenizer(data, tmp_path, capsys):
    directory = _saved_step(data, str(tmp_path / "run"), data["tok_big"])
    config = EvalConfig(checkpoint=directory, dataset=DatasetConfig(path=data["small"], max_rows=4),
                        decoding=("greedy",), per_device_batch_size=2)
    with pytest.raises(ValueError, match="trained with tokenizer sha256") as info:
        evaluate(config, log=None)
    message = str(info.value)
    assert data["tok_big"].sha256[:16] in message and data["tok_small"].sha256[:16] in message
    assert "(300 tokens)" in message and "(280 tokens)" in message and data["small"] in message
    path = tmp_path / "eval.yaml"
    path.write_text(json.dumps({"version": 1, "kind": "eval", "checkpoint": directory,
                                "dataset": {"path": data["small"]}, "decoding": ["greedy"]}))
    assert main(["eval", "--config", str(path)]) == 2
    _one_line(capsys, "eval", "trained with tokenizer sha256", data["tok_small"].sha256[:16])


def test_train_refuses_to_resume_or_reuse_on_another_tokenizer(data, tmp_path, capsys):
    for steps in (2, 4):  # reuse (the checkpoint holds num_steps) and resume
        out = str(tmp_path / f"run{steps}")
        _saved_step(data, out, data["tok_small"], step=2)
        assert main(["train", "--config", _job(data, out, steps), "--no-progress"]) == 2
        _one_line(capsys, "train", "trained with tokenizer sha256", data["tok_big"].sha256[:16])


@pytest.mark.slow
def test_train_job_writes_the_tokenizer_record(data, tmp_path):
    out = str(tmp_path / "run")
    done = train_job.run(train_job.load(_job(data, out, steps=2)), progress=False, log=lambda _: None)
    assert ckpt.read_metadata(done.checkpoint)["tokenizer"]["sha256"] == data["tok_big"].sha256
