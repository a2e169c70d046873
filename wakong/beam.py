"""``wakong build --runner beam``: the build as an Apache Beam pipeline (Dataflow, Flink, Spark, local).

The launcher (this process) does what :func:`wakong.multihost.build` does on one process -- tokenizer,
checks, :func:`wakong.pipeline.prepare_dir`, then :func:`wakong.pipeline.commit_part` and the dataset
manifest -- and hands the records to Beam in between::

    Create(shards to build) | Reshuffle            one task per output shard not finished by a killed run
      | FlatMap(_build_shard)                      records shard_ranges(n, num_shards)[shard]:
                                                   shards.fill_shard (make_outcomes, ShardWriter) -> staged
                                                   shard, then its summary (shards.write_summary)
    (that, Create([reused shards' tally sum]))     the shards shards.finished found (_reused)
      | Flatten | CombineGlobally(_sum_states)     Tally states (counts, drops, events, mask stats), shard list
      | Map(_write_manifest)                       checks the accounting, writes the part manifest last

The part is the one-process build's part 0 of 1: same record ranges per shard, same transform
(:func:`wakong.examples.make_outcomes`, deterministic per ``(seed, record index)``), same writer, so
the shards are byte-identical to ``wakong build`` without Beam and the manifests equal it but for the
timing. Workers open the input files themselves from the source's description (paths, sizes,
hashes: a file that changed since the launch is an error naming it); no record passes through the
launcher. The workers must see the input files and ``out_dir`` under the launcher's paths (one
machine, or a filesystem mounted on every node: NFS, Filestore, Lustre, Cloud Storage FUSE), or
elsewhere through Beam's FileSystems as ``worker_paths`` maps them (Dataflow: ``gs://``).

Faults: a task writes its shard under a unique temporary name and renames it into the staging
directory, then its summary, so a failed, retried or duplicated task leaves exactly one complete shard
(the bytes do not depend on the attempt). Nothing outside the staging directory changes before every
shard and the part manifest are there. A killed launcher leaves the old dataset (or its finished part)
and the staging directory, as the in-process build does (the same files: progress.json with the part's
identity, shards with their summaries); the same command run again, with either runner, keeps the
shards whose size and sha256 still match their summaries (:func:`wakong.shards.finished`), runs tasks
for the others only, counts each kept shard's tally once and writes the same dataset as a build that
was never killed; killed after the pipeline, the rerun only commits. Each run marks the staging
directory as its own and a rerun removes the older marker, so tasks of an abandoned run stop before
they write into it. As in process, a failed pipeline or Ctrl-C removes the staging directory, finished
shards included: only a killed build leaves shards to reuse.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import secrets
import shlex
import shutil
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from wakong import multihost, pipeline, records
from wakong.accounting import Tally
from wakong.config import BuildConfig
from wakong.shards import fill_shard, finished, shard_ranges, write_summary
from wakong.sources import ArrayRecordSource, TextSource
from wakong.tokenizer import TextTokenizer


def _columnar(kind: str):
    def open_file(path: str, description: dict):
        from wakong import columnar

        return getattr(columnar, kind)([path], description["column"])

    return open_file


#: Source types whose workers open the files themselves, one file at a time, from the source's
#: description (others are shipped to the workers pickled). Directories, globs and Hugging Face
#: ``datasets`` directories were expanded into files by the launcher; ``.gz``/``.zst`` text files are
#: decompressed by each worker that reads them.
_FILE_SOURCES = {
    "text": lambda path, description: TextSource([path], description["split"]),
    "array_record": lambda path, description: ArrayRecordSource([path]),
    "parquet": _columnar("ParquetSource"),
    "arrow": _columnar("ArrowSource"),
}


class BeamBuildError(RuntimeError):
    """The Beam pipeline failed (the message ends with the worker's error); nothing was committed."""


def worker_path(path: str, paths: Mapping[str, str]) -> str:
    """Where workers find the launcher's ``path``: its prefix replaced by the first entry of ``paths``
    (launcher prefix -> worker prefix) that it starts with, else ``path`` itself.

    >>> worker_path("/gcs/corpus/a.txt", {"/gcs/corpus/": "gs://corpus/"})
    'gs://corpus/a.txt'
    """
    for prefix, target in paths.items():
        if path.startswith(prefix):
            return target + path[len(prefix):]
    return path


def check_worker_paths(paths: Mapping[str, str] | None) -> dict:
    """``worker_paths`` as ``{absolute launcher prefix/: worker prefix/}`` (``ValueError`` naming it)."""
    out = {}
    for prefix, target in (paths or {}).items():
        if not isinstance(prefix, str) or not os.path.isabs(prefix) or not isinstance(target, str) or not target:
            raise ValueError(
                f"worker_paths maps an absolute launcher path to a worker path, got {prefix!r}: {target!r}"
            )
        out[os.path.join(prefix, "")] = target if target.endswith("/") else target + "/"
    return out


def _fetch(url: str) -> str:
    """A local copy of ``url``'s bytes, read with Beam's FileSystems (gs://, s3://, hdfs://, a path); it
    keeps the file name's suffix (``.gz``, ``.zst``: how the source decompresses it)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    fd, local = tempfile.mkstemp(prefix="wakong-input-", suffix=f"-{os.path.basename(url)}")
    try:
        with os.fdopen(fd, "wb") as out, FileSystems.open(url, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            shutil.copyfileobj(f, out, 1 << 22)
    except BaseException:
        os.remove(local)
        raise
    return local


def _put(local: str, directory: str, name: str) -> None:
    """Copies ``local`` to ``directory/name`` with Beam's FileSystems: under a unique temporary name,
    then renamed, so a retried or duplicated task leaves one complete file."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    tmp = FileSystems.join(directory, f".{name}{records.temp_suffix()}")
    with open(local, "rb") as f, FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        shutil.copyfileobj(f, out, 1 << 22)
    FileSystems.rename([tmp], [FileSystems.join(directory, name)])


class FileRecords:
    """A file source's records, opened on a worker from the source's ``describe()``: ``self[i]`` is the
    source's record ``i``. Files are opened when first read (copied first when ``paths`` maps them to
    another filesystem, see :func:`worker_path`) and checked against the description."""

    def __init__(self, description: dict, paths: Mapping[str, str] | None = None):
        self.description, self.type, self.files = description, description["type"], description["files"]
        self.paths = dict(paths or {})
        self.starts = [0]
        for f in self.files:
            self.starts.append(self.starts[-1] + f["records"])
        self._file: tuple[int, Any] | None = None  # the file read last (ranges are read in order)
        self._copy: str | None = None  # its local copy

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
        where = worker_path(file["path"], self.paths)
        local = where if where == file["path"] else _fetch(where)
        self.close()
        self._copy = None if local == where else local
        source = _FILE_SOURCES[self.type](local, self.description)
        (found,) = source.describe()["files"]
        changed = [f"{k} {file[k]} -> {found.get(k)}" for k in file if k != "path" and found.get(k) != file[k]]
        if changed:
            raise ValueError(f"input file {where} changed after the build started ({', '.join(changed)}); "
                             "rerun the build")
        return source

    def close(self) -> None:
        """Removes the local copy of the file read last (if any)."""
        if self._copy is not None:
            os.remove(self._copy)
            self._copy = None

    def __getstate__(self):
        return {**self.__dict__, "_file": None, "_copy": None}


def _shipped(source) -> Any:
    """What the workers get: a file source's description (they open the files), else the source."""
    description = getattr(source, "describe", dict)()
    if description.get("type") not in _FILE_SOURCES or "files" not in description:
        return source
    return {**description, "files": [{**f, "path": os.path.abspath(f["path"])} for f in description["files"]]}


class _Job:
    """Everything a shard task needs (pickled into the pipeline)."""

    def __init__(self, source, config: BuildConfig, tok: TextTokenizer, staging: str, run: str, manifest: dict,
                 paths: Mapping[str, str] | None = None):
        self.source, self.n = _shipped(source), len(source)
        self.config, self.tokenizer, self.staging, self.run = config, tok, staging, run
        self.manifest, self.start, self.paths = manifest, time.time(), dict(paths or {})
        self.target = worker_path(staging, self.paths)  # the staging directory as the workers reach it
        self.remote = self.target != staging  # workers write through Beam's FileSystems
        self.prefix = records.part_prefix(0, 1)
        self.phase = _phase  # the launcher's, so that a test's replacement reaches the workers

    def records(self):
        return FileRecords(self.source, self.paths) if isinstance(self.source, dict) else self.source

    def check_run(self) -> None:
        """Stops a task of an abandoned run (killed launcher) before it touches a newer run's staging."""
        if self.remote:
            from apache_beam.io.filesystems import FileSystems

            alive = FileSystems.exists(FileSystems.join(self.target, _marker(self.run)))
        else:
            alive = os.path.exists(os.path.join(self.staging, _marker(self.run)))
        if not alive:
            raise BeamBuildError(f"{self.target} no longer belongs to this build (run {self.run}); stopping")

    def stage(self, write: Callable[[str], str]) -> Any:
        """Runs ``write(directory)`` (it leaves one file there and returns its name) on the staging
        directory, or on a local one whose file is then copied there (``remote``); only while the staging
        directory belongs to this run (:meth:`check_run`)."""
        self.check_run()
        if not self.remote:
            return write(self.staging)
        local = tempfile.mkdtemp(prefix="wakong-stage-")
        try:
            name = write(local)
            self.check_run()
            _put(os.path.join(local, name), self.target, name)
            return name
        finally:
            shutil.rmtree(local, ignore_errors=True)


def _phase(name: str) -> None:
    """Marks a phase: ``pipeline`` (launcher, before the run), ``shard`` (a task, after its shard and its
    summary are in the staging directory), ``staged`` (launcher, after the run). Tests replace it to
    inject faults."""


def _marker(run: str) -> str:
    return f".beam-run-{run}"


def _build_shard(shard: int, job: _Job):
    """One output shard: its records' outcomes, written to the staging directory with its summary (as the
    in-process build's, :func:`wakong.shards.finished`: a rerun after a kill reuses it); yields its tally."""
    started, num_shards = time.time(), job.config.output.num_shards
    span, tally = shard_ranges(job.n, num_shards)[shard], Tally(job.config)
    written = {}

    def write(directory: str) -> str:
        source = job.records()
        try:
            with records.ShardWriter(directory, job.prefix, num_shards, shards=[shard]) as writer:
                fill_shard(writer, shard, source, job.config, job.tokenizer, span, tally)
                if tally.counts["records_in"] != len(span):
                    raise RuntimeError(f"shard {shard}: {tally.counts['records_in']} outcomes for {len(span)} records")
                job.check_run()
                (written[str(shard)],) = writer.commit()
        finally:
            if isinstance(source, FileRecords):
                source.close()
        return written[str(shard)]["file"]

    job.stage(write)
    state = tally.state()
    job.stage(lambda directory: write_summary(directory, shard, num_shards,  # after the shard, as in process
                                              {"files": [written[str(shard)]], "tally": state}))
    job.phase("shard")
    yield {**state, "shards": written, "started": started, "finished": time.time()}


def _reused(config: BuildConfig, done: Mapping[int, dict]) -> dict:
    """The sum of the tallies of the shards ``done`` (:func:`wakong.shards.finished`) a killed build left."""
    return _sum_states(config, [{**result["tally"], "shards": {str(k): result["files"][0]}, "started": None,
                                 "finished": None} for k, result in done.items()])


def _sum_states(config: BuildConfig, states) -> dict:
    """Sum of shard tallies (associative; Beam's combiner calls it on partial sums too)."""
    total, shards, started, finished = Tally(config), {}, [], []
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
    tally = Tally(job.config).merge(total)
    num_shards, c = job.config.output.num_shards, tally.manifest_counts()
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
        "mask_stats": tally.stats.state(),
        "timing": {
            "seconds": seconds,
            "loop_seconds": total["finished"] - total["started"] if total["started"] is not None else 0.0,
            "tokens_per_second": c["tokens"] / max(seconds, 1e-9),
            "workers": 0,
            "runner": runner,
        },
    }
    name = records.manifest_name(0, 1)
    job.stage(lambda directory: records.write_json_atomic(os.path.join(directory, name), manifest) or name)


def pipeline_options(flags: Sequence[str] | str = (), workers: int = 0):
    """Beam ``PipelineOptions`` from command-line flags (a list, or one string split like a shell).

    Every flag is passed on as it is, including those Beam's Python SDK does not define (the runner
    receives them: ``get_all_options(retain_unknown_options=True)``). Defaults, overridden by
    ``flags``: Beam's DirectRunner; ``workers > 0`` gives it that many worker processes
    (``--direct_num_workers=N --direct_running_mode=multi_processing``); worker logs at WARNING.
    """
    _import_beam()
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


def _run(beam, options, job: _Job, done: Mapping[int, dict]) -> dict:
    """Runs the pipeline: tasks for the shards not ``done``, whose tallies join theirs; returns the part
    manifest it staged."""
    from apache_beam.runners.runner import PipelineState

    runner = runner_name(options)
    p = beam.Pipeline(options=options)
    built = (
        p
        | "shards" >> beam.Create([k for k in range(job.config.output.num_shards) if k not in done])
        | "spread" >> beam.Reshuffle()
        | "build" >> beam.FlatMap(_build_shard, job)
    )
    (
        (built, p | "reused" >> beam.Create([_reused(job.config, done)]))
        | "all" >> beam.Flatten()
        | "sum" >> beam.CombineGlobally(functools.partial(_sum_states, job.config))
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
    worker_paths: Mapping[str, str] | None = None,
    tokenizer_progress: Callable[[], Any] | None = None,
) -> dict:
    """Builds the dataset with Apache Beam; returns the dataset manifest (as :func:`wakong.multihost.build`).

    Args:
      source, out_dir, config, tokenizer, overwrite: as :func:`wakong.pipeline.build`.
      options: Beam ``PipelineOptions``, or flags for :func:`pipeline_options` (default: DirectRunner).
      worker_paths: ``{launcher prefix: worker prefix}`` for workers that reach the launcher's input
        files and ``out_dir`` elsewhere, e.g. ``{"/gcs/bucket/": "gs://bucket/"}`` when the launcher
        mounts the bucket (Cloud Storage FUSE) and Dataflow workers read and write it with Beam's
        FileSystems (they copy each input file they read, and write each shard locally first).
      tokenizer_progress: called per record read to train a tokenizer (see ``resolve_tokenizer``).

    A build of this part that was killed (same settings, tokenizer and input; either runner) left its
    finished shards in the staging directory: they are kept and only the others are built.

    Raises:
      BeamBuildError: the pipeline failed (nothing replaced; the staging directory is removed).
      records.DatasetWriteError, FileExistsError, ValueError: as the in-process build.
    """
    paths = check_worker_paths(worker_paths)
    beam = _import_beam()
    if not hasattr(options, "view_as"):
        options = pipeline_options(options)
    out_dir = os.path.abspath(os.fspath(out_dir))
    tok = pipeline.resolve_tokenizer(config, source, tokenizer, progress=tokenizer_progress)
    identity = pipeline.part_identity(source, config, tok)
    part = pipeline.prepare_dir(out_dir, 0, 1, overwrite, identity, resume=True)
    if part is None:
        staging, run = records.staging_dir(out_dir, 0, 1), secrets.token_hex(8)
        pipeline.open_staging(staging)  # kept with its finished shards if a killed build of this part left it
        try:
            open(os.path.join(staging, _marker(run)), "w").close()  # the old run's marker is gone
        except OSError as err:
            raise records.write_error(staging, err) from err
        try:
            pipeline.write_progress(staging, identity)
            try:
                tok.save(os.path.join(staging, tok.file_name))
            except OSError as err:
                raise records.write_error(os.path.join(staging, tok.file_name), err) from err
            job = _Job(source, config, tok, staging, run, pipeline.part_manifest(source, config, tok, 0, 1), paths)
            part = _run(beam, options, job, finished(staging, config.output.num_shards))
            _phase("staged")
        except BaseException:  # a failure or an interruption, as in process: the old dataset is untouched
            shutil.rmtree(staging, ignore_errors=True)
            raise
        pipeline.commit_part(out_dir, staging, part)
    manifest = multihost.merge([part], config)
    manifest["timing"]["runner"] = part["timing"].get("runner", "in process")  # a reused part: its own
    records.write_json_atomic(os.path.join(out_dir, records.DATASET_MANIFEST), manifest)
    return manifest


__all__ = [
    "BeamBuildError",
    "FileRecords",
    "build",
    "check_worker_paths",
    "pipeline_options",
    "runner_name",
    "worker_path",
]
