"""Sort-based reference implementations of every truncation filter and adaptive selector.

Straight transcriptions of each anchor's algorithm (llama.cpp ``src/llama-sampling.cpp``, HF
``logits_process.py``) over a full descending sort, used (a) as oracles in the differential tests of
the sort-free implementations and (b) as the baseline of ``benchmarks/samplers.py``.

Conventions shared with the library, so that results can be compared exactly:

* probabilities come from :mod:`jaxsample._math` (NaN-free for empty rows, ``+inf`` = certain);
* sorts are stable (ties in id order). Where an anchor's tie order is unspecified (``std::sort``,
  ``torch.sort``) the reference cuts the sorted prefix and then keeps every token tied with the
  last kept one, the documented tie policy of jaxsample;
* mass comparisons use :func:`jaxsample._threshold.mass_reached` (4-ulp tolerance);
* counts of candidates (``N`` in llama.cpp) are counts of finite logits.

All functions take float32 logits ``[B, V]`` and per-row parameters ``[B]`` and return masked
float32 logits (or ``(token, state)`` for the selectors, given the Gumbel noise ``[B, V]``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jaxsample import _math
from jaxsample._threshold import MASS_RTOL, mass_reached

NEG = -jnp.inf


def _col(v):
    return jnp.asarray(v)[..., None]


def _sorted_desc(x):
    """``(values, order)``: descending, ties in id order."""
    order = jnp.argsort(-x, axis=-1, stable=True)
    return jnp.take_along_axis(x, order, axis=-1), order


def _keep_ties_of_prefix(x, sorted_vals, n_keep):
    """Keeps the first ``n_keep`` sorted tokens and every token tied with the last of them."""
    last = jnp.take_along_axis(sorted_vals, (jnp.maximum(n_keep, 1) - 1)[..., None], axis=-1)
    return x >= last


def _first_true(mask):
    """Index of the first True along the last axis, or the axis length if none."""
    n = mask.shape[-1]
    return jnp.where(jnp.any(mask, axis=-1), jnp.argmax(mask, axis=-1), n)


def _n_finite(x):
    return jnp.sum(x > NEG, axis=-1)


# ------------------------------------------------------------------------------------------ filters
def top_k(x, k):
    """HF ``TopKLogitsWarper`` / vLLM: keep ``x >= sorted[k-1]``; ``k <= 0`` or ``>= V`` off."""
    v = x.shape[-1]
    s, _ = _sorted_desc(x)
    kth = jnp.take_along_axis(s, jnp.clip(k - 1, 0, v - 1)[..., None], axis=-1)
    off = _col((k <= 0) | (k >= v))
    return jnp.where(off | (x >= kth), x, NEG)


def top_k_exact(x, k):
    """llama.cpp ``top_k_impl``: exactly ``min(k, N)`` tokens, ties by lowest id (stable sort)."""
    v = x.shape[-1]
    _, order = _sorted_desc(x)
    rank = jnp.argsort(order, axis=-1)
    off = _col((k <= 0) | (k >= v))
    return jnp.where(off | (rank < _col(k)), x, NEG)


def top_p(x, p, min_keep=1):
    """llama.cpp ``top_p``: smallest descending prefix with ``cum >= p`` and ``>= min_keep`` tokens."""
    s, _ = _sorted_desc(x)
    cum = jnp.cumsum(_math.softmax(s), axis=-1)
    i = jnp.arange(x.shape[-1])
    ok = mass_reached(cum, _col(p)) & (i + 1 >= _col(min_keep))
    n_keep = jnp.minimum(_first_true(ok) + 1, x.shape[-1])
    keep = _keep_ties_of_prefix(x, s, n_keep) | _col(p >= 1)
    return jnp.where(keep, x, NEG)


def top_p_hf(x, p, min_tokens_to_keep=1):
    """HF ``TopPLogitsWarper``: ascending sort, remove ``cum <= 1 - p`` except the last ``mtk``."""
    order = jnp.argsort(x, axis=-1, stable=True)
    s = jnp.take_along_axis(x, order, axis=-1)
    cum = jnp.cumsum(_math.softmax(s), axis=-1)
    remove = cum <= 1 - _col(p)
    remove &= jnp.arange(x.shape[-1]) < x.shape[-1] - _col(min_tokens_to_keep)
    removed = jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1)
    return jnp.where(removed, NEG, x)


def min_p(x, p, min_keep=1):
    """llama.cpp ``min_p``: ``logit >= max + log p``; if fewer than ``min_keep`` pass, the top ``min_keep``."""
    s, _ = _sorted_desc(x)
    min_logit = s[..., :1] + jnp.log(jnp.where(_col(p) > 0, _col(p), 1.0))
    above = x >= min_logit
    n_keep = jnp.maximum(jnp.sum(above, axis=-1), jnp.maximum(min_keep, 1))
    keep = above | _keep_ties_of_prefix(x, s, n_keep) | _col(p <= 0)
    return jnp.where(keep, x, NEG)


def typical(x, p, min_keep=1):
    """llama.cpp ``typical`` (strict ``cum > p``) with HF's ``nansum`` entropy."""
    logp = _math.log_softmax(x)
    probs = jnp.exp(logp)
    entropy = -jnp.nansum(jnp.where(probs > 0, probs * logp, jnp.nan), axis=-1, keepdims=True)
    keys = -jnp.abs(logp + entropy)
    order = jnp.argsort(-keys, axis=-1, stable=True)
    sk = jnp.take_along_axis(keys, order, axis=-1)
    cum = jnp.cumsum(jnp.take_along_axis(probs, order, axis=-1), axis=-1)
    i = jnp.arange(x.shape[-1])
    ok = mass_reached(cum, _col(p), strict=True) & (i >= _col(jnp.maximum(min_keep, 1)) - 1)
    n_keep = jnp.minimum(_first_true(ok) + 1, x.shape[-1])
    keep = _keep_ties_of_prefix(keys, sk, n_keep) | _col(p >= 1)
    return jnp.where(keep, x, NEG)


def top_n_sigma(x, n):
    """llama.cpp ``top_n_sigma``: ``logit >= max - n * std`` over finite logits; ``n <= 0`` off."""
    finite = jnp.isfinite(x)
    vals = jnp.where(finite, x, jnp.nan)
    std = jnp.nan_to_num(jnp.nanstd(vals, axis=-1, keepdims=True))
    thr = jnp.max(x, axis=-1, keepdims=True) - _col(n) * std
    return jnp.where(_col(n <= 0) | (x >= thr), x, NEG)


def _top_mtk(x, mtk):
    s, _ = _sorted_desc(x)
    return _keep_ties_of_prefix(x, s, jnp.maximum(mtk, 1))


def epsilon_cutoff(x, epsilon, min_keep=1):
    """HF ``EpsilonLogitsWarper``: remove ``p < eps`` unless among the top ``min_keep``."""
    keep = (_math.softmax(x) >= _col(epsilon)) | _top_mtk(x, min_keep)
    return jnp.where(keep, x, NEG)


def eta_cutoff(x, epsilon, min_keep=1):
    """HF ``EtaLogitsWarper``: remove ``p < min(eps, sqrt(eps) exp(-H))`` unless among the top ``min_keep``."""
    logp = _math.log_softmax(x)
    probs = jnp.exp(logp)
    entropy = -jnp.nansum(jnp.where(probs > 0, probs * logp, jnp.nan), axis=-1, keepdims=True)
    eps = _col(epsilon)
    eta = jnp.minimum(eps, jnp.sqrt(eps) * jnp.exp(-entropy))
    keep = (probs >= eta) | _top_mtk(x, min_keep)
    return jnp.where(keep, x, NEG)


def top_h(x, h, top_n=100):
    """HF ``TopHLogitsWarper``: cumulative entropy of the renormalised top-n within ``h * H``."""
    n = min(top_n, x.shape[-1])
    s, _ = _sorted_desc(x)
    top = s[..., :n]
    logq = _math.log_softmax(top)
    q = jnp.exp(logq)
    cum = jnp.cumsum(jnp.where(q > 0, -q * logq, 0.0), axis=-1)
    tau = _col(h) * cum[..., -1:]
    sel = (cum <= tau * (1 + MASS_RTOL)).at[..., 0].set(True)
    n_keep = jnp.sum(sel, axis=-1)
    keep = _keep_ties_of_prefix(x, s, n_keep) | _col(h <= 0)
    return jnp.where(keep, x, NEG)


def p_less(x, min_keep=1):
    """llama.cpp fork ``p_less``: keep ``p >= sum p^2``."""
    probs = _math.softmax(x)
    keep = mass_reached(probs, jnp.sum(probs**2, axis=-1, keepdims=True)) | _top_mtk(x, min_keep)
    return jnp.where(keep, x, NEG)


def xtc(u, x, probability, threshold, min_keep=1):
    """llama.cpp ``xtc`` given the row's uniform draw ``u``: drop the top choices above ``threshold``."""
    s, order = _sorted_desc(x)
    ps = _math.softmax(s)
    n = _n_finite(x)
    above = (ps >= _col(threshold)) & (s > NEG)
    pos_last = jnp.maximum(_first_true(~above) - 1, 0)  # last index of the leading run with p >= t
    least = jnp.take_along_axis(s, pos_last[..., None], axis=-1)
    removed = (x > least) & (jnp.sum(above, -1) > 0)[..., None]
    n_removed = jnp.sum(removed, axis=-1)
    active = (probability > 0) & (threshold <= 0.5) & (n >= 2) & (u <= probability)
    active &= (pos_last > 0) & (n - n_removed >= min_keep)
    return jnp.where(_col(active) & removed, NEG, x)


# -------------------------------------------------------------------------------------- selectors
def _draw(masked, gumbel):
    return jnp.argmax(jnp.where(masked > NEG, masked + gumbel, NEG), axis=-1).astype(jnp.int32)


def _surprise_bits(masked, token):
    logp = jnp.take_along_axis(_math.log_softmax(masked), token[..., None], axis=-1)[..., 0]
    return -logp / math.log(2.0)


def mirostat(gumbel, x, mu, tau, eta, m=100, n_vocab=None):
    """llama.cpp ``mirostat`` (v1), float formula as written upstream, sampling by Gumbel-max."""
    v = x.shape[-1]
    n_vocab = v if n_vocab is None else n_vocab
    s, _ = _sorted_desc(x)
    probs = _math.softmax(s)
    n = _n_finite(x)
    i = jnp.arange(v - 1)
    used = (i < m - 1) & (i < _col(n) - 1)
    t = jnp.log((i + 2.0) / (i + 1.0))
    b = jnp.where(used, jnp.log(probs[..., :-1] / jnp.where(used, probs[..., 1:], 1.0)), 0.0)
    s_hat = jnp.sum(jnp.where(used, t * b, 0.0), -1) / jnp.sum(jnp.where(used, t * t, 0.0), -1)
    e = s_hat - 1
    k = jnp.power((e * jnp.power(2.0, mu)) / (1 - jnp.power(float(n_vocab), -e)), 1 / s_hat)
    k = jnp.where(jnp.isnan(k), 1, jnp.clip(jnp.floor(k), 1, v)).astype(jnp.int32)
    masked = top_k_exact(x, jnp.where(k >= v, 0, k))
    token = _draw(masked, gumbel)
    return token, mu - eta * (_surprise_bits(masked, token) - tau)


def mirostat_v2(gumbel, x, mu, tau, eta):
    """llama.cpp ``mirostat_v2``: cut at the first sorted token with ``-log2 p > mu`` (keep >= 1)."""
    s, _ = _sorted_desc(x)
    bits = -_math.log_softmax(s) / math.log(2.0)
    n_keep = jnp.maximum(_first_true(bits > _col(mu)), 1)
    masked = jnp.where(_keep_ties_of_prefix(x, s, n_keep), x, NEG)
    token = _draw(masked, gumbel)
    return token, mu - eta * (_surprise_bits(masked, token) - tau)


def adaptive_p(gumbel, x, weighted_sum, total_weight, target, decay):
    """llama.cpp ``adaptive_p`` (PR #17927), EMA updated with the drawn token's original probability."""
    decay = jnp.clip(decay, 0.0, 0.99)
    probs = _math.softmax(x)
    goal = jnp.clip(target, 0.0, 1.0)
    adapted = jnp.where(total_weight == 0, goal, 2 * goal - weighted_sum / total_weight)
    adapted = jnp.clip(adapted, 0.0, 1.0)
    d = jnp.abs(probs - _col(adapted)) * jnp.float32(1 / 0.3)
    shaped = jnp.where(x > NEG, 5.0 - 10.0 * d * d / (1.0 + d), NEG)
    on = target >= 0
    token = _draw(jnp.where(_col(on), shaped, x), gumbel)
    p_tok = jnp.take_along_axis(probs, token[..., None], axis=-1)[..., 0]
    ws = jnp.where(on, p_tok + decay * weighted_sum, weighted_sum)
    tw = jnp.where(on, 1 + decay * total_weight, total_weight)
    return token, (ws, tw)
