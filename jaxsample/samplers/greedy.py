"""Greedy selection: the first maximal logit of each row.

Sharding/TPU: rows are independent; shard the batch axis. A chunked ``max`` then an ``argmax`` over
``~sqrt(V)`` entries (:func:`jaxsample._math.argmax`); no batch-level branch.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _fastpath, _math
from jaxsample._candidates import Candidates
from jaxsample._types import Float, Int
from jaxsample.chain import Selector


def greedy(logits: Float["*B V"]) -> Int["*B"]:
    """Index of the first maximal logit (ties go to the lowest id), ``int32[...]``.

    NaN counts as ``-inf``; a row with no finite logit returns 0.

    >>> import jax.numpy as jnp
    >>> int(greedy(jnp.array([0.1, 2.0, 2.0])))
    1
    """
    x, _ = _math.prepare(logits)
    return _math.argmax(x)


@dataclasses.dataclass(frozen=True)
class Greedy(Selector, _fastpath.CandidateSelector):
    """Selector taking the first maximal logit."""

    name: str = dataclasses.field(default="greedy", init=False)

    def select(self, x, state, params, info):
        return _math.argmax(x), state

    def select_candidates(self, c: Candidates, state, params, info):
        """The first candidate (canonical order), or 0 for a row with no finite logit."""
        return jnp.where(c.vals[..., 0] > -jnp.inf, c.ids[..., 0], 0).astype(jnp.int32), state
