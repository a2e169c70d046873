"""The ``train`` job: a BART on a wakong dataset, with a progress bar, checkpoints and a loss curve.

Config kind ``train``::

    version: 1
    kind: train
    out: runs/train                 # checkpoint/, train_history.json, loss.png
    data: {path: runs/train/data, corpus: pydoc, build: demo, split: train}
    model: {arch: bart, size: tiny, overrides: {d_model: 128}}
    train: {num_steps: 600, learning_rate: 0.003, warmup_steps: 60}   # jaxsample.models.train.TrainConfig
    batch_size: 32

The model's vocabulary size and special ids come from the dataset's tokenizer. A run whose
``out/checkpoint`` already holds ``num_steps`` steps is reused as is; one holding fewer resumes
from there (optimizer state restored; the data order restarts with ``seed + step``). Training
batches re-noise every epoch (:func:`wakong.reader.batches` with ``renoise``) unless
``renoise: false``. Single host for now (the batches are sharded by ``jax.process_index()`` but
parameters are not synchronised across hosts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable, NamedTuple

from jaxsample.evaluation.configs import DatasetConfig
from jaxsample.models.train import TrainConfig

KIND = "train"
_BART_KEYS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels", "loss_mask")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``arch`` / ``size`` of :func:`jaxsample.models.get_config` plus field ``overrides``.

    ``vocab_size`` and the special ids are taken from the dataset's tokenizer.
    """

    arch: str = "bart"
    size: str = "tiny"
    overrides: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.arch != "bart":
            raise ValueError(f"model.arch must be bart (infilling data has a source and a target), got {self.arch!r}")
        self.build(vocab_size=512, ids={})  # names and values are checked here (errors name the field)

    def build(self, vocab_size: int, ids: dict[str, int]):
        from jaxsample.models import get_config

        try:
            return get_config(self.arch, self.size, **{**self.overrides, "vocab_size": vocab_size, **ids})
        except (ValueError, TypeError) as err:
            raise ValueError(f"model.overrides: {err}") from None


@dataclasses.dataclass(frozen=True)
class TrainJobConfig:
    """See the module docstring."""

    out: str = "runs/train"
    seed: int = 0
    data: DatasetConfig = DatasetConfig(path="runs/train/data", corpus="pydoc", build="demo", split="train")
    model: ModelSection = ModelSection()
    train: TrainConfig = TrainConfig(num_steps=600, learning_rate=3e-3, warmup_steps=60, log_every=10)
    batch_size: int = 32
    renoise: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.out:
            raise ValueError("out is required (the run directory)")


def load(path: str | None, overrides=()) -> TrainJobConfig:
    from jaxsample import config as _config

    return _config.load(TrainJobConfig, path, overrides, kind=KIND)


class Trained(NamedTuple):
    checkpoint: str  # directory
    step: int
    reused: bool  # nothing was trained
    history: dict  # "step", "loss", "accuracy", ... lists (all steps so far)
    seconds: float  # training loop wall time of this run (0 when reused)


def model_config(job: TrainJobConfig, tokenizer):
    """The model config for ``job``: its size and overrides, the tokenizer's vocabulary and ids."""
    ids = {f"{r}_id": getattr(tokenizer, f"{r}_id") for r in ("bos", "pad", "eos", "mask", "decoder_start")}
    return job.model.build(tokenizer.vocab_size, ids)


def _batches(path: str, job: TrainJobConfig, start: int, noise):
    from wakong.reader import batches

    for batch in batches(path, batch_size=job.batch_size, seed=job.seed + start, num_epochs=None,
                         renoise=noise if job.renoise else None):
        yield {k: batch[k] for k in _BART_KEYS}


def run(job: TrainJobConfig, *, relative_to: str | None = None, progress: bool = True,
        log: Callable[[str], Any] = print) -> Trained:
    """Builds (or reuses) the data, trains (or reuses / resumes) the model, writes history and plot."""
    import jax

    from jaxsample.evaluation import data as _data
    from jaxsample.models import checkpoint as ckpt
    from jaxsample.models import make_model
    from jaxsample.models import train as T
    from wakong.config import config_from_dict
    from wakong.reader import open_dataset

    path = _data.prepare(job.data, relative_to=relative_to, log=log)
    info, tokenizer = open_dataset(path)
    config = model_config(job, tokenizer)
    model = make_model(config)
    directory = os.path.join(job.out, "checkpoint")
    history_file = os.path.join(job.out, "train_history.json")
    tc = dataclasses.replace(job.train, seed=job.seed)
    latest = ckpt.latest_step(directory) or 0
    history = _read_history(history_file)
    if latest >= tc.num_steps:
        ckpt.check_config(directory, config, step=latest)
        return Trained(directory, latest, True, history, 0.0)
    if latest:
        restored = ckpt.restore(directory, config, step=latest, optimizer=T.make_optimizer(tc))
        params, opt_state = restored.params, restored.opt_state
        log(f"resuming from step {latest} in {directory}")
    else:
        params, opt_state = model.init(jax.random.key(job.seed)), None
    noise = config_from_dict(info["config"]).noise
    n_params = sum(x.size for x in jax.tree.leaves(params))
    log(f"training bart ({n_params:,} parameters, d_model {config.d_model}, vocab {config.vocab_size}) "
        f"for {tc.num_steps - latest} steps of {job.batch_size} examples on {path}")
    bar = _bar(tc.num_steps, latest, progress)

    def callback(step: int, metrics: dict) -> None:
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}")

    try:
        result = T.train(model, params, _batches(path, job, latest, noise), tc, opt_state=opt_state,
                         start_step=latest, callback=callback, checkpoint_dir=directory)
    finally:
        bar.close()
    for key, values in result.history.items():
        history.setdefault(key, []).extend(values.tolist())
    os.makedirs(job.out, exist_ok=True)
    with open(history_file, "w", encoding="utf-8") as f:
        json.dump(history, f)
    plot_loss(history, os.path.join(job.out, "loss.png"))
    return Trained(directory, result.step, False, history, result.seconds)


def _read_history(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", disable=not enabled, dynamic_ncols=True, file=sys.stderr,
                desc="train")


def plot_loss(history: dict, path: str) -> None:
    """PNG of the training loss (per step, and a 20-step moving average) and token accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    step, loss = np.asarray(history["step"]), np.asarray(history["loss"])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(step, loss, lw=0.8, alpha=0.4, color="C0", label="loss (per step)")
    if len(loss) >= 20:
        smooth = np.convolve(loss, np.ones(20) / 20, mode="valid")
        ax.plot(step[19:], smooth, color="C0", label="loss (20-step mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(step, history["accuracy"], lw=0.8, color="C1", alpha=0.6, label="token accuracy")
    twin.set_ylabel("teacher-forced token accuracy")
    twin.set_ylim(0, 1)
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [h.get_label() for h in lines], loc="center right")
    ax.set_title("BART text infilling on pydoc topics")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
