"""The model protocol every decoding strategy drives, plus row-gathering helpers and a bigram toy model.

A model is two plain callables (bundled in :class:`DecodingModel`, also exported under its first
name ``Model``; it is hashable so it can be a static ``jit`` argument). Every strategy also takes
any object with these two methods (``jaxsample.models.DecoderLM`` and ``Bart``,
:class:`~jaxsample.decoding.TinyDecoder`) and, through :mod:`jaxsample.decoding.adapters`, plain
logits functions, Flax NNX modules, Gemma-style calls and caches with one shared write index:

* ``apply_step(params, tokens int32[B, T], positions int32[B, T], cache) -> StepOutput``.
  ``positions[b, t]`` is the absolute 0-based position of token ``t`` of row ``b``; ``-1`` marks
  padding (no cache write, never attended, logits ignored). Prefill is one call with the
  right-padded prompt; decoding then calls with ``T = 1`` (``T = k + 1`` to verify speculative
  drafts) at per-row positions.
* ``init_cache(batch_size, max_len) -> cache`` (decoder-only models). Encoder-decoder models build
  the cache with their encoder first and pass it to the strategy; decoding then starts from the
  decoder start token at position 0.
* optionally ``early_exit`` (:class:`EarlyExit`): the same step also returning the logits of
  intermediate layers (DoLa, :func:`jaxsample.decoding.dola_generate`).

Every leaf of the cache has the batch as leading axis, so beams and samples are reordered with
``leaf[idx]`` (:func:`take_rows`) and expanded with :func:`repeat_rows`. Strategies that rewind
(speculative decoding) rely on the usual position-masked KV cache: a query at position ``p`` attends
only to cache slots ``<= p``, and writes at a position overwrite whatever was there, so slots
written for rejected drafts are harmless.

>>> import jax.numpy as jnp
>>> params = {"logits": jnp.log(jnp.array([[0.1, 0.9], [0.8, 0.2]]))}
>>> out = BIGRAM.apply_step(params, jnp.array([[0, 1]]), jnp.array([[0, 1]]), BIGRAM.init_cache(1, 4))
>>> out.logits.argmax(-1).tolist()
[[1, 0]]
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxsample._types import Array

Cache = Any
Params = Any


class StepOutput(NamedTuple):
    """What ``apply_step`` returns."""

    logits: Array  # float32[B, T, V]
    cache: Cache  # pytree; every leaf has leading axis B
    hidden: Array | None = None  # [B, T, D] last-layer hidden states (contrastive search), or None
    layer_logits: Array | None = None  # float32[B, T, J, V] early-exit logits (EarlyExit.apply_step), or None


class EarlyExit(NamedTuple):
    """Early-exit logits of a model's intermediate layers (HF ``output_hidden_states`` + LM head).

    ``apply_step(params, tokens, positions, cache, layers)`` is ``Model.apply_step`` whose
    :class:`StepOutput` also carries ``layer_logits float32[B, T, J, V]``: the LM head applied to
    the hidden state after layer ``layers[j]`` (a static tuple; ``0`` is the embedding output,
    ``num_layers`` the last layer, whose logits are ``StepOutput.logits``).
    """

    num_layers: int  # N transformer layers
    tied_embeddings: bool  # the LM head is the token embedding (HF ``tie_word_embeddings``)
    apply_step: Callable[[Params, Array, Array, Cache, tuple[int, ...]], StepOutput]


class DecodingModel(NamedTuple):
    """A model as the decoding strategies see it: ``apply_step``, (decoder-only) ``init_cache``, and
    optionally ``early_exit`` (needed by DoLa only).

    ``lockstep`` is set by the shared-index adapters: the model writes every row at one shared
    cache slot, so it serves only strategies whose running rows all advance together (every
    strategy except speculative decoding). ``ragged`` is False when such a model takes no
    attention mask, so prompts of different lengths cannot share a batch.
    """

    apply_step: Callable[[Params, Array, Array, Cache], StepOutput]
    init_cache: Callable[[int, int], Cache] | None = None
    early_exit: EarlyExit | None = None
    lockstep: bool = False
    ragged: bool = True


#: The first name of :class:`DecodingModel` (kept; ``jaxsample.models.Model`` is another thing:
#: the union of the project's Flax model classes, also named ``jaxsample.models.LanguageModel``).
Model = DecodingModel


def take_rows(tree: Any, rows: Array) -> Any:
    """Gathers rows ``rows int32[R]`` along the leading (batch) axis of every leaf."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)


def repeat_rows(tree: Any, n: int) -> Any:
    """Repeats every row ``n`` times along the leading axis (``[B, ...] -> [B * n, ...]``, row-major)."""
    if n == 1:
        return tree
    return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), tree)


def repeat_params(sampler, params: dict, n: int) -> dict:
    """:func:`repeat_rows` for sampler parameters, leaving ``Param.shared`` ones (e.g. grammar tables) whole."""
    shared = {name for name, spec in sampler.param_specs().items() if spec.shared}
    return {k: v if k in shared else repeat_rows(v, n) for k, v in params.items()}


def where_rows(keep_new: Array, new: Any, old: Any) -> Any:
    """Per-row ``where`` over two pytrees with leading batch axis (``keep_new bool[B]``)."""

    def pick(a, b):
        return jnp.where(keep_new.reshape(keep_new.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def prompt_positions(prompt: Array, lengths: Array) -> tuple[Array, Array]:
    """Model inputs for a right-padded prompt: ``(tokens int32[B, P], positions int32[B, P])``.

    Padding slots (``t >= lengths[b]``) get token 0 and position ``-1``.
    """
    t = jnp.arange(prompt.shape[-1], dtype=jnp.int32)
    valid = t < lengths[:, None]
    return jnp.where(valid, prompt, 0), jnp.where(valid, t, -1)


def last_valid(x: Array, lengths: Array) -> Array:
    """``x[b, lengths[b] - 1]`` for ``x [B, T, ...]``."""
    idx = jnp.clip(lengths - 1, 0, x.shape[1] - 1)
    return jnp.take_along_axis(x, idx.reshape((-1, 1) + (1,) * (x.ndim - 2)), axis=1)[:, 0]


# ------------------------------------------------------------------------------------------ toy model
def _bigram_apply(params: Params, tokens: Array, positions: Array, cache: Cache) -> StepOutput:
    table = params["logits"]  # [V, V]
    b, t = tokens.shape
    written = positions >= 0
    slot = jnp.where(written, positions, cache["tokens"].shape[1])  # out of range -> dropped
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    cache_tokens = cache["tokens"].at[rows, slot].set(tokens, mode="drop")
    logits = jnp.take(table, jnp.clip(tokens, 0, table.shape[0] - 1), axis=0).astype(jnp.float32)
    hidden = jnp.take(params["hidden"], tokens, axis=0) if "hidden" in params else None
    return StepOutput(logits, {"tokens": cache_tokens}, hidden)


def _bigram_init_cache(batch_size: int, max_len: int) -> Cache:
    return {"tokens": jnp.full((batch_size, max_len), -1, jnp.int32)}


#: Deterministic toy model: the logits of the next token are ``params["logits"][last_token]`` (a
#: ``[V, V]`` table), the hidden state ``params["hidden"][last_token]`` if given (``[V, D]``). Its
#: cache records the token written at each position (``{"tokens": int32[B, max_len]}``), so tests can
#: check that strategies write and reorder caches correctly.
BIGRAM = DecodingModel(_bigram_apply, _bigram_init_cache)
