"""Sample-and-rank: ``best_of`` independent samples per prompt, the best ``n`` returned (vLLM ``n`` /
``best_of``; Meena and LaMDA "sample-and-rank").

The prompt is prefilled once and its cache repeated ``best_of`` times; sample ``i`` of a prompt with
stream ``r`` of seed ``s`` draws from stream ``r * best_of + i`` of ``s`` (:func:`jaxsample.chain.request_keys`;
a prompt given its own seed has ``r = 0``, so sample ``i`` is stream ``i``). Unlike vLLM's per-child
seeds ``s + i``, the samples of prompts with adjacent seeds never share a stream, and every sample
is reproducible on its own.
Samples are ranked by their sequence log-probability ``sum(log p) / L ** length_penalty`` under the
raw model (``rank_by="raw"``, Meena) or under the distribution sampled from (``"processed"``).
Everything, the ranking included, is one ``jax.jit``.

>>> import jax.numpy as jnp
>>> from jaxsample import chain, stages
>>> from jaxsample.decoding import BIGRAM
>>> table = jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2]]))
>>> out = sample_and_rank(BIGRAM, {"logits": table}, jnp.array([[0]]), n=2, best_of=8, max_new_tokens=3,
...                       sampler=chain(stages.temperature(1.0), select=stages.categorical()))
>>> out.tokens.shape, bool(out.scores[0, 0] >= out.scores[0, 1])
((1, 2, 3), True)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsample import _validate
from jaxsample._types import Array, ArrayLike
from jaxsample.decoding import _stopping, sharding
from jaxsample.decoding.loop import fill_pad, prepare, run
from jaxsample.decoding.model import repeat_params
from jaxsample.decoding.options import DecodingOptions


class RankedOutput(NamedTuple):
    """The best ``n`` of ``best_of`` samples per prompt, best first."""

    tokens: Array  # int32[B, n, N]
    lengths: Array  # int32[B, n]
    finish_reason: Array  # int32[B, n]
    scores: Array  # float32[B, n]: the ranking score
    cumulative_logprob: Array  # float32[B, n]: sum of raw-model log-probs of the sample
    sample_index: Array  # int32[B, n]: i of the sample (stream i of its seed, for a prompt with its own seed)


def _rank(model, sampler, cfg, best_of, n, rank_by, params, prompt, lengths, cache, sparams, stops, alpha):
    out = run(model, sampler, cfg, best_of, params, prompt, lengths, cache, sparams, stops)
    b = prompt.shape[0]
    valid = jnp.arange(cfg.max_tokens) < out.lengths[:, None]
    lp = out.logprobs.raw if rank_by == "raw" else out.logprobs.processed
    total = jnp.sum(jnp.where(valid, lp, 0.0), axis=-1).reshape(b, best_of)
    raw_total = jnp.sum(jnp.where(valid, out.logprobs.raw, 0.0), axis=-1).reshape(b, best_of)
    length = jnp.maximum(out.lengths, 1).astype(jnp.float32).reshape(b, best_of)
    scores = total / jnp.power(length, alpha[:, None])
    scores, j = lax.top_k(scores, n)

    def pick(x):  # [B * best_of, ...] -> the ranked [B, n, ...]
        x = x.reshape((b, best_of) + x.shape[1:])
        return jnp.take_along_axis(x, j.reshape(j.shape + (1,) * (x.ndim - 2)), axis=1)

    return RankedOutput(
        pick(out.tokens), pick(out.lengths), pick(out.finish_reason), scores, pick(raw_total.reshape(-1)), j
    )


_rank_jit = jax.jit(_rank, static_argnums=(0, 1, 2, 3, 4, 5))


def rank(model, params, prompt, prompt_lengths, opts: DecodingOptions, *, cache=None, attention_mask=None,
         mesh=None) -> RankedOutput:
    """Sample-and-rank from validated options (``n``, ``best_of``, ``rank_by``; see :func:`sample_and_rank`)."""
    n, best_of = opts.num_samples()
    req = prepare(model, params, prompt, prompt_lengths, opts.replace(logprobs=True, top_logprobs=0), cache=cache,
                  attention_mask=attention_mask, mesh=mesh)
    b = req.prompt.shape[0]
    alpha = _validate.param(opts.rank_length_penalty(), (b,), "length_penalty")
    rows = repeat_params(req.sampler, req.sampler_params, best_of)
    rows["seed_stream"] = rows["seed_stream"] * best_of + jnp.tile(jnp.arange(best_of, dtype=jnp.int32), b)
    stops = _stopping.repeat(req.stops, best_of)
    s = req.cfg.batch_sharding
    out = _rank_jit(
        req.model,
        req.sampler,
        req.cfg,
        best_of,
        n,
        opts.rank_by,
        sharding.replicate(params, s),
        req.prompt,
        req.lengths,
        req.cache,
        rows,
        stops,
        sharding.place_rows(alpha, s),
    )
    return fill_pad(out, req.pad_id)


def sample_and_rank(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    n: int = 1,
    best_of: int | None = None,
    max_new_tokens: ArrayLike,
    length_penalty: ArrayLike = 0.0,
    attention_mask: ArrayLike | None = None,
    cache: Any = None,
    mesh: Any = None,
    **kwargs: Any,
) -> RankedOutput:
    """Draws ``best_of`` samples per prompt and returns the ``n`` best (both static, ``n <= best_of``).

    Args:
      n, best_of: returned and drawn samples per prompt (``best_of`` defaults to ``n``).
      sampler, sampler_params: the chain and its per-prompt values ``[B]``; sample ``i`` of a
        prompt with its own seed draws from stream ``i`` of that seed (``seed_stream=i``).
      rank_by: ``"raw"`` (model log-probs) or ``"processed"`` (log-probs of what was sampled from).
      length_penalty: ``alpha`` per prompt: score ``= sum(log p) / length ** alpha`` (0: plain sum).
      Other arguments: as :func:`jaxsample.decoding.generate` (per prompt).
    """
    from jaxsample.decoding.generate import options_from

    opts = options_from(kwargs.pop("options", None), dict(kwargs, n=n, best_of=best_of, max_new_tokens=max_new_tokens,
                                                         length_penalty=length_penalty))
    return rank(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask, mesh=mesh)
