"""Log-probabilities of given continuations as text: perplexity and reranking from strings.

:func:`score_text` encodes each ``prompt + continuation`` jointly (so the tokens are those the
model would see) and scores, teacher-forced, the tokens after the longest common prefix with the
prompt's own encoding. When a token straddles the boundary (``"ab" + "c"`` encoded as ``"abc"``), it
is scored as part of the continuation; ``token_ids`` says exactly what was scored. One jitted call
of :func:`jaxsample.scoring.score_continuations` for the whole batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample.scoring import score_continuations
from jaxsample.text.tokenizer import as_tokenizer


class TextScore(NamedTuple):
    """Scores of one continuation."""

    logprob: float  # sum of the continuation tokens' log-probs
    token_ids: list[int]  # the scored tokens
    token_logprobs: list[float]

    @property
    def perplexity(self) -> float:
        """``exp(-logprob / len(token_ids))`` (``nan`` for an empty continuation)."""
        n = len(self.token_ids)
        return float(np.exp(-self.logprob / n)) if n else float("nan")


def _pad(rows: list[list[int]], width: int) -> np.ndarray:
    out = np.full((len(rows), max(width, 1)), -1, np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def score_text(
    model,
    params: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    continuations: Sequence[str],
    *,
    temperature=None,
) -> list[TextScore]:
    """Teacher-forced log-probs of ``continuations[i]`` after ``prompts[i]``.

    Args:
      model, params: a :class:`jaxsample.decoding.Model` (decoder-only) and its parameters.
      tokenizer: anything :func:`jaxsample.text.as_tokenizer` accepts.
      prompts, continuations: ``B`` strings each; a prompt must encode to at least one token.
      temperature: ``None`` (raw log-probs) or ``> 0`` (processed, see :mod:`jaxsample.scoring`).
    """
    tok = as_tokenizer(tokenizer)
    if len(prompts) != len(continuations) or not prompts:
        raise ValueError(
            f"prompts and continuations must be non-empty and of equal length, got {len(prompts)} and {len(continuations)}"
        )
    heads, tails = [], []
    for p, c in zip(prompts, continuations):
        alone, joint = tok.encode(p), tok.encode(p + c)
        k = 0
        while k < min(len(alone), len(joint)) and alone[k] == joint[k]:
            k += 1
        if k == 0:
            raise ValueError(
                f"prompt {p!r} shares no first token with prompt + continuation (scoring needs at least one "
                "prompt token before the continuation, e.g. a BOS)"
            )
        heads.append(joint[:k])
        tails.append(joint[k:])
    s = score_continuations(
        model,
        params,
        jnp.asarray(_pad(heads, max(map(len, heads)))),
        jnp.asarray(_pad(tails, max(map(len, tails)))),
        continuation_lengths=jnp.asarray([len(t) for t in tails], jnp.int32),
        temperature=temperature,
    )
    lp, total = np.asarray(s.logprobs), np.asarray(s.total)
    return [TextScore(float(total[i]), t, lp[i, : len(t)].tolist()) for i, t in enumerate(tails)]
