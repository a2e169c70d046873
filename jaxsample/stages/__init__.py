"""Stage factories: every functional sampler as a chain stage, named like the function.

A factory fixes static configuration (window sizes, token-id tables, candidate counts) and the
*default* of each per-row parameter; values are passed per call through ``params`` (see
:class:`jaxsample.chain.Sampler`). Factories are memoised: equal static configurations return the
same stage, so samplers built twice compare equal and share compilations.
"""

from jaxsample.stages._basic import categorical, dynamic_temperature, greedy, temperature
from jaxsample.stages._history import (
    bad_words,
    dry,
    encoder_no_repeat_ngram,
    encoder_repetition_penalty,
    no_repeat_ngram,
    penalties,
    sequence_bias,
)
from jaxsample.stages._reasoning import reasoning_budget
from jaxsample.stages._structured import grammar, lazy_grammar
from jaxsample.stages._tokens import (
    allowed_tokens,
    exponential_decay_length_penalty,
    forced_bos,
    forced_eos,
    ignore_eos,
    infill,
    log_softmax,
    logit_bias,
    min_tokens,
    remove_inf_nan,
    suppress_tokens,
    suppress_tokens_at_begin,
)
from jaxsample.stages._watermark import synthid_watermark, watermark
from jaxsample.stages._truncation import (
    MIN_KEEP,
    adaptive_p,
    epsilon_cutoff,
    eta_cutoff,
    min_p,
    mirostat,
    mirostat_v2,
    p_less,
    top_h,
    top_k,
    top_n_sigma,
    top_p,
    typical,
    xtc,
)

__all__ = [
    "MIN_KEEP",
    "adaptive_p",
    "allowed_tokens",
    "bad_words",
    "categorical",
    "dry",
    "dynamic_temperature",
    "encoder_no_repeat_ngram",
    "encoder_repetition_penalty",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "forced_bos",
    "forced_eos",
    "grammar",
    "lazy_grammar",
    "greedy",
    "ignore_eos",
    "infill",
    "log_softmax",
    "logit_bias",
    "min_p",
    "min_tokens",
    "mirostat",
    "mirostat_v2",
    "no_repeat_ngram",
    "p_less",
    "penalties",
    "reasoning_budget",
    "remove_inf_nan",
    "sequence_bias",
    "suppress_tokens",
    "suppress_tokens_at_begin",
    "synthid_watermark",
    "temperature",
    "top_h",
    "top_k",
    "top_n_sigma",
    "top_p",
    "typical",
    "watermark",
    "xtc",
]
