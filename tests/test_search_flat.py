"""top_p / typical on rows whose cut-off lies beyond the candidates: the exact searches against a sort.

``candidates=8`` on ``V = 4096`` forces every row through the value search (top-p) or the bit
bisection (typical); rows are built so that the boundary sits on ties, on groups of equal
probability (the target just above or below a group's exact mass), beside ``-inf`` entries, on a
single finite token, with per-row ``p`` and ``min_keep``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from tests import reference_samplers as ref

V = 4096


def _rows():
    rng = np.random.default_rng(13)
    flat = rng.normal(size=(3, V)).astype(np.float32) * 2
    tied = np.round(rng.normal(size=(2, V)) * 4).astype(np.float32) / 4  # ~40 distinct values
    two = np.where(np.arange(V) < V // 2, 1.0, 0.0).astype(np.float32)[None].repeat(2, 0)  # equal masses
    holes = rng.normal(size=(1, V)).astype(np.float32)
    holes[rng.random((1, V)) < 0.5] = -np.inf
    single = np.full((1, V), -np.inf, np.float32)
    single[0, 123] = 0.5
    uniform = np.zeros((1, V), np.float32)
    x = np.concatenate([flat, tied, two, holes, single, uniform])
    top = np.e / (np.e + 1.0)  # exact mass of the upper half of the two-level rows
    p = np.array([0.95, 0.5, 0.99, 0.9, 0.3, top + 1e-4, top - 1e-4, 0.7, 0.9, 0.5], np.float32)
    min_keep = np.array([1, 1, 3000, 1, 1, 1, 1, 5, 1, 1], np.int32)
    return jnp.asarray(x), jnp.asarray(p), jnp.asarray(min_keep)


@functools.cache
def _fns(name):
    fast = {"top_p": js.top_p, "typical": js.typical}[name]
    return jax.jit(functools.partial(fast, candidates=8)), jax.jit(getattr(ref, name))


@pytest.mark.parametrize("name", ["top_p", "typical"])
def test_search_beyond_candidates_matches_sorted_reference(name):
    x, p, min_keep = _rows()
    fast, reference = _fns(name)
    got, want = np.asarray(fast(x, p, min_keep)), np.asarray(reference(x, p, min_keep))
    np.testing.assert_array_equal(got > -np.inf, want > -np.inf)
    np.testing.assert_array_equal(got, want)


def test_equal_mass_groups_are_kept_or_cut_whole():
    x, p, min_keep = _rows()
    kept = np.asarray(_fns("top_p")[0](x, p, min_keep) > -jnp.inf).sum(-1)
    assert kept[5] == V and kept[6] == V // 2  # target just above / below the upper half's mass
    assert kept[2] >= 3000 and kept[8] == 1 and kept[9] == V  # min_keep, one finite token, all tied
