"""Categorical sampling: one draw from ``softmax(logits)`` per row by the Gumbel-max trick.

The Gumbel noise is addressed by token id (:mod:`jaxsample._noise`), so a row with at most ``K``
finite logits draws noise for its candidates only and still returns exactly
``argmax(logits + gumbel)`` over the whole vocabulary. Other rows hash every token id but take
the noise's logarithms for ``K`` tokens only (:func:`_dense`).

Per backend (``lax.platform_dependent``, the same token everywhere): on CPU, one ``lax.top_k`` of
``K + 1`` entries over a whole vocabulary row; rows with more finite logits hash every token id (and
take a second ``lax.top_k`` over the bounds), a batch-level ``lax.cond`` (an all-reduce of one bool
under GSPMD; both branches under ``vmap``). On GPU and TPU, where ``lax.top_k`` costs more than the
logarithms it saves, every row hashes every token id in one fused pass and takes the ``argmax``
(:func:`_whole_row`). Sharding: rows are independent; shard the batch axis.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax.numpy as jnp
from jax import lax

from jaxsample import _candidates, _fastpath, _math, _noise, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES, Candidates
from jaxsample._types import Array, Float, Int, Key
from jaxsample.chain import Selector, static_int


def gumbel_max(keys: Array, vals: Array, ids: Array) -> Array:
    """``int32[*B]``: the id maximising ``vals + gumbel(id)`` over candidates ``[*B, K]`` (ties: lowest id).

    This is ``argmax`` over the whole row as long as every finite logit is a candidate; a row with
    no finite candidate returns 0, like ``argmax`` of an all ``-inf`` row.
    """
    y = jnp.where(vals > -jnp.inf, vals + _noise.gumbel_at(keys, ids), -jnp.inf)
    best = jnp.max(y, axis=-1, keepdims=True)
    token = jnp.min(jnp.where(y == best, ids, jnp.iinfo(jnp.int32).max), axis=-1)
    return jnp.where(best[..., 0] > -jnp.inf, token, 0).astype(jnp.int32)


def certain(x: Array) -> Array:
    """Rows holding ``+inf`` logits sample uniformly among them: map those to 0, others to -inf."""
    posinf = _math.row_max(x) == jnp.inf
    return _math.if_any(posinf, lambda: jnp.where(posinf, jnp.where(x == jnp.inf, 0.0, -jnp.inf), x), lambda: x)


def _exact(keys: Array, x: Array) -> Array:
    """``argmax(x + gumbel)`` over every token of NaN-free ``x [*B, V]``: ``int32[*B]`` (all ``-inf``: 0)."""
    return _math.argmax(jnp.where(x > -jnp.inf, x + _noise.gumbel_all(keys, x.shape[-1]), -jnp.inf))


def _dense(keys: Array, x: Array, k: int, read: Callable[[Array], Array] = _math.identity) -> Array:
    """``argmax(x + gumbel)`` over every token of ``read(x) [*B, V]`` (NaN-free, after :func:`certain`).

    The noise's logarithms are taken for ``k`` tokens only: the ``k + 1`` largest of ``x +``
    :func:`jaxsample._noise.gumbel_bound` (an upper bound of every token's ``x + gumbel``, the hash
    alone) are candidates, and the best of the first ``k`` is the row's draw as soon as its exact
    ``x + gumbel`` exceeds the ``(k + 1)``-th bound (no other token can reach it). Rows where it does
    not (all ``-inf``, or a near tie) take the exact draw over the whole row. ``read`` is applied where
    ``x`` is read (the NaN map of a public call), so that no mapped copy is written.
    """
    vocab = x.shape[-1]
    # Written out once (read by the chunk maxima, then gathered): the hash fused into the maxima
    # pass (_candidates.top's ``at``) took ~30 passes instead of ~4.
    bound = jnp.where(read(x) > -jnp.inf, read(x) + _noise.gumbel_bound(_noise.bits_all(keys, vocab)), -jnp.inf)
    bounds, ids = _candidates.top(bound, k + 1)
    vals = read(jnp.take_along_axis(x, ids[..., :k], axis=-1))
    y = jnp.where(vals > -jnp.inf, vals + _noise.gumbel_at(keys, ids[..., :k]), -jnp.inf)
    pruned = jnp.max(y, axis=-1) > bounds[..., k]
    return _candidates.choose(pruned, lambda: gumbel_max(keys, vals, ids[..., :k]), lambda: _exact(keys, read(x)))


def _whole_row(keys: Array, x: Array) -> Array:
    """:func:`draw` as one fused pass over the row (GPU, TPU): every token id hashed, no ``lax.top_k``."""
    return _exact(keys, certain(x))


def _on_candidates(keys: Array, x: Array, candidates: int, read: Callable[[Array], Array] = _math.identity) -> Array:
    """:func:`draw` through the ``K`` largest logits (CPU): noise for the candidates only where they
    hold every finite logit, else :func:`_dense`."""
    batch, vocab = x.shape[:-1], x.shape[-1]
    k = min(candidates, vocab)
    vals, ids = _candidates.top_of(x, min(k + 1, vocab), read)
    # +inf logits come first among the candidates (ties in id order), so certain() on them is the
    # candidates of certain(x); only rows holding +inf pay for certain() over the whole row.
    posinf = vals[..., 0] == jnp.inf
    vals = certain(vals)
    covered = vals[..., -1] == -jnp.inf if k < vocab else jnp.ones(batch, bool)
    vals, ids = vals[..., :k], ids[..., :k]

    def full():
        if k >= vocab:
            return gumbel_max(keys, vals, ids)
        return _math.if_any(posinf, lambda: _dense(keys, certain(read(x)), k), lambda: _dense(keys, x, k, read))

    return _candidates.choose(covered, lambda: gumbel_max(keys, vals, ids), full)


def draw(keys: Array, x: Array, candidates: int, clean: bool = False) -> Array:
    """The draw of :func:`categorical` on typed ``keys [*B]`` and NaN-free float32 ``x [*B, V]``: ``int32[*B]``
    (shared by the adaptive selectors). The token is ``argmax(x + gumbel)`` on every backend; the
    program that finds it is the backend's fastest (module docstring). ``clean``: ``x`` may hold NaN
    (drawn as ``-inf``), mapped where each pass reads ``x``: on CPU no NaN-mapped ``[B, V]`` copy is
    written (a conditional takes its operands from memory)."""
    read = _math.clean if clean else _math.identity
    return lax.platform_dependent(
        keys, x, cpu=functools.partial(_on_candidates, candidates=candidates, read=read),
        default=lambda keys, x: _whole_row(keys, read(x)),
    )


def categorical(key: Key["*B"], logits: Float["*B V"], *, candidates: int = DEFAULT_CANDIDATES) -> Int["*B"]:
    """One draw from ``softmax(logits)`` per row by the Gumbel-max trick, ``int32[...]``.

    The token is ``argmax(logits + G)`` with ``G`` the Gumbel noise of :mod:`jaxsample._noise`,
    which is addressed by token id. Rows with at most ``candidates`` finite logits (any row after
    top-k, most rows after top-p or min-p) draw noise for their candidates only; other rows draw it
    for the whole vocabulary. Both paths return the same token, so results do not depend on the
    batch. No sort is performed.

    Args:
      key: a single key, or one key per row (typed ``[...]`` or raw ``uint32[..., 2]``). With one
        key per row, a row's draw depends only on its key and its logits.
      logits: ``[..., V]``; NaN counts as ``-inf``.
      candidates: static size of the candidate fast path.

    Returns:
      ``int32[...]`` token ids. A row with no finite logit returns 0.

    >>> import jax, jax.numpy as jnp
    >>> int(categorical(jax.random.key(0), jnp.array([-jnp.inf, 0.0, -jnp.inf])))
    1
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, _ = _math.prepare(logits, map_nan=False)
    return draw(_noise.row_keys(key, x.shape[:-1]), x, candidates, clean=True)


@dataclasses.dataclass(frozen=True)
class Categorical(Selector, _fastpath.CandidateSelector):
    """Selector drawing from ``softmax(logits)`` with the row's per-step key (llama.cpp ``dist``)."""

    _: dataclasses.KW_ONLY
    candidates: int = static_int(DEFAULT_CANDIDATES)
    name: str = dataclasses.field(default="dist", init=False)

    def select(self, x, state, params, info):
        return draw(info.key, x, self.candidates), state

    def select_candidates(self, c: Candidates, state, params, info):
        """The draw from complete candidates."""
        return gumbel_max(info.key, certain(c.vals), c.ids), state
