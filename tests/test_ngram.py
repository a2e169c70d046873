"""no_repeat_ngram / encoder_no_repeat_ngram / bad_words / sequence_bias and their stages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from jaxsample import stages
from tests._helpers import CountingJit, kept

V = 5
T = 10
no_repeat = jax.jit(js.no_repeat_ngram, static_argnums=2)
encoder_no_repeat = jax.jit(js.encoder_no_repeat_ngram, static_argnums=3)
bad = jax.jit(js.bad_words, static_argnums=(2, 3), static_argnames="skip_longer_than_context")
bias = CountingJit(js.sequence_bias, static_argnums=2, static_argnames="skip_longer_than_context")

SEQS = ((1,), (4,), (1, 0), (0, 1, 2), (1, 3, 1, 3), (2, 2))


def _tokens(history, vocab=V):
    return [t for t in history if 0 <= t < vocab]


def ngram_bans(source, context, n, vocab=V):
    """HF's dict of n-grams: tokens following the last n-1 context tokens in n-grams of ``source``."""
    source, context = _tokens(source, vocab), _tokens(context, vocab)
    if len(context) < n - 1:
        return set()
    prefix = tuple(context[len(context) - n + 1 :]) if n > 1 else ()
    return {source[i + n - 1] for i in range(len(source) - n + 1) if tuple(source[i : i + n - 1]) == prefix}


def completed(history, seqs, skip_longer):
    """Indices of sequences whose prefix ends the history (HF / vLLM length rules)."""
    tokens = _tokens(history)
    out = []
    for i, s in enumerate(seqs):
        need = (len(s) if skip_longer else len(s) - 1) if len(s) > 1 else 0
        if len(tokens) >= need and tuple(tokens[len(tokens) - len(s) + 1 :] if len(s) > 1 else ()) == s[:-1]:
            out.append(i)
    return out


def banned(out):
    return set(np.flatnonzero(~kept(out)).tolist())


histories = st.lists(st.integers(-1, V), min_size=T, max_size=T)  # -1 padding and V out of range


def test_hf_no_repeat_ngram_cases():
    ids = jnp.array([[1, 1, 2, 1], [0, 1, 0, 1]])
    x = jnp.zeros((2, V))
    np.testing.assert_array_equal(~kept(no_repeat(x, ids, 2)), [[0, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(~kept(no_repeat(x, ids, 3)), [[0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(~kept(no_repeat(x, ids, 1)), [[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]])


def test_hf_encoder_no_repeat_ngram_cases():
    enc = jnp.array([[1, 2, 1, 1], [0, 1, 0, 1]])
    ids = jnp.array([[1, 2, 1], [8, 0, 2]])
    x = jnp.zeros((2, V))
    np.testing.assert_array_equal(~kept(encoder_no_repeat(x, enc, ids, 2)), [[0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(~kept(encoder_no_repeat(x, enc, ids, 3)), [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(~kept(encoder_no_repeat(x, enc, ids, 1)), [[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]])


def test_hf_bad_words_case_with_eos():
    ids = jnp.array([[0, 1, 3, 1], [0, 1, 0, 1]])
    out = bad(jnp.zeros((2, V)), ids, ((1,), (4,), (1, 0), (0, 1, 2), (1, 3, 1, 3)), (4,))
    np.testing.assert_array_equal(~kept(out), [[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]])


def test_hf_sequence_bias_case():
    ids = jnp.array([[0, 1, 3, 1], [0, 1, 0, 1]])
    seqs = ((1,), (4,), (1, 0), (0, 1, 2), (1, 3, 1, 3))
    out = bias(jnp.zeros((2, V)), ids, seqs, jnp.array([100.0, 100.0, -100.0, -100.0, -100.0]))
    np.testing.assert_array_equal(out, [[-100, 100, 0, -100, 100], [-100, 100, -100, 0, 100]])


@pytest.mark.parametrize("n", [1, 2, 3])
@given(history=histories)
def test_no_repeat_ngram_matches_dict_oracle(n, history):
    out = no_repeat(jnp.zeros(V), jnp.array(history), n)
    assert banned(out) == ngram_bans(history, history, n)


@given(enc=st.lists(st.integers(-1, V), min_size=8, max_size=8), history=histories, n=st.sampled_from([1, 2, 3]))
def test_encoder_no_repeat_ngram_matches_oracle(enc, history, n):
    out = encoder_no_repeat(jnp.zeros(V), jnp.array(enc), jnp.array(history), n)
    assert banned(out) == ngram_bans(enc, history, n)


@pytest.mark.parametrize("skip_longer", [False, True])
@given(history=histories, values=st.lists(st.floats(-5, 5, width=32, allow_subnormal=False), min_size=len(SEQS), max_size=len(SEQS)))
def test_bad_words_and_sequence_bias_match_oracle(skip_longer, history, values):
    hist = jnp.array(history)
    hits = completed(history, SEQS, skip_longer)
    out = bad(jnp.zeros(V), hist, SEQS, (), skip_longer_than_context=skip_longer)
    assert banned(out) == {SEQS[i][-1] for i in hits}
    expected = np.zeros(V, np.float32)
    for i in hits:
        expected[SEQS[i][-1]] += np.float32(values[i])
    out = bias(jnp.zeros(V), hist, SEQS, jnp.array(values), skip_longer_than_context=skip_longer)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_length_rules_differ_only_when_the_context_is_the_prefix():
    hist = jnp.array([-1, 0, 1])  # exactly the prefix of (0, 1, 2)
    assert banned(bad(jnp.zeros(V), hist, ((0, 1, 2),), ())) == {2}  # vLLM: L - 1 tokens suffice
    assert banned(bad(jnp.zeros(V), hist, ((0, 1, 2),), (), skip_longer_than_context=True)) == set()


def test_edge_histories_and_vocab():
    x = jnp.zeros(3)
    empty = jnp.zeros((0,), jnp.int32)
    np.testing.assert_array_equal(no_repeat(x, empty, 2), x)
    np.testing.assert_array_equal(no_repeat(x, jnp.array([0, 1]), 3), x)  # n > T
    np.testing.assert_array_equal(encoder_no_repeat(x, jnp.array([1, 2]), empty, 1), [0, -jnp.inf, -jnp.inf])
    np.testing.assert_array_equal(encoder_no_repeat(x, jnp.array([1, 2]), empty, 2), x)
    assert banned(bad(x, empty, ((2,), (0, 1)), ())) == {2}
    # V = 1: banning the only token empties the row (hard constraint, documented)
    np.testing.assert_array_equal(no_repeat(jnp.zeros(1), jnp.array([0, 0]), 2), [-jnp.inf])
    # out-of-range history ids are skipped: the bigram (0, 1) spans the 7
    assert banned(no_repeat(x, jnp.array([0, 7, 1, -1, 0]), 2)) == {1}


def test_inf_and_nan_logits():
    x = jnp.array([jnp.inf, jnp.nan, 1.0])
    out = bias(x, jnp.array([0, 2]), ((0,), (1,), (2, 2)), jnp.array([-jnp.inf, 1.0, 2.0]))
    np.testing.assert_array_equal(out, [-jnp.inf, -jnp.inf, 3.0])


def test_per_row_biases_and_no_retrace():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, V)), jnp.float32)
    hist = jnp.array([[0, 1, 2], [2, 2, 2], [-1, 1, 0]])
    b = jnp.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0], [-2.0, 1.0, 1.0]])
    seqs = ((2,), (2, 2), (1, 0))
    batched = bias(x, hist, seqs, b)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], bias(x[i], hist[i], seqs, b[i]))
    traces = bias.traces
    for h, bb in [(hist[::-1], -b), (hist, jnp.zeros((3, 3)))]:
        bias(x, h, seqs, bb)
    assert bias.traces == traces  # new biases and histories: no retrace
    np.testing.assert_array_equal(batched[1], x[1] + jnp.array([0, 0, 0.5, 0, 0]))  # (2,) +0.5, (2, 2) +0
    broadcast = js.sequence_bias(x, hist, seqs, jnp.array([1.0, 2.0, -1.0]))  # one bias vector for all rows
    np.testing.assert_array_equal(broadcast, bias(x, hist, seqs, jnp.tile(b[:1], (3, 1))))


def test_bf16_in_bf16_out():
    out = bad(jnp.zeros(3, jnp.bfloat16), jnp.array([1]), ((1, 2),), ())
    assert out.dtype == jnp.bfloat16 and banned(out) == {2}


def test_bad_values_raise():
    x = jnp.zeros(4)
    h = jnp.array([0, 1])
    with pytest.raises(ValueError, match="n must be >= 1"):
        js.no_repeat_ngram(x, h, 0)
    with pytest.raises(ValueError, match="n must be a Python int"):
        js.encoder_no_repeat_ngram(x, h, h, 2.5)
    with pytest.raises(ValueError, match="sequences"):
        js.bad_words(x, h, ((),))
    with pytest.raises(ValueError, match="sequences"):
        js.bad_words(x, h, ((1, -2),))
    with pytest.raises(ValueError, match="vocabulary"):
        js.bad_words(x, h, ((1, 4),))
    with pytest.raises(ValueError, match="repeated"):
        js.sequence_bias(x, h, ((1,), (1,)), [1.0, 2.0])
    with pytest.raises(ValueError, match="biases"):
        js.sequence_bias(x, h, ((1,), (2,)), [1.0])
    with pytest.raises(ValueError, match="biases"):
        js.sequence_bias(jnp.zeros((2, 4)), h, ((1,),), jnp.ones((3, 1)))
    with pytest.raises(ValueError, match="biases"):
        js.sequence_bias(x, h, ((1,),), [jnp.nan])
    assert banned(js.bad_words(x, h, ((2,), (2,)))) == {2}  # repeated bans merge


# ------------------------------------------------------------------------------------- stages
def _process(sampler, params, prompt, accepted, vocab=V, **init):
    state = jax.jit(sampler.init, static_argnames=("vocab_size", "history_size"))(
        params, vocab_size=vocab, prompt=prompt, **init
    )
    accept = jax.jit(sampler.accept)
    for tok in accepted:
        state = accept(jnp.asarray(tok), state, params)
    x = jnp.asarray(np.random.default_rng(2).normal(size=prompt.shape[:-1] + (vocab,)), jnp.float32)
    return x, jax.jit(sampler.process)(x, state, params)[0]


def test_no_repeat_ngram_stage_equals_function_on_concatenated_history():
    sampler = js.chain(stages.no_repeat_ngram(2), select=stages.greedy())
    prompt = jnp.array([[3, -1, 1], [0, 4, -1]])
    accepted = [[3, 4], [2, 0]]
    x, out = _process(sampler, sampler.params((2,)), prompt, accepted, history_size=6)
    full = jnp.concatenate([prompt, jnp.array(accepted).T], axis=-1)
    np.testing.assert_array_equal(out, no_repeat(x, full, 2))


def test_bad_words_stage_scopes():
    seqs = ((1, 2), (0, 3, 4))
    prompt = jnp.array([[0, 1]])
    vllm = js.chain(stages.bad_words(seqs), select=stages.greedy())
    hf = js.chain(stages.bad_words(seqs, scope="hf"), select=stages.greedy())
    # at the first step, vLLM sees no generated tokens; HF matches the prompt
    _, out = _process(vllm, vllm.params((1,)), prompt, [])
    assert banned(out[0]) == set()
    _, out = _process(hf, hf.params((1,)), prompt, [])
    assert banned(out[0]) == {2}
    for sampler in (vllm, hf):
        _, out = _process(sampler, sampler.params((1,)), prompt, [[0], [3]])
        assert banned(out[0]) == {4}
    with pytest.raises(ValueError, match="scope"):
        stages.bad_words(seqs, scope="llama")


def test_sequence_bias_stage_per_row_params():
    sampler = js.chain(stages.sequence_bias(((2,), (1, 3)), [1.0, -1.0]), select=stages.greedy())
    assert {"sequence_bias_0", "sequence_bias_1"} <= set(sampler.param_specs())
    prompt = jnp.array([[0, 1], [1, 1]])
    params = sampler.params((2,), sequence_bias_1=jnp.array([-5.0, 7.0]))
    x, out = _process(sampler, params, prompt, [])
    expected = bias(x, prompt, ((2,), (1, 3)), jnp.array([[1.0, -5.0], [1.0, 7.0]]))
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="one value per sequence"):
        stages.sequence_bias(((2,),), [1.0, 2.0])


def test_encoder_no_repeat_ngram_stage():
    sampler = js.chain(stages.encoder_no_repeat_ngram(2), select=stages.greedy())
    enc = jnp.array([[1, 2, 1, 1]])
    x, out = _process(sampler, sampler.params((1,)), jnp.array([[3]]), [[1]], encoder_ids=enc)
    np.testing.assert_array_equal(out, encoder_no_repeat(x, enc, jnp.array([[3, 1]]), 2))
    with pytest.raises(ValueError, match="encoder_ids"):
        _process(sampler, sampler.params((1,)), jnp.array([[3]]), [])
