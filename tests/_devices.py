"""Environments for test subprocesses."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def eight_devices() -> dict[str, str]:
    """This process's environment with 8 simulated CPU devices (its other XLA flags kept) and the checkout
    on ``PYTHONPATH``."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
