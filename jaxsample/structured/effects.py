"""Token tables of a recursive grammar: what each token does to a row's state and stack (host side).

On a pushdown automaton (:mod:`~jaxsample.structured.pushdown`) a token's bytes, read from a
state, end in one of two ways:

* **stay**: the row ends in a state of the current rule (or of rules the token entered), with the
  return states the token pushed (most tokens push nothing; ``[{`` after a value position pushes one);
* **return**: the token finishes the current rule; the popped state reads the token's remaining
  bytes (the *rest*), which may return again (``}]`` closing two levels).

Calls pushed and popped inside one token never reach the stack, but count for the depth limit
(its *peak*: ``[1]`` nests one level deeper for a moment). Results are found with the
vocabulary trie walk of :mod:`~jaxsample.structured.walk`: a call or a return stops a walker (a
*marker*); walkers entering a rule continue below the same trie node with the return state on a
local (hash-consed, persistent) stack, returns pop it, and a return with an empty local stack is
the token's: every token below that node returns with the rest of its bytes. Rests are read from
every state a stack can hold. Tokens and rests are grouped into classes by identical results, as
for regular grammars; rest classes become extra columns of ``next`` (no token has them), so the
device resolves a return with the same table lookups: ``next[popped, rest class]``.

Masks: a token whose result does not depend on the stack (a stay, or a return with nothing left)
is in the state's bitmask, one per stack room (tokens whose result needs more room than is left
are not); a token that returns with a rest depends on the popped states and is listed per state
(``pop_token``): the device resolves those few per step. EOS is allowed when the state and every
state on the stack may end.

>>> from jaxsample.structured.automaton import Call, alt, lit, seq
>>> from jaxsample.structured.pushdown import Grammar, compile_grammar
>>> from jaxsample.structured.vocab import Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "(", ")", "x", "))"], kind="raw", special_ids=[0], eos_ids=[0])
>>> g = build(compile_grammar(Grammar({"r": alt(lit("x"), seq(lit("("), Call("r"), lit(")")))}, "r")), v)
>>> g.pushdown.max_pops, sorted(v.token_bytes[t] for t in g.pushdown.pop_token)
(2, [b'))'])
"""

from __future__ import annotations

import numpy as np

from jaxsample.structured import trie, walk
from jaxsample.structured.automaton import GrammarError, KeyOp, compose
from jaxsample.structured.minimise import unique_columns, unique_rows
from jaxsample.structured.pushdown import Pushdown
from jaxsample.structured.tokens import PushdownTables, TokenGrammar, _classes, _forced, _pack
from jaxsample.structured.vocab import Vocabulary

SELF = -1  # a return whose rest is the token itself: the popped state reads the same class


class _Stacks:
    """Hash-consed persistent stacks: id 0 is empty, id ``i`` is ``(top, below)``."""

    def __init__(self):
        self.items = [(0, 0)]
        self.depth = [0]
        self.ids: dict = {}

    def push(self, sid: int, q: int) -> int:
        key = (q, sid)
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.items)
            self.items.append(key)
            self.depth.append(self.depth[sid] + 1)
        return got

    def pop(self, sid: int) -> tuple[int, int]:
        return self.items[sid]

    def frames(self, sid: int) -> tuple:
        out = []
        while sid:
            q, sid = self.items[sid]
            out.append(q)
        return tuple(reversed(out))


class _Effects:
    """Results as ``next`` values: a stay without pushes (nor a transient deeper call, nor a key op)
    is its state; others are ``base + index``. ``peak``: the most frames above the start the token
    held at once; ``op``: the index in ``ops`` of the key ops the token applies (0: none)."""

    def __init__(self, base: int, ops: list | None = None):
        self.base = base
        self.keys: list = []
        self.ids: dict = {}
        self.ops = [KeyOp()] if ops is None else ops
        self.op_ids = {o: i for i, o in enumerate(self.ops)}

    def op(self, op: KeyOp) -> int:
        got = self.op_ids.get(op)
        if got is None:
            got = self.op_ids[op] = len(self.ops)
            self.ops.append(op)
        return got

    def then(self, k: int, op: KeyOp) -> int | None:
        """The index of op ``k`` followed by ``op`` (``None``: no register passes both)."""
        both = compose(self.ops[k], op)
        return None if both is None else self.op(both)

    def add(self, key) -> int:
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.keys)
            self.keys.append(key)
        return self.base + got

    def stay(self, q: int, pushes: tuple, peak: int = 0, op: int = 0) -> int:
        return self.add(("stay", q, pushes, max(peak, len(pushes)), op)) if pushes or peak or op else q

    def ret(self, rest: int, peak: int = 0, op: int = 0) -> int:
        return self.add(("ret", rest, peak, op))


def build(pd: Pushdown, vocab: Vocabulary) -> TokenGrammar:
    """Token tables of a pushdown automaton for a vocabulary (see the module docstring).

    Raises:
      GrammarError: if the vocabulary has no single-byte token for a byte the grammar uses (the
        completion guarantee at the depth limit relies on spelling any byte).
    """
    index = trie.vocab_index(vocab)
    used = ((pd.delta != 0) | (pd.enter != 0)).any(axis=0)[pd.byte_class]
    if not np.all(index.single_byte[used]):
        missing = bytes(np.flatnonzero(used & ~index.single_byte)[:8].tolist())
        raise GrammarError(f"recursive grammars need a token for every byte they use; missing {missing!r}")
    q_count = pd.num_states
    closed = pd.closed
    calls_q, calls_b = np.nonzero(pd.enter)
    ops_q, ops_b = np.nonzero(pd.op) if pd.op is not None else (np.zeros(0, np.int64),) * 2
    marker = np.zeros(pd.enter.shape, np.int64)
    marker[calls_q, calls_b] = q_count + np.arange(calls_q.size)
    marker[ops_q, ops_b] = q_count + calls_q.size + np.arange(ops_q.size)
    ret_marker = q_count + calls_q.size + ops_q.size
    dw = np.where(pd.delta != 0, pd.delta, np.where(pd.enter != 0, marker, np.where(pd.accept[:, None], ret_marker, 0)))
    dw[ops_q, ops_b] = marker[ops_q, ops_b]  # a byte read with a key op stops the walker too
    dw[pd.bottom] = 0
    plan = walk.plan(dw, pd.byte_class, index, marker_from=q_count)
    trees = walk.forest(dw, pd.byte_class, index, plan)
    w = walk.walk(dw, pd.byte_class, index, plan, marker_from=q_count, trees=trees)
    fx, stacks = _Effects(q_count), _Stacks()
    pop_empty = fx.ret(0)

    def value(q: np.ndarray) -> np.ndarray:
        return np.where(closed[q], pop_empty, q)

    fine = [(w.fine[0], w.fine[1], value(w.fine[2]))]
    coarse = tuple((o, t, value(q)) for o, t, q in w.coarse)
    rests = _Rests(index)
    more, exits = _resolve_marks(pd, index, trees, w.marks, fx, stacks, ret_marker, (calls_q, calls_b), (ops_q, ops_b))
    fine += more
    fine.append(_returns(index, exits, rests, fx))
    rest_value, rest_class = _rest_results(pd, rests, fx)
    # canonical effects: returns name rest classes, not rest strings
    final = _Effects(q_count, fx.ops)
    remap = np.array([final.add(("ret", SELF if k[1] == SELF else rest_class[k[1]], *k[2:])) if k[0] == "ret"
                      else final.add(k) for k in fx.keys] or [0], np.int64)  # fmt: skip

    def canon(v):
        v = np.asarray(v, np.int64)
        return np.where(v >= q_count, remap[np.maximum(v - q_count, 0)], v)

    fine = tuple(np.concatenate([np.asarray(f[i], np.int64) for f in fine]) for i in range(2)) + (
        canon(np.concatenate([np.asarray(f[2], np.int64) for f in fine])),
    )
    coarse = tuple((o, t, canon(v)) for o, t, v in coarse)
    string_class, cols = _classes(walk.Walk(fine, coarse), q_count, index, plan)
    n_rest = max(rest_class.values()) + 1
    rest_cols = np.zeros((q_count, n_rest), np.int32)  # int32 tables: half the memory traffic of int64
    rest_cols[:, 0] = np.arange(q_count)  # the empty rest: stay in the popped state
    firsts = {cls: rid for rid, cls in rest_class.items() if cls}  # the rests of a class have equal results
    if firsts:
        cls = np.fromiter(firsts, np.int64)
        rest_cols[np.ix_(pd.returns, cls)] = canon(np.stack([rest_value[firsts[c]] for c in cls.tolist()], axis=1))
    eos_col = np.where(pd.accept, np.arange(q_count, dtype=np.int32), 0)
    table = np.concatenate([np.zeros((q_count, 1), np.int32), eos_col[:, None], cols, rest_cols], axis=1)
    first, col_class = unique_columns(table)
    nxt = np.take(table, first, axis=1)
    class_of = np.zeros(vocab.size, np.int32)
    token_class = string_class[index.string_of_token]
    class_of[index.token_ids] = col_class[np.where(token_class >= 0, token_class + 2, 0)]
    class_of[list(vocab.eos_ids)] = col_class[1]
    rest_col = col_class[2 + cols.shape[1] + np.arange(n_rest)]
    effect, effect_op = _effect_table(final.keys, rest_col, pd.need)
    return _tables(pd, nxt, class_of, effect, effect_op, fx.ops)._replace(eos_ids=tuple(vocab.eos_ids))


class _Rests:
    """The remainders of returning tokens, by suffix id of the vocabulary (id 0: the empty rest)."""

    def __init__(self, index: trie.VocabIndex):
        self.flat, self.offset, self.suffix, self.first = index.suffixes
        self.ends = self.offset + index.lengths
        self.ids: dict[int, int] = {-1: 0}
        self.positions, self.lengths = [-1], [0]

    def at(self, position: int) -> int:
        """Id of the suffix starting at a flat byte position."""
        sid = int(self.suffix[position])
        got = self.ids.get(sid)
        if got is None:
            got = self.ids[sid] = len(self.positions)
            p = int(self.first[sid])
            self.positions.append(p)
            self.lengths.append(int(self.ends[np.searchsorted(self.offset, p, side="right") - 1] - p))
        return got

    def data(self, rid: int) -> list:
        p = self.positions[rid]
        return self.flat[p : p + self.lengths[rid]].tolist() if p >= 0 else []

    def length(self, rid: int) -> int:
        return self.lengths[rid]


def _returns(index, exits: list, rests: _Rests, fx: _Effects):
    """Entries ``(origin, string, value)`` of the tokens that return where a walker stopped: every token
    below the node returns, and its bytes from the one that could not be read go to the popped state."""
    if not exits:
        return tuple(np.zeros(0, np.int64) for _ in range(3))
    lo, hi, depth = index.subtree
    o, node, peak, op = (np.asarray(x, np.int64) for x in zip(*exits))
    size = hi[node] - lo[node]
    offsets = np.cumsum(size) - size
    strings = np.repeat(lo[node] - offsets, size) + np.arange(int(size.sum()))
    k = np.repeat(depth[node] - 1, size)
    peaks = np.repeat(peak, size)
    ops = np.repeat(op, size)
    rest = np.where(k > 0, 0, -1)  # -1: the token itself (SELF)
    later = np.flatnonzero(k > 0)  # a rest after some bytes: a suffix of the token
    suffix = rests.suffix[rests.offset[strings[later]] + k[later]]
    uniq, inv = np.unique(suffix, return_inverse=True)
    local = np.array([rests.at(int(rests.first[sid])) for sid in uniq.tolist()], np.int64)
    rest[later] = local[inv.reshape(-1)]
    span, n_ops = int(peaks.max()) + 1, int(ops.max()) + 1
    pairs, which = np.unique(((rest + 1) * span + peaks) * n_ops + ops, return_inverse=True)
    r, p, k = pairs // n_ops // span - 1, pairs // n_ops % span, pairs % n_ops
    vals = np.array([fx.ret(SELF if a < 0 else int(a), int(b), int(c)) for a, b, c in zip(r, p, k)], np.int64)
    return np.repeat(o, size), strings, vals[which.reshape(-1)]


def _resolve_marks(pd: Pushdown, index, trees, marks, fx, stacks, ret_marker, calls, key_ops):
    """Follows walkers stopped at calls, key ops and returns: ``(entries (origin, string, value), token
    returns (origin, node, peak, op))``.

    Each round walks, in one batch, every walker that entered a rule, read a byte with a key op or
    returned into a local caller, below the node where it stopped. A walker whose key ops no
    register passes stops: the tokens below are never allowed from its origin.
    """
    q_count = pd.num_states
    calls_q, calls_b = calls
    ops_q, ops_b = key_ops
    closed = pd.closed
    label = index.trie.label
    pairs: dict[tuple[int, int, int], int] = {}
    pair_list: list[tuple[int, int, int]] = []

    def pair(o, sid, peak, op):
        key = (o, sid, max(peak, stacks.depth[sid]), op)
        got = pairs.get(key)
        if got is None:
            got = pairs[key] = len(pair_list)
            pair_list.append(key)
        return got

    entries, exits = [], []
    o_arr, n_arr, m_arr = (np.asarray(x, np.int64) for x in marks)
    owners = [(int(o), 0, 0, 0) for o in o_arr.tolist()]
    while o_arr.size:
        states, nodes, who = [], [], []
        for (o, sid, peak, op), node, m in zip(owners, n_arr.tolist(), m_arr.tolist()):
            c = int(pd.byte_class[label[node]])
            if m < q_count + calls_q.size:  # enter a rule: push its return state(s)
                i = m - q_count
                q, b = int(calls_q[i]), int(calls_b[i])
                for r in pd.pushes[pd.enter_push[q, b]]:
                    sid = stacks.push(sid, r)
                states.append(int(pd.enter[q, b]))
                nodes.append(node)
                who.append(pair(o, sid, peak, op))
                continue
            if m < ret_marker:  # a byte read with a key op
                i = m - q_count - calls_q.size
                q, b = int(ops_q[i]), int(ops_b[i])
                op = fx.then(op, pd.ops[pd.op[q, b]])
                if op is not None:
                    states.append(int(pd.delta[q, b]))
                    nodes.append(node)
                    who.append(pair(o, sid, peak, op))
                continue
            while True:  # return: the caller on the local stack reads the byte, or the token returns
                if sid == 0:
                    exits.append((o, node, peak, op))
                    break
                r, sid = stacks.pop(sid)
                if pd.delta[r, c] or pd.enter[r, c]:
                    if not pd.delta[r, c]:
                        for x in pd.pushes[pd.enter_push[r, c]]:
                            sid = stacks.push(sid, x)
                    elif pd.op is not None and pd.op[r, c]:
                        op = fx.then(op, pd.ops[pd.op[r, c]])
                        if op is None:
                            break
                    states.append(int(pd.delta[r, c] or pd.enter[r, c]))
                    nodes.append(node)
                    who.append(pair(o, sid, peak, op))
                    break
                if not pd.accept[r]:
                    break
        if not states:
            break
        (po, s, q), (o_arr, n_arr, m_arr) = walk.walk_from(trees, np.asarray(states), np.asarray(nodes), np.asarray(who), q_count)
        combos, which = np.unique(po * q_count + q, return_inverse=True)  # one result per (walker, state)
        vals, origin = [], []
        for p_, q_ in zip((combos // q_count).tolist(), (combos % q_count).tolist()):
            o, sid, peak, op = pair_list[p_]
            while closed[q_] and sid:
                q_, sid = stacks.pop(sid)
            vals.append(fx.ret(0, peak, op) if closed[q_] else fx.stay(q_, stacks.frames(sid), peak, op))
            origin.append(o)
        which = which.reshape(-1)
        entries.append((np.asarray(origin, np.int64)[which], s, np.asarray(vals, np.int64)[which]))
        owners = [pair_list[p_] for p_ in o_arr.tolist()]
    return entries, exits


def _run(pd: Pushdown, q: int, rests: _Rests, rid: int, fx: _Effects):
    """The result of reading rest ``rid`` from ``q`` with an empty stack (a rest read by a popped state)."""
    closed, stack, peak, op = pd.closed, [], 0, 0
    start = rests.positions[rid]
    for i, byte in enumerate(rests.data(rid)):
        c = pd.byte_class[byte]
        while True:
            if pd.delta[q, c]:
                if pd.op is not None and pd.op[q, c]:
                    op = fx.then(op, pd.ops[pd.op[q, c]])
                    if op is None:
                        return 0
                q = int(pd.delta[q, c])
                break
            if pd.enter[q, c]:
                stack.extend(pd.pushes[pd.enter_push[q, c]])
                q = int(pd.enter[q, c])
                peak = max(peak, len(stack))
                break
            if not pd.accept[q] or q == pd.bottom:
                return 0
            if not stack:
                return fx.ret(rests.at(start + i), peak, op)
            q = stack.pop()
    while closed[q] and stack:
        q = stack.pop()
    return fx.ret(0, peak, op) if closed[q] else fx.stay(q, tuple(stack), peak, op)


def _rest_results(pd: Pushdown, rests: _Rests, fx: _Effects):
    """Results of every rest from every state a stack can hold, and the rests' classes (0: empty).

    Shorter rests are classified first: a rest's results name the classes of the (shorter) rests
    it returns with, or itself (a return before reading a byte: :data:`SELF`).
    """
    value = {}
    todo = list(range(1, len(rests.positions)))
    while todo:
        rid = todo.pop()
        before = len(rests.positions)
        value[rid] = np.array([_run(pd, int(r), rests, rid, fx) for r in pd.returns.tolist()], np.int64)
        todo += list(range(before, len(rests.positions)))
    cls: dict[int, int] = {0: 0}
    keys: dict[tuple, int] = {}
    for rid in sorted(value, key=rests.length):
        key = []
        for v in value[rid].tolist():
            kind = fx.keys[v - fx.base] if v >= fx.base else None
            if kind is not None and kind[0] == "ret":
                key.append(("ret", SELF if kind[1] == rid else cls[kind[1]], *kind[2:]))
            else:
                key.append(kind or v)
        cls[rid] = keys.setdefault(tuple(key), len(keys) + 1)
    return value, cls


def _effect_table(keys, rest_col, need) -> tuple[np.ndarray, np.ndarray]:
    """``(int32[E, 4 + P], int32[E])``: target (-1: return), rest class column (-1: own), pushes, room
    needed (for a return: the peak before it), pushed states; and each effect's key op."""
    width = max([len(k[2]) for k in keys if k[0] == "stay"], default=0)
    out = np.zeros((max(len(keys), 1), 4 + width), np.int32)
    op = np.zeros(out.shape[0], np.int32)
    for i, k in enumerate(keys):
        if k[0] == "stay":
            _, q, pushes, peak, op[i] = k
            room = max([peak, len(pushes) + int(need[q])] + [j + int(need[r]) for j, r in enumerate(pushes)])
            out[i, :4] = (q, -1, len(pushes), room)
            out[i, 4 : 4 + len(pushes)] = pushes
        else:
            out[i, :4] = (-1, -1 if k[1] == SELF else rest_col[k[1]], 0, k[2])
            op[i] = k[3]
    return out, op


def _tables(pd: Pushdown, nxt: np.ndarray, class_of: np.ndarray, effect: np.ndarray, effect_op: np.ndarray,
            ops: list) -> TokenGrammar:  # fmt: skip
    """Masks per stack room, the per-state lists of stack- (and key-register-) dependent tokens, forced tokens.

    The effects are few among the ``[Q, C]`` entries (8.6k of 35M in a 35k-state schema), so they
    are read at their own positions; the dense passes are the ones every entry needs.
    """
    q_count, c_count = nxt.shape
    big = np.iinfo(np.int32).max
    eq, ec = np.nonzero(nxt >= q_count)  # the (state, class) entries that are effects
    fx = effect[nxt[eq, ec] - q_count]
    ret = fx[:, 0] < 0
    rest = fx[:, 1]
    # A return whose rest consumes nothing (its class keeps every state where it is) does not
    # depend on the stack beyond ending the rule.
    cols = np.unique(rest[ret & (rest >= 0)])
    empty = cols[(nxt[:, cols] == np.arange(q_count)[:, None]).all(axis=0)]
    ret_empty = ret & np.isin(rest, empty)
    need = pd.need[np.minimum(nxt, q_count - 1)]  # an effect: the room it needs (a return: its peak)
    need[eq, ec] = fx[:, 3]
    resting = ~pd.closed | (np.arange(q_count) == pd.bottom)  # a row never rests where its rule must end
    base = (nxt != 0) & resting[:, None]
    base[eq[ret & ~ret_empty], ec[ret & ~ret_empty]] = False
    tests = np.array([bool(o.absent or o.present or o.either) for o in ops])[effect_op[nxt[eq, ec] - q_count]] & resting[eq]
    ends = None  # the entries ending where a key must still be written (a dense pass only if there are such states)
    if any(pd.key_need):
        needs = np.array(pd.key_need, object) != 0
        ends = needs[np.where(nxt < q_count, nxt, 0)] & resting[:, None]
        ends[eq, ec] = needs[np.maximum(fx[:, 0], 0)] & (fx[:, 0] >= 0) & resting[eq]
        tests |= ends[eq, ec]
        base &= ~ends
    base[eq[tests], ec[tests]] = False  # a key op's test or a key still needed: listed, resolved on the row's register
    need = np.where(base, need, big)
    finite = need[base & (need < big)]
    rooms = int(finite.max()) + 1 if finite.size else 1
    allowed = np.stack([need <= m for m in range(rooms)], axis=1)  # [Q, R, C]
    first, ids = unique_rows(allowed.reshape(q_count * rooms, c_count))
    room_mask_id = ids.reshape(q_count, rooms).astype(np.int32)
    patterns = allowed.reshape(-1, c_count)[first]
    depends = ret & ~ret_empty & resting[eq]
    viable, pops = _chains(pd, nxt, effect, eq[depends], ec[depends], bool(ret.any()))
    viable[eq[tests], ec[tests]] = True
    if ends is not None:
        viable |= ends
    first, which = unique_rows(viable)  # states with the same stack-dependent classes share one list
    lists = [np.flatnonzero(viable[f][class_of]) for f in first.tolist()]
    offset = np.concatenate([[0], np.cumsum([t.size for t in lists])]).astype(np.int32)
    pop_start, pop_count = offset[:-1][which], np.diff(offset)[which]
    pop_token = np.concatenate(lists).astype(np.int32) if offset[-1] else np.zeros(0, np.int32)
    forced = _forced(patterns, class_of)[room_mask_id[:, -1]]
    forced = np.where((pop_count == 0) & (room_mask_id[:, 0] == room_mask_id[:, -1]), forced, -1)
    mask_id = room_mask_id[:, -1]
    key_ops = _key_words(ops)
    n = key_ops.shape[2]
    key_need = _words(list(pd.key_need), n) if any(pd.key_need) else np.zeros((q_count, n), np.uint32)
    stack = PushdownTables(effect, pd.need, room_mask_id, pop_start, pop_count, pop_token, pd.bottom, pd.max_depth,
                           pops, effect_op, key_ops, key_need)  # fmt: skip
    masks = _pack(patterns, class_of)
    return TokenGrammar(nxt, class_of, pd.accept, forced.astype(np.int32), pd.start, mask_id, masks, stack)


def _key_words(ops: list) -> np.ndarray:
    """``uint32[O, 4 + 2E, W]``: each op's ``absent``, ``present``, ``clear`` and ``add`` bits as words,
    then the set bits and the clear bits of its ``either`` pairs (``E``: the most an op lists; the
    last pair repeated to fill, zero for an op without)."""
    width = max([max(o.absent, o.present, o.clear, o.add, *(p | a for p, a in o.either)).bit_length() for o in ops] + [1])
    n = -(-width // 32)
    e = max(len(o.either) for o in ops)
    fill = [list(o.either) + [o.either[-1]] * (e - len(o.either)) if o.either else [(0, 0)] * e for o in ops]
    return np.stack([_words([o.absent, o.present, o.clear, o.add, *(p for p, _ in f), *(a for _, a in f)], n)
                     for o, f in zip(ops, fill)])  # fmt: skip


def _words(masks: list, n: int) -> np.ndarray:
    """``uint32[len(masks), n]``: bit masks as ``n`` words each (bit ``i`` in word ``i // 32``)."""
    data = b"".join(m.to_bytes(4 * n, "little") for m in masks)
    return np.frombuffer(data, "<u4").astype(np.uint32).reshape(len(masks), n)


def _chains(pd: Pushdown, nxt, effect, q, c, returns: bool):
    """Stack-dependent (state, class) entries that some stack makes valid, and the most frames a token pops.

    ``q``, ``c``: the stack-dependent entries (returns); ``returns``: whether any token returns.
    A return continues with a class in every state a stack can hold; chains end in a stay (valid), a
    dead entry, or another return. Every chain is finite (:mod:`~jaxsample.structured.pushdown`
    refuses grammars where one byte returns through unboundedly many frames).
    """
    q_count = nxt.shape[0]
    memo: dict[int, tuple[bool, int]] = {}

    def through(col: int, active=()) -> tuple[bool, int]:
        """(viable, frames popped) of a return that continues with class ``col`` in a popped state."""
        if col in memo:
            return memo[col]
        if col in active:
            raise GrammarError("internal: a token returns through a cycle of calls")  # pragma: no cover
        ok, pops = False, 0
        for r in pd.returns.tolist():
            v = int(nxt[r, col])
            if v == 0:
                continue
            if v < q_count or effect[v - q_count, 0] >= 0:
                ok, pops = True, max(pops, 1)
                continue
            nxt_col = effect[v - q_count, 1]
            inner_ok, inner = through(col if nxt_col < 0 else int(nxt_col), active + (col,))
            if inner_ok:
                ok, pops = True, max(pops, 1 + inner)
        memo[col] = (ok, pops)
        return memo[col]

    viable = np.zeros(nxt.shape, bool)
    most = int(returns)
    rest = effect[nxt[q, c] - q_count, 1]
    cols, inv = np.unique(np.where(rest < 0, c, rest), return_inverse=True)
    found = [through(int(col)) for col in cols.tolist()]
    ok = np.array([f[0] for f in found], bool)
    viable[q, c] = ok[inv.reshape(-1)] if ok.size else False
    return viable, max([most] + [f[1] for f in found if f[0]])
