"""Composable sampler chains with explicit state, in the style of optax.

A :class:`Stage` is a logits transform with explicit state, two pure functions as in optax:
``init(info) -> state`` and ``update(logits, state, params, info) -> (logits, state)``, plus
``accept(tokens, state, params, info) -> state`` for stages that record the chosen tokens. It
declares the per-row parameters it reads (:class:`Param`) and the history window it needs.
:func:`chain` composes stages and a final :class:`Selector` into a :class:`Sampler`, whose step is
``process -> select -> accept``, one pytree-in / pytree-out function:

>>> import jax, jax.numpy as jnp
>>> from jaxsample import stages
>>> sampler = chain(stages.temperature(0.8), select=stages.categorical())
>>> params = sampler.params((2,), temperature=jnp.array([0.0, 1.0]), seed=jnp.array([1, 2]))
>>> state = sampler.init(params, vocab_size=5)
>>> logits = jnp.log(jnp.arange(1.0, 6.0)) * jnp.ones((2, 1))
>>> tokens, processed, state = jax.jit(sampler.sample)(logits, state, params)
>>> int(tokens[0])   # temperature 0 is greedy
4

Static structure (which stages exist, window sizes, candidate counts) lives in the stages, which
are frozen dataclasses compared by their fields: equal configurations are equal samplers, and a
``jit`` taking the sampler as a static argument compiles once for them. Every value a user may
vary lives in ``params`` (a dict of ``[B]`` arrays); a stage's *default* values only fill
``params`` and are not part of its identity, so ``stages.temperature(0.7)`` and ``(0.8)`` share
one compilation. Randomness is explicit and per request (:func:`request_keys`).

State conventions: every array in a stage's state has the batch shape as leading axes (any
pytree), which lets :meth:`Sampler.accept` freeze finished rows generically (``active=False``
rows keep their state) and the decoding loops reorder beams.

NaN: a sampler maps NaN to ``-inf`` once, at its input. Stages take NaN-free float32 logits and
return NaN-free float32 logits (library stages call the NaN-free cores of the functions); the
output of stages built from plain functions (:class:`FunctionStage`) is cleaned again.

The candidate fast path (:mod:`jaxsample._fastpath`) computes :meth:`Sampler.sample` on the few
candidates a row keeps after a filter such as top-k, when that provably gives the same result.

Sharding/TPU: every step is row-wise; shard the batch axis of logits, params and state alike.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _noise, _validate
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


#: Every chain reads ``seed`` and ``seed_stream``; together they name a row's random stream.
SEED = Param("seed", 0, jnp.int32, lo=-(2**31), hi=2**31 - 1)
STREAM = Param("seed_stream", 0, jnp.int32, lo=0, hi=2**31 - 1)
#: Shared by every filter that keeps a minimum number of tokens (llama.cpp ``min_keep``).
MIN_KEEP = Param("min_keep", 1, jnp.int32, lo=0)


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

    def recent(self, w: int) -> Array:
        """``int32[B, min(w, W)]``: the last ``w`` entries of the history (``w < 0``: all of it)."""
        h = self.history
        return h if w < 0 else h[..., h.shape[-1] - min(w, h.shape[-1]) :]

    def generated(self, window: Array) -> Array:
        """``window [B, w]`` (the end of the history) with all but the generated tokens blanked to ``-1``."""
        t = window.shape[-1]
        return jnp.where(jnp.arange(t) >= t - self.position[..., None], window, -1)

    def with_prompt(self) -> Array:
        """``int32[B, P + W]``: the prompt, then the history (every token of the request, some twice)."""
        return self.history if self.prompt is None else jnp.concatenate([self.prompt, self.history], axis=-1)


def static(convert: Callable[[Any, str], Any], default: Any = dataclasses.MISSING) -> Any:
    """A static stage field, normalised when the stage is built: ``convert(value, field_name)``.

    E.g. token-id lists become hashable tuples, candidate counts checked ints; a bad value raises
    ``ValueError`` naming the field.
    """
    return dataclasses.field(default=default, metadata={"static": convert})


def static_int(default: Any = dataclasses.MISSING, *, lo: int = 1) -> Any:
    """A static int field (a window, an n-gram order, a candidate count), at least ``lo``."""
    return static(lambda value, name: _validate.static_int(value, name, lo=lo), default)


def _normalise(part) -> None:
    """Applies the :func:`static` converters of a stage's (or selector's) fields."""
    for f in dataclasses.fields(part) if dataclasses.is_dataclass(part) else ():
        convert = f.metadata.get("static")
        if convert is not None:
            object.__setattr__(part, f.name, convert(getattr(part, f.name), f.name))


def _no_state(info: InitInfo) -> tuple:
    return ()


def _same_state(tokens: Array, state: Any, params: Params, info: StepInfo) -> Any:
    return state


class Stage:
    """Base of chain stages: ``name``, ``params``, ``history`` and ``init`` / ``update`` / ``accept``.

    Library stages are frozen dataclasses (hashable, compared by their static fields) subclassing
    it. ``Stage(name, update, params=(), init=..., accept=..., history=0)`` builds a stage from
    plain functions (a :class:`FunctionStage`).

    Attributes:
      name: unique name in a chain; also salts the stage's randomness.
      params: the per-row parameters the stage reads.
      history: how many past tokens the stage reads from ``StepInfo.history`` (static; ``-1``
        means everything the sampler keeps).
    """

    params: tuple[Param, ...] = ()
    history: int = 0

    def __new__(cls, *args, **kwargs):
        return super().__new__(FunctionStage if cls is Stage else cls)

    def __post_init__(self):
        """Normalises the static fields and builds the declarations once, so a bad configuration
        raises when the stage is built."""
        _normalise(self)
        _ = self.params, self.history

    def init(self, info: InitInfo) -> Any:
        """The stage's state for a batch (``()`` for stateless stages)."""
        return ()

    def update(self, logits: Array, state: Any, params: Params, info: StepInfo) -> tuple[Array, Any]:
        """``(logits float32[B, V], state) -> (logits, state)``; NaN-free in, NaN-free out."""
        raise NotImplementedError

    def accept(self, tokens: Array, state: Any, params: Params, info: StepInfo) -> Any:
        """Records the tokens ``int32[B]`` chosen at this step (sampled, forced or drafted)."""
        return state

    def _replace(self, **changes) -> Stage:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class FunctionStage(Stage):
    """A stage from plain functions (identity: the function objects); its output is cleaned of NaN."""

    name: str
    update: Callable[[Array, Any, Params, StepInfo], tuple[Array, Any]] = dataclasses.field()
    params: tuple[Param, ...] = ()
    init: Callable[[InitInfo], Any] = _no_state
    accept: Callable[[Array, Any, Params, StepInfo], Any] = _same_state
    history: int = 0

    def __post_init__(self):
        if self.accept is None:  # the former "no accept"
            object.__setattr__(self, "accept", _same_state)
        super().__post_init__()


class Selector:
    """The last step of a chain: ``select(logits, state, params, info) -> (tokens int32[B], state)``.

    ``Selector(name, select, params=(), init=...)`` builds one from plain functions.
    """

    params: tuple[Param, ...] = ()

    def __new__(cls, *args, **kwargs):
        return super().__new__(FunctionSelector if cls is Selector else cls)

    def __post_init__(self):
        _normalise(self)
        _ = self.params

    def init(self, info: InitInfo) -> Any:
        return ()

    def select(self, logits: Array, state: Any, params: Params, info: StepInfo) -> tuple[Array, Any]:
        raise NotImplementedError

    def _replace(self, **changes) -> Selector:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class FunctionSelector(Selector):
    """A selector from plain functions."""

    name: str
    select: Callable[[Array, Any, Params, StepInfo], tuple[Array, Any]] = dataclasses.field()
    params: tuple[Param, ...] = ()
    init: Callable[[InitInfo], Any] = _no_state


def apply(stage: Stage, x: Array, state: Any, params: Params, info: StepInfo) -> tuple[Array, Any]:
    """``stage.update`` on NaN-free ``x [B, V]``; NaN-free out."""
    x, state = stage.update(x, state, params, info)
    return (_math.clean(x) if isinstance(stage, FunctionStage) else x), state


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

    keys = jax.vmap(jax.random.key)(seeds.reshape(-1)).reshape(seeds.shape)
    data = jnp.where((streams == 0)[..., None], jax.random.key_data(keys), jax.random.key_data(_noise.fold_in(keys, streams)))
    return jax.random.wrap_key_data(data)


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
    def step_infos(self, state: SamplerState, params: Params) -> dict[str, StepInfo]:
        """What each stage and the selector see at this step, by name: its key, the position, the history.

        A name's key is :func:`request_keys` folded with the position, then salted with the name. The
        parts every name shares are computed once and the salts hashed in one call, so a step's program
        holds one key derivation, not one per stage (same bits as :meth:`step_info` name by name).
        """
        names = tuple(dict.fromkeys([s.name for s in self.stages] + [self.selector.name]))
        at_position = _noise.fold_in(request_keys(params), state.position)
        salts = jnp.asarray([_stage_salt(n) for n in names], jnp.uint32)
        keys = _noise.fold_in(jnp.broadcast_to(at_position[..., None], at_position.shape + (len(names),)), salts)
        history = _ring_view(state.ring, state.filled)
        return {
            name: StepInfo(key=keys[..., i], position=state.position, history=history, prompt=state.prompt,
                           encoder_ids=state.encoder_ids)
            for i, name in enumerate(names)
        }

    def step_info(self, state: SamplerState, params: Params, name: str) -> StepInfo:
        """:meth:`step_infos` of one stage (or the selector) ``name``."""
        infos = self.step_infos(state, params)
        if name not in infos:
            raise ValueError(f"name {name!r} is neither a stage nor the selector of this chain: {sorted(infos)}")
        return infos[name]

    def process(self, logits: ArrayLike, state: SamplerState, params: Params) -> tuple[Array, SamplerState]:
        """Applies every stage: ``logits [B, V]`` (any float dtype) -> float32 ``[B, V]`` (NaN -> ``-inf``)."""
        x = _math.clean(jnp.asarray(logits).astype(jnp.float32))
        new = []
        infos = self.step_infos(state, params)
        for stage, s in zip(self.stages, state.stages):
            x, s = apply(stage, x, s, params, infos[stage.name])
            new.append(s)
        return x, state._replace(stages=tuple(new))

    def select(self, logits: Array, state: SamplerState, params: Params) -> tuple[Array, SamplerState]:
        """Runs the selector on processed (NaN-free float32) logits: ``int32[B]`` tokens."""
        info = self.step_info(state, params, self.selector.name)
        tokens, s = self.selector.select(logits, state.selector, params, info)
        return tokens.astype(jnp.int32), state._replace(selector=s)

    def accept(
        self, tokens: ArrayLike, state: SamplerState, params: Params, active: ArrayLike | None = None
    ) -> SamplerState:
        """Records tokens (sampled, forced or drafted): stage ``accept``s, history, position.

        Rows where ``active`` is False keep their state unchanged.
        """
        tokens = jnp.asarray(tokens, jnp.int32)
        infos = self.step_infos(state, params)
        new = tuple(
            stage.accept(tokens, s, params, infos[stage.name])
            for stage, s in zip(self.stages, state.stages)
        )
        w = state.ring.shape[-1]
        ring = state.ring
        if w > 0:
            slot = state.filled % w
            ring = jnp.where(jnp.arange(w) == slot[..., None], tokens[..., None], ring)
        updated = state._replace(stages=new, ring=ring, filled=state.filled + 1, position=state.position + 1)
        if active is None:
            return updated
        return _where_rows(jnp.asarray(active, bool), updated, state)

    def sample(
        self, logits: ArrayLike, state: SamplerState, params: Params, active: ArrayLike | None = None
    ) -> tuple[Array, Array, SamplerState]:
        """One decoding step: ``process`` -> ``select`` -> ``accept``; rows with ``active=False`` keep their state.

        ``process`` and ``select`` run on candidate sets from the first filter on when the chain and
        the batch allow it; :mod:`jaxsample._fastpath` proves that equal bit for bit.

        Returns:
          ``(tokens int32[B], processed_logits float32[B, V], new_state)``.
        """
        from jaxsample import _fastpath  # (imports this module)

        x = _math.clean(jnp.asarray(logits).astype(jnp.float32))
        tokens, x, stage_states, sel = _fastpath.process_select(self, x, state, params)
        new = self.accept(tokens, state._replace(stages=stage_states, selector=sel), params)
        if active is not None:  # finished rows keep every part of their state, selector's included
            new = _where_rows(jnp.asarray(active, bool), new, state)
        return tokens, x, new


def chain(*stages: Stage, select: Selector) -> Sampler:
    """Composes stages (applied in order) and a selector into a :class:`Sampler`.

    Raises:
      ValueError: if a part is not a stage (or the selector not a selector), two stages share a
        name, or two stages declare the same parameter with different defaults or ranges.
    """
    for i, s in enumerate(stages):
        if not isinstance(s, Stage):
            raise ValueError(f"chain: stage {i} is not a jaxsample Stage (got {type(s).__name__}); "
                             "build stages with jaxsample.stages or Stage(name, update, ...)")
    if not isinstance(select, Selector):
        raise ValueError(f"chain: select= must be a jaxsample Selector (got {type(select).__name__})")
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
