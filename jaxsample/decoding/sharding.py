"""Data-parallel decoding over a mesh, with no sharding written by the caller.

Given ``mesh=`` (a ``jax.sharding.Mesh``), or a prompt already sharded over a mesh of several
devices, a strategy places every batch-leading input (prompt, lengths, per-row sampler values,
stopping rules, a given cache) with ``NamedSharding(mesh, PartitionSpec(<all mesh axes>))`` (the
batch split over every device), replicates model parameters that are not on the mesh yet (sharded
ones are left as they are), and constrains the cache it builds the same way. XLA then partitions
the whole decode loop along the batch: each device decodes ``B / devices`` rows, and the outputs
come back sharded the same way. Rows are independent, so the tokens equal those of one device.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxsample.decoding import _stopping


def find_mesh(mesh: Any, prompt: Any) -> Mesh | None:
    """``mesh`` if given, else the mesh ``prompt`` is sharded over (when it spans several devices)."""
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        return mesh
    if not isinstance(prompt, jax.Array) or isinstance(prompt, jax.core.Tracer):
        return None
    found = prompt.sharding
    if isinstance(found, NamedSharding) and found.mesh.size > 1:
        return found.mesh
    return None


def batch_sharding(mesh: Mesh | None, batch: int) -> NamedSharding | None:
    """The batch-leading sharding over every axis of ``mesh`` (``None`` without a mesh)."""
    if mesh is None:
        return None
    if batch % mesh.size:
        raise ValueError(
            f"the batch ({batch} rows) must be divisible by the mesh's {mesh.size} devices for data-parallel "
            "decoding: pad the batch with dummy rows"
        )
    return NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))


def constrain(tree: Any, sharding: NamedSharding | None, batch: int | None = None) -> Any:
    """``with_sharding_constraint`` of every leaf (with ``batch``: of leaves whose leading axis has that size).

    Inside ``jit``; identity without a mesh. Applied to the loop state on entry and after each step,
    so that XLA keeps the whole loop partitioned along the batch.
    """
    if sharding is None:
        return tree

    def one(x):
        if x.ndim == 0 or (batch is not None and x.shape[0] != batch):
            return x
        return jax.lax.with_sharding_constraint(x, sharding)

    return jax.tree.map(one, tree)


def _put(tree: Any, sharding: NamedSharding) -> Any:
    return jax.tree.map(lambda x: jax.device_put(x, sharding) if getattr(x, "ndim", 0) else x, tree)


def replicate(params: Any, sharding: NamedSharding | None) -> Any:
    """Model parameters on the mesh: leaves already placed on it are kept, the others replicated."""
    if sharding is None:
        return params
    full = NamedSharding(sharding.mesh, PartitionSpec())

    def one(x):
        s = getattr(x, "sharding", None)
        if isinstance(x, jax.core.Tracer) or (isinstance(s, NamedSharding) and s.mesh == sharding.mesh):
            return x
        return jax.device_put(x, full)

    return jax.tree.map(one, params)


def place(req):
    """A :class:`~jaxsample.decoding.loop.Request` with its batch-leading arrays sharded over the mesh."""
    s = req.cfg.batch_sharding
    shared = {name for name, spec in req.sampler.param_specs().items() if spec.shared}
    sparams = {
        k: replicate(v, s) if k in shared else _put(v, s) for k, v in req.sampler_params.items()
    }
    return req._replace(
        prompt=_put(req.prompt, s),
        lengths=_put(req.lengths, s),
        sampler_params=sparams,
        stops=_stopping.map_rows(req.stops, lambda x: _put(x, s)),
        cache=None if req.cache is None else _put(req.cache, s),
    )


def place_rows(tree: Any, sharding: NamedSharding | None) -> Any:
    """Per-row (batch-leading) arrays of a strategy placed like the batch (identity without a mesh)."""
    return tree if sharding is None else _put(tree, sharding)
