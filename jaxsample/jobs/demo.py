"""``python -m jaxsample demo``: data -> a tiny BART -> masked sentences filled by many strategies.

1. Builds wakong text-infilling data from Python's documentation topics (``pydoc_data.topics``,
   shipped with Python): one topic in ``holdout_every`` is held out for evaluation, the others
   train; both with the tokenizer trained on the training topics (``configs/wakong/demo.yaml``).
2. Trains a small BART on CPU with a progress bar (:mod:`jaxsample.jobs.train`), saves an orbax
   checkpoint, the loss history and ``loss.png``.
3. Runs the evaluation runner with ``configs/eval/demo.yaml`` on the held-out sentences: greedy,
   beam search, nucleus and min-p sampling, llama.cpp's default chain, mirostat, DRY ... and prints
   the comparison table and a few filled-in sentences.

Everything lands in ``out`` (default ``runs/demo``). A second run reuses the data and the
checkpoint and only evaluates. Deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

from jaxsample.evaluation.configs import DatasetConfig
from jaxsample.jobs.train import ModelSection, TrainJobConfig
from jaxsample.models.train import TrainConfig

KIND = "demo"


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo (kind ``demo``; ``configs/demo/demo.yaml`` holds the defaults).

    Attributes:
      out: run directory (data/, checkpoint/, eval/, loss.png, train_history.json).
      seed: model init, data order, masks of re-noised epochs, and the evaluation's sampling.
      build: the ``wakong.build`` config of the data (name in ``configs/wakong`` or a path).
      holdout_every: pydoc topic ``i`` is held out when ``i % holdout_every == 0``.
      model, train, batch_size: as in the ``train`` job.
      eval: the ``eval`` config (name in ``configs/eval`` or a path); its checkpoint and dataset
        are replaced by this run's; ``eval_set`` overrides it.
      eval_every: held-out loss / token accuracy every N training steps (drawn in ``loss.png``).
    """

    out: str = "runs/demo"
    seed: int = 0
    build: str = "demo"
    holdout_every: int = 10
    model: ModelSection = ModelSection(overrides={"max_len": 64})
    train: TrainConfig = TrainConfig(num_steps=1000, learning_rate=3e-3, warmup_steps=60, log_every=10)
    batch_size: int = 32
    eval: str = "demo"
    eval_set: tuple[str, ...] = ()
    eval_every: int = 250

    def __post_init__(self):
        if not self.out:
            raise ValueError("out is required (the run directory)")
        if self.holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2, got {self.holdout_every}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def load(path: str | None, overrides=()) -> DemoConfig:
    from jaxsample import config as _config

    return _config.load(DemoConfig, path, overrides, kind=KIND)


def _data(cfg: DemoConfig, split: str, **extra) -> DatasetConfig:
    return DatasetConfig(path=os.path.join(cfg.out, "data", split), corpus="pydoc", build=cfg.build, split=split,
                         holdout_every=cfg.holdout_every, **extra)


def run(cfg: DemoConfig, *, relative_to: str | None = None, progress: bool = True,
        log: Callable[[str], Any] = print) -> dict:
    """Runs the demo; returns the evaluation results plus ``"demo"`` timings (see the module docstring)."""
    from jaxsample.evaluation import configs as C
    from jaxsample.evaluation import runner
    from jaxsample.jobs import train as train_job

    wall, cpu = time.perf_counter(), time.process_time()
    tokenizer = os.path.join(cfg.out, "data", "train", "tokenizer.json")
    job = TrainJobConfig(out=cfg.out, seed=cfg.seed, data=_data(cfg, "train"), model=cfg.model, train=cfg.train,
                         batch_size=cfg.batch_size, heldout=_data(cfg, "heldout", tokenizer=tokenizer),
                         eval_every=cfg.eval_every)
    trained = train_job.run(job, relative_to=relative_to, progress=progress, log=log)
    if trained.reused:
        log(f"reusing the checkpoint at step {trained.step} in {trained.checkpoint}")
    trained_wall, trained_cpu = time.perf_counter() - wall, time.process_time() - cpu

    eval_file = C.resolve(cfg.eval, "eval", relative_to)
    ev = C.load_eval(eval_file, cfg.eval_set)
    ev = dataclasses.replace(
        ev, checkpoint=trained.checkpoint, seed=cfg.seed, output_dir=os.path.join(cfg.out, "eval"),
        dataset=_data(cfg, "heldout", tokenizer=tokenizer, max_rows=ev.dataset.max_rows))
    results = runner.evaluate(ev, config_path=eval_file, log=log)
    results["demo"] = {
        "wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
        "data_and_training_wall_seconds": trained_wall, "data_and_training_cpu_seconds": trained_cpu,
        "training_loop_seconds": trained.seconds, "trained_steps": trained.step, "reused_checkpoint": trained.reused,
        "final_loss": trained.history["loss"][-1] if trained.history.get("loss") else None,
    }
    return results
