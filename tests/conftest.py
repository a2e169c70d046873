"""Shared pytest configuration: hypothesis profiles and JAX settings for the whole suite."""

import os

collect_ignore = ["data"]  # scripts run against the reference package, not tests

import jax
from hypothesis import HealthCheck, settings

# Fast tier (CI default): few examples, no deadline (jit compiles dominate the first example).
settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

jax.config.update("jax_enable_x64", False)
