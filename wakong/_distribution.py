"""Span-length distributions: Poisson(4.2) truncated at ``m`` and renormalised, for ``m = 1..10``.

The reference package ships these ten CDFs as float32 numbers generated at build time with JAX and
numpyro. We derive them the same way, lazily on first use: the pmf ``exp(Poisson(4.2).log_prob(k))``
in float32, each truncated pmf divided by its sequentially accumulated float32 sum, and the CDF
accumulated with ``lax.associative_scan`` (the tree order JAX's ``cumsum`` used on CPU in 2022).
That order matters: a sequential cumsum differs from the published tables in the last bit of 9
of the 65 entries, and ``random.choices`` compares against these exact floats, so bit-exact parity
with ``wakong==1.1.1`` depends on it (``tests/test_wakong_reference.py`` pins every bit).
The computation is pinned to the CPU backend so a TPU host derives the same bits.
"""

from __future__ import annotations

import functools

import numpy as np

#: Budget proposed per word; the resulting mask rate is about 0.1516 (see docs/wakong.md).
PROPOSED_MASK_RATE = 0.188
#: Rate of the Poisson span-length distribution before truncation (mode 4, truncated mean 4.17).
POISSON_RATE = 4.2
#: Longest span.
MAX_SPAN_LEN = 10


@functools.cache
def span_length_cdfs() -> tuple[tuple[float, ...], ...]:
    """``cdfs[m - 1]``: CDF over ``0..m`` of ``Poisson(4.2) | X <= m``, float32 values as Python floats."""
    import jax
    import jax.numpy as jnp
    import numpyro.distributions as dist
    from jax import lax

    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        pmf = np.asarray(jnp.exp(dist.Poisson(rate=POISSON_RATE).log_prob(jnp.arange(MAX_SPAN_LEN + 1))), np.float32)
        cdfs = []
        for m in range(1, MAX_SPAN_LEN + 1):
            weights = pmf[: m + 1]
            total = np.float32(0.0)
            for w in weights:
                total = np.float32(total + w)
            cdf = lax.associative_scan(jnp.add, jnp.asarray(weights / total, jnp.float32))
            cdfs.append(tuple(float(c) for c in np.asarray(cdf)))
    return tuple(cdfs)


@functools.cache
def span_length_pmfs() -> np.ndarray:
    """``float64[10, 11]``: row ``m - 1`` is the pmf of ``Poisson(4.2) | X <= m`` (zeros past ``m``).

    Taken as differences of :func:`span_length_cdfs`, i.e. exactly the distribution the reference
    algorithm samples (including float32 rounding), for the JAX form and for exact statistics.
    """
    out = np.zeros((MAX_SPAN_LEN, MAX_SPAN_LEN + 1))
    for m, cdf in enumerate(span_length_cdfs(), start=1):
        c = np.asarray(cdf, np.float64)
        c = c / c[-1]  # random.choices scales draws by the last entry
        out[m - 1, : m + 1] = np.diff(c, prepend=0.0)
    return out
