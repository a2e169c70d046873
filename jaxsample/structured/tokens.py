"""Byte DFA x vocabulary -> token-level DFA with token equivalence classes (host side, numpy).

For every DFA state and every token the next state is computed by walking the token's bytes. Tokens
are first reduced to strings of the DFA's *byte classes* (deduplicated) and arranged in a trie, and
the walk runs level by level over the trie, vectorised over (state, trie node); states whose every
prefix died are dropped, so structural states (after ``{``, ``:`` ...) cost about one level. Then:

1. columns (one per token) that agree in every state are merged into **classes**;
2. states unreachable from the start or that cannot reach acceptance *with this vocabulary* are
   pruned, so every allowed token keeps the output completable (no dead ends);
3. the token-level DFA is minimised and the classes recomputed.

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

from jaxsample.structured.automaton import ByteDFA, EmptyLanguageError, minimise, trim
from jaxsample.structured.vocab import Vocabulary

#: Upper bound on (state, trie node) entries per walk level (memory of the vectorised walk).
_PAIR_CHUNK = 1 << 22


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
    """

    next: np.ndarray
    class_of: np.ndarray
    accept: np.ndarray
    forced: np.ndarray
    start: int
    mask_id: np.ndarray
    masks: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.next.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.next.shape[1])

    def allowed(self, state: int) -> np.ndarray:
        """``bool[V]``: tokens allowed in ``state`` (EOS ids only if accepting)."""
        return self.next[state][self.class_of] != 0

    def advance(self, state: int, token: int) -> int:
        """State after ``token`` (0 if the token was not allowed)."""
        return int(self.next[state, self.class_of[token]])

    def walk(self, tokens) -> int:
        """State after a token sequence from the start (0 = left the language)."""
        s = self.start
        for t in tokens:
            s = self.advance(s, int(t))
        return s


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _class_strings(dfa: ByteDFA, vocab: Vocabulary):
    """Unique byte-class strings of the text tokens: ``(ids, inverse [T], strings [U, L], lengths [U])``."""
    ids = np.array([i for i, b in enumerate(vocab.token_bytes) if b], np.int64)
    blobs = [vocab.token_bytes[i] for i in ids]
    lengths = np.array([len(b) for b in blobs], np.int64)
    width = int(lengths.max()) if lengths.size else 1
    flat = dfa.byte_class[np.frombuffer(b"".join(blobs), np.uint8)] if blobs else np.zeros(0, np.int32)
    padded = np.full((ids.size, width), -1, np.int32)
    row = np.repeat(np.arange(ids.size), lengths)
    col = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    padded[row, col] = flat
    strings, inverse = np.unique(padded, axis=0, return_inverse=True)
    return ids, inverse.reshape(-1), strings, (strings >= 0).sum(axis=1)


def _trie(strings: np.ndarray, lengths: np.ndarray, k: int):
    """Per depth: ``(parent [N_d], class [N_d], string ending here or -1 [N_d])``, children sorted by parent."""
    levels = []
    node = np.zeros(strings.shape[0], np.int64)
    for d in range(1, strings.shape[1] + 1):
        live = np.flatnonzero(lengths >= d)
        if live.size == 0:
            break
        key = node[live] * k + strings[live, d - 1]
        uniq, inv = np.unique(key, return_inverse=True)
        node[live] = inv
        term = np.full(uniq.size, -1, np.int64)
        ends = lengths[live] == d
        term[inv[ends]] = live[ends]
        levels.append((uniq // k, (uniq % k).astype(np.int64), term))
    return levels


def _walk(delta: np.ndarray, levels, origins: np.ndarray):
    """Sparse token-level transitions ``(state, string, next)`` for the given origin states.

    Dense per trie level: ``cur[o, node]`` is the state of origin ``o`` after the node's prefix
    (0 = dead); origins whose row died entirely are dropped, so structural states cost one level.
    """
    k = delta.shape[1]
    itype = np.int32 if delta.size < 2**31 else np.int64
    flat = (delta.astype(itype) * k).ravel()  # next states premultiplied by K
    out_s, out_u, out_t = [], [], []
    rows = origins.astype(np.int64)
    cur = (origins[:, None] * k).astype(itype)  # [R, 1]: the root; states are stored premultiplied by K
    for parent, cls, term in levels:
        idx = cur[:, parent]
        idx += cls.astype(itype)
        cur = flat[idx]  # [R, N_d]
        alive = cur.any(axis=1)
        if not alive.all():
            cur, rows = cur[alive], rows[alive]
        if rows.size == 0:
            break
        ends = np.flatnonzero(term >= 0)
        r, j = np.nonzero(cur[:, ends])
        out_s.append(rows[r])
        out_u.append(term[ends[j]])
        out_t.append(cur[r, ends[j]] // k)
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(out_s), cat(out_u), cat(out_t)


def _group_columns(s, u, t, n_strings: int, n_states: int):
    """Classes of identical sparse columns: ``(class per string or -1, dense [S, C])``; exact.

    Each column is fingerprinted by two sums of 26-bit hashes of its ``(state, next)`` entries
    (``bincount`` sums are exact in float64); the grouping is then verified against the entries.
    """
    for salt in range(8):
        with np.errstate(over="ignore"):
            h = _splitmix((s.astype(np.uint64) << np.uint64(32)) + t.astype(np.uint64) + np.uint64(salt * 0x9E37))
        lo = (h & np.uint64((1 << 26) - 1)).astype(np.float64)
        hi = (h >> np.uint64(38)).astype(np.float64)
        count = np.bincount(u, minlength=n_strings)
        key = np.stack([np.bincount(u, lo, n_strings), np.bincount(u, hi, n_strings), count], 1)
        has = count > 0
        _, cls = np.unique(key[has], axis=0, return_inverse=True)
        cls_of = np.full(n_strings, -1, np.int64)
        cls_of[has] = cls.reshape(-1)
        dense = np.zeros((n_states, int(cls.max()) + 1 if cls.size else 0), np.int32)
        col = cls_of[u]
        dense[s, col] = t
        if np.array_equal(dense[s, col], t) and np.array_equal((dense != 0).sum(axis=0)[cls_of[has]], count[has]):
            return cls_of, dense
    raise RuntimeError("token column hashing failed repeatedly")  # pragma: no cover


def build(dfa: ByteDFA, vocab: Vocabulary) -> TokenGrammar:
    """Token-level grammar of a byte DFA for a vocabulary.

    Raises:
      EmptyLanguageError: if no token sequence of this vocabulary spells an accepted string.
    """
    k = int(dfa.delta.shape[1])
    n_states = dfa.num_states
    ids, inverse, strings, lengths = _class_strings(dfa, vocab)
    levels = _trie(strings, lengths, k)
    chunk = max(1, _PAIR_CHUNK // max([1] + [lv[0].size for lv in levels]))
    parts = [_walk(dfa.delta, levels, np.arange(a, min(a + chunk, n_states))) for a in range(1, n_states, chunk)]
    s, u, t = (np.concatenate([p[i] for p in parts]) for i in range(3))
    cls_of_string, dense = _group_columns(s, u, t, strings.shape[0], n_states)
    eos_col = np.where(dfa.accept, np.arange(n_states), 0).astype(np.int32)
    table = np.concatenate([np.zeros((n_states, 1), np.int32), eos_col[:, None], dense], axis=1)
    try:
        table, accept, start = trim(table, dfa.accept, dfa.start)
    except EmptyLanguageError:
        raise EmptyLanguageError(
            "no token sequence of this vocabulary spells a string the constraint accepts"
        ) from None
    table, accept, start = minimise(table, accept, start)
    cols, col_class = np.unique(table.T, axis=0, return_inverse=True)
    col_class = col_class.reshape(-1)
    nxt = np.ascontiguousarray(cols.T.astype(np.int32))
    v = vocab.size
    class_of = np.zeros(v, np.int32)
    text_cls = cls_of_string[inverse]
    class_of[ids] = col_class[np.where(text_cls >= 0, text_cls + 2, 0)]  # column 0: never allowed
    class_of[list(vocab.eos_ids)] = col_class[1]
    forced = _forced(nxt, class_of)
    mask_id, masks = _bitmasks(nxt, class_of)
    return TokenGrammar(nxt, class_of, accept, forced, start, mask_id, masks)


def _bitmasks(nxt: np.ndarray, class_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct allowed-token bitmasks: ``(mask_id int32[S], masks uint32[U, ceil(V/32)])``.

    Mask 0 is the empty mask (the dead state's), so zero-padded ``mask_id`` entries are safe.
    """
    patterns, mask_id = np.unique(nxt != 0, axis=0, return_inverse=True)
    v = class_of.size
    w = -(-v // 32)
    masks = np.zeros((patterns.shape[0], w * 32), bool)
    masks[:, :v] = patterns[:, class_of]
    packed = np.packbits(masks, axis=1, bitorder="little").view("<u4").astype(np.uint32)
    return mask_id.reshape(-1).astype(np.int32), packed


def _forced(nxt: np.ndarray, class_of: np.ndarray) -> np.ndarray:
    """``int32[S]``: the single allowed token id of each state, ``-1`` when zero or several."""
    c = nxt.shape[1]
    size = np.bincount(class_of, minlength=c)
    first = np.full(c, -1, np.int64)
    first[class_of[::-1]] = np.arange(class_of.size)[::-1]
    allowed = nxt != 0
    count = allowed.astype(np.int64) @ size
    only = np.argmax(allowed, axis=1)
    return np.where(count == 1, first[only], -1).astype(np.int32)
