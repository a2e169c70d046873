"""Test utilities: trace counting, sort-free-vs-reference comparisons, small logits factories, wakong dataset reading and unmasking."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


class CountingJit:
    """``jax.jit`` that counts how many times the wrapped function is traced.

    >>> f = CountingJit(lambda x, t: x / t)
    >>> _ = f(jnp.ones(3), 1.0); _ = f(jnp.ones(3), 2.0)
    >>> f.traces
    1
    """

    def __init__(self, fn, **jit_kwargs):
        self.traces = 0

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            self.traces += 1
            return fn(*args, **kwargs)

        self._jitted = jax.jit(counted, **jit_kwargs)

    def __call__(self, *args, **kwargs):
        return self._jitted(*args, **kwargs)


def assert_single_trace(fn, calls):
    """Calls ``fn`` with each argument tuple in ``calls`` under one jit; asserts a single trace."""
    counted = CountingJit(fn)
    outs = [jax.block_until_ready(counted(*args)) for args in calls]
    assert counted.traces == 1, f"{counted.traces} traces for {len(calls)} calls with new values"
    return outs


def probs_logits(probs, dtype=jnp.float32):
    """Logits ``log(p)`` from a list of probabilities, as the llama.cpp tests build them."""
    return jnp.log(jnp.asarray(probs, jnp.float32)).astype(dtype)


def kept(x):
    """Boolean numpy mask of finite (kept) logits."""
    return np.asarray(jnp.asarray(x) > -jnp.inf)


def renormalised(x):
    """Softmax over kept tokens as float64 numpy (what llama.cpp ``dist`` leaves in ``p``)."""
    x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def dataset_records(path: str) -> list[dict]:
    """Every record of a built wakong dataset, decoded, in shard order."""
    import grain

    from wakong import records

    info = records.read_manifests(path)
    source = grain.sources.ArrayRecordDataSource(info["files"])
    return [records.decode_record(source[i]) for i in range(len(source))]


def dataset_files(path) -> dict:
    """sha256 of every file under a dataset directory ``path`` (hidden ones included), the report aside."""
    import hashlib
    import os

    out = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != "report"]
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def unmask(out, units, scheme, mask="<mask>"):
    """Puts each span of ``scheme`` (over ``units``) back in place of its ``mask`` in ``out``."""
    rebuilt, spans = [], iter(scheme)
    for token in out:
        if token == mask:
            start, length = next(spans)
            rebuilt.extend(units[start : start + length])
        else:
            rebuilt.append(token)
    return rebuilt
