"""Versioned YAML configs: strict building, header checks, overrides, and every file in configs/ loads."""

import dataclasses
import glob
import os

import pytest
import yaml

from jaxsample import config


@dataclasses.dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    names: tuple[str, ...] = ()

    def __post_init__(self):
        if not 0 <= self.rate <= 1:
            raise ValueError(f"inner.rate must be in [0, 1], got {self.rate}")


@dataclasses.dataclass(frozen=True)
class Outer:
    seed: int = 0
    label: str | None = None
    inner: Inner = Inner()


def test_build_coerces_and_nests():
    out = config.build(Outer, {"seed": 3, "inner": {"rate": 1, "names": ["a", "b"]}})
    assert out == Outer(3, None, Inner(1.0, ("a", "b")))


@pytest.mark.parametrize(
    "data,message",
    [
        ({"sed": 1}, "unknown config key sed"),
        ({"inner": {"rte": 1}}, "unknown config key inner.rte"),
        ({"seed": "3"}, "seed must be int"),
        ({"inner": {"rate": 2.0}}, "inner.rate must be in"),
        ({"inner": {"names": "a"}}, "inner.names must be a list"),
        ({"inner": 5}, "inner must be a mapping"),
    ],
)
def test_build_errors_name_the_key(data, message):
    with pytest.raises(ValueError, match=message):
        config.build(Outer, data)


def test_read_checks_header_and_applies_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nkind: demo.outer\nseed: 1\ninner: {rate: 0.2}\n")
    data = config.read(path, ["inner.rate=0.3", "label=x"], kind="demo.outer")
    assert data == {"seed": 1, "inner": {"rate": 0.3}, "label": "x"}
    assert config.load(Outer, path, ["seed=7"], kind="demo.outer").seed == 7
    with pytest.raises(ValueError, match="kind is 'demo.outer', expected 'model'"):
        config.read(path, kind="model")
    path.write_text("version: 2\n")
    with pytest.raises(ValueError, match="version 2 is not supported"):
        config.read(path)
    with pytest.raises(FileNotFoundError):
        config.read(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="section.key=value"):
        config.read(None, ["seed"])
    path.write_text("version: 1\nseed: [1]\n")
    with pytest.raises(ValueError, match=f"{path}: seed must be int"):
        config.load(Outer, path, kind="demo.outer")


def test_dump_round_trips():
    c = Outer(2, "l", Inner(0.1, ("x",)))
    data = config.dump(c, "demo.outer")
    assert data["version"] == 1 and data["kind"] == "demo.outer"
    assert config.build(Outer, {k: v for k, v in data.items() if k not in config.HEADER_KEYS}) == c


def _loaders():
    from jaxsample import models
    from wakong import config as wakong_config

    loaders = {"wakong.build": wakong_config.load_config, "model": models.load_config}
    # --- evaluation / jobs (branch evaldemo) ---
    from jaxsample.evaluation.configs import LOADERS
    from jaxsample.jobs import demo, showcase, train

    loaders.update(LOADERS)
    loaders.update({"train": train.load, "demo": demo.load, "showcase": showcase.load})
    # --- end evaluation / jobs ---
    return loaders


@pytest.mark.parametrize(
    "path", sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "**", "*.yaml"), recursive=True))
)
def test_every_shipped_config_is_versioned_and_loads(path):
    with open(path) as f:
        header = yaml.safe_load(f)
    assert header.get("version") == 1, "missing version: 1"
    loaders = _loaders()
    assert header.get("kind") in loaders, f"unknown kind {header.get('kind')!r}"
    loaders[header["kind"]](path)
