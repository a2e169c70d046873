"""Moved: temperature lives in :mod:`jaxsample.samplers.temperature` (this alias stays)."""

from jaxsample.samplers.temperature import dynamic_temperature, temperature

__all__ = ["dynamic_temperature", "temperature"]
