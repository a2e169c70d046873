"""The :class:`Preset` type shared by the ecosystem builders, and batching of presets per row."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from jaxsample.chain import Sampler


class Preset(NamedTuple):
    """A sampler structure plus the parameter values of one configuration.

    The :class:`~jaxsample.chain.Sampler` holds only static structure (which stages, in which order,
    window sizes), so configurations that differ only in values share one sampler and one
    compilation; ``values`` carries those values.

    >>> from jaxsample import presets
    >>> p = presets.vllm(temperature=0.7, top_p=0.9)
    >>> round(float(p.params((2,))["top_p"][1]), 6)
    0.9
    """

    sampler: Sampler
    values: dict[str, Any]
    #: Request-level fields of the source config, in the ecosystem-neutral names that
    #: :class:`jaxsample.decoding.DecodeRequest` reads (strategy, budgets, EOS / pad ids, ``n``,
    #: beams, log-probs, stop strings ...); ``None`` for presets built without them.
    request: dict[str, Any] | None = None
    #: keyword arguments of the decoding strategy the configuration selects (``{}``: any strategy),
    #: e.g. ``{"dola_layers": "high"}`` for ``decoding.dola_generate`` or ``{"constraints": ...}``
    #: for ``decoding.constrained_beam_search``.
    strategy: dict[str, Any] = {}

    def params(self, batch_shape: tuple[int, ...] = (), **overrides) -> dict:
        """``sampler.params`` with this configuration's values, then ``overrides``."""
        return self.sampler.params(batch_shape, **{**self.values, **overrides})


def stack(presets: Sequence[Preset]) -> Preset:
    """One preset whose values give row ``i`` the configuration of ``presets[i]`` (a mixed batch).

    All presets must share the same sampler structure (true for every vLLM configuration, and for
    llama.cpp / HF configurations that enable the same stages and windows).

    Raises:
      ValueError: if the structures differ.
    """
    presets = list(presets)
    if not presets:
        raise ValueError("stack needs at least one preset")
    first = presets[0].sampler
    for i, p in enumerate(presets[1:], start=1):
        if p.strategy != presets[0].strategy:
            raise ValueError(f"preset {i} selects a different decoding strategy than preset 0 "
                             f"({p.strategy} vs {presets[0].strategy})")
        if p.sampler != first:
            raise ValueError(
                f"preset {i} has a different sampler structure than preset 0 (stages "
                f"{[s.name for s in p.sampler.stages]} vs {[s.name for s in first.stages]}); "
                "enable the same stages in every configuration"
            )
    specs = first.param_specs()
    values: dict[str, Any] = {}
    # Equal samplers may differ in their stages' defaults: each row gets its own preset's.
    own = [p.sampler.param_specs() for p in presets]
    differ = {n for n, spec in specs.items() if not spec.shared and any(o[n].default != spec.default for o in own)}
    for name in sorted({k for p in presets for k in p.values} | differ):
        rows = [p.values.get(name, o[name].default) for p, o in zip(presets, own)]
        if specs[name].capacity is None:
            values[name] = np.asarray(rows, dtype=np.dtype(specs[name].dtype))
        else:
            values[name] = [list(np.atleast_1d(np.asarray(r)).tolist()) for r in rows]
    requests = [p.request for p in presets]
    return Preset(first, values, _stack_requests(requests), presets[0].strategy)


#: Request fields that may differ per row of a stacked preset (they become lists, one per row).
_PER_ROW = ("max_new_tokens", "min_new_tokens", "seed", "eos_ids")


def _stack_requests(requests: list) -> dict | None:
    if all(r is None for r in requests):
        return None
    if any(r is None for r in requests):
        raise ValueError("stack: some presets carry request fields and others do not")
    out = dict(requests[0])
    for key in sorted({k for r in requests for k in r}):
        rows = [r.get(key) for r in requests]
        if all(v == rows[0] for v in rows):
            continue
        if key not in _PER_ROW:
            raise ValueError(f"stack: request field {key!r} differs between presets ({rows[0]!r} vs "
                             f"{next(v for v in rows if v != rows[0])!r}); only {', '.join(_PER_ROW)} may vary per row")
        if any(v is None for v in rows):
            raise ValueError(f"stack: request field {key!r} is unset in some presets")
        out[key] = rows
    return out


def _number(value: Any, field: str, integer: bool) -> None:
    kind = "an integer" if integer else "a finite number"
    ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.integer, np.floating))
    if not ok or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{field} must be {kind}, got {value!r}")
    if not integer and not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}")
    if integer and not -(2**31) <= value < 2**31:
        raise ValueError(f"{field} must be in [-2**31, 2**31), got {value!r}")


def check_fields(builder: Callable, fields: Mapping[str, Any]) -> None:
    """Checks the scalar fields of an ecosystem builder against its annotations, by the user's names.

    Fields annotated ``float`` must be finite numbers (not bools, strings, NaN or infinities),
    ``int`` fields integers in ``[-2**31, 2**31)``, ``bool`` fields bools (``| None`` also allows
    ``None``). Other annotations (lists, mappings) are checked by the builder.

    Raises:
      ValueError: naming the first offending field.
    """
    for p in inspect.signature(builder).parameters.values():
        if p.name not in fields:
            continue
        options = {a.strip() for a in str(p.annotation).split("|")}
        value = fields[p.name]
        if value is None and "None" in options:
            continue
        if options - {"None"} == {"float"}:
            _number(value, p.name, integer=False)
        elif options - {"None"} == {"int"}:
            _number(value, p.name, integer=True)
        elif options == {"bool"} and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{p.name} must be true or false, got {value!r}")


def check_bias(bias: Mapping, field: str, *, allow: tuple[float, ...] = (-math.inf,)) -> None:
    """Token-id -> bias mappings: integer ids ``>= 0`` and finite biases (or one of ``allow``)."""
    for token, value in bias.items():
        token = int(token) if isinstance(token, str) and token.lstrip("-").isdigit() else token
        _number(token, f"{field} token id", integer=True)
        if token < 0:
            raise ValueError(f"{field} token id must be >= 0, got {token!r}")
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value in allow:
            continue
        _number(value, f"{field}[{token}]", integer=False)


def check_values(preset: Preset, names: Mapping[str, str]) -> Preset:
    """Validates a preset's values now (not at the first step), errors renamed to the user's fields.

    ``names`` maps jaxsample parameter names to the ecosystem's field names (``typical_p`` ->
    ``typ_p``).
    """
    try:
        preset.params(())
    except ValueError as err:
        message = str(err)
        for internal, user in names.items():
            if message.startswith(internal + " ") and internal != user:
                message = user + message[len(internal):]
                break
        raise ValueError(message) from None
    return preset
