"""Training with optax: masked cross-entropy losses, AdamW with warmup + cosine decay, a jitted step and a loop.

Batches are dicts of ``[B, ...]`` arrays:

- decoder-only LM: ``input_ids int32[B, T]``, ``loss_mask bool[B, T]`` aligned with ``input_ids``
  (``loss_mask[b, t]``: train the prediction of token ``t`` from tokens ``< t``; column 0 is
  ignored), optional ``attention_mask bool[B, T]`` (False = padding, left or right; a token is
  only a target when the token just before it is real);
- BART: ``input_ids``, ``attention_mask`` (encoder), ``decoder_input_ids`` (the labels shifted right
  behind ``decoder_start_id``), ``labels`` (the original ids ending with EOS), ``loss_mask`` (True
  exactly on real label positions, EOS included and nothing after it), optional
  ``decoder_attention_mask``. The prediction at decoder position ``t`` is scored against
  ``labels[:, t]``: no further shift, so the off-by-one of training on the padding after EOS cannot
  creep in as long as ``loss_mask`` is ``labels != pad`` (see :func:`shift_right`). Packed rows
  (:mod:`wakong.features`, ``hf`` layout with ``pack=True``) add ``segment_ids``, ``position_ids``,
  ``decoder_segment_ids``, ``decoder_position_ids``; attention then stays within each example.

A train step may first turn the batch into these features on the device (``batch_fn``, e.g. a
:class:`wakong.device_noise.DeviceNoiser` noising tokenized documents).

The loss is the mean cross-entropy over all ``loss_mask`` positions of the batch (token-weighted).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsample._types import Array
from jaxsample.models import checkpoint as _checkpoint
from jaxsample.models import parallel as _parallel
from jaxsample.models.layers import positions_from_mask

Batch = Mapping[str, Array]
_LM_KEYS = ("input_ids", "loss_mask")
_BART_KEYS = ("input_ids", "attention_mask", "decoder_input_ids", "labels", "loss_mask")
_PACKED_KEYS = ("segment_ids", "position_ids", "decoder_segment_ids", "decoder_position_ids")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation hyperparameters (AdamW, linear warmup then cosine decay, global-norm clipping)."""

    num_steps: int = 1000  # length of the schedule and of :func:`train`
    learning_rate: float = 1e-3  # peak, reached after ``warmup_steps``
    warmup_steps: int = 100
    final_lr_ratio: float = 0.1  # cosine decays to ``learning_rate * final_lr_ratio`` at ``num_steps``
    weight_decay: float = 0.01  # decoupled; applied to matrices only (not biases, norms)
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-6
    clip_norm: float = 1.0  # global gradient norm; <= 0 disables clipping
    dropout: bool = True  # use the model's dropout rates during training
    seed: int = 0  # dropout keys are fold_in(key(seed), step): independent of restarts
    log_every: int = 10  # host sync + callback period (steps)

    def __post_init__(self):
        from jaxsample import config as _config

        _config.check_types(self)
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if not 0 <= self.warmup_steps <= self.num_steps:
            raise ValueError(f"warmup_steps must be in [0, num_steps={self.num_steps}], got {self.warmup_steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.final_lr_ratio <= 1:
            raise ValueError(f"final_lr_ratio must be in [0, 1], got {self.final_lr_ratio}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")


def schedule(config: TrainConfig) -> optax.Schedule:
    """Learning rate at each step: linear warmup from 0, then cosine decay to the final ratio.

    >>> lr = schedule(TrainConfig(num_steps=100, warmup_steps=10, learning_rate=1e-3, final_lr_ratio=0.1))
    >>> [round(float(lr(s)), 6) for s in (0, 5, 10, 100)]
    [0.0, 0.0005, 0.001, 0.0001]
    """
    return optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, config.num_steps,
        config.learning_rate * config.final_lr_ratio,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm`` then AdamW on :func:`schedule`, weight decay masked to ``ndim >= 2`` leaves.

    >>> opt = make_optimizer(TrainConfig(num_steps=10, warmup_steps=2))
    >>> params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    >>> updates, _ = opt.update(params, opt.init(params), params)
    >>> float(jnp.abs(updates["w"]).max())  # step 0 of the warmup: learning rate 0
    0.0
    """
    adamw = optax.adamw(
        schedule(config), b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
        mask=lambda params: jax.tree.map(lambda x: x.ndim >= 2, params),
    )
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw) if config.clip_norm > 0 else adamw


def shift_right(labels: Array, start_id: int, pad_id: int) -> Array:
    """Decoder inputs from labels: ``[start, labels[:-1]]``, with padded labels (``< 0``) as ``pad_id``.

    >>> shift_right(jnp.array([[7, 8, 2, 1]]), start_id=2, pad_id=1).tolist()
    [[2, 7, 8, 2]]
    """
    labels = jnp.where(labels < 0, pad_id, labels)
    start = jnp.full(labels.shape[:-1] + (1,), start_id, labels.dtype)
    return jnp.concatenate([start, labels[..., :-1]], axis=-1)


def masked_cross_entropy(logits: Array, targets: Array, mask: Array) -> tuple[Array, dict[str, Array]]:
    """Mean cross-entropy of ``logits [B, T, V]`` against ``targets [B, T]`` over ``mask``; plus accuracy.

    >>> logits = jnp.log(jnp.array([[[0.5, 0.5], [0.9, 0.1]]]))
    >>> loss, m = masked_cross_entropy(logits, jnp.array([[0, 1]]), jnp.array([[True, False]]))
    >>> round(float(loss), 4), float(m["tokens"])
    (0.6931, 1.0)
    """
    targets = jnp.asarray(targets, jnp.int32)
    w = jnp.asarray(mask).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.maximum(targets, 0))
    n = jnp.sum(w)
    denom = jnp.maximum(n, 1.0)
    loss = jnp.sum(ce * w) / denom
    accuracy = jnp.sum((jnp.argmax(logits, axis=-1) == targets) * w) / denom
    return loss, {"loss": loss, "accuracy": accuracy, "tokens": n}


def _require(batch: Batch, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"{what} batch is missing key(s) {missing}; it has {sorted(batch)}")


def lm_loss(model, params: Any, batch: Batch, dropout_rng: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """Causal LM loss: logits at ``t`` predict ``input_ids[:, t + 1]``, weighted by ``loss_mask[:, t + 1]``."""
    _require(batch, _LM_KEYS, "LM")
    tokens = jnp.asarray(batch["input_ids"], jnp.int32)
    positions = positions_from_mask(batch["attention_mask"]) if "attention_mask" in batch else None
    logits = model(params, tokens, positions, dropout_rng=dropout_rng).logits
    mask = jnp.asarray(batch["loss_mask"], bool)[:, 1:]
    if positions is not None:  # a target must directly follow a real token
        mask = mask & (positions[:, :-1] >= 0) & (positions[:, 1:] == positions[:, :-1] + 1)
    return masked_cross_entropy(logits[:, :-1], tokens[:, 1:], mask)


def bart_loss(model, params: Any, batch: Batch,
              dropout_rng: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """Denoising loss: decoder logits at ``t`` are scored against ``labels[:, t]`` where ``loss_mask``."""
    _require(batch, _BART_KEYS, "BART")
    dec_mask = batch.get("decoder_attention_mask")
    positions = None if dec_mask is None else positions_from_mask(dec_mask)
    packed = {}
    if any(k in batch for k in _PACKED_KEYS):
        _require(batch, _PACKED_KEYS, "packed BART")
        segments = jnp.asarray(batch["decoder_segment_ids"], jnp.int32)
        positions = jnp.where(segments > 0, batch["decoder_position_ids"], -1)
        packed = {"encoder_positions": batch["position_ids"], "encoder_segment_ids": batch["segment_ids"],
                  "decoder_segment_ids": segments}
    logits = model(params, batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"], positions,
                   dropout_rng=dropout_rng, **packed).logits
    return masked_cross_entropy(logits, batch["labels"], batch["loss_mask"])


def loss_fn_for(model) -> Callable[..., tuple[Array, dict[str, Array]]]:
    """:func:`bart_loss` for encoder-decoders, :func:`lm_loss` otherwise."""
    return bart_loss if model.is_encoder_decoder else lm_loss


def _uses_dropout(model) -> bool:
    return model.config.dropout_rate > 0 or model.config.attention_dropout_rate > 0


def make_train_step(model, optimizer: optax.GradientTransformation, *, dropout: bool = True, donate: bool = False,
                    loss_fn: Callable | None = None, grad_accum: int = 1,
                    shardings: tuple[Any, Any, Any] | None = None, batch_fn: Callable | None = None) -> Callable:
    """Jitted ``(params, opt_state, batch, rng) -> (params, opt_state, metrics)``.

    Args:
      model: a :class:`~jaxsample.models.DecoderLM` or :class:`~jaxsample.models.Bart`.
      optimizer: e.g. :func:`make_optimizer`.
      dropout: apply the model's dropout (keyed by ``rng``); without dropout ``rng`` is unused.
      donate: donate ``params`` and ``opt_state`` buffers (in-place update on accelerators).
      loss_fn: ``(model, params, batch, dropout_rng) -> (loss, metrics)``; default :func:`loss_fn_for`.
      grad_accum: micro-batches per step (:func:`jaxsample.models.parallel.accumulated_grads`).
      shardings: ``(mesh, param_shardings, opt_state_shardings)`` to jit over a device mesh
        (:mod:`jaxsample.models.parallel`); default: a plain ``jax.jit``.
      batch_fn: ``batch -> batch`` run first inside the step (e.g. device noising of documents).

    ``metrics`` holds ``loss``, ``accuracy``, ``tokens`` (masked positions) and ``grad_norm``
    (before clipping), all float32 scalars left on device.
    """
    loss_fn = loss_fn_for(model) if loss_fn is None else loss_fn
    use_dropout = dropout and _uses_dropout(model)

    def objective(p, batch, rng):
        return loss_fn(model, p, batch, rng if use_dropout else None)

    def step(params, opt_state, batch, rng):
        batch = batch if batch_fn is None else batch_fn(batch)
        grads, metrics = _parallel.accumulated_grads(objective, params, batch, rng, grad_accum)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {**metrics, "grad_norm": optax.tree.norm(grads)}

    if shardings is None:
        return jax.jit(step, donate_argnums=(0, 1) if donate else ())
    return _parallel.shard_step(step, *shardings, donate)


def make_eval_step(model, loss_fn: Callable | None = None, shardings: tuple[Any, Any] | None = None) -> Callable:
    """Jitted ``(params, batch) -> metrics`` (``loss``, ``accuracy``, ``tokens``) without dropout.

    ``shardings``: ``(mesh, param_shardings)`` to run over a mesh like the train step.
    """
    loss_fn = loss_fn_for(model) if loss_fn is None else loss_fn

    def evaluate(params, batch):
        return loss_fn(model, params, batch, None)[1]

    if shardings is None:
        return jax.jit(evaluate)
    mesh, p_sh = shardings
    return jax.jit(evaluate, in_shardings=(p_sh, _parallel.batch_sharding(mesh)))


def evaluate_batches(eval_step: Callable, params: Any, batches: Iterable[Batch]) -> dict[str, float]:
    """Token-weighted mean ``loss`` / ``accuracy`` and total ``tokens`` of ``eval_step`` over ``batches``."""
    sums = {"loss": 0.0, "accuracy": 0.0, "tokens": 0.0}
    for metrics in [eval_step(params, b) for b in batches]:  # dispatch all, then read back
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        sums["loss"] += m["loss"] * m["tokens"]
        sums["accuracy"] += m["accuracy"] * m["tokens"]
        sums["tokens"] += m["tokens"]
    n = max(sums["tokens"], 1.0)
    return {"loss": sums["loss"] / n, "accuracy": sums["accuracy"] / n, "tokens": sums["tokens"]}


def _loop_step(model, config: TrainConfig, mesh=None, parallel: _parallel.ParallelConfig | None = None,
               batch_fn: Callable | None = None) -> Callable:
    """The donating step :func:`train` uses, cached so repeated runs of one setup compile once."""
    # neither the seed nor log_every is compiled in
    return _cached_step(model, dataclasses.replace(config, seed=0, log_every=1), mesh, parallel, batch_fn)


@functools.lru_cache(maxsize=8)
def _cached_step(model, config: TrainConfig, mesh, parallel, batch_fn) -> Callable:
    optimizer = make_optimizer(config)
    if mesh is None:
        return make_train_step(model, optimizer, dropout=config.dropout, donate=True, batch_fn=batch_fn)
    shardings = (mesh, *_parallel.state_shardings_of(model, optimizer, mesh, parallel))
    return make_train_step(model, optimizer, dropout=config.dropout, donate=True, grad_accum=parallel.grad_accum,
                           shardings=shardings, batch_fn=batch_fn)


class TrainResult(NamedTuple):
    """Output of :func:`train`."""

    params: Any
    opt_state: Any
    step: int  # steps completed (``start_step`` + steps run)
    history: dict[str, np.ndarray]  # per step: "step", "loss", "accuracy", "tokens", "grad_norm", "learning_rate"
    seconds: float  # wall time of the loop, first step (compilation) included
    evals: list[dict[str, float]] = []  # per evaluation: "step", "loss", "accuracy", "tokens"
    stopped_early: bool = False  # early stopping ended the run before ``num_steps``


class NonFiniteLossError(FloatingPointError, ValueError):
    """Training produced a NaN or infinite loss (or gradient norm); nothing after it was saved."""


def _check_finite(row: dict[str, float]) -> None:
    for name in ("loss", "grad_norm"):
        if name in row and not np.isfinite(row[name]):
            raise NonFiniteLossError(
                f"training stopped: {name} is {row[name]} at step {row['step']} (learning rate "
                f"{row['learning_rate']:.3g}); no checkpoint was written from this step on. Lower "
                "train.learning_rate, enable train.clip_norm or check the data"
            )


def train(
    model,
    params: Any,
    batches: Iterable[Batch],
    config: TrainConfig,
    *,
    opt_state: Any = None,
    start_step: int = 0,
    callback: Callable[[int, dict[str, float]], None] | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 0,
    mesh=None,
    parallel: _parallel.ParallelConfig | None = None,
    evaluate: Callable[[Any], dict[str, float]] | None = None,
    eval_every: int = 0,
    early_stopping: int = 0,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
    data_state: Callable[[], Any] | None = None,
    best_eval: float | None = None,
    keep_checkpoints: int | None = None,
    checkpoint_metadata: dict | None = None,
    batch_fn: Callable | None = None,
) -> TrainResult:
    """Runs the jitted step from ``start_step`` to ``config.num_steps`` (or until ``batches`` runs out).

    Args:
      params: initial parameters (not modified: the loop donates its own copy).
      batches: iterable of batch dicts (see the module docstring); consumed one per step. With a
        ``mesh`` these are this host's rows of the global batch.
      opt_state: resume from this optimizer state (default: a fresh one).
      start_step: first step index (schedule position and dropout key); use with ``opt_state``.
      callback: ``callback(step, metrics)`` every ``config.log_every`` steps and after the last,
        ``metrics`` being host floats of that step (``step`` counts completed steps).
      checkpoint_dir, checkpoint_every: save params, optimizer state and config with orbax every
        ``checkpoint_every`` steps and at the end (see :mod:`jaxsample.models.checkpoint`), with
        ``checkpoint_metadata`` (e.g. the tokenizer's sha256), ``best_eval`` and ``data_state()``.
      mesh, parallel: run sharded over ``mesh`` (default :func:`~jaxsample.models.parallel.make_mesh`
        when only ``parallel`` is given) with :class:`~jaxsample.models.parallel.ParallelConfig`.
      evaluate: ``evaluate(params) -> {"loss", "accuracy", ...}`` (held-out data), called every
        ``eval_every`` steps and after the last step; results go to ``on_eval(step, metrics)`` and
        :attr:`TrainResult.evals`.
      early_stopping: stop after this many evaluations in a row without a lower held-out loss than
        ``best_eval`` (the best so far; carried across resumes); 0 disables.
      data_state: returns the data iterator's state after the batches consumed so far (saved in
        each checkpoint so a resumed run continues with exactly the next batch).
      keep_checkpoints: keep only the newest this many checkpoints (``None``: all).
      batch_fn: ``batch -> batch`` applied inside the jitted step before the loss (a hashable
        callable, e.g. device noising: ``batches`` then yields what it consumes).

    Returns:
      :class:`TrainResult`; metrics are only copied to the host every ``log_every`` steps, so the
      device runs ahead of Python in between.

    Raises:
      NonFiniteLossError: (a ``ValueError``) at the first host sync that sees a NaN or infinite
        loss or gradient norm; no checkpoint holds parameters from that step on.
    """
    if early_stopping < 0 or eval_every < 0 or checkpoint_every < 0:
        raise ValueError("early_stopping, eval_every and checkpoint_every must be >= 0")
    if early_stopping and not (evaluate and eval_every):
        raise ValueError("early_stopping needs evaluate and eval_every")
    if parallel is not None and mesh is None:
        mesh = _parallel.make_mesh()
    if mesh is not None and parallel is None:
        parallel = _parallel.ParallelConfig()
    optimizer = make_optimizer(config)
    step_fn = _loop_step(model, config, mesh, parallel, batch_fn)
    if mesh is None:
        params = jax.tree.map(jnp.copy, params)
        opt_state = optimizer.init(params) if opt_state is None else jax.tree.map(jnp.copy, opt_state)
    else:
        p_sh, o_sh = _parallel.state_shardings_of(model, optimizer, mesh, parallel)
        params = _parallel.place(params, p_sh)
        opt_state = (jax.jit(optimizer.init, out_shardings=o_sh)(params) if opt_state is None
                     else _parallel.place(opt_state, o_sh))
    lr = schedule(config)
    base = jax.random.key(config.seed)
    pending: list[dict[str, Array]] = []
    rows: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    step = start_step
    stale = 0

    def flush():
        host = jax.device_get(pending)
        for i, m in enumerate(host):
            s = step - len(host) + i
            rows.append({"step": s, **{k: float(v) for k, v in m.items()}, "learning_rate": float(lr(s))})
            _check_finite(rows[-1])
        pending.clear()
        if callback is not None and host:
            callback(step, rows[-1])

    def run_eval() -> None:
        nonlocal best_eval, stale
        metrics = {"step": step, **evaluate(params)}
        evals.append(metrics)
        if best_eval is None or metrics["loss"] < best_eval:
            best_eval, stale = metrics["loss"], 0
        else:
            stale += 1
        if on_eval is not None:
            on_eval(step, metrics)

    def save() -> None:
        flush()  # a non-finite loss stops training before its parameters are saved
        metadata = {**(checkpoint_metadata or {}), "best_eval": best_eval}
        if data_state is not None:
            metadata["data_state"] = data_state()
        _checkpoint.save(checkpoint_dir, step, params, model.config, opt_state=opt_state, metadata=metadata,
                         max_to_keep=keep_checkpoints)

    start = time.perf_counter()
    stream = iter(batches)
    stopped = False
    while step < config.num_steps:
        batch = next(stream, None)
        if batch is None:
            break
        if mesh is not None:
            batch = _parallel.global_batch(batch, mesh)
        params, opt_state, metrics = step_fn(params, opt_state, batch, jax.random.fold_in(base, step))
        pending.append(metrics)
        step += 1
        if (step - start_step) % config.log_every == 0:
            flush()
        if evaluate is not None and eval_every and step % eval_every == 0:
            run_eval()
        if checkpoint_dir and checkpoint_every and step % checkpoint_every == 0:
            save()
        if early_stopping and stale >= early_stopping:
            stopped = True
            break
    flush()
    if evaluate is not None and step > start_step and not (evals and evals[-1]["step"] == step):
        run_eval()
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    if checkpoint_dir and step > start_step and not (checkpoint_every and step % checkpoint_every == 0):
        save()
    keys = rows[0].keys() if rows else ("step", "loss", "accuracy", "tokens", "grad_norm", "learning_rate")
    history = {k: np.asarray([r[k] for r in rows], np.int64 if k == "step" else np.float64) for k in keys}
    return TrainResult(params, opt_state, step, history, seconds, evals, stopped)
