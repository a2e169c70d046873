"""Moved: the selectors live in :mod:`jaxsample.samplers.greedy` and :mod:`jaxsample.samplers.categorical`
(this alias stays)."""

from jaxsample.samplers.categorical import categorical, certain, gumbel_max
from jaxsample.samplers.greedy import greedy

__all__ = ["categorical", "certain", "greedy", "gumbel_max"]
