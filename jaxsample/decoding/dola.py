"""DoLa, decoding by contrasting layers (Chuang et al., ICLR 2024), with HuggingFace's semantics.

Each step, the model's final logits ``z_N`` are contrasted with the early-exit logits ``z_j`` (the
LM head applied to the hidden state after layer ``j``) of a few candidate "premature" layers:

1. the premature layer is the candidate with the largest Jensen-Shannon divergence from the final
   layer, ``JS_j = (KL(p_N || m_j) + KL(p_j || m_j)) / 2`` with ``m_j = (p_N + p_j) / 2`` (HF takes
   the mean over the vocabulary, which does not change the argmax);
2. relative-top filter (``relative_top``, HF's default 0.1): tokens with
   ``log p_N < max log p_N + log(relative_top)`` get ``-inf``, and their premature log-prob ``-1e-3``;
3. the logits are ``log_softmax(z_N) - log_softmax(z_j)``; the sampler chain (repetition penalty,
   warpers, greedy or sampling selector) then runs on them as on ordinary logits.

Candidate layers (:func:`candidate_layers`, HF ``dola_layers``): ``"low"``, ``"high"`` or explicit
indices (``0`` is the embedding output; indices ``>= N`` are dropped). With tied embeddings the
embedding layer is skipped (its early exit is nearly the identity): the low range starts at layer 2
(``N > 2``), 1 (``N == 2``) or 0. For ``N <= 40`` layers ``"low"`` is ``range(start, N // 2, 2)`` and
``"high"`` ``range(N // 2, N, 2)``; for ``N > 40`` they are ``range(start, 20, 2)`` and
``range(N - 20, N, 2)``.

Deliberate differences from HF: the premature layer is chosen per row (HF averages the divergences
over the batch and picks one layer for the whole batch, so a row's output depends on its batch;
both agree for batch size 1, the paper's setting); ``relative_top`` is a per-row parameter (HF
hard-codes 0.1); encoder-decoder models are accepted (HF refuses them).

>>> import jax.numpy as jnp
>>> final = jnp.log(jnp.array([0.6, 0.3, 0.1]))
>>> early = jnp.log(jnp.array([[0.7, 0.2, 0.1]]))
>>> [round(float(x), 3) for x in contrast(final, early, 0.4)]
[-0.154, 0.405, -inf]
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.chain import Sampler
from jaxsample.decoding.adapters import as_model
from jaxsample.decoding.loop import GenerateOutput, decode, fill_pad, prepare
from jaxsample.decoding.model import Model, StepOutput
from jaxsample.decoding.options import DecodingOptions

_BASE_FILTERED = -1.0e-3  # HF's base_filter_value: premature log-prob of filtered tokens
_RECOMMENDED_PENALTY = 1.2


def candidate_layers(dola_layers: str | Sequence[int], num_layers: int, tied_embeddings: bool) -> tuple[int, ...]:
    """HF's premature candidate layers for ``dola_layers`` (``"low"``, ``"high"`` or indices).

    >>> candidate_layers("high", 12, True), candidate_layers("low", 12, True), candidate_layers([0, 5, 12], 12, True)
    ((6, 8, 10), (2, 4), (0, 5))
    """
    n = _validate.static_int(num_layers, "num_layers", lo=1)
    if not tied_embeddings:
        start = 0
    else:
        start = 2 if n > 2 else (1 if n == 2 else 0)
    if isinstance(dola_layers, str):
        if dola_layers == "low":
            if start == n // 2:
                layers = [start]
            else:
                layers = list(range(start, n // 2, 2) if n <= 40 else range(start, 20, 2))
        elif dola_layers == "high":
            layers = list(range(n // 2, n, 2) if n <= 40 else range(n - 20, n, 2))
        else:
            raise ValueError(f"dola_layers must be 'low', 'high' or a list of layer indices, got {dola_layers!r}")
    else:
        try:
            given = [int(i) for i in dola_layers]
        except (TypeError, ValueError):
            raise ValueError(f"dola_layers must be 'low', 'high' or a list of layer indices, got {dola_layers!r}")
        if any(i < 0 for i in given):
            raise ValueError(f"dola_layers indices must be >= 0 (0 is the embedding layer), got {given}")
        layers = [i for i in given if i < n]
    if not layers:
        raise ValueError(f"dola_layers={dola_layers!r} selects no layer below the final one of a {n}-layer model")
    return tuple(layers)


def _divergence(final: Array, early: Array) -> Array:
    """HF's Jensen-Shannon divergence ``float32[..., J]`` of log-probabilities ``final [..., V]`` and
    each early exit's ``early [..., J, V]`` (torch's ``kl_div(...).mean(-1)`` of both against their mean).

    The means over ``V`` are :func:`jaxsample._math.row_sum` (one summation order in every batch
    size: ``jnp.mean``'s changes with the shape, so a row's layer could depend on its neighbours).
    """
    p_final, p_early = jnp.exp(final)[..., None, :], jnp.exp(early)
    mid = 0.5 * (p_final + p_early)
    log_mid = jnp.log(jnp.where(mid > 0, mid, 1.0))

    def kl(logq):  # mean of mid * (log mid - logq), 0 where mid == 0
        return _math.row_sum(jnp.where(mid > 0, mid * (log_mid - logq), 0.0)) / mid.shape[-1]

    return 0.5 * (kl(final[..., None, :]) + kl(early))


def contrast(final_logits: Array, layer_logits: Array, relative_top: ArrayLike = 0.1) -> Array:
    """DoLa logits from ``final_logits [..., V]`` and candidate early exits ``layer_logits [..., J, V]``.

    ``relative_top`` broadcasts to the batch shape ``[...]``; returns float32 ``[..., V]``.
    """
    final = _math.log_softmax(jnp.asarray(final_logits, jnp.float32))
    early = _math.log_softmax(jnp.asarray(layer_logits, jnp.float32))
    js = _divergence(final, early)  # [..., J]
    pick = jnp.argmax(js, axis=-1)
    base = jnp.take_along_axis(early, pick[..., None, None], axis=-2)[..., 0, :]
    rt = jnp.clip(jnp.asarray(relative_top, jnp.float32), jnp.finfo(jnp.float32).tiny, 1.0)
    thresh = jnp.max(final, axis=-1, keepdims=True) + jnp.log(rt)[..., None]
    low = final < thresh
    return jnp.where(low, -jnp.inf, final) - jnp.where(low, _BASE_FILTERED, base)


class _Contrasted(NamedTuple):
    """A ``Model.apply_step`` returning DoLa logits; ``params`` is ``(model params, relative_top [B])``.

    A hashable callable (equal for equal fields), so the jitted loop is reused across calls.
    """

    model: Model
    layers: tuple[int, ...]

    def __call__(self, params, tokens, positions, cache) -> StepOutput:
        model_params, relative_top = params
        out = self.model.early_exit.apply_step(model_params, tokens, positions, cache, self.layers)
        logits = contrast(out.logits, out.layer_logits, relative_top[:, None])
        return StepOutput(logits, out.cache, out.hidden)


def _warn_penalty(sampler: Sampler, sampler_params: Mapping[str, ArrayLike] | None) -> None:
    """HF's rule: DoLa warns unless ``repetition_penalty >= 1.2``."""
    value = (sampler_params or {}).get("repetition_penalty")
    if value is None and "repetition_penalty" in sampler.param_specs():
        value = sampler.param_specs()["repetition_penalty"].default
    try:
        low = value is None or bool(np.any(np.asarray(value) < _RECOMMENDED_PENALTY))
    except jax.errors.TracerArrayConversionError:
        return
    if low:
        warnings.warn(
            f"repetition_penalty is {value} (None: no repetition penalty stage), which could induce unwanted "
            f"repetition. The recommended value for DoLa decoding is repetition_penalty >= {_RECOMMENDED_PENALTY}.",
            stacklevel=3,
        )


def dola_generate(
    model: Model,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    dola_layers: str | Sequence[int],
    relative_top: ArrayLike = 0.1,
    max_new_tokens: ArrayLike,
    max_tokens: int | None = None,
    sampler: Sampler | None = None,
    sampler_params: Mapping[str, ArrayLike] | None = None,
    eos_ids: ArrayLike | None = None,
    stop_sequences=None,
    min_new_tokens: ArrayLike = 0,
    pad_id: int | None = None,
    cache: Any = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    history_size: int | None = None,
    attention_mask: ArrayLike | None = None,
) -> GenerateOutput:
    """DoLa decoding (HF ``dola_layers``), greedy or sampled by ``sampler``; one jitted loop.

    Args:
      model: a :class:`Model` with ``early_exit`` (e.g. ``Model(lm.apply_step, lm.init_cache,
        lm.early_exit)`` for :class:`jaxsample.models.DecoderLM` or :class:`jaxsample.models.Bart`).
      dola_layers: ``"low"``, ``"high"`` or a list of layer indices (static; see the module docs).
      relative_top: relative-top filter per row (traced), in ``(0, 1]``.
      sampler: runs on the contrasted logits (HF applies its processors there too); HF recommends
        ``repetition_penalty >= 1.2`` and warns otherwise, as this function does.
      Other arguments: as :func:`jaxsample.decoding.generate`. Log-probs describe the contrasted
      distribution.
    """
    model = as_model(model)
    if model.early_exit is None:
        raise ValueError(
            "dola_generate needs a model with early_exit: jaxsample.models' DecoderLM / Bart, or "
            "DecodingModel(apply_step, init_cache, early_exit)"
        )
    ee = model.early_exit
    layers = candidate_layers(dola_layers, ee.num_layers, ee.tied_embeddings)
    opts = DecodingOptions(max_new_tokens=max_new_tokens, max_tokens=max_tokens, sampler=sampler,
                           sampler_params=sampler_params, eos_ids=eos_ids, stop_sequences=stop_sequences,
                           min_new_tokens=min_new_tokens, pad_id=pad_id, logprobs=logprobs, top_logprobs=top_logprobs,
                           history_size=history_size)
    req = prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask)
    _warn_penalty(req.sampler, sampler_params)
    b = req.prompt.shape[0]
    rt = _validate.param(relative_top, (b,), "relative_top", lo=0.0, hi=1.0, lo_open=True)
    inner = Model(_Contrasted(model, layers), model.init_cache)
    out = decode(
        inner, req.sampler, req.cfg, 1, (params, rt), req.prompt, req.lengths, req.cache, req.sampler_params, req.stops
    )
    return fill_pad(out, req.pad_id)
