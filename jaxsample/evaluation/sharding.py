"""Data-parallel evaluation over devices and hosts, with outputs independent of the device count.

Rows are cut into **blocks** of ``per_device_batch_size`` consecutive rows; block ``k`` is always
one per-device batch, whatever the number of devices. A step decodes ``D`` blocks (``D`` devices
in all); with ``P`` processes (hosts) of ``L = D / P`` local devices each, host ``h`` owns device
slots ``h * L .. h * L + L - 1`` and therefore blocks ``s * D + h * L + j`` of step ``s``
(:class:`RowPlan`). Since every device runs the same program on the same block contents, a row's
outputs are bit-identical for 1 or 8 devices, for the mesh and the pmap path, and for any host
count. Rows past the end are filled with copies of row 0 (row index ``-1``) and dropped.

Each host computes its blocks on its local devices (:class:`DataParallel`), either with
``jax.jit`` of a ``shard_map`` over a one-axis ``Mesh`` (inputs placed with ``NamedSharding``) or
with ``jax.pmap``; the per-device function is the same in both. Hosts then gather the per-row
results (``multihost_utils.process_allgather``, only when ``P > 1``), so process 0 can write them.
Randomness is per row (``fold_in`` of the global row index, see :func:`row_keys`), never per device.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"


class RowPlan(NamedTuple):
    """Which rows each host evaluates, step by step (see the module docstring)."""

    rows: int  # R: rows in all
    block: int  # rows per device per step
    devices: int  # D: devices over all hosts
    process_index: int = 0
    process_count: int = 1

    @property
    def local_devices(self) -> int:
        return self.devices // self.process_count

    @property
    def steps(self) -> int:
        return max(1, -(-self.rows // (self.block * self.devices)))

    def local_rows(self) -> np.ndarray:
        """``int64[steps, L * block]``: global row index of each local slot per step (``-1`` = padding).

        >>> RowPlan(rows=10, block=2, devices=4, process_index=1, process_count=2).local_rows().tolist()
        [[4, 5, 6, 7], [-1, -1, -1, -1]]
        """
        h = self.process_index
        s = np.arange(self.steps)[:, None, None]
        slot = h * self.local_devices + np.arange(self.local_devices)[None, :, None]
        rows = ((s * self.devices + slot) * self.block + np.arange(self.block)).reshape(self.steps, -1)
        return np.where(rows < self.rows, rows, -1)


def make_plan(rows: int, block: int, devices: int | None = None) -> RowPlan:
    """The plan of this process: ``devices`` defaults to ``jax.device_count()``."""
    if jax.device_count() % jax.process_count():
        raise ValueError("every process must have the same number of local devices")
    return RowPlan(rows, block, devices or jax.device_count(), jax.process_index(), jax.process_count())


def row_keys(seed: int | jax.Array, rows: jax.Array, num: int | None = None) -> jax.Array:
    """Sampler seeds of global rows ``rows int32[B]``: 31 bits of ``fold_in(key(seed), row)``.

    With ``num``, ``int32[B, num]`` seeds of ``num`` independent samples per row (one more
    ``fold_in`` of the sample index). Padding rows (``< 0``) get row 0's seeds. A row's seeds depend
    only on ``seed`` and its index, never on its device, step or batch.
    """
    base = jax.random.key(seed)

    def one(r):
        key = jax.random.fold_in(base, jnp.maximum(r, 0))
        if num is None:
            return jax.random.bits(key, dtype=jnp.uint32) >> 1
        return jax.vmap(lambda j: jax.random.bits(jax.random.fold_in(key, j), dtype=jnp.uint32) >> 1)(jnp.arange(num))

    return jax.vmap(one)(rows).astype(jnp.int32)


class Timing(NamedTuple):
    compile_seconds: float
    run_seconds: float


class DataParallel:
    """Runs a per-device function over the local blocks of a :class:`RowPlan`.

    ``fn(shared, local) -> outputs``: ``shared`` is a pytree replicated on every device (model
    parameters, sampler values), ``local`` a dict of ``[block, ...]`` arrays, ``outputs`` a pytree of
    ``[block, ...]`` arrays. It is traced once per (key, shapes) and reused across calls.

    Args:
      mode: ``"mesh"`` (``jax.jit`` + ``jax.shard_map`` over ``Mesh(devices, ("data",))``) or ``"pmap"``.
      devices: the local devices to use (default: all of this process's).
    """

    _instances: dict = {}

    def __init__(self, mode: str = "mesh", devices: list | None = None):
        if mode not in ("mesh", "pmap"):
            raise ValueError(f"mode must be mesh or pmap, got {mode!r}")
        self.mode = mode
        self.devices = list(devices) if devices is not None else jax.local_devices()
        self.mesh = Mesh(np.asarray(self.devices), (AXIS,))
        self._compiled: dict = {}

    @classmethod
    def shared_instance(cls, mode: str = "mesh", devices: list | None = None) -> "DataParallel":
        """One executor per ``(mode, devices)`` in this process, so repeated evaluations reuse compilations."""
        devices = list(devices) if devices is not None else jax.local_devices()
        key = (mode, tuple(devices))
        if key not in cls._instances:
            cls._instances[key] = cls(mode, devices)
        return cls._instances[key]

    def _executable(self, key: Any, fn: Callable, shared, local) -> tuple[Callable, float]:
        shapes = lambda tree: tuple((np.shape(x), str(np.result_type(x))) for x in jax.tree.leaves(tree))  # noqa: E731
        cache_key = (key, jax.tree.structure(shared), shapes(shared), jax.tree.structure(local), shapes(local))
        if cache_key in self._compiled:
            return self._compiled[cache_key], 0.0
        start = time.perf_counter()
        if self.mode == "mesh":
            rows, everywhere = NamedSharding(self.mesh, PartitionSpec(AXIS)), NamedSharding(self.mesh, PartitionSpec())
            mapped = jax.shard_map(fn, mesh=self.mesh, in_specs=(PartitionSpec(), PartitionSpec(AXIS)),
                                   out_specs=PartitionSpec(AXIS), check_vma=False)
            jitted = jax.jit(mapped, in_shardings=(everywhere, rows), out_shardings=rows)
        else:
            jitted = jax.pmap(fn, axis_name=AXIS, in_axes=(None, 0), devices=self.devices)
        compiled = jitted.lower(shared, self._place(local)).compile()
        self._compiled[cache_key] = compiled
        return compiled, time.perf_counter() - start

    def _place(self, arrays: dict[str, np.ndarray]) -> dict:
        if self.mode == "pmap":  # a leading device axis
            arrays = {k: v.reshape((len(self.devices), -1) + v.shape[1:]) for k, v in arrays.items()}
        return jax.device_put(arrays, NamedSharding(self.mesh, PartitionSpec(AXIS)))

    def shared(self, tree: Any) -> Any:
        """Places ``tree`` replicated on the local devices (a no-op for arrays already there)."""
        return jax.device_put(tree, NamedSharding(self.mesh, PartitionSpec()))

    def run(self, key: Any, fn: Callable, shared: Any, rows: dict[str, np.ndarray], plan: RowPlan,
            ) -> tuple[dict[str, np.ndarray], Timing]:
        """Applies ``fn`` to every block of this host and returns ``{name: [R, ...]}`` for *all* rows.

        Args:
          key: hashable identity of ``fn``'s static configuration (compilation cache key).
          rows: ``{name: [R, ...]}`` host arrays for every row (hosts read the same rows).
          plan: from :func:`make_plan`; ``plan.local_devices`` must equal the devices used here.

        Returns:
          ``(outputs, timing)``; on multi-host runs every host receives every row's outputs.
        """
        if plan.local_devices != len(self.devices):
            raise ValueError(f"plan has {plan.local_devices} local devices, this runner {len(self.devices)}")
        shared = self.shared(shared)  # a no-op for arrays already placed (model parameters)
        index = plan.local_rows()
        batches = [{**{k: v[np.maximum(i, 0)] for k, v in rows.items()}, "row": i.astype(np.int32)} for i in index]
        compiled, compile_seconds = self._executable(key, fn, shared, batches[0])
        start = time.perf_counter()
        pieces = [compiled(shared, self._place(batch)) for batch in batches]
        pieces = jax.device_get(pieces)  # waits for the devices
        run_seconds = time.perf_counter() - start
        flat = jax.tree.map(lambda *xs: np.concatenate([x.reshape((-1,) + x.shape[(2 if self.mode == "pmap" else 1):])
                                                        for x in xs]), *pieces)
        return _gather(flat, index.reshape(-1), plan), Timing(compile_seconds, run_seconds)


def _gather(local: Any, index: np.ndarray, plan: RowPlan) -> Any:
    """Global ``[R, ...]`` outputs from this host's ``[steps * L * block, ...]`` slots (all hosts')."""
    if plan.process_count > 1:
        from jax.experimental import multihost_utils

        local, index = multihost_utils.process_allgather((local, index))
        local = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), local)
        index = index.reshape(-1)
    keep = index >= 0

    def place(x):
        out = np.zeros((plan.rows,) + x.shape[1:], x.dtype)
        out[index[keep]] = x[keep]
        return out

    return jax.tree.map(place, local)
