"""Per-token probability cut-offs: epsilon, eta, p-less, and XTC (exclude top choices).

Each filter compares every token's probability with a per-row threshold in one or two passes over
the vocabulary (no search, no sort), then keeps at least the ``max(1, min_keep)`` most probable
tokens (ties kept), except XTC, whose ``min_keep`` guards the number of tokens left.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsample import _math, _noise, _threshold, _validate
from jaxsample._types import Array, ArrayLike, KeyLike
from jaxsample.truncation import _keep_top, _min_count, _probability


def epsilon_cutoff(logits: ArrayLike, epsilon: ArrayLike, min_keep: ArrayLike = 1) -> Array:
    """Epsilon sampling (HF ``EpsilonLogitsWarper``): removes tokens with ``prob < epsilon``.

    Args:
      logits: ``[..., V]``.
      epsilon: scalar or ``[...]``; ``0`` is off. ``ValueError`` if concretely ``< 0``. (HF also
        rejects ``>= 1``; here such a value keeps only the ``max(1, min_keep)`` most probable.)
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.87, 0.099, 0.001, 0.03]))
    >>> (epsilon_cutoff(x, 0.1) > -jnp.inf).tolist()
    [True, False, False, False]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    eps = _probability(epsilon, batch, "epsilon (epsilon_cutoff)")[..., None]
    min_count = _min_count(min_keep, batch, "epsilon_cutoff")

    def apply():
        return _math.keep(x, (_math.softmax(x) >= eps) | _keep_top(x, min_count))

    return _math.restore(_math.if_any(eps > 0, apply, lambda: x), dtype)


def eta_cutoff(logits: ArrayLike, epsilon: ArrayLike, min_keep: ArrayLike = 1) -> Array:
    """Eta sampling (HF ``EtaLogitsWarper``): removes tokens with ``prob < min(eps, sqrt(eps) * exp(-H))``.

    ``H`` is the entropy of the row's softmax.

    Args:
      logits: ``[..., V]``.
      epsilon: scalar or ``[...]``; ``0`` is off. ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.01, 0.04, 0.9, 0.05]))
    >>> (eta_cutoff(x, 0.0625) > -jnp.inf).tolist()
    [False, False, True, False]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    eps = _probability(epsilon, batch, "epsilon (eta_cutoff)")[..., None]
    min_count = _min_count(min_keep, batch, "eta_cutoff")

    def apply():
        logp = _math.log_softmax(x)
        probs, entropy = _math.entropy(logp)
        eta = jnp.minimum(eps, jnp.sqrt(eps) * jnp.exp(-entropy))
        return _math.keep(x, (probs >= eta) | _keep_top(x, min_count))

    return _math.restore(_math.if_any(eps > 0, apply, lambda: x), dtype)


def p_less(logits: ArrayLike, min_keep: ArrayLike = 1) -> Array:
    """p-less sampling (llama.cpp fork sampler ``p_less``): keeps tokens with ``p_i >= sum_j p_j**2``.

    The threshold is the probability that two independent draws agree; the most probable token always
    passes, and a uniform row keeps every token (comparison within
    :data:`jaxsample._threshold.MASS_RTOL`, since ``p == sum p**2`` exactly there).

    Args:
      logits: ``[..., V]``.
      min_keep: keep at least this many most probable tokens.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.15, 0.2, 0.25, 0.3]))
    >>> (p_less(x) > -jnp.inf).tolist()
    [False, False, False, True, True]
    """
    x, dtype = _math.prepare(logits)
    probs = _math.softmax(x)
    collision = jnp.sum(jnp.square(probs), axis=-1, keepdims=True)
    keep = _threshold.mass_reached(probs, collision) | _keep_top(x, _min_count(min_keep, x.shape[:-1], "p_less"))
    return _math.restore(_math.keep(x, keep), dtype)


def xtc(
    key: KeyLike, logits: ArrayLike, probability: ArrayLike, threshold: ArrayLike, min_keep: ArrayLike = 1
) -> Array:
    """Exclude Top Choices (llama.cpp ``xtc``).

    With the given probability (one uniform draw per row), removes every token with
    ``prob >= threshold`` except the least probable of them (and tokens tied with it). The row is
    left unchanged when ``probability <= 0``, ``threshold > 0.5``, it has fewer than 2 finite logits,
    fewer than 2 tokens reach the threshold, or fewer than ``min_keep`` tokens would remain.

    Args:
      key: one key, or one key per row (typed ``[...]`` or raw ``uint32[..., 2]``).
      logits: ``[..., V]``.
      probability: chance of applying the filter, scalar or ``[...]``; ``<= 0`` is off.
        ``ValueError`` if concretely ``< 0``.
      threshold: probability threshold, scalar or ``[...]``; ``> 0.5`` is off.
      min_keep: minimum number of tokens that must remain for the filter to apply.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    >>> (xtc(jax.random.key(0), x, 1.0, 0.19) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    x, dtype = _math.prepare(logits)
    batch = x.shape[:-1]
    chance = _probability(probability, batch, "probability (xtc)")
    thr = _validate.param(threshold, batch, "threshold (xtc)")[..., None]
    keep_at_least = _validate.param(min_keep, batch, "min_keep (xtc)", dtype=jnp.int32, lo=0)
    u = _noise.uniform(_noise.row_keys(key, batch))
    drawn = (chance > 0) & (u <= chance) & (thr[..., 0] <= 0.5)

    def apply():
        finite = x > -jnp.inf
        above = finite & (_math.softmax(x) >= thr)
        least = jnp.min(jnp.where(above, x, jnp.inf), axis=-1, keepdims=True)
        removed = above & (x > least)
        n_finite = jnp.sum(finite, axis=-1, dtype=jnp.float32)
        n_left = n_finite - jnp.sum(removed, axis=-1, dtype=jnp.float32)
        active = drawn & (n_finite >= 2) & (n_left >= keep_at_least)
        return _math.keep(x, ~(active[..., None] & removed))

    return _math.restore(_math.if_any(drawn, apply, lambda: x), dtype)
