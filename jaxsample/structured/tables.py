"""Device tables for compiled grammars, bucketed shapes, and the jit-side mask / advance gathers.

Several :class:`~jaxsample.structured.tokens.TokenGrammar` are stacked along a leading grammar axis
``G`` and padded to power-of-two buckets of grammars ``G``, states ``S``, classes ``C``, distinct
masks and class sets ``U``, mask blocks ``K`` and stored transitions ``N`` (and, for recursive
grammars, effects, stack-dependent tokens and stack rooms), so a new schema (or a new mix of
schemas) reuses the compiled decode loop unless it crosses a bucket. Index arrays take the smallest
of ``uint8`` / ``uint16`` / ``int32`` that holds their bucket (a function of the buckets only, so
equal buckets give equal dtypes and no recompile). A row selects its grammar with an id (``-1`` =
unconstrained). Per step, for a row in state ``s`` of grammar ``g``::

    ids           = mask_rows[g, mask_id[g, s, room]]         # [B, V/256] block ids of the state's mask
    words         = mask_blocks[g, ids].reshape(B, -1)        # one [B, V/32] gather of 8-word blocks
    allowed[b, v] = (words[b, v // 32] >> (v % 32)) & 1       # elementwise unpack, fused into the where
    s'            = next[g, s, class_of[g, token]]            # a few scalar gathers (packed, below)

**Masks** are cut into blocks of ``BLOCK`` words (256 tokens), deduplicated per grammar: most
blocks are empty or shared by many masks (on JSONSchemaBench 4-32x fewer distinct blocks than
mask blocks, 9x at the median), so a mask costs ``V/256`` block ids plus its distinct blocks.

**next** is stored per state as its live classes, a *default* target (the most common target of
its live classes: the state itself inside strings, a counter's next state, ...) and the
*exceptions*: live classes whose target differs. A state's pair of class sets (live, exceptions)
is one of ``U`` distinct pairs ``p = row_sets[s]``, bitsets over classes (``live_bits[p]``,
``pattern_bits[p]``) with the count of exceptions before each word (``pattern_rank[p]``). A state
with live classes has its default and then its exception targets in ``targets`` from
``row_offset[s]`` on::

    live = live_bits[g, p, c // 32] >> c % 32 & 1
    w    = pattern_bits[g, p, c // 32]
    k    = where(w >> c % 32 & 1, 1 + pattern_rank[g, p, c // 32] + popcount(w & ((1 << c % 32) - 1)), 0)
    s'   = where(live, targets[g, row_offset[g, s] + k], 0)

The earlier forms held more: the dense ``[S, C]`` table 2.6-5.8x the bytes of the unpadded one,
itself 15-25x the live entries; every live entry with an ``int16[U, C]`` rank table, up to 17x the
stored targets (2.5x at the median of JSONSchemaBench); and the full ``uint32[U, V/32]`` masks.

A row's state is a :class:`GrammarState`: the automaton state, and for recursive grammars a stack
of return states (``int32[B, D]``, ``D`` the stack capacity) with its depth. For regular grammars
``room`` is 0 and the stack is never touched. For recursive grammars (see
:mod:`~jaxsample.structured.effects`) ``room = min(limit - depth, R - 1)``; a ``next`` value from
``S`` on is an effect (a stay that pushes, or a return that pops and continues in the popped state
with another class, at most ``max_pops`` times per token); the few tokens that return and go on in
the caller are listed per state with their ``next`` value from it (a window of ``W`` per row) and
resolved on the stack; EOS also needs every state on the stack to be able to end. A token's ``i``-th
return pops the same frame for every token of a row (its depth less ``i``), and only the few states
a stack can hold are ever popped, reading few classes: their ``next`` rows are kept dense over
those classes (``return_next``; ``return_row`` and ``return_col`` index it, and an effect's rest
class is stored as its column), so each return is one gather per token, the popped state's row
found once per row. The stack arrays of a stack without recursion
(or without stack-dependent tokens) are one column wide: the code that reads them is not traced.

The mask is a packed bitmask rather than ``next[s, class_of[v]]`` because a per-element ``[B, V]``
gather is ~50x slower than the unpack on CPU (measured: 9 ms vs 0.16 ms at B=32, V=32k).
Padded states are all-dead and unreachable; padded logits columns are class 0 (dead) and never
set in a mask.

>>> import numpy as np
>>> from jaxsample.structured import compile_regex, Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "a", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> t = stack([compile_regex("ab?", v)])
>>> s = initial_state(t, np.array([0, -1]))
>>> np.asarray(allowed(t, np.array([0, -1]), s)).tolist()
[[False, True, False], [True, True, True]]
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._types import NEG_INF, Array, ArrayLike
from jaxsample.structured.minimise import unique_rows
from jaxsample.structured.tokens import TokenGrammar

MIN_GRAMMARS = 1
MIN_STATES = 64
MIN_CLASSES = 32
MIN_MASKS = 16
MIN_TRANSITIONS = 256
MIN_BLOCKS = 128
BLOCK = 8  # words (256 tokens) per mask block
# recursive grammars: stack capacity, stack-dependent tokens per row and in all, stack rooms, effects,
# pushes per token, returns per token (generous minimums: most grammars share one bucket)
MIN_DEPTH = 8
MIN_RETURNS = 32
MIN_POP_TOKENS = 1024
MIN_ROOMS = 4
MIN_EFFECTS = 256
MIN_PUSHES = 4
MIN_POPS = 2
MIN_RETURN_ROWS = 8  # return_next: the dead state and the states a return can pop,
MIN_RETURN_COLS = 32  # the dead class and the classes those states read
MIN_KEY_OPS = 16  # key-register ops of a grammar (objects recording their keys)

_STATIC = ("depth", "max_pops", "window")


@dataclasses.dataclass(frozen=True)
class Tables:
    """Stacked grammar tables (a pytree of device arrays; pass it to ``jit`` as an argument).

    ``idx`` below is the smallest of ``uint8`` / ``uint16`` / ``int32`` holding the values' bucket.

    Attributes:
      row_sets: ``idx[G, S]`` each state's pair of class sets (live, exceptions; 0: the dead state's, empty).
      live_bits: ``uint32[G, U, ceil(C/32)]`` the live class sets as bitsets (bit ``c % 32`` of word ``c // 32``).
      pattern_bits: ``uint32[G, U, ceil(C/32)]`` the exception class sets as bitsets.
      pattern_rank: ``idx[G, U, ceil(C/32)]`` set bits of an exception set before each word.
      row_offset: ``idx[G, S]`` where each state's default and exception targets start in ``targets``.
      targets: ``idx[G, N]`` per state with live classes: the next state or effect (``>= S``) of
        the live classes outside its exceptions, then of each exception in class order.
      class_of: ``idx[G, V]`` token class per logits column.
      forced: ``int16|int32[G, S]`` the only allowed token of a state, ``-1`` if none, several, or it depends on the stack.
      start: ``int32[G]`` initial state of each grammar.
      mask_id: ``idx[G, S, R]`` bitmask index of each state per stack room (``R = 1`` without recursion).
      mask_rows: ``idx[G, U, ceil(V/32/BLOCK)]`` the distinct allowed-token bitmasks as block ids.
      mask_blocks: ``uint32[G, K, BLOCK]`` distinct mask blocks (block 0 is empty).
      accept: ``bool[G, S]`` states where the current rule may end.
      need: ``int32[G, S]`` stack room needed to finish the current rule (``[G, 1]`` without recursion).
      effect: ``int32[G, E, 4 + P]`` effects (see :class:`~jaxsample.structured.tokens.PushdownTables`),
        the rest class as its column in ``return_next``.
      pop_start, pop_count: ``idx[G, S]`` each state's stack-dependent tokens in ``pop_token`` (``[G, 1]`` if ``window == 0``).
      pop_token: ``idx[G, T]`` (``[G, 1]`` if ``window == 0``).
      pop_next: ``idx[G, T]`` the ``next`` value (an effect that returns) of each listed token from its
        state (states share a list where tokens and values are equal).
      return_row: ``idx[G, S]`` row in ``return_next`` of each state a return can pop (0: others).
      return_col: ``idx[G, C]`` column in ``return_next`` of each class live in one of its rows (0: others).
      return_next: ``idx[G, Q, K]`` ``next`` of the states a return can pop (the pushed states and the
        bottom) for the classes live in their rows; row and column 0 are dead (the three are
        ``[G, 1]``, ``[G, 1]``, ``[G, 1, 1]`` without recursion).
      bottom: ``int32[G]`` the state below every stack.
      limit: ``int32[G]`` stack limit (traced: changing it never recompiles; ``<= depth``).
      eos: ``int32[G, N]`` EOS ids (``-1`` padding).
      effect_op: ``idx[G, E]`` the key-register op of each effect (0: none; ``[G, 1]`` when no grammar has one).
      key_ops: ``uint32[G, O, 4 + 2E, K]`` the ops' ``absent``, ``present``, ``clear`` and ``add`` bits over
        the ``K`` words of a row's key register (``K = 0`` when no grammar has ops), then the set and
        the clear bits of ``E`` alternatives of which one must hold (an op's ``either``, the last
        repeated to fill; zeros: none needed).
      key_need: ``uint32[G, S, K]`` per state, the key bits of which one at least must be clear (inside
        a key, after ``,``: the output must stay completable; 0: none).
      depth: static stack capacity ``D`` (0: no grammar recurses).
      max_pops: static bound on the frames one token returns from.
      window: static number of stack-dependent tokens examined per row and step.
    """

    row_sets: Array
    live_bits: Array
    pattern_bits: Array
    pattern_rank: Array
    row_offset: Array
    targets: Array
    class_of: Array
    forced: Array
    start: Array
    mask_id: Array
    mask_rows: Array
    mask_blocks: Array
    accept: Array
    need: Array
    effect: Array
    pop_start: Array
    pop_count: Array
    pop_token: Array
    pop_next: Array
    return_row: Array
    return_col: Array
    return_next: Array
    bottom: Array
    limit: Array
    eos: Array
    effect_op: Array
    key_ops: Array
    key_need: Array
    depth: int = 0
    max_pops: int = 0
    window: int = 0

    def arrays(self) -> list:
        return [getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _STATIC]


jax.tree_util.register_dataclass(
    Tables, data_fields=[f.name for f in dataclasses.fields(Tables) if f.name not in _STATIC], meta_fields=list(_STATIC)
)


class GrammarState(NamedTuple):
    """Per-row automaton state (a pytree; every leaf has the batch as leading axes).

    Attributes:
      state: ``int32[B]`` automaton state (0 = dead: a token the grammar did not allow was accepted).
      stack: ``int32[B, D]`` return states of a recursive grammar, oldest first.
      depth: ``int32[B]`` frames in use.
      keys: ``uint32[B, K]`` the key register: declared properties written in the open objects
        (:class:`~jaxsample.structured.automaton.KeyOp`; ``K = 0`` when no grammar records keys).
    """

    state: Array
    stack: Array
    depth: Array
    keys: Array


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _index_dtype(n: int):
    """The smallest of ``uint8`` / ``uint16`` / ``int32`` holding ``0 .. n - 1``."""
    return np.uint8 if n <= 1 << 8 else np.uint16 if n <= 1 << 16 else np.int32


def _size(value, need: int, minimum: int, name: str, sizes: dict) -> int:
    out = bucket(need, minimum) if value is None else int(value)
    sizes[name] = (out, need)
    return out


def stack(
    grammars: Sequence[TokenGrammar],
    *,
    num_grammars: int | None = None,
    num_states: int | None = None,
    num_classes: int | None = None,
    num_masks: int | None = None,
    max_depth: int | None = None,
    num_depth: int | None = None,
    num_returns: int | None = None,
    num_pop_tokens: int | None = None,
    num_transitions: int | None = None,
    num_blocks: int | None = None,
) -> Tables:
    """Device tables for several grammars (same vocabulary), padded to bucketed shapes.

    The per-grammar part (:func:`prepared`: ``next`` packed, masks cut into blocks) is kept for
    read-only grammars (every cached one), so stacking the same grammars again only pads and uploads.

    Args:
      grammars: compiled grammars; their index is the grammar id rows refer to.
      num_grammars: fixed ``G`` (default: the power-of-two bucket of ``len(grammars)``).
      num_states: fixed ``S`` (default: the power-of-two bucket, at least ``MIN_STATES``).
      num_classes: fixed ``C`` (default: the power-of-two bucket, at least ``MIN_CLASSES``).
      num_masks: fixed ``U`` (default: the power-of-two bucket, at least ``MIN_MASKS``), for the
        distinct bitmasks and the distinct pairs of class sets of ``next`` alike.
      num_transitions: fixed ``N``, the stored targets of ``next`` of a grammar (a default per state
        with live classes, and the exceptions), at most its live (state, class) pairs (default: the
        power-of-two bucket, at least ``MIN_TRANSITIONS``).
      num_blocks: fixed ``K``, the distinct mask blocks of a grammar (default: the power-of-two
        bucket, at least ``MIN_BLOCKS``).
      max_depth: stack limit of every recursive grammar (default: each grammar's own); a traced
        value: changing it within the capacity never recompiles.
      num_depth: fixed stack capacity ``D`` (default: the power-of-two bucket of the largest limit,
        at least ``MIN_DEPTH``; 0 when no grammar recurses).
      num_returns: fixed window ``W`` of stack-dependent tokens resolved per row and step (default:
        the bucket of the longest per-state list, at least ``MIN_RETURNS``; 0 without recursion).
      num_pop_tokens: fixed length ``T`` of the stack-dependent token lists of a grammar (default:
        the bucket of the longest, at least ``MIN_POP_TOKENS``).

    Raises:
      ValueError: on an empty list, mixed vocabulary sizes, a negative ``max_depth`` or one below
        what a grammar's shortest output needs, or fixed sizes that are too small.
    """
    if not grammars:
        raise ValueError("stack needs at least one grammar")
    vocab = {g.class_of.shape[0] for g in grammars}
    if len(vocab) != 1:
        raise ValueError(f"grammars were compiled for different vocabulary sizes {sorted(vocab)}")
    if max_depth is not None and int(max_depth) < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    pds = [g.pushdown for g in grammars]
    rec = [p for p in pds if p is not None]
    limits = [int(p.max_depth if max_depth is None else max_depth) if p is not None else 0 for p in pds]
    for i, (g, p, lim) in enumerate(zip(grammars, pds, limits)):
        if p is not None and p.need[g.start] > lim:
            raise ValueError(f"max_depth={lim} is below the {int(p.need[g.start])} frames grammar {i}'s shortest output needs")
    sizes: dict = {}
    n = _size(num_grammars, len(grammars), MIN_GRAMMARS, "num_grammars", sizes)
    s = _size(num_states, max(g.num_states for g in grammars), MIN_STATES, "num_states", sizes)
    c = _size(num_classes, max(g.num_classes for g in grammars), MIN_CLASSES, "num_classes", sizes)
    packed, blocked = zip(*(prepared(g) for g in grammars))
    u = _size(num_masks, max(max(g.masks.shape[0], p[1].shape[0]) for g, p in zip(grammars, packed)), MIN_MASKS,
              "num_masks", sizes)  # fmt: skip
    n_live = _size(num_transitions, max(p[-1].size for p in packed), MIN_TRANSITIONS, "num_transitions", sizes)
    k_size = _size(num_blocks, max(b[1].shape[0] for b in blocked), MIN_BLOCKS, "num_blocks", sizes)
    d = _size(num_depth, max(max(limits), 1), MIN_DEPTH, "num_depth", sizes) if rec else int(num_depth or 0)
    longest = max([int(p.pop_count.max(initial=0)) for p in rec], default=0)
    window = _size(num_returns, longest, MIN_RETURNS, "num_returns", sizes) if longest else int(num_returns or 0)
    lists = [_pop_lists(g) if g.pushdown is not None and window else None for g in grammars]
    n_pop = _size(num_pop_tokens, max([x[2].size for x in lists if x is not None], default=1), MIN_POP_TOKENS,
                  "num_pop_tokens", sizes)  # fmt: skip
    small = {k: v for k, v in sizes.items() if v[0] < v[1]}
    if small:
        raise ValueError(
            f"{', '.join(f'{k}={v[0]}' for k, v in small.items())} smaller than needed "
            f"({', '.join(str(v[1]) for v in small.values())})"
        )
    rooms = bucket(max(p.room_mask_id.shape[1] for p in rec), MIN_ROOMS) if rec else 1
    n_eff = bucket(max(p.effect.shape[0] for p in rec), MIN_EFFECTS) if rec else 1
    width = 4 + bucket(max(p.effect.shape[1] - 4 for p in rec), MIN_PUSHES) if rec else 4
    max_pops = bucket(max(p.max_pops for p in rec), MIN_POPS) if rec else 0
    returns = [_returns(g) if g.pushdown is not None else None for g in grammars]
    n_ret = bucket(1 + max(x[0].size for x in returns if x is not None), MIN_RETURN_ROWS) if rec else 1
    n_col = bucket(1 + max(x[1].size for x in returns if x is not None), MIN_RETURN_COLS) if rec else 1
    n_eos = max(len(g.eos_ids) for g in grammars) or 1
    key_ops = [p.key_ops for p in rec if p.key_ops.shape[0] > 1]
    n_ops = bucket(max([k.shape[0] for k in key_ops], default=1), MIN_KEY_OPS) if key_ops else 1
    n_words = bucket(max(k.shape[2] for k in key_ops), 1) if key_ops else 0
    n_rows = max([k.shape[1] for k in key_ops], default=4)
    v = vocab.pop()
    s_rec, s_pop = (s if rec else 1), (s if window else 1)  # stack arrays only where the code reads them
    cw = -(-c // 32)
    row_sets = np.zeros((n, s), _index_dtype(u))
    live_bits = np.zeros((n, u, cw), np.uint32)
    pattern_bits = np.zeros((n, u, cw), np.uint32)
    pattern_rank = np.zeros((n, u, cw), _index_dtype(c))
    row_offset = np.zeros((n, s), _index_dtype(n_live))
    targets = np.zeros((n, n_live), _index_dtype(s + n_eff))
    forced = np.full((n, s), -1, np.int16 if v <= 1 << 15 else np.int32)
    class_of = np.zeros((n, v), _index_dtype(c))
    mask_id = np.zeros((n, s, rooms), _index_dtype(u))
    mask_rows = np.zeros((n, u, blocked[0][0].shape[1]), _index_dtype(k_size))
    mask_blocks = np.zeros((n, k_size, BLOCK), np.uint32)
    accept = np.zeros((n, s), bool)
    need = np.zeros((n, s_rec), np.int32)
    effect = np.zeros((n, n_eff, width), np.int32)
    pop_start = np.zeros((n, s_pop), _index_dtype(n_pop + 1))  # (an empty list may start at the end)
    pop_count = np.zeros((n, s_pop), _index_dtype(window + 1))
    pop_token = np.zeros((n, n_pop if window else 1), _index_dtype(v))
    pop_next = np.zeros((n, n_pop if window else 1), _index_dtype(s + n_eff))
    return_row = np.zeros((n, s_rec), _index_dtype(n_ret))
    return_col = np.zeros((n, c if rec else 1), _index_dtype(n_col))
    return_next = np.zeros((n, n_ret, n_col), _index_dtype(s + n_eff))
    bottom = np.zeros(n, np.int32)
    limit = np.zeros(n, np.int32)
    eos = np.full((n, n_eos), -1, np.int32)
    effect_op = np.zeros((n, n_eff if key_ops else 1), _index_dtype(n_ops))
    key_table = np.zeros((n, n_ops, n_rows, n_words), np.uint32)
    key_need = np.zeros((n, s if key_ops else 1, n_words), np.uint32)
    start = np.zeros(n, np.int32)  # padding grammars: start in the dead state
    for i, (g, p) in enumerate(zip(grammars, pds)):
        k = g.num_states
        pair, live, bits, rank, offset, stored = packed[i]
        remap = lambda x: np.where(x >= k, x - k + s, x)  # noqa: E731  (effects follow the padded states)
        row_sets[i, :k] = pair
        live_bits[i, : live.shape[0], : live.shape[1]] = live
        pattern_bits[i, : bits.shape[0], : bits.shape[1]] = bits
        pattern_rank[i, : rank.shape[0], : rank.shape[1]] = rank
        row_offset[i, :k] = offset
        targets[i, : stored.size] = remap(stored)
        forced[i, :k] = g.forced
        class_of[i] = g.class_of
        ids, blocks = blocked[i]
        mask_rows[i, : ids.shape[0]] = ids
        mask_blocks[i, : blocks.shape[0]] = blocks
        accept[i, :k] = g.accept
        eos[i, : len(g.eos_ids)] = g.eos_ids
        start[i] = g.start
        if p is None:
            mask_id[i, :k] = g.mask_id[:, None]
            continue
        r = p.room_mask_id.shape[1]
        mask_id[i, :k, :r] = p.room_mask_id
        mask_id[i, :k, r:] = p.room_mask_id[:, -1:]
        need[i, :k] = p.need
        rows, cols = returns[i]
        return_row[i, rows] = np.arange(1, rows.size + 1)
        return_col[i, cols] = np.arange(1, cols.size + 1)
        return_next[i, 1 : rows.size + 1, 1 : cols.size + 1] = remap(g.next[np.ix_(rows, cols)])
        e = p.effect.copy()
        e[:, 1] = np.where(e[:, 1] >= 0, return_col[i, np.maximum(e[:, 1], 0)].astype(np.int32), -1)
        effect[i, : e.shape[0], : e.shape[1]] = e
        if key_ops:
            effect_op[i, : p.effect_op.size] = p.effect_op
            o, r, w = p.key_ops.shape
            key_table[i, :o, :4, :w] = p.key_ops[:, :4]
            if r > 4:  # the set and clear bits of either pairs, each part filled with its last pair
                e, pad = (r - 4) // 2, (n_rows - 4) // 2
                for part in range(2):
                    rows = p.key_ops[:, 4 + part * e : 4 + (part + 1) * e]
                    key_table[i, :o, 4 + part * pad : 4 + (part + 1) * pad, :w] = np.concatenate(
                        [rows, np.repeat(rows[:, -1:], pad - e, axis=1)], axis=1)
            key_need[i, : p.key_need.shape[0], : p.key_need.shape[1]] = p.key_need
        if window:
            pop_start[i, :k], pop_count[i, :k], token, value = lists[i]
            pop_token[i, : token.size], pop_next[i, : value.size] = token, remap(value)
        bottom[i] = p.bottom
        limit[i] = limits[i]
    arrays = [row_sets, live_bits, pattern_bits, pattern_rank, row_offset, targets, class_of, forced, start, mask_id,
              mask_rows, mask_blocks, accept, need, effect, pop_start, pop_count, pop_token, pop_next, return_row,
              return_col, return_next, bottom, limit, eos, effect_op, key_table, key_need]  # fmt: skip
    return Tables(*jax.device_put(arrays), depth=d, max_pops=max_pops, window=window)  # one transfer call: ~4x faster


class Prepared(NamedTuple):
    """The per-grammar part of :func:`stack`: ``next`` packed (:func:`_packed_next`) and the masks
    cut into deduplicated blocks (:func:`_blocks`)."""

    packed: tuple
    blocked: tuple


#: Prepared parts of recent read-only grammars, at most this many and :data:`PREPARED_BYTES` bytes of
#: grammars and parts (a service stacks the same cached grammars batch after batch; ``grammar_cache``
#: also stores the parts on disk). Keyed by identity, holding the grammar.
PREPARED_ENTRIES = 64
PREPARED_BYTES = 256 << 20
_memo: "collections.OrderedDict[int, tuple[TokenGrammar, Prepared, int]]" = collections.OrderedDict()
_memo_lock = threading.Lock()


def _leaves(x) -> list:
    return [a for a in jax.tree.leaves(x) if isinstance(a, np.ndarray)]


def remember(g: TokenGrammar, parts: Prepared) -> None:
    """Keeps ``parts`` as ``g``'s prepared parts (``g`` must be read-only: its arrays cannot change)."""
    if any(a.flags.writeable for a in _leaves(g)):
        raise ValueError("only a read-only grammar's prepared parts are kept")
    size = sum(a.nbytes for a in _leaves(g) + _leaves(tuple(parts)))
    with _memo_lock:
        _memo[id(g)] = (g, parts, size)
        _memo.move_to_end(id(g))
        while _memo and (len(_memo) > PREPARED_ENTRIES or sum(e[2] for e in _memo.values()) > PREPARED_BYTES):
            _memo.popitem(last=False)


def forget_prepared() -> None:
    """Drops every kept prepared part (``grammar_cache.clear()`` calls it)."""
    with _memo_lock:
        _memo.clear()


def prepared(g: TokenGrammar) -> Prepared:
    """``g``'s prepared parts, computed once per read-only grammar (compiled grammars are read-only
    once cached); a writeable grammar's are computed on every call (its arrays may have changed)."""
    with _memo_lock:
        hit = _memo.get(id(g))
        if hit is not None and hit[0] is g:
            _memo.move_to_end(id(g))
            return hit[1]
    parts = Prepared(_packed_next(g.next), _blocks(g.masks))
    if not any(a.flags.writeable for a in _leaves(g)):
        remember(g, parts)
    return parts


def _pop_lists(g: TokenGrammar):
    """Each state's stack-dependent tokens with their ``next`` values from it: ``(start int[S], count int[S],
    token int[T], value int[T])``; states with equal tokens and values share one list."""
    p = g.pushdown
    has = np.flatnonzero(p.pop_count)
    at = np.repeat(p.pop_start[has] - np.cumsum(p.pop_count[has]) + p.pop_count[has], p.pop_count[has])
    token = p.pop_token[at + np.arange(at.size)]  # every listed token of every state, state by state (start + j)
    state = np.repeat(has, p.pop_count[has])
    value = np.zeros((has.size, g.next.shape[1]), g.next.dtype)  # a state's list, as values by class (effects: > 0)
    value[np.repeat(np.arange(has.size), p.pop_count[has]), g.class_of[token]] = g.next[state, g.class_of[token]]
    first, which = unique_rows(value)
    size = p.pop_count[has][first]
    offset = np.cumsum(size) - size
    start, count = np.zeros(g.num_states, np.int64), np.zeros(g.num_states, np.int64)
    start[has], count[has] = offset[which], size[which]
    keep = np.isin(np.repeat(np.arange(has.size), p.pop_count[has]), first)  # the entries of each list's first state
    return start, count, token[keep], g.next[state[keep], g.class_of[token[keep]]]


def _returns(g: TokenGrammar) -> tuple[np.ndarray, np.ndarray]:
    """``(int[Q], int[K])``: the states a return can pop (the pushed ones and the bottom) and the classes
    live in their ``next`` rows, both sorted."""
    p = g.pushdown
    pushed = p.effect[:, 4:][np.arange(p.effect.shape[1] - 4) < p.effect[:, 2:3]]
    rows = np.union1d(pushed, [p.bottom])
    return rows, np.flatnonzero((g.next[rows] != 0).any(axis=0))


def _row_modes(row: np.ndarray, value: np.ndarray, rows: int) -> np.ndarray:
    """``int[rows]``: the most common value per row of sparse entries (the smallest among equally common
    ones; 0 for a row without entries)."""
    out = np.zeros(rows, np.int64)
    if row.size == 0:
        return out
    span = int(value.max()) + 1
    key = np.sort(row.astype(np.int64) * span + value, kind="stable")  # (timsort: rows come sorted, values in runs)
    first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))  # runs of one value in one row
    length = np.diff(np.append(first, key.size))
    run_row = key[first] // span
    starts = np.flatnonzero(np.concatenate([[True], run_row[1:] != run_row[:-1]]))  # each row's first run
    best = np.repeat(np.maximum.reduceat(length, starts), np.diff(np.append(starts, run_row.size)))
    top = np.flatnonzero(length == best)  # the longest runs; per row the first has the smallest value
    top = top[np.concatenate([[True], run_row[top[1:]] != run_row[top[:-1]]])]
    out[run_row[top]] = key[first[top]] % span
    return out


def _bitsets(sets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``bool[P, C]`` -> ``(bits uint32[P, ceil(C/32)], set bits before each word int[P, ceil(C/32)])``."""
    cw = -(-sets.shape[1] // 32)
    padded = np.zeros((sets.shape[0], cw * 32), bool)
    padded[:, : sets.shape[1]] = sets
    bits = np.packbits(padded, axis=1, bitorder="little").view("<u4").astype(np.uint32).reshape(sets.shape[0], cw)
    per_word = padded.reshape(sets.shape[0], cw, 32).sum(axis=2)
    return bits, np.cumsum(per_word, axis=1) - per_word


def _packed_next(nxt: np.ndarray):
    """``next`` as pairs of class sets, defaults and exceptions (see the module docstring).

    Returns:
      ``(pair int[S], live sets uint32[P, ceil(C/32)], exception sets uint32[P, ceil(C/32)], their
      ranks int[P, ceil(C/32)], offset int[S], targets int[N])``; pair 0 is the dead state's (empty).
    """
    live = nxt != 0
    at = np.flatnonzero(live)  # row-major
    value, r = nxt.ravel()[at], at // nxt.shape[1]
    default = _row_modes(r, value, nxt.shape[0])
    keep = value != default[r]
    exc = np.zeros_like(live)
    exc.ravel()[at[keep]] = True
    first, pair = unique_rows(np.concatenate([live, exc], axis=1))  # the dead state (row 0) comes first
    bits, rank = _bitsets(exc[first])
    has = live.any(axis=1)
    n_exc = np.bincount(r[keep], minlength=nxt.shape[0])
    size = has + n_exc  # per state: its default, then its exceptions
    offset = np.where(has, np.cumsum(size) - size, 0)  # 0 where never read: offsets stay below N
    targets = np.zeros(int(size.sum()), nxt.dtype)
    targets[offset[has]] = default[has]
    row = r[keep]
    targets[offset[row] + 1 + np.arange(row.size) - (np.cumsum(n_exc) - n_exc)[row]] = value[keep]
    return pair, _bitsets(live[first])[0], bits, rank, offset, targets


def _blocks(masks: np.ndarray):
    """Masks as deduplicated blocks: ``(ids int[U, ceil(W/BLOCK)], blocks uint32[K, BLOCK])``; block 0 is empty."""
    nb = -(-masks.shape[1] // BLOCK)
    padded = np.zeros((masks.shape[0] * nb + 1, BLOCK), np.uint32)  # row 0: the empty block, first
    padded[1:].reshape(masks.shape[0], nb * BLOCK)[:, : masks.shape[1]] = masks
    first, ids = unique_rows(padded)
    return ids[1:].reshape(masks.shape[0], nb), padded[first]


def _next(tables: Tables, g: Array, q: Array, cls: Array) -> Array:
    """``next[g, q, cls]`` from the class sets, defaults and exceptions (0 where dead); any matching shapes."""
    p = tables.row_sets[g, q].astype(jnp.int32)
    bit = (cls & 31).astype(jnp.uint32)
    live = (tables.live_bits[g, p, cls >> 5] >> bit) & 1 != 0
    word = tables.pattern_bits[g, p, cls >> 5]
    below = lax.population_count(word & ((jnp.uint32(1) << bit) - 1)).astype(jnp.int32)
    k = jnp.where((word >> bit) & 1 != 0, 1 + tables.pattern_rank[g, p, cls >> 5].astype(jnp.int32) + below, 0)
    at = jnp.minimum(tables.row_offset[g, q].astype(jnp.int32) + k, tables.targets.shape[1] - 1)  # (past the end: dead)
    return jnp.where(live, tables.targets[g, at].astype(jnp.int32), 0)


def nbytes(tables: Tables) -> int:
    """Device bytes held by the tables."""
    return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in tables.arrays()))


def _ids(tables: Tables, grammar: ArrayLike) -> Array:
    return jnp.clip(jnp.asarray(grammar, jnp.int32), 0, tables.start.shape[0] - 1)


def _as_state(tables: Tables, state) -> GrammarState:
    """A :class:`GrammarState`; a plain ``int[B]`` array is a state with an empty stack."""
    if isinstance(state, GrammarState):
        return state
    s = jnp.asarray(state, jnp.int32)
    return GrammarState(s, jnp.zeros(s.shape + (tables.depth,), jnp.int32), jnp.zeros(s.shape, jnp.int32),
                        jnp.zeros(s.shape + (tables.key_ops.shape[3],), jnp.uint32))  # fmt: skip


def initial_state(tables: Tables, grammar: ArrayLike) -> GrammarState:
    """Start states (state 0 for unconstrained rows, ``grammar < 0``), empty stacks."""
    grammar = jnp.asarray(grammar, jnp.int32)
    return _as_state(tables, jnp.where(grammar >= 0, tables.start[_ids(tables, grammar)], 0))


def _frames_accept(tables: Tables, g: Array, st: GrammarState) -> Array:
    """``bool[B]``: every state on the stack may end (EOS then returns through all of them)."""
    if tables.depth == 0:
        return jnp.ones(g.shape, bool)
    used = jnp.arange(tables.depth) < st.depth[:, None]
    return jnp.all(~used | tables.accept[g[:, None], st.stack], axis=1)


def _key_op(tables: Tables, gg: Array, v: Array, apply: Array, keys: Array) -> tuple[Array, Array]:
    """Where ``apply``, effect ``v``'s key op on ``keys [..., K]``: ``(passed, keys after)``."""
    n_eff = tables.effect_op.shape[1]
    op = tables.key_ops[gg, tables.effect_op[gg, jnp.clip(v - tables.forced.shape[1], 0, n_eff - 1)].astype(jnp.int32)]
    absent, present, clear, add = (op[..., j, :] for j in range(4))
    passed = jnp.all(keys & absent == 0, axis=-1) & jnp.all(keys & present == present, axis=-1)
    if op.shape[-2] > 4:  # one of the ``either`` pairs holds
        e = (op.shape[-2] - 4) // 2
        need, gone = op[..., 4 : 4 + e, :], op[..., 4 + e :, :]
        held = jnp.all((keys[..., None, :] & need == need) & (keys[..., None, :] & gone == 0), axis=-1)
        passed &= jnp.any(held, axis=-1)
    return ~apply | passed, jnp.where(apply[..., None], (keys & ~clear) | add, keys)


def _resolve(tables: Tables, g: Array, st: GrammarState, tokens: Array, first: Array | None = None):
    """Follows a token's returns: ``(valid, state, depth after pops, effect row or None, key register)``.

    Shapes are ``[B]`` (one token per row) or ``[B, W]`` (several tokens per row); ``first``: the
    tokens' ``next`` values from the row's state when known (the listed stack-dependent tokens).
    """
    v_size = tables.class_of.shape[-1]
    s_size = tables.forced.shape[1]
    lanes = tokens.ndim == 2
    gg = g[:, None] if lanes else g
    depth = jnp.broadcast_to(st.depth[:, None], tokens.shape) if lanes else st.depth
    keys = jnp.broadcast_to(st.keys[:, None], tokens.shape + st.keys.shape[-1:]) if lanes else st.keys
    cls = tables.class_of[gg, jnp.clip(tokens, 0, v_size - 1)].astype(jnp.int32)
    cls = jnp.where((tokens >= 0) & (tokens < v_size), cls, 0)
    v = _next(tables, gg, st.state[:, None] if lanes else st.state, cls) if first is None else first
    if tables.max_pops == 0:
        return v != 0, v, depth, None, keys
    n_eff = tables.effect.shape[1]
    rows = jnp.arange(g.shape[0])
    col = tables.return_col[gg, cls].astype(jnp.int32)  # the class read after a return, as a column of return_next
    fits = jnp.ones(v.shape, bool)  # calls entered and left before each return fit under the limit
    for i in range(tables.max_pops):  # a token returning once more has returned i times: it pops frame depth - 1 - i
        e = tables.effect[gg, jnp.clip(v - s_size, 0, n_eff - 1)]
        ret = (v >= s_size) & (e[..., 0] < 0)
        fits &= ~ret | (depth + e[..., 3] <= tables.limit[gg])
        if keys.shape[-1]:  # the key ops of the bytes before the return
            passed, keys = _key_op(tables, gg, v, ret, keys)
            fits &= passed
        at = st.depth - 1 - i
        popped = jnp.where(at >= 0, st.stack[rows, jnp.clip(at, 0, max(tables.depth - 1, 0))], tables.bottom[g])  # [B]
        row = tables.return_row[g, popped].astype(jnp.int32)
        col = jnp.where(ret & (e[..., 1] >= 0), e[..., 1], col)
        v = jnp.where(ret, tables.return_next[gg, row[:, None] if lanes else row, col].astype(jnp.int32), v)
        depth = jnp.where(ret, jnp.maximum(depth - 1, 0), depth)
    eff = v >= s_size
    e = tables.effect[gg, jnp.clip(v - s_size, 0, n_eff - 1)]
    if keys.shape[-1]:
        passed, keys = _key_op(tables, gg, v, eff, keys)
        fits &= passed
    target = jnp.where(eff, e[..., 0], v)
    room = jnp.where(eff, e[..., 3], tables.need[gg, jnp.clip(v, 0, s_size - 1)])
    valid = fits & (v != 0) & (target > 0) & (depth + room <= tables.limit[gg])
    if keys.shape[-1]:  # a key still needed there must be writable
        need = tables.key_need[gg, jnp.clip(target, 0, s_size - 1)]
        valid &= jnp.all(need == 0, axis=-1) | jnp.any(keys & need != need, axis=-1)
    return valid, target, depth, jnp.where(eff[..., None], e, 0), keys


def _mask_words(tables: Tables, g: Array, q: Array, room: Array) -> Array:
    """``uint32[B, W]`` allowed-token bitmask of state ``q`` at stack room ``room`` (``W``: ``V/32`` rounded up to ``BLOCK``)."""
    ids = tables.mask_rows[g, tables.mask_id[g, q, room].astype(jnp.int32)].astype(jnp.int32)  # [B, W / BLOCK]
    return tables.mask_blocks[g[:, None], ids].reshape(ids.shape[0], -1)


def allowed(tables: Tables, grammar: ArrayLike, state) -> Array:
    """``bool[B, V]`` allowed tokens; every token for unconstrained rows (``grammar < 0``).

    Args:
      tables: stacked tables.
      grammar: ``int[B]`` grammar id per row, ``-1`` = unconstrained.
      state: a :class:`GrammarState` (or ``int[B]`` states with empty stacks).
    """
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    g = _ids(tables, grammar)
    rooms = tables.mask_id.shape[2]
    room = jnp.clip(tables.limit[g] - st.depth, 0, rooms - 1)
    words = _mask_words(tables, g, st.state, room)
    rows = jnp.arange(words.shape[0])[:, None]
    v = tables.class_of.shape[-1]
    if tables.window:  # tokens that return and go on in the caller: resolve them on the stack, set their bits
        k = jnp.arange(tables.window)
        idx = jnp.clip(tables.pop_start[g, st.state].astype(jnp.int32)[:, None] + k, 0, tables.pop_token.shape[1] - 1)
        tok = tables.pop_token[g[:, None], idx].astype(jnp.int32)
        first = tables.pop_next[g[:, None], idx].astype(jnp.int32)
        valid = _resolve(tables, g, st, tok, first)[0] & (k < tables.pop_count[g, st.state].astype(jnp.int32)[:, None])
        bit = jnp.left_shift(jnp.uint32(1), (tok & 31).astype(jnp.uint32))
        words = words.at[rows, tok >> 5].add(jnp.where(valid, bit, jnp.uint32(0)))  # (their bits are 0 here)
    if tables.depth:  # EOS returns through every frame: cleared unless each may end
        eos = tables.eos[g]
        bit = jnp.left_shift(jnp.uint32(1), (eos & 31).astype(jnp.uint32))
        word = jnp.clip(eos >> 5, 0, words.shape[1] - 1)
        drop = (eos >= 0) & ~_frames_accept(tables, g, st)[:, None] & ((words[rows, word] & bit) != 0)
        words = words.at[rows, word].add(-jnp.where(drop, bit, jnp.uint32(0)))
    bits = (words[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1  # [B, W, 32]
    ok = bits.reshape(words.shape[0], -1)[:, :v] != 0
    return ok | (grammar < 0)[:, None]


def mask(logits: ArrayLike, tables: Tables, grammar: ArrayLike, state) -> Array:
    """``logits [B, V]`` with disallowed tokens at ``-inf`` (same dtype; kept logits unchanged).

    Raises:
      ValueError: if the logits width differs from the tables' vocabulary width.
    """
    logits = jnp.asarray(logits)
    if logits.shape[-1] != tables.class_of.shape[-1]:
        raise ValueError(
            f"logits have V={logits.shape[-1]} columns but the grammar tables were built for "
            f"{tables.class_of.shape[-1]} (build the Vocabulary with size=<logits width>)"
        )
    return jnp.where(allowed(tables, grammar, state), logits, jnp.asarray(NEG_INF, logits.dtype))


def advance(tables: Tables, grammar: ArrayLike, state, tokens: ArrayLike) -> GrammarState:
    """States after ``tokens``; unconstrained rows and negative (padding) tokens keep theirs.

    A token the grammar did not allow leads to the dead state 0, where nothing is allowed.
    """
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    tokens = jnp.asarray(tokens, jnp.int32)
    g = _ids(tables, grammar)
    valid, target, depth, e, keys = _resolve(tables, g, st, tokens)
    new = GrammarState(jnp.where(valid, target, 0), st.stack, st.depth, jnp.where(valid[:, None], keys, st.keys))
    if e is not None:
        pos = jnp.arange(tables.depth)[None, :] - depth[:, None]  # slot j of the pushes goes to depth + j
        npush = e[:, 2]
        pushed = jnp.take_along_axis(e[:, 4:], jnp.clip(pos, 0, max(e.shape[1] - 5, 0)), axis=1) if e.shape[1] > 4 else 0
        stk = jnp.where((pos >= 0) & (pos < npush[:, None]), pushed, st.stack)
        new = new._replace(stack=jnp.where(valid[:, None], stk, st.stack), depth=jnp.where(valid, depth + npush, st.depth))
    keep = (grammar >= 0) & (tokens >= 0)
    return jax.tree.map(lambda a, b: jnp.where(keep.reshape(keep.shape + (1,) * (a.ndim - 1)), a, b), new, st)


def forced_token(tables: Tables, grammar: ArrayLike, state) -> Array:
    """``int32[B]``: the single allowed token of each row, ``-1`` when several (or unconstrained).

    A decode loop may emit it without sampling (the mask leaves it the only finite logit anyway).
    For recursive grammars ``-1`` also where the answer depends on the stack.
    """
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    f = tables.forced[_ids(tables, grammar), st.state].astype(jnp.int32)
    return jnp.where(grammar >= 0, f, -1)


def is_accepting(tables: Tables, grammar: ArrayLike, state, eos_id: int) -> Array:
    """``bool[B]``: whether the row's output so far is complete (EOS ``eos_id`` allowed)."""
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    after = advance(tables, grammar, st, jnp.full(grammar.shape, eos_id, jnp.int32)).state
    return (after != 0) & _frames_accept(tables, _ids(tables, grammar), st)
