"""``wakong build --runner beam``: the build as an Apache Beam pipeline (Dataflow, Flink, Spark, local).

The launcher (this process) does what :func:`wakong.multihost.build` does on one process -- tokenizer,
checks, :func:`wakong.pipeline.prepare_dir`, then :func:`wakong.pipeline.commit_part` and the dataset
manifest -- and hands the records to Beam in between::

    Create(range(num_shards)) | Reshuffle          one task per output shard
      | FlatMap(_build_shard)                      records j with j * num_shards // n == shard:
                                                   pipeline.make_outcomes, ShardWriter -> staged shard
      | CombineGlobally(_sum_states)               counts, drop reasons, events, mask stats, shard list
      | Map(_write_manifest)                       checks the accounting, writes the part manifest last

The part is the one-process build's part 0 of 1: same record ranges per shard, same transform
(:func:`wakong.pipeline.make_outcomes`, deterministic per ``(seed, record index)``), same writer, so
the shards are byte-identical to ``wakong build`` without Beam and the manifests equal it but for the
timing. Workers open the input files themselves from the source's description (paths, sizes,
hashes: a file that changed since the launch is an error naming it); no record passes through the
launcher. The launcher, the workers and ``out_dir`` must see the input files and ``out_dir`` under the
same paths (one machine, or a shared filesystem such as NFS, Filestore, Lustre or a Cloud Storage
FUSE mount on every node).

Faults: a task writes its shard under a unique temporary name and renames it into the staging
directory, so a failed, retried or duplicated task leaves exactly one complete shard (the bytes do
not depend on the attempt). Nothing outside the staging directory changes before every shard and the
part manifest are there; a killed launcher leaves the old dataset (or its finished part) as the
in-process build does, and the same command run again finishes or redoes the job. Tasks of an
abandoned run stop before they write into a newer run's staging directory (each run marks its own).
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import secrets
import shlex
import shutil
import time
from typing import Any, Callable, Sequence

from wakong import multihost, pipeline, records
from wakong.accounting import Accounting
from wakong.config import BuildConfig
from wakong.sources import ArrayRecordSource, TextSource
from wakong.tokenizer import TextTokenizer

#: Records per :func:`wakong.pipeline.make_outcomes` call in a shard task (bounds a task's memory).
CHUNK = 1024
#: Source types whose workers open the files themselves (others are shipped to the workers pickled).
_FILE_SOURCES = {"text": lambda f, split: TextSource([f], split), "array_record": lambda f, split: ArrayRecordSource([f])}


class BeamBuildError(RuntimeError):
    """The Beam pipeline failed (the message ends with the worker's error); nothing was committed."""


def shard_range(shard: int, n: int, num_shards: int) -> range:
    """Records ``j`` of a part of ``n`` records that the in-process build writes to ``shard``
    (``j * num_shards // n == shard``).

    >>> [list(shard_range(k, 5, 3)) for k in range(3)]
    [[0, 1], [2, 3], [4]]
    """
    return range(-(-shard * n // num_shards), -(-(shard + 1) * n // num_shards))


class FileRecords:
    """A file source's records, opened on a worker from the source's ``describe()``: ``self[i]`` is the
    source's record ``i``. Files are opened when first read and checked against the description."""

    def __init__(self, description: dict):
        self.type, self.split, self.files = description["type"], description.get("split"), description["files"]
        self.starts = [0]
        for f in self.files:
            self.starts.append(self.starts[-1] + f["records"])
        self._file: tuple[int, Any] | None = None  # the file read last (ranges are read in order)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> bytes:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range [0, {len(self)})")
        k = bisect.bisect_right(self.starts, index) - 1  # empty files share a start: the last one holds it
        if self._file is None or self._file[0] != k:
            self._file = k, self._open(self.files[k])
        return self._file[1][index - self.starts[k]]

    def _open(self, file: dict):
        source = _FILE_SOURCES[self.type](file["path"], self.split)
        (found,) = source.describe()["files"]
        changed = [f"{key} {file[key]} -> {found.get(key)}" for key in file if key != "path" and found.get(key) != file[key]]
        if changed:
            raise ValueError(f"input file {file['path']} changed after the build started ({', '.join(changed)}); "
                             "rerun the build")
        return source

    def __getstate__(self):
        return {**self.__dict__, "_file": None}


def _shipped(source) -> Any:
    """What the workers get: a file source's description (they open the files), else the source."""
    description = getattr(source, "describe", dict)()
    return description if description.get("type") in _FILE_SOURCES and "files" in description else source


class _Job:
    """Everything a shard task needs (pickled into the pipeline)."""

    def __init__(self, source, config: BuildConfig, tok: TextTokenizer, staging: str, run: str, manifest: dict):
        self.source, self.n = _shipped(source), len(source)
        self.config, self.tokenizer, self.staging, self.run = config, tok, staging, run
        self.manifest, self.start = manifest, time.time()
        self.prefix = records.part_prefix(0, 1)
        self.phase = _phase  # the launcher's, so that a test's replacement reaches the workers

    def records(self):
        return FileRecords(self.source) if isinstance(self.source, dict) else self.source

    def check_run(self) -> None:
        """Stops a task of an abandoned run (killed launcher) before it touches a newer run's staging."""
        if not os.path.exists(os.path.join(self.staging, _marker(self.run))):
            raise BeamBuildError(f"{self.staging} no longer belongs to this build (run {self.run}); stopping")


def _phase(name: str) -> None:
    """Marks a phase: ``pipeline`` (launcher, before the run), ``shard`` (a task, after its shard is in
    the staging directory), ``staged`` (launcher, after the run). Tests replace it to inject faults."""


def _marker(run: str) -> str:
    return f".beam-run-{run}"


def _build_shard(shard: int, job: _Job):
    """One output shard: its records' outcomes, written to the staging directory; yields its tally."""
    started, num_shards = time.time(), job.config.output.num_shards
    span, source, tally = shard_range(shard, job.n, num_shards), job.records(), Accounting(job.config.noise.spans)
    job.check_run()
    with records.ShardWriter(job.staging, job.prefix, num_shards, shards=[shard]) as writer:
        for at in range(span.start, span.stop, CHUNK):
            chunk = range(at, min(at + CHUNK, span.stop))
            for outcome in pipeline.make_outcomes(source, job.config, job.tokenizer, chunk):
                for data in outcome.records:
                    writer.write(shard, data)
                tally.add(outcome)
        if tally.counts["records_in"] != len(span):
            raise RuntimeError(f"shard {shard}: {tally.counts['records_in']} outcomes for {len(span)} records")
        job.check_run()
        (written,) = writer.commit()
    job.phase("shard")
    yield {**tally.state(), "shards": {str(shard): written}, "started": started, "finished": time.time()}


def _sum_states(spans, states) -> dict:
    """Sum of shard tallies (associative; Beam's combiner calls it on partial sums too)."""
    total, shards, started, finished = Accounting(spans), {}, [], []
    for state in states:
        total.merge(state)
        twice = shards.keys() & state["shards"].keys()
        if twice:
            raise RuntimeError(f"shards {sorted(map(int, twice))} were counted twice")
        shards.update(state["shards"])
        started += [state["started"]] if state["started"] is not None else []
        finished += [state["finished"]] if state["finished"] is not None else []
    return {**total.state(), "shards": shards, "started": min(started, default=None),
            "finished": max(finished, default=None)}


def _write_manifest(total: dict, job: _Job, runner: str) -> None:
    """Checks that every shard and record is accounted for once; writes the part manifest last."""
    num_shards, c = job.config.output.num_shards, total["counts"]
    if sorted(map(int, total["shards"])) != list(range(num_shards)):
        raise RuntimeError(f"shards {sorted(map(int, total['shards']))} written, expected 0..{num_shards - 1}")
    shards = [total["shards"][str(k)] for k in range(num_shards)]
    out = c["records_written"] + sum(c["records_dropped"].values())
    if c["records_in"] != job.n or out != job.n or sum(s["records"] for s in shards) != c["examples"]:
        raise RuntimeError(f"record accounting is off: {c}, expected {job.n} records")
    seconds = time.time() - job.start
    manifest = {
        **job.manifest,
        "shards": shards,
        "counts": c,
        "mask_stats": total["mask_stats"],
        "timing": {
            "seconds": seconds,
            "loop_seconds": total["finished"] - total["started"],
            "tokens_per_second": c["tokens"] / max(seconds, 1e-9),
            "workers": 0,
            "runner": runner,
        },
    }
    records.write_json_atomic(os.path.join(job.staging, records.manifest_name(0, 1)), manifest)


def pipeline_options(flags: Sequence[str] | str = (), workers: int = 0):
    """Beam ``PipelineOptions`` from command-line flags (a list, or one string split like a shell).

    Every flag is passed on as it is, including those Beam's Python SDK does not define (the runner
    receives them: ``get_all_options(retain_unknown_options=True)``). Defaults, overridden by
    ``flags``: Beam's DirectRunner; ``workers > 0`` gives it that many worker processes
    (``--direct_num_workers=N --direct_running_mode=multi_processing``); worker logs at WARNING.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    if isinstance(flags, str):
        try:
            flags = shlex.split(flags)
        except ValueError as err:
            raise ValueError(f"beam options {flags!r} cannot be split into flags: {err}") from None
    defaults = ["--default_sdk_harness_log_level=WARNING"]
    if workers:
        defaults += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    return PipelineOptions([*defaults, *flags])


def runner_name(options) -> str:
    """The Beam runner ``options`` name (``DirectRunner`` when none is given)."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    return runner if isinstance(runner, str) else type(runner).__name__


def _import_beam():
    try:
        import apache_beam
    except ImportError as err:
        raise ImportError(f"--runner beam needs Apache Beam: pip install 'jaxsample[beam]' ({err})") from None
    return apache_beam


def _failure(err: Exception) -> BeamBuildError:
    """One line: the last ``...Error: message`` line of a (possibly remote) worker traceback."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    reason = (errors or lines or [type(err).__name__])[-1]
    if not errors and type(err).__name__ not in reason:
        reason = f"{type(err).__name__}: {reason}"
    return BeamBuildError(f"the Beam pipeline failed: {reason[:500]}")


def _run(beam, options, job: _Job) -> dict:
    """Runs the pipeline; returns the part manifest it staged."""
    from apache_beam.runners.runner import PipelineState

    runner = runner_name(options)
    p = beam.Pipeline(options=options)
    (
        p
        | "shards" >> beam.Create(range(job.config.output.num_shards))
        | "spread" >> beam.Reshuffle()
        | "build" >> beam.FlatMap(_build_shard, job)
        | "sum" >> beam.CombineGlobally(functools.partial(_sum_states, job.config.noise.spans))
        | "manifest" >> beam.Map(_write_manifest, job, runner)
    )
    _phase("pipeline")
    try:
        state = p.run().wait_until_finish()
    except Exception as err:
        raise _failure(err) from err
    if state != PipelineState.DONE:
        raise BeamBuildError(f"the Beam pipeline ended in state {state}")
    path = os.path.join(job.staging, records.manifest_name(0, 1))
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise BeamBuildError(f"the Beam pipeline finished without its manifest {path}: {err}") from None


def build(
    source: Sequence[bytes],
    out_dir: str | os.PathLike,
    config: BuildConfig,
    *,
    tokenizer: TextTokenizer | None = None,
    overwrite: bool = False,
    options: Any = (),
    tokenizer_progress: Callable[[], Any] | None = None,
) -> dict:
    """Builds the dataset with Apache Beam; returns the dataset manifest (as :func:`wakong.multihost.build`).

    Args:
      source, out_dir, config, tokenizer, overwrite: as :func:`wakong.pipeline.build`.
      options: Beam ``PipelineOptions``, or flags for :func:`pipeline_options` (default: DirectRunner).
      tokenizer_progress: called per record read to train a tokenizer (see ``resolve_tokenizer``).

    Raises:
      BeamBuildError: the pipeline failed (nothing replaced; the staging directory is removed).
      records.DatasetWriteError, FileExistsError, ValueError: as the in-process build.
    """
    beam = _import_beam()
    if not hasattr(options, "view_as"):
        options = pipeline_options(options)
    out_dir = os.fspath(out_dir)
    tok = pipeline.resolve_tokenizer(config, source, tokenizer, progress=tokenizer_progress)
    identity = pipeline.part_identity(source, config, tok)
    part = pipeline.prepare_dir(out_dir, 0, 1, overwrite, identity, resume=True)
    runner = None
    if part is None:
        staging, run = records.staging_dir(out_dir, 0, 1), secrets.token_hex(8)
        try:
            os.makedirs(staging)
            open(os.path.join(staging, _marker(run)), "w").close()
        except OSError as err:
            raise records._write_error(staging, err) from err
        try:
            try:
                tok.save(os.path.join(staging, "tokenizer.json"))
            except OSError as err:
                raise records._write_error(os.path.join(staging, "tokenizer.json"), err) from err
            job = _Job(source, config, tok, staging, run, pipeline._part_manifest(source, config, tok, 0, 1))
            part = _run(beam, options, job)
            _phase("staged")
        except BaseException:  # a failure or an interruption: the old dataset is untouched
            shutil.rmtree(staging, ignore_errors=True)
            raise
        pipeline.commit_part(out_dir, staging, part)
        runner = part["timing"]["runner"]
    manifest = multihost.merge([part], config)
    manifest["timing"]["runner"] = runner or part["timing"].get("runner", "in process")
    records.write_json_atomic(os.path.join(out_dir, records.DATASET_MANIFEST), manifest)
    return manifest


__all__ = ["BeamBuildError", "FileRecords", "build", "pipeline_options", "runner_name", "shard_range"]
