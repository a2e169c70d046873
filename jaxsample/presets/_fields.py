"""Reading an ecosystem's config object (an object, a dict or a JSON file) and checking its field types.

Errors name the user's field (``temperature``, ``eos_token_id``), never an internal parameter.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
from typing import Any, Iterable, Mapping


def read(config: Any, fields: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """``config`` as a dict of fields (``fields`` override it).

    ``config`` may be ``None``, a mapping, a path to a JSON file (or to a directory holding
    ``generation_config.json``), or an object: its ``to_dict()``, msgspec ``__struct_fields__``,
    dataclass fields or public attributes. Private names (``_x``) of objects are skipped.
    """
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, Mapping):
        data = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        data = _read_json(os.fspath(config), what)
    elif hasattr(config, "to_dict") and callable(config.to_dict):
        data = dict(config.to_dict())
    elif hasattr(config, "__struct_fields__"):
        data = {k: getattr(config, k) for k in config.__struct_fields__}
    elif dataclasses.is_dataclass(config):
        data = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    elif hasattr(config, "__dict__"):
        data = dict(vars(config))
    else:
        raise ValueError(f"{what}: expected a config object, a dict or a path, got {type(config).__name__}")
    if not isinstance(config, (Mapping, str, os.PathLike)) and config is not None:
        data = {k: v for k, v in data.items() if not k.startswith("_")}
    for key in data:
        if not isinstance(key, str):
            raise ValueError(f"{what}: field names must be strings, got {key!r}")
    return {**data, **fields}


def _read_json(path: str, what: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "generation_config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what}: {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def unknown(data: Mapping[str, Any], known: Iterable[str], what: str) -> None:
    """``ValueError`` naming the first field that is not in ``known``."""
    known = set(known)
    extra = sorted(k for k in data if k not in known)
    if extra:
        raise ValueError(f"{what}: unknown field {extra[0]!r} (known fields: {', '.join(sorted(known))})")


def number(name: str, value: Any, *, finite: bool = True) -> float:
    """A real number (int or float, not bool); NaN always, infinities when ``finite``, are rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not _numpy_scalar(value, "fc"):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def integer(name: str, value: Any) -> int:
    """An int (not bool, not float)."""
    if isinstance(value, bool) or not isinstance(value, int) and not _numpy_scalar(value, "iu"):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return int(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def ids(name: str, value: Any) -> tuple[int, ...]:
    """An int or a list of ints (token ids, ``>= 0``) -> tuple; ``None`` -> ()."""
    if value is None:
        return ()
    items = [value] if not isinstance(value, (list, tuple)) else list(value)
    out = tuple(integer(f"{name}[{i}]" if isinstance(value, (list, tuple)) else name, v) for i, v in enumerate(items))
    for v in out:
        if v < 0:
            raise ValueError(f"{name} must hold token ids >= 0, got {v}")
    return out


def strings(name: str, value: Any) -> tuple[str, ...]:
    """A string or a list of non-empty strings -> tuple; ``None`` -> ()."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    if any(not s for s in items):
        raise ValueError(f"{name} cannot contain an empty string")
    return tuple(dict.fromkeys(items))


def fresh_seed() -> int:
    """A seed from the operating system's entropy (``secrets``), in ``[0, 2**31)``."""
    return secrets.randbelow(2**31)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (a ``tokenizers.Tokenizer`` or a ``transformers`` one)."""
    out = tokenizer.encode(text, add_special_tokens=False)
    return list(out.ids if hasattr(out, "ids") else out)


def _numpy_scalar(value: Any, kinds: str) -> bool:
    import numpy as np

    return isinstance(value, np.generic) and value.dtype.kind in kinds
