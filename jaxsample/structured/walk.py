"""Walking a byte DFA over a vocabulary's token trie from every state at once (host side, numpy).

The result of a token from a state is the DFA state after its bytes. All states are walked
together, breadth first over the trie: the frontier holds walkers at ``(state, node)`` pairs, each
level expands the nodes' children with two gathers, drops dead pairs at once (a structural state
such as "after ``{``" stays alive on a handful of nodes) and records the tokens ending there.
Walkers reaching the same state at the same node continue as one, with the list of the origins
they stand for (whitespace variants before a value share everything after their first byte).

States that accept most bytes (inside strings, free-text patterns) would keep most of the ~170k
nodes of a 32k vocabulary alive, and counted strings (``maxLength``) have hundreds of them. They
walk a *quotient* trie instead (:mod:`~jaxsample.structured.trie`): under the coarsest byte
partition on which the states they lead to are constant (printable ASCII, ``"``, ``\\``, control
bytes and UTF-8 ranges, for a JSON string), bytes of a block are interchangeable and the quotient
trie has a few thousand nodes (:func:`plan` picks the states and partitions). A quotient walk
stays exact as long as the current state is constant on the blocks; at the first state that is
not (typically after the closing ``"``), the walker is expanded into the byte-trie nodes its
quotient node stands for and goes on byte by byte. A token's result is then recorded either for
its quotient terminal (shared by all tokens with the same block string) or for its own string,
never both.

>>> import numpy as np
>>> from jaxsample.structured.automaton import compile_expr, lit, alt
>>> from jaxsample.structured.trie import vocab_index
>>> from jaxsample.structured.vocab import Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "ab", "a", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> index = vocab_index(v)  # strings sorted: "a", "ab", "b"
>>> dfa = compile_expr(alt(lit("ab"), lit("b")))  # states: 1 start, 2 after "a", 3 accepting
>>> w = walk(dfa.delta, dfa.byte_class, index, plan(dfa.delta, dfa.byte_class, index))
>>> sorted(zip(*(x.tolist() for x in w.fine)))  # (origin, string, state)
[(1, 0, 2), (1, 1, 3), (1, 2, 3), (2, 2, 3)]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from jaxsample.structured.minimise import unique_rows
from jaxsample.structured.trie import Quotient, VocabIndex

#: A state walks a quotient trie when it is expected to keep this share of the trie alive ...
HEAVY_SHARE = 1 / 32
#: ... and at least this many nodes (small tries are walked byte by byte).
HEAVY_NODES = 512
#: A transition of such a state shapes its partition when it carries this share of its expected walk.
EDGE_SHARE = 1 / 16
#: Depth of the survival estimate (deeper levels are extrapolated).
SURVIVAL_DEPTH = 6
#: Partitions with more blocks than this are not used (their quotient would not be small).
MAX_BLOCKS = 16
#: Upper bound on (origin, node) pairs walked in one batch of origins (memory of the frontier).
PAIR_BUDGET = 1 << 23


class Mode(NamedTuple):
    """A quotient walk: the quotient trie and the states constant on its blocks."""

    quotient: Quotient
    compatible: np.ndarray  # bool[S]


class Plan(NamedTuple):
    """How each state is walked: ``mode[s] = 0`` byte by byte, ``p >= 1`` on ``modes[p - 1]``."""

    mode: np.ndarray  # int32[S]
    modes: tuple[Mode, ...]
    expected: np.ndarray  # float[S]: expected (origin, node) pairs of a byte-trie walk from each state


class Walk(NamedTuple):
    """Where tokens end: ``fine = (origin, string, state)``; ``coarse[p] = (origin, terminal, state)`` (int32 arrays).

    A token of a quotient terminal ends in ``state`` from ``origin`` for every token string ending
    at the terminal; a string is either covered by a terminal entry or by its own entries, never
    both, for a given origin. ``marks = (origin, node, marker)``: walkers stopped by a marker
    transition (see :func:`walk`) on the edge into byte-trie ``node``; the tokens below that node
    have no other entry for that origin.
    """

    fine: tuple[np.ndarray, np.ndarray, np.ndarray]
    coarse: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]
    marks: tuple[np.ndarray, np.ndarray, np.ndarray] = (np.zeros(0, np.int64),) * 3


def _blocks(sig: np.ndarray) -> np.ndarray:
    """Canonical partitions of the 256 bytes, one per row: each byte labelled by the first byte of its block.

    Args:
      sig: ``[R, 256]`` bytes with equal values in a row share a block.
    """
    order = np.argsort(sig, axis=1, kind="stable")
    s = np.take_along_axis(sig, order, axis=1)
    start = np.ones(sig.shape, bool)
    start[:, 1:] = s[:, 1:] != s[:, :-1]
    head = np.maximum.accumulate(np.where(start, np.arange(256), 0), axis=1)
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.take_along_axis(order, head, axis=1), axis=1)
    return out


def _compatible(delta: np.ndarray, byte_class: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``bool[S]``: states whose transition is constant on every block (``blocks``: first byte of the block)."""
    pairs = np.unique(np.stack([byte_class, byte_class[blocks]], 1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return (np.take(delta, pairs[:, 0], axis=1) == np.take(delta, pairs[:, 1], axis=1)).all(axis=1)


def _survival(delta: np.ndarray, class_weight: np.ndarray) -> np.ndarray:
    """``float[D + 1, S]``: chance that a random trie path of length ``d`` stays alive from each state.

    Bytes are drawn independently with their frequency on trie edges: a cheap stand-in for the
    share of the trie a state keeps alive, which is what its walk costs.
    """
    out = [np.ones(delta.shape[0])]
    out[0][0] = 0.0
    for _ in range(SURVIVAL_DEPTH):
        out.append(out[-1][delta] @ class_weight)
    return np.stack(out)


def plan(delta: np.ndarray, byte_class: np.ndarray, index: VocabIndex, marker_from: int | None = None) -> Plan:
    """Chooses the walk of every state.

    A state expected to keep a large part of the trie alive (string bodies, free-text patterns)
    walks a quotient trie under the coarsest partition on which the states its heavy transitions
    lead to are constant (the string body itself, and UTF-8 continuation states when the
    vocabulary has many multi-byte characters); its first byte is exact when the state itself is
    finer (an escape ``\\`` followed by the string body). Light transitions (the closing ``"``,
    an escape) do not shape the partition: the walk expands to bytes there. Other states walk the
    byte trie.

    Args:
      delta: ``int32[S, K]`` transitions per byte class, state 0 dead.
      byte_class: ``int[256]`` class of each byte.
      index: the vocabulary's tries.
      marker_from: values ``>= marker_from`` in ``delta`` are markers (they end a walk).
    """
    s_count, k = delta.shape
    mode = np.zeros(s_count, np.int32)
    class_weight = np.bincount(byte_class, weights=index.byte_weight, minlength=k)
    plain = delta if marker_from is None else np.where(delta >= marker_from, 0, delta)
    surv = _survival(plain, class_weight)
    t = index.trie
    per_depth = np.diff(t.depth_start)[1:].astype(np.float64)  # nodes at depth 1, 2, ...
    d = min(SURVIVAL_DEPTH, per_depth.size)
    expected = per_depth[:d] @ surv[1 : d + 1] + per_depth[d:].sum() * surv[d]
    seeds = np.flatnonzero(expected >= max(t.size * HEAVY_SHARE, HEAVY_NODES))
    seeds = seeds[seeds != 0]
    if seeds.size == 0:
        return Plan(mode, (), expected)
    targets = plain[seeds]  # [R, K]
    share = class_weight * surv[-2][targets]
    heavy = (share >= EDGE_SHARE * surv[-1][seeds][:, None]) & (targets != 0)
    # per seed: the partition on which all its heavy targets are constant (random linear signature)
    weight = np.random.default_rng(0x5EED).integers(1, 2**63, size=s_count, dtype=np.uint64) | np.uint64(1)
    row, col = np.nonzero(heavy)
    pair = np.unique(row.astype(np.int64) * s_count + targets[row, col])
    src, dst = pair // s_count, pair % s_count
    sig = np.zeros((seeds.size, k), np.uint64)
    with np.errstate(over="ignore"):
        np.add.at(sig, src, weight[dst][:, None] * delta[dst].astype(np.uint64))
    lonely = ~heavy.any(axis=1)
    sig[lonely] = delta[seeds[lonely]]
    blocks = _blocks(np.take(sig, byte_class, axis=1))
    own = np.take(delta[seeds], byte_class, axis=1)
    exact = ~(own == np.take_along_axis(own, blocks, axis=1)).all(axis=1)  # the seed splits a block
    first, inv = unique_rows(np.concatenate([blocks, exact[:, None]], 1))
    modes: list[Mode] = []
    for j, r in enumerate(first):
        labels = blocks[r].astype(np.int64)
        if np.unique(labels).size > MAX_BLOCKS:
            continue
        quotient = index.quotient(labels, int(exact[r]))
        compatible = _compatible(delta, byte_class, labels)
        members = seeds[inv == j]
        members = members[compatible[members] | exact[r]]
        if members.size:
            modes.append(Mode(quotient, compatible))
            mode[members] = len(modes)
    return Plan(mode, tuple(modes), expected)


class _Forest(NamedTuple):
    """The byte trie and the plan's quotient tries in one node space, with one transition table.

    Byte-trie nodes come first; quotient ``p`` occupies ``[base[p], base[p + 1])``. A label is a
    column of ``delta``: bytes ``0..255``, then each quotient's blocks.
    """

    label: np.ndarray
    first: np.ndarray
    count: np.ndarray
    term: np.ndarray  # string (byte trie) or terminal index (quotients), -1 if none
    mode: np.ndarray  # int32[N]: 0 for byte-trie nodes, p for quotient p
    members_start: np.ndarray  # quotient nodes: their byte-trie nodes are members[members_start[n]:...[n + 1]]
    members: np.ndarray
    base: np.ndarray
    delta: np.ndarray  # int32[S, 256 + blocks] flattened
    width: int
    compatible: np.ndarray  # bool[P + 1, S], row 0 all True
    exact_depth: np.ndarray  # int[P + 1]
    # unary paths (trie.Chains), node ids global: a walker whose state loops on a path's labels jumps
    chain_end: np.ndarray  # int64[N]
    hit_lo: np.ndarray  # int64[N]: tokens ending on the path are hit_nodes[hit_lo:hit_hi]
    hit_hi: np.ndarray
    hit_nodes: np.ndarray  # int32
    byte_mask: np.ndarray  # uint64[N_bytes, 4] bytes on each byte-trie path
    block_mask: np.ndarray  # uint64[N - N_bytes] blocks on each quotient path
    byte_loop: np.ndarray  # uint64[S, 4] bytes each state loops on
    block_loop: np.ndarray  # uint64[P + 1, S] blocks of quotient p each state loops on


def _loops(delta_cols: np.ndarray) -> np.ndarray:
    """``uint64[S, W]`` bit ``j``: state ``s`` loops on column ``j`` of ``delta_cols [S, J]``."""
    s_count, j = delta_cols.shape
    loops = delta_cols == np.arange(s_count)[:, None]
    loops[0] = False
    padded = np.zeros((s_count, -(-j // 64) * 64), bool)
    padded[:, :j] = loops
    return np.packbits(padded, axis=1, bitorder="little").view("<u8").astype(np.uint64)


_STRUCTURE_FIELDS = ("label", "first", "count", "term", "mode", "members_start", "members", "base", "width",
                     "exact_depth", "chain_end", "hit_lo", "hit_hi", "hit_nodes", "byte_mask", "block_mask")  # fmt: skip
_STRUCTURES: dict = {}  # (vocabulary index, quotients) -> the node arrays of their forest (the 4 most recent)


def _structure(index: VocabIndex, quotients: tuple) -> dict:
    """The node arrays of the forest of the byte trie and ``quotients``: they depend on the vocabulary
    and the partitions only, so they are built once and shared by every grammar using them."""
    key = (id(index), tuple(id(q) for q in quotients))
    hit = _STRUCTURES.get(key)
    if hit is not None and hit[0] is index and all(a is b for a, b in zip(hit[1], quotients)):
        return hit[2]
    t = index.trie
    labels, firsts, counts, terms, modes = [t.label], [t.first], [t.count], [t.term], [np.zeros(t.size, np.int32)]
    mstart, members, base = [np.zeros(t.size, np.int64)], [], [0, t.size]
    width = 256
    m_off = 0
    for k, q in enumerate(quotients, start=1):
        qt = q.trie
        b = base[-1]
        lab = qt.label.astype(np.int64)
        deep = np.arange(qt.size) >= qt.depth_start[min(q.exact_depth + 1, qt.depth_start.size - 1)]
        labels.append(np.where(deep, lab + width, lab))
        firsts.append(qt.first + b)
        counts.append(qt.count)
        terms.append(qt.term)
        modes.append(np.full(qt.size, k, np.int32))
        mstart.append(q.members_start[:-1] + m_off)
        members.append(q.members)
        m_off += q.members.size
        width += q.representative.size
        base.append(b + qt.size)
    mstart.append(np.array([m_off]))
    ch = [index.chains] + [q.chains for q in quotients]
    hit_off = np.cumsum([0] + [c.term_node.size for c in ch])
    out = dict(
        label=np.concatenate(labels).astype(np.int64), first=np.concatenate(firsts), count=np.concatenate(counts),
        term=np.concatenate(terms), mode=np.concatenate(modes), members_start=np.concatenate(mstart),
        members=np.concatenate(members) if members else np.zeros(0, np.int32), base=np.asarray(base), width=width,
        exact_depth=np.array([0] + [q.exact_depth for q in quotients]),
        chain_end=np.concatenate([c.end.astype(np.int64) + b for c, b in zip(ch, base)]),
        hit_lo=np.concatenate([c.hit_lo + o for c, o in zip(ch, hit_off)]),
        hit_hi=np.concatenate([c.hit_hi + o for c, o in zip(ch, hit_off)]),
        hit_nodes=np.concatenate([c.term_node.astype(np.int64) + b for c, b in zip(ch, base)]).astype(np.int32),
        byte_mask=ch[0].mask, block_mask=np.concatenate([c.mask[:, 0] for c in ch[1:]] or [np.zeros(0, np.uint64)]),
    )  # fmt: skip
    if len(_STRUCTURES) >= 4:
        _STRUCTURES.pop(next(iter(_STRUCTURES)))
    _STRUCTURES[key] = (index, quotients, out)
    return out


def _forest(delta: np.ndarray, byte_class: np.ndarray, index: VocabIndex, p: Plan) -> _Forest:
    quotients = tuple(m.quotient for m in p.modes)
    st = _structure(index, quotients)
    columns = [np.take(delta, byte_class, axis=1)] + [np.take(delta, byte_class[q.representative], axis=1) for q in quotients]
    compatible = np.stack([np.ones(delta.shape[0], bool)] + [m.compatible for m in p.modes])
    block_loop = np.zeros((len(quotients) + 1, delta.shape[0]), np.uint64)
    for k, c in enumerate(columns[1:], start=1):
        block_loop[k] = _loops(c)[:, 0]
    return _Forest(
        **{k: st[k] for k in _STRUCTURE_FIELDS},
        delta=np.ascontiguousarray(np.concatenate(columns, axis=1)).ravel(), compatible=compatible,
        byte_loop=_loops(columns[0]), block_loop=block_loop,
    )  # fmt: skip


def _estimate(delta: np.ndarray, byte_class: np.ndarray, p: Plan, marker_from: int | None = None) -> np.ndarray:
    """Pairs each origin is expected to walk: the survival estimate on the byte trie, and on a
    quotient the sizes of the subtries its live first letters open (small tries: a safe bound)."""
    est = p.expected.copy()
    for k, m in enumerate(p.modes, start=1):
        rows = np.flatnonzero(p.mode == k)
        live = np.take(delta[rows], byte_class, axis=1) != 0  # (markers count as live: a bound)
        first = live if m.quotient.exact_depth else np.take(live, m.quotient.representative, axis=1)
        est[rows] = first.astype(np.int64) @ m.quotient.trie.root_weight[: first.shape[1]]
    return est


def walk(
    delta: np.ndarray, byte_class: np.ndarray, index: VocabIndex, p: Plan, marker_from: int | None = None,
    trees: "_Forest | None" = None,
) -> Walk:
    """Where the tokens end from every state (see :class:`Walk`); origins are batched to bound memory.

    With ``marker_from``, a transition to a value ``>= marker_from`` stops the walker and is
    reported in ``Walk.marks`` (pushdown grammars: calls and returns, resolved by the caller).
    ``trees``: :func:`forest` of the same arguments, if the caller built it (to walk on with
    :func:`walk_from`).
    """
    forest = _forest(delta, byte_class, index, p) if trees is None else trees
    origins = np.arange(1, delta.shape[0], dtype=np.int64)
    batch = (np.cumsum(_estimate(delta, byte_class, p, marker_from)[origins]) // PAIR_BUDGET).astype(np.int64)
    hits = [_walk(forest, p, origins[batch == b], marker_from) for b in np.unique(batch)]
    # One copy of the (often tens of millions of) token ends: the batches' pieces joined once.
    o, n, q = _joined([piece for h in hits for piece in h[0]])
    mode = forest.mode[n].astype(np.int16 if len(p.modes) < 1 << 15 else np.int32)  # (int16: a radix sort)
    order = np.argsort(mode, kind="stable")  # the entries of each trie, in walk order
    bounds = np.concatenate([[0], np.cumsum(np.bincount(mode, minlength=len(p.modes) + 1))])
    parts = []
    for k in range(len(p.modes) + 1):
        sel = order[bounds[k] : bounds[k + 1]]
        parts.append((o[sel], forest.term[n[sel]], q[sel]))
    marks = _joined([piece for h in hits for piece in h[1]])
    return Walk(parts[0], tuple(parts[1:]), marks)


def _joined(pieces: list) -> tuple:
    """The ``(origin, node, state)`` triples of a list of pieces, each field concatenated."""
    return tuple(np.concatenate([x[i] for x in pieces]) if pieces else np.zeros(0, np.int64) for i in range(3))


def forest(delta: np.ndarray, byte_class: np.ndarray, index: VocabIndex, p: Plan) -> "_Forest":
    """The byte trie of ``index`` and the quotient tries of ``p`` with ``delta``'s transitions, for
    :func:`walk` and :func:`walk_from` (which walks the byte trie only)."""
    return _forest(delta, byte_class, index, p)


def walk_from(f: "_Forest", states: np.ndarray, nodes: np.ndarray, origins: np.ndarray, marker_from: int):
    """Walks the byte trie below ``nodes`` from ``states`` (the bytes of the nodes already read).

    Returns ``(hits, marks)``: ``hits = (origin, string, state)`` for the tokens ending at or below
    the start nodes, ``marks`` as :attr:`Walk.marks`.
    """
    p = Plan(np.zeros(int(np.max(states, initial=0)) + 1, np.int32), (), np.zeros(0))
    out, marks = _walk(f, p, np.asarray(origins, np.int64), marker_from, states, nodes)
    o, n, q = _joined(out)
    return (o, f.term[n], q), _joined(marks)


def _spans(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated CSR slices ``ptr[r]:ptr[r + 1]`` of ``rows``: ``(positions, lengths)``."""
    lo = ptr[rows]
    length = ptr[rows + 1] - lo
    offsets = np.cumsum(length) - length
    return np.repeat(lo - offsets, length) + np.arange(int(length.sum())), length


def _regroup(parent, q, n, ptr, origin, n_fine: int):
    """Walkers from ``(parent walker, state, node)`` items: one per distinct (state, node) pair.

    A walker's origins (CSR ``ptr``/``origin``) are the concatenated origins of its items' parents.
    Only byte-trie items are merged: quotient walkers (string bodies, counters) hardly ever meet,
    and sorting them would cost more than it saves.
    """
    single = ptr.size - 1 == origin.size  # every walker stands for one origin
    fine = np.flatnonzero(n < n_fine)
    if fine.size == 0 and single:  # quotient walkers only: nothing merges, origins follow their parents
        return q, n, np.arange(q.size + 1), origin[parent]
    key = q[fine].astype(np.int64) * n_fine + n[fine]  # (int64: states x nodes passes 2**31 at V=32k)
    by_key = np.argsort(key, kind="stable")
    key = key[by_key]
    order = np.concatenate([fine[by_key], np.flatnonzero(n >= n_fine)])
    new = np.ones(order.size, bool)
    new[1 : key.size] = key[1:] != key[:-1]
    start = np.flatnonzero(new)
    parent = parent[order]
    if single and start.size == order.size:  # no walkers met
        return q[order], n[order], np.arange(order.size + 1), origin[parent]
    pos, length = _spans(ptr, parent)
    size = np.add.reduceat(length, start) if start.size else start
    return q[order][start], n[order][start], np.concatenate([[0], np.cumsum(size)]), origin[pos]


def _walk(f: _Forest, p: Plan, origins: np.ndarray, marker_from=None, states=None, nodes=None):
    """Breadth-first walk of the forest from ``origins``: ``(token ends, marks)``, each a list of
    ``(origin, node, state)`` pieces (joined by the caller, :func:`_joined`).

    Walkers start at the root of each origin's trie in the origin's state, or at byte-trie
    ``nodes`` in ``states`` (tokens ending at a start node count). Walkers that reach the same
    state at the same node continue as one (whitespace variants before a string, say, share
    everything after their first byte); each keeps the list of its origins. Transitions to a
    marker (``>= marker_from``) stop the walker; they are reported on byte-trie nodes.
    """
    if nodes is None:
        n = f.base[p.mode[origins]].astype(np.int64)  # the root of each origin's trie
        q = origins.astype(np.int64)
    else:
        n, q = np.asarray(nodes, np.int64), np.asarray(states, np.int64)
    # The token ends (often tens of millions) are int32: half the memory of int64 to write and join.
    ptr, origin = np.arange(origins.size + 1), origins.astype(np.int32)
    n_fine = int(f.base[1])
    out, marks = [], []
    if nodes is not None:
        hit = np.flatnonzero(f.term[n] >= 0)
        out.append((origin[hit], n[hit].astype(np.int32), q[hit].astype(np.int32)))
    depth = 0
    while q.size:
        count = f.count[n]
        total = int(count.sum())
        if total == 0:
            break
        offsets = np.cumsum(count) - count
        child = np.repeat(f.first[n] - offsets, count) + np.arange(total)
        parent = np.repeat(np.arange(q.size), count)
        nxt = f.delta[np.repeat(q.astype(np.int64) * f.width, count) + f.label[child]]
        if marker_from is not None:
            mk = np.flatnonzero(nxt >= marker_from)
            if mk.size:
                marks.append(_marks(f, ptr, origin, parent[mk], child[mk], nxt[mk], n_fine))
            alive = np.flatnonzero((nxt != 0) & (nxt < marker_from))
        else:
            alive = np.flatnonzero(nxt != 0)
        q, n, ptr, origin = _regroup(parent[alive], nxt[alive], child[alive], ptr, origin, n_fine)
        hit = np.flatnonzero(f.term[n] >= 0)
        pos, length = _spans(ptr, hit)
        out.append((origin[pos], np.repeat(n[hit].astype(np.int32), length), np.repeat(q[hit].astype(np.int32), length)))
        mode = f.mode[n]
        ok = f.compatible[mode, q] | (depth + 1 < f.exact_depth[mode])
        if not ok.all():  # leave the quotient: continue on the byte-trie nodes this node stands for
            bad = np.flatnonzero(~ok)
            members, length = _spans(f.members_start, n[bad])
            parent = np.concatenate([np.flatnonzero(ok), np.repeat(bad, length)])
            nodes_ = np.concatenate([n[ok], f.members[members]])
            q, n, ptr, origin = _regroup(parent, q[parent], nodes_, ptr, origin, n_fine)
        n = _jump(f, q, n, ptr, origin, out, n_fine)
        depth += 1
    return out, marks


def _jump(f: _Forest, q, n, ptr, origin, out: list, n_fine: int) -> np.ndarray:
    """Moves walkers to the end of the unary path below their node when their state loops on all its
    labels (recording the tokens ending on the way, in that state); returns the new nodes."""
    cand = np.flatnonzero(f.chain_end[n] != n)
    if cand.size == 0:
        return n
    nn, qq = n[cand], q[cand]
    fine = nn < n_fine
    ok = np.zeros(cand.size, bool)
    if fine.any():
        ok[fine] = ~(f.byte_mask[nn[fine]] & ~f.byte_loop[qq[fine]]).any(axis=1)
    if not fine.all():
        k = ~fine
        ok[k] = (f.block_mask[nn[k] - n_fine] & ~f.block_loop[f.mode[nn[k]], qq[k]]) == 0
    jump = cand[ok]
    if jump.size == 0:
        return n
    lo, hi = f.hit_lo[n[jump]], f.hit_hi[n[jump]]
    pos, length = _spans(ptr, jump)  # the origins of each jumping walker
    w = np.repeat(np.arange(jump.size), length)
    cnt = (hi - lo)[w]
    offsets = np.cumsum(cnt) - cnt
    nodes = f.hit_nodes[np.repeat(lo[w] - offsets, cnt) + np.arange(int(cnt.sum()))]
    out.append((np.repeat(origin[pos], cnt), nodes, np.repeat(q[jump][w].astype(np.int32), cnt)))
    n = n.copy()
    n[jump] = f.chain_end[n[jump]]
    return n


def _marks(f: _Forest, ptr, origin, parent, child, marker, n_fine: int):
    """``(origin, byte-trie node, marker)`` of walkers stopped on the edges ``parent -> child``."""
    pos, length = _spans(ptr, parent)
    node, mark = np.repeat(child, length), np.repeat(marker, length)
    o = origin[pos]
    quotient = np.flatnonzero(node >= n_fine)
    if quotient.size:  # a quotient node stands for several byte-trie nodes
        members, count = _spans(f.members_start, node[quotient])
        fine = np.flatnonzero(node < n_fine)
        o = np.concatenate([o[fine], np.repeat(o[quotient], count)])
        mark = np.concatenate([mark[fine], np.repeat(mark[quotient], count)])
        node = np.concatenate([node[fine], f.members[members]])
    return o, node, mark
