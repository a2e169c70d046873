"""One entry point for every strategy: :func:`generate` (HF ``generate`` semantics where HF has one).

With its first keywords only, :func:`generate` is greedy or sampled generation with any
:class:`jaxsample.Sampler` chain: one ``jax.jit``-compiled ``lax.while_loop`` over the model (the
kernel lives in :mod:`jaxsample.decoding.loop`). The other options pick the strategy as HF does
(:meth:`~jaxsample.decoding.options.DecodingOptions.strategy`): ``num_beams > 1`` beam search
(``do_sample`` beam sampling, ``num_beam_groups`` diverse beam search), ``penalty_alpha`` with
``top_k`` contrastive search, ``n`` / ``best_of`` sample-and-rank, a ``draft_model`` speculative
decoding; ``num_beams=1`` is greedy unless ``do_sample`` or the sampler chain says otherwise.

Per-request values are traced (new values never recompile): sampler values, seeds,
``max_new_tokens`` up to the static ``max_tokens``, EOS ids, stop sequences, ``min_new_tokens``,
length / diversity penalties, ``penalty_alpha``. Prompts may be right-padded with ``-1``,
left-padded with ``-1``, or come with HF's ``attention_mask``. With ``mesh=`` (or a prompt sharded
over a mesh) the batch is decoded data-parallel (:mod:`jaxsample.decoding.sharding`).

>>> import jax.numpy as jnp
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.1, 0.2, 0.7], [0.8, 0.1, 0.1]]))
>>> out = generate(BIGRAM, {"logits": table}, jnp.array([[0, -1], [1, 2]]), max_new_tokens=4, eos_ids=0)
>>> out.tokens.tolist(), out.lengths.tolist(), out.finish_reason.tolist()
([[1, 2, 0, 0], [0, 0, 0, 0]], [3, 1], [1, 1])
>>> generate(BIGRAM, {"logits": table}, [[1]], max_new_tokens=2, num_beams=2).tokens.shape   # BeamOutput
(1, 1, 2)
"""

from __future__ import annotations

from typing import Any

from jaxsample._types import ArrayLike
from jaxsample.decoding import beam, contrastive, jump_forward, loop, rank, speculative
from jaxsample.decoding.loop import GenerateOutput
from jaxsample.decoding.options import DecodingOptions
from jaxsample.decoding.sharding import replicate


def options_from(options: DecodingOptions | None, kwargs: dict) -> DecodingOptions:
    """``options`` with ``kwargs`` applied (or a new :class:`DecodingOptions`); unknown names raise ``ValueError``."""
    if options is not None and not isinstance(options, DecodingOptions):
        raise ValueError(f"options must be a DecodingOptions, got {type(options).__name__}")
    try:
        return options.replace(**kwargs) if options is not None else DecodingOptions(**kwargs)
    except TypeError as err:
        raise ValueError(f"unknown decoding option: {err}") from None


def generate_tokens(model, params, prompt, prompt_lengths, opts: DecodingOptions, *, cache=None,
                    attention_mask=None, mesh=None) -> GenerateOutput:
    """Greedy / sampled generation from validated options (the ``generate`` strategy)."""
    if opts.jump_forward is not None:
        return jump_forward.generate_tokens(model, params, prompt, prompt_lengths, opts, cache=cache,
                                            attention_mask=attention_mask, mesh=mesh)
    req = loop.prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask, mesh=mesh)
    out = loop.decode(req.model, req.sampler, req.cfg, 1, replicate(params, req.cfg.batch_sharding), req.prompt,
                      req.lengths, req.cache, req.sampler_params, req.stops)
    return loop.fill_pad(out, req.pad_id)


def generate(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    options: DecodingOptions | None = None,
    attention_mask: ArrayLike | None = None,
    cache: Any = None,
    mesh: Any = None,
    draft_model: Any = None,
    draft_params: Any = None,
    draft_cache: Any = None,
    draft_sampler: Any = None,
    draft_sampler_params: Any = None,
    **kwargs: Any,
):
    """Generates with the strategy the options call for (greedy by default).

    Args:
      model: a :class:`~jaxsample.decoding.DecodingModel`, an object with ``apply_step`` /
        ``init_cache`` (``jaxsample.models.DecoderLM``), or an adapter of
        :mod:`jaxsample.decoding.adapters`.
      params: model parameters (any pytree), passed to ``apply_step``.
      prompt: ``int[B, P]``: right- or left-padded with ``-1``, or padded with anything under
        ``attention_mask``. Encoder-decoder models: the decoder start token, with ``cache``.
      prompt_lengths: ``int[B]`` valid lengths of a right-padded prompt (instead of ``-1`` padding).
      options: a :class:`~jaxsample.decoding.options.DecodingOptions`; ``kwargs`` override its fields.
      attention_mask: HF's ``[B, P]`` mask (1 = token), left or right padding.
      cache: a prebuilt cache (encoder-decoder models); default ``model.init_cache(B, P + N)``.
      mesh: a ``jax.sharding.Mesh`` to decode data-parallel over (default: the prompt's, if sharded).
      draft_model, draft_params, draft_cache, draft_sampler, draft_sampler_params: speculative
        decoding (see :func:`~jaxsample.decoding.speculative_generate`; needs ``num_draft_tokens``).
      **kwargs: :class:`DecodingOptions` fields: ``max_new_tokens`` (required), ``max_tokens``,
        ``sampler``, ``sampler_params``, ``eos_ids``, ``stop_sequences``, ``min_new_tokens``,
        ``pad_id``, ``logprobs``, ``top_logprobs``, ``history_size``, ``do_sample``, ``num_beams``,
        ``num_beam_groups``, ``diversity_penalty``, ``length_penalty``, ``early_stopping``,
        ``num_return_sequences``, ``length_normalization``, ``top_k``, ``penalty_alpha``, ``n``,
        ``best_of``, ``rank_by``, ``num_draft_tokens``, ``repetition_detection`` (greedy / sampling),
        ``logprob_token_ids``, ``jump_forward`` / ``jump_forward_min`` (greedy / sampling with a
        grammar stage: :mod:`~jaxsample.decoding.jump_forward`).

    Returns:
      :class:`GenerateOutput` (greedy, sampling, contrastive), :class:`~jaxsample.decoding.BeamOutput`
      (beams), :class:`~jaxsample.decoding.RankedOutput` (``n`` / ``best_of``) or
      :class:`~jaxsample.decoding.SpeculativeOutput` (draft model).
    """
    opts = options_from(options, kwargs)
    strategy = opts.strategy(draft=draft_model is not None)
    if opts.jump_forward is not None and strategy != "generate":
        raise ValueError(f"jump_forward: supported by greedy / sampled generation only, not by {strategy}")
    if opts.repetition_detection is not None and strategy != "generate":
        raise ValueError(f"repetition_detection: supported by greedy / sampled generation only, not by {strategy}")
    where = dict(cache=cache, attention_mask=attention_mask, mesh=mesh)
    if strategy == "beam_search":
        return beam.search(model, params, prompt, prompt_lengths, opts, **where)
    if strategy == "contrastive_search":
        return contrastive.search(model, params, prompt, prompt_lengths, opts, **where)
    if strategy == "sample_and_rank":
        return rank.rank(model, params, prompt, prompt_lengths, opts, **where)
    if strategy == "speculative_generate":
        where["target_cache"] = where.pop("cache")
        return speculative.speculate(model, params, draft_model, draft_params, prompt, prompt_lengths, opts,
                                     draft_cache=draft_cache, draft_sampler=draft_sampler,
                                     draft_sampler_params=draft_sampler_params, **where)
    if any(x is not None for x in (draft_params, draft_cache, draft_sampler, draft_sampler_params)):
        raise ValueError("draft_params / draft_cache / draft_sampler need a draft_model")
    return generate_tokens(model, params, prompt, prompt_lengths, opts, **where)
