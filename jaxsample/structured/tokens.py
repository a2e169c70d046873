"""Byte DFA x vocabulary -> token-level DFA with token equivalence classes (host side, numpy).

The next state of every (DFA state, token) pair comes from :mod:`~jaxsample.structured.walk`: all
states walk the vocabulary's token trie at once, dense states (inside strings) a much smaller
quotient trie. Then:

1. tokens whose results agree in every state are merged into **classes** (exactly: results are
   grouped per token string and per quotient terminal, by hashed fingerprints checked entry by
   entry, then combined);
2. if the vocabulary spells every byte the DFA uses with a single-byte token (byte-level BPE and
   SentencePiece with byte fallback do), the token-level DFA has exactly the byte DFA's states: it
   is reachable, co-reachable and minimal because the byte DFA is. Otherwise states unreachable or
   unable to reach acceptance *with this vocabulary* are pruned, so that every allowed token keeps
   the output completable (no dead ends), and the token-level DFA is minimised;
3. identical class columns are merged again.

Class 0 is the all-dead column (special tokens, padding columns, tokens no state allows); EOS ids
form the column that loops in accepting states and is dead elsewhere.

>>> from jaxsample.structured.automaton import compile_expr, lit, alt
>>> from jaxsample.structured.vocab import Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "a", "b", "ab"], kind="raw", special_ids=[0], eos_ids=[0])
>>> g = build(compile_expr(alt(lit("ab"), lit("b"))), v)
>>> g.allowed(g.start).tolist(), int(g.forced[g.advance(g.start, 1)])
([False, True, True, True], 2)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsample.structured import trie, walk
from jaxsample.structured.automaton import ByteDFA, EmptyLanguageError
from jaxsample.structured.minimise import mix64, minimise, trim, unique_columns, unique_rows
from jaxsample.structured.vocab import Vocabulary


class PushdownTables(NamedTuple):
    """The stack part of a recursive grammar's tables (host numpy arrays; built by :mod:`~jaxsample.structured.effects`).

    Values of ``TokenGrammar.next`` from ``num_states`` on are *effects* ``effect[v - num_states]``;
    classes from the first rest class on are the remainders of tokens that return (no token has them).

    Attributes:
      effect: ``int32[E, 4 + P]`` per effect: target state (``-1``: the token returns from the
        current rule), the class the token's remaining bytes continue with in the popped state
        (``-1``: the token's own class), the number of pushed return states, the stack room the
        result needs, then the pushed states (outermost first).
      need: ``int32[S]`` stack room needed to finish the current rule from each state.
      room_mask_id: ``int32[S, R]`` bitmask of the tokens whose effect does not depend on the stack,
        per stack room ``min(limit - depth, R - 1)``.
      pop_start, pop_count: ``int32[S]``, pop_token: ``int32[T]``: per state, the tokens that return
        and go on in the caller (their validity depends on the stack):
        ``pop_token[pop_start[s]:pop_start[s] + pop_count[s]]`` (states with equal lists share one).
      bottom: the state below every stack (only EOS).
      max_depth: default stack limit.
      max_pops: the most frames one token returns from.
      effect_op: ``int32[E]`` the key-register op each effect applies (an index in ``key_ops``; 0: none).
      key_ops: ``uint32[O, 4 + 2E, W]`` the ops' ``absent``, ``present``, ``clear`` and ``add`` bits, then
        the set and clear bits of ``E`` ``either`` pairs (:class:`~jaxsample.structured.automaton.KeyOp`)
        as ``W`` words of the row's key register.
        Tokens with an op that tests the register are listed with the stack-dependent ones.
      key_need: ``uint32[S, W]`` per state, the key bits of which one at least must be clear for the
        output to stay completable (0: none); tokens ending in such a state are listed too.
    """

    effect: np.ndarray
    need: np.ndarray
    room_mask_id: np.ndarray
    pop_start: np.ndarray
    pop_count: np.ndarray
    pop_token: np.ndarray
    bottom: int
    max_depth: int
    max_pops: int
    effect_op: np.ndarray
    key_ops: np.ndarray
    key_need: np.ndarray


class TokenGrammar(NamedTuple):
    """A compiled constraint for one vocabulary (host numpy arrays).

    Attributes:
      next: ``int32[S, C]`` next state per (state, token class); state 0 is dead, class 0 is dead.
      class_of: ``int32[V]`` class of every logits column.
      accept: ``bool[S]`` accepting states (where EOS is allowed).
      forced: ``int32[S]`` the only allowed token of a state, or ``-1``.
      start: initial state (always 1).
      mask_id: ``int32[S]`` index of the state's allowed-token bitmask in ``masks``.
      masks: ``uint32[U, ceil(V/32)]`` the distinct allowed-token bitmasks (bit ``j`` of word ``i``
        is token ``32*i+j``, the XGrammar/llguidance layout); ``U`` is usually far below ``S``.
      pushdown: the stack part of a recursive grammar (``None`` for a regular one). Its rows need a
        stack: step them with :class:`~jaxsample.structured.matcher.Matcher` or on the device.
      eos_ids: the vocabulary's EOS ids (the class that loops in accepting states).
    """

    next: np.ndarray
    class_of: np.ndarray
    accept: np.ndarray
    forced: np.ndarray
    start: int
    mask_id: np.ndarray
    masks: np.ndarray
    pushdown: PushdownTables | None = None
    eos_ids: tuple = ()

    @property
    def num_states(self) -> int:
        return int(self.next.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.next.shape[1])

    def _regular(self):
        if self.pushdown is not None:
            raise ValueError("a recursive grammar's state includes a stack: use structured.Matcher")

    def allowed(self, state: int) -> np.ndarray:
        """``bool[V]``: tokens allowed in ``state`` (EOS ids only if accepting); regular grammars."""
        self._regular()
        return self.next[state][self.class_of] != 0

    def advance(self, state: int, token: int) -> int:
        """State after ``token`` (0 if the token was not allowed); regular grammars."""
        self._regular()
        return int(self.next[state, self.class_of[token]])

    def walk(self, tokens) -> int:
        """State after a token sequence from the start (0 = left the language); regular grammars."""
        s = self.start
        for t in tokens:
            s = self.advance(s, int(t))
        return s


def _group_columns(s, u, t, n_columns: int, n_states: int):
    """Classes of identical sparse columns: ``(class per column or -1 if empty, dense int32[S, C])``; exact.

    Each column is fingerprinted by two sums of 26-bit hashes of its ``(state, next)`` entries
    (``bincount`` sums are exact in float64); the grouping is then verified against the entries.
    """
    count = np.bincount(u, minlength=n_columns)
    has = count > 0
    for salt in range(8):
        with np.errstate(over="ignore"):
            h = mix64((s.astype(np.uint64) << np.uint64(32)) + t.astype(np.uint64) + np.uint64(salt * 0x9E37))
        lo = (h & np.uint64((1 << 26) - 1)).astype(np.float64)
        hi = (h >> np.uint64(38)).astype(np.float64)
        key = np.stack([np.bincount(u, lo, n_columns), np.bincount(u, hi, n_columns), count], 1)
        _, cls = unique_rows(key[has].view(np.int64))
        cls_of = np.full(n_columns, -1, np.int64)
        cls_of[has] = cls
        dense = np.zeros((n_states, int(cls.max()) + 1 if cls.size else 0), np.int32)
        col = cls_of[u]
        dense[s, col] = t
        if np.array_equal(dense[s, col], t) and np.array_equal((dense != 0).sum(axis=0)[cls_of[has]], count[has]):
            return cls_of, dense
    raise RuntimeError("token column hashing failed repeatedly")  # pragma: no cover


def _classes(w: walk.Walk, n_states: int, index: trie.VocabIndex, p: walk.Plan):
    """Token-string classes and their columns: ``(class per string or -1 if dead everywhere, int32[S, C])``.

    A string's results come from its own entries and from its quotient terminal in each quotient
    walk; its class key is the tuple of the (exact) column classes of these parts, and a class
    column is the sum of the part columns (for every state at most one part is non-zero).
    """
    n_strings = index.lengths.size
    parts = [(_group_columns(*w.fine, n_strings, n_states), None)]
    for m, entries in zip(p.modes, w.coarse):
        parts.append((_group_columns(*entries, m.quotient.num_terminals, n_states), m.quotient.string_terminal))
    keys = np.stack([cls if at is None else cls[at] for (cls, _), at in parts], axis=1)
    rep, string_class = unique_rows(keys)
    uniq = keys[rep]
    cols = np.zeros((n_states, rep.size), np.int32)
    for i, ((_, dense), _) in enumerate(parts):
        k = uniq[:, i]
        rows = slice(None) if i == 0 else np.flatnonzero(p.mode == i)  # a quotient only fills its origins
        if dense.shape[1]:
            cols[rows] += np.where(k >= 0, np.take(dense[rows], np.maximum(k, 0), axis=1), 0)
    live = ~(uniq < 0).all(axis=1)
    return np.where(live[string_class], string_class, -1), cols


def _spells_every_byte(dfa: ByteDFA, index: trie.VocabIndex) -> bool:
    """Whether every byte some state accepts is a single-byte token (token and byte DFAs coincide)."""
    used = (dfa.delta != 0).any(axis=0)[dfa.byte_class]
    return bool(np.all(index.single_byte[used]))


def build(dfa: ByteDFA, vocab: Vocabulary) -> TokenGrammar:
    """Token-level grammar of a byte DFA for a vocabulary.

    Raises:
      EmptyLanguageError: if no token sequence of this vocabulary spells an accepted string.
    """
    index = trie.vocab_index(vocab)
    n_states = dfa.num_states
    plan = walk.plan(dfa.delta, dfa.byte_class, index)
    string_class, cols = _classes(walk.walk(dfa.delta, dfa.byte_class, index, plan), n_states, index, plan)
    eos_col = np.where(dfa.accept, np.arange(n_states), 0).astype(np.int32)
    table = np.concatenate([np.zeros((n_states, 1), np.int32), eos_col[:, None], cols], axis=1)
    accept, start = dfa.accept, dfa.start
    if not _spells_every_byte(dfa, index):
        trimmed = trim(table, accept, start)
        if trimmed is None:
            raise EmptyLanguageError("no token sequence of this vocabulary spells a string the constraint accepts")
        table, accept, start = minimise(*trimmed)
    # classes reached through different parts (a quotient terminal for one string, byte-trie entries
    # for another) can still have equal columns: merge them; column 0 (dead) comes first: class 0
    first, col_class = unique_columns(table)
    nxt = np.take(table, first, axis=1).astype(np.int32)
    class_of = np.zeros(vocab.size, np.int32)
    token_class = string_class[index.string_of_token]
    class_of[index.token_ids] = col_class[np.where(token_class >= 0, token_class + 2, 0)]  # column 0: never allowed
    class_of[list(vocab.eos_ids)] = col_class[1]
    mask_id, patterns = _patterns(nxt)
    forced = _forced(patterns, class_of)[mask_id]
    return TokenGrammar(nxt, class_of, accept, forced, start, mask_id, _pack(patterns, class_of), None, tuple(vocab.eos_ids))


def _patterns(nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct allowed-class sets: ``(mask_id int32[S], patterns bool[U, C])``; pattern 0 is empty (dead state)."""
    allowed = nxt != 0
    first, mask_id = unique_rows(allowed)  # the dead state (row 0) comes first
    return mask_id.astype(np.int32), allowed[first]


def _pack(patterns: np.ndarray, class_of: np.ndarray) -> np.ndarray:
    """``uint32[U, ceil(V/32)]`` token bitmasks of class patterns (bit ``j`` of word ``i``: token ``32i+j``)."""
    v = class_of.size
    padded = np.zeros(-(-v // 32) * 32, class_of.dtype)  # padding bits: class 0, never allowed
    padded[:v] = class_of
    masks = np.take(patterns, padded, axis=1)  # (np.take: ~10x faster than fancy indexing here)
    return np.ascontiguousarray(np.packbits(masks, axis=1, bitorder="little")).view("<u4").astype(np.uint32)


def _forced(patterns: np.ndarray, class_of: np.ndarray) -> np.ndarray:
    """``int32[U]``: the single token a pattern allows, ``-1`` when it allows none or several."""
    c = patterns.shape[1]
    size = np.bincount(class_of, minlength=c)
    first = np.full(c, -1, np.int64)
    first[class_of[::-1]] = np.arange(class_of.size)[::-1]
    count = patterns.astype(np.float64) @ size.astype(np.float64)  # BLAS; exact (counts < 2**53)
    only = np.argmax(patterns, axis=1)
    return np.where(count == 1, first[only], -1).astype(np.int32)
