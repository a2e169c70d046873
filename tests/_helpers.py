"""Test utilities: trace counting (functions, decoding models), sort-free-vs-reference comparisons,
small logits factories, sequence chi-square tests, wakong dataset reading and unmasking."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np


class LazyModule:
    """Module ``name``, imported on first attribute access: collecting a test file (which every xdist
    worker does for every file) then costs nothing; a test that uses it skips when it is not installed.

    >>> LazyModule("json").dumps([1])
    '[1]'
    """

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("_"):  # probes (doctest's __wrapped__, pytest's _mock_name) must not import it
            raise AttributeError(attr)
        import pytest

        return getattr(pytest.importorskip(self._name), attr)


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

    def trace(self, *args, **kwargs):
        """``jax.jit(...).trace``: traces (counted) or reuses the cached trace, without compiling."""
        return self._jitted.trace(*args, **kwargs)


def assert_single_trace(fn, calls):
    """Calls ``fn`` with each argument tuple in ``calls`` under one jit; asserts a single trace."""
    counted = CountingJit(fn)
    outs = [jax.block_until_ready(counted(*args)) for args in calls]
    assert counted.traces == 1, f"{counted.traces} traces for {len(calls)} calls with new values"
    return outs


def counting_model(model):
    """``(counted, traces)``: ``model`` (a decoding ``Model``) whose ``apply_step`` appends the shape of its
    ``tokens`` to the list ``traces`` each time it is traced."""
    traces = []

    def apply(params, tokens, positions, cache):
        traces.append(tokens.shape)
        return model.apply_step(params, tokens, positions, cache)

    return model._replace(apply_step=apply), traces


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


def bigram_sequence_probs(table, start: int, n: int) -> dict:
    """Exact probability of every ``n``-token continuation of ``start`` under the bigram ``softmax(table [V, V])``."""
    probs = np.asarray(jax.nn.softmax(jnp.asarray(table)), np.float64)
    out = {}
    for seq in itertools.product(range(probs.shape[0]), repeat=n):
        p, prev = 1.0, start
        for t in seq:
            p, prev = p * probs[prev, t], t
        out[seq] = p
    return out


def assert_draws_follow(tokens, p) -> None:
    """Chi-square test (p > 1e-3) that ``tokens int[R]`` are draws from the probabilities ``p [V]`` (renormalised)."""
    from scipy import stats

    p = np.asarray(p, np.float64)
    tokens = np.asarray(tokens).reshape(-1)
    counts = np.bincount(tokens, minlength=p.size)
    assert stats.chisquare(counts, tokens.size * p / p.sum()).pvalue > 1e-3


def assert_sequences_follow(tokens, expected: dict) -> None:
    """Chi-square test (p > 1e-3) that the rows of ``tokens [R, n]`` are draws from ``expected`` (sequence -> p).

    Cells with an expected count below 5 are merged into one (the test's validity condition).
    """
    from scipy import stats

    seqs = [tuple(r) for r in np.asarray(tokens)]
    n_rows, keys = len(seqs), sorted(expected)
    counts = np.array([seqs.count(s) for s in keys])
    p = np.array([expected[s] for s in keys])
    small = n_rows * p < 5
    counts = np.append(counts[~small], counts[small].sum())
    p = np.append(p[~small], p[small].sum())
    p /= p.sum()
    assert stats.chisquare(counts, n_rows * p).pvalue > 1e-3


def sample_noise(parts: tuple, rows: int, steps: int, vocab: int, key: int, seed_offset: int = 0, **init):
    """``int32[rows, steps]`` drawn by ``chain(*parts, categorical)`` (row seeds ``arange(rows) + seed_offset``)
    from fresh ``N(0, 2^2)`` logits ``[rows, vocab]`` at each step ``t`` (key ``fold_in(key(key), t)``);
    ``init``: the sampler's ``init`` keywords besides ``vocab_size``."""
    from jaxsample import stages
    from jaxsample.chain import chain

    sampler = chain(*parts, select=stages.categorical())
    params = sampler.params((rows,), seed=jnp.arange(rows) + seed_offset)
    state = sampler.init(params, vocab_size=vocab, **init)

    @jax.jit
    def run(state):
        def step(state, t):
            logits = 2.0 * jax.random.normal(jax.random.fold_in(jax.random.key(key), t), (rows, vocab))
            tokens, _, state = sampler.sample(logits, state, params)
            return state, tokens

        return jax.lax.scan(step, state, jnp.arange(steps))[1].T

    return np.asarray(run(state))


def dataset_records(path: str) -> list[dict]:
    """Every record of a built wakong dataset, decoded, in shard order."""
    import grain

    from wakong import records

    info = records.read_manifests(path)
    source = grain.sources.ArrayRecordDataSource(info["files"])
    return [records.decode_record(source[i]) for i in range(len(source))]


def failing_writer(error, after: int):
    """A stand-in for ``wakong.records._array_record_writer`` that creates its file and raises ``error``
    (an exception or its class) at every write after the first ``after``."""

    class Writer:
        def __init__(self, path):
            self.writes = 0
            open(path, "wb").close()

        def write(self, data):
            self.writes += 1
            if self.writes > after:
                raise error

        def close(self):
            pass

    return Writer


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
