"""Triggered (lazy) grammars: free text until a trigger, the grammar from the trigger's first byte on
(llama.cpp ``grammar_lazy`` / ``grammar_triggers``), matched on the device, including triggers that end
inside a token, are wholly inside one, or are token ids; priorities; masked dead continuations."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import presets, stages
from jaxsample import structured as st
from jaxsample.decoding import BIGRAM, generate, lookup, stop_strings
from jaxsample.structured import triggers as tr

PIECES = ["<eos>", "<|tool|>", "hi", " ", "<", "to", "ol>", "ol>{", "{", "}", "a", "b", "ol>z", "<tool>",
          "x<tool>{a", "<t", "ool>", "z", "q", "hi <to"]
TOK = {p: i for i, p in enumerate(PIECES)}
VOCAB = st.Vocabulary.from_pieces(PIECES, kind="raw", special_ids=[0, 1], eos_ids=[0])
V = len(PIECES)
CALL = r"<tool>\{(a|b){1,3}\}"
GREEDY = js.chain(stages.lazy_grammar(), select=stages.greedy())


def _text(tokens) -> str:
    return "".join((VOCAB.token_bytes[t] or b"").decode() for t in tokens)


def _run(grammars, triggers, forced, steps, seed=0, sampler=GREEDY, **kw):
    """Greedy steps on random logits, the first tokens forced by a large logit; returns tokens, the
    processed logits of every step, and the states."""
    rows = st.trigger_params(grammars, triggers, VOCAB, **kw)
    params = sampler.params((len(grammars),), seed=jnp.arange(len(grammars)), **rows)
    state = sampler.init(params, vocab_size=V, history_size=64)
    step = jax.jit(sampler.sample)
    rng = np.random.default_rng(seed)
    toks, procs, states = [], [], []
    for t in range(steps):
        logits = rng.standard_normal((len(grammars), V)).astype(np.float32)
        logits[:, 0] -= 3.0  # EOS only when nothing else is allowed, mostly
        for r, seq in enumerate(forced):
            if t < len(seq):
                logits[r, seq[t]] += 100.0
        tok, proc, state = step(jnp.asarray(logits), state, params)
        toks.append(np.asarray(tok))
        procs.append((logits, np.asarray(proc)))
        states.append(state)
    return np.stack(toks, 1), procs, states, params


def test_free_text_then_grammar_from_a_trigger_ending_inside_a_token():
    g = st.compile_regex(CALL, VOCAB)
    forced = [[TOK["hi"], TOK[" "], TOK["<"], TOK["to"], TOK["ol>{"]],  # "<tool>" ends after 3 bytes of "ol>{"
              [TOK["hi"], TOK["x<tool>{a"]],  # wholly inside a token, with "{a" after it
              [TOK["q"], TOK["hi"], TOK["z"]],  # free text (random tokens afterwards may trigger it)
              [TOK["<tool>"]]]  # not lazy (None): the grammar from the first token
    toks, procs, states, _ = _run([g, g, g, g], [["<tool>"], ["<tool>"], ["<tool>"], None], forced, 12)
    armed = np.stack([np.asarray(s.stages[0].armed) for s in states], 1)
    assert armed[0].tolist()[:6] == [False] * 4 + [True] * 2 and armed[1].tolist()[:3] == [False, True, True]
    assert not armed[2, :3].any() and armed[3].all()
    for r in (0, 1, 3):
        text = _text(toks[r][toks[r] != 0])
        call = text[text.index("<tool>"):]
        assert re.fullmatch(CALL, call), text  # the grammar took over from the trigger's first byte
        assert toks[r][-1] == 0  # and ended it
    assert _text(toks[0][:5]) == "hi <tool>{" and _text(toks[1][:2]) == "hix<tool>{a"
    # free text passes unmasked (but for tokens that would complete the trigger into a dead state)
    for t in range(3):
        raw, proc = procs[t]
        np.testing.assert_array_equal(proc[2], raw[2])
    raw, proc = procs[3]  # row 0 after "hi <": "to" is fine
    np.testing.assert_array_equal(proc[0], raw[0])
    raw, proc = procs[4]  # row 0 after "hi <to": "ol>z" would start the grammar on "<tool>z": masked
    dead = np.isneginf(proc[0])
    assert dead.tolist() == [i == TOK["ol>z"] for i in range(V)]


def test_trigger_order_decides_where_the_grammar_starts():
    brace = st.compile_regex(r"\{(a|b)+\}", VOCAB)
    tool = st.compile_regex(CALL, VOCAB)
    forced = [[TOK["hi"], TOK[" "], TOK["<"], TOK["to"], TOK["ol>{"]]] * 2
    # same text, "<tool>{" completed by "ol>{": the first listed trigger wins (llama.cpp checks them in order)
    toks, procs, states, _ = _run([brace, tool], [["{", "<tool>"], ["<tool>", "{"]], forced, 10)
    assert [bool(states[4].stages[0].armed[r]) for r in (0, 1)] == [True, True]
    assert re.fullmatch(r"\{(a|b)+\}", _text(toks[0][4:][toks[0][4:] != 0])[3:])  # grammar fed "{" only
    assert re.fullmatch(CALL, "<tool>{" + _text(toks[1][5:][toks[1][5:] != 0]))
    # swap the grammars: now the winning trigger's text is no valid start, so "ol>{" is masked there
    toks, procs, states, _ = _run([tool, brace], [["{", "<tool>"], ["<tool>", "{"]], forced, 6)
    raw, proc = procs[4]
    assert np.isneginf(proc[0, TOK["ol>{"]]) and np.isneginf(proc[1, TOK["ol>{"]])
    assert not np.isneginf(proc[0, TOK["ol>"]])  # "<tool>" alone: a valid start for row 0's grammar


def test_token_triggers_patterns_and_anchored_full_patterns():
    tool = st.compile_regex(CALL, VOCAB)
    body = st.compile_regex(r"(a|b)+", VOCAB)
    forced = [[TOK["hi"], TOK["<|tool|>"]],  # a special token: the grammar starts empty after it
              [TOK["q"], TOK["<tool>"]],  # a text token trigger: the grammar is fed its bytes
              [TOK["hi"], TOK[" "], TOK["<"], TOK["to"], TOK["ol>{"], TOK["<t"], TOK["ool>"]],
              [TOK["<t"], TOK["ool>"]]]
    full = {"type": 3, "value": r"[\s\S]*?(<tool>)"}  # must end where the text ends: not after "ol>{"
    triggers = [[{"type": "token", "token": TOK["<|tool|>"]}], [TOK["<tool>"]], [full], [{"type": 2, "value": "<t(?:o|x)ol>"}]]
    toks, _, states, params = _run([body, tool, tool, tool], triggers, forced, 14)
    armed = np.stack([np.asarray(s.stages[0].armed) for s in states], 1)
    assert armed[0, 1] and not armed[0, 0] and armed[1, 1] and not armed[1, 0]
    assert not armed[2, :6].any() and armed[2, 6]  # "ol>{" did not end the text with "<tool>"; "ool>" did
    assert armed[3, 1]
    assert re.fullmatch(r"(a|b)+", _text(toks[0][2:][toks[0][2:] != 0]))
    for r, start in ((1, 1), (2, 5), (3, 0)):
        text = _text(toks[r][start:][toks[r][start:] != 0])
        assert re.fullmatch(CALL, text), (r, text)
    # forced tokens are reported only once a row constrains
    free = js.chain(stages.lazy_grammar(), select=stages.greedy())
    state = free.init(params, vocab_size=V, history_size=64)
    assert np.asarray(st.forced_tokens(free, state, params)).tolist() == [-1] * 4
    assert np.asarray(st.forced_tokens(free, states[1], params))[1] == TOK["{"]  # after "q<tool>": "{" only
    assert not np.asarray(st.is_dead(free, states[-1], params)).any()


def test_generate_with_lazy_rows_jump_forward_and_no_recompile():
    table = {"logits": jnp.asarray(np.random.default_rng(7).standard_normal((V, V)).astype(np.float32))}
    tool = st.compile_regex(CALL, VOCAB)
    sampler = js.chain(stages.lazy_grammar(), stages.temperature(1.0), select=stages.categorical())
    prompt = np.array([[TOK["hi"]]] * 4)
    kw = dict(max_new_tokens=40, eos_ids=0, pad_id=-1, sampler=sampler)
    sizes = dict(num_slots=4, num_candidates=64)
    sp = {"seed": np.arange(4) + 100, **st.trigger_params([tool, tool, None, tool], [["<tool>"], ["<tool>", "<t"], None, None],
                                                           VOCAB, **sizes)}
    ref = generate(BIGRAM, table, prompt, sampler_params=sp, **kw)
    out = generate(BIGRAM, table, prompt, sampler_params=sp, jump_forward=4, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    toks = np.asarray(ref.tokens)
    triggered = 0
    for r, word in ((0, "<tool>"), (1, "<t")):  # row 1 also triggers on "<t", a prefix of "<tool>"
        text = _text(toks[r][toks[r] > 0])
        if word in text:
            triggered += 1
            assert re.fullmatch(CALL, text[text.index(word):]), text
    assert triggered >= 1
    assert re.fullmatch(CALL, _text(toks[3][toks[3] > 0]))  # not lazy
    before = lookup._decode_jit._cache_size()
    sp2 = {"seed": np.arange(4), **st.trigger_params([tool, None, tool, tool], [["x<tool>"], None, ["<to"], ["}"]],
                                                     VOCAB, **sizes)}
    again = generate(BIGRAM, table, prompt, sampler_params=sp2, jump_forward=4, **kw)
    assert lookup._decode_jit._cache_size() == before  # new triggers, same buckets: no recompile
    np.testing.assert_array_equal(again.tokens, generate(BIGRAM, table, prompt, sampler_params=sp2, **kw).tokens)


def test_pending_matches_brute_force():
    rng = np.random.default_rng(3)
    pieces = ["", "a", "b", "ab", "ba", "aab", "bba", "abab", "b"]
    tb = [p.encode() or None for p in pieces]
    strings = ["abab", "ba", "aabba"]
    table = stop_strings.build(tb, [strings])
    order = sorted(strings)
    windows = rng.integers(0, len(pieces), size=(200, 12))
    windows[np.arange(12)[None] < rng.integers(0, 12, size=(200, 1))] = -1  # -1 only before the first token
    pend = np.asarray(stop_strings.pending(jnp.asarray(windows), table._replace(target=table.target[0])))
    for w, p in zip(windows, pend):
        text = "".join(pieces[t] for t in w if t >= 0)
        for s, word in enumerate(order):
            for m in range(1, len(word)):
                assert p[s, m - 1] == text.endswith(word[: len(word) - m]), (text, word, m)
            assert not p[s, len(word) - 1:].any()


def test_expansion_and_parsing():
    assert tr.expand(tr.parse("<tool_call>")) == [("<tool_call>", 0, False)]
    assert tr.expand(tr.parse({"type": 2, "value": r"\{\s?\"n"}))[:2] == [('{\t"n', 0, False), ('{\n"n', 0, False)]
    assert tr.expand(tr.parse({"type": "pattern", "value": r"(?:ab|c)d{1,2}"})) == [
        ("abdd", 0, False), ("abd", 0, False), ("cdd", 0, False), ("cd", 0, False)]
    full = tr.expand(tr.parse({"type": 3, "value": r"^[\s\S]*?x(<(tool|fn)>)[\s\S]*$"}))
    assert full == [("x<tool>", 1, False), ("x<fn>", 1, False)]  # the grammar starts at the first group
    assert tr.expand(tr.parse({"type": 3, "value": r"[\s\S]*?(<a>)"})) == [("<a>", 0, True)]
    assert tr.parse(7) == tr.Trigger("token", 7) and tr.parse({"type": 0, "token": 3}) == tr.Trigger("token", 3)
    for bad, match in [({"type": 2, "value": r"<a>\s*"}, "unbounded"), ({"type": 3, "value": r"^<a>"}, "start with"),
                       ({"type": 3, "value": r"[\s\S]*?<a>"}, "capturing group"), ({"type": 2, "value": "(?=a)b"}, "not supported"),
                       ({"type": 2, "value": "[a-z]{4}"}, "more than"), ({"type": 2, "value": "a?"}, "empty"),
                       ({"type": 9, "value": "x"}, "type"), ("", "non-empty"), (-1, "token id"), (2.5, "grammar trigger"),
                       ({"type": 2, "value": "a^b"}, "anchors"), ({"type": 2, "value": "(a"}, "invalid")]:
        with pytest.raises(ValueError, match=match):
            tr.expand(tr.parse(bad))


def test_invalid_uses_and_the_llama_cpp_preset():
    tool = st.compile_regex(CALL, VOCAB)
    with pytest.raises(ValueError, match="one per row"):
        st.trigger_params([tool, tool], [["<tool>"]], VOCAB)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        st.trigger_params([tool], [[99]], VOCAB)
    with pytest.raises(ValueError, match="1 to 512 triggers"):
        st.trigger_params([tool], [[]], VOCAB)
    with pytest.raises(ValueError, match="max_trigger_bytes"):
        st.trigger_params([tool], [["x" * 40]], VOCAB)
    rows = st.trigger_params([tool], [["<tool>", "<t", "to", "ol>", "x"]], VOCAB)  # 5 slots: bucket 8
    small = js.chain(stages.lazy_grammar(max_triggers=4), select=stages.greedy())
    with pytest.raises(ValueError, match="max_triggers|capacity|at most"):
        small.init(small.params((1,), **rows), vocab_size=V)
    p = presets.llama_cpp(grammar='root ::= "<tool>{" [ab]+ "}"', grammar_lazy=True, vocabulary=VOCAB,
                          grammar_triggers=["<tool>", {"type": 0, "token": TOK["<|tool|>"]}])
    assert p.sampler.stages[0] == stages.lazy_grammar(max_triggers=4)
    assert presets.llama_cpp(grammar='root ::= "a"', grammar_triggers=["<tool>"], vocabulary=VOCAB).sampler.stages[0] \
        == stages.grammar()  # triggers without grammar_lazy are ignored, as in llama.cpp
    with pytest.raises(ValueError, match="grammar_triggers"):
        presets.llama_cpp(grammar='root ::= "a"', grammar_lazy=True, vocabulary=VOCAB)
    with pytest.raises(ValueError, match="needs a grammar"):
        presets.llama_cpp(grammar_lazy=True, grammar_triggers=["x"], vocabulary=VOCAB)


def test_trigger_starts_a_recursive_grammar_with_its_stack():
    """A recursive GBNF grammar (nested braces: a pushdown automaton) under a trigger: the dead
    continuation is found with the stack-aware host matcher, the stack state rides in the lazy state."""
    pieces = ["<eos>", "hi", " ", "<", "t", "o", "l", ">", "{", "}", "to", "ol>{", "ol>}", "<tool>", "{{", "}}"]
    tok = {p: i for i, p in enumerate(pieces)}
    vocab = st.Vocabulary.from_pieces(pieces, kind="raw", special_ids=[0], eos_ids=[0])
    g = st.compile_gbnf('root ::= "<tool>" obj\nobj ::= "{" obj* "}"', vocab)
    assert g.pushdown is not None
    rows = st.trigger_params([g, g], [["<tool>"], None], vocab)
    params = GREEDY.params((2,), seed=jnp.arange(2), **rows)
    state = GREEDY.init(params, vocab_size=len(pieces), history_size=64)
    step = jax.jit(GREEDY.sample)
    rng = np.random.default_rng(1)
    forced = [[tok["hi"], tok[" "], tok["<"], tok["to"], tok["ol>{"], tok["{{"], tok["{{"]], [tok["<tool>"], tok["{{"]]]
    toks, depth = [], []
    for t in range(24):
        logits = rng.standard_normal((2, len(pieces))).astype(np.float32)
        logits[:, 0] -= 1.0
        for r, seq in enumerate(forced):
            if t < len(seq):
                logits[r, seq[t]] += 100.0
        tok_, proc, state = step(jnp.asarray(logits), state, params)
        if t == 4:  # after "hi <to": "ol>}" would start the grammar on "<tool>}" (dead): masked
            assert np.isneginf(np.asarray(proc)[0]).tolist() == [i == tok["ol>}"] for i in range(len(pieces))]
        toks.append(np.asarray(tok_))
        depth.append(np.asarray(state.stages[0].grammar.depth))
    assert np.max(np.stack(depth)) >= 3  # "{{{{" nested: frames on the row's stack
    for r in range(2):
        text = "".join(pieces[t] for t in np.stack(toks, 1)[r] if t != 0)
        call = text[text.index("<tool>") + len("<tool>"):]
        level = np.cumsum([1 if c == "{" else -1 for c in call])
        assert set(call) <= set("{}") and level.min() >= 0 and (level[:-1] > 0).all(), text
        if 0 in np.stack(toks, 1)[r]:
            assert level[-1] == 0, text  # ended at EOS only when balanced
