"""DFA trimming and minimisation on transition tables, and exact row deduplication (host side, numpy).

Used for byte DFAs (after subset construction) and token-level DFAs (for vocabularies that cannot
spell every byte). Tables are ``int[S, K]`` with state 0 the absorbing dead state.

Minimisation is Moore's partition refinement made incremental: each state carries a hashed
signature of its successors' blocks; when a block splits, only the states that moved update the
signatures of their predecessors, and only blocks holding such predecessors are regrouped (the
largest part of a split block keeps its id, as in Hopcroft's algorithm). A long counter chain
(``maxLength: 200``) needs one round per link, and each round touches a handful of states instead
of the whole table (rounds of a few states regroup them in plain Python, cheaper than numpy calls
there). The result is checked exactly (every block's members agree on their successors' blocks); a
hash collision falls back to plain Moore rounds.

>>> import numpy as np
>>> delta = np.array([[0, 0], [2, 3], [0, 4], [0, 4], [0, 0]])  # "ab" or "bb": states 2 and 3 merge
>>> accept = np.array([False, False, False, False, True])
>>> d, a, s = minimise(delta, accept, 1)
>>> d.tolist(), a.tolist()
([[0, 0], [2, 2], [0, 3], [0, 0]], [False, False, False, True])
"""

from __future__ import annotations

import numpy as np

_SEED = 0x5EED


def _weights(n: int, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(_SEED + salt)
    return rng.integers(1, 2**63, size=n, dtype=np.uint64) | np.uint64(1)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the word (a plain weighted sum mod 2**64
    of sparse words collides: 2**63 times any odd weight is 2**63)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _row_hash(a: np.ndarray, salt: int) -> np.ndarray:
    """A random linear hash of each row, exact in float64 (so equal rows always hash equal).

    The weights are random integers small enough that no sum rounds; the product is a BLAS
    matrix-vector product (integer ``@`` in numpy is not, and is ~20x slower on wide tables).
    """
    if a.dtype == bool:  # 64 columns per word
        words = np.packbits(a, axis=1)
        pad = -words.shape[1] % 8
        a = np.pad(words, ((0, 0), (0, pad))).view(np.uint64) if pad else np.ascontiguousarray(words).view(np.uint64)
        with np.errstate(over="ignore"):
            return mix64(a + np.uint64(salt)) @ _weights(a.shape[1], salt)
    return _int_hash(a, salt, axis=1)


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a 2-D integer/bool array, in order of first occurrence.

    Rows are grouped by a random linear hash and the grouping is verified exactly (``np.unique``
    over whole rows sorts byte strings and is far slower on wide rows).

    Returns:
      ``(first, inverse)``: the index of the first row of each distinct row, and the distinct-row
      index of every row (``a[first][inverse] == a``).
    """
    a = np.asarray(a)
    if a.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if a.shape[1] == 0:
        return np.zeros(1, np.int64), np.zeros(a.shape[0], np.int64)
    return _group(lambda salt: _row_hash(a, salt), lambda rep: np.array_equal(a, a[rep]))


def unique_columns(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`unique_rows` of ``a.T`` for a 2-D integer table ``a [S, C]`` (a token table's class
    columns), without reading ``a`` transposed: the hash runs down the rows of the contiguous table
    and only the columns grouped with an earlier one are compared (a 35k x 1k table: 1.2 s -> 0.1 s)."""
    a = np.ascontiguousarray(a)
    if a.shape[1] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if a.shape[0] == 0:
        return np.zeros(1, np.int64), np.zeros(a.shape[1], np.int64)

    def same(rep):
        dup = np.flatnonzero(rep != np.arange(rep.size))
        return np.array_equal(np.take(a, rep[dup], axis=1), np.take(a, dup, axis=1))

    return _group(lambda salt: _int_hash(a, salt, axis=0), same)


def _group(hashes, same) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)`` of lines grouped by ``hashes(salt)``, retried with another salt until
    ``same(rep)`` (every line equals the first line of its group, ``rep``) confirms the grouping."""
    for salt in range(8):
        _, first, inv = np.unique(hashes(salt), return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        if same(first[inv]):
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            return first[order], rank[inv]
    raise RuntimeError("row hashing failed repeatedly")  # pragma: no cover


def _int_hash(a: np.ndarray, salt: int, axis: int) -> np.ndarray:
    """:func:`_row_hash` of the rows (``axis=1``) or the columns (``axis=0``) of an integer table."""
    n = a.shape[axis]
    lo = int(a.min())
    span = int(a.max()) - lo + 1
    bits = 52 - (span * n).bit_length()
    if bits < 16:  # values too large for an exact float hash: modular integer hash
        with np.errstate(over="ignore"):
            m, w = mix64(a.astype(np.uint64) + np.uint64(salt)), _weights(n, salt)
            return m @ w if axis == 1 else (m * w[:, None]).sum(axis=0)
    w = np.random.default_rng(_SEED + salt).integers(0, 1 << bits, size=n).astype(np.float64)
    v = a.astype(np.float64) - lo if lo else a.astype(np.float64)
    return v @ w if axis == 1 else w @ v


def predecessors(delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reverse edges: ``(start [S + 1], edge [E])``; edges into ``t > 0`` are ``edge[start[t]:start[t+1]]``,
    each ``source * K + class``, in that order. Edges into the dead state 0 (most of a table) are left
    out: no caller walks back from it."""
    flat = delta.ravel()
    edge = np.flatnonzero(flat)
    edge = edge[np.argsort(flat[edge], kind="stable")]
    start = np.searchsorted(flat[edge], np.arange(delta.shape[0] + 1))
    return start, edge


def _gather(start: np.ndarray, edge: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges into ``targets``: ``(edge ids, index into targets)``."""
    lo, hi = start[targets], start[targets + 1]
    count = hi - lo
    total = int(count.sum())
    offsets = np.cumsum(count) - count
    which = np.repeat(np.arange(targets.size), count)
    return edge[np.repeat(lo - offsets, count) + np.arange(total)], which


def coreachable(delta: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """``bool[S]``: the states from which a seed is reachable along ``delta``'s edges (0 is no edge,
    and never in the result). Breadth first backwards, one level per step; a level of one state (a
    counter chain's) reads its predecessors as one slice."""
    out = np.asarray(seeds, bool).copy()
    out[0] = False
    pstart, edge = predecessors(delta)
    source = edge // delta.shape[1]
    frontier = np.flatnonzero(out)
    while frontier.size:
        if frontier.size == 1:
            f = int(frontier[0])
            found = source[pstart[f] : pstart[f + 1]]
        else:
            found = _sources(pstart, source, frontier)
        found = found[~out[found]]
        out[found] = True
        frontier = found if found.size < 2 else np.unique(found)
    return out


def _sources(start: np.ndarray, source: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The source states of the edges into ``targets`` (``source``: :func:`predecessors`' edges' sources)."""
    lo = start[targets]
    count = start[targets + 1] - lo
    offsets = np.cumsum(count) - count
    return source[np.repeat(lo - offsets, count) + np.arange(int(count.sum()))]


def trim(
    delta: np.ndarray, accept: np.ndarray, start: int, reachable: bool = False
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Keeps states reachable from ``start`` that can reach acceptance; renumbers (0 = dead, 1 = start).

    ``reachable``: every state is known to be reachable (a subset construction's output).
    Returns ``None`` when ``start`` cannot reach an accepting state (the language is empty).
    """
    s_count = delta.shape[0]
    fwd = np.full(s_count, reachable)
    fwd[start] = True
    frontier = np.array([] if reachable else [start], np.int64)
    while frontier.size:
        nxt = np.unique(delta[frontier])
        nxt = nxt[~fwd[nxt]]
        fwd[nxt] = True
        frontier = nxt
    live = coreachable(delta, accept) & fwd
    if not live[start]:
        return None
    keep = np.concatenate([[0, start], np.flatnonzero(live & (np.arange(s_count) != start))])
    new_id = np.zeros(s_count, np.int32)
    new_id[keep] = np.arange(keep.size)
    new_id[~live] = 0
    new_delta = new_id[delta[keep]]
    new_delta[0] = 0
    return new_delta.astype(np.int32), accept[keep] & (np.arange(keep.size) > 0), 1


#: Rounds with at most this many dirty states regroup them in Python (fewer steps than numpy's ~30 calls).
SMALL_ROUND = 48


def _split(block, sig, block_sig, size, dirty):
    """Regroups the blocks of ``dirty`` states by signature; returns ``(moved states, old blocks, block_sig, size)``.

    Per block: states whose signature equals the block's keep it; if none does and every member
    changed, the largest group keeps it; every other group becomes a new block.
    """
    if dirty.size <= SMALL_ROUND:
        return _split_small(block, sig, block_sig, size, dirty)
    b, sg = block[dirty], sig[dirty]
    order = np.lexsort((sg, b))
    b, sg, states = b[order], sg[order], dirty[order]
    new_group = np.ones(b.size, bool)
    new_group[1:] = (b[1:] != b[:-1]) | (sg[1:] != sg[:-1])
    g_start = np.flatnonzero(new_group)
    g_size = np.diff(np.append(g_start, b.size))
    g_block, g_sig = b[g_start], sg[g_start]
    new_block = np.ones(g_block.size, bool)
    new_block[1:] = g_block[1:] != g_block[:-1]
    blk_first = np.flatnonzero(new_block)  # first group of each touched block
    blk_of_group = np.cumsum(new_block) - 1
    dirty_count = np.add.reduceat(g_size, blk_first)
    match = g_sig == block_sig[g_block]
    has_match = np.logical_or.reduceat(match, blk_first)
    all_dirty = dirty_count == size[g_block[blk_first]]
    # largest group of each block (first one on ties)
    big = np.maximum.reduceat(g_size, blk_first)
    is_big = g_size == big[blk_of_group]
    first_big = np.zeros(g_block.size, bool)
    idx = np.flatnonzero(is_big)
    first_big[idx[np.unique(blk_of_group[idx], return_index=True)[1]]] = True
    stays = np.where(has_match[blk_of_group], match, all_dirty[blk_of_group] & first_big)
    block_sig[g_block[stays]] = g_sig[stays]  # a whole block that changed together keeps its id
    moving = np.flatnonzero(~stays)
    if moving.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), block_sig, size
    fresh = size.size + np.arange(moving.size)
    block_sig = np.concatenate([block_sig, g_sig[moving]])
    size = np.concatenate([size, g_size[moving]])
    np.subtract.at(size, g_block[moving], g_size[moving])
    members = np.repeat(g_start[moving], g_size[moving]) + (
        np.arange(int(g_size[moving].sum())) - np.repeat(np.cumsum(g_size[moving]) - g_size[moving], g_size[moving])
    )
    moved = states[members]
    old = block[moved]
    block[moved] = np.repeat(fresh, g_size[moving])
    return moved, old, block_sig, size


def _split_small(block, sig, block_sig, size, dirty):
    """:func:`_split` of a few dirty states (the long tail of rounds along counter chains), in Python."""
    groups: dict[int, dict[int, list[int]]] = {}
    for b, g, x in zip(block[dirty].tolist(), sig[dirty].tolist(), dirty.tolist()):
        groups.setdefault(b, {}).setdefault(g, []).append(x)
    moved, old, fresh_sig, fresh_size = [], [], [], []
    for b, by_sig in groups.items():
        own = int(block_sig[b])
        if own not in by_sig and sum(map(len, by_sig.values())) == size[b]:  # all changed: the largest stays
            own = max(by_sig, key=lambda g: len(by_sig[g]))
            block_sig[b] = own
        for g, members in by_sig.items():
            if g != own:
                moved += members
                old += [b] * len(members)
                fresh_sig.append(g)
                fresh_size.append(len(members))
                size[b] -= len(members)
    if not moved:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), block_sig, size
    first = size.size
    block[moved] = np.repeat(np.arange(first, first + len(fresh_size)), fresh_size)
    block_sig = np.concatenate([block_sig, np.array(fresh_sig, np.uint64)])
    size = np.concatenate([size, np.array(fresh_size, np.int64)])
    return np.array(moved, np.int64), np.array(old, np.int64), block_sig, size


def minimise(delta: np.ndarray, accept: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Minimal equivalent DFA (incremental Moore refinement, see the module docstring).

    Args:
      delta: ``int[S, K]`` trimmed transition table with 0 absorbing (every other state live).
      accept: ``bool[S]``.
      start: initial state.

    Returns:
      ``(delta, accept, start)`` of the minimal DFA, numbered 0 = dead, 1 = start, the other
      blocks in order of their first state.
    """
    return _renumber(np.asarray(delta, np.int64), accept, start, partition(delta, accept))


def partition(delta: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """``int64[S]``: the coarsest stable partition (Myhill-Nerode blocks) of a trimmed table's states."""
    s_count, k = delta.shape
    delta = np.asarray(delta, np.int64)
    mult = _weights(k)
    block = np.where(accept, 2, 1).astype(np.int64)
    block[0] = 0
    size = np.bincount(block, minlength=3).astype(np.int64)
    with np.errstate(over="ignore"):
        sig = (block[delta].astype(np.uint64) * mult).sum(axis=1, dtype=np.uint64)
    block_sig = np.full(3, np.uint64(0xFFFFFFFFFFFFFFFF))  # matches no state: the first round regroups all
    pstart, edge = predecessors(delta)
    dirty = np.arange(s_count)
    while dirty.size:
        moved, old, block_sig, size = _split(block, sig, block_sig, size, dirty)
        if moved.size == 0:
            break
        e, which = _gather(pstart, edge, moved)
        diff = (block[moved] - old).astype(np.uint64)
        src = e // k
        with np.errstate(over="ignore"):
            np.add.at(sig, src, mult[e % k] * diff[which])
        dirty = np.unique(src)
    _, block = np.unique(block, return_inverse=True)
    block = block.reshape(-1)
    n_blocks = int(block.max()) + 1
    rep = np.zeros(n_blocks, np.int64)
    rep[block] = np.arange(s_count)
    if not np.array_equal(block[delta], block[delta[rep[block]]]):  # pragma: no cover - hash collision
        return _moore_blocks(delta, accept)
    return block


def _renumber(delta, accept, start, block):
    """Quotient DFA of a stable partition: dead block 0, start block 1, others by first state."""
    n_blocks = int(block.max()) + 1
    first = np.full(n_blocks, delta.shape[0], np.int64)
    np.minimum.at(first, block, np.arange(delta.shape[0]))
    rest = np.setdiff1d(np.arange(n_blocks), [block[0], block[start]])
    order = np.concatenate([[block[0], block[start]], rest[np.argsort(first[rest], kind="stable")]])
    renum = np.zeros(n_blocks, np.int32)
    renum[order] = np.arange(n_blocks)
    return renum[block[delta[first[order]]]].astype(np.int32), accept[first[order]], 1


def _moore(delta, accept, start):
    """Plain Moore rounds (the reference the incremental refinement is tested against)."""
    return _renumber(np.asarray(delta, np.int64), accept, start, _moore_blocks(delta, accept))


def _moore_blocks(delta, accept):
    block = np.where(accept, 2, 1)
    block[0] = 0
    while True:
        _, nb = np.unique(np.concatenate([block[:, None], block[delta]], 1), axis=0, return_inverse=True)
        nb = nb.reshape(-1)
        if len(np.unique(nb)) == len(np.unique(block)):
            break
        block = nb
    return np.unique(block, return_inverse=True)[1].reshape(-1)
