"""Regex parser and byte automata: whole-string semantics against Python ``re``, UTF-8, errors."""

import collections
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from jaxsample.structured import automaton as am
from jaxsample.structured.pushdown import Pushdown
from jaxsample.structured.regex import parse_regex

PATTERNS = [
    r"[a-c]{2}\d+",
    r"(foo|ba[rz])*",
    r"^\w+@\w+\.(com|org)$",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"[^a-z]{1,3}x?",
    r"a{2,}b{0,2}",
    r"(?:ab|c)+?d",
    r"\u00e9.\x41",
    r"(?P<year>\d{4})-(?P<m>\d\d)",
    r"[\w.-]+|\s",
    r"[]a]+[^]]",
    r"(|a)(b|)c{0}",
    r"(?:x{2}){3}",
    r"[\u0400-\u04ff\U0001F600-\U0001F64F]+",
]
ALPHABET = "abcdfoxrz019_@.-+eEéA \n]Жф😀"
_DFAS = {p: am.compile_expr(parse_regex(p)) for p in PATTERNS}


_DIST: dict = {}


def _distance_to_accept(dfa: am.ByteDFA) -> np.ndarray:
    hit = _DIST.get(id(dfa))
    if hit is not None and hit[0] is dfa:
        return hit[1]
    dist = np.where(dfa.accept, 0, np.iinfo(np.int64).max // 2)
    step = dfa.delta[:, dfa.byte_class]  # [S, 256]
    while True:
        new = np.minimum(dist, dist[step].min(axis=1) + 1)
        new[0] = dist[0]
        if np.array_equal(new, dist):
            _DIST[id(dfa)] = (dfa, dist)
            return dist
        dist = new


def random_member(dfa: am.ByteDFA, rng, stop: float = 0.3, limit: int = 200) -> bytes:
    """A random accepted byte string: walk live transitions, stop in accepting states."""
    if isinstance(dfa, Pushdown):
        return _random_pushdown_member(dfa, rng, stop, limit)
    s, out = dfa.start, bytearray()
    dist = _distance_to_accept(dfa)
    for _ in range(limit):
        if dfa.accept[s] and rng.random() < stop:
            return bytes(out)
        live = np.flatnonzero(dfa.delta[s, dfa.byte_class] != 0)
        if live.size == 0:
            break
        b = int(rng.choice(live))
        out.append(b)
        s = int(dfa.delta[s, dfa.byte_class[b]])
    while not dfa.accept[s]:  # finish along a shortest path
        b = int(np.argmin(dist[dfa.delta[s, dfa.byte_class]]))
        out.append(b)
        s = int(dfa.delta[s, dfa.byte_class[b]])
    return bytes(out)


def _pushdown_distance(pd: Pushdown) -> np.ndarray:
    """Bytes needed to finish the current rule from each state (an entered rule costs its shortest string)."""
    big = np.iinfo(np.int64).max // 4
    dist = np.where(pd.accept, 0, big)
    dist[0] = big
    while True:
        frames = np.array([min(big, sum(int(dist[r]) for r in p)) for p in pd.pushes])
        shift = np.where(pd.delta != 0, dist[pd.delta], big).min(axis=1) + 1
        enter = np.where(pd.enter != 0, dist[pd.enter] + frames[pd.enter_push], big).min(axis=1) + 1
        new = np.minimum(dist, np.minimum(shift, enter))
        new[0] = big
        if np.array_equal(new, dist):
            return dist
        dist = new


def _random_pushdown_member(pd: Pushdown, rng, stop: float, limit: int) -> bytes:
    """A random string of a pushdown automaton (within its depth limit, following its key register):
    random bytes, then the cheapest completion (one byte per byte class is tried; the byte is drawn
    from the chosen class)."""
    dist = _pushdown_distance(pd)
    reps = [int(np.flatnonzero(pd.byte_class == c)[0]) for c in range(int(pd.byte_class.max()) + 1)]
    q, stack, keys, out = pd.start, [], 0, bytearray()

    def options():
        got = []
        for c, b in enumerate(reps):
            st = list(stack)
            q2, _, keys2 = pd.step_peak(q, b, st, keys)
            if (q2 and pd.viable(q2, keys2) and len(st) + pd.need[q2] <= pd.max_depth
                    and all(i + pd.need[r] <= pd.max_depth for i, r in enumerate(st))):  # fmt: skip
                got.append((c, q2, st, keys2, dist[q2] + sum(int(dist[r]) for r in st)))
        return got

    def done():
        return pd.accept[q] and all(pd.accept[r] for r in stack)

    for _ in range(limit):
        if done() and rng.random() < stop:
            return bytes(out)
        opts = options()
        if not opts:
            break
        c, q, stack, keys, _ = opts[int(rng.integers(len(opts)))]
        out.append(int(rng.choice(np.flatnonzero(pd.byte_class == c))))
    if pd.op is not None:  # the distances ignore the register: a shortest completion by search
        return bytes(out) + _key_completion(pd, reps, q, stack, keys)
    while not done():  # finish along the cheapest completion
        c, q, stack, keys, _ = min(options(), key=lambda o: o[4])
        out.append(int(rng.choice(np.flatnonzero(pd.byte_class == c))))
    return bytes(out)


def _key_completion(pd: Pushdown, reps: list, q: int, stack: list, keys: int) -> bytes:
    """A shortest completion from a configuration of an automaton with key-register ops (breadth first)."""
    todo, seen = collections.deque([(q, tuple(stack), keys, b"")]), set()
    while todo:
        q, stack, keys, out = todo.popleft()
        if pd.accept[q] and all(pd.accept[r] for r in stack):
            return out
        if (q, stack, keys) in seen:
            continue
        seen.add((q, stack, keys))
        for b in reps:
            st = list(stack)
            q2, _, keys2 = pd.step_peak(q, b, st, keys)
            if q2 and len(st) <= pd.max_depth:
                todo.append((q2, tuple(st), keys2, out + bytes([b])))
    raise AssertionError("no completion")


@pytest.mark.parametrize("pattern", PATTERNS)
@given(text=hs.text(alphabet=ALPHABET, max_size=8))
def test_dfa_equals_re_fullmatch(pattern, text):
    assert _DFAS[pattern].matches(text.encode()) == bool(re.fullmatch(pattern, text, re.ASCII))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_random_members_match_re(pattern):
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = random_member(_DFAS[pattern], rng).decode("utf-8")  # accepted strings are valid UTF-8
        assert re.fullmatch(pattern, s, re.ASCII), (pattern, s)


@given(lo=hs.integers(0, 0x10FFFF), span=hs.integers(0, 5000))
def test_utf8_sequences_encode_exactly_the_range(lo, span):
    hi = min(lo + span, 0x10FFFF)
    seqs = am.utf8_sequences(lo, hi)
    for cp in {lo, hi, (lo + hi) // 2}:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        enc = chr(cp).encode()
        assert sum(len(s) == len(enc) and all(a <= b <= c for (a, c), b in zip(s, enc)) for s in seqs) == 1
    below = chr(lo - 1).encode("utf-8", "surrogatepass") if lo > 0 else None
    if below is not None:
        assert not any(len(s) == len(below) and all(a <= b <= c for (a, c), b in zip(s, below)) for s in seqs)


def test_dot_excludes_newline_and_invalid_utf8():
    d = am.compile_expr(parse_regex("."))
    assert d.matches("é".encode()) and d.matches("😀".encode()) and not d.matches(b"\n")
    assert not d.matches(b"\xff") and not d.matches(b"\xc3") and not d.matches("\ud800".encode("utf-8", "surrogatepass"))
    assert not d.matches(b"\xc0\x80")  # overlong encodings are not UTF-8


def test_surrogates_are_never_encoded_whatever_the_front_end():
    from jaxsample.structured.gbnf import parse_gbnf

    surrogate = "\ud800".encode("utf-8", "surrogatepass")
    dfas = [am.compile_expr(parse_regex(r"\uD800|a")), am.compile_expr(am.alt(am.lit("\ud800a"), am.lit("b"))),
            am.compile_expr(parse_gbnf('root ::= . | "\\uD800"'))]
    for d in dfas:
        assert not d.matches(surrogate) and not d.matches(surrogate + b"a")
    assert dfas[0].matches(b"a") and dfas[1].matches(b"b") and dfas[2].matches("é".encode())


def test_minimal_state_counts():
    # dead + the minimal DFA's states
    assert am.compile_expr(parse_regex("(a|b)*abb")).num_states == 1 + 4
    assert am.compile_expr(parse_regex("a{3}")).num_states == 1 + 4
    assert am.compile_expr(parse_regex("(ab|ab)(c|c)")).num_states == 1 + 4


@pytest.mark.parametrize(
    "pattern, named",
    [
        ("a(?=b)", "look-around"),
        ("a(?<!b)", "look-around"),
        (r"(a)\1", "back-reference"),
        (r"\bword", "word boundary"),
        (r"\p{L}", "unicode property"),
        ("(?i)abc", "inline flags"),
        ("a^b", "'^'"),
        ("a$b", "'$'"),
        ("(ab", "missing ')'"),
        ("ab)", "unbalanced"),
        ("*a", "nothing to repeat"),
        ("a{3,2}", "max < min"),
        ("[b-a]", "bad character range"),
        ("[[:alpha:]]", "POSIX"),
    ],
)
def test_unsupported_and_malformed_patterns_raise_named_errors(pattern, named):
    with pytest.raises(am.GrammarError, match=re.escape(named)):
        parse_regex(pattern)


def test_empty_language_and_budget():
    with pytest.raises(am.EmptyLanguageError):
        am.compile_expr(parse_regex("[^\\x00-\\U0010FFFF]"))
    with pytest.raises(am.GrammarError, match="too large"):
        am.compile_expr(parse_regex("(.{100}){100}"), max_nfa_states=10_000)


def test_intersects():
    a = am.compile_expr(parse_regex("[0-9]+"))
    assert am.intersects(a, am.compile_expr(parse_regex("1[a-z]?")))
    assert not am.intersects(a, am.compile_expr(parse_regex("[a-z]+")))


@pytest.mark.parametrize("pattern", [r"[a-z]+@[a-z]+\.(com|org)", r"(\d{1,3}\.){3}\d{1,3}", r"[^\x00-\x7f]{1,3}x?", r"(ab|a)*b"])
def test_automaton_leaf_edges_and_nfa_match_the_per_state_construction(pattern):
    """``Automaton.edges`` (vectorised, computed once per leaf) lists exactly the per-state (mask, target)
    edges in state-then-target order, and a leaf reused under two continuations compiles to the same
    minimal DFA as the expression it was made from."""
    from jaxsample.structured import dfa_ops

    d = am.compile_expr(parse_regex(pattern))
    leaf = dfa_ops.Automaton(d)
    expected = []
    for s in range(1, d.num_states):
        targets = d.delta[s, d.byte_class]
        for t in np.unique(targets):
            if t:
                expected.append((s, int.from_bytes(np.packbits(targets == t, bitorder="little").tobytes(), "little"), int(t)))
    assert leaf.edges() == expected
    inline = am.compile_expr(am.alt(am.seq(parse_regex(pattern), am.lit("!")), parse_regex(pattern)))
    reused = am.compile_expr(am.alt(am.seq(leaf, am.lit("!")), leaf))
    for a, b in zip(_canonical(inline), _canonical(reused)):
        np.testing.assert_array_equal(a, b)  # minimal DFAs: equal up to numbering iff equal languages


def _canonical(d):
    """``(bytes table, accept)`` of a DFA renumbered breadth first from its start, over all 256 bytes."""
    table = d.delta[:, d.byte_class]
    order, index = [d.start], {0: 0, d.start: 1}
    for s in order:
        for t in table[s].tolist():
            if t not in index:
                index[t] = len(index)
                order.append(t)
    rows = np.array([[index[t] for t in table[s].tolist()] for s in order])
    return rows, d.accept[order]
