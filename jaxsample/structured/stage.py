"""The grammar-masking chain stage: tables shared by the batch, one automaton state per row.

The stage ``stages.grammar(name="grammar")`` reads two sampler parameters:

* ``f"{name}_tables"``: the stacked, bucketed :class:`~jaxsample.structured.tables.Tables` of the
  grammars in use — a *shared* parameter (one pytree for the whole batch, passed to ``jit`` as an
  argument: a new schema whose tables fit the same buckets reuses the compiled loop), or ``None``
  when no row is constrained (the stage is then the identity at no cost);
* ``f"{name}_grammar"``: ``int32[B]`` the grammar of each row (an index into the tables), ``-1``
  for an unconstrained row (its logits pass through untouched).

Its state is a :class:`~jaxsample.structured.tables.GrammarState` per row (the automaton state,
and the stack and depth of recursive grammars; every leaf has the batch as leading axes, so the
chain conventions hold: finished rows freeze, beams reorder), set to the row's start state by
``Sampler.init``. Build both parameters with :func:`grammar_params`::

    sampler = chain(stages.grammar(), stages.temperature(0.7), select=stages.categorical())
    params = sampler.params((B,), seed=seeds, **structured.grammar_params([g_json, g_regex, None, g_json]))
    state = sampler.init(params, vocab_size=V)
    tokens, _, state = jax.jit(sampler.sample)(logits, state, params)   # no recompile per schema

Rows sharing a grammar share its tables: device memory is one copy per distinct grammar, whatever
the batch size. Place the stage anywhere in the chain: it only removes tokens. Putting it first
makes later truncation (top-k/top-p) act on the allowed tokens only, as in llguidance and XGrammar.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _validate
from jaxsample._types import Array
from jaxsample.chain import InitInfo, Param, Params, Sampler, SamplerState, Stage
from jaxsample.structured import tables as _tables
from jaxsample.structured.grammar_cache import same_grammar
from jaxsample.structured.tokens import TokenGrammar


def param_names(name: str = "grammar") -> tuple[str, str]:
    """``(tables, grammar ids)`` parameter names of the grammar stage ``name``."""
    return f"{name}_tables", f"{name}_grammar"


def _rows(state: _tables.GrammarState, shape: tuple) -> _tables.GrammarState:
    """Leaves reshaped from one batch shape to another (the stack keeps its trailing axis)."""
    n = state.state.ndim
    return jax.tree.map(lambda a: a.reshape(shape + a.shape[n:]), state)


@dataclasses.dataclass(frozen=True)
class GrammarStage(Stage):
    """The masking stage (see the module docstring); rows follow ``params[f"{name}_grammar"]``.

    Its identity is its name: every grammar stage of a name is the same stage (one compilation).
    """

    _: dataclasses.KW_ONLY
    name: str = "grammar"

    @property
    def params(self) -> tuple[Param, ...]:
        tables_key, ids_key = param_names(self.name)
        return (Param(tables_key, None, shared=True), Param(ids_key, -1, jnp.int32, lo=-1))

    def _bound(self, params: Params):
        tables_key, ids_key = param_names(self.name)
        return params[tables_key], jnp.asarray(params[ids_key], jnp.int32).reshape(-1)

    def init(self, info: InitInfo) -> _tables.GrammarState:
        t, ids = self._bound(info.params)
        if _validate.is_concrete(ids):  # eager use: ids must point into the tables (under jit: clamped)
            n = 0 if t is None else int(t.start.shape[0])
            bad = np.asarray(ids)[np.asarray(ids) >= n]
            if bad.size:
                tables_key, ids_key = param_names(self.name)
                raise ValueError(
                    f"{ids_key} {sorted(set(bad.tolist()))} refer to grammars missing from {tables_key} "
                    f"({n} grammars); build both with structured.grammar_params"
                )
        if t is None:
            zero = jnp.zeros(info.batch_shape, jnp.int32)
            none = info.batch_shape + (0,)
            return _tables.GrammarState(zero, jnp.zeros(none, jnp.int32), zero, jnp.zeros(none, jnp.uint32))
        return _rows(_tables.initial_state(t, ids), info.batch_shape)

    def update(self, logits, state, params, info):
        t, ids = self._bound(params)
        if t is None:
            return logits, state
        x = logits.reshape((ids.shape[0], logits.shape[-1]))
        flat = _rows(state, (ids.shape[0],))
        out = lax.cond(jnp.any(ids >= 0), lambda: _tables.mask(x, t, ids, flat), lambda: x)
        return out.reshape(logits.shape), state

    def accept(self, tokens, state, params, info):
        t, ids = self._bound(params)
        if t is None:
            return state
        new = _tables.advance(t, ids, _rows(state, (ids.shape[0],)), tokens.reshape(-1))
        return _rows(new, state.state.shape)


def grammar_stage(*, name: str = "grammar") -> Stage:
    """The masking stage :class:`GrammarStage` (see the module docstring)."""
    return GrammarStage(name=name)


def grammar_params(
    grammars: Sequence[TokenGrammar | None],
    batch_shape: tuple[int, ...] | None = None,
    *,
    name: str = "grammar",
    num_grammars: int | None = None,
    num_states: int | None = None,
    num_classes: int | None = None,
    num_masks: int | None = None,
    max_depth: int | None = None,
    num_depth: int | None = None,
    num_returns: int | None = None,
    num_pop_tokens: int | None = None,
    num_transitions: int | None = None,
    num_blocks: int | None = None,
) -> dict:
    """Sampler parameter values binding one grammar (or ``None``: unconstrained) to each row.

    Merge the result into ``sampler.params(...)`` keywords or ``generate(..., sampler_params=...)``.
    Equal grammars (by content: :func:`~jaxsample.structured.grammar_cache.same_grammar`, not only
    the same object) are stacked (and uploaded) once; the stack is padded to buckets (see
    :func:`~jaxsample.structured.tables.stack`), so grammars of similar size give the same shapes
    and never recompile the decode loop. Pin the buckets (``num_grammars=``, ``num_states=``, ...)
    to serve any mix of schemas with one compilation. ``max_depth`` overrides the stack limit of
    recursive grammars (traced); ``num_depth``, ``num_returns``, ``num_pop_tokens`` pin their buckets
    (``num_transitions``: the stored exceptions of the packed ``next`` table; ``num_blocks``: the
    distinct blocks of the masks).

    Args:
      grammars: one entry per row, row-major over ``batch_shape``.
      batch_shape: defaults to ``(len(grammars),)``.
      name: the grammar stage's name.

    Returns:
      ``{f"{name}_tables": Tables or None, f"{name}_grammar": int32[batch_shape]}``.

    Raises:
      ValueError: if the row count does not match ``batch_shape``, grammars were compiled for
        different vocabularies, or pinned buckets are too small.
    """
    grammars = list(grammars)
    batch_shape = (len(grammars),) if batch_shape is None else tuple(batch_shape)
    if int(np.prod(batch_shape)) != len(grammars):
        raise ValueError(f"{len(grammars)} grammars for batch shape {batch_shape}")
    uniq: list[TokenGrammar] = []
    ids = []
    for g in grammars:
        if g is None:
            ids.append(-1)
            continue
        j = next((i for i, u in enumerate(uniq) if same_grammar(u, g)), None)
        if j is None:
            uniq.append(g)
            j = len(uniq) - 1
        ids.append(j)
    tables_key, ids_key = param_names(name)
    tables = None
    if uniq:
        tables = _tables.stack(
            uniq, num_grammars=num_grammars, num_states=num_states, num_classes=num_classes, num_masks=num_masks,
            max_depth=max_depth, num_depth=num_depth, num_returns=num_returns, num_pop_tokens=num_pop_tokens,
            num_transitions=num_transitions, num_blocks=num_blocks,
        )  # fmt: skip
    return {tables_key: tables, ids_key: np.asarray(ids, np.int32).reshape(batch_shape)}


def _stage_state(sampler: Sampler, state: SamplerState, params: Params, name: str):
    names = [s.name for s in sampler.stages]
    if name not in names:
        raise ValueError(f"the sampler has no stage named {name!r} (stages: {names}); add stages.grammar()")
    tables_key, ids_key = param_names(name)
    s = state.stages[names.index(name)]
    armed = getattr(s, "armed", None)  # a lazy grammar (structured.triggers) awaiting its trigger constrains nothing
    if armed is not None:
        s = s.grammar
    return params[tables_key], jnp.asarray(params[ids_key], jnp.int32), s, armed


def forced_tokens(sampler: Sampler, state: SamplerState, params: Params, *, name: str = "grammar") -> Array:
    """``int32[B...]``: each row's only allowed token, ``-1`` if several or unconstrained.

    A loop can write ``token = where(forced >= 0, forced, sampled)`` to skip the selector's work
    (results are identical: the mask leaves the forced token as the only finite logit).

    Raises:
      ValueError: if the sampler has no stage ``name``.
    """
    t, ids, s, armed = _stage_state(sampler, state, params, name)
    if t is None:
        return jnp.full(s.state.shape, -1, jnp.int32)
    forced = _tables.forced_token(t, ids.reshape(-1), _rows(s, (ids.size,))).reshape(s.state.shape)
    return forced if armed is None else jnp.where(armed, forced, -1)


def is_dead(sampler: Sampler, state: SamplerState, params: Params, *, name: str = "grammar") -> Array:
    """``bool[B...]``: constrained rows that accepted a token their grammar did not allow.

    Raises:
      ValueError: if the sampler has no stage ``name``.
    """
    t, ids, s, armed = _stage_state(sampler, state, params, name)
    if t is None:
        return jnp.zeros(s.state.shape, bool)
    dead = (ids.reshape(s.state.shape) >= 0) & (s.state == 0)
    return dead if armed is None else dead & armed
