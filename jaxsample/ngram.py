"""N-gram and token-sequence processors: no-repeat n-grams, bad words, sequence bias (HF, vLLM).

All of them match patterns against the *end* of a token history. Histories follow
:mod:`jaxsample.penalties`: ``int32[..., T]`` oldest first, entries outside ``[0, V)`` are padding
and are skipped wherever they sit (the history is compacted first, so an n-gram may span a
padding slot). Matching is a fixed-shape comparison of shifted copies of the history,
``O(T * n)`` per row for n-grams and ``O(S * L)`` for ``S`` static sequences of length ``<= L``;
bans and biases reach the vocabulary through one scatter.

Bans are hard constraints: a row whose every token is banned comes out all ``-inf`` (callers can
detect such rows; selectors return token 0 for them). Each function has its chain stage next to it;
the sequences and ``n`` are static (they fix shapes), biases are per-row parameters.

Sharding/TPU: rows are independent; shard the batch axis. Fixed-shape comparisons over the history
and one scatter into ``[*B, V]``; no batch-level branch.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._history import NEVER, compact
from jaxsample._types import NEG_INF, Array, ArrayLike, Float, Int
from jaxsample.chain import Param, Stage, static_int


def _shift(c: Array, j: int) -> Array:
    """``c[..., e - j]`` at position ``e`` (``NEVER`` where ``e < j``)."""
    if j == 0:
        return c
    fill = jnp.full(c.shape[:-1] + (min(j, c.shape[-1]),), NEVER, c.dtype)
    return jnp.concatenate([fill, c[..., : max(c.shape[-1] - j, 0)]], axis=-1)


def _ban(x: Array, ids: Array, hit: Array) -> Array:
    """``x`` with ``-inf`` at ``ids [..., K]`` wherever ``hit [..., K]``."""
    vocab = x.shape[-1]
    mask = _math.scatter(jnp.zeros(x.shape, bool), jnp.where(hit, ids, vocab), hit, "max")
    return jnp.where(mask, NEG_INF, x)


def no_repeat_ngram(logits: Float["*B V"], history: Int["*B T"], n: int) -> Float["*B V"]:
    """HF ``NoRepeatNGramLogitsProcessor``: bans every token that would repeat an n-gram.

    A token ``t`` is banned when the history already contains the n-gram
    ``(h[-n+1], ..., h[-1], t)``, i.e. its last ``n - 1`` tokens followed by ``t``. ``n = 1`` bans
    every token of the history.

    Args:
      logits: ``[..., V]``.
      history: ``int32[..., T]`` (HF passes the whole ``input_ids``, prompt included).
      n: static n-gram size ``>= 1``.

    Returns:
      ``[..., V]`` logits in the input dtype, banned tokens at ``-inf``.

    >>> import jax.numpy as jnp
    >>> no_repeat_ngram(jnp.zeros(5), jnp.array([1, 1, 2, 1]), 2).tolist()
    [0.0, -inf, -inf, 0.0, 0.0]
    """
    n = _validate.static_int(n, "n", lo=1)
    x, dtype = _math.prepare(logits)
    history = _validate.check_tokens(history, "history", x.shape[:-1])
    return _math.restore(_no_repeat_ngram(x, history, n), dtype)


def _no_repeat_ngram(x: Array, history: Array, n: int) -> Array:
    """The core on NaN-free float32 ``x [*B, V]`` and ``history int32[*B, T]``."""
    t = history.shape[-1]
    if n > t:
        return x
    c, _ = compact(history, x.shape[-1])
    hit = c >= 0
    for j in range(1, n):  # static: the n-gram ending at e must share its first n-1 tokens
        hit &= _shift(c, j) == c[..., t - j, None]
    return _ban(x, c, hit)


def encoder_no_repeat_ngram(
    logits: Float["*B V"], encoder_ids: Int["*B S"], history: Int["*B T"], n: int
) -> Float["*B V"]:
    """HF ``EncoderNoRepeatNGramLogitsProcessor``: bans continuations that copy an encoder n-gram.

    A token ``t`` is banned when ``(h[-n+1], ..., h[-1], t)`` occurs in ``encoder_ids``, with
    ``h`` the decoder history. ``n = 1`` bans every encoder token.

    Args:
      logits: ``[..., V]``.
      encoder_ids: ``int32[..., S]`` encoder input ids.
      history: ``int32[..., T]`` decoder ids (only the last ``n - 1`` tokens matter).
      n: static n-gram size ``>= 1``.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> encoder_no_repeat_ngram(jnp.zeros(4), jnp.array([1, 2, 1, 1]), jnp.array([3, 1]), 2).tolist()
    [0.0, -inf, -inf, 0.0]
    """
    n = _validate.static_int(n, "n", lo=1)
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    encoder_ids = _validate.check_tokens(encoder_ids, "encoder_ids", batch)
    history = _validate.check_tokens(history, "history", batch)
    return _math.restore(_encoder_no_repeat_ngram(x, encoder_ids, history, n), dtype)


def _encoder_no_repeat_ngram(x: Array, encoder_ids: Array, history: Array, n: int) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``encoder_ids int32[*B, S]``, ``history int32[*B, T]``."""
    vocab, t = x.shape[-1], history.shape[-1]
    if n - 1 > t:
        return x
    e, _ = compact(encoder_ids, vocab)
    c, m = compact(history, vocab)
    hit = (e >= 0) & (m >= n - 1)[..., None]
    for j in range(1, n):
        hit &= _shift(e, j) == c[..., t - j, None]
    return _ban(x, e, hit)


# ----------------------------------------------------------------------- static token sequences
class _Sequences:
    """Static sequences packed for matching: right-aligned prefixes, last tokens, lengths."""

    def __init__(self, sequences: tuple[tuple[int, ...], ...]):
        self.count = len(sequences)
        self.lengths = np.array([len(s) for s in sequences], np.int32)
        self.last = np.array([s[-1] for s in sequences], np.int32)
        width = int(self.lengths.max(initial=1)) - 1
        self.prefix = np.full((self.count, width), NEVER, np.int32)
        self.care = np.zeros((self.count, width), bool)
        for i, s in enumerate(sequences):
            if len(s) > 1:
                self.prefix[i, width - len(s) + 1 :] = s[:-1]
                self.care[i, width - len(s) + 1 :] = True
        self.width = width


def _pack(sequences, vocab_size: int, name: str) -> _Sequences:
    seqs = _validate.static_sequences(sequences, name)
    bad = sorted({t for s in seqs for t in s if t >= vocab_size})
    if bad:
        raise ValueError(f"{name} holds token ids outside the vocabulary (V={vocab_size}): {bad[:10]}")
    return _Sequences(seqs)


def _completes(history: Array, packed: _Sequences, vocab_size: int, skip_longer: bool) -> Array:
    """``bool[..., S]``: whether each sequence would be completed by its last token next.

    The last ``L - 1`` tokens of the history must equal the sequence's prefix. With
    ``skip_longer`` (HF), a sequence of length ``L > 1`` also needs ``L`` tokens of history.
    """
    c, m = compact(history, vocab_size)
    w = packed.width
    t = c.shape[-1]
    if w > t:
        c = jnp.concatenate([jnp.full(c.shape[:-1] + (w - t,), NEVER, c.dtype), c], axis=-1)
    tail = c[..., c.shape[-1] - w :]
    eq = (tail[..., None, :] == packed.prefix) | ~packed.care
    need = np.where(packed.lengths > 1, packed.lengths - (0 if skip_longer else 1), 0)
    return jnp.all(eq, axis=-1) & (m[..., None] >= need)


def bad_words(
    logits: Float["*B V"],
    history: Int["*B T"],
    sequences: Sequence[Sequence[int]],
    eos_ids: Sequence[int] = (),
    *,
    skip_longer_than_context: bool = False,
) -> Float["*B V"]:
    """Bans the last token of every sequence whose other tokens end the history (vLLM / HF).

    For each static ``sequence = (t1, ..., tL)``: ``tL`` gets ``-inf`` when the last ``L - 1``
    history tokens are ``t1 .. t(L-1)`` (always for ``L = 1``). vLLM matches the generated tokens
    only, HF (``NoBadWordsLogitsProcessor``) the whole ``input_ids``: pass the matching history.

    Args:
      logits: ``[..., V]``.
      history: ``int32[..., T]``.
      sequences: static collection of non-empty token-id sequences, ids in ``[0, V)``.
      eos_ids: static EOS ids; single-token sequences equal to one of them are dropped (HF).
      skip_longer_than_context: HF's rule: a sequence of length ``L > 1`` is ignored unless the
        history holds at least ``L`` tokens (vLLM needs ``L - 1``).

    Returns:
      ``[..., V]`` logits in the input dtype.

    Raises:
      ValueError: on empty sequences, negative ids or ids ``>= V`` (repeated sequences are merged).

    >>> import jax.numpy as jnp
    >>> bad_words(jnp.zeros(4), jnp.array([2, 1]), ((3,), (1, 0), (2, 2))).tolist()
    [-inf, 0.0, 0.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    history = _validate.check_tokens(history, "history", x.shape[:-1])
    seqs = _validate.static_sequences(sequences, "sequences", unique=False)
    return _math.restore(_bad_words(x, history, seqs, tuple(int(e) for e in eos_ids), skip_longer_than_context), dtype)


def _bad_words(x: Array, history: Array, seqs: tuple, eos_ids: tuple[int, ...], skip_longer: bool) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]`` and validated static sequences."""
    seqs = tuple(s for s in seqs if not (len(s) == 1 and s[0] in set(eos_ids)))
    if not seqs:
        return x
    packed = _pack(seqs, x.shape[-1], "sequences")
    hit = _completes(history, packed, x.shape[-1], skip_longer)
    return _ban(x, jnp.asarray(packed.last), hit)


def sequence_bias(
    logits: Float["*B V"],
    history: Int["*B T"],
    sequences: Sequence[Sequence[int]],
    biases: ArrayLike,
    *,
    skip_longer_than_context: bool = True,
) -> Float["*B V"]:
    """HF ``SequenceBiasLogitsProcessor``: adds a bias to the token that would complete a sequence.

    For each static ``sequence = (t1, ..., tL)`` with bias ``b``: ``logit[tL] += b`` when the last
    ``L - 1`` history tokens are ``t1 .. t(L-1)`` (always for ``L = 1``); biases of sequences
    ending in the same token add up. As in HF, a sequence longer than the history is ignored.

    Args:
      logits: ``[..., V]``.
      history: ``int32[..., T]`` (HF: the whole ``input_ids``).
      sequences: static collection of ``S`` non-empty token-id sequences, ids in ``[0, V)``.
      biases: ``float[..., S]``, one bias per sequence (per row if batched); ``-inf`` bans.
      skip_longer_than_context: HF's rule (default); ``False`` needs only ``L - 1`` tokens.

    Returns:
      ``[..., V]`` logits in the input dtype (``+inf`` logits hit by a ``-inf`` bias are ``-inf``).

    Raises:
      ValueError: on invalid sequences, or ``biases`` whose shape is not ``[..., S]``.

    >>> import jax.numpy as jnp
    >>> seqs = ((2,), (1, 0), (0, 1, 2))   # (0, 1, 2) is longer than the history: ignored (HF)
    >>> sequence_bias(jnp.zeros(3), jnp.array([0, 1]), seqs, [1.0, -2.0, 0.5]).tolist()
    [-2.0, 0.0, 1.0]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    history = _validate.check_tokens(history, "history", batch)
    seqs = _validate.static_sequences(sequences, "sequences")
    b = _row_biases(biases, batch, len(seqs))
    return _math.restore(_sequence_bias(x, history, seqs, b, skip_longer_than_context), dtype)


def _sequence_bias(x: Array, history: Array, seqs: tuple, biases: Array, skip_longer: bool) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``, ``history int32[*B, T]``, ``biases float32[*B, S]``."""
    packed = _pack(seqs, x.shape[-1], "sequences")
    hit = _completes(history, packed, x.shape[-1], skip_longer)
    total = _math.scatter(jnp.zeros(x.shape, jnp.float32), jnp.asarray(packed.last), jnp.where(hit, biases, 0.0))
    return _math.clean(x + total)


def _row_biases(biases: ArrayLike, batch: tuple[int, ...], count: int) -> Array:
    """``float32[..., S]`` biases broadcast to the batch (``ValueError`` naming ``biases``)."""
    shape = tuple(np.shape(biases))
    if not shape or shape[-1] != count:
        raise ValueError(f"biases must have a trailing axis of size {count} (one per sequence), got shape {shape}")
    _validate.check_range(biases, "biases")  # numeric, not NaN (-inf bans)
    _validate.check_broadcast(shape[:-1], batch, "biases", what="leading shape", hint="")
    return jnp.broadcast_to(jnp.asarray(biases, jnp.float32), batch + (count,))


# ----------------------------------------------------------------------------------------- stages
@dataclasses.dataclass(frozen=True)
class NoRepeatNgram(Stage):
    """HF ``NoRepeatNGramLogitsProcessor`` over prompt + generated ids.

    ``n`` (HF ``no_repeat_ngram_size``) is static: it fixes the shapes of the n-gram match. Use a
    chain without this stage for rows that should not use it. ``last_n`` is the static window
    (``-1`` = the whole ring, as HF: ``Sampler.init`` then needs a ``history_size`` that holds the
    prompt and every generated token, or the oldest n-grams are forgotten).
    """

    n: int = static_int()
    _: dataclasses.KW_ONLY
    last_n: int = static_int(-1, lo=-1)
    name: str = "no_repeat_ngram"

    @property
    def history(self) -> int:
        return self.last_n

    def update(self, x, state, params, info):
        return _no_repeat_ngram(x, info.recent(self.last_n), self.n), state


@dataclasses.dataclass(frozen=True)
class EncoderNoRepeatNgram(Stage):
    """HF ``EncoderNoRepeatNGramLogitsProcessor``: n-grams of ``StepInfo.encoder_ids``, static ``n``."""

    n: int = static_int()
    _: dataclasses.KW_ONLY
    name: str = "encoder_no_repeat_ngram"

    @property
    def history(self) -> int:
        return self.n - 1

    def update(self, x, state, params, info):
        if info.encoder_ids is None:
            raise ValueError(
                f"stage {self.name!r} needs encoder_ids= in Sampler.init (HF: encoder-decoder models only)"
            )
        return _encoder_no_repeat_ngram(x, info.encoder_ids, info.recent(self.n - 1), self.n), state


@dataclasses.dataclass(frozen=True)
class BadWords(Stage):
    """Bans token sequences: ``scope="vllm"`` matches generated tokens only, ``"hf"`` the whole
    ``input_ids`` with HF's rules (a sequence longer than the context is ignored; single-token
    sequences equal to an ``eos_ids`` entry are dropped)."""

    sequences: tuple[tuple[int, ...], ...]
    _: dataclasses.KW_ONLY
    scope: str = "vllm"
    eos_ids: tuple[int, ...] = ()
    name: str = "bad_words"

    def __post_init__(self):
        if self.scope not in ("vllm", "hf"):
            raise ValueError(f"scope must be 'vllm' or 'hf', got {self.scope!r}")
        object.__setattr__(self, "sequences", _validate.static_sequences(self.sequences, "sequences", unique=False))
        object.__setattr__(self, "eos_ids", tuple(int(e) for e in self.eos_ids))
        super().__post_init__()

    @property
    def history(self) -> int:
        longest = max((len(q) for q in self.sequences), default=1)
        return longest if self.scope == "hf" else longest - 1

    def update(self, x, state, params, info):
        h = info.recent(self.history)
        if self.scope == "vllm":
            h = info.generated(h)
        return _bad_words(x, h, self.sequences, self.eos_ids, self.scope == "hf"), state


@dataclasses.dataclass(frozen=True)
class SequenceBias(Stage):
    """HF ``SequenceBiasLogitsProcessor`` over prompt + generated ids.

    Each sequence ``i`` reads its bias from the per-row param ``f"{name}_{i}"`` (default
    ``biases[i]``), so biases change per row and per call without recompiling.
    """

    sequences: tuple[tuple[int, ...], ...]
    biases: tuple[float, ...] = dataclasses.field(compare=False)
    _: dataclasses.KW_ONLY
    name: str = "sequence_bias"

    def __post_init__(self):
        seqs = _validate.static_sequences(self.sequences, "sequences")
        biases = tuple(float(b) for b in self.biases)
        if len(biases) != len(seqs):
            raise ValueError(f"biases needs one value per sequence ({len(seqs)}), got {len(biases)}")
        object.__setattr__(self, "sequences", seqs)
        object.__setattr__(self, "biases", biases)
        super().__post_init__()

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(Param(f"{self.name}_{i}", b) for i, b in enumerate(self.biases))

    @property
    def history(self) -> int:
        return max((len(q) for q in self.sequences), default=1)

    def update(self, x, state, params, info):
        b = jnp.stack([params[f"{self.name}_{i}"] for i in range(len(self.sequences))], axis=-1)
        return _sequence_bias(x, info.recent(self.history), self.sequences, b, True), state
