"""top_p / typical on rows whose cut-off lies beyond the candidates: the exact searches against a sort.

``candidates=8`` on ``V = 4096`` forces every row through the value searches (or the bit bisection
where they do not settle); rows are built so that the boundary sits on ties, on groups of equal
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


def _bisection_typical(x, p, min_keep, candidates):
    """typical with the bit bisection as its only exact path (the implementation before the value search)."""
    from jaxsample import _math, _threshold

    x = _math.clean(x)
    logp = _math.log_softmax(x)
    probs, entropy = _math.entropy(logp)
    keys = -jnp.abs(logp + entropy)
    off = p >= 1
    t = _threshold.cutoff(keys, weights=probs, target=jnp.where(off, 0.0, p), min_count=jnp.maximum(min_keep, 1),
                          strict=True, candidates=candidates)
    return jnp.where(off[:, None] | (keys >= t[:, None]), x, -jnp.inf)


def _typical_rows(seed):
    rng = np.random.default_rng(seed)
    n = 24
    x = rng.normal(size=(n, V)).astype(np.float32) * rng.uniform(0.5, 3.0, size=(n, 1)).astype(np.float32)
    x[1] = np.round(x[1] * 2) / 2  # ties
    x[2] = -1.6 * np.log(1 + rng.permutation(V)).astype(np.float32)  # peaked (Zipf)
    x[3, rng.random(V) < 0.7] = -np.inf
    x[4] = -np.inf  # empty row
    x[5, :100] = np.nan
    x[6, 7] = np.inf
    x[7, :100] = np.inf  # more +inf tokens than candidates
    x[8] = 0.0  # uniform
    x[9] = np.where(np.arange(V) < 3, 5.0, x[9])
    p = rng.choice(np.array([1e-6, 0.2, 0.5, 0.9, 0.95, 0.999, 1 - 1e-7, 1.0], np.float32), size=n)
    p[:12] = [0.9, 0.5, 0.9, 0.95, 0.9, 0.9, 0.9, 0.9, 0.5, 0.9, 0.999, 1e-6]
    min_keep = rng.choice(np.array([1, 1, 1, 5, 3000], np.int32), size=n)
    return jnp.asarray(x), jnp.asarray(p), jnp.asarray(min_keep)


@functools.cache
def _typical_fns():  # shared by both seeds: compiled once per shape
    return jax.jit(functools.partial(js.typical, candidates=8)), jax.jit(functools.partial(_bisection_typical, candidates=8))


@pytest.mark.parametrize("seed", [0, 1])
def test_typical_value_search_is_the_bit_bisection(seed):
    """The value search keeps what the exhaustive bit bisection keeps, with and without candidates
    (a batch of flat rows skips them), and a row alone equals its row of the batch.

    Every call has the batch's 24 rows (one compiled program per function): a row "alone" is that row
    repeated over the batch, so every batch-level decision sees it alone, as in a batch of one.
    """
    x, p, min_keep = _typical_rows(seed)
    n = x.shape[0]
    fast, bisection = _typical_fns()
    got = np.asarray(fast(x, p, min_keep))
    np.testing.assert_array_equal(got, np.asarray(bisection(x, p, min_keep)))
    for i in (0, 2, 3, 7, 9):
        alone = fast(*(jnp.repeat(a[i:i + 1], n, axis=0) for a in (x, p, min_keep)))
        np.testing.assert_array_equal(np.asarray(alone), np.broadcast_to(got[i], got.shape))
    flat = jnp.concatenate([x[10:], x[10:]])[:n]  # no candidates cover these rows
    p_flat, one = jnp.full((n,), 0.9), jnp.ones((n,), jnp.int32)
    got = np.asarray(fast(flat, p_flat, one))
    np.testing.assert_array_equal(got, np.asarray(bisection(flat, p_flat, one)))
    mixed = jnp.concatenate([x[:11], x[:11], x[:11]])[:n]  # row 10 among rows that take the candidates
    np.testing.assert_array_equal(np.asarray(fast(mixed, p_flat, one))[10], got[0])


def test_typical_program_holds_one_value_search_per_nan_branch():
    """Compile time: the unrolled search (``_SEARCH_STEPS`` conditionals) appears once in each branch
    of the NaN switch; a batch without candidates reuses it with placeholders instead of a second
    copy (four copies compiled in 26 s at ``V = 4096``, two in ~6 s)."""
    from jaxsample import _threshold

    x = jnp.zeros((4, V))
    text = jax.jit(js.typical).lower(x, jnp.full((4,), 0.9), jnp.ones((4,), jnp.int32)).as_text()
    conditionals = text.count("stablehlo.case")
    assert 2 * _threshold._SEARCH_STEPS <= conditionals < 2 * (_threshold._SEARCH_STEPS + 14), conditionals


def _bisections(monkeypatch) -> list:
    """Records one entry per run of the bit bisection (eager calls only)."""
    from jaxsample import _threshold

    calls = []
    bisect = _threshold._bisect
    monkeypatch.setattr(_threshold, "_bisect", lambda u, predicate: calls.append(1) or bisect(u, predicate))
    return calls


def _search_steps(monkeypatch) -> list:
    """Records, per ``masked_sum_count`` call, whether a value-search step made it (eager calls only)."""
    import sys

    from jaxsample import _math

    steps = []
    masked_sum_count = _math.masked_sum_count

    def counting(w, mask):
        steps.append(sys._getframe(1).f_code.co_name == "step")
        return masked_sum_count(w, mask)

    monkeypatch.setattr(_math, "masked_sum_count", counting)
    return steps


def test_value_search_settles_flat_top_p_rows_without_the_bisection(monkeypatch):
    """The mass bound that ends the search leaves half the finish window for the rounding of ``m(lo)``:
    with ``w - 2`` tokens this flat row (row 8 of the benchmark's batch) overran its 64-token window at
    ``p = 0.999`` and fell to the 32-step bisection. Eager, so the bisection runs only if a row needs it."""
    from benchmarks.samplers import flat_logits

    calls = _bisections(monkeypatch)
    x = flat_logits(jax.random.key(0), 64, 131072)[8:9]
    got = js.top_p(x, 0.999)
    assert not calls, "a flat row took the bit bisection"
    # A nucleus (every kept logit above every dropped one) whose exact mass is p up to float32 sums
    # over 113k tokens (the sorted reference's own float32 cumsum is off by ~80 tokens here).
    kept, v = np.asarray(got)[0] > -np.inf, np.asarray(x)[0].astype(np.float64)
    assert v[kept].min() > v[~kept].max()
    probs = np.exp(v - v.max()) / np.exp(v - v.max()).sum()
    assert abs(probs[kept].sum() - 0.999) < 2e-6


def test_value_search_aims_past_the_target_before_any_point_reaches_it(monkeypatch):
    """Rows 36 and 55 of the benchmark's flat batch missed the target at p = 0.95 by 4e-4, 1e-5, 3e-6:
    with no point reached yet, the aim's band was weighed at the start, far below the cut-off, and
    each secant crept up from below (4 steps). Weighed at the last miss they settle in 2. Eager, so
    only the steps that run are counted; the result is the nucleus either way."""
    from benchmarks.samplers import flat_logits

    steps = _search_steps(monkeypatch)
    x = flat_logits(jax.random.key(0), 64, 131072)[jnp.array([36, 55])]
    got = np.asarray(js.top_p(x, 0.95))
    assert sum(steps) == 2, steps
    v = np.asarray(x, np.float64)
    for row, kept in zip(v, got > -np.inf):
        assert row[kept].min() > row[~kept].max()
        probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        assert 0.95 <= probs[kept].sum() < 0.95 + probs[kept].min() + 1e-6


def test_typical_settles_a_row_of_deviation_3_without_the_bisection(monkeypatch):
    """This row of deviation-3 logits once took all 16 steps, then the 32-step bisection (a secant on
    the window's mass, its band weighed at the last miss); weighed at ``lo`` it settled in 9, and with
    the model of the heavy tokens above the window (which now also weighs it at the last miss) in 2."""
    from benchmarks.samplers import flat_logits

    steps, bisections = _search_steps(monkeypatch), _bisections(monkeypatch)
    x = flat_logits(jax.random.key(12), 64, 131072)[18:19] * 1.5
    got = np.asarray(js.typical(x, 0.9))
    assert sum(steps) <= 3 and not bisections, (sum(steps), len(bisections))
    np.testing.assert_array_equal(got > -np.inf, np.asarray(ref.typical(x, 0.9)) > -np.inf)


def test_typical_models_the_mass_above_its_window(monkeypatch):
    """Flat rows (the benchmark's batch, deviation 2): each step models the mass of the window *and*
    everything above it, which is smooth, and adds back the exact mass of the few heavy tokens above
    the window's top end (:class:`jaxsample._threshold.Heavy`, from the ``K`` most probable tokens).
    The secant on the window's mass alone, which jumps by a heavy token's whole weight wherever the
    top end passes one, took 5 steps on this batch of 4 rows; the model 3, and 2 since a point on a
    heavy key settles by mass once that token's known weight is taken off (rows 0, 2 and 3: the model
    puts their second point on a heavy key; the third was the key just above it).

    Rows of deviation 1 (rows 3, 52, 63, 7 of the same draw halved), whose window's top end lies
    beyond the ``K`` most probable tokens, take the secant on the window's mass; aimed at the bare
    target until a point reaches it, it crept up from below and stalled where two points held the
    same tokens (6 and 7 steps at p = 0.5 and 0.9, one of them over the whole row); aimed past the
    target by half the band weighed at the last miss, 3. Steps are counted as they run (a debug
    callback in each step's pass, under ``jit``); the result is the bit bisection's."""
    import sys

    from benchmarks.samplers import flat_logits
    from jaxsample import _math

    steps = []
    masked_sum_count = _math.masked_sum_count

    def counting(w, mask):
        out = masked_sum_count(w, mask)
        if sys._getframe(1).f_code.co_name == "step":
            jax.debug.callback(lambda _: steps.append(1), out[1])
        return out

    monkeypatch.setattr(_math, "masked_sum_count", counting)
    flat = flat_logits(jax.random.key(0), 64, 131072)
    one = jnp.ones((4,), jnp.int32)
    fast = jax.jit(lambda x, p: js.typical(x, p, one))
    bisection = jax.jit(functools.partial(_bisection_typical, candidates=64))
    cases = [(flat[:4], p, 2) for p in (0.9, 0.95)] + [(0.5 * flat[jnp.array([3, 52, 63, 7])], p, 3) for p in (0.5, 0.9)]
    for x, p, most in cases:
        steps.clear()
        got = jax.block_until_ready(fast(x, jnp.full((4,), p)))
        assert 1 <= len(steps) <= most, (p, len(steps))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(bisection(x, jnp.full((4,), p), one)))


def test_typical_flat_rows_compute_one_top_and_no_row_maximum_of_keys(monkeypatch):
    """A batch of flat rows, one of them with an outlying logit (probability ~0.15, so ``K`` times
    the largest probability reaches ``p`` while its ``K`` most probable tokens hold ~0.15): the entropy
    bound marks every row as one the ``K`` tokens nearest the entropy cannot cover, so the program
    takes only the ``K`` most probable tokens (for the search's model), not also the ``K`` nearest the
    entropy (two tops before), and with ``min_keep = 1`` reads no maximum of the keys (a pass over the
    keys written out as a ``[B, V]`` array before). Eager calls run only the branches taken."""
    from jaxsample import _candidates, _threshold

    tops, maxima = [], []
    top, kth = _candidates.top, _threshold.kth_largest
    monkeypatch.setattr(_candidates, "top", lambda x, k, **kw: tops.append(k) or top(x, k, **kw))
    monkeypatch.setattr(_threshold, "kth_largest", lambda *a, **k: maxima.append(1) or kth(*a, **k))
    x = np.random.default_rng(5).normal(size=(3, V)).astype(np.float32) * 2
    x[1, 17] = 8.6
    x = jnp.asarray(x)
    got = js.typical(x, 0.9, candidates=8)
    assert tops == [8, 128] and not maxima, (tops, maxima)  # the K most probable, the finish window
    np.testing.assert_array_equal(np.asarray(got) > -np.inf, np.asarray(ref.typical(x, 0.9)) > -np.inf)


@pytest.mark.parametrize("k", [1, 8, 64])
def test_typical_entropy_bound_never_marks_a_row_its_candidates_could_cover(k):
    """``_beyond_candidates`` is a bound: a row it marks has no ``k`` tokens holding ``p`` (the ``k``
    most probable hold less), on peaked, flat, outlying and two-level rows of several sizes."""
    from jaxsample import _math
    from jaxsample.samplers.typical import _beyond_candidates

    rng = np.random.default_rng(k)
    for vocab in (k + 1, 100, 4096):
        rows = [rng.normal(size=vocab) * s for s in (0.1, 0.5, 1.0, 2.0, 3.0, 5.0)]
        rows += [-1.6 * np.log(rng.permutation(vocab) + 1.0), np.where(np.arange(vocab) < k, 3.0, 0.0)]
        outlier = rng.normal(size=vocab) * 2
        outlier[0] = np.log(np.exp(outlier[1:]).sum())  # holds half the mass
        x = jnp.asarray(np.stack(rows + [outlier]).astype(np.float32))
        m, _, log_sum = _math.shifted_normaliser(x)
        _, h = _math.log_probs_entropy(x, m)
        probs = np.sort(np.asarray(jax.nn.softmax(x)), axis=-1)[:, ::-1]
        for p in (0.1, 0.5, 0.9, 0.99):
            beyond = np.asarray(_beyond_candidates(h[:, 0], log_sum[:, 0], jnp.full(len(rows) + 1, p), k, vocab))
            assert not np.any(beyond & (probs[:, :k].sum(-1) >= p)), (vocab, p, beyond)
            if vocab == 4096 and p == 0.9 and k == 64:  # the flat rows of deviation 0.5-2 are all marked
                assert beyond[1:4].all(), beyond
