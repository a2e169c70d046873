"""The candidate fast path equals the dense step bit for bit, for every stage and every preset.

One hypothesis property: random logits (ties, ``-inf`` rows, NaN, ``+inf``, peaked and flat rows,
huge values), random per-row parameters (off values, extremes, NaN), random histories, rows that
do and do not qualify for candidates in one batch. For every chain, two decoding steps compare

* :meth:`Sampler.sample` (which switches to candidates when the batch allows it) with the dense
  definition ``process -> select -> accept``: tokens, processed logits and state, bit for bit, and
  the processed logits never NaN;
* the candidate computation alone (:func:`jaxsample._fastpath.candidate_path`, no switch) with the
  dense step in every row it claims to represent (so mixed batches test the forms row by row);
* one row alone with its row of the batch (batch invariance: a batch-level skip such as
  ``lax.cond(any(on), ...)`` must not change rows that are off, NaN parameters included). "Alone" is
  the row repeated over the whole batch: every batch-level reduction then sees only that row, as in a
  batch of one, and the step's own compiled program checks all three computations (no second compile).
"""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import _fastpath, presets, stages
from jaxsample.chain import chain

B, V, K = 4, 24, 8  # K candidates < V: rows qualify or not
V_PRESET = 80  # presets use 64 candidates
V_CHUNKED = 333  # > 16 K and > 32 K: _candidates.top cuts rows into chunks of 32
P = 6  # prompt / encoder length

def _settings(examples: int):
    return hypothesis.settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                               suppress_health_check=list(hypothesis.HealthCheck))


_TABLE = js.infill_table([bytes([97 + i % 5]) * (1 + i // 5) for i in range(V - 2)] + [b"", b""], eog_ids=[V - 1])

# Stages without a candidate form: they run densely before the entry (their output feeds it).
DENSE = [
    stages.logit_bias(capacity=3, vocab_size=V),
    stages.allowed_tokens(capacity=4),
    stages.suppress_tokens((5,), capacity=2),
    stages.suppress_tokens_at_begin((3,), capacity=1),
    stages.min_tokens(0, (1,), capacity=1),
    stages.forced_bos(0),
    stages.forced_eos(3, (1,)),
    stages.exponential_decay_length_penalty(1, 1.1, (1,)),
    stages.ignore_eos((1,)),
    stages.penalties(last_n=8),
    stages.penalties(scope="vllm", name="penalties_vllm"),
    stages.penalties(scope="hf", name="penalties_hf"),
    stages.encoder_repetition_penalty(),
    stages.no_repeat_ngram(2),
    stages.encoder_no_repeat_ngram(2),
    stages.bad_words(((1, 2), (3,))),
    stages.sequence_bias(((1, 2), (4,)), (0.5, -1.0)),
    stages.dry(last_n=8),
    stages.reasoning_budget((5,), (6,)),
    stages.watermark(),
    stages.synthid_watermark(2, (11, 12, 13), sampling_table_size=64, context_history_size=16),
    stages.grammar(),  # no tables: the identity
    stages.lazy_grammar(name="lazy"),  # no tables, no triggers: the identity
    stages.top_h(),
    stages.p_less(),
    stages.infill(_TABLE),
    stages.remove_inf_nan(),
    stages.log_softmax(),
]
# Stages with a candidate form (after the entry).
FORMS = [
    stages.top_p(candidates=K),
    stages.min_p(),
    stages.typical(candidates=K),
    stages.top_n_sigma(),
    stages.epsilon_cutoff(),
    stages.eta_cutoff(),
    stages.xtc(),
    stages.dynamic_temperature(name="dynatemp"),
    stages.temperature(),
]
CHAINS = {
    # every stage, dense ones first, then top-k (the entry) and every form, and a draw
    "all_top_k": chain(*DENSE, stages.top_k(candidates=K), *FORMS, select=stages.categorical(candidates=K)),
    # every form directly behind top-k (no dense stage reshapes the rows first)
    "forms_top_k": chain(stages.top_k(candidates=K), *FORMS, select=stages.categorical(candidates=K)),
    # top-p as the entry, llama.cpp's exact top-k as a form, greedy
    "top_p_entry": chain(stages.top_p(candidates=K), stages.top_k(exact=True, candidates=K), stages.min_p(),
                         stages.temperature(), select=stages.greedy()),
    # selectors without a candidate form: the step stays dense
    "mirostat": chain(stages.top_k(candidates=K), select=stages.mirostat(candidates=K)),
    "mirostat_v2": chain(stages.top_k(candidates=K), select=stages.mirostat_v2(candidates=K)),
    "adaptive_p": chain(stages.top_k(candidates=K), select=stages.adaptive_p(candidates=K)),
}
PRESETS = {
    "llama_cpp": presets.llama_cpp(),
    "llama_cpp_mirostat": presets.llama_cpp(mirostat=2),
    "vllm": presets.vllm(),
    "hf": presets.hf(do_sample=True, top_k=20, top_p=0.9, min_p=0.05, typical_p=0.9, epsilon_cutoff=1e-3,
                     eta_cutoff=1e-3, repetition_penalty=1.2, no_repeat_ngram_size=2, temperature=0.8),
}
CASES = {**{k: (c, V) for k, c in CHAINS.items()}, **{k: (p.sampler, V_PRESET) for k, p in PRESETS.items()},
         # K candidates over 11 chunks (the last one padded): the chunked search and its -inf floors
         "llama_cpp_chunked": (presets.llama_cpp(candidates=K).sampler, V_CHUNKED)}

# -------------------------------------------------------------------------------------- drawing
ROW_KINDS = ("normal", "ties", "peaked", "flat", "empty", "nan", "posinf", "sparse", "huge", "tiny_gaps")
INTS = np.array([-1, 0, 1, 2, 3, 5, 7, 9, 30, 2**31 - 1], np.int64)
FLOATS = np.array([-1.0, 0.0, 1e-30, 0.05, 0.1, 0.3, 0.5, 0.8, 0.95, 1.0, 1.2, 2.0, 5.0, 1e30,
                   np.inf, -np.inf, np.nan], np.float32)


def _row(rng, kind: str, v: int) -> np.ndarray:
    x = rng.normal(0.0, 3.0, v)
    if kind == "ties":
        x = rng.integers(-2, 3, v).astype(np.float64)
    elif kind == "peaked":
        x[rng.integers(v)] += 40.0
    elif kind == "flat":
        x = np.full(v, rng.normal())
    elif kind == "empty":
        x = np.full(v, -np.inf)
    elif kind == "nan":
        x[rng.random(v) < 0.3] = np.nan
    elif kind == "posinf":
        x[rng.integers(v, size=rng.integers(1, 3))] = np.inf
    elif kind == "sparse":
        keep = rng.integers(v, size=rng.integers(1, 6))
        x = np.where(np.isin(np.arange(v), keep), x, -np.inf)
    elif kind == "huge":
        x = x * 1e37
    elif kind == "tiny_gaps":
        x = 1.0 + rng.integers(0, 4, v) * 1e-7
    x = np.where(rng.random(v) < 0.15, -np.inf, x) if kind not in ("empty", "posinf") else x
    return x.astype(np.float32)


def _values(rng, sampler, v: int) -> dict:
    """Random per-row values for every parameter of the chain (traced: no eager range check)."""
    out = {}
    for name, spec in sampler.param_specs().items():
        if spec.shared:
            continue
        if name == "seed":
            out[name] = rng.integers(-(2**31), 2**31, B).astype(np.int32)
        elif name == "seed_stream":
            out[name] = rng.integers(0, 3, B).astype(np.int32)
        elif spec.capacity is not None:
            shape = (B, spec.capacity)
            if np.dtype(spec.dtype) == np.int32:
                ids = rng.integers(-1, v, shape)
                out[name] = np.where(rng.random(shape) < 0.3, -1, ids).astype(np.int32)
            else:
                out[name] = rng.choice(FLOATS, shape)
        elif np.dtype(spec.dtype) == np.int32:
            out[name] = np.where(rng.random(B) < 0.3, spec.default, rng.choice(INTS, B)).astype(np.int64)
            out[name] = np.clip(out[name], -(2**31), 2**31 - 1).astype(np.int32)
        else:
            default = np.float32(spec.default)
            out[name] = np.where(rng.random(B) < 0.3, default, rng.choice(FLOATS, B)).astype(np.float32)
    return out


@functools.cache
def _compiled(case: str):
    """``init`` and one program returning the three computations of a step."""
    sampler, v = CASES[case]

    def init(params, prompt):
        w = max(16, sampler.history_size())
        return sampler.init(params, vocab_size=v, prompt=prompt, encoder_ids=prompt, history_size=w)

    def step(x, state, params):
        processed, dense = sampler.process(x, state, params)
        tokens, dense = sampler.select(processed, dense, params)
        want = (tokens, processed, sampler.accept(tokens, dense, params))
        fast = _fastpath.candidate_path(sampler, jnp.where(jnp.isnan(x), -jnp.inf, x), state, params)
        return sampler.sample(x, state, params), want, fast, (tokens, processed, dense.stages, dense.selector)

    return sampler, v, jax.jit(init), jax.jit(step)


def _bits(tree):
    """Leaves as exact bit patterns (floats as uint32), so -0.0 != 0.0 and NaN payloads count."""
    def one(a):
        a = np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
        return a.view(np.uint32) if a.dtype == np.float32 else a

    return jax.tree.map(one, tree)


def _assert_rows_equal(a, b, rows, what: str):
    for x, y in zip(jax.tree.leaves(_bits(a)), jax.tree.leaves(_bits(b))):
        np.testing.assert_array_equal(x[rows], y[rows], err_msg=what)


def _check(case, kinds, seed):
    sampler, v, init, step_fn = _compiled(case)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(np.stack([_row(rng, k, v) for k in kinds]))
    params = {**sampler.params((B,)), **{k: jnp.asarray(a) for k, a in _values(rng, sampler, v).items()}}
    prompt = jnp.asarray(np.where(rng.random((B, P)) < 0.2, -1, rng.integers(0, v, (B, P))).astype(np.int32))
    state = init(params, prompt)
    for step in range(2):
        out = step_fn(x, state, params)
        _check_step(case, f"step {step}", out)
        if step == 0:  # batch invariance: one row alone (repeated over the batch) gives its row of the batch
            r = seed % B
            alone = step_fn(*jax.tree.map(lambda a: jnp.repeat(a[r : r + 1], B, axis=0), (x, state, params)))
            _check_step(case, f"row {r} alone", alone)
            _assert_rows_equal(alone[:2], jax.tree.map(lambda a: jnp.repeat(a[r : r + 1], B, axis=0), out[:2]),
                               np.arange(B), f"{case}: row {r} alone")
        state = out[1][2]
        x = jnp.asarray(np.stack([_row(rng, k, v) for k in kinds]))


def _check_step(case, what, out):
    """The switching step equals the dense step in every row, the candidates equal it in the rows they claim."""
    got, want, fast, before_accept = out
    assert not np.isnan(np.asarray(want[1])).any(), f"{case}: NaN in processed logits"
    _assert_rows_equal(got, want, np.arange(B), f"{case} {what}")
    if fast is not None:
        tokens, processed, stage_states, selector, ok = fast
        rows = np.flatnonzero(np.asarray(ok))
        _assert_rows_equal((tokens, processed, stage_states, selector), before_accept, rows,
                           f"{case} {what}: candidates of rows {rows.tolist()}")


_GIVEN = hypothesis.given(kinds=st.lists(st.sampled_from(ROW_KINDS), min_size=B, max_size=B),
                          seed=st.integers(0, 2**32 - 1))


# The fast tier: every stage (all_top_k), both entries, the selectors without a form and one preset;
# the slow tier below runs every case (forms_top_k, hf, vllm, llama_cpp_chunked too) with 200 examples.
# (tests/test_candidates.py checks the chunked search itself in the fast tier.)
FAST_CASES = ("adaptive_p", "all_top_k", "llama_cpp", "llama_cpp_mirostat", "mirostat", "mirostat_v2",
              "top_p_entry")


@pytest.mark.parametrize("case", FAST_CASES)
@_settings(8)
@_GIVEN
def test_fast_path_is_the_dense_step_bit_for_bit(case, kinds, seed):
    _check(case, kinds, seed)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
@_settings(200)
@_GIVEN
def test_fast_path_is_the_dense_step_bit_for_bit_long(case, kinds, seed):
    _check(case, kinds, seed)


def test_every_stage_factory_is_covered():
    """A new stage factory must join one of the chains above (its form, or its dense step, is then tested)."""
    covered = {type(s) for c, _ in CASES.values() for s in c.stages + (c.selector,)}
    missing = sorted(n for n in set(stages.__all__) - {"MIN_KEEP"} if getattr(stages, n) not in covered)
    assert not missing, f"stage factories missing from the fast-path property: {missing}"
