"""One dataset built by every process of a (multi-host) JAX job: a part per process, merged on process 0.

:func:`build` runs on every process (``wakong build`` calls it; start JAX's runtime first with
:func:`jaxsample.distributed.initialize`). Steps, each ending with :func:`jaxsample.distributed.together`
so that an error on one process stops every process with a clear message instead of a hang:

1. ``tokenizer``: a given or configured ``tokenizer.json`` is loaded by every process; otherwise
   process 0 alone trains the BPE and broadcasts its JSON, so nothing races on a shared directory
   and hosts without one get the same bytes (the parts' tokenizer sha256 are checked in step 4).
   Nothing in ``out_dir`` is touched before this step succeeded everywhere.
2. ``prepare``: each process checks what its part would replace in ``out_dir`` (refusing without
   ``overwrite``) and finishes or reuses its part of an identical killed build
   (:func:`wakong.pipeline.prepare_dir`); nothing is removed yet.
3. ``build``: process ``i`` builds records ``i, i + n, ...`` of the source into part ``i``
   (:func:`wakong.pipeline.build`: staged, then it replaces what the part replaces in ``out_dir``, or
   refuses without ``overwrite``). The examples of a record depend only on ``(seed, record index)``,
   so the union of the parts equals a one-process build.
4. ``manifest``: every process receives every part manifest and merges them identically
   (:func:`merge`: same settings, tokenizer and input everywhere, every input record read and
   written or dropped exactly once, counts and mask statistics summed). Process 0 writes the
   dataset manifest ``manifest.json``; a process that does not see it (no shared filesystem)
   writes the same bytes into its own ``out_dir``.

``out_dir`` may be shared by the processes (NFS, GCS FUSE, ...) or local to each host; in the latter
case each host holds its own part, read with ``wakong.reader.batches(path, part=jax.process_index())``.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Sequence

from jaxsample import distributed
from wakong import pipeline, records
from wakong.config import BuildConfig
from wakong.report import MaskStats
from wakong.tokenizer import TextTokenizer


def merge(parts: Sequence[dict], config: BuildConfig) -> dict:
    """The dataset manifest of a complete set of part manifests (checked by ``records.combine_parts``).

    Timing is the slowest part's (parts run concurrently); ``tokens_per_second`` is over the dataset.
    """
    combined = records.combine_parts(list(parts))
    stats = MaskStats(config.noise.spans)
    for part in combined["parts"]:
        stats.merge(part["mask_stats"])
    seconds = max(p["timing"]["seconds"] for p in combined["parts"])
    return {
        "version": records.MANIFEST_VERSION,
        **combined,
        "mask_stats": stats.state(),
        "timing": {
            "seconds": seconds,
            "loop_seconds": max(p["timing"]["loop_seconds"] for p in combined["parts"]),
            "tokens_per_second": combined["counts"]["tokens"] / max(seconds, 1e-9),
            "workers": combined["parts"][0]["timing"]["workers"],
            "processes": combined["process_count"],
        },
    }


def _tokenizer(config, source, tokenizer, info: distributed.ProcessInfo, step, progress) -> TextTokenizer:
    """The tokenizer every process uses: given, loaded by each, or trained on process 0 and broadcast."""
    if tokenizer is not None or config.tokenizer.path or info.count == 1:
        with step("tokenizer"):
            return pipeline.resolve_tokenizer(config, source, tokenizer, progress=progress)
    with step("tokenizer"):
        trained = pipeline.resolve_tokenizer(config, source, progress=progress) if info.is_main else None
    payload = None
    if trained is not None:
        payload = f"{trained.origin}\n{json.dumps(trained.training)}\n{trained.json_text}".encode()
    origin, training, text = distributed.broadcast_bytes(payload).decode().split("\n", 2)
    if trained is not None:
        return trained
    received = TextTokenizer(text, config.tokenizer.special, origin=origin)
    received.training = json.loads(training)
    return received


def _dumps(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


def _holds(path: str, manifest: dict) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f) == manifest
    except (OSError, ValueError):
        return False


def build(
    source: Sequence[bytes],
    out_dir: str | os.PathLike,
    config: BuildConfig,
    *,
    tokenizer: TextTokenizer | None = None,
    workers: int = 0,
    overwrite: bool = False,
    progress: Callable[[pipeline.Outcome], Any] | None = None,
    processes: distributed.ProcessInfo | None = None,
    tokenizer_progress: Callable[[], Any] | None = None,
) -> dict:
    """Builds the dataset with every process of the job; returns the dataset manifest (on every process).

    Args:
      source, out_dir, config, tokenizer, workers, overwrite, progress: as :func:`wakong.pipeline.build`
        (the same on every process; ``progress`` sees this process's records).
      processes: this process's place in the job (default: JAX's, :func:`jaxsample.distributed.current`).
      tokenizer_progress: called per record read to train a tokenizer (see ``resolve_tokenizer``).

    Raises:
      jaxsample.distributed.DistributedError: another process failed (this one raises its own error).
      records.DatasetError: the parts do not make one dataset (e.g. hosts read different inputs).
    """
    info = processes if processes is not None else distributed.current()
    if info.count > 1 and distributed.process_count() != info.count:
        raise ValueError(
            f"a build with {info.count} processes needs JAX's distributed runtime with as many "
            f"(it runs {distributed.process_count()}); call jaxsample.distributed.initialize() first"
        )
    step = distributed.together if info.count > 1 else lambda name: contextlib.nullcontext()
    out_dir = os.fspath(out_dir)
    pipeline.check_workers(workers)
    tok = _tokenizer(config, source, tokenizer, info, step, tokenizer_progress)
    with step("prepare"):  # every process refuses (or finishes a killed build) before any builds
        identity = pipeline.part_identity(source, config, tok, info.index, info.count)
        pipeline.prepare_dir(out_dir, info.index, info.count, overwrite, identity, resume=True)
    with step("build"):
        part = _dumps(
            pipeline.build(
                source,
                out_dir,
                config,
                tokenizer=tok,
                workers=workers,
                process_index=info.index,
                process_count=info.count,
                overwrite=overwrite,
                progress=progress,
                resume=True,  # a part built by a run killed before the dataset manifest is reused
            )
        )
    parts = distributed.allgather_bytes(part) if info.count > 1 else [part]
    manifest = merge([json.loads(p) for p in parts], config)
    path = os.path.join(out_dir, records.DATASET_MANIFEST)
    with step("manifest"):
        if info.is_main:
            records.write_json_atomic(path, manifest)
    with step("manifest copies"):
        if not info.is_main and not _holds(path, manifest):
            records.write_json_atomic(path, manifest)
    return manifest


__all__ = ["build", "merge"]
