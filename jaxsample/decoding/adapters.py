"""Bring your own model: coercion, contract checks and adapters to the decoding protocol.

Every strategy takes ``model`` as one of:

* a :class:`~jaxsample.decoding.model.DecodingModel` (``apply_step``, ``init_cache``);
* any object with ``apply_step(params, tokens, positions, cache)`` and (decoder-only)
  ``init_cache(batch_size, max_len)`` methods: ``jaxsample.models.DecoderLM`` / ``Bart``,
  :class:`~jaxsample.decoding.TinyDecoder` (:func:`as_model`);
* an adapter built here, once (adapters compare equal when built from the same objects, so
  compiled loops are reused):

  - :func:`from_function`: ``logits = f(params, tokens int32[B, T])``, a causal model with no cache
    (every step reruns the whole sequence: simple, ``O(L)`` per token);
  - :func:`from_nnx`: a Flax NNX module, uncached (``module(tokens) -> logits``) or cached with
    ``nnx.MultiHeadAttention(decode=True)`` caches;
  - :func:`from_gemma`: the Gemma-style call ``f(params, tokens, positions, cache, attention_mask)
    -> (logits, cache)`` whose cache writes every row at one shared index;
  - :func:`from_shared_index`: the general form of the two above, for any cache with one write
    index for the whole batch (HF Flax, ``nnx`` ``decode=True``).

**Shared-index caches.** The protocol lets every row write at its own position; a shared-index
cache writes all rows at one slot. :func:`from_shared_index` makes the two agree: prompts are
right-aligned in the cache (row ``b`` of length ``n_b`` fills slots ``P - n_b .. P - 1``), so every
strategy whose running rows advance together (all but speculative decoding, which refuses such a
model) writes all rows at the same slot; the model gets an attention mask over the slots holding
each row's real tokens and the rows' true positions (for rotary / learned position embeddings).
Cache leaves without a batch axis (the scalar index) are broadcast to ``[B, ...]`` outside the
model, so beams and samples are gathered like any other leaf, and given back unbroadcast.

:func:`check_model` runs before any compilation: every cache leaf must be batch-leading, and one
abstract model call on the prompt (``jax.eval_shape``) must return ``logits [B, P, V]`` and a cache
of the same structure and shapes; errors name the offending leaf.

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import generate
>>> table = jnp.log(jnp.array([[0.1, 0.9], [0.8, 0.2]]))
>>> model = from_function(lambda params, tokens: params[tokens])   # logits [B, T, V]
>>> generate(model, table, [[0]], max_new_tokens=3).tokens.tolist()
[[1, 0, 1]]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample._types import Array
from jaxsample.decoding.model import DecodingModel, StepOutput

_ADAPTERS = "from_function, from_nnx, from_gemma or from_shared_index (jaxsample.decoding.adapters)"


def as_model(model: Any, name: str = "model") -> DecodingModel:
    """``model`` as a :class:`DecodingModel`: itself, or its ``apply_step`` / ``init_cache`` methods."""
    if isinstance(model, DecodingModel):
        return model
    if isinstance(model, tuple) and len(model) == 2 and all(callable(x) or x is None for x in model):
        return DecodingModel(*model)
    apply = getattr(model, "apply_step", None)
    if callable(apply):
        init = getattr(model, "init_cache", None)
        return DecodingModel(apply, init if callable(init) else None, getattr(model, "early_exit", None))
    hint = " (a plain logits function: wrap it with from_function)" if callable(model) else ""
    raise ValueError(
        f"{name} must be a jaxsample.decoding.DecodingModel, an object with apply_step(params, tokens, "
        f"positions, cache) and init_cache(batch_size, max_len) (e.g. jaxsample.models.DecoderLM), or an "
        f"adapter: {_ADAPTERS}; got {type(model).__name__}{hint}"
    )


# ------------------------------------------------------------------------------------------ checks
def _spec(x: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), x)


def _key(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.result_type(a))) for a in leaves)


def batch_leading(spec: Any, batch: int, bigger: Any = None) -> list[bool]:
    """Per leaf of ``spec``: whether its leading axis is the batch (``bigger``: the spec at ``batch + 1``)."""
    leaves = jax.tree.leaves(spec)
    more = jax.tree.leaves(bigger) if bigger is not None else [None] * len(leaves)
    return [
        len(a.shape) >= 1 and a.shape[0] == batch and (m is None or (len(m.shape) >= 1 and m.shape[0] == batch + 1))
        for a, m in zip(leaves, more)
    ]


def check_cache(spec: Any, batch: int, bigger: Any = None, name: str = "model") -> None:
    """``ValueError`` naming the first cache leaf whose leading axis is not the batch."""
    flags = batch_leading(spec, batch, bigger)
    for (path, leaf), ok in zip(jax.tree_util.tree_flatten_with_path(spec)[0], flags):
        if not ok:
            raise ValueError(
                f"cache leaf {jax.tree_util.keystr(path) or '<root>'} of {name} has shape {tuple(leaf.shape)}: "
                f"every cache leaf needs the batch (B={batch}) as leading axis, so rows can be gathered for "
                "beams and samples. A cache with one write index shared by the batch (a scalar cache_index, "
                "as in HF Flax or nnx decode=True) needs jaxsample.decoding.adapters.from_shared_index "
                "(from_nnx(..., cached=True), from_gemma)"
            )


_CHECKED: dict = {}


def check_model(model: DecodingModel, params: Any, prompt: Array, cache: Any, cache_len: int,
                name: str = "model") -> None:
    """Checks the cache contract and one abstract prefill call (no compilation; memoised per shapes).

    Raises:
      ValueError: naming the cache leaf without a batch axis, or what the model returned instead of
        ``StepOutput(logits [B, P, V], cache of the same structure and shapes)``.
    """
    b, p = prompt.shape
    key = (model, b, p, cache_len, _key(params), None if cache is None else _key(cache))
    if key in _CHECKED:
        return
    if cache is None:
        spec = jax.eval_shape(lambda: model.init_cache(b, cache_len))
        check_cache(spec, b, jax.eval_shape(lambda: model.init_cache(b + 1, cache_len)), name)
    else:
        spec = _spec(cache)
        check_cache(spec, b, None, name)
    tokens = jax.ShapeDtypeStruct((b, p), jnp.int32)
    out = jax.eval_shape(model.apply_step, params, tokens, tokens, spec)
    if not hasattr(out, "logits") or not hasattr(out, "cache"):
        raise ValueError(f"{name}.apply_step must return StepOutput(logits, cache, hidden), got {type(out).__name__}")
    logits = out.logits
    if len(logits.shape) != 3 or tuple(logits.shape[:2]) != (b, p):
        raise ValueError(
            f"{name}.apply_step returned logits of shape {tuple(logits.shape)} for tokens [{b}, {p}]; "
            f"expected [B, T, V] = [{b}, {p}, V]"
        )
    if jax.tree.structure(out.cache) != jax.tree.structure(spec):
        raise ValueError(
            f"{name}.apply_step returned a cache of another structure than it was given: "
            f"{jax.tree.structure(out.cache)} vs {jax.tree.structure(spec)}"
        )
    for (path, old), new in zip(jax.tree_util.tree_flatten_with_path(spec)[0], jax.tree.leaves(out.cache)):
        if tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype:
            raise ValueError(
                f"{name}.apply_step changed cache leaf {jax.tree_util.keystr(path)} from "
                f"{old.dtype}{list(old.shape)} to {new.dtype}{list(new.shape)}; a step must keep every cache leaf's shape"
            )
    hidden = getattr(out, "hidden", None)
    if hidden is not None and tuple(hidden.shape[:2]) != (b, p):
        raise ValueError(f"{name}.apply_step returned hidden states of shape {tuple(hidden.shape)}; expected [{b}, {p}, D]")
    if len(_CHECKED) > 512:
        _CHECKED.clear()
    _CHECKED[key] = True


# ------------------------------------------------------------------------------- plain functions
def _split_output(out: Any) -> tuple[Array, Array | None]:
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields") and len(out) == 2:
        return out[0], out[1]
    if hasattr(out, "logits"):
        return out.logits, getattr(out, "hidden", None)
    return out, None


@dataclasses.dataclass(frozen=True)
class _FunctionStep:
    fn: Callable

    def __call__(self, params: Any, tokens: Array, positions: Array, cache: dict) -> StepOutput:
        buf = cache["tokens"]
        b, t = tokens.shape
        length = buf.shape[1]
        rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
        buf = buf.at[rows, jnp.where(positions >= 0, positions, length)].set(tokens, mode="drop")
        logits, hidden = _split_output(self.fn(params, buf))
        if logits.ndim != 3 or tuple(logits.shape[:2]) != (b, length):
            raise ValueError(
                f"the model function must return logits [B, T, V] = [{b}, {length}, V] for tokens "
                f"[{b}, {length}], got shape {tuple(logits.shape)}"
            )
        pick = jnp.clip(positions, 0, length - 1)[..., None]
        logits = jnp.take_along_axis(logits, pick, axis=1).astype(jnp.float32)
        if hidden is not None:
            hidden = jnp.take_along_axis(hidden, pick, axis=1)
        return StepOutput(logits, {"tokens": buf}, hidden)


def _token_buffer(batch_size: int, max_len: int) -> dict:
    return {"tokens": jnp.zeros((batch_size, max_len), jnp.int32)}


def from_function(fn: Callable) -> DecodingModel:
    """A causal model without a cache: ``fn(params, tokens int32[B, T]) -> logits [B, T, V]``.

    ``fn`` may also return ``(logits, hidden [B, T, D])`` (contrastive search needs ``hidden``).
    The "cache" is the token buffer ``int32[B, max_len]``; each step writes the new tokens at their
    positions and reruns ``fn`` on the whole buffer, reading the logits at those positions. Slots
    after a row's position hold zeros or stale tokens, so ``fn`` must be causal (position ``t`` may
    depend only on tokens ``<= t``), as every decoder LM is.
    """
    if not callable(fn):
        raise ValueError(f"from_function needs a callable fn(params, tokens), got {type(fn).__name__}")
    return DecodingModel(_FunctionStep(fn), _token_buffer)


# ---------------------------------------------------------------------------- shared-index caches
@functools.lru_cache(maxsize=256)
def _shared_leaves(init_cache: Callable, batch: int, max_len: int) -> tuple[bool, ...]:
    """Per leaf of ``init_cache(batch, max_len)``: True for leaves without a batch axis."""
    spec = jax.eval_shape(lambda: init_cache(batch, max_len))
    bigger = jax.eval_shape(lambda: init_cache(batch + 1, max_len))
    return tuple(not f for f in batch_leading(spec, batch, bigger))


def _broadcast(tree: Any, shared: tuple[bool, ...], batch: int) -> Any:
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [jnp.broadcast_to(x, (batch,) + x.shape) if s else x for x, s in zip(leaves, shared)]
    return jax.tree.unflatten(treedef, leaves)


def _unbroadcast(tree: Any, shared: tuple[bool, ...]) -> Any:
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [x[0] if s else x for x, s in zip(leaves, shared)])


@dataclasses.dataclass(frozen=True)
class _SharedInit:
    init_cache: Callable

    def __call__(self, batch_size: int, max_len: int) -> dict:
        shared = _shared_leaves(self.init_cache, batch_size, max_len)
        return {
            "model": _broadcast(self.init_cache(batch_size, max_len), shared, batch_size),
            "valid": jnp.zeros((batch_size, max_len), bool),  # slot holds a real token of the row
            "index": jnp.zeros((batch_size,), jnp.int32),  # slots written so far (the same in every row)
        }


@dataclasses.dataclass(frozen=True)
class _SharedStep:
    step: Callable  # (params, tokens, positions, cache, attention_mask) -> logits | (logits, cache) | StepOutput
    init_cache: Callable
    masks: bool
    single_token: bool

    def _call(self, params, tokens, positions, cache, mask):
        out = self.step(params, tokens, positions, cache, mask if self.masks else None)
        if hasattr(out, "logits"):
            return out.logits, out.cache, getattr(out, "hidden", None)
        if isinstance(out, (tuple, list)) and len(out) in (2, 3):
            return out[0], out[1], out[2] if len(out) == 3 else None
        raise ValueError(f"a shared-index step must return (logits, cache) or StepOutput, got {type(out).__name__}")

    def __call__(self, params: Any, tokens: Array, positions: Array, cache: dict) -> StepOutput:
        b, t = tokens.shape
        valid, index = cache["valid"], cache["index"][0]
        length = valid.shape[1]
        shared = _shared_leaves(self.init_cache, b, length)
        inner = _unbroadcast(cache["model"], shared)
        # right-align each row's real tokens (a prefix of the block) so that every row writes slot index + j
        n = jnp.sum(positions >= 0, axis=1)
        shift = t - n
        j = jnp.arange(t)
        src = jnp.clip(j[None, :] - shift[:, None], 0, t - 1)
        real = j[None, :] >= shift[:, None]  # [B, T]
        tok = jnp.where(real, jnp.take_along_axis(tokens, src, axis=1), 0)
        pos = jnp.where(real, jnp.take_along_axis(positions, src, axis=1), 0)
        slots = index + j  # [T]
        hit = slots[None, :, None] == jnp.arange(length)  # [1, T, L]
        valid = valid | jnp.any(hit & real[:, :, None], axis=1)
        sees = valid[:, None, :] & (jnp.arange(length)[None, None, :] <= slots[None, :, None])
        mask = sees | hit  # a padding query sees its own slot only (no all-masked rows)
        if self.single_token and t > 1:
            def one(c, xs):
                tk, ps, mk = xs
                logit, c, hid = self._call(params, tk[:, None], ps[:, None], c, mk[:, None])
                return c, (logit[:, 0], None if hid is None else hid[:, 0])

            inner, (logits, hidden) = lax.scan(one, inner, (tok.T, pos.T, jnp.swapaxes(mask, 0, 1)))
            logits = jnp.swapaxes(logits, 0, 1)
            hidden = None if hidden is None else jnp.swapaxes(hidden, 0, 1)
        else:
            logits, inner, hidden = self._call(params, tok, pos, inner, mask)
        if logits.ndim != 3 or tuple(logits.shape[:2]) != (b, t):
            raise ValueError(f"the model step must return logits [B, T, V] = [{b}, {t}, V], got {tuple(logits.shape)}")
        back = jnp.clip(j[None, :] + shift[:, None], 0, t - 1)[..., None]  # undo the alignment
        logits = jnp.take_along_axis(logits.astype(jnp.float32), back, axis=1)
        if hidden is not None:
            hidden = jnp.take_along_axis(hidden, back, axis=1)
        new = {"model": _broadcast(inner, shared, b), "valid": valid, "index": cache["index"] + t}
        return StepOutput(logits, new, hidden)


def from_shared_index(
    step: Callable, init_cache: Callable, *, masks: bool = True, single_token: bool = False
) -> DecodingModel:
    """A model whose cache writes every row at one shared index (see the module docstring).

    Args:
      step: ``step(params, tokens int32[B, T], positions int32[B, T], cache, attention_mask)`` returning
        ``(logits [B, T, V], cache)``, ``(logits, cache, hidden)`` or a ``StepOutput``. The model writes
        the ``T`` tokens at its own index and advances it by ``T``. ``attention_mask: bool[B, T, L]``
        (``None`` when ``masks=False``) is True where query ``t`` may attend cache slot ``l``: slots
        holding the row's real tokens up to the query's own slot. ``positions`` are each token's
        true position in its row (``0`` for alignment padding).
      init_cache: ``init_cache(batch_size, max_len)``; leaves without a batch axis are allowed.
      masks: whether ``step`` applies ``attention_mask``; without it prompts of different lengths
        are refused (``ValueError``), since their padding would be attended.
      single_token: the model takes one token per call (``nnx`` ``decode=True``); longer blocks
        (the prompt) are fed one token at a time with ``lax.scan``.
    """
    if not callable(step) or not callable(init_cache):
        raise ValueError("from_shared_index needs callables step(...) and init_cache(batch_size, max_len)")
    return DecodingModel(
        _SharedStep(step, init_cache, bool(masks), bool(single_token)), _SharedInit(init_cache), lockstep=True,
        ragged=bool(masks),
    )


@dataclasses.dataclass(frozen=True)
class _GemmaCall:
    fn: Callable

    def __call__(self, params, tokens, positions, cache, mask):
        return self.fn(params, tokens, positions, cache, mask)


def from_gemma(fn: Callable, init_cache: Callable) -> DecodingModel:
    """The Gemma-style call: ``fn(params, tokens [B, T], positions [B, T], cache, attention_mask [B, T, L])
    -> (logits [B, T, V], cache)``, with a cache that writes all rows at one index.

    This is :func:`from_shared_index` with masks; ragged prompts and beams are supported (rows are
    right-aligned in the cache, ``attention_mask`` hides each row's alignment padding).
    """
    return from_shared_index(_GemmaCall(fn), init_cache, masks=True)


# ------------------------------------------------------------------------------------------ Flax NNX
@dataclasses.dataclass(frozen=True)
class _NnxLogits:
    graphdef: Any

    def __call__(self, state, tokens):
        from flax import nnx

        return nnx.merge(self.graphdef, state)(tokens)


@dataclasses.dataclass(frozen=True)
class _NnxStep:
    graphdef: Any
    call: Callable | None

    def __call__(self, params, tokens, positions, cache, mask):
        from flax import nnx

        module = nnx.merge(self.graphdef, cache, params)
        if self.call is None:
            logits = module(tokens)
        else:
            logits = self.call(module, tokens, positions, mask)
        return logits, nnx.state(module, nnx.Cache)


def _nnx_init_caches(module, batch_size: int, max_len: int) -> None:
    from flax import nnx

    for _, m in module.iter_modules():
        if isinstance(m, nnx.MultiHeadAttention):
            m.init_cache((batch_size, max_len, m.in_features), m.dtype or jnp.float32)


@dataclasses.dataclass(frozen=True)
class _NnxInit:
    graphdef: Any
    init: Callable
    params: Any = dataclasses.field(compare=False, hash=False)
    template: Any = dataclasses.field(compare=False, hash=False)

    def __call__(self, batch_size: int, max_len: int):
        from flax import nnx

        module = nnx.merge(self.graphdef, self.template, self.params)
        self.init(module, batch_size, max_len)
        return nnx.state(module, nnx.Cache)


def from_nnx(
    module: Any, *, cached: bool = False, call: Callable | None = None, init_cache: Callable | None = None,
    masks: bool | None = None,
) -> tuple[DecodingModel, Any]:
    """A Flax NNX module as ``(model, params)`` (``params``: the module's non-cache state).

    Uncached (default): ``module(tokens int32[B, T]) -> logits [B, T, V]``, run through
    :func:`from_function` (the whole sequence every step).

    Cached (``cached=True``): a module built with ``nnx.MultiHeadAttention(decode=True)`` layers (or
    any ``nnx.Cache`` variables with one shared write index). Each call feeds one token per row
    (:func:`from_shared_index` with ``single_token=True``). ``call(module, tokens, positions,
    attention_mask bool[B, 1, L]) -> logits`` runs the module with the mask (pass it to the attention
    layers as ``mask=attention_mask[:, None]``); without ``call`` the module is called as
    ``module(tokens)``; without a mask (no ``call``, or ``masks=False``) prompts of different lengths
    are refused. ``init_cache(module,
    batch_size, max_len)`` allocates the caches in place (default: ``init_cache`` of every
    ``nnx.MultiHeadAttention`` in the module).
    """
    from flax import nnx

    if not isinstance(module, nnx.Module):
        raise ValueError(f"from_nnx needs a flax.nnx.Module, got {type(module).__name__}")
    if not cached:
        graphdef, state = nnx.split(module)
        return from_function(_NnxLogits(graphdef)), state
    init = init_cache or _nnx_init_caches
    probe = nnx.clone(module)
    init(probe, 1, 1)  # the cache variables exist only once allocated
    graphdef, template, params = nnx.split(probe, nnx.Cache, ...)
    if not jax.tree.leaves(template):
        raise ValueError("from_nnx(cached=True): the module has no nnx.Cache variables after init_cache")
    model = from_shared_index(
        _NnxStep(graphdef, call),
        _NnxInit(graphdef, init, params, template),
        masks=call is not None if masks is None else masks,
        single_token=True,
    )
    return model, params
