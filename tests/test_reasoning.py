"""Reasoning budgets: the stage against ports of vLLM's ThinkingTokenBudgetLogitsProcessor and
llama.cpp's reasoning-budget sampler on random token streams, per-row budgets (traced, no
recompiles), rows independent, and in the decoding loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import BIGRAM, generate

from tests._helpers import CountingJit

V = 6
START, END, FORCED = (4,), (5, 3), (2, 5, 3)


def _ref_vllm(prompt, budget, start, end):
    """vLLM's processor: state from the prompt, update after each output token, force end ids."""
    def last(lst, seq):
        for i in range(len(lst) - len(seq), -1, -1):
            if lst[i : i + len(seq)] == list(seq):
                return i
        return -1

    s, e = last(prompt, start), last(prompt, end)
    st = dict(in_think=s > e, count=len(prompt) - (s + len(start)) if s > e else 0, in_end=False, end_count=0)
    if st["in_think"] and budget >= 0 and st["count"] >= budget:
        st.update(in_think=False, in_end=True)
    out = []

    def force():
        return end[st["end_count"]] if st["in_end"] else None

    def update():
        if out[-len(start):] == list(start):
            st.update(in_think=True, count=0)
        elif out[-len(end):] == list(end):
            st.update(in_think=False, count=0)
        elif st["in_think"]:
            st["count"] += 1
        if st["in_end"]:
            st["end_count"] += 1
            if st["end_count"] >= len(end):
                st.update(in_end=False, end_count=0)
        elif st["in_think"] and budget >= 0 and st["count"] >= budget:
            st.update(in_think=False, in_end=True, end_count=0)

    return out, force, update


def _ref_llama(prompt, budget, start, end, forced):
    """llama.cpp's common_reasoning_budget (accept/apply), initial state from the prompt."""
    def last(lst, seq):
        for i in range(len(lst) - len(seq), -1, -1):
            if lst[i : i + len(seq)] == list(seq):
                return i
        return -1

    class M:
        def __init__(self, toks):
            self.toks, self.pos = toks, 0

        def advance(self, t):
            if t == self.toks[self.pos]:
                self.pos += 1
                if self.pos >= len(self.toks):
                    self.pos = 0
                    return True
            else:
                self.pos = 1 if t == self.toks[0] else 0
            return False

    sm, em = M(start), M(end)
    thinking = last(prompt, start) > last(prompt, end)
    st = dict(state="COUNTING" if thinking else "IDLE", remaining=budget, force_pos=0)
    if st["state"] == "COUNTING" and budget == 0:
        st["state"] = "FORCING"
    out = []

    def force():
        return forced[st["force_pos"]] if st["state"] == "FORCING" else None

    def update():
        t = out[-1]
        if st["state"] in ("IDLE", "DONE"):
            if sm.advance(t):
                st.update(state="COUNTING", remaining=budget)
                em.pos = 0
                if budget == 0:
                    st.update(state="FORCING", force_pos=0)
        elif st["state"] == "COUNTING":
            if em.advance(t):
                st["state"] = "DONE"
            else:
                st["remaining"] -= 1
                if budget >= 0 and st["remaining"] <= 0:
                    st.update(state="FORCING", force_pos=0)
                    em.pos = 0
        else:
            st["force_pos"] += 1
            if st["force_pos"] >= len(forced):
                st["state"] = "DONE"

    return out, force, update


def _run(scope, prompts, budgets, steps, seed):
    stage = stages.reasoning_budget(START, END, FORCED, scope=scope)
    sampler = js.chain(stage, select=stages.greedy())
    b = len(prompts)
    p = sampler.params((b,), thinking_token_budget=jnp.asarray(budgets))
    width = max(len(x) for x in prompts)
    padded = np.full((b, width), -1, np.int32)
    for i, x in enumerate(prompts):
        padded[i, : len(x)] = x
    st = sampler.init(p, vocab_size=V, prompt=padded)
    # logits that like the start token and rarely produce the end sequence on their own
    logits = np.array(jax.random.normal(jax.random.key(seed), (steps, b, V)))
    logits[..., 4] += 0.8 * (np.arange(steps) % 5 == 0)[:, None]
    step = jax.jit(sampler.sample)
    got = []
    for t in range(steps):
        tok, _, st = step(jnp.asarray(logits[t]), st, p)
        got.append(np.asarray(tok))
    got = np.stack(got, 1)
    for i in range(b):
        ref = _ref_vllm(prompts[i], budgets[i], START, END) if scope == "vllm" else _ref_llama(
            prompts[i], budgets[i], START, END, FORCED)
        out, force, update = ref
        for t in range(steps):
            f = force()
            out.append(int(np.argmax(logits[t, i])) if f is None else f)
            update()
        assert got[i].tolist() == out, (scope, i, prompts[i], budgets[i])
    return got


PROMPTS = [[1, 4, 0], [1, 2], [4, 5, 3, 1], [0, 4], [4], [3, 3, 4, 1, 1]]


@pytest.mark.parametrize("scope", ["vllm", "llama"])
def test_matches_the_anchor_state_machines(scope):
    for seed, budgets in enumerate([[0, 1, 2, 3, -1, 2], [3, 0, 1, -1, 2, 4], [1, 1, 1, 1, 1, 1]]):
        got = _run(scope, PROMPTS, budgets, steps=24, seed=seed)
        assert np.sum(got == 3) >= 3  # the end sequences were forced (and checked) several times


def test_hand_case_vllm_forces_after_budget():
    sampler = js.chain(stages.reasoning_budget([4], [5]), select=stages.greedy())
    p = sampler.params((1,), thinking_token_budget=2)
    st = sampler.init(p, vocab_size=V, prompt=jnp.array([[1, 4]]))  # prompt opened thinking, 0 spent
    x = jnp.array([[0.0, 3.0, 1.0, 0.0, 0.0, -1.0]])
    toks = []
    for _ in range(4):
        tok, proc, st = sampler.sample(x, st, p)
        toks.append(int(tok[0]))
    assert toks == [1, 1, 5, 1]  # two thinking tokens, then </think> forced, then free again
    off = sampler.params((1,), thinking_token_budget=-1)
    st = sampler.init(off, vocab_size=V, prompt=jnp.array([[1, 4]]))
    assert [int(sampler.sample(x, st, off)[0][0]) for _ in range(3)] == [1, 1, 1]


def test_per_row_budgets_never_recompile_and_rows_are_independent():
    stage = stages.reasoning_budget(START, END, scope="vllm")
    sampler = js.chain(stage, select=stages.greedy())
    f = CountingJit(sampler.sample)
    x = jax.random.normal(jax.random.key(0), (3, V))
    outs = []
    for budgets in ([0, 1, 2], [5, -1, 0]):
        p = sampler.params((3,), thinking_token_budget=jnp.array(budgets))
        st = sampler.init(p, vocab_size=V, prompt=jnp.array([[4], [4], [4]]))
        tok, _, st = f(x, st, p)
        outs.append(np.asarray(tok))
    assert f.traces == 1
    free = np.asarray(jnp.argmax(x, axis=-1))
    assert outs[0].tolist() == [END[0], free[1], free[2]]  # budget 0 forces at once, 1 and 2 do not yet
    assert outs[1].tolist() == [free[0], free[1], END[0]]
    assert stages.reasoning_budget(START, END) == stages.reasoning_budget(list(START), list(END))


def test_in_the_decoding_loop():
    # the model wants to think forever: 4 (<think>) then 1 1 1 ...; the budget closes the block with 5 3
    table = jnp.log(jnp.full((V, V), 0.02).at[0, 4].set(0.9).at[4, 1].set(0.9).at[1, 1].set(0.9)
                    .at[3, 2].set(0.9).at[2, 2].set(0.9).at[5, 1].set(0.9))
    sampler = js.chain(stages.reasoning_budget(START, END), select=stages.greedy())
    out = generate(BIGRAM, {"logits": table}, jnp.array([[0], [0]]), max_new_tokens=8, sampler=sampler,
                   sampler_params={"thinking_token_budget": jnp.array([2, 0])})
    assert out.tokens.tolist() == [[4, 1, 1, 5, 3, 2, 2, 2], [4, 5, 3, 2, 2, 2, 2, 2]]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="scope"):
        stages.reasoning_budget([1], [2], scope="hf")
    with pytest.raises(ValueError, match="start_ids"):
        stages.reasoning_budget([], [2])
    sampler = js.chain(stages.reasoning_budget([1], [2]), select=stages.greedy())
    with pytest.raises(ValueError, match="thinking_token_budget"):
        sampler.params((1,), thinking_token_budget=-2)
