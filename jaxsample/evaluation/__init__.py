"""Evaluation of decoding strategies and samplers on BART infilling data, data-parallel over devices.

* :mod:`~jaxsample.evaluation.configs`: the ``sampler`` / ``decoding`` / ``eval`` config kinds;
* :mod:`~jaxsample.evaluation.metrics`: exact match, span-level infill accuracy, token accuracy,
  distinct-n, self-BLEU, length statistics, perplexity;
* :mod:`~jaxsample.evaluation.sharding`: the row plan and the mesh / pmap executors;
* :mod:`~jaxsample.evaluation.data`: datasets (built, or built from the ``pydoc`` corpus);
* :mod:`~jaxsample.evaluation.runner`: :func:`evaluate`.
"""

from jaxsample.evaluation.configs import (
    DatasetConfig,
    DecodingConfig,
    EvalConfig,
    SamplerConfig,
    load_decoding,
    load_decodings,
    load_eval,
    load_sampler,
)
from jaxsample.evaluation.runner import evaluate, format_table
from jaxsample.evaluation.sharding import DataParallel, RowPlan, make_plan, row_keys

__all__ = [
    "DataParallel",
    "DatasetConfig",
    "DecodingConfig",
    "EvalConfig",
    "RowPlan",
    "SamplerConfig",
    "evaluate",
    "format_table",
    "load_decoding",
    "load_decodings",
    "load_eval",
    "load_sampler",
    "make_plan",
    "row_keys",
]
