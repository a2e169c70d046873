"""Moved: mirostat lives in :mod:`jaxsample.samplers.mirostat`, adaptive-p in
:mod:`jaxsample.samplers.adaptive_p` (this alias stays)."""

from jaxsample.samplers.adaptive_p import AdaptivePState, adaptive_p, adaptive_p_init
from jaxsample.samplers.mirostat import mirostat, mirostat_v2

__all__ = ["AdaptivePState", "adaptive_p", "adaptive_p_init", "mirostat", "mirostat_v2"]
