"""Sharded training: a device mesh, data parallelism or FSDP, gradient accumulation.

One mesh axis, ``"data"``, spans every device of every host. Batches are always split along it
(each device holds ``global_batch / devices`` rows). Parameters and optimizer state are either

- ``mode="data"``: replicated on every device (classic data parallelism; gradients are all-reduced),
- ``mode="fsdp"``: split along the same axis (ZeRO-3 / MaxText's ``fsdp``): every array with at least
  ``fsdp_min_size`` elements is sharded on its largest dimension divisible by the device count, the
  rest are replicated. XLA inserts the all-gathers before use and the reduce-scatters of gradients.

The rule depends only on an array's shape, so an optimizer state leaf (AdamW's ``mu``/``nu``) gets the
sharding of its parameter. The step is one ``jax.jit`` with ``NamedSharding`` in/out shardings
(GSPMD): the same program runs on one CPU, eight simulated devices or a TPU pod slice, and gives the
same losses up to float reassociation of the reductions.

Gradient accumulation splits a global batch ``[B, ...]`` into ``grad_accum`` micro-batches of
``B / grad_accum`` rows (row ``r`` goes to micro-batch ``r % grad_accum``, so every device keeps its
rows: no communication) and sums their gradients in a ``lax.scan``. Each micro-batch's loss is
weighted by its share of the batch's loss tokens, so the accumulated gradient is the gradient of the
full batch's token-weighted mean loss, whatever the split.

Mixed precision: ``ModelConfig.dtype="bfloat16"`` computes in bfloat16 while parameters, gradients
and optimizer state stay float32 (the master weights); the loss is always float32.

>>> import jax
>>> mesh = make_mesh()
>>> spec = param_spec((512, 128), ParallelConfig(mode="fsdp", fsdp_min_size=1), mesh.shape["data"])
>>> spec == (jax.sharding.PartitionSpec("data") if jax.device_count() > 1 else jax.sharding.PartitionSpec())
True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Array = jax.Array
AXIS = "data"
MODES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How a train step is spread over devices (see the module docstring).

    Attributes:
      mode: ``"data"`` (replicated parameters) or ``"fsdp"`` (parameters and optimizer state sharded).
      grad_accum: micro-batches per step; the global batch must be divisible by
        ``grad_accum * devices``.
      fsdp_min_size: arrays with fewer elements stay replicated under FSDP (biases, norms).
    """

    mode: str = "data"
    grad_accum: int = 1
    fsdp_min_size: int = 4096

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"parallel.mode must be one of {MODES}, got {self.mode!r}")
        for name in ("grad_accum", "fsdp_min_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"parallel.{name} must be an integer >= 1, got {value!r}")


def make_mesh(devices: list | None = None) -> Mesh:
    """A one-axis (``"data"``) mesh over ``devices`` (default: every device of every host)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (AXIS,))


def param_spec(shape: tuple[int, ...], parallel: ParallelConfig, n: int) -> PartitionSpec:
    """The partition of an array of ``shape`` on ``n`` devices: FSDP shards the largest dimension
    divisible by ``n`` (first one on ties) of arrays with ``>= fsdp_min_size`` elements."""
    if parallel.mode != "fsdp" or n == 1 or math.prod(shape) < parallel.fsdp_min_size:
        return PartitionSpec()
    candidates = [d for d in range(len(shape)) if shape[d] % n == 0]
    if not candidates:
        return PartitionSpec()
    d = max(candidates, key=lambda i: (shape[i], -i))
    return PartitionSpec(*([None] * d + [AXIS]))


def state_shardings(tree: Any, mesh: Mesh, parallel: ParallelConfig) -> Any:
    """``NamedSharding`` for every array leaf of ``tree`` (parameters or optimizer state)."""
    n = mesh.shape[AXIS]
    return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(tuple(np.shape(x)), parallel, n)), tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over the ``"data"`` axis."""
    return NamedSharding(mesh, PartitionSpec(AXIS))


def check_batch_size(global_batch: int, mesh: Mesh, parallel: ParallelConfig) -> None:
    """Raises ``ValueError`` unless ``global_batch`` splits into whole micro-batches on every device."""
    n = mesh.shape[AXIS] * parallel.grad_accum
    if global_batch % n:
        raise ValueError(f"batch_size {global_batch} must be divisible by devices ({mesh.shape[AXIS]}) x "
                         f"parallel.grad_accum ({parallel.grad_accum}) = {n}")


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This host's rows -> global ``jax.Array``s split over the mesh (``make_array_from_process_local_data``).

    Every host passes its own ``[B / process_count, ...]`` slice (``wakong.reader.batches`` with the
    host's ``process_index``); the result is the ``[B, ...]`` batch the jitted step consumes.
    """
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def accumulated_grads(objective: Callable, params: Any, batch: Mapping[str, Array], rng, grad_accum: int,
                      weight_key: str = "loss_mask") -> tuple[Any, dict]:
    """Gradient of ``objective(params, batch, rng) -> (mean loss, metrics)`` over ``grad_accum`` micro-batches.

    Equals ``jax.grad`` of the whole batch's token-weighted mean (up to float reassociation). Metrics
    ``loss``/``accuracy`` are token-weighted means and ``tokens`` the sum over the whole batch.
    """
    grad_fn = jax.value_and_grad(objective, has_aux=True)
    if grad_accum == 1:
        (_, metrics), grads = grad_fn(params, batch, rng)
        return grads, metrics
    total = jnp.maximum(jnp.sum(jnp.asarray(batch[weight_key], jnp.float32)), 1.0)

    def split(x):  # row r -> micro-batch r % grad_accum, keeping each device's rows local
        x = jnp.asarray(x)
        return jnp.moveaxis(x.reshape((x.shape[0] // grad_accum, grad_accum) + x.shape[1:]), 1, 0)

    micro = {k: split(v) for k, v in batch.items()}

    def weighted(p, mb, key):
        loss, metrics = objective(p, mb, key)
        share = metrics["tokens"] / total
        return loss * share, metrics

    weighted_grad = jax.value_and_grad(weighted, has_aux=True)

    def body(carry, xs):
        grads, sums = carry
        i, mb = xs
        (_, m), g = weighted_grad(params, mb, None if rng is None else jax.random.fold_in(rng, i))
        sums = {"loss": sums["loss"] + m["loss"] * m["tokens"], "accuracy": sums["accuracy"] + m["accuracy"] * m["tokens"],
                "tokens": sums["tokens"] + m["tokens"]}
        return (jax.tree.map(jnp.add, grads, g), sums), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    init = {k: jnp.zeros((), jnp.float32) for k in ("loss", "accuracy", "tokens")}
    (grads, sums), _ = jax.lax.scan(body, (zeros, init), (jnp.arange(grad_accum), micro))
    n = jnp.maximum(sums["tokens"], 1.0)
    return grads, {"loss": sums["loss"] / n, "accuracy": sums["accuracy"] / n, "tokens": sums["tokens"]}


def shard_step(step: Callable, mesh: Mesh, param_shardings: Any, opt_shardings: Any, donate: bool) -> Callable:
    """``jax.jit`` of ``step(params, opt_state, batch, rng)`` with the mesh's in/out shardings."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step, in_shardings=(param_shardings, opt_shardings, batch_sharding(mesh), replicated),
                   out_shardings=(param_shardings, opt_shardings, replicated),
                   donate_argnums=(0, 1) if donate else ())


def state_shardings_of(model, optimizer: optax.GradientTransformation, mesh: Mesh,
                       parallel: ParallelConfig) -> tuple[Any, Any]:
    """``(param_shardings, opt_state_shardings)`` of ``model``'s parameters and ``optimizer``'s state."""
    abstract = jax.eval_shape(model.init, jax.random.key(0))
    return (state_shardings(abstract, mesh, parallel),
            state_shardings(jax.eval_shape(optimizer.init, abstract), mesh, parallel))


def init_sharded(model, rng, mesh: Mesh, parallel: ParallelConfig) -> Any:
    """``model.init(rng)`` created directly in its shardings (no host holds a full FSDP copy)."""
    abstract = jax.eval_shape(model.init, rng)
    return jax.jit(model.init, out_shardings=state_shardings(abstract, mesh, parallel))(rng)


def place(tree: Any, shardings: Any) -> Any:
    """``tree`` (host or device arrays, identical on every host) moved to ``shardings``."""
    return jax.jit(lambda t: t, out_shardings=shardings)(tree)
