"""Jump-forward decoding: tokens a grammar forces are fed to the model several per call.

Where a grammar state allows exactly one token (``"customer_id": `` after ``{`` in a JSON schema
with a required first property, a closing ``"}``), that token is *forced*. Jump-forward (SGLang's
name; llguidance's fast-forward tokens, XGrammar's ``find_jump_forward_string``) follows the chain
of forced tokens from each row's grammar state and feeds them to the model together with the row's
newest token in **one** call of ``1 + j`` tokens, instead of ``1 + j`` one-token calls. The call's
logits at the last forced token then give the next free token, as a plain step would.

It is prompt-lookup decoding (:mod:`jaxsample.decoding.lookup`) with a different proposer: the
drafts are the forced chain (:class:`Forced`), verified by the same kernel. At every position the
row runs the whole sampler chain as plain decoding does (its key for that position, the chain
state after the tokens before it) and a draft is kept only if it equals that draw, so:

* **outputs are bit-identical to plain constrained decoding**, greedy or sampled, for any chain
  and seed (a draft is plain decoding's own draw at its position; stateful stages such as
  mirostat see the same tokens in the same order);
* **randomness**: the key of position ``p`` is ``fold_in(key(seed), p)`` whether or not ``p`` is
  forced. A forced position draws (its draw is the forced token, the only finite logit) and
  consumes nothing that later positions use, so they draw exactly as in plain decoding;
* only the number of model calls changes. A forced chain stops at ``k`` tokens (``jump_forward``,
  static), after a forced EOS id, and where the row's ``max_new_tokens`` leaves no room.

Shapes stay fixed: the call width is chosen per iteration among the powers of two up to ``k + 1``
(``lax.switch``), the smallest that holds ``1 + max`` chain length over the batch's rows; a batch
whose longest chain is shorter than ``jump_forward_min`` (traced) takes a plain one-token step
(multi-token calls cost more than one-token calls on some hardware: a CPU pays for every position).

>>> import jax.numpy as jnp
>>> import jaxsample as js
>>> from jaxsample import stages, structured as st
>>> from jaxsample.decoding import BIGRAM, generate
>>> v = st.Vocabulary.from_pieces(["<eos>", "a", "b", "c"], kind="raw", special_ids=[0], eos_ids=[0])
>>> sampler = js.chain(stages.grammar(), select=stages.greedy())
>>> rows = {"seed": jnp.zeros(1, jnp.int32), **st.grammar_params([st.compile_regex("abc(a|b)+", v)])}
>>> table = {"logits": jnp.log(jnp.tile(jnp.array([0.1, 0.2, 0.6, 0.1]), (4, 1)))}
>>> common = dict(max_new_tokens=6, eos_ids=0, sampler=sampler, sampler_params=rows)
>>> out = jump_forward_generate(BIGRAM, table, [[0]], jump_forward=4, **common)
>>> out.tokens.tolist(), out.num_accepted.tolist()   # "abc" forced: one call for a, b, c and the next token
([[1, 2, 3, 2, 2, 2]], [3])
>>> generate(BIGRAM, table, [[0]], **common).tokens.tolist()
[[1, 2, 3, 2, 2, 2]]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxsample import _validate
from jaxsample._types import ArrayLike
from jaxsample.chain import Sampler
from jaxsample.decoding import _stopping, lookup
from jaxsample.decoding.loop import GenerateOutput, fill_pad, prepare
from jaxsample.decoding.options import DecodingOptions
from jaxsample.decoding.speculative import SpeculativeOutput


class Forced(NamedTuple):
    """The forced-chain proposer (static): up to ``k`` tokens the grammar stage ``name`` forces in a row."""

    name: str

    def __call__(self, state: lookup.LookupState, sampler: Sampler, sparams, stops, extra, k: int):
        from jaxsample import structured

        b = state.last.shape[0]
        room = stops.max_new_tokens - state.out.length - 1  # the call also emits one free token
        going = ~state.out.done & (room > 0)

        def body(carry):
            j, going, sst, drafts, count = carry
            f = structured.forced_tokens(sampler, sst, sparams, name=self.name)
            take = going & (f >= 0) & (j < room)
            drafts = drafts.at[:, j].set(jnp.where(take, f, 0))
            sst = sampler.accept(jnp.where(take, f, 0), sst, sparams, take)
            going = take & ~_stopping.is_eos(f, stops.eos_ids)
            return j + 1, going, sst, drafts, count + take

        init = (0, going, state.sampler, jnp.zeros((b, k), jnp.int32), jnp.zeros((b,), jnp.int32))
        _, _, _, drafts, count = lax.while_loop(lambda c: (c[0] < k) & jnp.any(c[1]), body, init)
        return drafts, count


def grammar_stage_name(sampler: Sampler | None) -> str:
    """The name of the sampler's one grammar stage.

    Raises:
      ValueError: if the sampler has no grammar stage, or several.
    """
    from jaxsample.structured.stage import param_names

    names = [] if sampler is None else [
        s.name for s in sampler.stages if param_names(s.name)[0] in {p.name for p in s.params}
    ]
    if len(names) != 1:
        raise ValueError(
            f"jump_forward needs a sampler with exactly one grammar stage (stages.grammar()), found {names or 'none'}"
        )
    return names[0]


def widths(k: int) -> tuple[int, ...]:
    """Static call widths: the powers of two below ``k + 1``, then ``k + 1``."""
    out = [1]
    while out[-1] * 2 < k + 1:
        out.append(out[-1] * 2)
    return tuple(out) + ((k + 1,) if out[-1] != k + 1 else ())


def decode(model, params, prompt, prompt_lengths, opts: DecodingOptions, *, cache=None, attention_mask=None, mesh=None):
    """Validated jump-forward decode: ``(request, Tracker, drafted int32[B], accepted int32[B])``."""
    k = _validate.static_int(opts.jump_forward, "jump_forward", lo=1)
    _validate.check_range(opts.jump_forward_min, "jump_forward_min", lo=1, integer=True)
    req = prepare(model, params, prompt, prompt_lengths, opts, cache=cache, attention_mask=attention_mask,
                  extra_positions=k + 1, mesh=mesh)
    name = grammar_stage_name(req.sampler)
    b = req.prompt.shape[0]
    o, drafted, accepted = lookup._decode_jit(
        req.model, req.sampler, req.cfg, widths(k), Forced(name), params, req.prompt, req.lengths,
        jnp.full((b, 0), -1, jnp.int32), req.cache, req.sampler_params, None, jnp.int32(opts.jump_forward_min),
        req.stops,
    )
    return req, o, drafted, accepted


def generate_tokens(model, params, prompt, prompt_lengths, opts: DecodingOptions, **where) -> GenerateOutput:
    """``generate(..., jump_forward=k)``: the same output as plain decoding (log-probs included)."""
    req, o, _, _ = decode(model, params, prompt, prompt_lengths, opts, **where)
    return fill_pad(GenerateOutput(o.tokens, o.length, o.reason, o.logprobs), req.pad_id)


def jump_forward_generate(
    model: Any,
    params: Any,
    prompt: ArrayLike,
    prompt_lengths: ArrayLike | None = None,
    *,
    jump_forward: int = 8,
    jump_forward_min: int = 1,
    cache: Any = None,
    attention_mask: ArrayLike | None = None,
    **kwargs: Any,
) -> SpeculativeOutput:
    """Jump-forward decoding with the forced-token counts (``generate(..., jump_forward=k)`` without them).

    Args:
      model, params, prompt, prompt_lengths, cache, attention_mask: as :func:`~jaxsample.decoding.generate`.
      jump_forward: static ``k >= 1``: most forced tokens fed per call.
      jump_forward_min: traced: a batch whose longest forced chain is shorter takes a one-token step.
      **kwargs: :class:`~jaxsample.decoding.DecodingOptions` fields of greedy / sampled generation
        (``max_new_tokens``, ``sampler`` with a grammar stage, ``sampler_params``, ``eos_ids``, ...).

    Returns:
      :class:`~jaxsample.decoding.SpeculativeOutput`: ``num_drafted`` forced tokens proposed per
      row, ``num_accepted`` those emitted by multi-token calls (model calls per row: ``lengths -
      num_accepted``).

    Raises:
      ValueError: on invalid options, a sampler without exactly one grammar stage, or
        ``logprobs`` (use ``generate(..., jump_forward=k, logprobs=True)``).
    """
    opts = DecodingOptions(jump_forward=jump_forward, jump_forward_min=jump_forward_min, **kwargs)
    if opts.strategy() != "generate" or opts.logprobs or opts.top_logprobs or opts.logprob_token_ids is not None:
        raise ValueError("jump_forward_generate runs greedy / sampled generation without log-probs; "
                         "use generate(..., jump_forward=k) for log-probs")
    req, o, drafted, accepted = decode(model, params, prompt, prompt_lengths, opts, cache=cache,
                                       attention_mask=attention_mask)
    return fill_pad(SpeculativeOutput(o.tokens, o.length, o.reason, drafted, accepted), req.pad_id)
