"""Temperature scaling: plain (all three anchors) and entropy-based dynamic temperature (llama.cpp)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Array, ArrayLike


def _scale(x: Array, t: Array) -> Array:
    """``x / t`` per row; rows with ``t <= 0`` keep only their first maximal logit."""
    # inf / inf (an infinite temperature) is NaN; a row that overflows to -inf everywhere (a tiny
    # temperature) keeps its first maximum, the t -> 0 limit.
    scaled = _math.nonempty(_math.clean(x / jnp.where(t > 0, t, 1.0)), x)

    def with_greedy_rows():
        return jnp.where(t > 0, scaled, _math.keep(x, _math.first_max_mask(x)))

    return _math.if_any(t <= 0, with_greedy_rows, lambda: scaled)


def temperature(logits: ArrayLike, temp: ArrayLike) -> Array:
    """Divides logits by the temperature; ``temp <= 0`` keeps only the first maximal logit.

    Matches llama.cpp ``temp``; for ``temp > 0`` also HF ``TemperatureLogitsWarper`` and vLLM.

    Args:
      logits: ``[..., V]`` float32 or bfloat16.
      temp: temperature, scalar or ``[...]`` per row. ``<= 0`` selects greedy masking.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> temperature(jnp.array([1.0, 3.0, 3.0]), 0.5).tolist()
    [2.0, 6.0, 6.0]
    >>> temperature(jnp.array([1.0, 3.0, 3.0]), 0.0).tolist()
    [-inf, 3.0, -inf]
    """
    x, dtype = _math.prepare(logits)
    t = _validate.param(temp, x.shape[:-1], "temp")[..., None]
    return _math.restore(_scale(x, t), dtype)


def dynamic_temperature(
    logits: ArrayLike, temp: ArrayLike, delta: ArrayLike, exponent: ArrayLike = 1.0
) -> Array:
    """Entropy-scaled temperature (llama.cpp ``temp_ext``, a.k.a. dynatemp).

    With ``N`` the number of finite logits and ``h = H(softmax(logits)) / ln N`` the normalised
    entropy, the row is divided by ``min_temp + (max_temp - min_temp) * h ** exponent`` with
    ``min_temp = max(0, temp - delta)`` and ``max_temp = temp + delta``. A resulting temperature ``<= 0`` keeps only the first
    maximal logit. Rows with ``delta <= 0`` get plain :func:`temperature`; rows with at most one
    finite logit are returned unchanged (llama.cpp returns before scaling).

    Args:
      logits: ``[..., V]``.
      temp: base temperature, scalar or ``[...]``.
      delta: half-width of the temperature range (``dynatemp_range``), scalar or ``[...]``.
      exponent: exponent applied to the normalised entropy (``>= 0``), scalar or ``[...]``.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.25, 0.25, 0.25, 0.25]))   # maximal entropy: h = 1
    >>> bool(jnp.allclose(dynamic_temperature(x, 1.0, 0.5), x / 1.5))
    True
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    t = _validate.param(temp, batch, "temp")[..., None]
    d = _validate.param(delta, batch, "delta")[..., None]
    e = jnp.maximum(_validate.param(exponent, batch, "exponent", lo=0.0)[..., None], 0.0)


    def dynamic():
        n = jnp.sum(x > -jnp.inf, axis=-1, keepdims=True, dtype=jnp.float32)
        logp = _math.log_softmax(x)
        _, entropy = _math.entropy(logp)
        h = entropy / jnp.log(jnp.maximum(n, 2.0))
        lo_t = jnp.maximum(0.0, t - d)
        dyn_t = lo_t + (t + d - lo_t) * jnp.power(h, e)
        scaled = _scale(x, jnp.where(d > 0, dyn_t, t))
        return _math.nonempty(jnp.where((d > 0) & (n <= 1), x, scaled), x)

    return _math.restore(_math.if_any(d > 0, dynamic, lambda: _scale(x, t)), dtype)
