"""The ``train`` job: a BART on a wakong dataset, sharded over every device of every host, resumable,
with held-out evaluation in the loop, checkpoints, metrics and a loss plot.

Config kind ``train``::

    version: 1
    kind: train
    out: runs/train                 # checkpoint/, train_history.json, metrics.jsonl, loss.png, tensorboard/
    data: {path: runs/train/data, corpus: pydoc, build: demo, split: train}
    heldout: {path: runs/train/heldout, corpus: pydoc, build: demo, split: heldout}   # optional
    model: {arch: bart, size: tiny, overrides: {d_model: 128, dtype: bfloat16}}
    train: {num_steps: 600, learning_rate: 0.003, warmup_steps: 60}   # jaxsample.models.train.TrainConfig
    parallel: {mode: fsdp, grad_accum: 2}                              # jaxsample.models.parallel.ParallelConfig
    batch_size: 32                  # global: every host reads batch_size / hosts rows per step
    eval_every: 100                 # held-out loss / token accuracy every N steps (and at the end)
    early_stopping: 0               # stop after N evaluations without a lower held-out loss
    checkpoint_every: 200           # and at the end; a killed run resumes from the newest one

The model's vocabulary size and special ids come from the dataset's tokenizer (a held-out set is
tokenized with the training set's tokenizer). A run whose ``out/checkpoint`` already holds
``num_steps`` steps is reused as is; one holding fewer resumes from there exactly: parameters,
optimizer state, step and every host's data-iterator state come from the checkpoint, so the next
batch and (on the same mesh) the loss trajectory are those of an uninterrupted run. The checkpoint
restores onto any mesh. Checkpoints record the dataset tokenizer's sha256 and vocabulary size
(``metadata["tokenizer"]``); reusing or resuming one on data built with another tokenizer is
refused, and so is evaluating it on such data (:mod:`jaxsample.evaluation.runner`). A truncated or
corrupt checkpoint fails with one line naming it (:class:`jaxsample.models.checkpoint.CheckpointError`).
Training batches re-noise every epoch (:func:`wakong.reader.batches` with ``renoise``) unless
``renoise: false``. With ``noising: device`` the reader yields tokenized documents and the train step
noises them (:class:`wakong.device_noise.DeviceNoiser`, the dataset's ``noise`` settings) with a key
per example and epoch: fresh masks every epoch; the only way to train on datasets built with
``output.mode: tokenized`` without noising on the host.

Several hosts: run the same command on each with ``--distributed`` (or ``--coordinator``,
``--num-processes``, ``--process-id``), as for ``eval``; process 0 builds missing data, writes the
history, metrics and plot, and every process writes its shards of each checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import sys
import time
from typing import Any, Callable, NamedTuple

from jaxsample.evaluation.configs import DatasetConfig
from jaxsample.models.parallel import ParallelConfig
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
    noising: str = "host"
    parallel: ParallelConfig = ParallelConfig()
    heldout: DatasetConfig | None = None
    eval_every: int = 0
    early_stopping: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int | None = None

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.noising not in ("host", "device"):
            raise ValueError(f"noising must be host or device, got {self.noising!r}")
        if not self.out:
            raise ValueError("out is required (the run directory)")
        for name in ("eval_every", "early_stopping", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.early_stopping and not (self.heldout and self.eval_every):
            raise ValueError("early_stopping needs heldout and eval_every")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1 or null, got {self.keep_checkpoints}")


def load(path: str | None, overrides=()) -> TrainJobConfig:
    from jaxsample import config as _config

    return _config.load(TrainJobConfig, path, overrides, kind=KIND)


class Trained(NamedTuple):
    checkpoint: str  # directory
    step: int
    reused: bool  # nothing was trained
    history: dict  # "step", "loss", "accuracy", ... lists (all steps so far); "eval": held-out rows
    seconds: float  # training loop wall time of this run (0 when reused)


def model_config(job: TrainJobConfig, tokenizer):
    """The model config for ``job``: its size and overrides, the tokenizer's vocabulary and ids."""
    ids = {f"{r}_id": getattr(tokenizer, f"{r}_id") for r in ("bos", "pad", "eos", "mask", "decoder_start")}
    return job.model.build(tokenizer.vocab_size, ids)


def _data_stream(path: str, job: TrainJobConfig, local_rows: int, noise, states):
    """``(iterator of this host's batches, reader iterator, restored)``, resumed from the checkpoint's
    ``states`` (every host's) when they fit this number of hosts."""
    from wakong.device_noise import DOCUMENT_KEYS
    from wakong.reader import batches, restore_host_state

    device = job.noising == "device"
    it = iter(batches(path, batch_size=local_rows, seed=job.seed, num_epochs=None, documents=device,
                      renoise=noise if job.renoise and not device else None))
    restored = restore_host_state(it, states)
    keys = DOCUMENT_KEYS + ("noise_keys",) if device else _BART_KEYS
    return ({k: b[k] for k in keys} for b in it), it, restored


def _device_noising(job: TrainJobConfig, info: dict, tokenizer):
    """The train step's ``batch_fn``: the dataset's noise settings applied on the device (or None)."""
    if job.noising != "device":
        return None

    from wakong.config import config_from_dict
    from wakong.device_noise import DeviceNoiser

    config = config_from_dict(info["config"])
    noiser = DeviceNoiser.create(config.noise, tokenizer, max_source_len=config.examples.max_source_len,
                                 max_target_len=config.examples.max_target_len)
    return functools.partial(_noised, noiser, noiser.params(config.noise, tokenizer.random_ids))


def _noised(noiser, params, batch):
    return noiser(params, batch["noise_keys"], batch)


def _heldout_batches(path: str, local_rows: int) -> list[dict]:
    """This host's held-out batches, padded (``loss_mask`` False) to the same count on every host."""
    import json as _json

    import numpy as np

    from jaxsample import distributed
    from wakong.reader import batches

    local = [{k: b[k] for k in _BART_KEYS} for b in batches(path, batch_size=local_rows, shuffle=False)]
    counts = [_json.loads(c) for c in distributed.allgather_bytes(_json.dumps(len(local)).encode())]
    pad = {k: np.zeros_like(v) for k, v in local[0].items()}
    return local + [pad] * (max(counts) - len(local))


def run(job: TrainJobConfig, *, relative_to: str | None = None, progress: bool = True,
        log: Callable[[str], Any] = print) -> Trained:
    """Builds (or reuses) the data, trains (or reuses / resumes) the model, writes history and plot."""
    import jax

    from jaxsample import distributed
    from jaxsample.evaluation import data as _data
    from jaxsample.models import checkpoint as ckpt
    from jaxsample.models import make_model
    from jaxsample.models import parallel as P
    from jaxsample.models import train as T
    from wakong.config import config_from_dict
    from wakong.reader import host_states, open_dataset

    main, hosts = distributed.is_main(), distributed.process_count()
    mesh = P.make_mesh()
    P.check_batch_size(job.batch_size, mesh, job.parallel)
    if job.batch_size % hosts:
        raise ValueError(f"batch_size {job.batch_size} must be divisible by the number of hosts ({hosts})")
    quiet = log if main and log is not None else (lambda _: None)
    with distributed.together("train: prepare the data"):  # process 0 builds missing datasets first
        if main:
            path = _data.prepare(job.data, relative_to=relative_to, log=log)
            if job.heldout is not None:
                _data.prepare(_with_tokenizer(job.heldout, path), relative_to=relative_to, log=log)
    path = job.data.path
    info, tokenizer = open_dataset(path)
    config = model_config(job, tokenizer)
    model = make_model(config)
    directory = os.path.join(job.out, "checkpoint")
    history_file = os.path.join(job.out, "train_history.json")
    tc = dataclasses.replace(job.train, seed=job.seed)
    optimizer = T.make_optimizer(tc)
    latest = ckpt.latest_step(directory) or 0
    history = _read_history(history_file)
    if latest:
        ckpt.check_config(directory, config, step=latest)
        ckpt.check_tokenizer(ckpt.read_metadata(directory, latest), tokenizer, f"{directory}/{latest}", path)
    if latest >= tc.num_steps:
        return Trained(directory, latest, True, history, 0.0)
    p_sh, o_sh = P.state_shardings_of(model, optimizer, mesh, job.parallel)
    states, best = None, None
    if latest:
        like = jax.eval_shape(model.init, jax.random.key(0))
        restored = ckpt.restore(directory, config, step=latest, optimizer=optimizer,
                                params_like=_with_shardings(like, p_sh),
                                opt_state_like=_with_shardings(jax.eval_shape(optimizer.init, like), o_sh))
        params, opt_state = restored.params, restored.opt_state
        states, best = restored.metadata.get("data_state"), restored.metadata.get("best_eval")
        quiet(f"resuming from step {latest} in {directory}")
    else:
        params, opt_state = P.init_sharded(model, jax.random.key(job.seed), mesh, job.parallel), None
    local_rows = job.batch_size // hosts
    stream, reader, resumed = _data_stream(path, job, local_rows, config_from_dict(info["config"]).noise, states)
    if latest and not resumed:
        quiet(f"the checkpoint has no data state for {hosts} host(s): the data order restarts")
    evaluate = None
    if job.heldout is not None:
        held = _heldout_batches(job.heldout.path, local_rows)
        eval_step = T.make_eval_step(model, shardings=(mesh, p_sh))
        evaluate = lambda p: T.evaluate_batches(eval_step, p, [P.global_batch(b, mesh) for b in held])  # noqa: E731
    n_params = sum(x.size for x in jax.tree.leaves(params))
    quiet(f"training bart ({n_params:,} parameters, d_model {config.d_model}, vocab {config.vocab_size}, "
          f"{config.dtype}) for {tc.num_steps - latest} steps of {job.batch_size} examples on {path}; "
          f"{job.parallel.mode} over {mesh.size} device(s) on {hosts} host(s)"
          + (f", {job.parallel.grad_accum} micro-batches per step" if job.parallel.grad_accum > 1 else ""))
    quiet("compiling the training step ... (the first step waits for XLA; later runs read the compile cache)")
    bar = _bar(tc.num_steps, latest, progress and main)
    started, first = time.perf_counter(), []
    metrics_log = _MetricsLog(job.out, enabled=main)

    def callback(step: int, metrics: dict) -> None:
        if not first and main:
            first.append(step)
            bar.write(f"compiled; first {step - latest} step(s) done in {time.perf_counter() - started:.1f} s",
                      file=sys.stderr)
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}")
        metrics_log.write("train", step, metrics)

    def on_eval(step: int, metrics: dict) -> None:
        bar.write(f"step {step}: held-out loss {metrics['loss']:.3f}, token accuracy {metrics['accuracy']:.3f}") \
            if main else None
        metrics_log.write("heldout", step, metrics)

    try:
        result = T.train(model, params, stream, tc, opt_state=opt_state, start_step=latest, callback=callback,
                         checkpoint_dir=directory, checkpoint_every=job.checkpoint_every, mesh=mesh,
                         parallel=job.parallel, evaluate=evaluate, eval_every=job.eval_every,
                         early_stopping=job.early_stopping, on_eval=on_eval,
                         data_state=functools.partial(host_states, reader), best_eval=best,
                         keep_checkpoints=job.keep_checkpoints,
                         checkpoint_metadata={"tokenizer": ckpt.tokenizer_metadata(tokenizer)},
                         batch_fn=_device_noising(job, info, tokenizer))
    finally:
        bar.close()
        metrics_log.close()
    for key, values in result.history.items():
        history.setdefault(key, []).extend(values.tolist())
    history.setdefault("eval", []).extend(result.evals)
    if result.stopped_early:
        quiet(f"early stopping at step {result.step}: no better held-out loss in {job.early_stopping} evaluations")
    if main:
        os.makedirs(job.out, exist_ok=True)
        with open(history_file, "w", encoding="utf-8") as f:
            json.dump(history, f)
        if not plot_loss(history, os.path.join(job.out, "loss.png")):
            print("loss.png skipped: matplotlib is not installed (pip install 'jaxsample[plots]')", file=sys.stderr)
    return Trained(directory, result.step, False, history, result.seconds)


def _with_tokenizer(spec: DatasetConfig, train_path: str) -> DatasetConfig:
    """A held-out spec tokenized with the training set's tokenizer unless it names one."""
    return spec if spec.tokenizer else dataclasses.replace(spec, tokenizer=os.path.join(train_path, "tokenizer.json"))


def _with_shardings(abstract, shardings):
    import jax

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


class _MetricsLog:
    """``metrics.jsonl`` (one line per logged step and per evaluation) and TensorBoard scalars when a
    writer is installed (``tensorboardX``, or ``torch.utils.tensorboard`` with ``tensorboard``)."""

    def __init__(self, out: str, enabled: bool):
        self.file = self.board = None
        if not enabled:
            return
        os.makedirs(out, exist_ok=True)
        self.file = open(os.path.join(out, "metrics.jsonl"), "a", encoding="utf-8")
        writer = _summary_writer()
        self.board = writer(os.path.join(out, "tensorboard")) if writer else None

    def write(self, split: str, step: int, metrics: dict) -> None:
        if self.file is None:
            return
        row = {"split": split, "step": step, **{k: v for k, v in metrics.items() if k != "step"}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.board is not None:
            for key, value in row.items():
                if key not in ("split", "step"):
                    self.board.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        for f in (self.file, self.board):
            if f is not None:
                f.close()


def _summary_writer():
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
    return SummaryWriter
def _read_history(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", disable=not enabled, dynamic_ncols=True, file=sys.stderr,
                desc="train")


def plot_loss(history: dict, path: str) -> bool:
    """PNG of the training loss (per step, and a 20-step moving average) and token accuracy, with the
    held-out loss and accuracy of every evaluation (``history["eval"]``) next to them.

    Returns False (and writes nothing) when matplotlib, an optional dependency, is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        return False
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
    evals = history.get("eval") or []
    if evals:
        ax.plot([e["step"] for e in evals], [e["loss"] for e in evals], "o-", color="C2", ms=4,
                label="held-out loss")
    twin = ax.twinx()
    twin.plot(step, history["accuracy"], lw=0.8, color="C1", alpha=0.6, label="token accuracy (train)")
    if evals:
        twin.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "s--", color="C3", ms=4,
                  label="token accuracy (held-out)")
    twin.set_ylabel("teacher-forced token accuracy")
    twin.set_ylim(0, 1)
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [h.get_label() for h in lines], loc="center right")
    ax.set_title("BART text infilling on pydoc topics")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
