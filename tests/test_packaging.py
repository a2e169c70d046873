"""Shipped configs (package data), config names on the command lines, the persistent compile cache.

CI (``.ci/run``) also builds the wheel, installs it in a fresh virtualenv and runs ``jaxsample`` and
``wakong`` from another directory; these tests cover the same code paths in the source tree.
"""

import argparse
import glob
import os
import subprocess
import sys

import pytest

from jaxsample import compile_cache
from jaxsample.__main__ import main
from jaxsample.config import config_path, shipped_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _yaml_files(root):
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "*", "*.yaml")))


def test_shipped_configs_hold_every_config_of_the_repository():
    assert _yaml_files(shipped_configs()) == _yaml_files(os.path.join(ROOT, "configs"))
    assert len(_yaml_files(shipped_configs())) > 30


def test_setup_ships_every_config_folder_as_package_data():
    """setup.py lists configs/ and each of its folders as packages with their YAML files."""
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    source = ast.unparse(tree)
    assert "package_dir={'jaxsample.configs': 'configs'}" in source
    assert "package_data={name: ['*.yaml'] for name in CONFIGS}" in source
    from setuptools import find_namespace_packages

    folders = {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, "configs", "*", "*.yaml"))}
    assert folders <= set(find_namespace_packages(where=os.path.join(ROOT, "configs")))


def test_configs_command_lists_names_kinds_and_summaries(capsys):
    assert main(["configs", "samplers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(glob.glob(os.path.join(ROOT, "configs", "samplers", "*.yaml")))
    top_p = next(line for line in lines if line.startswith("samplers/top_p "))
    assert " sampler " in top_p and "Nucleus sampling" in top_p
    assert main(["configs", "--path"]) == 0
    assert capsys.readouterr().out.strip() == shipped_configs()
    assert main(["configs", "no_such_folder"]) == 2
    assert "no shipped config folder 'no_such_folder'" in capsys.readouterr().err


def test_config_path_resolves_bare_names_to_shipped_files(tmp_path):
    assert config_path("bart", "wakong") == os.path.join(shipped_configs(), "wakong", "bart.yaml")
    mine = tmp_path / "mine.yaml"
    assert config_path(str(mine), "wakong") == str(mine)  # a path is returned as given (checked later)
    with pytest.raises(FileNotFoundError, match=r"no shipped wakong config 'nope' \(shipped: article, bart, demo\)"):
        config_path("nope", "wakong")


def test_wakong_build_reads_a_shipped_config_by_name(tmp_path):
    import pydoc_data.topics

    text = tmp_path / "tiny.txt"
    text.write_text("\n".join(list(pydoc_data.topics.topics.values())[:2]))
    cmd = [sys.executable, "-m", "wakong.cli", "build", str(text), "--config", "bart", "--vocab-size", "300",
           "--out", str(tmp_path / "data"), "--no-plots", "--no-progress"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    import json

    manifest = json.load(open(tmp_path / "data" / "manifest.json"))
    assert manifest["config"]["examples"]["unit"] == "document"  # bart.yaml, not the defaults (sentence)
    assert manifest["config"]["noise"]["spans"]["poisson_rate"] == 3.0


def _args(**kw):
    parser = argparse.ArgumentParser()
    compile_cache.add_arguments(parser)
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in kw.items()]
    return parser.parse_args(flags)


def test_compile_cache_flags_and_environment(monkeypatch, tmp_path):
    enabled = []
    monkeypatch.setattr(compile_cache, "enable", lambda d=None: enabled.append(d) or d or "default")
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.from_args(_args()) == "default"  # on by default
    assert compile_cache.from_args(_args(no_compile_cache=True)) is None
    assert compile_cache.from_args(_args(compile_cache=str(tmp_path))) == str(tmp_path)
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert compile_cache.from_args(_args()) is None
    assert compile_cache.from_args(_args(compile_cache=str(tmp_path))) == str(tmp_path)  # the flag wins
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
    assert compile_cache.from_args(_args()) == str(tmp_path / "env")
    assert enabled == [None, str(tmp_path), str(tmp_path), str(tmp_path / "env")]
    with pytest.raises(SystemExit):
        _args(compile_cache="x", no_compile_cache=True)


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "jaxsample" / "jax")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache.default_dir() == os.path.expanduser("~/.cache/jaxsample/jax")


def test_notice_logs_before_and_the_time_after():
    lines = []
    with compile_cache.notice("chain", lines.append):
        lines.append("work")
    assert lines[0] == "compiling chain ..." and lines[1] == "work"
    assert lines[2].startswith("compiled chain in ") and lines[2].endswith(" s")


@pytest.mark.slow
def test_second_process_loads_the_showcase_from_the_persistent_cache(tmp_path):
    """Two fresh processes: the first fills the cache directory, the second compiles faster from it."""
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "jaxsample", "showcase", "--compile-cache", str(cache),
           "--set", "samplers=[llama_cpp]", "--set", "samples=2"]
    env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}

    def seconds():
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
        assert run.returncode == 0, run.stderr
        line = next(line for line in run.stdout.splitlines() if line.startswith("compiled the llama_cpp chain"))
        return float(line.rsplit(" in ", 1)[1].split()[0])

    cold = seconds()
    assert os.listdir(cache)
    warm = seconds()
    assert warm < cold / 2, (cold, warm)


def test_plots_are_skipped_without_matplotlib(monkeypatch, tmp_path):
    """matplotlib is the optional `plots` extra: without it the loss plot is skipped, not an error."""
    import importlib.util

    from jaxsample.jobs import train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    history = {"step": [0, 1], "loss": [2.0, 1.5], "accuracy": [0.1, 0.2]}
    assert train.plot_loss(history, str(tmp_path / "loss.png")) is False
    assert not (tmp_path / "loss.png").exists()
    monkeypatch.undo()
    assert train.plot_loss(history, str(tmp_path / "loss.png")) is True and (tmp_path / "loss.png").exists()
