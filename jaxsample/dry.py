"""llama.cpp DRY ("Don't Repeat Yourself"): penalise tokens that would extend a repeated phrase.

With ``w`` the last ``penalty_last_n`` history tokens, a candidate token ``t`` is penalised when
some suffix of ``w`` of length ``L >= allowed_length`` already occurred earlier in ``w`` and was
followed there by ``t``. With ``L`` the longest such suffix::

    logit[t] -= multiplier * base ** min(L - allowed_length, max_exp)

where ``max_exp = int(88.7228391 / ln(base))`` when ``base > 1.000001`` (llama's overflow clamp).
Sequence breakers cap ``L``: scanning from the most recent token, the first position where a
breaker sequence ends limits repeats to the tokens after it; single-token breakers are never
penalised themselves.

Implementation. llama.cpp computes the suffix-match lengths with a reverse Z-algorithm, a
sequential loop. Here they are the column counts of the match matrix
``M[l, k] = (w[-1-l] == w[-1-l-k])``: ``L_k`` is the number of leading True entries of column
``k``. Row ``l`` of the matrix is a shifted slice of ``w`` compared with one token; rows are
computed ``C = 8`` at a time (unrolled) inside a ``lax.while_loop`` that stops as
soon as every column has hit a mismatch, the breaker limit, or the length past which the penalty
no longer grows (``allowed_length + max_exp``, e.g. 160 tokens for ``base = 1.75``). Typical text
costs one loop step (``C`` fused passes over ``[..., T]``); a model stuck in a verbatim loop
costs ``O(T * min(T, allowed_length + max_exp))``, i.e. ``O(T * 160)`` with the default base;
memory is ``O(T)`` per row. Breakers are matched with static tables indexed by token id
(``O(T * K * tail)`` per row, ``K`` tails per head); the per-token maximum is one scatter-max
into ``[..., V]``.

Sharding/TPU: rows are independent; shard the batch axis. The match loop is a ``lax.while_loop``
over the batch (its trip count is the longest repeat in the batch) and skipping off batches a
batch-level ``lax.cond``: both reduce over the batch shards under GSPMD.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _math, _validate
from jaxsample._history import NEVER, compact
from jaxsample._types import Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage, static, static_int

_FLOAT_MAX_LOG = 88.7228391  # llama.cpp's ln(FLT_MAX)
_CHUNK = 8
_NO_TAIL = 2**30  # length of an unused tail slot: never <= a window position


class _Breakers:
    """Static lookup tables for sequence breakers over a vocabulary of size ``V``.

    ``single[V]`` marks single-token breakers; ``group[V]`` indexes the multi-token breakers whose
    head is that token (``-1`` if none) into ``tails[G, K, width]`` (``NEVER`` padded) with
    lengths ``lengths[G, K]`` (``_NO_TAIL`` for unused slots).
    """

    def __init__(self, breakers: tuple[tuple[int, ...], ...], vocab_size: int):
        self.single = np.zeros(vocab_size, bool)
        tails: dict[int, list[tuple[int, ...]]] = {}
        for head, *tail in breakers:
            if head >= vocab_size or any(t >= vocab_size for t in tail):
                continue  # can never match a window of in-vocabulary tokens
            if tail:
                tails.setdefault(head, []).append(tuple(tail))
            else:
                self.single[head] = True
        self.group = np.full(vocab_size, -1, np.int32)
        k = max((len(v) for v in tails.values()), default=0)
        self.width = max((len(t) for v in tails.values() for t in v), default=0)
        self.tails = np.full((len(tails), k, self.width), NEVER, np.int32)
        self.lengths = np.full((len(tails), k), _NO_TAIL, np.int32)
        for g, (head, seqs) in enumerate(sorted(tails.items())):
            self.group[head] = g
            for j, t in enumerate(seqs):
                self.tails[g, j, : len(t)] = t
                self.lengths[g, j] = len(t)


def _tables(breakers: tuple[tuple[int, ...], ...], vocab_size: int) -> _Breakers:
    return _Breakers(breakers, vocab_size)


def _restart_limit(r: Array, n: Array, tables: _Breakers) -> Array:
    """``int32[...]``: llama's ``rep_limit``, the longest repeat allowed by sequence breakers.

    Args:
      r: ``int32[..., T]`` window, most recent first (``r[i] < 0`` past the window).
      n: ``int32[...]`` window length.
    """
    t = r.shape[-1]
    i = jnp.arange(t)
    is_tok = r >= 0
    tok = jnp.where(is_tok, r, 0)
    longest = jnp.where(is_tok & jnp.asarray(tables.single)[tok], 0, -1)
    if tables.tails.shape[0]:
        g = jnp.asarray(tables.group)[tok]
        has = is_tok & (g >= 0)
        g = jnp.maximum(g, 0)
        tails = jnp.asarray(tables.tails)[g]  # [..., T, K, width]
        lengths = jnp.asarray(tables.lengths)[g]  # [..., T, K]
        o = jnp.arange(tables.width)
        idx = i[:, None] - o - 1  # tail token o sits at r[i - o - 1]
        prev = jnp.where(idx >= 0, jnp.take(r, jnp.clip(idx, 0, t - 1), axis=-1), NEVER)
        same = (o >= lengths[..., None]) | (tails == prev[..., None, :])
        match = jnp.all(same, axis=-1) & (lengths <= i[:, None]) & has[..., None]
        longest = jnp.maximum(longest, jnp.max(jnp.where(match, lengths, -1), axis=-1))
    hit = longest >= 0
    first = jnp.argmax(hit, axis=-1)
    at_first = jnp.take_along_axis(longest, first[..., None], axis=-1)[..., 0]
    return jnp.where(jnp.any(hit, axis=-1), first - at_first, n).astype(jnp.int32)


def _suffix_matches(r: Array, limit: Array, chunk: int = _CHUNK) -> Array:
    """``int32[..., T]``: ``z[k] = min(LCP(r, r[k:]), limit)`` for ``k >= 1``, ``z[0] = 0``.

    ``r[i]`` is the ``i``-th most recent token, so ``z[k]`` is the length of the longest suffix of
    the window that also ends ``k`` tokens earlier. Entries past the window must be distinct
    negatives (they never match). Row ``l`` of the match matrix is ``r[l] == r[l:l+T]``, a
    shifted slice, so no ``[C, T]`` block is materialised; ``chunk`` rows are unrolled per loop step.
    """
    t = r.shape[-1]
    c = min(chunk, t)
    steps = -(-t // c)
    ext = jnp.arange(t, 2 * t + steps * c, dtype=jnp.int32)
    r_ext = jnp.concatenate([r, jnp.broadcast_to(-(1 + ext), r.shape[:-1] + ext.shape)], axis=-1)

    def body(carry):
        j, z, alive = carry
        for i in range(c):  # static unroll: one fused pass over [..., T] per matrix row
            l = j * c + i
            head = lax.dynamic_slice_in_dim(r_ext, l, 1, axis=-1)
            alive &= (head == lax.dynamic_slice_in_dim(r_ext, l, t, axis=-1)) & (l < limit[..., None])
            z += alive
        return j + 1, z, alive

    def cond(carry):
        j, _, alive = carry
        return (j < steps) & jnp.any(alive)

    alive = jnp.broadcast_to(jnp.arange(t) >= 1, r.shape)
    _, z, _ = lax.while_loop(cond, body, (jnp.int32(0), jnp.zeros(r.shape, jnp.int32), alive))
    return z


def _penalty(history, vocab_size, mult, base, allowed, last_n, tables: _Breakers) -> Array:
    """``float32[..., V]`` DRY penalty (0 for untouched tokens)."""
    c, m = compact(history, vocab_size)
    t = c.shape[-1]
    i = jnp.arange(t)
    n = jnp.where(last_n < 0, m, jnp.minimum(m, last_n))
    r = jnp.where(i < n[..., None], jnp.flip(c, -1), -(1 + i))
    limit = _restart_limit(r, n, tables)
    max_exp = jnp.where(base > 1.000001, jnp.floor(_FLOAT_MAX_LOG / jnp.log(base)), jnp.inf)
    # The penalty stops growing at L = allowed + max_exp (and at L = allowed when base == 1), so
    # longer matches need not be measured: with base 1.75 no match is followed past 160 tokens.
    saturation = jnp.where(base == 1.0, 0.0, max_exp) + allowed
    cap = jnp.minimum(limit.astype(jnp.float32), saturation).astype(jnp.int32)
    z = _suffix_matches(r, cap)
    # Shift k >= 1: the suffix also ends k tokens back, where it was followed by r[k - 1].
    length, follower = z[..., 1:], r[..., :-1]
    ok = (length >= allowed[..., None]) & (i[1:] < n[..., None])
    # base ** e grows with L (base >= 1), so the per-token maximum of the growth factor belongs to
    # the longest repeat; it is computed on the T candidates, never over V.
    exponent = jnp.minimum((length - allowed[..., None]).astype(jnp.float32), max_exp[..., None])
    growth = jnp.power(base[..., None], exponent)
    zeros = jnp.zeros(history.shape[:-1] + (vocab_size,), jnp.float32)
    factor = _math.scatter(zeros, jnp.where(ok, follower, vocab_size), growth, "max")
    return jnp.where(jnp.asarray(tables.single) | (factor == 0), 0.0, mult[..., None] * factor)


def dry(
    logits: Float["*B V"],
    history: Int["*B T"],
    multiplier: ArrayLike,
    base: ArrayLike = 1.75,
    allowed_length: ArrayLike = 2,
    penalty_last_n: ArrayLike = -1,
    sequence_breakers: Sequence[Sequence[int]] = (),
) -> Float["*B V"]:
    """llama.cpp DRY repetition penalty (see the module docstring for the rule).

    Args:
      logits: ``[..., V]``.
      history: ``int32[..., T]`` token ids, oldest first (llama pushes the prompt, then every
        accepted token); entries outside ``[0, V)`` are ignored.
      multiplier: penalty scale, scalar or ``[...]``; ``0`` = off.
      base: growth per extra repeated token, scalar or ``[...]``; ``< 1`` = off (as llama.cpp).
      allowed_length: repeats shorter than this are free (int ``>= 0``; traced negatives count as
        0), scalar or ``[...]``.
      penalty_last_n: window in tokens, scalar or ``[...]``: ``-1`` (any negative when traced) =
        the whole history, ``0`` = off.
      sequence_breakers: static tuple of token-id tuples ``(head, *tail)`` (llama's processed
        breakers; build them from strings with :func:`dry_sequence_breakers`).

    Returns:
      ``[..., V]`` logits in the input dtype.

    Raises:
      ValueError: NaN parameters, ``allowed_length < 0``, ``penalty_last_n < -1``, non-integer
        lengths, malformed breakers, or shapes that do not broadcast.

    >>> import jax.numpy as jnp
    >>> x = jnp.zeros(4)   # "0 1 2 0 1": emitting 2 would extend the repeat "0 1"
    >>> dry(x, jnp.array([0, 1, 2, 0, 1]), multiplier=1.0, base=1.1).tolist()
    [0.0, 0.0, -1.0, 0.0]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    history = _validate.check_tokens(history, "history", batch)
    mult = _validate.param(multiplier, batch, "multiplier")
    b = _validate.param(base, batch, "base")
    allowed = _validate.param(allowed_length, batch, "allowed_length", dtype=jnp.int32, lo=0)
    last_n = _validate.param(penalty_last_n, batch, "penalty_last_n", dtype=jnp.int32, lo=-1)
    breakers = _validate.static_sequences(sequence_breakers, "sequence_breakers", unique=False)
    return _math.restore(_dry(x, history, mult, b, allowed, last_n, breakers), dtype)


def _dry(x: Array, history: Array, mult: Array, base: Array, allowed: Array, last_n: Array, breakers: tuple) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]``, ``[*B]`` parameters and
    validated static breakers."""
    vocab = x.shape[-1]
    tables = _tables(breakers, vocab)
    if history.shape[-1] == 0:
        return x
    allowed = jnp.maximum(allowed, 0)
    on = (mult != 0) & (base >= 1) & (last_n != 0)

    def apply():
        pen = _penalty(history, vocab, mult, jnp.where(on, base, 2.0), allowed, last_n, tables)
        out = x - pen
        # an overflowing penalty never empties a row
        return _math.nonempty(jnp.where(on[..., None], _math.clean(out), x), x)

    return _math.if_any(on, apply, lambda: x)


# ------------------------------------------------------------------------ breakers from strings
def _vocabulary(vocab, encode) -> tuple[list[str], Callable[[str], Sequence[int]]]:
    """Token texts and an encoder from a tokenizer, or from a list of strings and ``encode``."""
    if hasattr(vocab, "decode") and hasattr(vocab, "encode"):
        size = vocab.get_vocab_size(with_added_tokens=True) if hasattr(vocab, "get_vocab_size") else len(vocab)
        single = [[i] for i in range(size)]
        if hasattr(vocab, "decode_batch"):
            texts = list(vocab.decode_batch(single, skip_special_tokens=False))
        else:
            texts = [vocab.decode(ids, skip_special_tokens=False) for ids in single]
        if encode is None:

            def encode(text):
                out = vocab.encode(text, add_special_tokens=False)
                return out.ids if hasattr(out, "ids") else out

        return texts, encode
    texts = list(vocab)
    if not all(isinstance(s, str) for s in texts):
        raise ValueError("vocab must be a tokenizer or a sequence of token strings (index = token id)")
    if encode is None:
        raise ValueError("encode is required when vocab is a list of token strings")
    return texts, encode


def dry_sequence_breakers(
    breakers: Sequence[str],
    vocab,
    encode: Callable[[str], Sequence[int]] | None = None,
    *,
    max_chars: int = 40,
    max_tail: int = 20,
) -> tuple[tuple[int, ...], ...]:
    """Token-id breakers for :func:`dry` from breaker strings, as llama.cpp preprocesses them.

    Each non-empty breaker is truncated to ``max_chars`` characters. Then for every token id with
    text ``word``: if ``word`` contains the breaker, ``(id,)`` is a single-token breaker; otherwise
    for every suffix of ``word`` that is a proper prefix of the breaker, ``(id, *tail)`` is a
    breaker, with ``tail`` the first ``max_tail`` ids of ``encode(rest of the breaker)``.

    Args:
      breakers: strings, e.g. llama's defaults ``["\\n", ":", "\\"", "*"]``.
      vocab: a ``tokenizers.Tokenizer`` (or any tokenizer with ``decode``/``encode``, e.g. from
        ``transformers``), or a sequence of token texts indexed by id.
      encode: text -> token ids without special tokens; required for a list of texts, optional
        for a tokenizer (defaults to ``vocab.encode(text, add_special_tokens=False)``).
      max_chars: breaker truncation (llama: 40; llama counts bytes, this counts characters).
      max_tail: maximum tail length in tokens (llama: 20).

    Returns:
      Sorted, de-duplicated tuple of token-id tuples, ready to pass as ``sequence_breakers``.

    >>> vocab = ["a", "b", "xab", "ca", "c"]
    >>> dry_sequence_breakers(["ab"], vocab, encode=lambda s: [vocab.index(ch) for ch in s])
    ((0, 1), (2,), (3, 1))
    """
    texts, encode = _vocabulary(vocab, encode)
    found: dict[tuple[int, ...], None] = {}
    tails: dict[str, tuple[int, ...]] = {}
    for breaker in breakers:
        breaker = str(breaker)[:max_chars]
        if not breaker:
            continue
        for tid, word in enumerate(texts):
            if breaker in word:
                found[(tid,)] = None
                continue
            pos = word.find(breaker[0])
            while pos != -1:
                rest = word[pos:]
                if breaker.startswith(rest):
                    remainder = breaker[len(rest) :]
                    if remainder not in tails:
                        tails[remainder] = tuple(int(t) for t in encode(remainder))[:max_tail]
                    found[(tid,) + tails[remainder]] = None
                pos = word.find(breaker[0], pos + 1)
    return tuple(sorted(found))


# ----------------------------------------------------------------------------------------- stage
def _breakers(value, name: str) -> tuple[tuple[int, ...], ...]:
    return _validate.static_sequences(value, name, unique=False)


@dataclasses.dataclass(frozen=True)
class Dry(Stage):
    """llama.cpp DRY over prompt + generated ids, llama's defaults.

    ``last_n`` is the static window ``W`` (``-1`` = the whole ring: ``Sampler.init`` needs
    ``history_size``); ``sequence_breakers`` are static token-id tuples (see
    :func:`dry_sequence_breakers`). Params: ``dry_multiplier`` (``0`` = off), ``dry_base``,
    ``dry_allowed_length`` (int ``>= 0``), ``dry_penalty_last_n`` (``<= W``, ``-1`` = ``W``, ``0`` =
    off; default ``-1``).
    """

    multiplier: float = dataclasses.field(default=0.0, compare=False)
    base: float = dataclasses.field(default=1.75, compare=False)
    allowed_length: int = dataclasses.field(default=2, compare=False)
    last_n: int = static_int(-1, lo=-1)
    sequence_breakers: tuple[tuple[int, ...], ...] = static(_breakers, ())
    _: dataclasses.KW_ONLY
    name: str = "dry"

    @property
    def history(self) -> int:
        return self.last_n

    @property
    def params(self) -> tuple[Param, ...]:
        return (
            Param("dry_multiplier", self.multiplier),
            Param("dry_base", self.base),
            Param("dry_allowed_length", self.allowed_length, jnp.int32, lo=0),
            Param("dry_penalty_last_n", -1, jnp.int32, lo=-1, hi=None if self.last_n < 0 else self.last_n),
        )

    def update(self, x, state, p, info):
        if self.last_n == 0:
            return x, state
        out = _dry(
            x, info.recent(self.last_n), p["dry_multiplier"], p["dry_base"], p["dry_allowed_length"],
            p["dry_penalty_last_n"], self.sequence_breakers,
        )
        return out, state
