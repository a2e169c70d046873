"""Moved: the truncation filters live one per module in :mod:`jaxsample.samplers` (this alias stays)."""

from jaxsample.samplers.min_p import min_p
from jaxsample.samplers.top_h import top_h
from jaxsample.samplers.top_k import top_k
from jaxsample.samplers.top_n_sigma import top_n_sigma
from jaxsample.samplers.top_p import top_p
from jaxsample.samplers.typical import typical

__all__ = ["min_p", "top_h", "top_k", "top_n_sigma", "top_p", "typical"]
