"""Reliability of ``wakong build`` under faults: validation before any change, staged builds that keep
the old dataset through failures, interruptions and kills at every phase, reruns that finish a killed
build byte-identically, cleaned temporaries, long unbroken words, and nonsensical CLI numbers."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from tests._helpers import dataset_files, failing_writer
from tests.test_pipeline import SMALL, corpus, tokenizer  # noqa: F401  (fixtures)
from wakong import pipeline, records
from wakong.cli import main
from wakong.config import load_config
from wakong.sources import TextSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: phases of wakong.pipeline.build, in order (see ``pipeline._phase``)
PHASES = ("staging", "shards", "staged", "replacing", "committed")
FLAGS = ["--split", "paragraph", "--no-progress", "--no-plots", "--num-shards", "2",
         "--set", "examples.max_source_len=64", "--set", "examples.max_target_len=64"]
KILL = """
import os, signal, sys
from wakong import pipeline
phase = sys.argv[1]
pipeline._phase = lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == phase else None
from wakong.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory, tokenizer):  # noqa: F811
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(path)
    return str(path)


def _argv(corpus, out, tok_file, seed, *extra):  # noqa: F811
    return ["build", corpus, "--out", str(out), "--tokenizer", tok_file, "--seed", str(seed), *FLAGS, *extra]


def _timeless(data):
    if isinstance(data, dict):
        return {k: _timeless(v) for k, v in data.items() if k != "timing"}
    if isinstance(data, list):
        return [_timeless(v) for v in data]
    return data


def _same_dataset(path, reference) -> None:
    """``path`` holds exactly the dataset of ``reference`` (timings aside) and nothing else."""
    got, want = dataset_files(path), dataset_files(reference)
    assert sorted(got) == sorted(want)  # no staging directory, no temporary file
    manifests = {"manifest.json", records.manifest_name(0, 1)}
    assert {k: v for k, v in got.items() if k not in manifests} == {k: v for k, v in want.items() if k not in manifests}
    assert _timeless(records.read_manifests(str(path))) == {
        **_timeless(records.read_manifests(str(reference))), "files": records.read_manifests(str(path))["files"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, tok_file):  # noqa: F811
    """Clean builds with seeds 1 (the "old" dataset) and 2 (the "new" one)."""
    root = tmp_path_factory.mktemp("reference")
    for seed in (1, 2):
        assert main(_argv(corpus, root / f"seed{seed}", tok_file, seed)) == 0
    return root


def _old(tmp_path, reference):
    """A copy of the seed-1 dataset, and its file digests."""
    import shutil

    out = tmp_path / "data"
    shutil.copytree(reference / "seed1", out)
    return out, dataset_files(out)


# ---------------------------------------------------------------- validation before any change


@pytest.mark.parametrize("bad", [["--tokenizer", "{tmp}/corrupt.json"], ["--tokenizer", "{tmp}/missing.json"],
                                 ["--set", "noise.spans.budget_rate=0.9"], ["--set", "input.max_record_bytes=0"],
                                 "missing input"])
def test_failing_overwrite_keeps_the_old_dataset(tmp_path, corpus, tok_file, reference, capsys, bad):  # noqa: F811
    out, before = _old(tmp_path, reference)
    (tmp_path / "corrupt.json").write_text('{"version": "1.0", "truncated')
    if bad == "missing input":
        argv = _argv(str(tmp_path / "missing.txt"), out, tok_file, 2, "--overwrite")
    else:
        argv = _argv(corpus, out, tok_file, 2, "--overwrite") + [b.replace("{tmp}", str(tmp_path)) for b in bad]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("wakong: error:")
    assert dataset_files(out) == before
    records.read_manifests(str(out))


def _fail_at(phase: str, error: BaseException):
    """A stand-in for ``pipeline._phase`` that raises ``error`` when the build reaches ``phase``."""

    def fail(name):
        if name == phase:
            raise error

    return fail


@pytest.mark.parametrize("phase", ["staging", "shards", "staged"])
def test_failure_before_the_replacement_keeps_the_old_dataset(tmp_path, corpus, tok_file, reference,  # noqa: F811
                                                               monkeypatch, capsys, phase):
    out, before = _old(tmp_path, reference)
    monkeypatch.setattr(pipeline, "_phase", _fail_at(phase, OSError(errno.ENOSPC, "No space left on device")))
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert dataset_files(out) == before  # staging removed, nothing replaced
    monkeypatch.undo()
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 0
    _same_dataset(out, reference / "seed2")


def test_write_error_names_the_real_cause(tmp_path, corpus, tok_file, reference, monkeypatch):  # noqa: F811
    out, before = _old(tmp_path, reference)
    denied = failing_writer(OSError(errno.EACCES, "Permission denied"), 0)
    monkeypatch.setattr(records, "_array_record_writer", denied)
    with pytest.raises(records.DatasetWriteError) as info:
        pipeline.build(TextSource([corpus], "paragraph"), out, load_config(overrides=SMALL + ["seed=2"]),
                       overwrite=True, tokenizer=pipeline.load_tokenizer(tok_file))
    assert info.value.errno == errno.EACCES and "(no permission to write there)" in str(info.value)
    assert "disk" not in str(info.value) and dataset_files(out) == before


def test_ctrl_c_is_an_interruption_not_a_full_disk(tmp_path, corpus, tok_file, reference, monkeypatch, capsys):  # noqa: F811
    out, before = _old(tmp_path, reference)

    monkeypatch.setattr(records, "_array_record_writer", failing_writer(KeyboardInterrupt, 2))
    source, config = TextSource([corpus], "paragraph"), load_config(overrides=SMALL + ["seed=2"])
    with pytest.raises(KeyboardInterrupt):  # not DatasetWriteError
        pipeline.build(source, out, config, overwrite=True, tokenizer=pipeline.load_tokenizer(tok_file))
    assert dataset_files(out) == before
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "disk" not in err and "Traceback" not in err
    assert dataset_files(out) == before


# ---------------------------------------------------------------- failures while replacing, reruns


@pytest.mark.parametrize("phase", ["replacing", "committed"])
def test_failure_while_replacing_is_finished_by_a_rerun(tmp_path, corpus, tok_file, reference, monkeypatch,  # noqa: F811
                                                        capsys, phase):
    out, _ = _old(tmp_path, reference)
    monkeypatch.setattr(pipeline, "_phase", _fail_at(phase, OSError(errno.EIO, "Input/output error")))
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 1
    monkeypatch.undo()
    if phase == "replacing":
        with pytest.raises(records.DatasetError, match="interrupted while replacing the dataset; run the same"):
            records.read_manifests(str(out))
    assert main(_argv(corpus, out, tok_file, 2)) == 0  # the same command, even without --overwrite
    _same_dataset(out, reference / "seed2")
    capsys.readouterr()
    assert main(_argv(corpus, out, tok_file, 3)) == 1  # a finished dataset is still protected
    assert "already holds a dataset" in capsys.readouterr().err


def test_interrupted_replacement_with_other_settings_needs_overwrite(tmp_path, corpus, tok_file, reference,  # noqa: F811
                                                                    monkeypatch, capsys):
    out, _ = _old(tmp_path, reference)
    monkeypatch.setattr(pipeline, "_phase", lambda name: (_ for _ in ()).throw(OSError(5, "EIO")) if name == "replacing"
                        else None)
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 1
    monkeypatch.undo()
    capsys.readouterr()
    assert main(_argv(corpus, out, tok_file, 1)) == 1
    assert "killed while replacing the dataset" in capsys.readouterr().err
    assert main(_argv(corpus, out, tok_file, 1, "--overwrite")) == 0
    _same_dataset(out, reference / "seed1")


def test_temporaries_of_killed_builds_are_cleaned(tmp_path, corpus, tok_file, reference):  # noqa: F811
    leftovers = [".manifest-00000-of-00001.json.tmp-77-0a1b2c3d", ".manifest.json.tmp-77-0a1b2c3d",
                 ".part-00000-of-00001-shard-00000-of-00002.array_record.tmp-77", "tokenizer.json.tmp-77-0a1b2c3d"]
    fresh = tmp_path / "fresh"
    stale_staging = records.staging_dir(str(fresh), 0, 1)
    os.makedirs(stale_staging)
    for name in leftovers:
        (fresh / name).write_text("x")
    (tmp_path / "fresh" / ".staging-part-00000-of-00001" / "part-x").write_text("x")
    assert main(_argv(corpus, fresh, tok_file, 2)) == 0  # a plain build: nothing of a dataset was there
    _same_dataset(fresh, reference / "seed2")
    out, _ = _old(tmp_path, reference)
    for name in leftovers:
        (out / name).write_text("x")
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 0
    _same_dataset(out, reference / "seed2")


# ---------------------------------------------------------------- SIGKILL at each phase


def _killed(phase, argv):
    done = subprocess.run([sys.executable, "-c", KILL, phase, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def _kill_then_rerun(tmp_path, corpus, tok_file, reference, phase, overwrite):  # noqa: F811
    if overwrite:
        out, before = _old(tmp_path, reference)
    else:
        out, before = tmp_path / "data", {}
    extra = ["--overwrite"] if overwrite else []
    _killed(phase, _argv(corpus, out, tok_file, 2, *extra))
    visible = {k: v for k, v in dataset_files(out).items() if not k.startswith(".staging-")}
    if PHASES.index(phase) < PHASES.index("replacing"):
        assert visible == before  # the old dataset (or nothing) is untouched
        if overwrite:
            assert _timeless(records.read_manifests(str(out))) == {
                **_timeless(records.read_manifests(str(reference / "seed1"))),
                "files": records.read_manifests(str(out))["files"]}
    assert main(_argv(corpus, out, tok_file, 2, *extra)) == 0  # the same command finishes the job
    _same_dataset(out, reference / "seed2")


def test_sigkill_while_replacing_then_plain_rerun(tmp_path, corpus, tok_file, reference):  # noqa: F811
    _kill_then_rerun(tmp_path, corpus, tok_file, reference, "replacing", overwrite=False)


@pytest.mark.slow
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_at_every_phase(tmp_path, corpus, tok_file, reference, phase, overwrite):  # noqa: F811
    _kill_then_rerun(tmp_path, corpus, tok_file, reference, phase, overwrite)


# ---------------------------------------------------------------- long words, CLI numbers


def test_one_long_unbroken_word_builds_in_seconds(tmp_path):
    word = tmp_path / "w.txt"
    word.write_text("x" * (1 << 18))
    start = time.perf_counter()
    assert main(["build", str(word), "--out", str(tmp_path / "o"), "--vocab-size", "1000", "--no-progress",
                 "--no-plots"]) == 0
    seconds = time.perf_counter() - start
    assert seconds < 60, seconds  # was 162 s (BPE training is quadratic in a word's length)
    manifest = records.read_manifests(str(tmp_path / "o"))
    assert manifest["tokenizer"]["training"] == {"records": 1, "records_skipped": 0, "long_words_cut": 1}
    c = manifest["counts"]
    assert c["records_in"] == 1 and c["records_written"] == 1 and c["events"]["words_cut"] == 1


def test_training_texts_cut_long_words_only():
    config = load_config(overrides=["input.max_record_bytes=700", "input.oversize=drop"])
    stats = {}
    texts = list(pipeline.training_texts([b"a " + b"y" * 600 + b" b", b"short words", b"z" * 800], config, stats))
    n = pipeline.MAX_TRAINING_PIECE
    assert texts == [" ".join(["a", "y" * n, "y" * n, "y" * (600 - 2 * n), "b"]), "short words"]
    assert stats == {"records": 2, "records_skipped": 1, "long_words_cut": 1}


@pytest.mark.parametrize("argv,flag", [
    (["build", "x.txt", "--out", "o", "--workers", "-1"], "--workers: must be >= 0, got -1"),
    (["build", "x.txt", "--out", "o", "--workers", "two"], "--workers: expected an integer"),
    (["build", "x.txt", "--out", "o", "--num-shards", "0"], "--num-shards: must be >= 1"),
    (["build", "x.txt", "--out", "o", "--vocab-size", "-5"], "--vocab-size: must be >= 1"),
    (["build", "--corpus", "pydoc", "--repeat", "0", "--out", "o"], "--repeat: must be >= 1"),
    (["train-tokenizer", "x.txt", "--out", "t.json", "--vocab-size", "0"], "--vocab-size: must be >= 1"),
    (["inspect", "d", "--examples", "-1"], "--examples: must be >= 0"),
])
def test_nonsensical_numbers_are_refused_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_library_refuses_negative_workers(tmp_path, corpus, tokenizer):  # noqa: F811
    with pytest.raises(ValueError, match="workers must be an integer >= 0"):
        pipeline.build(TextSource([corpus], "paragraph"), tmp_path, load_config(overrides=SMALL), tokenizer=tokenizer,
                       workers=-1)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- interruptions (Ctrl-C), workers, new sources


def test_write_cut_short_by_a_signal_is_an_interruption(tmp_path, corpus, tok_file, reference,  # noqa: F811
                                                        monkeypatch, capsys):
    """ArrayRecord reports a write interrupted by Ctrl-C (EINTR) as a RuntimeError: not a disk error."""
    out, before = _old(tmp_path, reference)

    monkeypatch.setattr(records, "_array_record_writer", failing_writer(
        RuntimeError("riegeli: write() failed: Interrupted system call [type.googleapis.com/...]"), 2))
    with pytest.raises(KeyboardInterrupt):
        pipeline.build(TextSource([corpus], "paragraph"), out, load_config(overrides=SMALL + ["seed=2"]),
                       overwrite=True, tokenizer=pipeline.load_tokenizer(tok_file))
    assert main(_argv(corpus, out, tok_file, 2, "--overwrite")) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "disk" not in err and "error" not in err
    assert dataset_files(out) == before


def test_swallowed_ctrl_c_still_stops_the_build(tmp_path, corpus, tok_file, reference, monkeypatch):  # noqa: F811
    """Python only prints a KeyboardInterrupt raised in a garbage-collector callback: the build remembers it."""
    out, before = _old(tmp_path, reference)
    monkeypatch.setattr(records._Interrupt, "seen", False)

    def swallowed(name):
        if name == "shards":
            try:
                records._on_interrupt(signal.SIGINT, None)
            except KeyboardInterrupt:  # what the interpreter does with one raised inside a gc callback
                pass

    monkeypatch.setattr(pipeline, "_phase", swallowed)
    with records.catching_interrupts():
        with pytest.raises(KeyboardInterrupt):
            pipeline.build(TextSource([corpus], "paragraph"), out, load_config(overrides=SMALL + ["seed=2"]),
                           overwrite=True, tokenizer=pipeline.load_tokenizer(tok_file))
    assert dataset_files(out) == before


#: ``python -m wakong.cli`` with SIGINT handled and unblocked first, as in a process started from a terminal
#: (the test process may have it ignored or blocked, which a child would inherit: no Ctrl-C could reach it).
AS_FROM_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
                      "runpy.run_module('wakong.cli', run_name='__main__', alter_sys=True)")


def test_ctrl_c_during_a_build_with_workers(tmp_path, tok_file):
    """A real SIGINT to the whole process group (a terminal's Ctrl-C): exit 130, one line, nothing left."""
    out = tmp_path / "data"
    argv = ["build", "--corpus", "pydoc", "--repeat", "30", "--out", str(out), "--tokenizer", tok_file,
            "--workers", "2", "--num-shards", "4", "--no-progress", "--no-plots"]
    process = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, *argv], cwd=ROOT, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    staging = records.staging_dir(str(out), 0, 1)
    deadline = time.monotonic() + 240
    while not (os.path.isdir(staging) and any(".tmp-" in n for n in os.listdir(staging))):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("wakong: interrupted") and "Traceback" not in stderr
    assert os.listdir(out) == []  # the staging directory is gone, nothing was committed


def test_a_dying_worker_fails_the_build_without_a_hang(tmp_path, tokenizer):  # noqa: F811
    from tests._sources import DyingSource

    with pytest.raises(RuntimeError, match="a build worker died"):
        pipeline.build(DyingSource(40, die_at=25), tmp_path, load_config(overrides=SMALL), tokenizer=tokenizer,
                       workers=2)
    assert os.listdir(tmp_path) == []


def test_sigkill_with_workers_on_parquet_then_rerun(tmp_path, corpus, tok_file):  # noqa: F811
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    paragraphs = open(corpus, encoding="utf-8").read().split("\n\n")
    pq.write_table(pa.table({"text": paragraphs * 3}), tmp_path / "in.parquet", row_group_size=7)
    argv = ["build", str(tmp_path / "in.parquet"), "--format", "parquet", "--tokenizer", tok_file, "--seed", "2",
            "--workers", "2", *FLAGS[2:]]
    clean = tmp_path / "clean"
    assert main([*argv, "--out", str(clean)]) == 0
    out = tmp_path / "data"
    _killed("shards", [*argv, "--out", str(out)])
    time.sleep(0.5)  # the orphaned workers notice their parent is gone and exit
    assert not records.existing_parts(str(out))
    assert main([*argv, "--out", str(out)]) == 0  # the same command restarts the build
    shards = lambda path: {k: v for k, v in dataset_files(path).items() if not k.startswith("manifest")}  # noqa: E731
    assert shards(out) == shards(clean)
    assert records.read_manifests(str(out))["counts"] == records.read_manifests(str(clean))["counts"]


@pytest.mark.parametrize("workers", [0, 2])
def test_killed_build_resumes_its_finished_shards(tmp_path, corpus, tok_file, reference, monkeypatch, workers):  # noqa: F811
    """SIGKILL halfway: the rerun rebuilds only the shards that were not finished, byte-identically."""
    from wakong import shards

    out = tmp_path / "data"
    argv = _argv(corpus, out, tok_file, 2, "--workers", str(workers))
    _killed("shards", argv)
    done = sorted(shards.finished(records.staging_dir(str(out), 0, 1), 2))
    # in process, shard 0 was done when half the records were; with workers, whichever shards a worker had
    # finished before the kill (possibly none: the workers build both shards at once)
    assert done == [0] if not workers else set(done) <= {0, 1}
    built = []
    make = shards.make_outcomes
    monkeypatch.setattr(shards, "make_outcomes", lambda *args: built.extend(args[3]) or make(*args))
    assert main(_argv(corpus, out, tok_file, 2)) == 0  # in process: the count below sees every record made
    ranges = shards.shard_ranges(len(TextSource([corpus], "paragraph")), 2)
    assert built == [i for k in (0, 1) if k not in done for i in ranges[k]]
    _same_dataset(out, reference / "seed2")
