"""penalties / encoder_repetition_penalty and their stages: upstream vectors, reference, jit, chains."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from jaxsample import stages
from tests._helpers import CountingJit, probs_logits, renormalised

P5 = [0.2] * 5
# Shared compiled entry points (eager calls are kept for the validation tests).
pen = CountingJit(js.penalties)
enc_pen = CountingJit(js.encoder_repetition_penalty)


def assert_no_retrace(f, calls):
    """``f`` (a shared :class:`CountingJit`) is not traced again for new parameter values."""
    outs = [f(*calls[0])]
    before = f.traces
    outs += [f(*c) for c in calls[1:]]
    assert f.traces == before, f"{f.traces - before} retraces for new values"
    return outs


def reference(logits, history, repeat=1.0, frequency=0.0, presence=0.0, last_n=-1):
    """llama.cpp's loop, one row, float32: the window is the last ``last_n`` tokens in ``[0, V)``."""
    x = np.array(logits, np.float32)
    tokens = [t for t in history if 0 <= t < len(x)]
    if last_n >= 0:
        tokens = tokens[max(len(tokens) - last_n, 0) :] if last_n else []
    for tok, c in collections.Counter(tokens).items():
        v = x[tok]
        v = v * np.float32(repeat) if v <= 0 else v / np.float32(repeat)
        x[tok] = v - (np.float32(c) * np.float32(frequency) + np.float32(presence))
    return x


@pytest.mark.parametrize(
    "tokens, repeat, fp, expected",
    [
        ([0], 50.0, 0.0, [0, 0.25, 0.25, 0.25, 0.25]),
        ([0, 1, 2], 50.0, 0.0, [0, 0, 0, 0.5, 0.5]),
        ([0, 1, 2, 0, 0], 50.0, 0.0, [0, 0, 0, 0.5, 0.5]),
        ([0], 1.0, 5.0, [0.000011, 0.249997, 0.249997, 0.249997, 0.249997]),
        ([0, 1, 2], 1.0, 5.0, [0.000023, 0.000023, 0.000023, 0.499966, 0.499966]),
        ([0, 1, 2, 0, 0], 1.0, 5.0, [0.000000, 0.000023, 0.000023, 0.499977, 0.499977]),
    ],
)
def test_llama_upstream_vectors(tokens, repeat, fp, expected):
    hist = jnp.array([-1] * (5 - len(tokens)) + tokens)  # one shape for all cases: padding is ignored
    out = pen(probs_logits(P5), hist, repeat, fp, fp, -1)
    np.testing.assert_allclose(renormalised(out), expected, atol=1e-6)


def test_formula_by_hand():
    x = jnp.array([2.0, -1.0, 0.0, 3.0, -jnp.inf])
    hist = jnp.array([0, 1, 1, 2, 4, 4, 4])
    out = pen(x, hist, 2.0, 0.5, 0.25, -1)
    # token 0: 2/2 - (0.5 + 0.25); token 1: -1*2 - (1 + 0.25); token 2: 0 - 0.75; token 3 unseen
    np.testing.assert_array_equal(out, [0.25, -3.25, -0.75, 3.0, -jnp.inf])


def test_repetition_once_per_distinct_token():
    out = pen(jnp.array([4.0, -4.0]), jnp.array([0, 0, 0, 1, 1]), 2.0, 0.0, 0.0, -1)
    np.testing.assert_array_equal(out, [2.0, -8.0])


def test_window_counts_last_valid_tokens_padding_anywhere():
    x = jnp.zeros(4)
    hist = jnp.array([3, -1, 0, 9, 1, -5, 1, 2, -1])  # tokens (V=4): 3 0 1 1 2; 9 is out of range
    counts = lambda n: -np.asarray(pen(x, hist, 1.0, 1.0, 0.0, n))  # noqa: E731
    np.testing.assert_array_equal(counts(-1), [1, 2, 1, 1])
    np.testing.assert_array_equal(counts(3), [0, 2, 1, 0])
    np.testing.assert_array_equal(counts(1), [0, 0, 1, 0])
    np.testing.assert_array_equal(counts(0), [0, 0, 0, 0])
    np.testing.assert_array_equal(counts(100), [1, 2, 1, 1])


def test_empty_and_all_padding_histories_and_v1():
    x = jnp.array([1.0, -2.0])
    for hist in (jnp.zeros((0,), jnp.int32), jnp.full((3,), -1)):
        np.testing.assert_array_equal(pen(x, hist, 3.0, 1.0, 1.0, -1), x)
    np.testing.assert_array_equal(pen(jnp.array([2.0]), jnp.array([0, 0]), 2.0, 1.0, 0.0, -1), [-1.0])


def test_off_values_are_exact_no_ops_and_inf_nan():
    x = jnp.array([1.3, -jnp.inf, jnp.nan, jnp.inf])
    out = pen(x, jnp.array([0, 1, 2, 3]), 1.0, 0.0, 0.0, -1)
    np.testing.assert_array_equal(out, jnp.where(jnp.isnan(x), -jnp.inf, x))
    out = pen(x, jnp.array([0, 1, 2, 3]), 1.5, 2.0, 1.0, -1)
    assert not np.isnan(np.asarray(out)).any()


def test_bf16_in_bf16_out():
    out = pen(jnp.array([2.0, -2.0], jnp.bfloat16), jnp.array([0, 1]), 2.0, 0.0, 0.0, -1)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), [1.0, -4.0])


@given(
    st.lists(st.integers(-2, 7), max_size=12),
    st.lists(st.floats(-3, 3, width=32, allow_subnormal=False), min_size=6, max_size=6),
    st.sampled_from([0.5, 1.0, 1.7]),
    st.floats(-1, 1, width=32, allow_subnormal=False),
    st.floats(-1, 1, width=32, allow_subnormal=False),
    st.integers(-1, 13),
)
def test_matches_reference(history, logits, repeat, frequency, presence, last_n):
    hist = jnp.array(history + [-1] * (12 - len(history)), jnp.int32)  # one shape: one compile
    out = pen(jnp.array(logits), hist, repeat, frequency, presence, last_n)
    np.testing.assert_allclose(out, reference(logits, history, repeat, frequency, presence, last_n), rtol=1e-6)


def test_per_row_equals_single_row_and_no_retrace():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 7)), jnp.float32)
    hist = jnp.array([[0, 1, 1, -1, 6], [2, 2, 2, 3, 9], [-1, -1, -1, -1, -1]])
    args = (jnp.array([1.5, 0.7, 2.0]), jnp.array([0.1, 0.0, -0.3]), jnp.array([0.0, 0.4, 1.0]), jnp.array([-1, 2, 0]))
    batched = pen(x, hist, *args)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], pen(x[i], hist[i], *(a[i] for a in args)))
    calls = [
        (x, hist, *args),
        (x, hist, jnp.array([1.0, 3.0, 0.2]), jnp.array([-0.5, 0.0, 0.5]), jnp.array([2.0, 1.0, 0.0]), jnp.array([5, 0, 1])),
    ]
    out = assert_no_retrace(pen, calls)[1]
    np.testing.assert_allclose(out[0], reference(x[0], hist[0].tolist(), 1.0, -0.5, 2.0, 5), rtol=1e-6)


def test_traced_out_of_range_values_are_clamped():
    out = pen(jnp.array([1.0, -1.0, 1.0]), jnp.array([0, 1]), jnp.float32(-2.0), 0.0, 0.0, jnp.int32(-7))
    # repeat -> the smallest positive float, last_n -> the whole history (token 1 penalised too)
    tiny = np.finfo(np.float32).tiny
    np.testing.assert_allclose(out, [1 / tiny, -tiny, 1.0], rtol=1e-6)


def test_bad_values_raise():
    x = jnp.ones(3)
    with pytest.raises(ValueError, match="repeat"):
        js.penalties(x, jnp.array([0]), repeat=0.0)
    with pytest.raises(ValueError, match="repeat"):
        js.penalties(x, jnp.array([0]), repeat=-1.0)
    with pytest.raises(ValueError, match="last_n"):
        js.penalties(x, jnp.array([0]), last_n=-2)
    with pytest.raises(ValueError, match="last_n"):
        js.penalties(x, jnp.array([0]), last_n=1.5)
    with pytest.raises(ValueError, match="frequency"):
        js.penalties(jnp.ones((2, 3)), jnp.array([0]), frequency=jnp.ones(3))
    with pytest.raises(ValueError, match="history"):
        js.penalties(jnp.ones((2, 3)), jnp.zeros((3, 2), jnp.int32))
    with pytest.raises(ValueError, match="penalty"):
        js.encoder_repetition_penalty(x, jnp.array([0]), 0.0)


def test_hf_style_repetition_and_encoder_cases():
    # HF semantics: scores 1/V except scores[0,0] = -1/V and scores[1,5] = 4/V; input_ids [[0,1],[5,0]]
    v = 10
    scores = np.full((2, v), 1 / v, np.float32)
    scores[0, 0], scores[1, 5] = -1 / v, 4 / v
    ids = jnp.array([[0, 1], [5, 0]])
    out = np.asarray(pen(scores, ids, 2.0, 0.0, 0.0, -1))
    expected = scores.copy()
    expected[0, 0], expected[0, 1], expected[1, 0], expected[1, 5] = -2 / v, 0.5 / v, 0.5 / v, 2 / v
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    enc = np.asarray(enc_pen(scores, ids, 2.0))
    expected = scores.copy()
    expected[0, 0], expected[0, 1], expected[1, 0], expected[1, 5] = -0.5 / v, 2 / v, 2 / v, 8 / v
    np.testing.assert_allclose(enc, expected, rtol=1e-6)
    assert_no_retrace(enc_pen, [(scores, ids, jnp.float32(p)) for p in (2.0, 0.5)])


# ------------------------------------------------------------------------------------- stages
def _run(sampler, params, prompt, accepted, vocab, history_size=None, encoder_ids=None):
    init = jax.jit(sampler.init, static_argnames=("vocab_size", "history_size"))
    state = init(params, vocab_size=vocab, prompt=prompt, history_size=history_size, encoder_ids=encoder_ids)
    accept = jax.jit(sampler.accept)
    for tok in accepted:
        state = accept(jnp.asarray(tok), state, params)
    x = jnp.asarray(np.random.default_rng(1).normal(size=prompt.shape[:-1] + (vocab,)), jnp.float32)
    out, _ = jax.jit(sampler.process)(x, state, params)
    return x, out


def test_llama_stage_equals_function_on_prompt_then_accepted():
    # DRY (off by default) makes the ring longer than the penalties window: the stage reads its 6
    sampler = js.chain(stages.penalties(last_n=6), stages.dry(last_n=10), select=stages.greedy())
    params = sampler.params((2,), repetition_penalty=jnp.array([1.5, 2.0]), frequency_penalty=0.3,
                            presence_penalty=jnp.array([0.0, 0.5]), penalty_last_n=jnp.array([-1, 3]))
    prompt = jnp.array([[1, 2, 0, 3], [-1, -1, 4, 4]])  # row 0: 7 tokens, one more than the window
    accepted = [[5, 0], [1, 1], [1, 2]]
    x, out = _run(sampler, params, prompt, accepted, 8)
    full = jnp.concatenate([prompt, jnp.array(accepted).T], axis=-1)
    expected = pen(x, full, params["repetition_penalty"], 0.3, params["presence_penalty"], jnp.array([6, 3]))
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="penalty_last_n"):
        sampler.params((2,), penalty_last_n=7)


def test_vllm_stage_scopes():
    sampler = js.chain(stages.penalties(scope="vllm"), select=stages.greedy())
    params = sampler.params((1,), repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    prompt = jnp.array([[1, 2, 2]])
    x, out = _run(sampler, params, prompt, [[2], [3], [3]], 6, history_size=8)
    expected = pen(x, jnp.array([[1, 2, 2, 2, 3, 3]]), 1.5, 0.0, 0.0, -1)
    expected = pen(expected, jnp.array([[-1, -1, -1, 2, 3, 3]]), 1.0, 0.5, 0.25, -1)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # the prompt-only token 1 gets the repetition penalty but no frequency/presence
    assert out[0, 1] == pen(x, jnp.array([[-1, -1, -1, -1, -1, 1]]), 1.5, 0.0, 0.0, -1)[0, 1]


def test_hf_stage_and_encoder_stage():
    sampler = js.chain(stages.penalties(scope="hf"), stages.encoder_repetition_penalty(), select=stages.greedy())
    assert set(sampler.param_specs()) == {"seed", "seed_stream", "repetition_penalty", "prompt_ignore_length",
                                          "encoder_repetition_penalty"}
    params = sampler.params((1,), repetition_penalty=1.3, encoder_repetition_penalty=2.0)
    prompt, enc = jnp.array([[0, 1]]), jnp.array([[4, 5, -1]])
    x, out = _run(sampler, params, prompt, [[2]], 6, history_size=3, encoder_ids=enc)
    expected = enc_pen(pen(x, jnp.array([[0, 1, 2]]), 1.3, 0.0, 0.0, -1), enc, 2.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # without encoder ids, the encoder penalty reads the prompt (HF decoder-only behaviour)
    x, out = _run(sampler, params, prompt, [[2]], 6, history_size=3)
    expected = enc_pen(pen(x, jnp.array([[0, 1, 2]]), 1.3, 0.0, 0.0, -1), prompt, 2.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_stage_validation():
    with pytest.raises(ValueError, match="scope"):
        stages.penalties(scope="openai")
    sampler = js.chain(stages.penalties(last_n=-1), select=stages.greedy())
    with pytest.raises(ValueError, match="history_size"):
        sampler.init(sampler.params((1,)), vocab_size=4)
    with pytest.raises(ValueError, match="repetition_penalty"):
        sampler.params((1,), repetition_penalty=0.0)
