"""N-gram and token-sequence processors: no-repeat n-grams, bad words, sequence bias (HF, vLLM).

All of them match patterns against the *end* of a token history. Histories follow
:mod:`jaxsample.penalties`: ``int32[..., T]`` oldest first, entries outside ``[0, V)`` are padding
and are skipped wherever they sit (the history is compacted first, so an n-gram may span a
padding slot). Matching is a fixed-shape comparison of shifted copies of the history,
``O(T * n)`` per row for n-grams and ``O(S * L)`` for ``S`` static sequences of length ``<= L``;
bans and biases reach the vocabulary through one scatter.

Bans are hard constraints: a row whose every token is banned comes out all ``-inf`` (callers can
detect such rows; selectors return token 0 for them).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._types import NEG_INF, Array, ArrayLike
from jaxsample.penalties import _NEVER, _compact


def _shift(c: Array, j: int) -> Array:
    """``c[..., e - j]`` at position ``e`` (``_NEVER`` where ``e < j``)."""
    if j == 0:
        return c
    fill = jnp.full(c.shape[:-1] + (min(j, c.shape[-1]),), _NEVER, c.dtype)
    return jnp.concatenate([fill, c[..., : max(c.shape[-1] - j, 0)]], axis=-1)


def _ban(x: Array, ids: Array, hit: Array) -> Array:
    """``x`` with ``-inf`` at ``ids [..., K]`` wherever ``hit [..., K]``."""
    vocab = x.shape[-1]
    mask = _math.scatter(jnp.zeros(x.shape, bool), jnp.where(hit, ids, vocab), hit, "max")
    return jnp.where(mask, NEG_INF, x)


def no_repeat_ngram(logits: ArrayLike, history: ArrayLike, n: int) -> Array:
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
    t = history.shape[-1]
    if n > t:
        return _math.restore(x, dtype)
    c, _ = _compact(history, x.shape[-1])
    hit = c >= 0
    for j in range(1, n):  # static: the n-gram ending at e must share its first n-1 tokens
        hit &= _shift(c, j) == c[..., t - j, None]
    return _math.restore(_ban(x, c, hit), dtype)


def encoder_no_repeat_ngram(logits: ArrayLike, encoder_ids: ArrayLike, history: ArrayLike, n: int) -> Array:
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
    batch, vocab = x.shape[:-1], x.shape[-1]
    encoder_ids = _validate.check_tokens(encoder_ids, "encoder_ids", batch)
    history = _validate.check_tokens(history, "history", batch)
    t = history.shape[-1]
    if n - 1 > t:
        return _math.restore(x, dtype)
    e, _ = _compact(encoder_ids, vocab)
    c, m = _compact(history, vocab)
    hit = (e >= 0) & (m >= n - 1)[..., None]
    for j in range(1, n):
        hit &= _shift(e, j) == c[..., t - j, None]
    return _math.restore(_ban(x, e, hit), dtype)


# ----------------------------------------------------------------------- static token sequences
class _Sequences:
    """Static sequences packed for matching: right-aligned prefixes, last tokens, lengths."""

    def __init__(self, sequences: tuple[tuple[int, ...], ...]):
        self.count = len(sequences)
        self.lengths = np.array([len(s) for s in sequences], np.int32)
        self.last = np.array([s[-1] for s in sequences], np.int32)
        width = int(self.lengths.max(initial=1)) - 1
        self.prefix = np.full((self.count, width), _NEVER, np.int32)
        self.care = np.zeros((self.count, width), bool)
        for i, s in enumerate(sequences):
            if len(s) > 1:
                self.prefix[i, width - len(s) + 1 :] = s[:-1]
                self.care[i, width - len(s) + 1 :] = True
        self.width = width


@functools.lru_cache(maxsize=64)
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
    c, m = _compact(history, vocab_size)
    w = packed.width
    t = c.shape[-1]
    if w > t:
        c = jnp.concatenate([jnp.full(c.shape[:-1] + (w - t,), _NEVER, c.dtype), c], axis=-1)
    tail = c[..., c.shape[-1] - w :]
    eq = (tail[..., None, :] == packed.prefix) | ~packed.care
    need = np.where(packed.lengths > 1, packed.lengths - (0 if skip_longer else 1), 0)
    return jnp.all(eq, axis=-1) & (m[..., None] >= need)


def bad_words(
    logits: ArrayLike,
    history: ArrayLike,
    sequences: Sequence[Sequence[int]],
    eos_ids: Sequence[int] = (),
    *,
    skip_longer_than_context: bool = False,
) -> Array:
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
    vocab = x.shape[-1]
    history = _validate.check_tokens(history, "history", x.shape[:-1])
    eos = {int(e) for e in eos_ids}
    seqs = _validate.static_sequences(sequences, "sequences", unique=False)
    seqs = tuple(s for s in seqs if not (len(s) == 1 and s[0] in eos))
    if not seqs:
        return _math.restore(x, dtype)
    packed = _pack(seqs, vocab, "sequences")
    hit = _completes(history, packed, vocab, skip_longer_than_context)
    return _math.restore(_ban(x, jnp.asarray(packed.last), hit), dtype)


def sequence_bias(
    logits: ArrayLike,
    history: ArrayLike,
    sequences: Sequence[Sequence[int]],
    biases: ArrayLike,
    *,
    skip_longer_than_context: bool = True,
) -> Array:
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
    batch, vocab = x.shape[:-1], x.shape[-1]
    history = _validate.check_tokens(history, "history", batch)
    packed = _pack(_validate.static_sequences(sequences, "sequences"), vocab, "sequences")
    b = _row_biases(biases, batch, packed.count)
    hit = _completes(history, packed, vocab, skip_longer_than_context)
    total = _math.scatter(jnp.zeros(x.shape, jnp.float32), jnp.asarray(packed.last), jnp.where(hit, b, 0.0))
    out = x + total
    return _math.restore(_math.clean(out), dtype)


def _row_biases(biases: ArrayLike, batch: tuple[int, ...], count: int) -> Array:
    """``float32[..., S]`` biases broadcast to the batch (``ValueError`` naming ``biases``)."""
    shape = tuple(np.shape(biases))
    if not shape or shape[-1] != count:
        raise ValueError(f"biases must have a trailing axis of size {count} (one per sequence), got shape {shape}")
    _validate.check_range(biases, "biases")  # numeric, not NaN (-inf bans)
    try:
        ok = np.broadcast_shapes(shape[:-1], batch) == tuple(batch)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"biases has leading shape {shape[:-1]}, which does not broadcast to the batch shape {batch}")
    return jnp.broadcast_to(jnp.asarray(biases, jnp.float32), batch + (count,))
