"""Orbax checkpoints: parameters (+ optional optimizer state), the model config and the step.

Layout: ``<directory>/<step>/{params, opt_state, config, metadata}`` written by an
``orbax.checkpoint.CheckpointManager``. Saves are atomic: orbax writes into a temporary
``<step>.orbax-checkpoint-tmp-*`` directory, drops ``commit_success.txt`` into it when every item
is written and only then renames it to ``<step>``. Only step directories holding that marker count
as checkpoints here, so an interrupted save (or a non-atomic copy of one) is never restored.

Restores build the target pytree from the config (``jax.eval_shape`` of ``model.init``), so
parameters come back in exactly the structure, shapes and dtypes the model expects, and a
checkpoint written for a different config is rejected with the differing fields named. A
checkpoint whose files are truncated or corrupt raises :class:`CheckpointError` (a ``ValueError``)
naming the step directory and the item, in one line. ``metadata`` is free JSON saved with the
step (the training job records the tokenizer's sha256 there, which evaluation checks).

>>> import tempfile, jax
>>> from jaxsample.models import get_config, make_model
>>> cfg = get_config("decoder", "tiny", d_model=32, d_ff=64, num_layers=1)
>>> d = tempfile.mkdtemp()
>>> _ = save(d, 7, make_model(cfg).init(jax.random.key(0)), cfg)
>>> ckpt = restore(d, cfg)
>>> ckpt.step, ckpt.config == cfg
(7, True)
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import optax
import orbax.checkpoint as ocp

from jaxsample.models.configs import ModelConfig, config_diff, config_from_dict

_COMMITTED = "commit_success.txt"


class Checkpoint(NamedTuple):
    """A restored checkpoint."""

    params: Any
    config: ModelConfig
    step: int
    opt_state: Any  # None unless requested
    metadata: dict = {}  # what save() was given as metadata ({} for checkpoints saved without)


class CheckpointError(ValueError):
    """A checkpoint's files cannot be read (truncated, corrupt, or not an orbax checkpoint)."""


def _unreadable(path: str, items: list[str], err: Exception) -> CheckpointError:
    reason = " ".join(str(err).split())
    reason = reason if len(reason) <= 300 else reason[:297] + "..."
    where = ", ".join(os.path.join(path, item) for item in items)
    return CheckpointError(f"checkpoint {where} is truncated or corrupt ({type(err).__name__}: {reason})")


def _manager(directory: str, max_to_keep: int | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def steps(directory: str) -> list[int]:
    """Steps with a complete (committed) checkpoint in ``directory``, ascending."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        if name.isdigit() and os.path.isfile(os.path.join(directory, name, _COMMITTED)):
            found.append(int(name))
    return sorted(found)


def latest_step(directory: str) -> int | None:
    """The newest complete checkpoint's step, or ``None``."""
    found = steps(directory)
    return found[-1] if found else None


def save(directory: str, step: int, params: Any, config: ModelConfig, *, opt_state: Any = None,
         max_to_keep: int | None = None, metadata: dict | None = None) -> str:
    """Writes ``params`` (and ``opt_state``) with ``config`` as checkpoint ``step``; returns its path.

    Parameters may be sharded ``jax.Array``s spanning several hosts: every process must call ``save``
    (each writes its shards); ``metadata`` is written by process 0.

    Args:
      max_to_keep: keep only the newest ``max_to_keep`` checkpoints (``None`` keeps all).
      metadata: JSON-able dict saved with the step (:func:`read_metadata`, ``Checkpoint.metadata``).

    Raises:
      ValueError: if ``step`` is negative or already saved in ``directory``.
    """
    step = int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step in steps(directory):
        raise ValueError(f"checkpoint step {step} already exists in {directory}")
    items = {"params": ocp.args.StandardSave(params), "config": ocp.args.JsonSave(config.to_dict())}
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardSave(opt_state)
    if metadata is not None:
        items["metadata"] = ocp.args.JsonSave(dict(metadata))
    with _manager(directory, max_to_keep) as manager:
        manager.save(step, args=ocp.args.Composite(**items), force=True)
        manager.wait_until_finished()
    return os.path.join(os.path.abspath(directory), str(step))


def _abstract(tree: Any) -> Any:
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # addressable on every host
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)
                                                       or sharding), tree)


def check_config(directory: str, config: ModelConfig | None = None, *,
                 step: int | None = None) -> tuple[ModelConfig, int]:
    """``(saved config, step)`` of a checkpoint (default: the latest), without reading its arrays.

    Raises:
      FileNotFoundError: no complete checkpoint (at ``step``) in ``directory``.
      ValueError: ``config`` is given and differs from the saved one (the message lists the fields).
    """
    available = steps(directory)
    if not available:
        raise FileNotFoundError(f"no complete checkpoint in {directory}")
    step = available[-1] if step is None else int(step)
    if step not in available:
        raise FileNotFoundError(f"no complete checkpoint for step {step} in {directory}; available: {available}")
    meta = _restore_json(directory, step, "config")
    try:
        saved = config_from_dict(meta)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise _unreadable(os.path.join(os.path.abspath(directory), str(step)), ["config"], err) from None
    if config is not None and saved != config:
        diff = ", ".join(f"{k}: saved {a!r} != expected {b!r}" for k, (a, b) in config_diff(saved, config).items())
        raise ValueError(f"checkpoint {directory}/{step} was written for a different model config ({diff})")
    return saved, step


def _restore_json(directory: str, step: int, item: str) -> Any:
    try:
        with _manager(directory) as manager:
            return getattr(manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()})), item)
    except Exception as err:  # orbax raises assorted errors for damaged files
        raise _unreadable(os.path.join(os.path.abspath(directory), str(step)), [item], err) from None


def _damaged(directory: str, step: int, items: dict) -> list[str]:
    """The items that fail to restore on their own (all of them if none does alone)."""
    bad = []
    for name, args in items.items():
        try:
            with _manager(directory) as manager:
                manager.restore(step, args=ocp.args.Composite(**{name: args}))
        except Exception:
            bad.append(name)
    return bad or sorted(items)


def read_metadata(directory: str, step: int | None = None) -> dict:
    """The ``metadata`` saved with a checkpoint (default: the latest); ``{}`` if it was saved without."""
    _, step = check_config(directory, step=step)
    if not os.path.isdir(os.path.join(directory, str(step), "metadata")):
        return {}
    return _restore_json(directory, step, "metadata")


def restore(
    directory: str,
    config: ModelConfig | None = None,
    *,
    step: int | None = None,
    optimizer: optax.GradientTransformation | None = None,
    params_like: Any = None,
    opt_state_like: Any = None,
) -> Checkpoint:
    """Loads a checkpoint, verifying it was written for ``config``.

    Args:
      config: the expected config; ``None`` accepts whatever the checkpoint holds.
      step: which step (default: the latest complete one).
      optimizer: also restore the optimizer state, shaped like ``optimizer.init(params)``.
      params_like: abstract target (``jax.ShapeDtypeStruct`` leaves, possibly with shardings) to
        restore into; default: single-device arrays shaped like the model's parameters. Any mesh
        works, whatever the mesh the checkpoint was written from.
      opt_state_like: the same for the optimizer state (default: single-device arrays).

    Raises:
      FileNotFoundError: no complete checkpoint (at ``step``) in ``directory``.
      ValueError: the saved config differs from ``config`` (the message lists the fields), or the
        optimizer state was requested but not saved.
      CheckpointError: the checkpoint's files are truncated or corrupt (one line naming them).
    """
    from jaxsample.models import make_model

    saved, step = check_config(directory, config, step=step)
    metadata = read_metadata(directory, step)
    if params_like is None:
        params_like = jax.eval_shape(make_model(saved).init, jax.random.key(0))
    params_like = _abstract(params_like)
    items = {"params": ocp.args.StandardRestore(params_like)}
    if optimizer is not None:
        if not os.path.isdir(os.path.join(directory, str(step), "opt_state")):
            raise ValueError(f"checkpoint {directory}/{step} has no optimizer state")
        if opt_state_like is None:
            opt_state_like = jax.eval_shape(optimizer.init, params_like)
        items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state_like))
    try:
        with _manager(directory) as manager:
            restored = manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as err:  # orbax/tensorstore raise assorted errors for truncated or damaged files
        raise _unreadable(os.path.join(os.path.abspath(directory), str(step)), _damaged(directory, step, items),
                          err) from None
    opt_state = restored.opt_state if optimizer is not None else None
    return Checkpoint(restored.params, saved, step, opt_state, metadata)


def tokenizer_metadata(tokenizer) -> dict:
    """What a checkpoint records about the tokenizer it was trained with (its content hash and size)."""
    return {"sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size}


def check_tokenizer(metadata: dict, tokenizer, checkpoint: str, dataset: str) -> None:
    """Refuses data built with another tokenizer than the one a checkpoint recorded (``ValueError``).

    Checkpoints saved without the record pass (their vocabulary and special ids are checked elsewhere).
    """
    saved = metadata.get("tokenizer")
    if not isinstance(saved, dict) or saved.get("sha256") == tokenizer.sha256:
        return
    raise ValueError(
        f"checkpoint {checkpoint} was trained with tokenizer sha256 {str(saved.get('sha256'))[:16]}... "
        f"({saved.get('vocab_size')} tokens) but dataset {dataset} was built with tokenizer sha256 "
        f"{tokenizer.sha256[:16]}... ({tokenizer.vocab_size} tokens): use data built with the checkpoint's tokenizer"
    )
