"""Speculative decoding: greedy speculative == greedy target (transformer and bigram, ragged prompts,
EOS inside accepted runs), sampled output distribution == the target's, identical draft accepts
everything, temperature 0 rows are greedy."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import BIGRAM, TinyDecoder, generate, speculative_generate
from tests._helpers import assert_sequences_follow, bigram_sequence_probs

TARGET_NET = TinyDecoder(vocab_size=12, d_model=16, num_layers=2, num_heads=2)
DRAFT_NET = TinyDecoder(vocab_size=12, d_model=8, num_layers=1, num_heads=2)


@functools.cache
def target_params():
    return jax.jit(TARGET_NET.init_params)(jax.random.key(10), scale=3.0)


@functools.cache
def draft_params():
    return jax.jit(DRAFT_NET.init_params)(jax.random.key(11), scale=3.0)


SAMPLER = js.chain(stages.temperature(1.0), select=stages.categorical())


def test_greedy_speculative_equals_greedy_target_on_transformers():
    prompts = jnp.array([[1, 2, 3, 4], [5, -1, -1, -1], [7, 7, 0, -1]])
    kw = dict(
        max_new_tokens=jnp.array([8, 5, 8]), max_tokens=8, eos_ids=3, min_new_tokens=jnp.array([0, 2, 0])
    )
    ref = generate(TARGET_NET.model, target_params(), prompts, **kw)
    out = speculative_generate(
        TARGET_NET.model, target_params(), DRAFT_NET.model, draft_params(), prompts, num_draft_tokens=3, **kw
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
    assert np.all(np.asarray(out.num_accepted) <= np.asarray(out.num_drafted))


V = 4
RNG = np.random.default_rng(12)
TARGET = {"logits": jnp.asarray(RNG.standard_normal((V, V)), jnp.float32)}
DRAFT = {"logits": jnp.asarray(RNG.standard_normal((V, V)), jnp.float32)}


def test_greedy_bigram_with_eos_inside_an_accepted_run_stops_there():
    # the draft equals the target, so every draft is accepted and EOS arrives mid-run
    prompts = jnp.array([[0], [1], [2], [3]])
    ref = generate(BIGRAM, TARGET, prompts, max_new_tokens=7, eos_ids=2, stop_sequences=[[3, 1]])
    out = speculative_generate(
        BIGRAM,
        TARGET,
        BIGRAM,
        TARGET,
        prompts,
        num_draft_tokens=4,
        max_new_tokens=7,
        eos_ids=2,
        stop_sequences=[[3, 1]],
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
    np.testing.assert_array_equal(out.num_accepted, out.num_drafted)


@pytest.mark.parametrize(
    "draft_sampler,k", [("sampled", 2), pytest.param("greedy", 1, marks=pytest.mark.slow)]
)
def test_sampled_output_is_distributed_as_the_target(draft_sampler, k):
    n_rows, n_new = 4000, 3
    dsampler = SAMPLER if draft_sampler == "sampled" else js.chain(select=stages.greedy())
    out = speculative_generate(
        BIGRAM,
        TARGET,
        BIGRAM,
        DRAFT,
        jnp.full((n_rows, 1), 1),
        num_draft_tokens=k,
        max_new_tokens=n_new,
        sampler=SAMPLER,
        sampler_params={"seed": jnp.arange(n_rows)},
        draft_sampler=dsampler,
        draft_sampler_params={"seed": jnp.arange(n_rows)},
    )
    assert_sequences_follow(out.tokens, bigram_sequence_probs(TARGET["logits"], 1, n_new))
    acc = np.asarray(out.num_accepted).sum() / np.asarray(out.num_drafted).sum()
    assert 0.05 < acc < 0.98  # the drafts are neither always rejected nor always accepted


def test_identical_draft_accepts_everything_and_temperature_zero_is_greedy():
    prompts = jnp.array([[0], [3]])
    same = speculative_generate(
        BIGRAM,
        TARGET,
        BIGRAM,
        TARGET,
        prompts,
        num_draft_tokens=3,
        max_new_tokens=6,
        sampler=SAMPLER,
        sampler_params={"seed": jnp.array([4, 5])},
    )
    np.testing.assert_array_equal(same.num_accepted, same.num_drafted)
    cold = speculative_generate(
        BIGRAM,
        TARGET,
        BIGRAM,
        DRAFT,
        prompts,
        num_draft_tokens=3,
        max_new_tokens=6,
        sampler=SAMPLER,
        sampler_params={"seed": jnp.array([4, 5]), "temperature": 0.0},
    )
    np.testing.assert_array_equal(cold.tokens, generate(BIGRAM, TARGET, prompts, max_new_tokens=6).tokens)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        speculative_generate(BIGRAM, TARGET, BIGRAM, DRAFT, [[1]], num_draft_tokens=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="draft"):
        speculative_generate(BIGRAM, TARGET, "draft", DRAFT, [[1]], num_draft_tokens=2, max_new_tokens=2)


@pytest.mark.parametrize(
    "role,select",
    [("sampler", stages.mirostat_v2()), ("sampler", stages.adaptive_p(0.5)),
     ("draft_sampler", stages.mirostat()), # a selector merely named like an exact one is not trusted
     ("sampler", js.Selector("greedy", lambda x, s, p, info: (jnp.argmin(x, -1), s)))],
)
def test_selectors_without_an_exact_rule_are_refused(role, select):
    chain = js.chain(select=select)
    with pytest.raises(ValueError, match=f"^{role}: speculative decoding is exact only"):
        speculative_generate(BIGRAM, TARGET, BIGRAM, DRAFT, [[1]], num_draft_tokens=2, max_new_tokens=2,
                             **{role: chain})
