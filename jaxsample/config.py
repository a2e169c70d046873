"""Versioned YAML configs: nested frozen dataclasses, strict validation, ``section.key=value`` overrides.

Every config file of the project (``configs/``) is a mapping with a ``version`` (currently 1) and a
``kind`` naming what it configures, plus the fields of that kind's dataclass::

    version: 1
    kind: wakong.build
    seed: 0
    noise: {spans: {budget_rate: 0.4}}

:func:`load` reads a file, checks version and kind, applies command-line overrides and builds the
dataclass; unknown keys, wrong types and invalid values raise ``ValueError`` naming the key (and
the file). Every CLI takes ``--config FILE`` plus ``--set section.key=value`` overrides.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from typing import Any, Mapping, Sequence, TypeVar

def shipped_configs() -> str:
    """The directory of the shipped configs (``samplers/``, ``decoding/``, ``eval/``, ...).

    Installed (wheel or editable), it is the package data ``jaxsample.configs``; run from a source
    checkout without installing (``PYTHONPATH=.``), the checkout's top-level ``configs/``. The
    package must live on the file system (not in a zip archive).
    """
    import importlib.resources

    try:
        return str(importlib.resources.files("jaxsample.configs"))
    except ModuleNotFoundError:  # not installed: the source tree's configs/
        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_path(ref: str, folder: str) -> str:
    """``ref`` when it is a path; a bare name (no ``.yaml``, no ``/``) is the shipped ``<folder>/<ref>.yaml``.

    >>> os.path.basename(config_path("bart", "wakong"))
    'bart.yaml'

    Raises:
      FileNotFoundError: a bare name that is not a shipped config (the message lists the shipped ones).
    """
    if ref.endswith((".yaml", ".yml")) or "/" in ref or os.sep in ref or os.path.exists(ref):
        return ref
    directory = os.path.join(shipped_configs(), folder)
    path = os.path.join(directory, f"{ref}.yaml")
    if not os.path.isfile(path):
        names = sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".yaml")) if os.path.isdir(directory) else []
        raise FileNotFoundError(f"no shipped {folder} config {ref!r} (shipped: {', '.join(names) or 'none'})")
    return path


#: Config format versions this code reads.
SUPPORTED_VERSIONS = (1,)
#: Keys every file may carry besides its dataclass fields.
HEADER_KEYS = ("version", "kind", "description")

T = TypeVar("T")


def build(cls: type[T], data: Mapping, prefix: str = "") -> T:
    """Builds the frozen dataclass ``cls`` from nested mappings, strictly.

    Raises:
      ValueError: on an unknown key, a value of the wrong type, or a ``__post_init__`` check,
        naming the dotted key (``noise.spans.budget_rate``).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        nested = _dataclass_option(hint)
        if nested is not None and (value is not None or nested is hint):
            kwargs[key] = build(nested, value or {}, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(f"{prefix}{key}", value, hint)
    try:
        return cls(**kwargs)
    except ValueError as err:
        if not prefix or str(err).startswith(prefix):
            raise
        raise ValueError(f"{prefix}{err}") from None


def _dataclass_option(hint) -> type | None:
    """The dataclass of a ``Section`` or ``Section | None`` field, else ``None``."""
    if dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        found = [o for o in typing.get_args(hint) if dataclasses.is_dataclass(o)]
        return found[0] if len(found) == 1 else None
    return None


def _coerce(name: str, value: Any, hint) -> Any:
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (dict, Mapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping, got {value!r}")
        return dict(value)
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_coerce(f"{name}[{i}]", v, item) for i, v in enumerate(value))
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or origin is typing.Union else (hint,)
    if value is None and type(None) in options:
        return None
    for option in options:
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            return float(value)
        if option is int and type(value) is int and not -(2**63) <= value < 2**63:
            raise ValueError(f"{name} must be an integer in [-2**63, 2**63), got {value!r}")
        if option in (int, str, bool) and type(value) is option:
            return value
        if typing.get_origin(option) in (dict, tuple, list, Mapping) or option in (dict, tuple, list):
            return _coerce(name, value, option)
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ValueError(f"{name} must be {names}, got {value!r}")


def check_types(config: Any, prefix: str = "") -> None:
    """Checks every field of a config dataclass against its type hint (for configs built in Python).

    The same rules as :func:`build`: ``float`` fields take finite numbers (ints are converted),
    ``int`` and ``bool`` fields exactly that type (``True`` is not an int, ``0`` not a bool);
    nested dataclass fields are skipped (they check themselves).

    Raises:
      ValueError: naming ``prefix + field``.
    """
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        hint, value = hints[f.name], getattr(config, f.name)
        if not f.init or dataclasses.is_dataclass(hint) or typing.get_origin(hint) is typing.ClassVar:
            continue
        coerced = _coerce(f"{prefix}{f.name}", value, hint)
        if type(coerced) is float and type(value) is not float:
            object.__setattr__(config, f.name, coerced)


def set_path(data: dict, dotted: str, value: Any) -> None:
    """Sets ``data[a][b][c] = value`` for ``dotted = "a.b.c"``, creating sections."""
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted}: {part} is not a section")
    node[leaf] = value


def read(path: str | os.PathLike | None, overrides: Sequence[str] = (), *, kind: str | None = None) -> dict:
    """Reads a YAML config into a dict, checks its header and applies ``key=value`` overrides.

    Args:
      path: a YAML file, or ``None`` for an empty config (defaults).
      overrides: ``section.key=value`` strings; values are parsed as YAML (``top_k=40`` is an int).
      kind: the expected ``kind``; a file declaring another kind is rejected.

    Returns:
      The mapping without the header keys.
    """
    import yaml

    data: dict = {}
    where = "config"
    if path is not None:
        where = f"config file {path}"
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{where} does not exist")
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a mapping, got {type(data).__name__}")
        version = data.get("version", 1)
        if type(version) is not int or version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{where}: version {version!r} is not supported (supported: {SUPPORTED_VERSIONS})")
        if kind is not None and data.get("kind", kind) != kind:
            raise ValueError(f"{where}: kind is {data.get('kind')!r}, expected {kind!r}")
    data = {k: v for k, v in data.items() if k not in HEADER_KEYS}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} must look like section.key=value")
        set_path(data, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
    return data


def load(cls: type[T], path: str | os.PathLike | None = None, overrides: Sequence[str] = (), *, kind: str) -> T:
    """:func:`read` then :func:`build`; errors name the file and the key."""
    data = read(path, overrides, kind=kind)
    try:
        return build(cls, data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}" if path is not None else str(err)) from None


def dump(config: Any, kind: str) -> dict:
    """The YAML-ready mapping of a config dataclass, with its header."""
    return {"version": SUPPORTED_VERSIONS[-1], "kind": kind, **dataclasses.asdict(config)}
