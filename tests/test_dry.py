"""dry / dry_sequence_breakers / stages.dry: upstream vectors, a port of llama.cpp's loops, jit, chains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsample as js
from jaxsample import stages
from jaxsample.dry import _suffix_matches
from tests._helpers import CountingJit, probs_logits, renormalised

dry = CountingJit(js.dry, static_argnums=6)  # shared compiled entry point; breakers are static


def reference(logits, history, mult, base, allowed, last_n, breakers=()):
    """llama_sampler_dry_apply step by step (restart scan, reverse Z-algorithm, penalties), one row."""
    x = np.array(logits, np.float32)
    if mult == 0 or base < 1 or last_n == 0:
        return x
    tokens = [t for t in history if 0 <= t < len(x)]
    w = tokens if last_n < 0 else tokens[max(len(tokens) - last_n, 0) :]
    n = len(w)
    if n <= allowed:
        return x
    rat = lambda i: w[n - 1 - i]  # noqa: E731
    heads = {}
    for head, *tail in breakers:
        heads.setdefault(head, []).append(tail)
    rep_limit = n
    for i in range(n):
        longest = -1
        for tail in heads.get(rat(i), []):
            m = len(tail)
            if longest < m <= i and all(tail[o] == rat(i - o - 1) for o in range(m)):
                longest = m
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return x
    cnt, last, lt, rt = [0] * n, n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            cnt[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p, right = k - lt, rt - k + 1
            if cnt[last - p] < right:
                cnt[last - k] = min(cnt[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                cnt[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    longest_by_token = {}
    for i in range(n - 1):
        if cnt[i] >= allowed:
            tok = rat(n - 2 - i)
            longest_by_token[tok] = max(longest_by_token.get(tok, -1), cnt[i])
    max_exp = int(np.float32(88.7228391) / np.log(np.float32(base))) if base > 1.000001 else 0
    single = {h for h, tails in heads.items() if [] in tails}
    for tok, length in longest_by_token.items():
        if tok not in single:
            e = length - allowed
            if max_exp > 0 and e > max_exp:
                e = max_exp
            x[tok] -= np.float32(mult * np.float64(base) ** e)
    return x


@pytest.mark.parametrize(
    "probs, tokens, mult, allowed, last_n, breakers, expected",
    [
        ([0.25] * 4, [0, 1], 1.0, 2, 4, (), [0.25] * 4),
        ([0.25] * 4, [0, 1, 2, 0, 1], 1.0, 2, 5, (), [0.296923, 0.296923, 0.109232, 0.296923]),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], 1.0, 2, 6, ((3,),), [0.2] * 5),
        ([0.2] * 5, [0, 1, 2, 0, 1], 2.0, 2, 5, (), [0.241818, 0.241818, 0.032727, 0.241818, 0.241818]),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], 1.0, 4, 7, (), [0.2] * 5),
    ],
)
def test_llama_upstream_vectors(probs, tokens, mult, allowed, last_n, breakers, expected):
    # One shape for all cases (fewer compiles): V = 5 with a p = 0 token, T = 8 with front padding.
    x = probs_logits(probs + [0.0] * (5 - len(probs)))
    out = dry(x, jnp.array([-1] * (8 - len(tokens)) + tokens), mult, 1.1, allowed, last_n, breakers)
    np.testing.assert_allclose(renormalised(out)[: len(probs)], expected, atol=1e-6)


def test_suffix_match_lengths_llama_example():
    # "a b c c b c y a b c": llama's repeat counts 0 0 3 1 0 2 0 0 0 0 (index = position from the start)
    w = [0, 1, 2, 2, 1, 2, 9, 0, 1, 2]
    for chunk in (1, 3, 32):
        z = np.asarray(_suffix_matches(jnp.array(w[::-1]), jnp.int32(99), chunk))
        np.testing.assert_array_equal([z[9 - i] if i < 9 else 0 for i in range(10)], [0, 0, 3, 1, 0, 2, 0, 0, 0, 0])
    np.testing.assert_array_equal(_suffix_matches(jnp.array(w[::-1]), jnp.int32(2), 3)[7], 2)  # capped


def test_multi_token_breaker_caps_the_repeat():
    x = jnp.zeros(8)
    hist = jnp.array([0, 1, 2, 5, 6, 0, 1, 2])  # the suffix "0 1 2" was followed by 5
    np.testing.assert_allclose(dry(x, hist, 1.0, 2.0, 2, -1, ())[5], -2.0)  # L = 3: 1 * 2 ** 1
    np.testing.assert_allclose(dry(x, hist, 1.0, 2.0, 2, -1, ((6, 0),))[5], -1.0)  # "6 0" caps L at 2
    np.testing.assert_array_equal(dry(x, hist, 1.0, 2.0, 2, -1, ((2,),)), x)  # rep_limit 0 < allowed


def test_single_token_breakers_are_never_penalised():
    hist = jnp.array([0, 1, 2, 0, 1])
    assert dry(jnp.zeros(3), hist, 1.0, 1.5, 2, -1, ())[2] == -1.0
    np.testing.assert_array_equal(dry(jnp.zeros(3), hist, 1.0, 1.5, 2, -1, ((2,), (2, 7))), jnp.zeros(3))


def test_exponent_clamp_keeps_penalties_finite():
    phrase = list(range(1, 201))
    hist = jnp.array(phrase + [0] + phrase)  # repeat of 200 tokens, followed earlier by 0
    out = dry(jnp.zeros(201), hist, 1.0, 1.75, 2, -1, ())
    max_exp = int(np.float32(88.7228391) / np.log(np.float32(1.75)))
    assert max_exp == 158
    np.testing.assert_allclose(out[0], -(1.75**158), rtol=1e-4)
    np.testing.assert_allclose(out, reference(np.zeros(201), list(np.asarray(hist)), 1.0, 1.75, 2, -1), rtol=1e-4)


BREAKER_SETS = [(), ((2,),), ((1, 0), (2,), (2, 1, 1)), ((0, 0),)]


@pytest.mark.parametrize("breakers", BREAKER_SETS)
@given(
    history=st.lists(st.integers(-1, 3), min_size=24, max_size=24),
    mult=st.sampled_from([0.0, 0.5, 2.0]),
    base=st.sampled_from([0.9, 1.0, 1.3, 1.75]),
    allowed=st.integers(0, 4),
    last_n=st.integers(-1, 25),
)
def test_matches_llama_loops(breakers, history, mult, base, allowed, last_n):
    logits = np.linspace(-1.0, 1.0, 3, dtype=np.float32)  # V = 3: token 3 is out of range
    out = dry(jnp.asarray(logits), jnp.array(history), mult, base, allowed, last_n, breakers)
    np.testing.assert_allclose(out, reference(logits, history, mult, base, allowed, last_n, breakers), rtol=1e-5)


def test_padding_empty_histories_and_v1():
    x = jnp.array([0.5, -0.5, 1.0])
    np.testing.assert_array_equal(dry(x, jnp.zeros((0,), jnp.int32), 1.0, 1.75, 2, -1, ()), x)
    np.testing.assert_array_equal(dry(x, jnp.full((6,), -1), 1.0, 1.75, 2, -1, ()), x)
    padded = jnp.array([-1, 0, 1, -3, 2, 0, 9, -1, 1, -1])  # 9 >= V is skipped like padding
    np.testing.assert_array_equal(dry(x, padded, 1.0, 1.1, 2, -1, ()), dry(x, jnp.array([0, 1, 2, 0, 1]), 1.0, 1.1, 2, -1, ()))
    np.testing.assert_array_equal(dry(jnp.zeros(1), jnp.array([0, 0, 0, 0]), 1.0, 1.0, 2, -1, ()), [-1.0])


def test_inf_and_nan_logits_never_give_nan():
    x = jnp.array([jnp.inf, jnp.nan, -jnp.inf])
    out = dry(x, jnp.array([0, 1, 2, 0, 1, 2, 0, 1]), 3.0, 1.75, 0, -1, ())
    assert not np.isnan(np.asarray(out)).any()


def test_per_row_equals_single_row_and_no_retrace():
    hist = jnp.array([[0, 1, 2, 0, 1, -1], [1, 1, 1, 1, 1, 1], [2, 0, 2, 0, 2, 0]])
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)), jnp.float32)
    args = (jnp.array([1.0, 0.5, 0.0]), jnp.array([1.1, 1.75, 2.0]), jnp.array([2, 1, 0]), jnp.array([-1, 4, 5]))
    batched = dry(x, hist, *args, ((2,),))
    for i in range(3):
        np.testing.assert_array_equal(batched[i], dry(x[i], hist[i], *(a[i] for a in args), ((2,),)))
    traces = dry.traces
    new = (jnp.array([2.0, 1.0, -1.0]), jnp.array([1.0, 0.5, 1.3]), jnp.array([3, 0, 1]), jnp.array([0, -1, 2]))
    out = dry(x, hist, *new, ((2,),))
    assert dry.traces == traces  # new multiplier / base / allowed_length / penalty_last_n: no retrace
    for i in range(3):
        want = reference(x[i], hist[i].tolist(), *(a[i].item() for a in new), ((2,),))
        np.testing.assert_allclose(out[i], want, rtol=1e-6)


def test_bad_values_raise():
    x, h = jnp.zeros(3), jnp.array([0, 1])
    with pytest.raises(ValueError, match="allowed_length"):
        js.dry(x, h, 1.0, allowed_length=-1)
    with pytest.raises(ValueError, match="penalty_last_n"):
        js.dry(x, h, 1.0, penalty_last_n=-2)
    with pytest.raises(ValueError, match="multiplier"):
        js.dry(x, h, jnp.nan)
    with pytest.raises(ValueError, match="base"):
        js.dry(jnp.zeros((2, 3)), h, 1.0, base=jnp.ones(3))
    with pytest.raises(ValueError, match="sequence_breakers"):
        js.dry(x, h, 1.0, sequence_breakers=((),))
    with pytest.raises(ValueError, match="sequence_breakers"):
        js.dry(x, h, 1.0, sequence_breakers=(3,))
    with pytest.raises(ValueError, match="static"):
        jax.jit(js.dry)(x, h, 1.0, sequence_breakers=((2,),))


# ------------------------------------------------------------------------- breakers from strings
SENTENCES = [
    'Q: what is "DRY"?\nA: a *repetition* penalty.\n',
    "### Instruction:\nRepeat after me: the cat sat on the mat.\n",
    "### Response:\nThe cat sat on the mat. The cat sat on the mat.\n",
    'name: "value"\n**bold** text:: and more: "quotes"\n',
]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(vocab_size=330, initial_alphabet=alphabet, show_progress=False))
    return tok


def expected_breakers(breaker, tok, max_tail=20):
    """The rule stated over all suffixes of every token text (llama scans the breaker's first char)."""
    out = set()
    for tid in range(tok.get_vocab_size()):
        word = tok.decode([tid])
        if breaker in word:
            out.add((tid,))
            continue
        for p in range(len(word)):
            if breaker.startswith(word[p:]):
                out.add((tid,) + tuple(tok.encode(breaker[len(word) - p :], add_special_tokens=False).ids[:max_tail]))
    return out


def test_breakers_from_tokenizer(tokenizer):
    got = js.dry_sequence_breakers(["\n", ":", '"', "*", "### Response"], tokenizer)
    want = set().union(*(expected_breakers(b, tokenizer) for b in ["\n", ":", '"', "*", "### Response"]))
    assert set(got) == want and list(got) == sorted(got)
    assert any(len(s) > 1 for s in got) and any(len(s) == 1 for s in got)
    newline = tokenizer.encode("\n").ids
    assert tuple(newline) in got  # the newline token itself is a single-token breaker


def test_breakers_from_texts_truncation_and_errors(tokenizer):
    texts = [tokenizer.decode([i]) for i in range(tokenizer.get_vocab_size())]
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    assert js.dry_sequence_breakers([":", ""], texts, encode) == js.dry_sequence_breakers([":"], tokenizer)
    long = "### Response:" + "x" * 50
    assert js.dry_sequence_breakers([long], tokenizer) == js.dry_sequence_breakers([long[:40]], tokenizer)
    short = js.dry_sequence_breakers(["### Response"], tokenizer, max_tail=1)
    assert max(len(s) for s in short) == 2
    with pytest.raises(ValueError, match="encode"):
        js.dry_sequence_breakers([":"], texts)
    with pytest.raises(ValueError, match="vocab"):
        js.dry_sequence_breakers([":"], [1, 2], encode)


# ------------------------------------------------------------------------------------- stages
def test_stage_equals_function_on_prompt_then_accepted(tokenizer):
    breakers = js.dry_sequence_breakers(["\n"], tokenizer)
    sampler = js.chain(stages.dry(0.8, last_n=12, sequence_breakers=breakers), select=stages.greedy())
    assert set(sampler.param_specs()) == {"seed", "seed_stream", "dry_multiplier", "dry_base", "dry_allowed_length",
                                          "dry_penalty_last_n"}
    params = sampler.params((2,), dry_multiplier=jnp.array([0.8, 2.0]), dry_penalty_last_n=jnp.array([-1, 6]))
    ids = tokenizer.encode("The cat sat on the mat. The cat sat").ids
    prompt = jnp.array([ids[:6], [-1] * 2 + ids[:4]])
    accepted = [[t, t] for t in ids[6:]]
    init = jax.jit(sampler.init, static_argnames=("vocab_size", "history_size"))
    state = init(params, vocab_size=tokenizer.get_vocab_size(), prompt=prompt)
    accept = jax.jit(sampler.accept)
    for tok in accepted:
        state = accept(jnp.array(tok), state, params)
    x = jnp.zeros((2, tokenizer.get_vocab_size()))
    process = CountingJit(sampler.process)
    out, _ = process(x, state, params)
    full = jnp.concatenate([prompt, jnp.array(accepted).T], axis=-1)[:, -12:]
    expected = dry(x, full, params["dry_multiplier"], 1.75, 2, jnp.array([-1, 6]), breakers)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert (np.asarray(out) < 0).any()
    other = sampler.params((2,), dry_multiplier=1.5, dry_base=jnp.array([1.2, 3.0]), dry_allowed_length=jnp.array([1, 3]),
                           dry_penalty_last_n=jnp.array([4, 0]))
    out, _ = process(x, state, other)
    assert process.traces == 1  # every DRY param is per-row data
    expected = dry(x, full, 1.5, other["dry_base"], other["dry_allowed_length"], jnp.array([4, 0]), breakers)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="dry_penalty_last_n"):
        sampler.params((2,), dry_penalty_last_n=13)
