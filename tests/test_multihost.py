"""Multi-host: jaxsample.distributed start-up and collectives, wakong builds across processes.

The ``two processes`` tests are real: two Python processes on this machine join JAX's distributed
runtime through a loopback coordinator (CPU devices, gloo collectives) and run ``wakong build``.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import grain
import jax
import numpy as np
import pytest

from jaxsample import distributed
from jaxsample.distributed import DistributedError, ProcessInfo
from wakong import multihost, records
from wakong.cli import main
from wakong.config import load_config
from wakong.pipeline import build, commit_part, prepare_dir
from wakong.reader import batches
from wakong.sources import TextSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_VARS = [v for k, v in vars(distributed).items() if k.startswith("ENV_")]
SMALL = ["--vocab-size", "1000", "--set", "examples.max_source_len=64", "--set", "examples.max_target_len=64",
         "--num-shards", "2", "--seed", "5", "--no-progress", "--no-plots"]
TIMEOUT = 150  # seconds for a two-process job (several times what it needs on a loaded machine)


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """17 records: 13 Python doc topics plus an empty, a blank, a too-short and an invalid UTF-8 line."""
    from pydoc_data.topics import topics

    lines = [" ".join(topics[name].split()).encode() for name in sorted(topics)[:13]]
    lines[4:4] = [b"", b"   ", b"short", b"bad \xff\xfe bytes in a line"]
    path = tmp_path_factory.mktemp("mh") / "corpus.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


@pytest.fixture(scope="module")
def single(tmp_path_factory, corpus) -> str:
    """The one-process build every multi-process result must equal."""
    out = str(tmp_path_factory.mktemp("single") / "data")
    for name in ENV_VARS:
        assert name not in os.environ
    assert main(["build", corpus, "--out", out, *SMALL]) == 0
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The driver imports every package first (none may start a JAX backend, or initialize() could not
# run), initialises from the JAXSAMPLE_* variables, then runs the CLI named by its first argument
# (wakong.cli or jaxsample.__main__), which initialises again.
DRIVER = """
import importlib, sys
import jaxsample, jaxsample.decoding, jaxsample.models, jaxsample.presets, jaxsample.structured
from jaxsample import distributed
first = distributed.initialize()
code = importlib.import_module(sys.argv[1]).main(sys.argv[2:])
assert distributed.initialize() == first and first.count == 2, first
sys.exit(code)
"""


def _run_processes(tmp_path, argv_of, env_of, name: str) -> list[tuple[int, str, str]]:
    """Runs the driver as processes 0 and 1: (exit code, stdout, stderr) of each. Kills them on timeout."""
    procs, files = [], []
    try:
        for i in range(2):
            out, err = (open(tmp_path / f"{name}-{i}.{s}", "w+") for s in ("out", "err"))
            files += [out, err]
            env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_of(i)}
            command = [sys.executable, "-c", DRIVER, *argv_of(i)]  # argv_of(i)[0]: the CLI module
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err))
        deadline = time.monotonic() + TIMEOUT
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for i, proc in enumerate(procs):
        out, err = files[2 * i], files[2 * i + 1]
        out.seek(0), err.seek(0)
        results.append((proc.returncode, out.read(), err.read()))
    for f in files:
        f.close()
    return results


def _settings(port: int):
    """The JAXSAMPLE_* variables of process ``i`` of a 2-process job with a loopback coordinator."""
    return lambda i: {
        "JAXSAMPLE_COORDINATOR": f"127.0.0.1:{port}",
        "JAXSAMPLE_NUM_PROCESSES": "2",
        "JAXSAMPLE_PROCESS_ID": str(i),
    }


def _raw_records(path: str, part: int | None = None) -> list[bytes]:
    source = grain.sources.ArrayRecordDataSource(records.read_manifests(path, part)["files"])
    return [bytes(source[i]) for i in range(len(source))]


def _key(data: bytes) -> tuple[int, int]:
    record = records.decode_record(data)
    return record["index"], record["part"]


def _by_index(raw: list[bytes]) -> list[bytes]:
    return sorted(raw, key=_key)


def _rows(path, **kwargs) -> list[tuple[int, int]]:
    out = []
    for b in batches(path, batch_size=8, seed=1, **kwargs):
        out += [(int(i), int(p)) for i, p in zip(b["index"], b["part"]) if i >= 0]
    return out


# ---------------------------------------------------------------- two real processes


@pytest.mark.multiprocess
def test_two_processes_build_exactly_the_one_process_dataset(tmp_path, corpus, single):
    out, port = str(tmp_path / "data"), _free_port()
    flags = lambda i: ["wakong.cli", "build", corpus, "--out", out, *SMALL,  # noqa: E731
                       "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)]
    (code0, out0, err0), (code1, out1, err1) = _run_processes(tmp_path, flags, _settings(port), "build")
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "records in                  17" in out0 and "processes                    2" in out0
    assert "records in" not in out1 and "process 1 of 2: built part 1 (8 records" in err1
    assert "training a byte-level BPE" in err0 and "training" not in err1  # only process 0 trains

    merged, one = records.read_manifests(out), records.read_manifests(single)
    assert merged["counts"] == one["counts"] and merged["counts"]["records_in"] == 17
    assert [p["counts"]["records_in"] for p in merged["parts"]] == [9, 8]
    assert merged["tokenizer"]["sha256"] == one["tokenizer"]["sha256"]
    with open(os.path.join(out, records.DATASET_MANIFEST)) as f:
        dataset = json.load(f)
    with open(os.path.join(single, records.DATASET_MANIFEST)) as f:
        reference = json.load(f)
    assert dataset["process_count"] == 2 and dataset["counts"] == reference["counts"]
    assert dataset["mask_stats"] == reference["mask_stats"]
    assert dataset["parts"] == merged["parts"]

    raw = _raw_records(out)
    keys = [_key(r) for r in raw]
    assert len(keys) == len(set(keys)) == one["counts"]["examples"]  # nothing lost or duplicated
    assert _by_index(raw) == _by_index(_raw_records(single))  # byte-identical examples
    parts = [_raw_records(out, part=k) for k in range(2)]
    assert {records.decode_record(r)["index"] % 2 for r in parts[1]} == {1}
    assert _by_index(parts[0] + parts[1]) == _by_index(raw)

    shared = _rows(out, process_index=0, process_count=2) + _rows(out, process_index=1, process_count=2)
    whole = _rows(single, process_index=0, process_count=1)
    assert sorted(shared) == sorted(whole) and len(set(shared)) == len(shared)
    assert sorted(_rows(out, part=0) + _rows(out, part=1)) == sorted(whole)


@pytest.mark.multiprocess
def test_two_processes_without_a_shared_directory(tmp_path, corpus, single):
    """Each process writes into its own directory (hosts with local disks only)."""
    port = _free_port()
    flags = lambda i: ["wakong.cli", "build", corpus, "--out", str(tmp_path / f"host{i}"), *SMALL]  # noqa: E731
    (code0, out0, err0), (code1, _, err1) = _run_processes(tmp_path, flags, _settings(port), "local")
    assert code0 == 0 and code1 == 0, err0 + err1
    host0, host1 = str(tmp_path / "host0"), str(tmp_path / "host1")
    assert "records in                  17" in out0
    copies = []
    for host in (host0, host1):
        with open(os.path.join(host, records.DATASET_MANIFEST)) as f:
            copies.append(json.load(f))
    assert copies[0] == copies[1] and copies[0]["process_count"] == 2  # process 1 wrote its own copy
    with pytest.raises(records.DatasetError, match=r"parts \[1\] of 2 are not here"):
        records.read_manifests(host0)
    own = [_raw_records(host, part=k) for k, host in enumerate((host0, host1))]
    assert _by_index(own[0] + own[1]) == _by_index(_raw_records(single))
    whole = _rows(single, process_index=0, process_count=1)
    assert sorted(_rows(host0, part=0) + _rows(host1, part=1)) == sorted(whole)


def test_a_failing_process_stops_every_process_with_its_error(tmp_path, corpus):
    out, port = tmp_path / "data", _free_port()
    out.mkdir()
    (out / records.manifest_name(1, 2)).write_text("{}")  # only process 1 finds a part it would replace
    argv = ["wakong.cli", "build", corpus, "--out", str(out), *SMALL]
    (code0, _, err0), (code1, _, err1) = _run_processes(tmp_path, lambda i: argv, _settings(port), "fail")
    assert code0 == code1 == 1
    assert err1.startswith("wakong: error:") and "already holds a dataset" in err1
    assert "process 1 of 2 failed in 'prepare': FileExistsError" in err0 and "Traceback" not in err0
    assert sorted(os.listdir(out)) == [records.manifest_name(1, 2)]  # nothing was built


# ---------------------------------------------------------------- start-up settings


@pytest.mark.parametrize(
    "args,environ,expected",
    [
        ({}, {}, (False, {})),
        ({}, {"JAXSAMPLE_DISTRIBUTED": "1"}, (True, {})),
        ({}, {"JAXSAMPLE_DISTRIBUTED": "0"}, (False, {})),
        ({"distributed": True, "local_device_ids": "0, 1"}, {}, (True, {"local_device_ids": [0, 1]})),
        (
            {"coordinator": "10.0.0.1:1234", "num_processes": 4, "process_id": 3},
            {},
            (True, {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}),
        ),
        (
            {"process_id": 0},  # arguments win over the environment, field by field
            {"JAXSAMPLE_COORDINATOR": "host:99", "JAXSAMPLE_NUM_PROCESSES": "2", "JAXSAMPLE_PROCESS_ID": "1",
             "JAXSAMPLE_LOCAL_DEVICE_IDS": "3"},
            (True, {"coordinator_address": "host:99", "num_processes": 2, "process_id": 0, "local_device_ids": [3]}),
        ),
    ],
)
def test_settings_resolution(args, environ, expected):
    assert distributed._resolve(**args, environ=environ) == expected


@pytest.mark.parametrize(
    "args,environ,message",
    [
        ({"coordinator": "h:1"}, {}, r"missing num_processes \(JAXSAMPLE_NUM_PROCESSES\), process_id"),
        ({}, {"JAXSAMPLE_PROCESS_ID": "1", "JAXSAMPLE_DISTRIBUTED": "1"}, "missing coordinator"),
        ({"coordinator": "h:1", "num_processes": 2, "process_id": 0}, {"JAXSAMPLE_DISTRIBUTED": "0"},
         "given with JAXSAMPLE_DISTRIBUTED=0"),
        ({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, {}, r"process_id must be in \[0, num_processes=2\)"),
        ({"coordinator": "h", "num_processes": 2, "process_id": 0}, {}, "HOST:PORT"),
        ({}, {"JAXSAMPLE_COORDINATOR": "h:1", "JAXSAMPLE_NUM_PROCESSES": "two", "JAXSAMPLE_PROCESS_ID": "0"},
         "JAXSAMPLE_NUM_PROCESSES must be an integer >= 1, got 'two'"),
        ({"coordinator": "h:1", "num_processes": 0, "process_id": 0}, {}, "num_processes must be an integer >= 1"),
        ({}, {"JAXSAMPLE_DISTRIBUTED": "maybe"}, "JAXSAMPLE_DISTRIBUTED must be 0 or 1"),
        ({"local_device_ids": [0]}, {}, "only apply to a distributed run"),
        ({"distributed": True, "local_device_ids": "a"}, {}, "device ids like 0,1,2"),
    ],
)
def test_bad_settings_are_refused_naming_the_problem(args, environ, message):
    with pytest.raises(ValueError, match=message):
        distributed._resolve(**args, environ=environ)


class FakeJax:
    """Stands in for JAX's distributed runtime: records initialize() calls."""

    def __init__(self, monkeypatch, index=1, count=2):
        self.calls, self.up, self.index, self.count = [], False, index, count
        monkeypatch.setattr(jax.distributed, "initialize", self.initialize)
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: self.up)
        monkeypatch.setattr(jax, "process_index", lambda: self.index)
        monkeypatch.setattr(jax, "process_count", lambda: self.count)

    def initialize(self, **kwargs):
        if self.up:
            raise RuntimeError("distributed.initialize should only be called once.")
        self.calls.append(kwargs)
        self.up = True


def test_initialize_single_process_touches_nothing(monkeypatch):
    fake = FakeJax(monkeypatch)
    assert distributed.initialize(environ={}) == ProcessInfo(0, 1, False) and fake.calls == []
    assert ProcessInfo().is_main and not ProcessInfo(1, 2, True).is_main


def test_initialize_is_safe_to_call_again(monkeypatch):
    fake = FakeJax(monkeypatch)
    first = distributed.initialize(environ={"JAXSAMPLE_DISTRIBUTED": "1"})
    assert first == ProcessInfo(1, 2, True) and fake.calls == [{}]  # auto-detection: no arguments
    assert distributed.initialize(environ={"JAXSAMPLE_DISTRIBUTED": "1"}) == first
    assert distributed.initialize(environ={}) == first  # the running runtime is reported
    assert distributed.initialize("h:1", 2, 1, environ={}) == first  # compatible explicit settings
    with pytest.raises(DistributedError, match="runs as process 1 of 2; cannot initialise as process 0 of 2"):
        distributed.initialize("h:1", 2, 0, environ={})
    assert fake.calls == [{}]


def test_initialize_failures_name_the_settings(monkeypatch):
    def unreachable(**kwargs):
        raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")

    FakeJax(monkeypatch)
    monkeypatch.setattr(jax.distributed, "initialize", unreachable)
    message = r"initialize\(coordinator_address=h:1, num_processes=2, process_id=1\) failed: DEADLINE_EXCEEDED"
    with pytest.raises(DistributedError, match=message):
        distributed.initialize("h:1", 2, 1, environ={})


def test_initialize_passes_explicit_settings(monkeypatch):
    fake = FakeJax(monkeypatch, index=0, count=3)
    env = {"JAXSAMPLE_COORDINATOR": "10.1.2.3:8476", "JAXSAMPLE_NUM_PROCESSES": "3", "JAXSAMPLE_PROCESS_ID": "0"}
    assert distributed.initialize(environ=env) == ProcessInfo(0, 3, True)
    assert fake.calls == [{"coordinator_address": "10.1.2.3:8476", "num_processes": 3, "process_id": 0}]


def test_cli_flags(monkeypatch):
    parser = argparse.ArgumentParser()
    distributed.add_arguments(parser)
    fake = FakeJax(monkeypatch, index=1, count=2)
    args = parser.parse_args(["--coordinator", "h:5", "--num-processes", "2", "--process-id", "1",
                              "--local-device-ids", "0,1"])
    assert distributed.from_args(args) == ProcessInfo(1, 2, True)
    assert fake.calls == [{"coordinator_address": "h:5", "num_processes": 2, "process_id": 1, "local_device_ids": [0, 1]}]
    none = parser.parse_args([])
    assert none.distributed is None and parser.parse_args(["--distributed"]).distributed is True


def test_wakong_build_reports_bad_settings_in_one_line(tmp_path, corpus, capsys, monkeypatch):
    assert main(["build", corpus, "--out", str(tmp_path), "--coordinator", "h:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wakong: error: incomplete distributed settings") and "Traceback" not in err
    monkeypatch.setenv("JAXSAMPLE_DISTRIBUTED", "yes please")
    assert main(["build", corpus, "--out", str(tmp_path)]) == 1
    assert "JAXSAMPLE_DISTRIBUTED must be 0 or 1" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- collectives on one process


def test_collectives_on_one_process():
    assert distributed.allgather_bytes(b"x\0y") == [b"x\0y"]
    assert distributed.gather_bytes(b"a") == [b"a"] and distributed.broadcast_bytes(b"b") == b"b"
    distributed.barrier("one")
    with pytest.raises(KeyError):
        with distributed.together("step"):
            raise KeyError("own errors propagate unchanged")
    assert distributed._words(b"abcde", 8).tolist() == list(np.frombuffer(b"abcde\0\0\0", "<i4"))
    assert [distributed._padded(n) for n in (0, 64, 65, 1000)] == [64, 64, 128, 1024]


def test_together_reports_other_processes_errors(monkeypatch):
    """The agreement logic, with the gather replaced by what the other process sent."""
    monkeypatch.setattr(distributed, "process_count", lambda: 2)
    sent = {}

    def gather(status, other):
        sent["mine"] = status
        return [status, other]

    monkeypatch.setattr(distributed, "allgather_bytes", lambda s: gather(s, b"step\0!OSError: disk full"))
    with pytest.raises(DistributedError, match="process 1 of 2 failed in 'step': OSError: disk full"):
        with distributed.together("step"):
            pass
    assert sent["mine"] == b"step\0"
    monkeypatch.setattr(distributed, "allgather_bytes", lambda s: gather(s, b"other\0"))
    with pytest.raises(DistributedError, match="reached different steps"):
        with distributed.together("step"):
            pass
    monkeypatch.setattr(distributed, "allgather_bytes", lambda s: gather(s, b"step\0"))
    with pytest.raises(ValueError, match="mine"):
        with distributed.together("step"):
            raise ValueError("mine")
    assert sent["mine"] == b"step\0!ValueError: mine"


# ---------------------------------------------------------------- manifests, merging, per-part reading


@pytest.fixture(scope="module")
def parts(tmp_path_factory, corpus, single):
    """The single build's data as two parts built one after the other (no coordination)."""
    out = tmp_path_factory.mktemp("parts")
    config = load_config(overrides=["examples.max_source_len=64", "examples.max_target_len=64",
                                    "output.num_shards=2", "seed=5"])
    from wakong.tokenizer import load_tokenizer

    tok = load_tokenizer(single)
    manifests = [build(TextSource([corpus]), out, config, tokenizer=tok, process_index=i, process_count=2)
                 for i in range(2)]
    return str(out), config, [json.loads(json.dumps(m)) for m in manifests]


def test_merge_checks_that_parts_make_one_dataset(parts, single):
    _, config, (a, b) = parts
    merged = multihost.merge([b, a], config)
    assert merged["counts"] == records.read_manifests(single)["counts"]
    assert [p["process_index"] for p in merged["parts"]] == [0, 1]
    bad = [
        ([a], r"parts \[1\] of 2 are missing"),
        ([a, a, b], r"parts \[0\] appear more than once"),
        ([a, {**b, "seed": 6}], "part 1 differs from part 0 in seed"),
        ([a, {**b, "tokenizer": {**b["tokenizer"], "sha256": "0"}}], "part 1 was built with a different tokenizer"),
        ([a, {**b, "source": {**b["source"], "files": [{**b["source"]["files"][0], "sha256": "0"}]}}],
         "part 1 read other input"),
        ([a, {**b, "counts": {**b["counts"], "records_in": 9}}], "part 1 accounts for 9 records"),
        ([a, {**b, "counts": {**b["counts"], "records_written": 0}}], r"part 1 accounts for 8 records \(0 written"),
        ([a, {**b, "version": 0}], "part 1 has manifest version 0"),
    ]
    for group, message in bad:
        with pytest.raises(records.DatasetError, match=message):
            multihost.merge(group, config)
    moved = {**b, "source": {**b["source"], "files": [{**b["source"]["files"][0], "path": "/elsewhere.txt"}]}}
    assert multihost.merge([a, moved], config)["counts"] == merged["counts"]  # paths may differ per host


def test_one_process_build_writes_the_dataset_manifest(tmp_path, parts, corpus):
    _, config, _ = parts
    m = multihost.build(TextSource([corpus]), tmp_path, config, processes=ProcessInfo())
    assert m["process_count"] == 1 and m["timing"]["processes"] == 1
    with open(tmp_path / records.DATASET_MANIFEST) as f:
        assert json.load(f) == m
    part = tmp_path / records.manifest_name(0, 1)
    part.write_text(part.read_text().replace('"seed": 5', '"seed": 6'))
    with pytest.raises(records.DatasetError, match="is not the part listed in"):
        records.read_manifests(str(tmp_path))
    with pytest.raises(ValueError, match="needs JAX's distributed runtime with as many"):
        multihost.build(TextSource([corpus]), tmp_path, config, processes=ProcessInfo(0, 2, True), overwrite=True)


def test_hosts_without_a_shared_directory_read_their_own_part(tmp_path, parts):
    path, _, (a, b) = parts
    host0 = tmp_path / "host0"  # what worker 0 holds: its part, the tokenizer and the dataset manifest
    host0.mkdir()
    for name in ["tokenizer.json", records.manifest_name(0, 2)] + [s["file"] for s in a["shards"]]:
        (host0 / name).write_bytes(open(os.path.join(path, name), "rb").read())
    records.write_json_atomic(str(host0 / records.DATASET_MANIFEST), multihost.merge([a, b], parts[1]))
    with pytest.raises(records.DatasetError, match=r"parts \[1\] of 2 are not here.*part=process_index"):
        records.read_manifests(str(host0))
    own = records.read_manifests(str(host0), part=0)
    assert own["counts"] == a["counts"] and len(own["files"]) == 2
    assert sorted(_rows(str(host0), part=0)) == sorted(_rows(path, part=0))
    with pytest.raises(records.DatasetError, match="no manifest of part 1"):
        records.read_manifests(str(host0), part=1)
    with pytest.raises(ValueError, match="give part"):
        batches(str(host0), batch_size=2, part=0, process_count=1)


def test_prepare_dir_and_commit_replace_only_what_the_part_owns(tmp_path):
    def touch(*names):
        for name in names:
            (tmp_path / name).write_text("x")

    mine = ["manifest-00001-of-00002.json", "part-00001-of-00002-shard-00000-of-00001.array_record"]
    other = ["manifest-00000-of-00002.json", "part-00000-of-00002-shard-00000-of-00001.array_record"]
    stale = ["manifest-00000-of-00003.json", "part-00002-of-00003-shard-00000-of-00001.array_record",
             records.DATASET_MANIFEST]
    temporary = [".part-00001-of-00002-shard-00000-of-00001.array_record.tmp-1-ab", ".manifest-00001-of-00002.json.tmp-1-cd"]
    touch(*mine, *other, *stale, *temporary, ".manifest-00000-of-00002.json.tmp-1-ef")
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        prepare_dir(str(tmp_path), 1, 2)
    assert prepare_dir(str(tmp_path), 1, 2, overwrite=True) is None  # only temporary files go now
    kept = sorted(mine + other + stale + [".manifest-00000-of-00002.json.tmp-1-ef"])  # the other part's temporary stays
    assert sorted(os.listdir(tmp_path)) == kept
    staging = records.staging_dir(str(tmp_path), 1, 2)
    os.mkdir(staging)
    shard = "part-00001-of-00002-shard-00000-of-00002.array_record"
    for name in (shard, "tokenizer.json", "manifest-00001-of-00002.json"):
        with open(os.path.join(staging, name), "w") as f:
            f.write("new")
    commit_part(str(tmp_path), staging, {"process_index": 1, "process_count": 2, "shards": [{"file": shard}]})
    assert sorted(os.listdir(tmp_path)) == sorted(other + [shard, "tokenizer.json", "manifest-00001-of-00002.json",
                                                           ".manifest-00000-of-00002.json.tmp-1-ef"])
    assert (tmp_path / "manifest-00001-of-00002.json").read_text() == "new"  # the other host's part stays


@pytest.mark.multiprocess
def test_two_processes_evaluate_exactly_like_one(tmp_path):
    """``python -m jaxsample eval`` on 2 processes (1 CPU device each): process 0 writes what 1 process writes."""
    from tests.test_eval_runner import SAMPLE, _write_fixture

    paths = _write_fixture(str(tmp_path / "fixture"))
    config = tmp_path / "eval.yaml"
    config.write_text(json.dumps({
        "version": 1, "kind": "eval", "checkpoint": paths["checkpoint"], "dataset": {"path": paths["data"], "max_rows": 6},
        "decoding": ["greedy", SAMPLE], "per_device_batch_size": 2, "seed": 3}))
    flags = lambda out: ["eval", "--config", str(config), "--out", str(tmp_path / out)]  # noqa: E731
    one = subprocess.run([sys.executable, "-m", "jaxsample", *flags("one")], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=TIMEOUT)
    assert one.returncode == 0, one.stderr
    port = _free_port()
    (code0, out0, err0), (code1, out1, err1) = _run_processes(
        tmp_path, lambda i: ["jaxsample.__main__", *flags("two")], _settings(port), "eval")
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "| sample | sample |" in out0 and "sample" not in out1  # process 0 reports
    assert sorted(os.listdir(tmp_path / "two")) == ["outputs.jsonl", "results.json", "summary.md"]
    results = {k: json.load(open(tmp_path / k / "results.json")) for k in ("one", "two")}
    assert results["two"]["settings"]["processes"] == 2 and results["one"]["settings"]["processes"] == 1
    for name in ("greedy", "sample"):  # same metrics; only timings differ
        a, b = (results[k]["configs"][name] for k in ("one", "two"))
        assert {k: v for k, v in a.items() if k != "timing"} == {k: v for k, v in b.items() if k != "timing"}
    assert results["one"]["reference"]["nll_per_token"] == pytest.approx(results["two"]["reference"]["nll_per_token"])
    read = lambda k: open(tmp_path / k / "outputs.jsonl").read()  # noqa: E731
    assert read("one") == read("two")  # every row's tokens and text
