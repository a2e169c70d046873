"""Moved: epsilon, eta, p-less and XTC live one per module in :mod:`jaxsample.samplers` (this alias stays)."""

from jaxsample.samplers.epsilon_cutoff import epsilon_cutoff
from jaxsample.samplers.eta_cutoff import eta_cutoff
from jaxsample.samplers.p_less import p_less
from jaxsample.samplers.xtc import xtc

__all__ = ["epsilon_cutoff", "eta_cutoff", "p_less", "xtc"]
