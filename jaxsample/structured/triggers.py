"""Triggered (lazy) grammars: free text until a trigger appears, the grammar from the trigger on.

llama.cpp's lazy grammars (``grammar_lazy`` with ``grammar_triggers`` of type word, pattern,
pattern_full or token; ``src/llama-grammar.cpp``), matched on the device. While a row *awaits* its
trigger its logits pass unmasked; after each token, the text generated so far is searched:

* **token** triggers first: the token is one of the trigger token ids. The grammar then starts on
  the token's bytes (a special token, which has none, starts it empty: our grammars are over
  bytes and cannot name it; llama.cpp would need a ``<[id]>`` terminal);
* then the string triggers, in the row's order: a **word** (a literal string, found anywhere), a
  **pattern** (a regular expression, found anywhere) or a **pattern_full** (matched against the
  whole generated text, ``^...$``); the first trigger with a match wins, at its leftmost match.
  The grammar starts at the match's first non-empty capturing group (else at the match start),
  and is fed the text from there to the end of the newest token: the trigger's own bytes, then
  whatever the token carries after it (a trigger may end in the middle of a token).

From then on the grammar masks every step. The row's grammar must therefore accept the text from
the trigger on (llama.cpp's tool-call grammars start with the trigger, e.g. ``root ::=
"<tool_call>" ...``). Where llama.cpp raises on a trigger whose continuation the grammar rejects
(an empty grammar stack), a row here never emits such a token: while awaiting, a token that would
complete a trigger into a dead grammar state is masked, so **every triggered output parses**.

Patterns are expanded on the host into the finite set of strings they match (at most
:data:`MAX_EXPANSIONS`): literals, escapes, classes of at most 64 characters (``\\d``, ``\\w``,
``\\s`` as in ECMAScript), alternation, groups, bounded ``?``/``{m,n}``. A ``pattern_full`` must
be ``[\\s\\S]*?`` (lazy, anything) + a finite part with a capturing group + optionally ``[\\s\\S]*``
(without it the match must end where the generated text ends). Anything else (``\\s*`` inside the
trigger, look-arounds, anchors in the middle) raises ``ValueError``: such a trigger would need a
regex engine on the device.

On the device (fixed shapes, :func:`~jaxsample.decoding.stop_strings.pending` and the stop-string
tables): the candidate ways a trigger can end inside each token are listed on the host (``C``
candidates: token, trigger slot, bytes of the trigger inside the token, start, the tokens spelling
the text the grammar starts on, and per grammar whether that text is a valid start). Per step, a
row computes which candidates the text so far makes live (``[B, S, M]`` prefix matches), picks per
token the winning candidate (segment minimum over a priority key), masks the tokens whose winner
is invalid, and in ``accept`` walks the winner's tokens through the grammar with
:func:`~jaxsample.structured.tables.advance` (only in steps where a row triggers).

>>> from jaxsample import structured as st
>>> v = st.Vocabulary.from_pieces(["<eos>", "a", "<", "x>", "1", "2", ">"], kind="raw", special_ids=[0], eos_ids=[0])
>>> t = compile_triggers([["<x>"]], v, [st.compile_regex("<x>[12]+", v)])
>>> sorted({(int(k), int(m)) for k, m in zip(t.cand_token, t.cand_m) if k >= 0})   # "x>" after "<", ">" after "<x"
[(3, 2), (6, 1)]
"""

from __future__ import annotations

import dataclasses

import re
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._types import NEG_INF, Array
from jaxsample.chain import InitInfo, Param, Params, Stage, StepInfo, static_int
from jaxsample.decoding import stop_strings
from jaxsample.decoding.stop_strings import StopStrings
from jaxsample.structured import grammar_cache, stage as _stage
from jaxsample.structured.matcher import Matcher
from jaxsample.structured.tables import bucket

#: Most strings a pattern trigger may expand to.
MAX_EXPANSIONS = 256
#: llama.cpp's ``common_grammar_trigger_type`` values (server requests give the type as an int).
TYPES = {0: "token", 1: "word", 2: "pattern", 3: "pattern_full"}
_ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000\ufeff"
_CATEGORIES = {"CATEGORY_SPACE": _ECMA_SPACE, "CATEGORY_DIGIT": "0123456789",
               "CATEGORY_WORD": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"}
_ANY_PAIRS = ({"CATEGORY_SPACE", "CATEGORY_NOT_SPACE"}, {"CATEGORY_DIGIT", "CATEGORY_NOT_DIGIT"},
              {"CATEGORY_WORD", "CATEGORY_NOT_WORD"})
_KEY_START = 1 << 12  # candidate starts lie in (-_KEY_START, _KEY_START): tokens of under 4 KiB
_MAX_PER_ROW = 512  # priority keys stay within int32


class Trigger(NamedTuple):
    """One trigger: ``kind`` in ``("token", "word", "pattern", "pattern_full")`` and its value."""

    kind: str
    value: Any


def parse(trigger: Any) -> Trigger:
    """A :class:`Trigger` from a string (a word), an int (a token id), a :class:`Trigger`, or a
    llama.cpp trigger dict ``{"type": 0..3 or name, "value": str, "token": int}``.

    Raises:
      ValueError: on anything else, an empty word or pattern, or a negative token id.
    """
    if isinstance(trigger, Trigger):
        kind, value = trigger
    elif isinstance(trigger, str):
        kind, value = "word", trigger
    elif isinstance(trigger, (int, np.integer)) and not isinstance(trigger, bool):
        kind, value = "token", int(trigger)
    elif isinstance(trigger, dict) and "type" in trigger:
        kind = TYPES.get(trigger["type"], trigger["type"])
        value = trigger.get("token") if kind == "token" else trigger.get("value")
    else:
        raise ValueError(f"a grammar trigger is a word (str), a token id (int) or a llama.cpp trigger dict, got {trigger!r}")
    if kind not in TYPES.values():
        raise ValueError(f"grammar trigger type must be one of {sorted(TYPES.values())} (or 0-3), got {kind!r}")
    if kind == "token":
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"a token trigger needs a token id >= 0, got {value!r}")
        return Trigger(kind, int(value))
    if not isinstance(value, str) or not value:
        raise ValueError(f"a {kind} trigger needs a non-empty string value, got {value!r}")
    return Trigger(kind, value)


# ------------------------------------------------------------------------------------------ patterns
def _op(item) -> str:
    return str(item[0])


def _is_any(item) -> bool:
    op, av = item
    if str(op) == "ANY":
        return False  # "." excludes line terminators in ECMAScript
    return str(op) == "IN" and any(pair <= {str(a) for o, a in av if str(o) == "CATEGORY"} for pair in _ANY_PAIRS)


def _class(av, what: str) -> str:
    chars = []
    for op, a in av:
        op = str(op)
        if op == "LITERAL":
            chars.append(chr(a))
        elif op == "RANGE" and a[1] - a[0] < 64:
            chars += [chr(c) for c in range(a[0], a[1] + 1)]
        elif op == "CATEGORY" and str(a) in _CATEGORIES:
            chars += _CATEGORIES[str(a)]
        else:
            raise ValueError(f"{what}: character class item {op} {a} matches too many characters for a trigger")
    out = list(dict.fromkeys(chars))
    if len(out) > 64:
        raise ValueError(f"{what}: a character class of {len(out)} characters is too large for a trigger")
    return "".join(out)


def _expand(items, what: str) -> list[tuple[str, dict]]:
    """Strings matched by a parsed sequence, in ECMAScript preference order, with group spans."""
    out = [("", {})]
    for op, av in items:
        op = str(op)
        if op == "LITERAL":
            alts = [(chr(av), {})]
        elif op == "IN":
            alts = [(c, {}) for c in _class(av, what)]
        elif op == "BRANCH":
            alts = [x for seq in av[1] for x in _expand(seq, what)]
        elif op == "SUBPATTERN":
            gid, add, remove, seq = av
            if add or remove:
                raise ValueError(f"{what}: inline flags are not supported in triggers")
            alts = _expand(seq, what)
            if gid is not None:
                alts = [(s, {**g, gid: (0, len(s))}) for s, g in alts]
        elif op in ("MAX_REPEAT", "MIN_REPEAT"):
            lo, hi, seq = av
            if str(hi) == "MAXREPEAT":
                raise ValueError(f"{what}: unbounded repetition (*, +, {{n,}}) inside a trigger matches infinitely "
                                 "many strings; use a word, a finite pattern, or [\\s\\S]*? before a pattern_full")
            one = _expand(seq, what)
            counts = range(hi, lo - 1, -1) if op == "MAX_REPEAT" else range(lo, hi + 1)
            alts = []
            for n in counts:
                rep = [("", {})]
                for _ in range(n):
                    rep = _join(rep, one, what)
                alts += rep
        else:
            raise ValueError(f"{what}: {op} is not supported in a trigger (only finite patterns: literals, classes, "
                             "alternation, groups, bounded repetition)")
        out = _join(out, alts, what)
    return out


def _join(left, right, what: str):
    out = []
    for a, ga in left:
        for b, gb in right:
            out.append((a + b, {**ga, **{k: (s + len(a), e + len(a)) for k, (s, e) in gb.items()}}))
            if len(out) > MAX_EXPANSIONS:
                raise ValueError(f"{what} matches more than {MAX_EXPANSIONS} strings; use fewer alternatives")
    return out


def _start(groups: dict) -> int:
    """llama.cpp's start: the first capturing group (by number) that matched a non-empty string."""
    for gid in sorted(groups):
        s, e = groups[gid]
        if e > s:
            return s
    return 0


def expand(trigger: Trigger) -> list[tuple[str, int, bool]]:
    """A string trigger as ``(string, offset where the grammar starts, must end the text)`` entries.

    Raises:
      ValueError: for a pattern outside the supported subset (see the module docstring).
    """
    if trigger.kind == "word":
        return [(trigger.value, 0, False)]
    import re._parser as sre_parse  # the standard library's own regex parser (structure only)

    what = f"{trigger.kind} trigger {trigger.value!r}"
    try:
        items = list(sre_parse.parse(trigger.value).data)
    except re.error as err:
        raise ValueError(f"{what}: invalid regular expression ({err})") from None
    at_end = False
    if trigger.kind == "pattern_full":
        if items and _op(items[0]) == "AT":
            items = items[1:]
        if items and _op(items[-1]) == "AT":
            items = items[:-1]
        if not (items and _op(items[0]) == "MIN_REPEAT" and items[0][1][0] == 0 and str(items[0][1][1]) == "MAXREPEAT"
                and len(items[0][1][2]) == 1 and _is_any(items[0][1][2][0])):
            raise ValueError(f"{what}: a pattern_full trigger must start with [\\s\\S]*? (the trigger anywhere in "
                             "the output); one anchored at the start of the output is not supported")
        items = items[1:]
        tail = items[-1] if items else None
        if tail is not None and _op(tail) in ("MAX_REPEAT", "MIN_REPEAT") and tail[1][0] == 0 \
                and str(tail[1][1]) == "MAXREPEAT" and len(tail[1][2]) == 1 and _is_any(tail[1][2][0]):
            items = items[:-1]
        else:
            at_end = True
        strings = _expand(items, what)
        if any(_start(g) == 0 and not g for _, g in strings):
            raise ValueError(f"{what}: put the trigger in a capturing group (llama.cpp starts the grammar at the "
                             "first non-empty group, else at the start of the whole output)")
    else:
        if any(_op(x) == "AT" for x in items):
            raise ValueError(f"{what}: anchors are not supported in a pattern trigger (use pattern_full)")
        strings = _expand(items, what)
    out = [(s, _start(g), at_end) for s, g in strings]
    if any(not s for s, _, _ in out):
        raise ValueError(f"{what} matches the empty string")
    return out


def longest(triggers: Sequence[Any]) -> int:
    """The ``max_trigger_bytes`` a trigger list needs: its longest string (expanded), at least 31."""
    sizes = [len(x.encode("utf-8")) for t in map(parse, triggers) if t.kind != "token" for x, _, _ in expand(t)]
    return max([31] + sizes)


# ------------------------------------------------------------------------------------------ host tables
class TriggerTables(NamedTuple):
    """Device tables of the trigger slots of a batch (a shared sampler parameter; every leaf traced).

    ``S`` slots (one per distinct ``(string, grammar start offset, must end the text)`` or token id),
    ``C`` candidates (ways a slot completes inside a token), ``T`` resume tokens per candidate.
    """

    match: StopStrings  # fits/ends [V, S, K], token_len [V]; target int32[S]: string bytes, 0 for token slots
    cand_token: Array  # int32[C]: the token completing the trigger (-1 = padding)
    cand_slot: Array  # int32[C]
    cand_m: Array  # int32[C]: bytes of the trigger inside the token (1 .. L; L: wholly inside); 0 for token slots
    cand_start: Array  # int32[C]: where the trigger starts, relative to the token's first byte
    cand_group: Array  # int32[C]: index of cand_token among the candidates' distinct tokens
    resume: Array  # int32[C, T]: tokens spelling the text the grammar starts on (-1 = padding)
    ok: Array  # bool[G, C]: grammar g accepts that text as the start of an output


class _Speller:
    """Shortest token spellings of byte strings over a vocabulary (a dynamic programme that extends a
    piece only while it is a prefix of some token)."""

    def __init__(self, token_bytes: Sequence[bytes | None]):
        self.index: dict = {}
        for i, b in enumerate(token_bytes):
            if b:
                self.index.setdefault(bytes(b), i)
        self.prefixes = {b[:k] for b in self.index for k in range(1, len(b) + 1)}
        self.memo: dict = {}

    def __call__(self, text: bytes) -> tuple[int, ...] | None:
        """A shortest token sequence spelling ``text`` (None if the vocabulary cannot)."""
        if text in self.memo:
            return self.memo[text]
        n = len(text)
        best: list = [None] * (n + 1)
        best[0] = ()
        for i in range(n):
            if best[i] is None:
                continue
            for j in range(i + 1, n + 1):
                piece = text[i:j]
                if piece not in self.prefixes:
                    break
                t = self.index.get(piece)
                if t is not None and (best[j] is None or len(best[j]) > len(best[i]) + 1):
                    best[j] = best[i] + (t,)
        self.memo[text] = best[n]
        return best[n]


_SPELLERS: dict = {}


def _speller_for(vocab) -> _Speller:
    """The (memoised, per vocabulary content) speller of a vocabulary."""
    digest = grammar_cache.vocab_digest(vocab)
    if digest not in _SPELLERS:
        _SPELLERS.clear()  # one vocabulary at a time is the common case
        _SPELLERS[digest] = _Speller(vocab.token_bytes)
    return _SPELLERS[digest]


def compile_triggers(
    triggers_per_row: Sequence[Sequence[Any] | None],
    vocab: Any,
    grammars: Sequence[Any],
    *,
    num_slots: int | None = None,
    num_candidates: int | None = None,
    max_trigger_bytes: int = 31,
) -> TriggerTables:
    """Host tables for the triggers of a batch (see the module docstring).

    Args:
      triggers_per_row: per row ``None`` (not lazy) or a list of triggers (:func:`parse` forms).
      vocab: the :class:`~jaxsample.structured.Vocabulary` the grammars were compiled for.
      grammars: the distinct grammars of the batch, in table order (their index is the grammar id).
      num_slots: static ``S`` (default: the power-of-two bucket of the distinct slots, at least 4).
      num_candidates: static ``C`` (default: the power-of-two bucket, at least 64).
      max_trigger_bytes: static bound on a trigger string's UTF-8 length (rounded up to ``32 k - 1``).

    Raises:
      ValueError: an invalid trigger or pattern, a token id outside the vocabulary, fixed sizes too small.
    """
    slots, _ = _slots(triggers_per_row, vocab)
    return _tables_for(tuple(slots), vocab, tuple(grammars), num_slots, num_candidates, max_trigger_bytes)


def _slots(triggers_per_row, vocab) -> tuple[list, list]:
    """Distinct slots ``(kind, value, offset, at_end)`` and per row ``{slot: rank}``."""
    slots: dict = {}
    ranks = []
    for row in triggers_per_row:
        if row is None:
            ranks.append(None)
            continue
        parsed = [parse(t) for t in row]
        if not 0 < len(parsed) <= _MAX_PER_ROW:
            raise ValueError(f"a lazy row needs 1 to {_MAX_PER_ROW} triggers, got {len(parsed)} "
                             "(None: the grammar applies from the start)")
        order = [t for t in parsed if t.kind == "token"] + [t for t in parsed if t.kind != "token"]  # tokens first
        rank: dict = {}
        for i, t in enumerate(order):
            if t.kind == "token":
                if t.value >= vocab.size:
                    raise ValueError(f"token trigger {t.value} is outside the vocabulary [0, {vocab.size})")
                entries = [(("token", t.value, 0, False), 0)]
            else:
                entries = [(("string", s, o, e), j) for j, (s, o, e) in enumerate(expand(t))]
            for key, j in entries:
                slot = slots.setdefault(key, len(slots))
                rank.setdefault(slot, i * MAX_EXPANSIONS + j)
        ranks.append(rank)
    return list(slots), ranks


def _window_bytes(max_trigger_bytes: int) -> int:
    """The stop-string table size ``32 k - 1`` holding ``max_trigger_bytes`` (also the window in tokens)."""
    return stop_strings.WORD * (-(-(int(max_trigger_bytes) + 1) // stop_strings.WORD)) - 1


def _tables_for(slots, vocab, grammars, num_slots, num_candidates, max_trigger_bytes, num_grammars=None) -> TriggerTables:
    token_bytes = vocab.token_bytes
    spell = _speller_for(vocab)
    strings = [key[1] for key in slots if key[0] == "string"]
    longest = max((len(s.encode("utf-8")) for s in strings), default=1)
    if longest > max_trigger_bytes:
        raise ValueError(f"a trigger of {longest} bytes is longer than max_trigger_bytes={max_trigger_bytes}")
    max_len = _window_bytes(max_trigger_bytes)
    s_need = max(len(slots), 1)
    s = bucket(s_need, 4) if num_slots is None else int(num_slots)
    if s < s_need:
        raise ValueError(f"num_slots={s} is smaller than the {s_need} trigger slots of the batch")
    base = stop_strings.build(token_bytes, [strings], max_len=max_len)  # distinct strings, sorted
    order = {x: i for i, x in enumerate(sorted(set(strings)))}
    base_fits, base_ends = np.asarray(base.fits), np.asarray(base.ends)
    k_words = base_fits.shape[-1]
    fits = np.zeros((vocab.size, s, k_words), np.uint32)
    ends = np.zeros((vocab.size, s, k_words), np.uint32)
    target = np.zeros(s, np.int32)
    cands = []  # (token, slot, m, start, tail bytes)
    heads = []  # per slot: the tokens spelling the trigger's text from the grammar's start on
    for j, (kind, value, offset, at_end) in enumerate(slots):
        if kind == "token":
            heads.append(())
            cands.append((value, j, 0, 0, token_bytes[value] or b""))
            continue
        fits[:, j] = base_fits[:, order[value]]
        ends[:, j] = base_ends[:, order[value]]
        word = value.encode("utf-8")
        target[j] = len(word)
        heads.append(spell(word[len(value[:offset].encode("utf-8")):]))
        bits = np.unpackbits(ends[:, j].view(np.uint8), axis=1, bitorder="little")
        for v, m in zip(*np.nonzero(bits[:, 1 : len(word) + 1])):
            v, m = int(v), int(m) + 1
            tb = token_bytes[v]
            cut = m if m < len(word) else tb.find(word) + len(word)
            if at_end and cut != len(tb):
                continue
            cands.append((v, j, m, m - len(word) if m < len(word) else cut - len(word), tb[cut:]))
    c_need = max(len(cands), 1)
    c = bucket(c_need, 64) if num_candidates is None else int(num_candidates)
    if c < c_need:
        raise ValueError(f"num_candidates={c} is smaller than the {c_need} trigger candidates of the batch")
    if any(abs(start) >= _KEY_START for _, _, _, start, _ in cands):
        raise ValueError(f"a token of {_KEY_START} bytes or more completes a trigger")
    spelled = []
    for v, j, m, _, tail in cands:
        if m == 0:  # a token trigger: the grammar walks the token itself (nothing for a special token)
            rest = (v,) if tail else ()
        else:
            rest = spell(tail)
        spelled.append(None if heads[j] is None or rest is None else (heads[j], rest))
    t = bucket(max((len(h) + len(r) for h, r in filter(None, spelled)), default=1), 8)
    resume = np.full((c, t), -1, np.int32)
    ok = np.zeros((max(len(grammars), num_grammars or 1), c), bool)
    starts: dict = {}
    for i, parts in enumerate(spelled):
        if parts is None:
            continue  # the vocabulary cannot spell the text: never a valid start (the token is masked)
        head, rest = parts
        resume[i, : len(head) + len(rest)] = head + rest
        for g, grammar in enumerate(grammars):
            if grammar.pushdown is not None:  # a recursive grammar's state includes its stack
                ok[g, i] = Matcher(grammar).accept_tokens(head + rest) == len(head) + len(rest)
                continue
            if (g, head) not in starts:
                starts[g, head] = grammar.walk(head)
            state = starts[g, head]
            for token in rest:
                state = grammar.advance(state, token) if state else 0
            ok[g, i] = state != 0
    tok = np.full(c, -1, np.int32)
    col = np.zeros((4, c), np.int32)
    for i, (v, j, m, start, _) in enumerate(cands):
        tok[i] = v
        col[:, i] = (j, m, start, 0)
    distinct = {v: g for g, v in enumerate(sorted({v for v, *_ in cands}))}
    col[3, : len(cands)] = [distinct[v] for v, *_ in cands]
    col[3, len(cands):] = len(distinct)  # padding: a group of its own
    match = StopStrings(jnp.asarray(fits), jnp.asarray(ends), base.token_len, jnp.asarray(target))
    return TriggerTables(match, jnp.asarray(tok), *(jnp.asarray(x) for x in col), jnp.asarray(resume), jnp.asarray(ok))


def trigger_params(
    grammars: Sequence[Any],
    triggers: Sequence[Sequence[Any] | None],
    vocab: Any,
    batch_shape: tuple[int, ...] | None = None,
    *,
    name: str = "grammar",
    num_slots: int | None = None,
    num_candidates: int | None = None,
    max_trigger_bytes: int = 31,
    **buckets,
) -> dict:
    """Parameter values of :func:`lazy_grammar_stage`: a grammar per row and its triggers.

    Args:
      grammars: one entry per row (a compiled grammar, or ``None``: unconstrained), as
        :func:`~jaxsample.structured.grammar_params`.
      triggers: one entry per row: ``None`` (the grammar applies from the start) or a list of
        triggers (words, token ids, llama.cpp trigger dicts; see :func:`parse`).
      vocab: the grammars' vocabulary.
      num_slots: static slot count ``S`` (the stage's ``max_triggers`` must be at least this).
      num_candidates: static candidate count ``C``.
      max_trigger_bytes: static bound on a trigger's UTF-8 length (the stage's must be at least this).
      **buckets: ``num_grammars`` / ``num_states`` / ``num_classes`` / ``num_masks`` / ``num_transitions`` /
        ``num_blocks`` (see
        :func:`~jaxsample.structured.tables.stack`).

    Returns:
      ``{f"{name}_tables", f"{name}_grammar", f"{name}_triggers", f"{name}_trigger_rank"}``.

    Raises:
      ValueError: mismatched lengths, invalid triggers, sizes too small.
    """
    grammars, triggers = list(grammars), list(triggers)
    if len(triggers) != len(grammars):
        raise ValueError(f"{len(triggers)} trigger lists for {len(grammars)} grammars (one per row)")
    out = _stage.grammar_params(grammars, batch_shape, name=name, **buckets)
    ids = np.asarray(out[_stage.param_names(name)[1]]).reshape(-1)
    distinct: list = [None] * (int(ids.max()) + 1 if ids.size and ids.max() >= 0 else 0)
    for g, i in zip(grammars, ids):
        if i >= 0:
            distinct[i] = g
    rows = [None if g is None else t for g, t in zip(grammars, triggers)]  # unconstrained rows: nothing to await
    slots, ranks = _slots(rows, vocab)
    tables = None
    if slots:
        g = int(out[_stage.param_names(name)[0]].start.shape[0])  # the grammar tables' bucket
        tables = _cached_tables(tuple(slots), vocab, tuple(distinct), num_slots, num_candidates, max_trigger_bytes, g)
    width = 0 if tables is None else int(tables.match.target.shape[0])
    rank = np.full((len(rows), max(width, 1)), -1, np.int32)
    for b, r in enumerate(ranks):
        for slot, value in (r or {}).items():
            rank[b, slot] = value
    shape = tuple(np.shape(ids.reshape(out[_stage.param_names(name)[1]].shape)))
    out[f"{name}_triggers"] = tables
    out[f"{name}_trigger_rank"] = rank.reshape(shape + (rank.shape[-1],))
    return out


_TABLES: dict = {}


def _cached_tables(slots, vocab, grammars, *sizes):
    """:func:`_tables_for`, memoised for the last few batches (keyed by grammar identity, held here)."""
    key = (slots, grammar_cache.vocab_digest(vocab), tuple(id(g) for g in grammars), sizes)
    hit = _TABLES.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], grammars)):
        return hit[1]
    tables = _tables_for(slots, vocab, grammars, *sizes)
    _TABLES[key] = (grammars, tables)
    while len(_TABLES) > 16:
        _TABLES.pop(next(iter(_TABLES)))
    return tables



# ------------------------------------------------------------------------------------------ the stage
class LazyState(NamedTuple):
    """State of :func:`lazy_grammar_stage`: the grammar's own state and whether it constrains yet."""

    grammar: Any  # the grammar stage's state (opaque), held at the start state while awaiting
    armed: Array  # bool[B]: the grammar constrains this row


def _window(info: StepInfo, width: int) -> Array:
    """``int32[B, width]``: the last generated tokens before this step (``-1`` for prompt or none)."""
    h = info.history
    generated = jnp.arange(h.shape[-1]) >= h.shape[-1] - info.position.reshape(-1)[:, None]
    h = jnp.where(generated, h.reshape(-1, h.shape[-1]), -1)
    return h[:, max(h.shape[-1] - width, 0):]


def _winners(t: TriggerTables, rank: Array, grammar: Array, info: StepInfo):
    """``(live bool[B, C], bad bool[B, C])``: the candidate that wins for its token if that token came
    next, and whether its text is an invalid grammar start (or unspellable) for the row's grammar."""
    used = rank >= 0  # [B, S]
    lengths = t.match.target
    table = t.match._replace(target=jnp.where(used & (lengths > 0), lengths, 0))
    pend = stop_strings.pending(_window(info, table.max_len), table)  # [B, S, M]
    slot, m = t.cand_slot, t.cand_m
    inside = (m == 0) | (m >= lengths[slot])  # token triggers, or wholly inside the token
    prefix = _pick_m(pend, slot, m)
    live = used[:, slot] & (t.cand_token >= 0)[None] & (inside[None] | prefix)
    r = rank[:, slot]
    key = (r // MAX_EXPANSIONS) * (2 * _KEY_START * MAX_EXPANSIONS) + (t.cand_start + _KEY_START)[None] * MAX_EXPANSIONS \
        + r % MAX_EXPANSIONS
    key = jnp.where(live, key, jnp.iinfo(jnp.int32).max)
    c = slot.shape[0]
    best = jax.ops.segment_min(key.T, t.cand_group, num_segments=c + 1)  # [groups, B]
    live = live & (key == best[t.cand_group].T)
    g = jnp.clip(grammar, 0, t.ok.shape[0] - 1)
    return live, live & ~t.ok[g]


def _pick_m(pend: Array, slot: Array, m: Array) -> Array:
    """``bool[B, C]``: ``pend[b, slot[c], m[c] - 1]`` (False for ``m < 1``)."""
    flat = pend.reshape(pend.shape[0], -1)
    idx = slot * pend.shape[-1] + jnp.clip(m - 1, 0, pend.shape[-1] - 1)
    return jnp.take(flat, idx, axis=1) & (m >= 1)[None]


@dataclasses.dataclass(frozen=True)
class LazyGrammarStage(Stage):
    """The grammar stage with triggers (see the module docstring); bind rows with :func:`trigger_params`.

    Reads the grammar stage's parameters plus the shared ``f"{name}_triggers"``
    (:class:`TriggerTables` or ``None``) and the per-row ``f"{name}_trigger_rank"``
    (``int32[B, max_triggers]``, ``-1``: slot unused; a row with no slot is not lazy).
    ``max_triggers`` is the static slot capacity (distinct trigger strings of the batch),
    ``max_trigger_bytes`` the static longest trigger (the stage reads that many past tokens).
    Its identity is its static fields: equal stages share one compilation.
    """

    _: dataclasses.KW_ONLY
    name: str = "grammar"
    max_triggers: int = static_int(8)
    max_trigger_bytes: int = static_int(31)

    @property
    def _inner(self) -> Stage:
        return _stage.grammar_stage(name=self.name)

    @property
    def _keys(self) -> tuple[str, str, str]:
        """``(grammar ids, triggers, trigger rank)`` parameter names."""
        return _stage.param_names(self.name)[1], f"{self.name}_triggers", f"{self.name}_trigger_rank"

    @property
    def history(self) -> int:
        return _window_bytes(self.max_trigger_bytes)

    @property
    def params(self) -> tuple[Param, ...]:
        _, triggers_key, rank_key = self._keys
        return self._inner.params + (Param(triggers_key, None, shared=True),
                                     Param(rank_key, -1, jnp.int32, lo=-1, capacity=self.max_triggers))

    def _bound(self, params: Params):
        ids_key, triggers_key, rank_key = self._keys
        t, ids = params[triggers_key], jnp.asarray(params[ids_key], jnp.int32).reshape(-1)
        rank = jnp.asarray(params[rank_key], jnp.int32).reshape(ids.shape[0], -1)
        return t, ids, (rank if t is None else rank[:, : t.match.target.shape[0]])

    def init(self, info: InitInfo) -> LazyState:
        t, ids, rank = self._bound(info.params)
        _, triggers_key, rank_key = self._keys
        if t is not None and self.max_triggers < t.match.target.shape[0]:
            raise ValueError(f"{rank_key} has {self.max_triggers} slots but {triggers_key} has "
                             f"{t.match.target.shape[0]}: raise max_triggers or build both with trigger_params")
        if t is not None and t.match.max_len > self.history:
            raise ValueError(f"{triggers_key} hold triggers of up to {t.match.max_len} bytes, the stage reads "
                             f"{self.history}: raise the stage's max_trigger_bytes")
        lazy = (ids >= 0) & jnp.any(rank >= 0, axis=-1) if t is not None else jnp.zeros(ids.shape, bool)
        return LazyState(self._inner.init(info), (~lazy).reshape(info.batch_shape))

    def update(self, logits, state, params, info):
        t, ids, rank = self._bound(params)
        out, _ = self._inner.update(logits, state.grammar, params, info)
        armed = state.armed.reshape(-1)
        x = logits.reshape((ids.shape[0], logits.shape[-1]))
        if t is not None:
            def bans():
                _, bad = _winners(t, rank, ids, info)
                column = jnp.where(t.cand_token >= 0, t.cand_token, x.shape[-1])  # padding: dropped
                banned = jnp.zeros(x.shape, jnp.int32).at[:, column].add(bad.astype(jnp.int32), mode="drop")
                return jnp.where(banned > 0, jnp.asarray(NEG_INF, x.dtype), x)

            x = lax.cond(jnp.any(~armed), bans, lambda: x)
        out = jnp.where(armed[:, None], out.reshape(x.shape), x)
        return out.reshape(logits.shape), state

    def accept(self, tokens, state, params, info):
        t, ids, rank = self._bound(params)
        inner = self._inner
        tokens = tokens.reshape(-1)
        armed = state.armed.reshape(-1)
        grammar = inner.accept(jnp.where(armed, tokens, -1), state.grammar, params, info)
        if t is None:
            return LazyState(grammar, state.armed)
        live = lax.cond(jnp.any(~armed), lambda: _winners(t, rank, ids, info)[0],
                        lambda: jnp.zeros((ids.shape[0], t.cand_token.shape[0]), bool))
        hit = live & ~armed[:, None] & (t.cand_token[None] == tokens[:, None])  # [B, C]: at most one per row
        fired = jnp.any(hit, axis=-1)
        which = jnp.argmax(hit, axis=-1)

        def walk():
            s = grammar
            for j in range(t.resume.shape[1]):
                s = inner.accept(jnp.where(fired, t.resume[which, j], -1), s, params, info)
            return s

        grammar = lax.cond(jnp.any(fired), walk, lambda: grammar)
        return LazyState(grammar, (armed | fired).reshape(state.armed.shape))


def lazy_grammar_stage(*, name: str = "grammar", max_triggers: int = 8, max_trigger_bytes: int = 31) -> Stage:
    """The stage :class:`LazyGrammarStage` (see the module docstring)."""
    return LazyGrammarStage(name=name, max_triggers=max_triggers, max_trigger_bytes=max_trigger_bytes)
