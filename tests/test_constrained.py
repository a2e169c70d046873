"""Constrained beam search against a plain-Python transcription of HuggingFace's algorithm
(``PhrasalConstraint``, ``DisjunctiveConstraint``, ``ConstraintListState``, the
``ConstrainedBeamSearchScorer`` process / step_sentence_constraint / finalize, transformers <= 4.55;
transformers >= 4.56 moved it to the Hub and the installed version no longer has it), plus
hand-computed cases."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import presets
from jaxsample.decoding import BIGRAM, beam_search, constrained_beam_search
from jaxsample.decoding.constraints import add, as_constraints, bank, build_tries, disjunctive, init_state, phrasal
from tests._helpers import counting_model


# ----------------------------------------------------------------------------- HF reference (Python)
class _Word:
    """HF Phrasal/DisjunctiveConstraint state: a trie walk (a phrase is a one-word trie)."""

    def __init__(self, words):
        self.words = [list(w) for w in words]
        self.seqlen = max(len(w) for w in words)
        self.seq = []

    def fresh(self):
        return _Word(self.words)

    def clone(self):
        w = _Word(self.words)
        w.seq = list(self.seq)
        return w

    def next_tokens(self):
        out = []
        for w in self.words:  # dict insertion order of the trie
            if w[: len(self.seq)] == self.seq and len(w) > len(self.seq) and w[len(self.seq)] not in out:
                out.append(w[len(self.seq)])
        return out

    def completed(self):
        return any(w == self.seq for w in self.words)

    def remaining(self):
        return 0 if self.completed() else self.seqlen - len(self.seq)


class _ListState:
    """HF ConstraintListState."""

    def __init__(self, constraints):
        self.constraints = constraints
        self.max_seqlen = max(c.seqlen for c in constraints)
        self.complete, self.inprogress, self.pending = [], None, [c.fresh() for c in constraints]
        self.completed = False

    def clone(self):
        s = _ListState(self.constraints)
        s.complete = [c.clone() for c in self.complete]
        if self.inprogress is not None:  # HF's copy(stateful=True) shares the word list (aliasing kept)
            s.inprogress = _Word(self.inprogress.words)
            s.inprogress.seq = self.inprogress.seq
        s.pending = [c.fresh() for c in self.pending]
        s.completed = self.completed
        return s

    def bank(self):
        add = 0 if self.inprogress is None else self.max_seqlen - self.inprogress.remaining()
        return len(self.complete) * self.max_seqlen + add

    def advance(self):
        if self.inprogress is not None:
            return self.inprogress.next_tokens()
        return [t for c in self.pending for t in c.next_tokens()]

    def add(self, tok):
        if self.completed:
            return
        if self.inprogress is not None:
            c = self.inprogress
            if tok in c.next_tokens():
                c.seq.append(tok)
                if c.completed():
                    self.complete.append(c)
                    self.inprogress = None
                    if not self.pending:
                        self.completed = True
            else:
                c.seq = []  # HF reset() rebinds the list; the shared one is untouched
                self.pending.append(c.fresh())
                self.inprogress = None
            return
        for i, c in enumerate(self.pending):
            if tok in c.next_tokens():
                c.seq.append(tok)
                if c.completed():
                    self.complete.append(c)
                else:
                    self.inprogress = c
                self.pending = self.pending[:i] + self.pending[i + 1 :]
                if not self.pending and self.inprogress is None:
                    self.completed = True
                break

    @classmethod
    def of(cls, constraints, seq):
        s = cls(constraints)
        for t in seq:
            s.add(t)
            if s.completed:
                break
        return s


def _hf_constrained(logp_fn, prompt, k, words, max_new, eos, alpha=1.0, early_stopping=False, r=1):
    """One prompt; returns the best r hypotheses as (generated tokens, score)."""
    cons = [_Word(w if isinstance(w[0], list) else [w]) for w in words]  # HF force_words_ids format
    f32 = np.float32
    seqs = [list(prompt) for _ in range(k)]
    scores = np.array([0.0] + [-1e9] * (k - 1), f32)
    hyps = []  # (score, generated)

    def add_hyp(score, gen_tokens):
        hyps.append((f32(score) / f32(len(gen_tokens)) ** f32(alpha), gen_tokens))
        hyps.sort(key=lambda h: -h[0])
        del hyps[k:]

    p = len(prompt)
    for t in range(max_new):
        acc = np.stack([logp_fn(s).astype(f32) + scores[i] for i, s in enumerate(seqs)])  # [K, V]
        v = acc.shape[1]
        flat = acc.reshape(-1)
        order = np.argsort(-flat, kind="stable")[: max(2, 1 + len(eos)) * k]
        top = []
        for rank, ix in enumerate(order):
            b, tok = divmod(int(ix), v)
            if tok in eos:
                if rank < k and _ListState.of(cons, seqs[b]).completed:
                    add_hyp(flat[ix], seqs[b][p:] + [tok])
            else:
                top.append((flat[ix], tok, b))
            if len(top) == k:
                break
        cands = [(sc, tok, b, _ListState.of(cons, seqs[b] + [tok])) for sc, tok, b in top]
        seen = [seqs[b] + [tok] for _, tok, b in top]
        for b in range(k):
            st = _ListState.of(cons, seqs[b])
            if st.completed:
                continue
            for tok in st.advance():
                new = st.clone()
                new.add(tok)
                if seqs[b] + [tok] not in seen:
                    seen.append(seqs[b] + [tok])
                    cands.append((acc[b, tok], tok, b, new))
        zipped = np.array([f32(c[3].bank()) * f32(100) + f32(c[0]) for c in cands], f32)
        srt = np.argsort(-zipped, kind="stable")
        banks = [cands[i][3].bank() for i in srt]
        inc, counter, cur = [], -1, banks[0]
        for bk in banks:
            counter = counter + 1 if bk == cur else 0
            cur = bk
            inc.append(counter)
        chosen = [cands[srt[i]] for i in np.argsort(inc, kind="stable")[:k]]
        best = flat[order[0]]
        gen = t + 1
        done = False
        if len(hyps) >= k:
            if early_stopping is True:
                done = True
            else:
                length = max_new if (early_stopping == "never" and alpha > 0) else gen
                done = min(h[0] for h in hyps) >= f32(best) / f32(length) ** f32(alpha)
        seqs = [seqs[b] + [tok] for _, tok, b, _ in chosen]
        scores = np.array([c[0] for c in chosen], f32)
        if done:
            break
        if gen == max_new:
            ok = [i for i in range(k) if _ListState.of(cons, seqs[i]).completed]
            for i in ok:
                add_hyp(scores[i], seqs[i][p:])
            if len(ok) < r:
                for i in range(k):
                    if i not in ok:
                        add_hyp(scores[i], seqs[i][p:])
    return [(h[1], float(h[0])) for h in hyps[:r]]


# ------------------------------------------------------------------------------------------- tests
def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _bigram(v, seed):
    return np.asarray(np.random.default_rng(seed).standard_normal((v, v)) * 1.5, np.float32)


def _check(table, prompt, k, words, max_new, eos, **kw):
    ref = _hf_constrained(lambda s: _log_softmax(table[s[-1]]), prompt, k, words, max_new, eos,
                          alpha=kw.get("length_penalty", 1.0), early_stopping=kw.get("early_stopping", False),
                          r=kw.get("num_return_sequences", 1))
    out = constrained_beam_search(BIGRAM, {"logits": jnp.asarray(table)}, [prompt], num_beams=k,
                                  force_words_ids=words, max_new_tokens=max_new, eos_ids=list(eos), **kw)
    for j, (toks, score) in enumerate(ref):
        n = int(out.lengths[0, j])
        assert np.asarray(out.tokens[0, j, :n]).tolist() == toks, (j, ref)
        np.testing.assert_allclose(float(out.scores[0, j]), score, rtol=1e-5)
    return ref


@pytest.mark.parametrize("seed", range(6))
def test_matches_hf_transcription_phrasal_and_disjunctive(seed):
    table = _bigram(12, seed)
    words = [[3, 4], [[5, 6], [7, 8, 9], [5, 10]]]
    _check(table, [1], 4, words, 7, [0], num_return_sequences=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_matches_hf_transcription_options(seed):
    table = _bigram(10, 100 + seed)
    _check(table, [2, 3], 3, [[4, 5, 6], [7]], 6, [0, 1], length_penalty=0.5, early_stopping=True)
    _check(table, [2], 3, [[4, 5], [4, 6]], 5, [0], early_stopping="never", length_penalty=2.0)
    _check(table, [7, 2], 2, [[[7], [5, 6]]], 4, [0], length_penalty=0.0)  # the prompt's 7 fulfils it


# HF's documented example (t5, "How old are you?" with force_words_ids=["Sie"] -> "Wie alt sind Sie?")
# on a bigram "German": 0 EOS, 1 wie, 2 alt, 3 bist, 4 du, 5 sind, 6 Sie, 7 ?, 8 <s>
_GERMAN = np.full((9, 9), 1e-4)
for a, nxt in {8: {1: 1.0}, 1: {2: 1.0}, 2: {3: 0.6, 5: 0.4}, 3: {4: 0.9, 6: 0.05}, 4: {7: 1.0}, 5: {6: 0.9, 4: 0.1},
               6: {7: 1.0}, 7: {0: 1.0}, 0: {0: 1.0}}.items():
    for b, p in nxt.items():
        _GERMAN[a, b] = p
_GERMAN = {"logits": jnp.asarray(np.log(_GERMAN / _GERMAN.sum(1, keepdims=True)), jnp.float32)}


def test_documented_example_forced_word():
    plain = beam_search(BIGRAM, _GERMAN, [[8]], num_beams=3, max_new_tokens=7, eos_ids=0)
    assert np.asarray(plain.tokens[0, 0, : int(plain.lengths[0, 0])]).tolist() == [1, 2, 3, 4, 7, 0]  # wie alt bist du?
    out = constrained_beam_search(BIGRAM, _GERMAN, [[8]], num_beams=3, force_words_ids=[[6]], max_new_tokens=7,
                                  eos_ids=0)
    assert np.asarray(out.tokens[0, 0, : int(out.lengths[0, 0])]).tolist() == [1, 2, 5, 6, 7, 0]  # wie alt sind Sie?
    assert float(out.scores[0, 0]) < float(plain.scores[0, 0])
    # disjunctive: "du" or "Sie", the free choice wins; a phrase "sind du" forces the unlikely bigram
    out = constrained_beam_search(BIGRAM, _GERMAN, [[8]], num_beams=3, force_words_ids=[[[4], [6]]], max_new_tokens=7,
                                  eos_ids=0)
    assert np.asarray(out.tokens[0, 0, : int(out.lengths[0, 0])]).tolist() == [1, 2, 3, 4, 7, 0]
    out = constrained_beam_search(BIGRAM, _GERMAN, [[8]], num_beams=3, force_words_ids=[[5, 4]], max_new_tokens=7,
                                  eos_ids=0, stop_sequences=[[4, 7]])
    toks = np.asarray(out.tokens[0, 0, : int(out.lengths[0, 0])]).tolist()
    assert toks == [1, 2, 5, 4, 7] and int(out.finish_reason[0, 0]) == 2  # ended by the stop sequence


def test_state_machine_quirks_by_hand():
    tb = build_tries(as_constraints(force_words_ids=[[1, 2, 3], [[4], [5, 6]]]))  # max_seqlen 3
    add_, bank_ = jax.jit(functools.partial(add, tb)), jax.jit(functools.partial(bank, tb))
    st = init_state(tb, ())
    got = []
    for tok in [1, 2, 1, 2, 3, 5, 6]:
        st = add_(st, jnp.asarray(tok))
        got.append((np.asarray(st.status).tolist(), int(bank_(st))))
    assert got == [
        ([1, 0], 1),  # phrase 1/3: bank = 3 - remaining(2)
        ([1, 0], 2),  # 2/3
        ([0, 0], 0),  # "1" breaks the phrase; the phrase goes to the back, "1" is not retried
        ([0, 0], 0),  # "2" advances nothing
        ([0, 0], 0),
        ([0, 1], 2),  # disjunctive: 5 of [5, 6], remaining = seqlen 2 - 1 -> bank 3 - 1
        ([0, 2], 3),  # complete: 1 * 3
    ]


def test_pending_order_after_reset_decides_which_constraint_a_token_advances():
    tb = build_tries(as_constraints(force_words_ids=[[1, 2], [1, 3]]))
    add_ = jax.jit(functools.partial(add, tb))
    st = add_(init_state(tb, ()), jnp.asarray(1))
    assert np.asarray(st.status).tolist() == [1, 0]  # the first pending one
    st = add_(st, jnp.asarray(9))  # breaks it: [1, 2] moves behind [1, 3]
    st = add_(st, jnp.asarray(1))
    assert np.asarray(st.status).tolist() == [0, 1]


def test_constraint_validation():
    assert as_constraints(force_words_ids=[[1, 2], [[3], [4, 5]]]) == (phrasal([1, 2]), disjunctive([[3], [4, 5]]))
    for bad in ([[]], [[-1]], [["a"]], [[[1], [1, 2]]], [[[]]]):
        with pytest.raises(ValueError):
            as_constraints(force_words_ids=bad)
    with pytest.raises(ValueError, match="at least one constraint"):
        constrained_beam_search(BIGRAM, {"logits": jnp.zeros((4, 4))}, [[1]], num_beams=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="num_beams"):
        constrained_beam_search(BIGRAM, {"logits": jnp.zeros((4, 4))}, [[1]], num_beams=1, max_new_tokens=2,
                                force_words_ids=[[1]])


def test_preset_wiring():
    p = presets.hf(force_words_ids=[[3, 4]], constraints=[[[5], [6]]])
    assert p.strategy == {"constraints": (disjunctive([[5], [6]]), phrasal([3, 4]))}  # HF: constraints first
    with pytest.raises(ValueError, match="sampling"):
        presets.hf(do_sample=True, force_words_ids=[[3]])
    with pytest.raises(ValueError, match="strategy"):
        presets.stack([p, presets.hf()])
    assert presets.stack([p, p]).strategy == p.strategy


def test_new_values_never_recompile_and_batch_rows_are_independent():
    table = _bigram(12, 5)
    model, traces = counting_model(BIGRAM)
    counts, outs = [], []
    for lp, max_new, eos in [(1.0, [6, 3], [0, 1]), (0.2, [2, 6], [1, -1]), (2.0, [6, 6], [0, 0])]:
        out = constrained_beam_search(model, {"logits": jnp.asarray(table)}, [[1], [2]], num_beams=3,
                                      force_words_ids=[[4, 5]], max_new_tokens=jnp.array(max_new), max_tokens=6,
                                      length_penalty=jnp.array([lp, lp]), eos_ids=jnp.array(eos)[:, None])
        jax.block_until_ready(out)
        counts.append(len(traces))
        outs.append(out)
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]
    one = constrained_beam_search(BIGRAM, {"logits": jnp.asarray(table)}, [[2]], num_beams=3,
                                  force_words_ids=[[4, 5]], max_new_tokens=3, max_tokens=6, eos_ids=1)
    np.testing.assert_array_equal(outs[0].tokens[1], one.tokens[0])


def test_matches_hf_transcription_on_a_transformer():
    """Logits depend on the whole history, so cache rows must follow every proposal's parent beam."""
    from jaxsample.decoding import TinyDecoder

    net = TinyDecoder(vocab_size=11, d_model=16, num_layers=2, num_heads=2)
    params = jax.jit(net.init_params)(jax.random.key(8), scale=2.0)
    width = 10
    apply = jax.jit(net.apply_step)

    def logp(seq):
        padded = np.zeros((1, width), np.int32)
        padded[0, : len(seq)] = seq
        pos = np.where(np.arange(width) < len(seq), np.arange(width), -1)[None]
        o = apply(params, jnp.asarray(padded), jnp.asarray(pos), net.init_cache(1, width))
        return _log_softmax(np.asarray(o.logits[0, len(seq) - 1], np.float64)).astype(np.float32)

    words = [[3, 4], [[5, 6], [7, 8]]]
    out = constrained_beam_search(net.model, params, [[1, 2], [9, -1]], num_beams=3, force_words_ids=words,
                                  max_new_tokens=6, eos_ids=0, num_return_sequences=2)
    for b, prompt in enumerate([[1, 2], [9]]):
        ref = _hf_constrained(logp, prompt, 3, words, 6, [0], r=2)
        for j, (toks, score) in enumerate(ref):
            assert np.asarray(out.tokens[b, j, : int(out.lengths[b, j])]).tolist() == toks
            np.testing.assert_allclose(float(out.scores[b, j]), score, rtol=1e-4)


def test_proposals_share_the_word_list_as_hf():
    """HF's DisjunctiveConstraint.copy(stateful=True) aliases the word list: after "5", proposals 6 and
    10 are tried from [5] and then from [5, 6], so the second one resets (bank 0 instead of 3)."""
    from jaxsample.decoding.constraints import proposal_states

    tb = build_tries(as_constraints(force_words_ids=[[[5, 6], [7, 8, 9], [5, 10]]]))
    st = jax.jit(functools.partial(add, tb))(init_state(tb, ()), jnp.asarray(5))
    props = jax.jit(functools.partial(proposal_states, tb))(st, jnp.asarray(tb.token))
    banks = np.asarray(jax.jit(functools.partial(bank, tb))(props))
    by_token = {(p, t): int(bk) for p, t, bk in zip(tb.parent, tb.token, banks)}
    node5 = tb.child[tb.token.index(5)]
    assert by_token[(node5, 6)] == 3 and by_token[(node5, 10)] == 0
