"""HuggingFace's numerical processors: ``InfNanRemoveLogitsProcessor`` and ``LogitNormalization``.

Sharding/TPU: rows are independent; shard the batch axis. Elementwise passes and one
``logsumexp`` per row; ``+inf`` rows in :func:`log_softmax` are a batch-level ``lax.cond``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _math, _validate
from jaxsample._types import Float
from jaxsample.chain import Stage


def remove_inf_nan(logits: Float["*B V"]) -> Float["*B V"]:
    """HF ``InfNanRemoveLogitsProcessor``: NaN -> 0, ``+inf`` -> ``finfo.max``, ``-inf`` -> ``finfo.min``.

    ``finfo`` is that of the input dtype (``bfloat16`` in gives ``bfloat16`` limits). Unlike every
    other processor this one turns removed tokens into (very unlikely) finite ones: that is its job.

    Args:
      logits: ``[..., V]`` float32 or bfloat16.

    Returns:
      ``[..., V]`` finite logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> remove_inf_nan(jnp.array([jnp.nan, 1.0, jnp.inf, -jnp.inf])).tolist()
    [0.0, 1.0, 3.4028234663852886e+38, -3.4028234663852886e+38]
    """
    _validate.check_logits(logits)
    logits = jnp.asarray(logits)
    info = jnp.finfo(logits.dtype)
    x = logits.astype(jnp.float32)
    x = jnp.where(jnp.isnan(x), 0.0, x)
    x = jnp.where(x == jnp.inf, float(info.max), x)
    x = jnp.where(x == -jnp.inf, float(info.min), x)
    return x.astype(logits.dtype)


def log_softmax(logits: Float["*B V"]) -> Float["*B V"]:
    """HF ``LogitNormalization`` (``renormalize_logits=True``): ``log_softmax`` over the vocabulary.

    Removed tokens stay ``-inf``; an all ``-inf`` row stays all ``-inf`` (no NaN); ``n`` tokens at
    ``+inf`` each get ``-log n``.

    Args:
      logits: ``[..., V]`` float32 or bfloat16 (NaN counts as ``-inf``).

    Returns:
      ``[..., V]`` log-probabilities in the input dtype.

    >>> import jax.numpy as jnp
    >>> [round(v, 4) for v in log_softmax(jnp.log(jnp.array([1.0, 3.0]))).tolist()]
    [-1.3863, -0.2877]
    """
    x, dtype = _math.prepare(logits)
    return _math.restore(_math.log_softmax(x), dtype)


@dataclasses.dataclass(frozen=True)
class RemoveInfNan(Stage):
    """HF ``InfNanRemoveLogitsProcessor`` (:func:`remove_inf_nan`; the chain's logits are float32)."""

    _: dataclasses.KW_ONLY
    name: str = "remove_inf_nan"

    def update(self, x, state, params, info):
        return remove_inf_nan(x), state


@dataclasses.dataclass(frozen=True)
class LogSoftmax(Stage):
    """HF ``LogitNormalization`` (:func:`log_softmax`)."""

    _: dataclasses.KW_ONLY
    name: str = "log_softmax"

    def update(self, x, state, params, info):
        return _math.log_softmax(x), state
