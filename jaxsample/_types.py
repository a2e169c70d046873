"""Type aliases and constants shared by every module.

Shapes in docstrings use ``B...`` for any batch shape (``logits.shape[:-1]``) and ``V`` for the vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
#: A PRNG key: a typed key (``jax.random.key``), a raw ``uint32[2]`` key, or an array of either, one per row.
KeyLike = jax.Array

#: Value written into removed tokens. Filters never resize: they set logits to ``-inf``.
NEG_INF = float("-inf")

#: Dtype of all internal math, whatever the input dtype.
COMPUTE_DTYPE = jnp.float32
