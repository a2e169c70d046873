"""``_candidates.top``: the ``k`` largest entries, exactly, with and without its ``-inf`` floors.

The chunked search (several levels forced on small rows with ``chunk=4, leaf=2``) is checked against
``lax.top_k`` over the whole row, and the pruned search (``prune=True``: entries below a lower bound
of the ``k``-th largest set to ``-inf`` before each ``lax.top_k``) against the plain one bit for bit,
``-inf`` ids included: ties, ``+-0.0``, ``-inf`` rows and rows with fewer than ``k`` finite entries,
``+inf``, huge values, ``V`` not a multiple of the chunk, ``V`` below the leaf size. NaN never reaches
``top`` (the sampler maps it to ``-inf`` first; ``tests/test_fastpath.py`` covers NaN logits through
the whole step, the chunked preset included).
"""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import _candidates

KINDS = ("normal", "ties", "zeros", "empty", "sparse", "posinf", "huge", "ascending")


def _row(rng, kind: str, v: int) -> np.ndarray:
    x = rng.normal(0.0, 3.0, v)
    if kind == "ties":
        x = rng.integers(-2, 3, v).astype(np.float64)
    elif kind == "zeros":  # -0.0 ties with 0.0 and keeps its sign
        x = np.where(rng.random(v) < 0.5, 0.0, -0.0) + np.where(rng.random(v) < 0.1, 1.0, 0.0)
    elif kind == "empty":
        x = np.full(v, -np.inf)
    elif kind == "sparse":  # fewer finite entries than k in most rows
        x = np.where(np.isin(np.arange(v), rng.integers(v, size=rng.integers(1, 6))), x, -np.inf)
    elif kind == "posinf":
        x[rng.integers(v, size=rng.integers(1, v))] = np.inf
    elif kind == "huge":
        x = x * 1e37
    elif kind == "ascending":  # the worst order for a k-heap
        x = np.sort(x)
    if kind not in ("empty", "posinf", "zeros"):
        x = np.where(rng.random(v) < 0.15, -np.inf, x)
    return x.astype(np.float32)


@functools.cache
def _search(k: int, chunk: int, leaf: int):
    return jax.jit(lambda x: (_candidates._top(x, k, chunk, leaf, True), _candidates._top(x, k, chunk, leaf, False)))


def _check(x: np.ndarray, k: int, chunk: int, leaf: int):
    (vals, ids), (vals0, ids0) = _search(k, chunk, leaf)(jnp.asarray(x))
    vals, ids = np.asarray(vals), np.asarray(ids)
    # pruned == plain, bit for bit (-inf ids included)
    np.testing.assert_array_equal(vals.view(np.uint32), np.asarray(vals0).view(np.uint32))
    np.testing.assert_array_equal(ids, np.asarray(ids0))
    # == lax.top_k over the whole row (-0.0 ties with 0.0), except which -inf ids fill short rows
    want_vals, want_ids = jax.lax.top_k(jnp.where(x == 0, 0.0, x), k)
    want_vals, want_ids = np.asarray(want_vals), np.asarray(want_ids)
    for r in range(x.shape[0]):
        n = min(k, int(np.sum(x[r] > -np.inf)))
        np.testing.assert_array_equal(ids[r, :n], want_ids[r, :n], err_msg=f"row {r}")
        np.testing.assert_array_equal(vals[r, :n], want_vals[r, :n], err_msg=f"row {r}")
        assert np.all(vals[r, n:] == -np.inf) and np.all(x[r, ids[r, n:]] == -np.inf), f"row {r}"
        assert len(set(ids[r].tolist())) == k, f"row {r}: repeated ids"


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True, database=None)
@hypothesis.given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=4, max_size=4),
    v=st.sampled_from([3, 7, 16, 33, 64, 97, 130, 257]),  # below the leaf, multiples of the chunk and not
    k=st.sampled_from([1, 2, 3, 5, 8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_chunked_top_is_exact_and_pruning_changes_nothing(kinds, v, k, seed):
    rng = np.random.default_rng(seed)
    _check(np.stack([_row(rng, kind, v) for kind in kinds]), min(k, v), 4, 2)


@pytest.mark.parametrize("v", [32000, 32001, 131072])
def test_top_at_vocabulary_sizes(v):
    """The default chunking (two levels at 131k) with 64 candidates, one row of each kind."""
    rng = np.random.default_rng(v)
    _check(np.stack([_row(rng, kind, v) for kind in KINDS]), 64, _candidates._CHUNK, _candidates._LEAF)


def test_top_keeps_the_sign_of_zero():
    x = jnp.asarray([[-0.0, 0.0, -1.0, -0.0]] * 2)
    vals, ids = _candidates.top(x, 3)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 1, 3]] * 2)
    np.testing.assert_array_equal(np.signbit(np.asarray(vals)), [[True, False, True]] * 2)
