"""HF's beam-search constraints (``PhrasalConstraint``, ``DisjunctiveConstraint``) and their
``ConstraintListState`` as fixed-shape integer state, for :mod:`jaxsample.decoding.constrained`.

Constraints compile on the host into tries (:func:`build_tries`; a phrase is a one-word trie). A
beam's :class:`ConstraintState` holds, per constraint, a status (pending / in progress / complete)
and a pending-list order key, plus the trie node of the constraint in progress. :func:`add` is
``ConstraintListState.add`` (HF's quirks included: a token that breaks the constraint in progress
sends it to the back of the pending list and is not tried on the others; a token advances only
the first pending constraint it fits); :func:`bank` is ``get_bank`` and :func:`advance` lists the
tokens ``advance()`` proposes, as a mask over the trie edges.

>>> tries = build_tries(as_constraints(force_words_ids=[[1, 2]]))
>>> st = add(tries, add(tries, init_state(tries, ()), jnp.asarray(1)), jnp.asarray(2))
>>> bool(completed(st)), int(bank(tries, st))
(True, 2)
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample._types import Array

_NEVER = np.iinfo(np.int32).max


class Constraint(NamedTuple):
    """One constraint: the output must contain one of ``words`` (one word: HF ``PhrasalConstraint``,
    several: ``DisjunctiveConstraint``)."""

    words: tuple[tuple[int, ...], ...]


def phrasal(token_ids: Sequence[int]) -> Constraint:
    """HF ``PhrasalConstraint(token_ids)``: the ordered tokens must appear."""
    return Constraint((_word(token_ids, "token_ids"),))


def disjunctive(nested_token_ids: Sequence[Sequence[int]]) -> Constraint:
    """HF ``DisjunctiveConstraint(nested_token_ids)``: one of the words must appear (no word may be a
    prefix of another)."""
    if isinstance(nested_token_ids, (str, bytes)) or not len(nested_token_ids):
        raise ValueError(f"`nested_token_ids` has to be a non-empty list, but is {nested_token_ids!r}")
    words = tuple(_word(w, "nested_token_ids") for w in nested_token_ids)
    unique = set(words)
    if any(a != b and b[: len(a)] == a for a in unique for b in unique) or len(unique) != len(words):
        raise ValueError(
            f"Each list in `nested_token_ids` can't be a complete subset of another list, but is {nested_token_ids}."
        )
    return Constraint(words)


def _word(ids, name: str) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes, int)) or not hasattr(ids, "__len__") or not len(ids):
        raise ValueError(f"`{name}` has to be a non-empty list of token ids, but is {ids!r}")
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in ids):
        raise ValueError(f"`{name}` has to be a list of non-negative integers, but is {ids!r}")
    return tuple(int(t) for t in ids)


def as_constraints(constraints=None, force_words_ids=None) -> tuple[Constraint, ...]:
    """HF's ``constraints + force_words_ids`` list as :class:`Constraint` s.

    ``constraints``: :class:`Constraint`, HF ``PhrasalConstraint`` / ``DisjunctiveConstraint``
    objects (read through their ``token_ids``), token-id lists (phrasal) or lists of lists
    (disjunctive). ``force_words_ids``: HF's format, a list whose items are a word (phrasal) or a
    list of words (disjunctive).
    """
    out = []
    for c in list(constraints or ()) + list(force_words_ids or ()):
        if isinstance(c, Constraint):
            out.append(c)
            continue
        ids = getattr(c, "token_ids", c)
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or not len(ids):
            raise ValueError(f"a constraint must be a non-empty list of token ids (or of such lists), got {c!r}")
        first = ids[0]
        out.append(disjunctive(ids) if hasattr(first, "__len__") else phrasal(ids))
    return tuple(out)


class Tries(NamedTuple):
    """Tries of all constraints (static, hashable). Node 0.. are shared ids; ``-1`` is no node."""

    root: tuple[int, ...]  # [C] root node of each constraint
    seqlen: tuple[int, ...]  # [C] longest word (HF ``seqlen``)
    depth: tuple[int, ...]  # [Nn] tokens from the root
    leaf: tuple[bool, ...]  # [Nn]
    parent: tuple[int, ...]  # [E] edges in insertion order
    token: tuple[int, ...]  # [E]
    child: tuple[int, ...]  # [E]
    owner: tuple[int, ...]  # [E] constraint of the edge
    rank: tuple[int, ...]  # [E] position among its siblings (HF dict order)
    from_root: tuple[bool, ...]  # [E]


def build_tries(constraints: tuple[Constraint, ...]) -> Tries:
    root, seqlen, depth, kids = [], [], [], []
    edges = []  # (parent, token, child, owner, rank, from_root)
    for ci, c in enumerate(constraints):
        r = len(depth)
        root.append(r)
        depth.append(0)
        kids.append({})
        seqlen.append(max(len(w) for w in c.words))
        for w in c.words:
            node = r
            for tok in w:
                if tok not in kids[node]:
                    kids.append({})
                    depth.append(depth[node] + 1)
                    kids[node][tok] = len(depth) - 1
                    edges.append((node, tok, len(depth) - 1, ci, len(kids[node]) - 1, node == r))
                node = kids[node][tok]
    leaf = tuple(not k for k in kids)
    cols = list(zip(*edges))
    return Tries(tuple(root), tuple(seqlen), tuple(depth), leaf, *(tuple(col) for col in cols))


class ConstraintState(NamedTuple):
    """HF ``ConstraintListState`` of one beam (any leading batch shape)."""

    status: Array  # int32[..., C]: 0 pending, 1 in progress, 2 complete
    node: Array  # int32[...]: trie node of the constraint in progress, -1 if none
    order: Array  # int32[..., C]: pending-list order (smaller first)


def init_state(tb: Tries, shape: tuple[int, ...]) -> ConstraintState:
    c = len(tb.root)
    return ConstraintState(
        jnp.zeros(shape + (c,), jnp.int32),
        jnp.full(shape, -1, jnp.int32),
        jnp.broadcast_to(jnp.arange(c, dtype=jnp.int32), shape + (c,)),
    )


def _arr(tb: Tries, name: str):
    return jnp.asarray(getattr(tb, name))


def _add_one(tb: Tries, st: ConstraintState, token: Array) -> ConstraintState:
    """``ConstraintListState.add(token)`` for one beam (vmapped by :func:`add`)."""
    status, node, order = st
    c_count = status.shape[-1]
    done = jnp.all(status == 2)
    in_prog = jnp.any(status == 1)
    c_in = jnp.argmax(status == 1)
    etok, eparent, echild, eowner = (_arr(tb, n) for n in ("token", "parent", "child", "owner"))
    hit_in = (eparent == node) & (etok == token)
    hit_pending = _arr(tb, "from_root") & (status[eowner] == 0) & (etok == token)
    e_pending = jnp.argmin(jnp.where(hit_pending, order[eowner], _NEVER))
    e_in = jnp.argmax(hit_in)
    found = jnp.where(in_prog, jnp.any(hit_in), jnp.any(hit_pending))
    edge = jnp.where(in_prog, e_in, e_pending)
    c = jnp.where(in_prog, c_in, eowner[edge])
    child = echild[edge]
    leaf = _arr(tb, "leaf")[child]
    apply = ~done & (in_prog | found)
    this = apply & (jnp.arange(c_count) == c)
    status = jnp.where(this, jnp.where(found, jnp.where(leaf, 2, 1), 0), status)
    order = jnp.where(this & ~found, jnp.max(order) + 1, order)
    node = jnp.where(apply, jnp.where(found & ~leaf, child, -1), node)
    return ConstraintState(status, node.astype(jnp.int32), order.astype(jnp.int32))


def add(tb: Tries, st: ConstraintState, token: Array) -> ConstraintState:
    """:func:`_add_one` over any leading shape of ``token``."""
    shape = token.shape
    flat = ConstraintState(st.status.reshape(-1, st.status.shape[-1]), st.node.reshape(-1),
                           st.order.reshape(-1, st.order.shape[-1]))
    out = jax.vmap(functools.partial(_add_one, tb))(flat, token.reshape(-1))
    return ConstraintState(out.status.reshape(shape + (-1,)), out.node.reshape(shape),
                           out.order.reshape(shape + (-1,)))


def completed(st: ConstraintState) -> Array:
    return jnp.all(st.status == 2, axis=-1)


def bank(tb: Tries, st: ConstraintState) -> Array:
    """``ConstraintListState.get_bank()``: ``complete * max_len + (max_len - remaining)``."""
    max_len = max(tb.seqlen)
    in_prog = jnp.any(st.status == 1, axis=-1)
    c_in = jnp.argmax(st.status == 1, axis=-1)
    remaining = _arr(tb, "seqlen")[c_in] - _arr(tb, "depth")[jnp.maximum(st.node, 0)]
    return jnp.sum(st.status == 2, axis=-1) * max_len + jnp.where(in_prog, max_len - remaining, 0)


def advance(tb: Tries, st: ConstraintState) -> tuple[Array, Array]:
    """Advance tokens of every state: ``(valid bool[..., E], order key int32[..., E])`` over the edges."""
    eparent, eowner, rank = _arr(tb, "parent"), _arr(tb, "owner"), _arr(tb, "rank")
    in_prog = jnp.any(st.status == 1, axis=-1)[..., None]
    pending = _arr(tb, "from_root") & (jnp.take(st.status, eowner, axis=-1) == 0)
    valid = ~completed(st)[..., None] & jnp.where(in_prog, eparent == st.node[..., None], pending)
    width = max(tb.rank) + 1
    key = jnp.where(in_prog, rank, jnp.take(st.order, eowner, axis=-1) * width + rank)
    return valid, key


def _shared_nodes_one(tb: Tries, node: Array) -> Array:
    """Node each proposal of an in-progress constraint at ``node`` starts from, ``int32[E]``.

    HF's ``DisjunctiveConstraint.copy(stateful=True)`` shares the word list between copies, so each
    proposal of a beam appends its token to the list the next proposal starts from: proposal ``r``
    (sibling rank) starts at the node reached by walking the earlier proposals' tokens from
    ``node`` while they fit the trie.
    """
    eparent, etok, echild, rank = (_arr(tb, n) for n in ("parent", "token", "child", "rank"))
    sibling = eparent == node
    start, cur = jnp.full(etok.shape, node), node
    for r in range(max(tb.rank) + 1):
        mine = sibling & (rank == r)
        start = jnp.where(mine, cur, start)
        tok = jnp.sum(jnp.where(mine, etok, 0))
        step = (eparent == cur) & (etok == tok) & jnp.any(mine)
        cur = jnp.where(jnp.any(step), jnp.sum(jnp.where(step, echild, 0)), cur)
    return start.astype(jnp.int32)


def proposal_states(tb: Tries, st: ConstraintState, token: Array) -> ConstraintState:
    """States of the proposals ``token int32[..., E]`` (the trie edges' tokens) of states ``st [...]``:
    :func:`add` from the node HF's shared word list has reached (see :func:`_shared_nodes_one`)."""
    flat = st.node.reshape(-1)
    start = jax.vmap(functools.partial(_shared_nodes_one, tb))(flat).reshape(st.node.shape + (-1,))
    in_prog = jnp.any(st.status == 1, axis=-1)[..., None]
    e = token.shape[-1]
    expand = lambda x: jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (e, x.shape[-1]))  # noqa: E731
    base = ConstraintState(expand(st.status), jnp.where(in_prog, start, st.node[..., None]), expand(st.order))
    return add(tb, base, token)
