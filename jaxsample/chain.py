"""Composable sampler chains with explicit state, in the style of optax.

A :class:`Stage` is a tuple of pure functions (``init``, ``update``, ``accept``) plus the names,
defaults and ranges of the per-row parameters it reads. :func:`chain` composes stages and a final
:class:`Selector` into a :class:`Sampler`, whose whole step is one pytree-in / pytree-out function:

>>> import jax, jax.numpy as jnp
>>> from jaxsample import stages
>>> sampler = chain(stages.temperature(0.8), select=stages.categorical())
>>> params = sampler.params((2,), temperature=jnp.array([0.0, 1.0]), seed=jnp.array([1, 2]))
>>> state = sampler.init(params, vocab_size=5)
>>> logits = jnp.log(jnp.arange(1.0, 6.0)) * jnp.ones((2, 1))
>>> tokens, processed, state = jax.jit(sampler.sample)(logits, state, params)
>>> int(tokens[0])   # temperature 0 is greedy
4

Static structure (which stages exist, window sizes) lives in the :class:`Sampler`; every value a
user may vary per call or per row lives in ``params`` (a dict of ``[B]`` arrays), so changing a
value never recompiles. Randomness is explicit and per request: at step ``position`` a row's key is
``fold_in(key(seed), position)``, further folded with a hash of the stage name, so a row's draws
depend on neither its batch slot nor its neighbours.

State conventions: every array in a stage's state has the batch shape as leading axes, which lets
:meth:`Sampler.accept` freeze finished rows generically (``active=False`` rows keep their state).

Candidate forms: a stage may carry a :class:`Form`, its computation on the few candidates a row
has left after a filter such as top-k (:mod:`jaxsample._forms`). :meth:`Sampler.sample` switches
to the forms after the first filter that offers an entry, when every later stage and the selector
have a form and every row of the batch qualifies; the result is bit-identical either way, so only
the cost changes (one ``top_k`` per step instead of several passes over the vocabulary).
"""

from __future__ import annotations

import functools
import inspect
import zlib
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax import lax

from jaxsample import _candidates, _math, _validate
from jaxsample._candidates import Candidates
from jaxsample._types import Array, ArrayLike

Params = Mapping[str, Array]


class Param(NamedTuple):
    """A per-row parameter a stage reads from ``params``: name, default and accepted range.

    With ``capacity=None`` the value is one number per row (``[B]``). With an int ``capacity`` it
    is a per-row list padded with ``default`` to that static length (``[B, capacity]``), e.g. token
    ids with ``-1`` padding: ragged lists of new ids never recompile. Range checks skip padding.
    With ``shared=True`` the value is any pytree common to all rows (e.g. the device tables of
    several grammars, indexed per row by another parameter); it is passed through unchecked, and
    its shapes (not its values) are part of the compiled structure.
    """

    name: str
    default: float | int
    dtype: Any = jnp.float32
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    capacity: int | None = None
    shared: bool = False


class InitInfo(NamedTuple):
    """What a stage may look at when it builds its state."""

    batch_shape: tuple[int, ...]
    vocab_size: int
    params: Params
    prompt: Array | None  # int32[B, P] prompt tokens, -1 = padding
    encoder_ids: Array | None  # int32[B, S] encoder input ids (enc-dec models), -1 = padding


class StepInfo(NamedTuple):
    """Per-step context handed to ``update``/``accept``/``select``."""

    key: Array  # typed keys [B]: this stage's key for this step
    position: Array  # int32[B]: tokens generated so far (0 at the first sampled token)
    history: Array  # int32[B, W]: prompt + generated tokens, oldest first, -1 = empty slot
    prompt: Array | None  # int32[B, P] prompt tokens given to init (-1 = padding)
    encoder_ids: Array | None  # int32[B, S] encoder ids given to init (-1 = padding)


def _no_state(info: InitInfo) -> tuple:
    return ()


class Form(NamedTuple):
    """A stage's computation on candidates (see :mod:`jaxsample._forms` for the contract).

    Attributes:
      update: ``(Candidates [B, K], state, params, StepInfo) -> (Candidates, state)``.
      handles: optional ``params -> bool[B]``: the rows whose parameter values ``update`` covers
        (default: all); a batch with any other row stays dense.
      enter: optional ``(logits float32[B, V], state, params, StepInfo) -> (Candidates, ok bool[B],
        dense)``: the stage's output as candidates, the rows it represents, and a thunk returning
        the dense output. Only for stateless stages.
      k: the static candidate count ``K`` the form's arithmetic depends on (``None``: any); a
        chain only switches when it matches the entry's.
    """

    update: Callable[[Candidates, Any, Params, StepInfo], tuple[Candidates, Any]]
    handles: Callable[[Params], Array] | None = None
    enter: Callable[[Array, Any, Params, StepInfo], tuple[Candidates, Array, Callable[[], Array]]] | None = None
    k: int | None = None


class Stage(NamedTuple):
    """A logits transform: ``update(logits, state, params, info) -> (logits, state)``.

    Attributes:
      name: unique name in a chain; also seeds the stage's randomness.
      update: pure function of ``(logits float32[B, V], state, params, StepInfo)``.
      params: the per-row parameters the stage reads.
      init: ``InitInfo -> state`` (stateless stages return ``()``).
      accept: optional ``(tokens int32[B], state, params, StepInfo) -> state``.
      history: how many past tokens the stage reads from ``StepInfo.history`` (static; ``-1``
        means everything the sampler keeps).
      form: optional :class:`Form`, the same computation on candidates.
      nan_free: ``update`` never turns NaN-free logits into NaN (the sampler maps NaN to ``-inf``
        after the other stages).
    """

    name: str
    update: Callable[[Array, Any, Params, StepInfo], tuple[Array, Any]]
    params: tuple[Param, ...] = ()
    init: Callable[[InitInfo], Any] = _no_state
    accept: Callable[[Array, Any, Params, StepInfo], Any] | None = None
    history: int = 0
    form: Form | None = None
    nan_free: bool = False


class Selector(NamedTuple):
    """The last step of a chain: ``select(logits, state, params, info) -> (tokens, state)``.

    ``form``: optional ``(Candidates [B, K], state, params, StepInfo) -> (tokens, state)``, the same
    selection on candidates (see :class:`Form`).
    """

    name: str
    select: Callable[[Array, Any, Params, StepInfo], tuple[Array, Any]]
    params: tuple[Param, ...] = ()
    init: Callable[[InitInfo], Any] = _no_state
    form: Callable[[Candidates, Any, Params, StepInfo], tuple[Array, Any]] | None = None


def cached(factory: Callable) -> Callable:
    """Memoises a stage factory so equal static configurations give the *same* stage object.

    Stages hold closures, so two calls would otherwise build unequal samplers, and a ``jit`` taking
    the sampler as a static argument would compile once per call. Unhashable arguments (lists)
    bypass the cache.
    """
    memo: dict = {}
    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()  # top_p() and top_p(candidates=64) are the same configuration
        key = tuple(bound.arguments.items())
        try:
            return memo[key]
        except TypeError:
            return factory(*args, **kwargs)
        except KeyError:
            memo[key] = out = factory(*args, **kwargs)
            return out

    return wrapper


def stateless(
    name: str,
    fn: Callable[..., Array],
    params: tuple[Param, ...],
    keyed: bool = False,
    form: Form | None = None,
    nan_free: bool = False,
) -> Stage:
    """Wraps a functional sampler ``fn(logits, *param_values)`` (or ``fn(key, logits, ...)``) as a stage."""

    def update(logits, state, p, info):
        args = [p[q.name] for q in params]
        out = fn(info.key, logits, *args) if keyed else fn(logits, *args)
        return out, state

    return Stage(name=name, update=update, params=params, form=form, nan_free=nan_free)


#: Every chain reads ``seed`` and ``seed_stream``; together they name a row's random stream.
SEED = Param("seed", 0, jnp.int32, lo=-(2**31), hi=2**31 - 1)
STREAM = Param("seed_stream", 0, jnp.int32, lo=0, hi=2**31 - 1)


def _default_streams(seed, batch_shape: tuple[int, ...]):
    """``seed_stream`` when none is given: 0 for per-row seeds, the flat row index for a shared seed."""
    if seed is not None and tuple(np.shape(seed)) == batch_shape:
        return 0
    return np.arange(int(np.prod(batch_shape, dtype=np.int64)), dtype=np.int32).reshape(batch_shape)


def request_keys(params: Params) -> Array:
    """Typed keys ``[B]``: each row's key before the step is folded in.

    Row ``b`` draws from stream ``seed_stream[b]`` of ``seed[b]``: ``key(seed)`` for stream 0 and
    ``fold_in(key(seed), stream)`` otherwise. Streams are independent threefry keys, so distinct
    ``(seed, stream)`` pairs never overlap (unlike ``seed + i``), and a request alone (stream 0)
    equals its own row of a batch given one seed per row, whatever its slot.
    """
    seeds = jnp.asarray(params[SEED.name], jnp.int32)
    streams = jnp.broadcast_to(jnp.asarray(params.get(STREAM.name, 0), jnp.int32), seeds.shape)

    def one(seed, stream):
        k = jax.random.key(seed)
        data = jnp.where(stream == 0, jax.random.key_data(k), jax.random.key_data(jax.random.fold_in(k, stream)))
        return jax.random.wrap_key_data(data)

    return jax.vmap(one)(seeds.reshape(-1), streams.reshape(-1)).reshape(seeds.shape)


class SamplerState(NamedTuple):
    """Everything that evolves during decoding, as a pytree with leading batch axes."""

    position: Array  # int32[B]: tokens accepted since init
    ring: Array  # int32[B, W]: history ring buffer (-1 = empty)
    filled: Array  # int32[B]: tokens ever written to the ring (prompt included)
    prompt: Array | None  # int32[B, P]
    encoder_ids: Array | None  # int32[B, S]
    stages: tuple  # one state per stage
    selector: Any


def _stage_salt(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _ring_view(ring: Array, filled: Array) -> Array:
    """Chronological view (oldest first) of a ring buffer ``[B, W]``."""
    w = ring.shape[-1]
    idx = (filled[..., None] + jnp.arange(w)) % w
    return jnp.take_along_axis(ring, idx, axis=-1)


def _fill_ring(tokens: Array, w: int) -> tuple[Array, Array]:
    """Ring buffer ``[B, W]`` holding the last ``W`` valid tokens of ``tokens [B, P]`` and its count."""
    valid = tokens >= 0
    order = jnp.argsort(~valid, axis=-1, stable=True)
    compact = jnp.take_along_axis(tokens, order, axis=-1)
    n = jnp.sum(valid, axis=-1).astype(jnp.int32)
    s = jnp.arange(w)
    j = s + w * jnp.floor_divide(n[..., None] - 1 - s, w)
    ok = (n[..., None] - 1 - s >= 0) & (j < tokens.shape[-1])
    ring = jnp.where(ok, jnp.take_along_axis(compact, jnp.clip(j, 0, tokens.shape[-1] - 1), axis=-1), -1)
    return ring.astype(jnp.int32), n


def _where_rows(active: Array, new, old):
    def pick(a, b):
        m = active.reshape(active.shape + (1,) * (a.ndim - active.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, new, old)


class Sampler(NamedTuple):
    """A chain of stages ending in a selector. Build with :func:`chain`."""

    stages: tuple[Stage, ...]
    selector: Selector

    # ----------------------------------------------------------------------------------- params
    def param_specs(self) -> dict[str, Param]:
        """All parameters read by the chain, by name (``seed`` and ``seed_stream`` are always present)."""
        specs: dict[str, Param] = {SEED.name: SEED, STREAM.name: STREAM}
        for part in self.stages + (self.selector,):
            for p in part.params:
                specs.setdefault(p.name, p)
        return specs

    def params(self, batch_shape: tuple[int, ...] = (), **values: ArrayLike) -> dict[str, Array]:
        """Validated per-row parameters, defaults filled in.

        Args:
          batch_shape: the logits batch shape (``()`` for a single row).
          **values: overrides, each a scalar or an array broadcastable to ``batch_shape``; list
            parameters (``Param.capacity``) take one list for all rows, one list per row, or an array.

        Returns:
          ``{name: array[*batch_shape]}`` (``[*batch_shape, capacity]`` for list parameters) for every
          parameter of the chain.

        Raises:
          ValueError: on an unknown name, a value out of range, or a shape that does not broadcast.

        Seeds (see :func:`request_keys`): one seed per row (an array of the batch shape) gives every
        row stream 0 of its seed; a seed shared by the batch (a scalar, a broadcast array, or none:
        seed 0) gives row ``b`` stream ``b`` (its flat index), so no two rows share noise.
        """
        specs = self.param_specs()
        unknown = sorted(set(values) - set(specs))
        if unknown:
            raise ValueError(f"unknown sampler parameter(s) {unknown}; this chain reads {sorted(specs)}")
        batch_shape = tuple(batch_shape)
        if STREAM.name not in values:
            values[STREAM.name] = _default_streams(values.get(SEED.name), batch_shape)
        out = {}
        for name, s in specs.items():
            checks = dict(lo=s.lo, hi=s.hi, lo_open=s.lo_open, hi_open=s.hi_open)
            if s.shared:
                out[name] = values.get(name, s.default)
            elif s.capacity is None:
                out[name] = _validate.param(values.get(name, s.default), batch_shape, name, dtype=s.dtype, **checks)
            else:
                out[name] = _validate.row_lists(
                    values.get(name, ()), batch_shape, s.capacity, name, dtype=s.dtype, fill=s.default, **checks
                )
        return out

    def history_size(self) -> int:
        """Static window the chain needs: the largest ``Stage.history`` (``-1`` if any stage wants all)."""
        sizes = [s.history for s in self.stages]
        return -1 if -1 in sizes else max(sizes, default=0)

    # ------------------------------------------------------------------------------------- init
    def init(
        self,
        params: Params,
        *,
        vocab_size: int,
        prompt: ArrayLike | None = None,
        encoder_ids: ArrayLike | None = None,
        history_size: int | None = None,
    ) -> SamplerState:
        """Builds the state for a batch.

        Args:
          params: from :meth:`params`; fixes the batch shape.
          vocab_size: ``V`` of the logits.
          prompt: ``int32[B, P]`` prompt tokens (``-1`` padding anywhere). They fill the history
            window first, as llama.cpp pushes the prompt into its samplers.
          encoder_ids: ``int32[B, S]`` encoder input ids for encoder-side processors.
          history_size: ring size ``W``; defaults to the largest window a stage declares. Required
            when a stage reads the whole history (``history=-1``).
        """
        batch_shape = tuple(np.shape(params["seed"]))
        need = self.history_size()
        if history_size is None:
            if need == -1:
                raise ValueError(
                    "history_size is required: a stage of this chain reads the whole history "
                    "(e.g. penalty_last_n=-1); pass the longest prompt + generation length"
                )
            history_size = need
        w = _validate.static_int(history_size, "history_size", lo=0)
        if need > w:
            raise ValueError(f"history_size={w} is smaller than the window a stage needs ({need})")
        if prompt is not None:
            prompt = _validate.check_tokens(prompt, "prompt", batch_shape)
        if encoder_ids is not None:
            encoder_ids = _validate.check_tokens(encoder_ids, "encoder_ids", batch_shape)
        if prompt is not None and w > 0:
            ring, filled = _fill_ring(prompt, w)
        else:
            ring = jnp.full(batch_shape + (w,), -1, jnp.int32)
            filled = jnp.zeros(batch_shape, jnp.int32)
        info = InitInfo(batch_shape, int(vocab_size), params, prompt, encoder_ids)
        return SamplerState(
            position=jnp.zeros(batch_shape, jnp.int32),
            ring=ring,
            filled=filled,
            prompt=prompt,
            encoder_ids=encoder_ids,
            stages=tuple(s.init(info) for s in self.stages),
            selector=self.selector.init(info),
        )

    # ------------------------------------------------------------------------------------- step
    def _info(self, state: SamplerState, params: Params, name: str) -> StepInfo:
        keys = request_keys(params)
        base = jax.vmap(jax.random.fold_in)(keys.reshape(-1), state.position.reshape(-1))
        key = jax.vmap(lambda k: jax.random.fold_in(k, _stage_salt(name)))(base).reshape(keys.shape)
        return StepInfo(
            key=key,
            position=state.position,
            history=_ring_view(state.ring, state.filled),
            prompt=state.prompt,
            encoder_ids=state.encoder_ids,
        )

    @staticmethod
    def _update(stage: Stage, x: Array, s, params: Params, info: StepInfo):
        """One stage on NaN-free ``x``; NaN-free out (see :func:`jaxsample._math.nan_free`)."""
        with _math.nan_free():
            x, s = stage.update(x, s, params, info)
        return (x if stage.nan_free else _math.clean(x)), s

    def process(self, logits: ArrayLike, state: SamplerState, params: Params) -> tuple[Array, SamplerState]:
        """Applies every stage: ``logits [B, V]`` (any float dtype) -> float32 ``[B, V]`` (NaN -> ``-inf``)."""
        x = _math.clean(jnp.asarray(logits).astype(jnp.float32))
        new = []
        for stage, s in zip(self.stages, state.stages):
            x, s = self._update(stage, x, s, params, self._info(state, params, stage.name))
            new.append(s)
        return x, state._replace(stages=tuple(new))

    def _forms_from(self, i: int, k: int, vocab: int) -> bool:
        """Whether stages ``i..`` and the selector all have forms usable with ``k`` candidates."""
        forms = [s.form for s in self.stages[i:]]
        usable = lambda f: f is not None and (f.k is None or min(f.k, vocab) == k)  # noqa: E731
        return self.selector.form is not None and all(usable(f) for f in forms)

    def _dense(self, i: int, x: Array, states: tuple, state: SamplerState, params: Params):
        """Stages ``i..`` and the selector on ``x [B, V]``, switching to forms at the first entry that allows it."""
        states = list(states)
        vocab = x.shape[-1]
        for j in range(i, len(self.stages)):
            stage, info = self.stages[j], self._info(state, params, self.stages[j].name)
            form = stage.form
            if form is not None and form.enter is not None and self._forms_from(j + 1, min(form.k, vocab), vocab):
                c, ok, dense = form.enter(x, states[j], params, info)  # (a filter: NaN-free)
                for later in self.stages[j + 1 :]:
                    if later.form.handles is not None:
                        ok &= later.form.handles(params)
                frozen = tuple(states)
                return lax.cond(
                    jnp.all(ok),
                    lambda: self._on_candidates(j + 1, c, frozen, state, params, vocab),
                    lambda: self._dense(j + 1, dense(), frozen, state, params),
                )
            x, states[j] = self._update(stage, x, states[j], params, info)
        with _math.nan_free():
            tokens, sel = self.selector.select(x, state.selector, params, self._info(state, params, self.selector.name))
        return tokens.astype(jnp.int32), x, tuple(states), sel

    def _on_candidates(self, i: int, c: Candidates, states: tuple, state: SamplerState, params: Params, vocab: int):
        states = list(states)
        for j in range(i, len(self.stages)):
            c, states[j] = self.stages[j].form.update(c, states[j], params, self._info(state, params, self.stages[j].name))
        info = self._info(state, params, self.selector.name)
        tokens, sel = self.selector.form(c, state.selector, params, info)
        return tokens.astype(jnp.int32), _candidates.densify(c, vocab), tuple(states), sel

    def select(self, logits: Array, state: SamplerState, params: Params) -> tuple[Array, SamplerState]:
        """Runs the selector on processed logits: ``int32[B]`` tokens."""
        tokens, s = self.selector.select(logits, state.selector, params, self._info(state, params, self.selector.name))
        return tokens.astype(jnp.int32), state._replace(selector=s)

    def accept(
        self, tokens: ArrayLike, state: SamplerState, params: Params, active: ArrayLike | None = None
    ) -> SamplerState:
        """Records tokens (sampled, forced or drafted): stage ``accept``s, history, position.

        Rows where ``active`` is False keep their state unchanged.
        """
        tokens = jnp.asarray(tokens, jnp.int32)
        new = []
        for stage, s in zip(self.stages, state.stages):
            if stage.accept is not None:
                s = stage.accept(tokens, s, params, self._info(state, params, stage.name))
            new.append(s)
        w = state.ring.shape[-1]
        ring = state.ring
        if w > 0:
            slot = state.filled % w
            ring = jnp.where(jnp.arange(w) == slot[..., None], tokens[..., None], ring)
        updated = state._replace(
            stages=tuple(new), ring=ring, filled=state.filled + 1, position=state.position + 1
        )
        if active is None:
            return updated
        return _where_rows(jnp.asarray(active, bool), updated, state)

    def sample(
        self, logits: ArrayLike, state: SamplerState, params: Params, active: ArrayLike | None = None
    ) -> tuple[Array, Array, SamplerState]:
        """One decoding step: ``process`` -> ``select`` -> ``accept``; rows with ``active=False`` keep their state.

        Equal to ``process`` then ``select`` then ``accept``, computed on candidate sets from the
        first filter on when the chain and the batch allow it (see the module docstring).

        Returns:
          ``(tokens int32[B], processed_logits float32[B, V], new_state)``.
        """
        x = _math.clean(jnp.asarray(logits).astype(jnp.float32))
        tokens, x, stage_states, sel = self._dense(0, x, state.stages, state, params)
        new = self.accept(tokens, state._replace(stages=stage_states, selector=sel), params)
        if active is not None:  # finished rows keep every part of their state, selector's included
            new = _where_rows(jnp.asarray(active, bool), new, state)
        return tokens, x, new


def chain(*stages: Stage, select: Selector) -> Sampler:
    """Composes stages (applied in order) and a selector into a :class:`Sampler`.

    Raises:
      ValueError: if two stages share a name, or two stages declare the same parameter with
        different defaults or ranges.
    """
    names = [s.name for s in stages] + [select.name]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"stage names must be unique in a chain; repeated: {dupes} (rename with stage._replace(name=...))")
    seen: dict[str, tuple[str, Param]] = {}
    for part in stages + (select,):
        for p in part.params:
            if p.name in seen and seen[p.name][1] != p:
                raise ValueError(
                    f"parameter {p.name!r} is declared differently by stages {seen[p.name][0]!r} and "
                    f"{part.name!r}: {seen[p.name][1]} vs {p}"
                )
            seen.setdefault(p.name, (part.name, p))
    return Sampler(tuple(stages), select)
