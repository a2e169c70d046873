"""The grammar-masking chain stage: per-row grammar state, EOS only in accepting states.

The stage's state follows the chain convention (every leaf has leading batch axes), so finished
rows freeze and beam reordering works unchanged: each row carries its *own* copy of its grammar's
bucketed tables next to its automaton state. Rows sharing a grammar share nothing on the device;
with class compression and mask deduplication a row's tables are small (``S*C`` next states and
``V`` class ids, int16 when they fit, plus ``U`` distinct ``V``-bit masks), and the tables never
change inside the loop (XLA elides the ``where`` over them).

Usage::

    sampler = chain(stages.temperature(0.7), stages.grammar(), select=stages.categorical())
    params = sampler.params((B,), seed=seeds)
    state = sampler.init(params, vocab_size=V)
    state = structured.constrain(sampler, state, [g_json, g_regex, None, g_json])  # None = free row
    tokens, _, state = jax.jit(sampler.sample)(logits, state, params)   # no recompile per schema

Place the stage anywhere in the chain: it only removes tokens, so it composes with every filter.
Putting it first makes later truncation (top-k/top-p) act on the allowed tokens only, as in
llguidance and XGrammar.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample._types import Array
from jaxsample.chain import InitInfo, Sampler, SamplerState, Stage
from jaxsample.structured import tables as _tables
from jaxsample.structured.tokens import TokenGrammar


class GrammarState(NamedTuple):
    """Per-row grammar state (all leaves have leading batch axes ``B...``)."""

    state: Array  # int32[B...]: automaton state (0 = dead; unused for unconstrained rows)
    constrained: Array  # bool[B...]: False rows pass through untouched
    tables: _tables.Tables  # the row's own tables: next [B..., S, C], class_of [B..., V], ...


def _flat(gs: GrammarState):
    """Rows flattened to one batch axis: (grammar ids, tables with G = rows, states)."""
    n = int(np.prod(gs.state.shape))
    nd = len(gs.state.shape)
    t = _tables.Tables(*(x.reshape((n,) + x.shape[nd:]) for x in gs.tables))
    ids = jnp.where(gs.constrained.reshape(n), jnp.arange(n, dtype=jnp.int32), -1)
    return ids, t, gs.state.reshape(n)


def unconstrained(batch_shape: tuple[int, ...], vocab_size: int) -> GrammarState:
    """A state where every row is free (tiny placeholder tables)."""
    b = tuple(batch_shape)
    t = _tables.Tables(
        jnp.zeros(b + (1, 1), jnp.int16),
        jnp.zeros(b + (int(vocab_size),), jnp.int16),
        jnp.full(b + (1,), -1, jnp.int32),
        jnp.zeros(b, jnp.int32),
        jnp.zeros(b + (1,), jnp.int32),
        jnp.zeros(b + (1, -(-int(vocab_size) // 32)), jnp.uint32),
    )
    return GrammarState(jnp.zeros(b, jnp.int32), jnp.zeros(b, bool), t)


def _init(info: InitInfo) -> GrammarState:
    return unconstrained(info.batch_shape, info.vocab_size)


def _update(logits, gs: GrammarState, params, info):
    ids, t, s = _flat(gs)
    x = _tables.mask(logits.reshape(ids.shape + logits.shape[-1:]), t, ids, s)
    return x.reshape(logits.shape), gs


def _accept(tokens, gs: GrammarState, params, info):
    ids, t, s = _flat(gs)
    new = _tables.advance(t, ids, s, tokens.reshape(ids.shape))
    return gs._replace(state=new.reshape(gs.state.shape))


def grammar_stage(*, name: str = "grammar") -> Stage:
    """The masking stage; bind grammars to rows with :func:`constrain`. Stateless until then."""
    return Stage(name=name, update=_update, init=_init, accept=_accept)


def grammar_state(
    grammars: Sequence[TokenGrammar | None],
    batch_shape: tuple[int, ...] | None = None,
    *,
    num_states: int | None = None,
    num_classes: int | None = None,
    num_masks: int | None = None,
) -> GrammarState:
    """Per-row state for rows ``grammars`` (row-major over ``batch_shape``; ``None`` = unconstrained).

    Shapes are bucketed (see :func:`jaxsample.structured.stack`): grammars of similar size give the
    same shapes, hence no recompilation of the decode step. Identical grammar objects are uploaded once.
    """
    grammars = list(grammars)
    batch_shape = (len(grammars),) if batch_shape is None else tuple(batch_shape)
    if int(np.prod(batch_shape)) != len(grammars):
        raise ValueError(f"{len(grammars)} grammars for batch shape {batch_shape}")
    used = [g for g in grammars if g is not None]
    if not used:
        raise ValueError("every row is unconstrained; use the state from Sampler.init as is")
    uniq: list[TokenGrammar] = []
    slot = []
    for g in grammars:
        g = used[0] if g is None else g
        j = next((i for i, u in enumerate(uniq) if u is g), None)
        if j is None:
            uniq.append(g)
            j = len(uniq) - 1
        slot.append(j)
    stacked = _tables.stack(uniq, num_states=num_states, num_classes=num_classes, num_masks=num_masks)
    idx = jnp.asarray(slot, jnp.int32)
    rows = _tables.Tables(*(jnp.take(x, idx, axis=0).reshape(batch_shape + x.shape[1:]) for x in stacked))
    constrained = jnp.asarray([g is not None for g in grammars]).reshape(batch_shape)
    state = jnp.where(constrained, rows.start, 0).astype(jnp.int32)
    return GrammarState(state, constrained, rows)


def constrain(
    sampler: Sampler,
    state: SamplerState,
    grammars: Sequence[TokenGrammar | None],
    *,
    name: str = "grammar",
    num_states: int | None = None,
    num_classes: int | None = None,
    num_masks: int | None = None,
) -> SamplerState:
    """Binds one grammar (or ``None``) per row to the grammar stage ``name`` of ``sampler``.

    Raises:
      ValueError: if the chain has no stage ``name``, the row count or vocabulary width mismatch.
    """
    names = [s.name for s in sampler.stages]
    if name not in names:
        raise ValueError(f"the sampler has no stage named {name!r} (stages: {names}); add stages.grammar()")
    i = names.index(name)
    old: GrammarState = state.stages[i]
    gs = grammar_state(
        grammars, tuple(old.state.shape), num_states=num_states, num_classes=num_classes, num_masks=num_masks
    )
    if gs.tables.class_of.shape[-1] != old.tables.class_of.shape[-1]:
        raise ValueError(
            f"grammars were compiled for V={gs.tables.class_of.shape[-1]} but the sampler was initialised "
            f"with vocab_size={old.tables.class_of.shape[-1]}"
        )
    return state._replace(stages=state.stages[:i] + (gs,) + state.stages[i + 1 :])


def forced_tokens(gs: GrammarState) -> Array:
    """``int32[B...]``: each row's only allowed token, ``-1`` if several or unconstrained.

    A loop can write ``token = where(forced >= 0, forced, sampled)`` to skip the selector's work
    (results are identical: the mask leaves the forced token as the only finite logit).
    """
    ids, t, s = _flat(gs)
    return _tables.forced_token(t, ids, s).reshape(gs.state.shape)


def is_dead(gs: GrammarState) -> Array:
    """``bool[B...]``: constrained rows that accepted a token their grammar did not allow."""
    return gs.constrained & (gs.state == 0)
