"""vLLM's repetition detection as a stopping rule: against a port of vLLM's ``check_sequence_repetition``
token by token, in the decoding loop (priority, min_new_tokens, per-row values, no recompiles)."""

import importlib

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample.decoding import BIGRAM, FinishReason, generate, prompt_lookup_generate
from jaxsample.decoding import _repetition


def _vllm_check(tokens, max_size, min_size, min_count):
    """vLLM's check_sequence_repetition (naive algorithm), on generated token ids."""
    min_size = max(min_size, 1)
    if max_size <= 0 or min_count < 2 or min_size > max_size:
        return False
    for size in range(min_size, max_size + 1):
        if size * min_count > len(tokens):
            return False
        if all(tokens[-n] == tokens[-(size * m + n)] for n in range(1, size + 1) for m in range(1, min_count)):
            return True
    return False


@pytest.mark.parametrize("max_size,min_size,min_count", [(3, 0, 2), (4, 2, 3), (1, 1, 4), (0, 0, 3), (2, 0, 1)])
def test_detect_matches_vllm_on_every_prefix(max_size, min_size, min_count):
    rng = np.random.default_rng(max_size * 7 + min_count)
    rows = rng.integers(0, 2, size=(48, 14)).astype(np.int32)
    rep = _repetition.params(48, dict(max_pattern_size=max_size, min_pattern_size=min_size, min_count=min_count),
                             bound=4)
    for n in range(15):
        got = np.asarray(_repetition.detect(jnp.asarray(rows), jnp.full((48,), n), rep))
        want = [_vllm_check(list(r[:n]), max_size, min_size, min_count) for r in rows]
        np.testing.assert_array_equal(got, want)


# a bigram model that loops 1 -> 2 -> 1 -> ... (and 3 -> 3 -> ...)
TABLE = jnp.log(jnp.full((5, 5), 0.01).at[1, 2].set(0.96).at[2, 1].set(0.96).at[3, 3].set(0.96).at[0, 4].set(0.96)
                .at[4, 3].set(0.96))


def test_looping_rows_stop_with_reason_repetition():
    prompts = jnp.array([[2], [3], [0]])
    spec = dict(max_pattern_size=2, min_count=3)
    out = generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=12, repetition_detection=spec)
    # row 0: 1 2 1 2 1 2 -> stops at 6 tokens; row 1: 3 3 3 -> 3 tokens; row 2: 4 3 3 3 -> 4 tokens
    assert out.lengths.tolist() == [6, 3, 4]
    assert out.finish_reason.tolist() == [FinishReason.REPETITION] * 3
    assert out.tokens[0, :6].tolist() == [1, 2, 1, 2, 1, 2]
    plain = generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=12)
    assert plain.lengths.tolist() == [12, 12, 12]


def test_priority_min_tokens_per_row_values_and_no_recompile():
    prompts = jnp.array([[2], [2], [2]])
    kw = dict(max_tokens=12, repetition_detection=dict(max_pattern_size=jnp.array([2, 0, 2]), min_count=3, bound=4))
    decode = importlib.import_module("jaxsample.decoding.loop").decode  # the jitted loop
    before = decode._cache_size()
    out = generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=jnp.array([12, 12, 6]),
                   min_new_tokens=jnp.array([8, 0, 0]), **kw)
    # row 0 may not stop before 8 tokens: the pattern is still there at 8; row 1 off; row 2: length wins
    assert out.lengths.tolist() == [8, 12, 6]
    assert out.finish_reason.tolist() == [FinishReason.REPETITION, FinishReason.LENGTH, FinishReason.LENGTH]
    kw["repetition_detection"] = dict(max_pattern_size=jnp.array([4, 1, 2]), min_pattern_size=jnp.array([2, 1, 1]),
                                      min_count=jnp.array([2, 2, 4]), bound=4)
    again = generate(BIGRAM, {"logits": TABLE}, prompts, max_new_tokens=12, **kw)
    assert again.lengths.tolist() == [4, 12, 8]
    assert decode._cache_size() - before == 1


def test_prompt_lookup_stops_inside_an_accepted_run():
    out = prompt_lookup_generate(BIGRAM, {"logits": TABLE}, jnp.array([[1, 2, 1, 2]]), num_draft_tokens=5,
                                 max_new_tokens=12, repetition_detection=dict(max_pattern_size=2, min_count=3))
    assert out.lengths.tolist() == [6] and out.finish_reason.tolist() == [FinishReason.REPETITION]


def test_invalid_specs():
    with pytest.raises(ValueError, match="unknown field"):
        _repetition.params(2, dict(max_size=2))
    with pytest.raises(ValueError, match="min_pattern_size must be <="):
        _repetition.params(2, dict(max_pattern_size=2, min_pattern_size=3, min_count=2))
    with pytest.raises(ValueError, match="min_count"):
        _repetition.params(2, dict(max_pattern_size=2, min_count=-1))
    with pytest.raises(ValueError, match="bound"):
        _repetition.params(2, dict(max_pattern_size=5, min_count=2), bound=3)
