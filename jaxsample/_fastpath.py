"""The candidate fast path of :meth:`jaxsample.Sampler.sample`: the same step on ``[B, K]`` candidates.

A sampler step is, by definition, ``process -> select -> accept`` on ``[B, V]`` logits. After a
filter such as ``top_k(40)`` a row has fewer than ``K`` finite logits, and everything the rest of a
typical chain does (top-p, min-p, temperature, the draw) only needs those. This module computes
``process -> select`` that way whenever it provably gives the same result, bit for bit:

* an *entry* (:class:`CandidateEntry`: ``top_k``, ``top_p``) returns its output as
  :class:`~jaxsample._candidates.Candidates`, the rows that output holds completely (every finite
  logit among fewer than ``K`` candidates), and a thunk for its dense output;
* every later stage must be a :class:`CandidateForm` and the selector a :class:`CandidateSelector`
  (the same computation on candidates); a form that covers only some parameter values (``typical``
  and ``xtc`` when off, dynamic temperature with ``delta <= 0``) says which rows it handles;
* the batch switches (one ``lax.cond``) when every row is complete and handled; otherwise the step
  stays dense. So whether a batch takes the candidates or not never changes a row's result.

Contract of a form, for complete rows: it returns exactly what the dense stage returns on the
densified row. The dense cores are written to make this hold: what they reduce over the vocabulary
they reduce over :func:`jaxsample._candidates.top` for complete rows, and order-dependent steps
(cumulative sums) see the canonical candidate order, which every form keeps.
``tests/test_fastpath.py`` checks it for every stage and preset.

Sharding/TPU: the switch is a batch-level ``lax.cond``; under GSPMD its predicate is an all-reduce
over the batch shards, and under ``vmap`` both branches run (same result, no saving). Candidate
arrays ``[B, K]`` are small and follow the batch sharding of the logits.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxsample import _candidates, _math
from jaxsample._candidates import Candidates
from jaxsample._types import Array
from jaxsample.chain import apply

Entry = tuple[Candidates, Array, Callable[[], Array]]


class CandidateForm:
    """A stage that can also run on candidates (mix into a :class:`jaxsample.Stage`)."""

    #: The static candidate count ``K`` the form's arithmetic depends on (``None``: any); a chain only
    #: switches when it matches the entry's.
    candidate_count: int | None = None

    def candidate_rows(self, params) -> Array | None:
        """``bool[B]``: the rows whose parameter values :meth:`on_candidates` covers (``None``: all)."""
        return None

    def on_candidates(self, c: Candidates, state: Any, params, info) -> tuple[Candidates, Any]:
        """The stage on complete candidates ``[B, K]``, in canonical order in and out."""
        raise NotImplementedError


class CandidateEntry(CandidateForm):
    """A filter that can start the candidate regime (stateless)."""

    def enter_candidates(self, x: Array, state: Any, params, info) -> Entry:
        """``(candidates, complete bool[B], dense thunk)`` of the filter's output on ``x [B, V]``."""
        raise NotImplementedError


class CandidateSelector:
    """A selector that can also draw from candidates (mix into a :class:`jaxsample.Selector`)."""

    def select_candidates(self, c: Candidates, state: Any, params, info) -> tuple[Array, Any]:
        """The selection on complete candidates: ``(tokens int32[B], state)``."""
        raise NotImplementedError


def enter(x: Array, on: Array, k: int, filtered: Callable, dense: Callable) -> Entry:
    """An entry from a filter's two halves.

    Args:
      x: ``float32[B, V]`` NaN-free logits.
      on: ``bool[B]`` rows where the filter does something; if none, the batch stays dense.
      k: static candidate count.
      filtered: ``top -> (keep bool[B, K], aux)``: the filter on the ``K`` largest logits, and
        whatever (small) values the dense output needs.
      dense: ``(top, aux) -> float32[B, V]`` the dense output.
    """
    vocab = x.shape[-1]
    k = min(k, vocab)

    def compute():
        top = _candidates.top(x, k)
        keep, aux = filtered(top)
        out = Candidates(*top).mask(keep)
        finite = top[0][..., 0] < jnp.inf  # rows holding +inf logits take the dense path
        return out, _candidates.complete(out.vals, vocab) & finite, top, aux

    shapes = jax.eval_shape(compute)
    idle = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731 (ok = False)
    out, ok, top, aux = _math.if_any(on, compute, idle)
    return out, ok, lambda: _math.if_any(on, lambda: dense(top, aux), lambda: x)


def _usable(sampler, i: int, k: int, vocab: int) -> bool:
    """Whether stages ``i..`` and the selector all have forms usable with ``k`` candidates."""
    forms = sampler.stages[i:]
    def ok(f):
        return isinstance(f, CandidateForm) and (f.candidate_count is None or min(f.candidate_count, vocab) == k)

    return isinstance(sampler.selector, CandidateSelector) and all(ok(f) for f in forms)


def _is_entry(sampler, j: int, vocab: int) -> bool:
    """Whether stage ``j`` is an entry whose candidates every later stage and the selector can take."""
    stage = sampler.stages[j]
    return isinstance(stage, CandidateEntry) and _usable(sampler, j + 1, min(stage.candidate_count, vocab), vocab)


def _enter(sampler, j: int, x: Array, states: tuple, params, infos: dict) -> Entry:
    """The entry stage ``j`` on ``x``, its ``ok`` narrowed to the rows every later form handles."""
    stage = sampler.stages[j]
    c, ok, dense = stage.enter_candidates(x, states[j], params, infos[stage.name])
    for later in sampler.stages[j + 1 :]:
        rows = later.candidate_rows(params)
        if rows is not None:
            ok &= rows
    return c, ok, dense


def _forms(sampler, i: int, c: Candidates, states: tuple, state, params, infos: dict, vocab: int):
    """Stages ``i..`` and the selector on candidates: ``(tokens, processed [B, V], states, selector state)``."""
    states = list(states)
    for j in range(i, len(sampler.stages)):
        stage = sampler.stages[j]
        c, states[j] = stage.on_candidates(c, states[j], params, infos[stage.name])
    info = infos[sampler.selector.name]
    tokens, sel = sampler.selector.select_candidates(c, state.selector, params, info)
    return tokens.astype(jnp.int32), _candidates.densify(c, vocab), tuple(states), sel


def _dense(sampler, i: int, x: Array, states: tuple, state, params, infos: dict):
    """Stages ``i..`` and the selector on ``x [B, V]``, switching to candidates at the first usable entry."""
    states = list(states)
    vocab = x.shape[-1]
    for j in range(i, len(sampler.stages)):
        if _is_entry(sampler, j, vocab):
            c, ok, dense = _enter(sampler, j, x, tuple(states), params, infos)
            frozen = tuple(states)
            return _math.cond(
                jnp.all(ok),
                lambda: _forms(sampler, j + 1, c, frozen, state, params, infos, vocab),
                lambda: _dense(sampler, j + 1, dense(), frozen, state, params, infos),
            )
        stage = sampler.stages[j]
        x, states[j] = apply(stage, x, states[j], params, infos[stage.name])
    tokens, sel = sampler.select(x, state, params)
    return tokens, x, tuple(states), sel.selector


def process_select(sampler, x: Array, state, params) -> tuple[Array, Array, tuple, Any]:
    """``process`` then ``select`` on NaN-free float32 ``x [B, V]``, on candidates when the batch allows it.

    Returns:
      ``(tokens int32[B], processed float32[B, V], stage states, selector state)``, equal bit for bit
      to :meth:`~jaxsample.Sampler.process` followed by :meth:`~jaxsample.Sampler.select`.
    """
    return _dense(sampler, 0, x, state.stages, state, params, sampler.step_infos(state, params))


def candidate_path(sampler, x: Array, state, params):
    """The candidate computation alone, without the switch (tests and benchmarks).

    Runs the stages before the first usable entry densely, then the entry and the forms. Returns
    ``None`` when the chain has no usable entry, else ``(tokens, processed, stage states, selector
    state, ok bool[B])``: equal to the dense step in every row where ``ok``.
    """
    vocab = x.shape[-1]
    j = next((j for j in range(len(sampler.stages)) if _is_entry(sampler, j, vocab)), None)
    if j is None:
        return None
    states = list(state.stages)
    infos = sampler.step_infos(state, params)
    for i in range(j):
        stage = sampler.stages[i]
        x, states[i] = apply(stage, x, states[i], params, infos[stage.name])
    c, ok, _ = _enter(sampler, j, x, tuple(states), params, infos)
    return _forms(sampler, j + 1, c, tuple(states), state, params, infos, vocab) + (ok,)
