"""Type aliases and constants shared by every module.

Shapes in annotations and docstrings use ``*B`` for any batch shape (``logits.shape[:-1]``), ``V``
for the vocabulary, ``K`` for a candidate count and ``T`` for a history length:
``logits: Float["*B V"]`` is a float array of shape ``[..., V]`` (documentation only, in the
spirit of jaxtyping; nothing is checked at run time).
"""

from __future__ import annotations

import typing

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


class _Shaped:
    """``Float["*B V"]``: an array annotation that carries its dtype kind and shape."""

    def __init__(self, kind: str):
        self.kind = kind

    def __getitem__(self, shape: str):
        return typing.Annotated[ArrayLike, f"{self.kind}[{shape}]"]


Float, Int, Bool, Key = _Shaped("float"), _Shaped("int"), _Shaped("bool"), _Shaped("key")
