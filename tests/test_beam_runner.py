"""``wakong build --runner beam`` on Apache Beam's DirectRunner: the same dataset as the in-process build
(byte-identical shards, equal manifests but for timing) from several worker processes, every source
type, and faults: a killed launcher (the rerun keeps the shards a killed Beam or in-process build
finished), failed or repeated shard tasks, changed inputs, Ctrl-C.

Tests that run a pipeline need ``apache_beam`` (``pip install 'jaxsample[beam]'``; CI installs it) and
are skipped without it; the others check the runner's plumbing and run everywhere.
"""

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests._helpers import dataset_files
from tests.test_build_inputs import sp_model  # noqa: F401  (fixture)
from tests.test_pipeline import tokenizer  # noqa: F401  (fixture)
from wakong import beam, multihost, pipeline, records, shards
from wakong.accounting import Tally
from wakong.cli import main
from wakong.config import load_config
from wakong.sources import PydocSource, TextSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_beam = pytest.mark.skipif(importlib.util.find_spec("apache_beam") is None,
                                reason="apache_beam is not installed (pip install 'jaxsample[beam]')")
SETTINGS = ["examples.max_source_len=64", "examples.max_target_len=64", "examples.min_words=3"]
FLAGS = ["--split", "paragraph", "--num-shards", "4", "--no-progress", "--no-plots",
         *(arg for s in SETTINGS for arg in ("--set", s))]
MULTIPROCESS = ["--runner", "beam", "--workers", "2"]  # DirectRunner, multi_processing, 2 SDK worker processes
IN_MEMORY = ["--runner", "beam"]  # DirectRunner in this process
# A launcher whose wakong.<argv[1]>._phase(name) (beam, or pipeline: the in-process build) kills it
# (SIGKILL) at the phase named by argv[2]; the replacement is defined in __main__, so Beam pickles it by
# value into the worker processes too ("shard").
KILL = """
import importlib, os, signal, sys
module = importlib.import_module("wakong." + sys.argv[1])
launcher, phase = os.getpid(), sys.argv[2]
def kill(name):
    if name == phase:
        os.kill(launcher, signal.SIGKILL)
module._phase = kill
from wakong.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _texts(n: int) -> list[bytes]:
    """The first ``n`` Python doc topics, one line each."""
    from pydoc_data.topics import topics

    return [" ".join(topics[name].split()).encode() for name in sorted(topics)[:n]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """Three text files (one empty) of 32 paragraphs: 30 doc topics, one with invalid UTF-8, one too short;
    shard ranges cross the file boundaries."""
    texts = _texts(30)
    texts[7:7] = [b"bad \xff\xfe bytes in a paragraph of words", b"short"]
    root = tmp_path_factory.mktemp("beam_inputs")
    paths = []
    for name, chunk in (("a.txt", texts[:12]), ("empty.txt", []), ("b.txt", texts[12:])):
        (root / name).write_bytes(b"\n\n".join(chunk) + (b"\n" if chunk else b""))
        paths.append(str(root / name))
    return paths


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory, tokenizer) -> str:  # noqa: F811
    path = tmp_path_factory.mktemp("beam_tok") / "tokenizer.json"
    tokenizer.save(path)
    return str(path)


def _argv(inputs, out, tok_file, seed, *extra) -> list[str]:
    return ["build", *inputs, "--out", str(out), "--tokenizer", tok_file, "--seed", str(seed), *FLAGS, *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs, tok_file):
    """In-process builds (no Beam) with seeds 1 and 2: what every Beam build must equal."""
    root = tmp_path_factory.mktemp("beam_reference")
    for seed in (1, 2):
        assert main(_argv(inputs, root / f"seed{seed}", tok_file, seed)) == 0
    return root


def _timeless(data, drop=("timing",)):
    if isinstance(data, dict):
        return {k: _timeless(v, drop) for k, v in data.items() if k not in drop}
    if isinstance(data, list):
        return [_timeless(v, drop) for v in data]
    return data


def _manifest(path, name=records.DATASET_MANIFEST) -> dict:
    with open(os.path.join(path, name), encoding="utf-8") as f:
        return json.load(f)


def _same_dataset(path, reference) -> None:
    """``path`` holds exactly ``reference``'s files: byte-identical shards and tokenizer, and manifests
    (the part's and the dataset's) equal but for their timing (and the input paths, which may differ)."""
    got, want = dataset_files(path), dataset_files(reference)
    assert sorted(got) == sorted(want)  # no staging directory, run marker or temporary file
    manifests = {records.DATASET_MANIFEST, records.manifest_name(0, 1)}
    assert {k: v for k, v in got.items() if k not in manifests} == {k: v for k, v in want.items() if k not in manifests}
    for name in manifests:
        built, expected = (_timeless(_manifest(p, name), ("timing", "path")) for p in (path, reference))
        assert built == expected
    info = records.read_manifests(str(path))
    assert records.verify_shards(info) > 0


# ---------------------------------------------------------------- the transform and the shard ranges


def test_shard_ranges_are_the_in_process_assignment():
    for n in range(0, 41):
        for k in range(1, 8):
            ranges = shards.shard_ranges(n, k)
            assert [j for r in ranges for j in r] == list(range(n))
            assert all(j * k // n == s for s, r in enumerate(ranges) for j in r)


def test_make_outcomes_is_the_builds_transform_for_any_range(inputs, tokenizer):  # noqa: F811
    source = TextSource(inputs, "paragraph")
    config = load_config(overrides=SETTINGS + ["seed=3"])
    whole = pipeline.make_outcomes(source, config, tokenizer, range(len(source)))
    parts = [o for a in range(0, len(source), 5) for o in pipeline.make_outcomes(source, config, tokenizer,
                                                                                 range(a, min(a + 5, len(source))))]
    middle = pipeline.make_outcomes(source, config, tokenizer, range(20, 23))
    assert [o.index for o in whole] == list(range(len(source)))
    pairs = [(parts, whole), (middle, whole[20:23])]  # whole == grain's random_map: tests/test_outcomes.py
    for got, want in pairs:
        assert [(o.index, o.records, o.dropped, o.events, o.tokens, o.schemes) for o in got] == \
            [(o.index, o.records, o.dropped, o.events, o.tokens, o.schemes) for o in want]
    assert {o.dropped for o in whole} == {None, "too_short"} and any(o.events for o in whole)


def test_workers_read_the_files_themselves_and_refuse_changed_ones(tmp_path, inputs):
    source = TextSource(inputs, "paragraph")
    view = beam.FileRecords(source.describe())
    assert len(view) == len(source) and [view[i] for i in range(len(view))] == [source[i] for i in range(len(source))]
    with pytest.raises(IndexError):
        view[len(view)]
    copy = tmp_path / "a.txt"
    shutil.copy(inputs[0], copy)
    changed = beam.FileRecords(TextSource([str(copy)], "paragraph").describe())
    copy.write_bytes(copy.read_bytes() + b"\n\none more paragraph\n")
    with pytest.raises(ValueError, match=r"input file .*a.txt changed after the build started \(bytes \d+ -> \d+, "
                                         r"sha256 .* -> .*, records 12 -> 13\); rerun the build"):
        changed[0]


def test_sources_are_shipped_as_descriptions_or_pickled(inputs):
    shipped = beam._shipped(TextSource(inputs, "paragraph"))
    assert shipped["type"] == "text" and [f["path"] for f in shipped["files"]] == inputs
    pydoc = PydocSource()
    assert beam._shipped(pydoc) is pydoc  # no files to open: the (small) source itself


# ---------------------------------------------------------------- options and the command line


@needs_beam
def test_beam_options_are_passed_on_as_they_are():
    options = beam.pipeline_options("--runner=FlinkRunner --flink_master=localhost:8081 --my_own_flag 'a b'", workers=2)
    every = options.get_all_options(retain_unknown_options=True)
    assert every["runner"] == "FlinkRunner" and every["flink_master"] == "localhost:8081"
    assert every["my_own_flag"] == "a b"  # unknown to Beam's Python SDK, kept for the runner
    assert every["direct_num_workers"] == 2 and every["direct_running_mode"] == "multi_processing"
    assert beam.pipeline_options(["--direct_num_workers=3"], workers=2).get_all_options()["direct_num_workers"] == 3
    assert beam.runner_name(beam.pipeline_options()) == "DirectRunner"
    assert beam.runner_name(options) == "FlinkRunner"
    with pytest.raises(ValueError, match="cannot be split into flags"):
        beam.pipeline_options("--project 'unclosed")


def _readme_beam_commands() -> list[list[str]]:
    """The `wakong build` lines of the README's Beam section, split into arguments by bash itself."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("### On many machines: Apache Beam"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")].replace("\\\n", " ")
    commands = [line for line in block.splitlines() if line.startswith("wakong build") and " ... " not in line]
    out = []
    for line in commands:
        done = subprocess.run(["bash", "-c", f"printf '%s\\0' {line[len('wakong '):]}"],
                              capture_output=True, check=True)
        out.append(done.stdout.decode().split("\0")[:-1])
    return out


@needs_beam
def test_the_readme_beam_invocations_parse_as_documented():
    from wakong.cli import _parser

    commands = _readme_beam_commands()
    assert len(commands) == 3
    runners = []
    for argv in commands:
        args = _parser().parse_args(argv)
        options = beam.pipeline_options(args.beam_options, workers=args.workers).get_all_options()
        runners.append(options["runner"] or "DirectRunner")
        assert args.runner == "beam" and args.num_shards >= 16
        if options["runner"] == "DataflowRunner":
            assert args.worker_path == ["/gcs/my-bucket/=gs://my-bucket/"] and options["region"] == "us-central1"
            assert options["temp_location"].startswith("gs://") and options["extra_packages"]
        if options["runner"] == "FlinkRunner":
            assert json.loads(options["environment_config"]) == {"command": "/opt/apache/beam/boot"}
    assert runners == ["DirectRunner", "DataflowRunner", "FlinkRunner"]


@pytest.mark.parametrize("extra,message", [
    (["--beam-options=--runner=DirectRunner"], "--beam-options and --worker-path need --runner beam"),
    (["--runner", "beam", "--worker-path", "/gcs/b/"], "--worker-path takes LAUNCHER=WORKER"),
    (["--runner", "beam", "--worker-path", "gcs/b/=gs://b/"], "worker_paths maps an absolute launcher path"),
    (["--runner", "beam", "--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "0"],
     "--runner beam is started once"),
])
def test_runner_flags_are_checked(tmp_path, inputs, tok_file, capsys, extra, message):
    assert main(_argv(inputs, tmp_path / "o", tok_file, 1, *extra)) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_missing_beam_is_one_line(tmp_path, inputs, tok_file, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # import apache_beam raises ImportError
    assert main(_argv(inputs, tmp_path / "o", tok_file, 1, *IN_MEMORY)) == 1
    assert "pip install 'jaxsample[beam]'" in capsys.readouterr().err


# ---------------------------------------------------------------- same dataset as the in-process build


@pytest.mark.multiprocess
@needs_beam
def test_multiprocess_beam_build_equals_the_in_process_build(tmp_path, inputs, tok_file, reference, capsys):
    out = tmp_path / "data"
    assert main(_argv(inputs, out, tok_file, 2, *MULTIPROCESS)) == 0
    _same_dataset(out, reference / "seed2")
    manifest = _manifest(out)
    assert manifest["timing"]["runner"] == "DirectRunner"
    c = manifest["counts"]
    assert c["records_in"] == 32 and c["records_dropped"]["too_short"] == 1
    assert c["events"]["utf8_repaired_records"] == 1
    assert "Beam DirectRunner" in capsys.readouterr().out


@needs_beam
@pytest.mark.parametrize("kind", ["jsonl", "array_record", "parquet", "gz"])
def test_file_sources_build_the_same_dataset(tmp_path, tok_file, kind):
    from array_record.python.array_record_module import ArrayRecordWriter

    texts = [text.decode() for text in _texts(14)]
    if kind == "parquet":  # two files, several row groups each, a null row; a glob the launcher expands
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        for name, chunk in (("a.parquet", texts[:6]), ("b.parquet", [*texts[6:10], None, *texts[10:]])):
            pq.write_table(pa.table({"id": range(len(chunk)), "body": chunk}), tmp_path / name, row_group_size=3)
        args = [str(tmp_path / "*.parquet"), "--format", "parquet", "--column", "body"]
    elif kind == "gz":  # a directory of compressed text files
        import gzip

        (tmp_path / "in").mkdir()
        for name, chunk in (("a.txt.gz", texts[:6]), ("b.txt.gz", texts[6:])):
            (tmp_path / "in" / name).write_bytes(gzip.compress("\n".join(chunk).encode()))
        args = [str(tmp_path / "in")]
    elif kind == "jsonl":
        lines = [json.dumps({"body": t}) for t in texts]
        lines.insert(7, "{not json")
        (tmp_path / "a.jsonl").write_text("\n".join(lines[:5]) + "\n")
        (tmp_path / "b.jsonl").write_text("\n".join(lines[5:]) + "\n")
        args = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--format", "jsonl", "--set", "input.field=body"]
    else:
        args = ["--format", "array_record"]
        for name, chunk in (("a.ar", texts[:6]), ("b.ar", texts[6:])):
            writer = ArrayRecordWriter(str(tmp_path / name), "group_size:1")
            for t in chunk:
                writer.write(t.encode())
            writer.close()
            args.append(str(tmp_path / name))
    common = ["--tokenizer", tok_file, "--seed", "4", "--num-shards", "3", "--no-progress", "--no-plots",
              *(arg for s in SETTINGS for arg in ("--set", s))]
    assert main(["build", *args, "--out", str(tmp_path / "local"), *common]) == 0
    assert main(["build", *args, "--out", str(tmp_path / "beam"), *common, *IN_MEMORY]) == 0
    _same_dataset(tmp_path / "beam", tmp_path / "local")
    if kind == "jsonl":
        assert _manifest(tmp_path / "beam")["counts"]["records_dropped"]["invalid_json"] == 1
    if kind == "parquet":
        assert _manifest(tmp_path / "beam")["counts"]["records_dropped"]["empty"] == 1  # the null row


@needs_beam
@pytest.mark.parametrize("mode", ["noised", "tokenized"])
def test_a_source_without_files_is_shipped_to_the_workers(tmp_path, tokenizer, mode):  # noqa: F811
    source = _texts(9) + [b"", b"tiny"]  # any sequence of bytes records (pydoc, Python lists): pickled
    config = load_config(overrides=SETTINGS + ["output.num_shards=13", "seed=6",  # more shards than records
                                               f"output.mode={mode}"])  # tokenized: documents for the device
    multihost.build(source, tmp_path / "local", config, tokenizer=tokenizer)
    manifest = beam.build(source, tmp_path / "beam", config, tokenizer=tokenizer)
    _same_dataset(tmp_path / "beam", tmp_path / "local")
    assert manifest["counts"]["records_dropped"] == {**dict.fromkeys(pipeline.DROP_REASONS, 0), "empty": 1,
                                                     "too_short": 1}


@needs_beam
def test_a_sentencepiece_tokenizer_is_staged_under_its_own_name(tmp_path, sp_model):  # noqa: F811
    """The staged tokenizer is ``tokenizer.model`` as the manifest names it (it was once staged as
    ``tokenizer.json``: the commit dropped it and the dataset had no tokenizer)."""
    from wakong.tokenizer import load_tokenizer

    tok = load_tokenizer(sp_model[0])
    config = load_config(overrides=SETTINGS + ["output.num_shards=2", "seed=5"])
    multihost.build(_texts(9), tmp_path / "local", config, tokenizer=tok)
    beam.build(_texts(9), tmp_path / "beam", config, tokenizer=tok)
    _same_dataset(tmp_path / "beam", tmp_path / "local")
    assert "tokenizer.model" in os.listdir(tmp_path / "beam")


@needs_beam
def test_workers_reach_the_files_through_worker_paths(tmp_path, inputs, tok_file, reference, monkeypatch):
    """Workers that see the launcher's files elsewhere (a bucket the launcher mounts): they copy the input
    files they read and write shards and the manifest through Beam's FileSystems. Here the launcher's
    ``view`` is a symlink to ``real``, where the workers are sent."""
    real, view = tmp_path / "real", tmp_path / "view"
    real.mkdir()
    view.symlink_to(real, target_is_directory=True)
    for path in inputs:
        shutil.copy(path, real)
    calls = {"fetch": [], "put": []}
    fetch, put = beam._fetch, beam._put
    monkeypatch.setattr(beam, "_fetch", lambda url: calls["fetch"].append(url) or fetch(url))
    monkeypatch.setattr(beam, "_put", lambda local, d, name: calls["put"].append((d, name)) or put(local, d, name))
    argv = _argv([str(view / os.path.basename(p)) for p in inputs], view / "data", tok_file, 2, *IN_MEMORY,
                 "--worker-path", f"{view}={real}")
    assert main(argv) == 0
    _same_dataset(view / "data", reference / "seed2")
    assert sorted(set(calls["fetch"])) == [str(real / "a.txt"), str(real / "b.txt")]  # the empty file holds no record
    staging = records.staging_dir(str(real / "data"), 0, 1)
    assert sorted(calls["put"]) == [(staging, f"done-shard-{k:05d}-of-00004.json") for k in range(4)] + [
        (staging, records.manifest_name(0, 1))] + [
        (staging, f"part-00000-of-00001-shard-{k:05d}-of-00004.array_record") for k in range(4)]
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("wakong-input-", "wakong-stage-"))]


# ---------------------------------------------------------------- faults


def _old(tmp_path, reference):
    out = tmp_path / "data"
    shutil.copytree(reference / "seed1", out)
    return out, dataset_files(out)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` remains (Linux /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _killed(phase, argv, module="beam"):
    """Runs ``wakong`` ARGV in a launcher that is SIGKILLed at ``phase`` (of ``wakong.<module>._phase``);
    waits for its workers to end."""
    launcher = subprocess.Popen([sys.executable, "-c", KILL, module, phase, *argv], cwd=ROOT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        _, err = launcher.communicate(timeout=300)
        assert launcher.returncode == -signal.SIGKILL, err[-3000:]
        deadline = time.monotonic() + 60
        while _group_alive(launcher.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(launcher.pid), "Beam's worker processes outlived the killed launcher"
    finally:
        if _group_alive(launcher.pid):
            os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.multiprocess
@needs_beam
def test_killed_multiprocess_build_keeps_the_old_dataset_and_a_rerun_finishes_it(tmp_path, inputs, tok_file,
                                                                                   reference):
    """Killed when a worker finished a shard; the rerun (Beam again) builds only the shards not finished."""
    out, before = _old(tmp_path, reference)
    _killed("shard", _argv(inputs, out, tok_file, 2, "--overwrite", *MULTIPROCESS))  # killed by a worker
    staging = records.staging_dir(str(out), 0, 1)
    staged = os.listdir(staging)
    assert any(n.startswith("part-") for n in staged) and records.manifest_name(0, 1) not in staged
    assert {k: v for k, v in dataset_files(out).items() if not k.startswith(".staging-")} == before
    old = records.read_manifests(str(out))
    assert _timeless(old) == {**_timeless(records.read_manifests(str(reference / "seed1"))), "files": old["files"]}
    done = shards.finished(staging, 4)
    assert done  # at least the shard whose task killed the launcher (others may have finished as well)
    with _building_only_missing_shards(staging, done, 32):
        assert main(_argv(inputs, out, tok_file, 2, "--overwrite", *IN_MEMORY)) == 0
    _same_dataset(out, reference / "seed2")


@needs_beam
def test_killed_in_process_build_is_resumed_by_beam(tmp_path, inputs, tok_file, reference):
    out = tmp_path / "data"
    _killed("shards", _argv(inputs, out, tok_file, 2), module="pipeline")  # halfway: shards 0 and 1 finished
    staging = records.staging_dir(str(out), 0, 1)
    done = shards.finished(staging, 4)
    assert sorted(done) == [0, 1]
    with _building_only_missing_shards(staging, done, 32):
        assert main(_argv(inputs, out, tok_file, 2, *IN_MEMORY)) == 0
    _same_dataset(out, reference / "seed2")


@contextlib.contextmanager
def _building_only_missing_shards(staging, done, n_records, num_shards=4):
    """The build in the block (in this process: Beam's in-memory DirectRunner or the in-process build) must
    make exactly the records of the shards not ``done`` (each once) and commit the finished shards' files
    as they are (the same inodes and mtimes) into the dataset directory, ``staging``'s parent."""
    files = {r["files"][0]["file"]: os.stat(os.path.join(staging, r["files"][0]["file"])) for r in done.values()}
    built = []
    make = shards.make_outcomes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shards, "make_outcomes", lambda *args: built.extend(args[3]) or make(*args))
        yield
    ranges = shards.shard_ranges(n_records, num_shards)
    assert sorted(built) == [i for k in range(num_shards) if k not in done for i in ranges[k]]
    for name, before in files.items():
        after = os.stat(os.path.join(os.path.dirname(staging), name))
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@needs_beam
def test_launcher_killed_after_the_pipeline_is_finished_without_rebuilding(tmp_path, inputs, tok_file, reference,
                                                                         monkeypatch):
    out = tmp_path / "data"
    _killed("staged", _argv(inputs, out, tok_file, 2, *IN_MEMORY))
    with pytest.raises(records.DatasetError):
        records.read_manifests(str(out))
    monkeypatch.setattr(beam, "_run", lambda *a: pytest.fail("the staged part was built again"))
    assert main(_argv(inputs, out, tok_file, 2, *IN_MEMORY)) == 0
    _same_dataset(out, reference / "seed2")


def _job(tmp_path, inputs, tokenizer, num_shards=4):  # noqa: F811
    source = TextSource(inputs, "paragraph")
    config = load_config(overrides=SETTINGS + [f"output.num_shards={num_shards}", "seed=2"])
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / beam._marker("r1")).touch()
    return beam._Job(source, config, tokenizer, str(staging), "r1", {}), staging


def test_failed_and_repeated_shard_tasks_leave_one_complete_shard(tmp_path, inputs, tokenizer,  # noqa: F811
                                                                   monkeypatch):
    job, staging = _job(tmp_path, inputs, tokenizer)
    (first,) = beam._build_shard(1, job)
    name = first["shards"]["1"]["file"]
    data = (staging / name).read_bytes()
    real = records._array_record_writer

    class Failing:  # a task that dies after three records
        def __init__(self, path):
            self.inner, self.writes = real(path), 0

        def write(self, record):
            self.writes += 1
            if self.writes > 3:
                raise OSError(5, "Input/output error")
            self.inner.write(record)

        def close(self):
            self.inner.close()

    monkeypatch.setattr(records, "_array_record_writer", Failing)
    with pytest.raises(records.DatasetWriteError, match="Input/output error"):
        list(beam._build_shard(1, job))
    monkeypatch.undo()
    assert (staging / name).read_bytes() == data  # the failed attempt left the shard and no temporary file
    (again,) = beam._build_shard(1, job)  # a retry, or a duplicated task
    assert sorted(os.listdir(staging)) == sorted([beam._marker("r1"), name, "done-shard-00001-of-00004.json"])
    assert (staging / name).read_bytes() == data
    assert {k: v for k, v in again.items() if k not in ("started", "finished")} == \
        {k: v for k, v in first.items() if k not in ("started", "finished")}


def test_shard_tally_sums_to_the_in_process_accounting(tmp_path, inputs, tokenizer):  # noqa: F811
    job, staging = _job(tmp_path, inputs, tokenizer, num_shards=3)
    states = [s for k in range(3) for s in beam._build_shard(k, job)]
    total = beam._sum_states(job.config, [beam._sum_states(job.config, states[:2]), states[2]])
    tally = Tally(job.config).merge(total)
    out = tmp_path / "local"
    manifest = pipeline.build(TextSource(inputs, "paragraph"), out, job.config, tokenizer=tokenizer)
    assert tally.manifest_counts() == manifest["counts"] and tally.stats.state() == manifest["mask_stats"]
    assert [total["shards"][str(k)] for k in range(3)] == manifest["shards"]
    with pytest.raises(RuntimeError, match=r"shards \[1\] were counted twice"):
        beam._sum_states(job.config, [states[1], states[1]])


def test_shard_tasks_leave_the_summaries_of_the_in_process_build(tmp_path, inputs, tokenizer):  # noqa: F811
    """Each task stages its shard's summary as the in-process build does (same name, same bytes), so either
    runner's rerun reuses the shards of the other; their tallies sum as the tasks' own."""
    job, staging = _job(tmp_path, inputs, tokenizer)
    states = [s for k in (0, 2) for s in beam._build_shard(k, job)]
    local = tmp_path / "local"
    local.mkdir()
    in_process = shards.ShardJob(TextSource(inputs, "paragraph"), job.config, tokenizer, str(local), job.prefix,
                                 range(job.n))
    for k in (0, 2):
        in_process(k)
    done = shards.finished(str(staging), 4)
    assert sorted(done) == [0, 2] and done == shards.finished(str(local), 4)
    for k in (0, 2):
        name = f"done-shard-{k:05d}-of-00004.json"
        assert (staging / name).read_bytes() == (local / name).read_bytes()
    reused, built = beam._reused(job.config, done), beam._sum_states(job.config, states)
    assert reused["shards"] == built["shards"] and reused["started"] is None
    assert Tally(job.config).merge(reused).state() == Tally(job.config).merge(built).state()


def _staging_of_a_killed_build(out, source, config, tokenizer):  # noqa: F811
    """``out``'s staging directory as a Beam run ``old`` of this part leaves it when killed before any shard
    (progress.json, its marker), and that run's job (its tasks)."""
    staging = records.staging_dir(str(out), 0, 1)
    pipeline.open_staging(staging)
    pipeline.write_progress(staging, pipeline.part_identity(source, config, tokenizer))
    open(os.path.join(staging, beam._marker("old")), "w").close()
    return staging, beam._Job(source, config, tokenizer, staging, "old", {})


@pytest.mark.parametrize("runner", [pytest.param("beam", marks=needs_beam), "in process"])
def test_a_rerun_keeps_the_shards_a_killed_build_finished(tmp_path, inputs, tokenizer, monkeypatch,  # noqa: F811
                                                          runner):
    """A staging directory as a killed build leaves it: shard 0 by a Beam task, 1 by the in-process build, 2
    damaged, 3 cut short (a temporary file), an abandoned Beam run's marker. The rerun, with either runner,
    removes the marker and temporaries, builds shards 2 and 3 only and writes the dataset of a fresh build."""
    source = TextSource(inputs, "paragraph")
    config = load_config(overrides=SETTINGS + ["output.num_shards=4", "seed=2"])
    multihost.build(source, tmp_path / "fresh", config, tokenizer=tokenizer)
    out = tmp_path / "data"
    staging, old = _staging_of_a_killed_build(out, source, config, tokenizer)
    for name in (".part-00000-of-00001-shard-00003-of-00004.array_record.tmp-9-0a1b2c3d",
                 "tokenizer.json.tmp-9-0a1b2c3d"):
        open(os.path.join(staging, name), "w").close()
    for shard in (0, 2):
        list(beam._build_shard(shard, old))
    shards.ShardJob(source, config, tokenizer, staging, old.prefix, range(len(source)))(1)
    damaged = os.path.join(staging, shards.finished(staging, 4)[2]["files"][0]["file"])
    data = open(damaged, "rb").read()
    with open(damaged, "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 1]))  # same size, another sha256
    done = shards.finished(staging, 4)
    assert sorted(done) == [0, 1]
    seen = []

    def phase(name):  # when the rerun starts building: only its own marker is left
        if name in ("pipeline", "staging"):
            seen.append(sorted(n for n in os.listdir(staging) if n.startswith(".") or ".tmp-" in n))
            with pytest.raises(beam.BeamBuildError, match="no longer belongs to this build"):
                old.check_run()  # the abandoned run's tasks stop

    monkeypatch.setattr(beam if runner == "beam" else pipeline, "_phase", phase)
    with _building_only_missing_shards(staging, done, len(source)):
        manifest = (beam.build if runner == "beam" else multihost.build)(source, out, config, tokenizer=tokenizer)
    assert len(seen) == 1 and [n.startswith(".beam-run-") for n in seen[0]] == ([True] if runner == "beam" else [])
    assert manifest["timing"].get("runner") == ("DirectRunner" if runner == "beam" else None)
    _same_dataset(out, tmp_path / "fresh")


@needs_beam
def test_a_rerun_after_every_shard_finished_builds_none(tmp_path, tokenizer):  # noqa: F811
    """Killed after its last shard, before the part manifest: the rerun's pipeline has no shard task; the
    combiner sums the finished shards' tallies alone."""
    source = _texts(9)
    config = load_config(overrides=SETTINGS + ["output.num_shards=3", "seed=6"])
    multihost.build(source, tmp_path / "fresh", config, tokenizer=tokenizer)
    staging, old = _staging_of_a_killed_build(tmp_path / "data", source, config, tokenizer)
    for shard in range(3):
        list(beam._build_shard(shard, old))
    with _building_only_missing_shards(staging, shards.finished(staging, 3), len(source), num_shards=3):
        manifest = beam.build(source, tmp_path / "data", config, tokenizer=tokenizer)
    assert manifest["timing"]["loop_seconds"] == 0.0
    _same_dataset(tmp_path / "data", tmp_path / "fresh")


def test_a_task_of_an_abandoned_run_stops_before_writing(tmp_path, inputs, tokenizer):  # noqa: F811
    job, staging = _job(tmp_path, inputs, tokenizer)
    os.remove(staging / beam._marker("r1"))  # a newer run replaced the staging directory
    with pytest.raises(beam.BeamBuildError, match="no longer belongs to this build"):
        list(beam._build_shard(0, job))
    assert os.listdir(staging) == []


@needs_beam
def test_pipeline_failure_is_one_line_and_keeps_the_old_dataset(tmp_path, inputs, tok_file, reference, monkeypatch,
                                                                capsys):
    out, before = _old(tmp_path, reference)
    copies = [str(tmp_path / os.path.basename(p)) for p in inputs]
    for src, dst in zip(inputs, copies):
        shutil.copy(src, dst)

    def edit(name):  # the input changes after the launcher read it, before the workers do
        if name == "pipeline":
            with open(copies[2], "ab") as f:
                f.write(b"\nappended\n")

    monkeypatch.setattr(beam, "_phase", edit)
    assert main(_argv(copies, out, tok_file, 2, "--overwrite", *IN_MEMORY)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("wakong: error: the Beam pipeline failed: ValueError: input file ")
    assert "b.txt changed after the build started" in err[-1] and "Traceback" not in "\n".join(err)
    assert dataset_files(out) == before  # staging removed, nothing replaced


@needs_beam
def test_ctrl_c_during_a_beam_build_is_an_interruption(tmp_path, inputs, tok_file, reference, monkeypatch, capsys):
    out, before = _old(tmp_path, reference)

    def interrupt(name):
        if name == "pipeline":
            raise KeyboardInterrupt

    monkeypatch.setattr(beam, "_phase", interrupt)
    assert main(_argv(inputs, out, tok_file, 2, "--overwrite", *IN_MEMORY)) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
    assert dataset_files(out) == before
