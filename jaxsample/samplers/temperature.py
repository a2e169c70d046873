"""Temperature scaling: plain (all three anchors) and entropy-based dynamic temperature (llama.cpp ``temp_ext``).

Both stages have a candidate form for rows with plain temperature (dynamic temperature with
``delta <= 0``): dividing each candidate by ``t`` is what the dense core does to it.

Sharding/TPU: rows are independent; shard the batch axis. One elementwise pass (plus a softmax for
dynamic rows); greedy rows (``t <= 0``) and dynamic rows are batch-level ``lax.cond``s (an
all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from jaxsample import _candidates, _fastpath, _math, _validate
from jaxsample._candidates import Candidates
from jaxsample._types import Array, Float
from jaxsample.chain import Param, Stage


_INF_BITS = 0x7F800000  # float32 bit patterns of inf and of 2**63
_BITS_2_63 = 0x5F000000


def _scale(x: Array, t: Array, m: Array | None = None) -> Array:
    """``x [*B, V] / t [*B, 1]`` per row; rows with ``t <= 0`` keep only their first maximal logit.

    ``x`` may hold NaN (read as ``-inf``) unless its row maximum ``m [*B, 1]`` is given. A batch of
    ordinary rows (temperatures in ``[2**-64, 2**64]``, a finite logit below ``2**63`` in magnitude:
    with ``m``, the maximum itself) is one fused division; other batches take the guarded path,
    which gives the same values in ordinary rows.
    """

    def guarded():
        # inf / inf (an infinite temperature) is NaN; a row that overflows to -inf everywhere (a tiny
        # temperature) keeps its first maximum, the t -> 0 limit.
        # NaN is off (1): such rows are scaled by 1 in both branches, whatever the rest of the batch.
        y = _math.clean(x)
        scaled = _math.nonempty(_math.clean(y / jnp.where(t > 0, t, 1.0)), y)
        return _math.if_any(t <= 0, lambda: jnp.where(t <= 0, _math.keep(y, _math.first_max_mask(y)), scaled),
                            lambda: scaled)

    # The plain division is the guarded path's value wherever it yields no NaN (XLA may divide by
    # multiplying with 1 / t, so inf * 0 once 1 / t underflows) and leaves a finite logit. Both hold
    # with a wide margin for 2**-64 <= t <= 2**64 and a finite logit below 2**63 in magnitude.
    ordinary_t = (t >= 2.0**-64) & (t <= 2.0**64)

    def check():
        # min |x| over finite logits as int32 bit patterns (the same order for non-negative floats; inf
        # and NaN patterns are larger), over chunks of 32 first: XLA's own reduction then fuses the
        # map, where YNNPACK's float min (or XLA's tree of windows over a whole row, which the two
        # levels would be merged into without the barrier) reads it from a [B, V] buffer written first.
        magnitude = jnp.minimum(lax.bitcast_convert_type(x, jnp.int32) & 0x7FFFFFFF, _INF_BITS)
        chunk_min = lax.optimization_barrier(jnp.min(_math.chunks(magnitude, 32, _INF_BITS), axis=-1))
        smallest = jnp.min(chunk_min, axis=-1, keepdims=True)
        return _math.cond(jnp.all(ordinary_t & (smallest < _BITS_2_63)), lambda: _math.clean(x) / t, guarded)

    if m is None:
        return check()
    return _math.cond(jnp.all(ordinary_t & (jnp.abs(m) < 2.0**63)), lambda: x / t, check)


def _entropy(x: Array) -> tuple[Array, Array]:
    """``(m, H)``, each ``float32[*B, 1]``: the row maximum and :func:`_math.entropy` of
    :func:`_math.log_softmax` of NaN-free ``x [*B, V]``, without writing the log-probabilities
    (:func:`_math.log_probs` computes them inside the entropy's reduction: the same bits)."""
    m = _math.row_max(x)
    return m, _math.entropy(_math.log_probs(x, m)(x))[1]


def _finite_count(x: Array, m: Array) -> Array:
    """``float32[*B, 1]``: the number of finite logits of NaN-free ``x [*B, V]`` with row maximum ``m``;
    one ``min`` reduction when every row is free of ``-inf`` (then it is ``V``)."""
    v = x.shape[-1]
    full = jnp.min(x, axis=-1, keepdims=True) > -jnp.inf
    return _math.cond(jnp.all(full), lambda: jnp.full(m.shape, v, jnp.float32),
                      lambda: _math.row_count(x > -jnp.inf, keepdims=True).astype(jnp.float32))


def _dynamic_temperature(x: Array, temp: Array, delta: Array, exponent: Array) -> Array:
    """The core on NaN-free float32 ``x [*B, V]`` and ``[*B]`` parameters."""
    t, d, e = temp[..., None], delta[..., None], jnp.maximum(exponent, 0.0)[..., None]

    def dynamic():
        m, entropy = _entropy(x)
        n = _finite_count(x, m)
        h = entropy / jnp.log(jnp.maximum(n, 2.0))
        lo_t = jnp.maximum(0.0, t - d)
        dyn_t = lo_t + (t + d - lo_t) * jnp.power(h, e)
        # _scale never empties a row, and rows with n <= 1 are x itself: no nonempty guard needed.
        return jnp.where((d > 0) & (n <= 1), x, _scale(x, jnp.where(d > 0, dyn_t, t), m))

    return _math.if_any(d > 0, dynamic, lambda: _scale(x, t))


def temperature(logits: Float["*B V"], temp: Float["*B"] | float) -> Float["*B V"]:
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
    x, dtype = _math.prepare(logits, map_nan=False)  # _scale reads NaN as -inf in its own pass
    return _math.restore(_scale(x, _validate.param(temp, x.shape[:-1], "temp")[..., None]), dtype)


def dynamic_temperature(
    logits: Float["*B V"], temp: Float["*B"] | float, delta: Float["*B"] | float, exponent: Float["*B"] | float = 1.0
) -> Float["*B V"]:
    """Entropy-scaled temperature (llama.cpp ``temp_ext``, a.k.a. dynatemp).

    With ``N`` the number of finite logits and ``h = H(softmax(logits)) / ln N`` the normalised
    entropy, the row is divided by ``min_temp + (max_temp - min_temp) * h ** exponent`` with
    ``min_temp = max(0, temp - delta)`` and ``max_temp = temp + delta``. A resulting temperature
    ``<= 0`` keeps only the first maximal logit. Rows with ``delta <= 0`` get plain
    :func:`temperature`; rows with at most one finite logit are returned unchanged (llama.cpp
    returns before scaling).

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
    x, dtype = _math.prepare(logits, map_nan=False)
    batch = x.shape[:-1]
    t = _validate.param(temp, batch, "temp")
    d = _validate.param(delta, batch, "delta")
    e = _validate.param(exponent, batch, "exponent", lo=0.0)
    return _math.restore(_math.nan_free(x, lambda x: _dynamic_temperature(x, t, d, e)), dtype)


def _on_candidates(c: Candidates, t: Array) -> Candidates:
    """Temperature ``t [*B]`` on candidates; ``t <= 0`` keeps the first candidate (the first maximum)."""
    t = t[..., None]
    greedy = jnp.where(jnp.arange(c.vals.shape[-1]) == 0, c.vals, -jnp.inf)
    out = jnp.where(t <= 0, greedy, _math.clean(c.vals / jnp.where(t > 0, t, 1.0)))
    return _candidates.restore_order(Candidates(out, c.ids))


@dataclasses.dataclass(frozen=True)
class Temperature(Stage, _fastpath.CandidateForm):
    """:func:`temperature` reading ``temperature``."""

    default: float = dataclasses.field(default=1.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "temperature"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("temperature", self.default),)

    def update(self, x, state, params, info):
        return _scale(x, params["temperature"][..., None]), state

    def on_candidates(self, c, state, params, info):
        return _on_candidates(c, params["temperature"]), state


@dataclasses.dataclass(frozen=True)
class DynamicTemperature(Stage, _fastpath.CandidateForm):
    """llama.cpp ``temp_ext`` reading ``temperature``, ``dynatemp_range``, ``dynatemp_exponent``; on
    candidates for rows with ``dynatemp_range <= 0`` (plain temperature)."""

    default: float = dataclasses.field(default=1.0, compare=False)
    delta: float = dataclasses.field(default=0.0, compare=False)
    exponent: float = dataclasses.field(default=1.0, compare=False)
    _: dataclasses.KW_ONLY
    name: str = "temperature"

    @property
    def params(self) -> tuple[Param, ...]:
        return (
            Param("temperature", self.default),
            Param("dynatemp_range", self.delta),
            Param("dynatemp_exponent", self.exponent, lo=0.0),
        )

    def update(self, x, state, params, info):
        p = params
        return _dynamic_temperature(x, p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"]), state

    def candidate_rows(self, params):
        return ~(params["dynatemp_range"] > 0)

    def on_candidates(self, c, state, params, info):
        return _on_candidates(c, params["temperature"]), state
