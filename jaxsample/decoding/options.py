"""One validated object for every decoding option: :class:`DecodingOptions`.

Every strategy (:func:`~jaxsample.decoding.generate` and the functions it dispatches to) builds a
``DecodingOptions`` from its keywords, and :class:`jaxsample.evaluation.DecodingConfig` validates
its settings through the same object, so a rule (``num_beams`` divisible by ``num_beam_groups``,
``early_stopping`` values, ``n <= best_of`` ...) lives in one place. Static options (shapes and
code paths) are checked here; per-row values (``max_new_tokens``, EOS ids, penalties ...) are
checked against the batch later, by :func:`jaxsample.decoding.loop.prepare`.

:meth:`DecodingOptions.strategy` picks the strategy the way HuggingFace ``generate`` does:

>>> DecodingOptions(max_new_tokens=8).strategy(), DecodingOptions(max_new_tokens=8, num_beams=4).strategy()
('generate', 'beam_search')
>>> DecodingOptions(max_new_tokens=8, penalty_alpha=0.6, top_k=4).strategy()
'contrastive_search'
>>> DecodingOptions(max_new_tokens=8, num_beams=4, num_beam_groups=3)
Traceback (most recent call last):
...
ValueError: num_beams (4) must be divisible by num_beam_groups (3)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxsample import _validate
from jaxsample.chain import Sampler

#: The strategies :meth:`DecodingOptions.strategy` can pick.
STRATEGIES = ("generate", "beam_search", "contrastive_search", "sample_and_rank", "speculative_generate")


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    """Every option of every decoding strategy (HF / vLLM names where they exist).

    Stopping and output (all strategies):
      max_new_tokens: int or ``int[B]`` per-row limit (traced: new values never recompile).
      max_tokens: static output width ``N >= max(max_new_tokens)``; defaults to that maximum.
      eos_ids: an id, a list, ``int[E]`` or ``int[B, E]`` (``-1`` = unused slot).
      stop_sequences: list of token-id lists, or ``int[S, L]`` / ``int[B, S, L]`` right-aligned.
      min_new_tokens: int or ``int[B]``: EOS masked and no stop rule before this many tokens.
      pad_id: token written after a row has finished (default 0; a new value never recompiles). Given
        explicitly (HF ``pad_token_id``), a prompt whose rows start with it without an
        ``attention_mask`` is ambiguous (left padding or tokens?) and raises ``ValueError``.
      logprobs, top_logprobs: return chosen-token log-probs (and the static top-``n``).
      logprob_token_ids: ids (``int[M]`` or ``int[B, M]``, ``-1`` = unused; static ``M``, traced
        values) whose raw log-probs are recorded at every step in ``logprobs.requested``
        (vLLM ``logprob_token_ids``; turns ``logprobs`` on).
      repetition_detection: vLLM's ``RepetitionDetectionParams`` (a mapping of ``max_pattern_size``,
        ``min_pattern_size``, ``min_count``, per row or not): a row whose output ends in
        ``min_count`` copies of a pattern stops (``FinishReason.REPETITION``); greedy / sampling only.
    Sampling:
      sampler, sampler_params: a :class:`jaxsample.Sampler` chain and its per-row values.
      do_sample: HF meaning: ``True`` samples (a plain categorical chain when ``sampler`` is None),
        ``False`` is greedy (the chain's stages still process the logits), ``None``: the chain's own
        selector (greedy by default).
      history_size: static sampler history window.
    Beams (``num_beams > 1``):
      num_beams, num_beam_groups, diversity_penalty, length_penalty (``None``: 1.0 for beams, 0.0
      for ranking), early_stopping, num_return_sequences, length_normalization (``"hf"`` | ``"gnmt"`` | ``"vllm"``).
    Contrastive search (both given): top_k (static candidate count), penalty_alpha (traced, ``[0, 1]``).
    Sample-and-rank (``best_of > n`` or ``n > 1``): n, best_of, rank_by (``"raw"`` | ``"processed"``).
    Speculative decoding: num_draft_tokens (static, with a draft model given to ``generate``).
    Jump-forward (greedy / sampled generation with a grammar stage): jump_forward (static ``k >= 1``:
      most grammar-forced tokens fed to the model per call; outputs identical to plain decoding),
      jump_forward_min (traced: a batch whose longest forced chain is shorter takes a one-token step);
      see :mod:`jaxsample.decoding.jump_forward`.
    """

    max_new_tokens: Any = None
    max_tokens: int | None = None
    eos_ids: Any = None
    stop_sequences: Any = None
    min_new_tokens: Any = 0
    pad_id: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    sampler: Sampler | None = None
    sampler_params: Mapping[str, Any] | None = None
    do_sample: bool | None = None
    history_size: int | None = None
    num_beams: int = 1
    num_beam_groups: int = 1
    diversity_penalty: Any = 0.0
    length_penalty: Any = None
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    length_normalization: str = "hf"
    top_k: int | None = None
    penalty_alpha: Any = None
    n: int = 1
    best_of: int | None = None
    rank_by: str = "raw"
    num_draft_tokens: int | None = None
    repetition_detection: Any = None
    logprob_token_ids: Any = None
    jump_forward: int | None = None
    jump_forward_min: Any = 1

    def __post_init__(self):
        if self.max_new_tokens is None:
            raise ValueError("max_new_tokens is required")
        if self.pad_id is not None:
            _validate.static_int(self.pad_id, "pad_id")
        _validate.static_int(self.top_logprobs, "top_logprobs", lo=0)
        if self.max_tokens is not None:
            _validate.static_int(self.max_tokens, "max_tokens", lo=0)
        if self.history_size is not None:
            _validate.static_int(self.history_size, "history_size", lo=0)
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise ValueError(
                f"sampler must be a jaxsample.Sampler (built with jaxsample.chain), got {type(self.sampler)}"
            )
        if self.do_sample not in (None, True, False):
            raise ValueError(f"do_sample must be True, False or None, got {self.do_sample!r}")
        k = _validate.static_int(self.num_beams, "num_beams", lo=1)
        g = _validate.static_int(self.num_beam_groups, "num_beam_groups", lo=1)
        if k % g:
            raise ValueError(f"num_beams ({k}) must be divisible by num_beam_groups ({g})")
        if self.do_sample and g > 1:
            raise ValueError("beam sampling (do_sample=True) does not combine with num_beam_groups > 1 (as in HF)")
        r = _validate.static_int(self.num_return_sequences, "num_return_sequences", lo=1)
        if r > k and k > 1:
            raise ValueError(f"num_return_sequences ({r}) must be <= num_beams ({k})")
        if not any(self.early_stopping is v for v in (True, False)) and self.early_stopping != "never":
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.length_normalization not in ("hf", "gnmt", "vllm"):
            raise ValueError(f"length_normalization must be 'hf', 'gnmt' or 'vllm', got {self.length_normalization!r}")
        _validate.check_range(self.diversity_penalty, "diversity_penalty", lo=0.0)
        if self.top_k is not None:
            _validate.static_int(self.top_k, "top_k", lo=1)
        if self.penalty_alpha is not None:
            try:
                _validate.check_range(self.penalty_alpha, "penalty_alpha", lo=0.0, hi=1.0)
            except ValueError:
                raise ValueError(f"penalty_alpha must be in [0, 1], got {self.penalty_alpha}") from None
        n = _validate.static_int(self.n, "n", lo=1)
        if self.best_of is not None and _validate.static_int(self.best_of, "best_of", lo=1) < n:
            raise ValueError(f"best_of ({self.best_of}) must be >= n ({n})")
        if self.rank_by not in ("raw", "processed"):
            raise ValueError(f"rank_by must be 'raw' or 'processed', got {self.rank_by!r}")
        if self.num_draft_tokens is not None:
            _validate.static_int(self.num_draft_tokens, "num_draft_tokens", lo=1)
        if self.jump_forward is not None:
            _validate.static_int(self.jump_forward, "jump_forward", lo=1)
        _validate.check_range(self.jump_forward_min, "jump_forward_min", lo=1, integer=True)
        if k > 1 and (n > 1 or self.best_of is not None):
            raise ValueError("n / best_of (sample-and-rank) do not combine with num_beams > 1: use num_return_sequences")
        if k > 1 and self.penalty_alpha is not None:
            raise ValueError("penalty_alpha (contrastive search) does not combine with num_beams > 1")

    def replace(self, **changes) -> "DecodingOptions":
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def strategy(self, draft: bool = False) -> str:
        """The strategy HF / vLLM would run for these options (one of :data:`STRATEGIES`).

        ``num_beams > 1``: beam search (beam sampling with ``do_sample``, diverse beam search with
        groups); ``penalty_alpha`` and ``top_k`` (its static candidate count): contrastive search;
        ``n > 1``, ``best_of > n`` or (HF) ``do_sample`` with ``num_return_sequences > 1``: sample-and-rank; a draft model: speculative decoding; otherwise
        ``generate`` (``num_beams=1`` is greedy unless ``do_sample`` or the sampler says otherwise).
        """
        if draft:
            if self.num_beams > 1 or self.penalty_alpha is not None or self.n > 1 or self.best_of is not None:
                raise ValueError("a draft model (speculative decoding) combines only with greedy or sampled generation")
            return "speculative_generate"
        if self.num_beams > 1:
            return "beam_search"
        if self.penalty_alpha is not None or self.top_k is not None:
            if self.penalty_alpha is None or self.top_k is None:
                raise ValueError(
                    "contrastive search needs both penalty_alpha and top_k (its candidate count); a sampling "
                    "top_k belongs in the sampler chain (stages.top_k)"
                )
            return "contrastive_search"
        if self.num_return_sequences > 1:  # HF: independent samples, only with do_sample
            if not self.do_sample:
                raise ValueError("num_return_sequences > 1 with num_beams=1 needs do_sample=True (as in HF), or use n")
            return "sample_and_rank"
        if self.n > 1 or (self.best_of is not None and self.best_of > self.n):
            return "sample_and_rank"
        return "generate"

    def num_samples(self) -> tuple[int, int]:
        """``(n, best_of)`` of sample-and-rank (HF ``num_return_sequences`` counts as ``n``)."""
        n = max(self.n, self.num_return_sequences if self.num_beams == 1 else 1)
        return n, max(n, self.best_of or n)

    def beam_length_penalty(self) -> Any:
        return 1.0 if self.length_penalty is None else self.length_penalty

    def rank_length_penalty(self) -> Any:
        return 0.0 if self.length_penalty is None else self.length_penalty
