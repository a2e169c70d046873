"""Reasoning budgets: after ``N`` thinking tokens, force the end-of-thinking sequence (vLLM, llama.cpp).

A row is in one of three phases: outside a thinking block, thinking (counting tokens), or forcing
(emitting the forced sequence one token per step: every other logit ``-inf``). The per-row budget
``thinking_token_budget`` is traced (``-1``: no budget, the stage never forces); ``0`` forces as
soon as thinking starts. The forced sequence ends the block; a later start sequence opens a new one
with a fresh budget. Two anchors, chosen with ``scope``:

* ``"vllm"`` (``ThinkingTokenBudgetLogitsProcessor``, ``thinking_token_budget``): the phase is
  initialised from the prompt (thinking iff the last start sequence comes after the last end
  sequence; the prompt's tokens after it count); then after each generated token: generated
  tokens ending with the start sequence open a block (count 0), ending with the end sequence close
  it, otherwise a thinking row counts one; a thinking row whose count reaches the budget starts
  forcing the end sequence. The forced token's logit is set to 0.
* ``"llama"`` (``common/reasoning-budget.cpp``, ``--reasoning-budget``): token matchers for the
  start and end sequences that restart on a mismatch (llama.cpp's ``token_matcher``, not a suffix
  match); only the end matcher runs while thinking, only the start matcher outside; thinking
  starts in the prompt as in ``"vllm"`` but counts only generated tokens; the forced sequence may
  differ from the end sequence (``forced_ids``); the forced token keeps its logit (0 if it was
  ``-inf``). Deviation: llama.cpp waits for a UTF-8-complete token before forcing, which needs the
  vocabulary's bytes; this stage forces at once.

Place the stage after the filters (or anywhere before a selector that keeps the best token) so
that nothing removes the forced token.

Sharding/TPU: rows are independent; shard the batch axis (the state is ``[*B, ...]``). One
elementwise pass over ``[*B, V]``; no batch-level branch.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxsample import _math
from jaxsample.chain import InitInfo, Param, Stage, StepInfo

_SCOPES = ("vllm", "llama")
OUTSIDE, THINKING, FORCING = 0, 1, 2


def _ids(seq, name: str) -> tuple[int, ...]:
    out = tuple(int(t) for t in np.asarray(seq, np.int64).reshape(-1))
    if not out or any(t < 0 for t in out):
        raise ValueError(f"{name} must be a non-empty list of token ids >= 0, got {seq!r}")
    return out


def _last_index(tokens, seq: tuple[int, ...]):
    """Start index of the last occurrence of ``seq`` in ``tokens [B, T]`` (-1: none)."""
    b, t = tokens.shape
    n = len(seq)
    if n > t:
        return jnp.full((b,), -1, jnp.int32)
    hit = jnp.ones((b, t - n + 1), bool)
    for j, tok in enumerate(seq):
        hit = hit & (tokens[:, j : t - n + 1 + j] == tok)
    idx = jnp.arange(t - n + 1)
    return jnp.max(jnp.where(hit, idx, -1), axis=-1).astype(jnp.int32)


def _advance(pos, token, seq: tuple[int, ...]):
    """llama.cpp's ``token_matcher::advance``: ``(new_pos, matched)``."""
    arr = jnp.asarray(seq, jnp.int32)
    nxt = jnp.where(token == arr[jnp.clip(pos, 0, len(seq) - 1)], pos + 1, jnp.where(token == seq[0], 1, 0))
    done = nxt >= len(seq)
    return jnp.where(done, 0, nxt).astype(jnp.int32), done


def _ends_with(window, seq: tuple[int, ...]):
    return jnp.all(window[:, window.shape[1] - len(seq) :] == jnp.asarray(seq, jnp.int32), axis=-1)


@dataclasses.dataclass(frozen=True)
class ReasoningBudget(Stage):
    """Forces the end of a thinking block after ``thinking_token_budget`` thinking tokens (see the module doc).

    Args:
      start_ids, end_ids: token ids opening and closing a thinking block (e.g. ``<think>``, ``</think>``).
      forced_ids: the sequence forced when the budget is spent (default ``end_ids``; ``scope="vllm"``
        always forces ``end_ids``).
      budget: default of the per-row param ``thinking_token_budget`` (``-1``: no budget).
      scope: ``"vllm"`` or ``"llama"``.

    State per row: ``(phase, count, force_pos, window or matcher positions)``; the stage's
    ``accept`` must see every generated token (samplers do this in the decoding loops).
    """

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    forced_ids: tuple[int, ...] | None = None
    _: dataclasses.KW_ONLY
    budget: int = dataclasses.field(default=-1, compare=False)
    scope: str = "vllm"
    name: str = "reasoning_budget"

    def __post_init__(self):
        if self.scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {self.scope!r}")
        object.__setattr__(self, "start_ids", _ids(self.start_ids, "start_ids"))
        object.__setattr__(self, "end_ids", _ids(self.end_ids, "end_ids"))
        forced = None if self.forced_ids is None or self.scope == "vllm" else _ids(self.forced_ids, "forced_ids")
        object.__setattr__(self, "forced_ids", forced)
        super().__post_init__()

    @property
    def _forced(self) -> tuple[int, ...]:
        return self.end_ids if self.forced_ids is None else self.forced_ids

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("thinking_token_budget", self.budget, jnp.int32, lo=-1),)

    def init(self, info: InitInfo):
        b = info.batch_shape
        zeros = jnp.zeros(b, jnp.int32)
        limit = jnp.broadcast_to(info.params["thinking_token_budget"], b)
        if info.prompt is None:
            thinking, count = jnp.zeros(b, bool), zeros
        else:
            prompt = info.prompt.reshape((-1, info.prompt.shape[-1]))
            s_at, e_at = _last_index(prompt, self.start_ids), _last_index(prompt, self.end_ids)
            thinking = (s_at > e_at).reshape(b)
            n_tok = jnp.sum(prompt >= 0, axis=-1)  # prompts are left-aligned: tokens after the start
            after = (n_tok - s_at - len(self.start_ids)).reshape(b)
            count = jnp.where(thinking, after, 0) if self.scope == "vllm" else zeros
        phase = jnp.where(thinking, THINKING, OUTSIDE)
        phase = jnp.where(thinking & (limit >= 0) & (count >= limit), FORCING, phase).astype(jnp.int32)
        if self.scope == "vllm":
            aux = jnp.full(b + (max(len(self.start_ids), len(self.end_ids)),), -1, jnp.int32)
        else:
            aux = jnp.zeros(b + (2,), jnp.int32)
        return (phase, count.astype(jnp.int32), zeros, aux)

    def update(self, x, s, p, info: StepInfo):
        phase, _, pos, _ = s
        forced = self._forced
        tok = jnp.asarray(forced, jnp.int32)[jnp.clip(pos, 0, len(forced) - 1)]
        hot = jnp.arange(x.shape[-1]) == tok[..., None]
        if self.scope == "vllm":
            value = jnp.zeros_like(x)
        else:
            value = jnp.where(jnp.isfinite(x), x, 0.0)
        forced_x = jnp.where(hot, value, _math.NEG_INF)
        return jnp.where((phase == FORCING)[..., None], forced_x, x), s

    def accept(self, tokens, state, params, info):
        accept = self._accept_vllm if self.scope == "vllm" else self._accept_llama
        return accept(tokens, state, params, info)

    def _accept_vllm(self, tokens, s, p, info):
        phase, count, pos, window = s
        limit = p["thinking_token_budget"]
        window = jnp.concatenate([window[..., 1:], tokens[..., None]], axis=-1)
        forcing = phase == FORCING
        pos_f = pos + 1
        finished = pos_f >= len(self._forced)
        opened = _ends_with(window, self.start_ids)
        closed = ~opened & _ends_with(window, self.end_ids)
        new_phase = jnp.where(opened, THINKING, jnp.where(closed, OUTSIDE, phase))
        new_count = jnp.where(opened | closed, 0, jnp.where(phase == THINKING, count + 1, count))
        over = (new_phase == THINKING) & (limit >= 0) & (new_count >= limit)
        new_phase = jnp.where(over, FORCING, new_phase)
        phase = jnp.where(forcing, jnp.where(finished, OUTSIDE, FORCING), new_phase)
        count = jnp.where(forcing, 0, new_count)
        pos = jnp.where(forcing & ~finished, pos_f, 0)
        return (phase.astype(jnp.int32), count.astype(jnp.int32), pos.astype(jnp.int32), window)

    def _accept_llama(self, tokens, s, p, info):
        phase, count, pos, m = s
        limit = p["thinking_token_budget"]
        spos, epos = m[..., 0], m[..., 1]
        # outside: the start matcher runs
        spos_n, opened = _advance(spos, tokens, self.start_ids)
        out_phase = jnp.where(opened, jnp.where(limit == 0, FORCING, THINKING), OUTSIDE)
        # thinking: the end matcher runs, other tokens count
        epos_n, closed = _advance(epos, tokens, self.end_ids)
        counted = count + 1
        over = ~closed & (limit >= 0) & (counted >= limit)
        in_phase = jnp.where(closed, OUTSIDE, jnp.where(over, FORCING, THINKING))
        # forcing: advance through the forced sequence
        pos_f = pos + 1
        finished = pos_f >= len(self._forced)
        outside, thinking = phase == OUTSIDE, phase == THINKING
        new_phase = jnp.where(outside, out_phase, jnp.where(thinking, in_phase, jnp.where(finished, OUTSIDE, FORCING)))
        new_count = jnp.where(outside, 0, jnp.where(thinking, counted, count))
        new_pos = jnp.where((phase == FORCING) & ~finished, pos_f, 0)
        new_spos = jnp.where(outside, spos_n, spos)
        # llama.cpp resets the end matcher when a block opens or forcing starts
        new_epos = jnp.where(thinking & ~over, epos_n, 0)
        m = jnp.stack([new_spos, new_epos], axis=-1)
        return (new_phase.astype(jnp.int32), new_count.astype(jnp.int32), new_pos.astype(jnp.int32), m)
