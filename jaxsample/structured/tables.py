"""Device tables for compiled grammars, bucketed shapes, and the jit-side mask / advance gathers.

Several :class:`~jaxsample.structured.tokens.TokenGrammar` are stacked along a leading grammar axis
``G`` and padded to power-of-two buckets of grammars ``G``, states ``S``, classes ``C`` and distinct
masks ``U`` (and, for recursive grammars, effects, stack-dependent tokens and stack rooms), so a new
schema (or a new mix of schemas) reuses the compiled decode loop unless it crosses a bucket. A row
selects its grammar with an id (``-1`` = unconstrained). Per step, for a row in state ``s`` of
grammar ``g``::

    words         = masks[g, mask_id[g, s, room]]        # one [B, V/32] row gather
    allowed[b, v] = (words[b, v // 32] >> (v % 32)) & 1  # elementwise unpack, fused into the where
    s'            = next[g, s, class_of[g, token]]       # a few scalar gathers (packed, below)

``next`` is sparse (4-7% of (state, class) pairs are live on JSONSchemaBench) and is stored packed:
the live targets of every state in one list ``targets`` (state ``s``'s from ``row_offset[s]``), and
per distinct live-class set ``p = row_pattern[s]`` the rank of each class in it (``slot[p, c]``,
``-1`` where dead)::

    k  = slot[g, row_pattern[g, s], c]
    s' = where(k >= 0, targets[g, row_offset[g, s] + k], 0)

(the dense ``[S, C]`` table, padded to buckets, held 2.6-5.8x the bytes of the unpadded one, itself
15-25x the live entries).

A row's state is a :class:`GrammarState`: the automaton state, and for recursive grammars a stack
of return states (``int32[B, D]``, ``D`` the stack capacity) with its depth. For regular grammars
``room`` is 0 and the stack is never touched. For recursive grammars (see
:mod:`~jaxsample.structured.effects`) ``room = min(limit - depth, R - 1)``; a ``next`` value from
``S`` on is an effect (a stay that pushes, or a return that pops and continues in the popped state
with another class, at most ``max_pops`` times per token); the few tokens that return and go on in
the caller are listed per state (a window of ``W`` per row) and resolved by those gathers; EOS also
needs every state on the stack to be able to end.

The mask is a packed bitmask rather than ``next[s, class_of[v]]`` because a per-element ``[B, V]``
gather is ~50x slower than the unpack on CPU (measured: 9 ms vs 0.16 ms at B=32, V=32k).
Padded states and classes are all-dead and unreachable; padded logits columns are class 0 (dead)
and never set in a mask.

>>> import numpy as np
>>> from jaxsample.structured import compile_regex, Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "a", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> t = stack([compile_regex("ab?", v)])
>>> s = initial_state(t, np.array([0, -1]))
>>> np.asarray(allowed(t, np.array([0, -1]), s)).tolist()
[[False, True, False], [True, True, True]]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample._types import NEG_INF, Array, ArrayLike
from jaxsample.structured.minimise import unique_rows
from jaxsample.structured.tokens import TokenGrammar

MIN_GRAMMARS = 1
MIN_STATES = 64
MIN_CLASSES = 32
MIN_MASKS = 16
MIN_TRANSITIONS = 256
# recursive grammars: stack capacity, stack-dependent tokens per row and in all, stack rooms, effects,
# pushes per token, returns per token (generous minimums: most grammars share one bucket)
MIN_DEPTH = 8
MIN_RETURNS = 32
MIN_POP_TOKENS = 1024
MIN_ROOMS = 4
MIN_EFFECTS = 256
MIN_PUSHES = 4
MIN_POPS = 2

_STATIC = ("depth", "max_pops", "window")


@dataclasses.dataclass(frozen=True)
class Tables:
    """Stacked grammar tables (a pytree of device arrays; pass it to ``jit`` as an argument).

    Attributes:
      row_pattern: ``int16|int32[G, S]`` each state's live-class set (0: none).
      slot: ``int16|int32[G, U, C]`` rank of class ``c`` among the live classes of a set, ``-1`` if dead.
      row_offset: ``int32[G, S]`` where each state's live targets start in ``targets``.
      targets: ``int16|int32[G, N]`` next state or effect (``>= S``) of every live (state, class), row-major.
      class_of: ``int16|int32[G, V]`` token class per logits column.
      forced: ``int32[G, S]`` the only allowed token of a state, ``-1`` if none, several, or it depends on the stack.
      start: ``int32[G]`` initial state of each grammar.
      mask_id: ``int32[G, S, R]`` bitmask index of each state per stack room (``R = 1`` without recursion).
      masks: ``uint32[G, U, ceil(V/32)]`` distinct allowed-token bitmasks.
      accept: ``bool[G, S]`` states where the current rule may end.
      need: ``int32[G, S]`` stack room needed to finish the current rule.
      effect: ``int32[G, E, 4 + P]`` effects (see :class:`~jaxsample.structured.tokens.PushdownTables`).
      pop_start, pop_count: ``int32[G, S]`` each state's stack-dependent tokens in ``pop_token``.
      pop_token: ``int32[G, T]``.
      bottom: ``int32[G]`` the state below every stack.
      limit: ``int32[G]`` stack limit (traced: changing it never recompiles; ``<= depth``).
      eos: ``int32[G, N]`` EOS ids (``-1`` padding).
      depth: static stack capacity ``D`` (0: no grammar recurses).
      max_pops: static bound on the frames one token returns from.
      window: static number of stack-dependent tokens examined per row and step.
    """

    row_pattern: Array
    slot: Array
    row_offset: Array
    targets: Array
    class_of: Array
    forced: Array
    start: Array
    mask_id: Array
    masks: Array
    accept: Array
    need: Array
    effect: Array
    pop_start: Array
    pop_count: Array
    pop_token: Array
    bottom: Array
    limit: Array
    eos: Array
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
    """

    state: Array
    stack: Array
    depth: Array


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _index_dtype(n: int):
    return np.int16 if n <= np.iinfo(np.int16).max else np.int32


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
) -> Tables:
    """Device tables for several grammars (same vocabulary), padded to bucketed shapes.

    Args:
      grammars: compiled grammars; their index is the grammar id rows refer to.
      num_grammars: fixed ``G`` (default: the power-of-two bucket of ``len(grammars)``).
      num_states: fixed ``S`` (default: the power-of-two bucket, at least ``MIN_STATES``).
      num_classes: fixed ``C`` (default: the power-of-two bucket, at least ``MIN_CLASSES``).
      num_masks: fixed ``U`` (default: the power-of-two bucket, at least ``MIN_MASKS``), for the
        distinct bitmasks and the distinct live-class sets of ``next`` alike.
      num_transitions: fixed ``N``, the live (state, class) pairs of a grammar (default: the
        power-of-two bucket, at least ``MIN_TRANSITIONS``).
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
    packed = [_packed_next(g.next) for g in grammars]
    u = _size(num_masks, max(max(g.masks.shape[0], p[1].shape[0]) for g, p in zip(grammars, packed)), MIN_MASKS,
              "num_masks", sizes)  # fmt: skip
    n_live = _size(num_transitions, max(p[3].size for p in packed), MIN_TRANSITIONS, "num_transitions", sizes)
    d = _size(num_depth, max(max(limits), 1), MIN_DEPTH, "num_depth", sizes) if rec else int(num_depth or 0)
    longest = max([int(p.pop_count.max(initial=0)) for p in rec], default=0)
    window = _size(num_returns, longest, MIN_RETURNS, "num_returns", sizes) if longest else int(num_returns or 0)
    n_pop = _size(num_pop_tokens, max([p.pop_token.size for p in rec], default=1), MIN_POP_TOKENS, "num_pop_tokens", sizes)
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
    n_eos = max(len(g.eos_ids) for g in grammars) or 1
    v = vocab.pop()
    row_pattern = np.zeros((n, s), _index_dtype(u))
    slot = np.full((n, u, c), -1, _index_dtype(c))
    row_offset = np.zeros((n, s), np.int32)
    targets = np.zeros((n, n_live), _index_dtype(s + n_eff))
    forced = np.full((n, s), -1, np.int32)
    class_of = np.zeros((n, v), _index_dtype(c))
    mask_id = np.zeros((n, s, rooms), np.int32)
    masks = np.zeros((n, u, -(-v // 32)), np.uint32)
    accept = np.zeros((n, s), bool)
    need = np.zeros((n, s), np.int32)
    effect = np.zeros((n, n_eff, width), np.int32)
    pop_start = np.zeros((n, s), np.int32)
    pop_count = np.zeros((n, s), np.int32)
    pop_token = np.zeros((n, n_pop), np.int32)
    bottom = np.zeros(n, np.int32)
    limit = np.zeros(n, np.int32)
    eos = np.full((n, n_eos), -1, np.int32)
    start = np.zeros(n, np.int32)  # padding grammars: start in the dead state
    for i, (g, p) in enumerate(zip(grammars, pds)):
        k = g.num_states
        pattern, slots, offset, live = packed[i]
        row_pattern[i, :k] = pattern
        slot[i, : slots.shape[0], : g.num_classes] = slots
        row_offset[i, :k] = offset
        targets[i, : live.size] = np.where(live >= k, live - k + s, live)  # effects follow the padded states
        forced[i, :k] = g.forced
        class_of[i] = g.class_of
        masks[i, : g.masks.shape[0]] = g.masks
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
        e = p.effect.copy()
        e[:, 1] = np.where(e[:, 1] >= 0, e[:, 1], -1)
        effect[i, : e.shape[0], : e.shape[1]] = e
        pop_start[i, :k] = p.pop_start
        pop_count[i, :k] = p.pop_count
        pop_token[i, : p.pop_token.size] = p.pop_token
        bottom[i] = p.bottom
        limit[i] = limits[i]
    arrays = [row_pattern, slot, row_offset, targets, class_of, forced, start, mask_id, masks, accept, need, effect, pop_start, pop_count, pop_token,
              bottom, limit, eos]  # fmt: skip
    return Tables(*jax.device_put(arrays), depth=d, max_pops=max_pops, window=window)  # one transfer call: ~4x faster


def _packed_next(nxt: np.ndarray):
    """``next`` packed: ``(row_pattern int32[S], slot int32[P, C], row_offset int32[S], targets int64[N])``.

    Pattern 0 is the dead state's (no live class); ``targets`` lists the live entries row by row.
    """
    live = nxt != 0
    first, pattern = unique_rows(live)  # the dead state (row 0) comes first
    patterns = live[first]
    slot = np.where(patterns, np.cumsum(patterns, axis=1) - 1, -1)
    count = live.sum(axis=1)
    offset = np.concatenate([[0], np.cumsum(count)[:-1]])
    return pattern.astype(np.int32), slot, offset.astype(np.int32), nxt[live].astype(np.int64)


def _next(tables: Tables, g: Array, q: Array, cls: Array) -> Array:
    """``next[g, q, cls]`` from the packed table (0 where dead); any matching shapes."""
    k = tables.slot[g, tables.row_pattern[g, q], cls].astype(jnp.int32)
    at = tables.row_offset[g, q] + jnp.maximum(k, 0)
    return jnp.where(k >= 0, tables.targets[g, at].astype(jnp.int32), 0)


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
    return GrammarState(s, jnp.zeros(s.shape + (tables.depth,), jnp.int32), jnp.zeros(s.shape, jnp.int32))


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


def _resolve(tables: Tables, g: Array, st: GrammarState, tokens: Array, lanes: bool = False):
    """Follows a token's returns: ``(valid, state, depth after pops, effect row or None)``.

    Shapes are ``[B]`` (one token per row) or ``[B, W]`` (``lanes``: several tokens per row).
    """
    v_size = tables.class_of.shape[-1]
    s_size = tables.forced.shape[1]
    gg = g[:, None] if lanes else g
    q = st.state[:, None] if lanes else st.state
    depth = jnp.broadcast_to(st.depth[:, None], tokens.shape) if lanes else st.depth
    cls = tables.class_of[gg, jnp.clip(tokens, 0, v_size - 1)].astype(jnp.int32)
    cls = jnp.where((tokens >= 0) & (tokens < v_size), cls, 0)
    v = _next(tables, gg, q, cls)
    if tables.max_pops == 0:
        return v != 0, v, depth, None
    n_eff = tables.effect.shape[1]
    fits = jnp.ones(v.shape, bool)  # calls entered and left before each return fit under the limit
    for _ in range(tables.max_pops):
        e = tables.effect[gg, jnp.clip(v - s_size, 0, n_eff - 1)]
        ret = (v >= s_size) & (e[..., 0] < 0)
        fits &= ~ret | (depth + e[..., 3] <= tables.limit[gg])
        at = jnp.clip(depth - 1, 0, max(tables.depth - 1, 0))
        top = jnp.take_along_axis(st.stack, at if lanes else at[:, None], axis=1)
        top = top if lanes else top[:, 0]
        popped = jnp.where(depth > 0, top, tables.bottom[gg])
        cls = jnp.where(ret & (e[..., 1] >= 0), e[..., 1], cls)
        v = jnp.where(ret, _next(tables, gg, popped, cls), v)
        depth = jnp.where(ret, jnp.maximum(depth - 1, 0), depth)
    eff = v >= s_size
    e = tables.effect[gg, jnp.clip(v - s_size, 0, n_eff - 1)]
    target = jnp.where(eff, e[..., 0], v)
    room = jnp.where(eff, e[..., 3], tables.need[gg, jnp.clip(v, 0, s_size - 1)])
    valid = fits & (v != 0) & (target > 0) & (depth + room <= tables.limit[gg])
    return valid, target, depth, jnp.where(eff[..., None], e, 0)


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
    words = tables.masks[g, tables.mask_id[g, st.state, room]]  # [B, W]
    rows = jnp.arange(words.shape[0])[:, None]
    v = tables.class_of.shape[-1]
    if tables.window:  # tokens that return and go on in the caller: resolve them on the stack, set their bits
        k = jnp.arange(tables.window)
        idx = jnp.clip(tables.pop_start[g, st.state][:, None] + k, 0, tables.pop_token.shape[1] - 1)
        tok = tables.pop_token[g[:, None], idx]
        valid = _resolve(tables, g, st, tok, lanes=True)[0] & (k < tables.pop_count[g, st.state][:, None])
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
    valid, target, depth, e = _resolve(tables, g, st, tokens)
    new = GrammarState(jnp.where(valid, target, 0), st.stack, st.depth)
    if e is not None:
        pos = jnp.arange(tables.depth)[None, :] - depth[:, None]  # slot j of the pushes goes to depth + j
        npush = e[:, 2]
        pushed = jnp.take_along_axis(e[:, 4:], jnp.clip(pos, 0, max(e.shape[1] - 5, 0)), axis=1) if e.shape[1] > 4 else 0
        stk = jnp.where((pos >= 0) & (pos < npush[:, None]), pushed, st.stack)
        new = GrammarState(new.state, jnp.where(valid[:, None], stk, st.stack), jnp.where(valid, depth + npush, st.depth))
    keep = (grammar >= 0) & (tokens >= 0)
    return jax.tree.map(lambda a, b: jnp.where(keep.reshape(keep.shape + (1,) * (a.ndim - 1)), a, b), new, st)


def forced_token(tables: Tables, grammar: ArrayLike, state) -> Array:
    """``int32[B]``: the single allowed token of each row, ``-1`` when several (or unconstrained).

    A decode loop may emit it without sampling (the mask leaves it the only finite logit anyway).
    For recursive grammars ``-1`` also where the answer depends on the stack.
    """
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    f = tables.forced[_ids(tables, grammar), st.state]
    return jnp.where(grammar >= 0, f, -1)


def is_accepting(tables: Tables, grammar: ArrayLike, state, eos_id: int) -> Array:
    """``bool[B]``: whether the row's output so far is complete (EOS ``eos_id`` allowed)."""
    grammar = jnp.asarray(grammar, jnp.int32)
    st = _as_state(tables, state)
    after = advance(tables, grammar, st, jnp.full(grammar.shape, eos_id, jnp.int32)).state
    return (after != 0) & _frames_accept(tables, _ids(tables, grammar), st)
