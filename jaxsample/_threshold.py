"""Sort-free exact cut-off search: the engine behind every truncation filter.

A truncation filter keeps a *prefix* of the vocabulary in its own order. Every filter here is
phrased as

* ``keys float32[..., V]``: the filter's order, higher first (the logits for top-k / top-p, the
  negated distance ``-|surprise - H|`` for locally typical sampling). Removed tokens have key
  ``-inf``; keys are NaN-free.
* ``weights float32[..., V] >= 0``: what a prefix accumulates (probabilities, or 1 per token when
  counting). Tokens with key ``-inf`` must have weight 0.

and :func:`cutoff` returns, per row, the key ``t`` such that ``keys >= t`` is the smallest prefix
(all tokens tied at ``t`` included) whose weight reaches the target and which holds at least
``min_count`` tokens. The filter then keeps ``keys >= t``. ``t`` is always one of the row's keys, or
``-inf`` ("keep everything") when no prefix reaches the target.

Two exact algorithms compute the same ``t``:

* **candidates** (fast path): the ``K`` largest keys (:func:`jaxsample._candidates.top`, about one pass over ``V``)
  and a cumulative sum over them. A row is covered when the target is reached inside its
  candidates (or the row has fewer than ``K`` finite keys); ``t`` is then the key where the
  cumulative weight first reaches the target, because a cumulative sum over a sorted prefix is
  exactly the weight of ``{keys >= key_j}`` up to ties, which only ever add weight.
* **bisection** (exact fallback): the largest ``T`` over order-preserving ``uint32`` images of the
  keys such that the prefix ``{key >= T}`` satisfies the criteria, built bit by bit from the most
  significant one (32 masked reductions over ``V``, as ``t5x/binary_search.py``). The result is the
  image of an actual key.

:func:`jaxsample._candidates.choose` combines them so that the fallback runs only when some row
needs it and every row's answer depends on that row alone.

Ties: tokens tied with the cut-off key are always kept (HF / vLLM top-k semantics), so a filter
can keep more tokens than its count; :func:`first_k` is the exception (llama.cpp exact top-k).

Float policy for mass comparisons: sums of float32 probabilities carry rounding error, and several
upstream test vectors sit exactly on the boundary (llama.cpp top_p 0.7 on ``{0.1, 0.2, 0.3, 0.4}``
keeps ``{0.4, 0.3}``; HF TopP 0.8 on ``[0.3, 0.1, 0.1, 0.5]`` keeps ``{0.5, 0.3}``). A mass within
``MASS_RTOL`` (4 float32 ulps, relative) of its target counts as *equal* to it: for ``>=`` that
means "reached", for the strict ``>`` of llama.cpp typical it means "not reached yet". Both paths
and the sort-based test references use the same rule.

Sharding/TPU: rows are independent; shard the batch axis. The bisections are ``fori_loop`` /
unrolled ``lax.cond`` steps whose predicates reduce over the batch (an all-reduce under GSPMD);
each step is one masked reduction over a whole vocabulary row.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsample import _candidates, _math
from jaxsample._types import Array

#: Relative tolerance under which a float32 mass equals its target (4 ulps of float32).
MASS_RTOL = 2.0**-21

_SIGN = np.uint32(0x80000000)  # numpy: importing jaxsample must not start a JAX backend

#: Most steps of :func:`_value_search`, each unrolled in the program (a batch of 64 flat rows at
#: ``V = 131072`` took 2-5 under top-p, 5-12 under typical, 15 under typical on logits of deviation 3
#: at ``p = 0.95``); rows that do not settle take the bit bisection.
_SEARCH_STEPS = 16

#: The first steps of a two-sided search that may use :class:`Heavy`'s model (rows it serves settle
#: in 1-3 on flat rows; the rest keep the plain secant). Each copy costs compile time (all 16: 13 s
#: against 6.5 s for typical at ``B = 64, V = 131072``).
_MODEL_STEPS = 4



def mass_reached(mass: Array, target: Array, strict: bool = False) -> Array:
    """``mass >= target`` (or ``mass > target`` if ``strict``), treating values within ``MASS_RTOL`` as equal."""
    if strict:
        return mass > target * (1.0 + MASS_RTOL)
    return mass >= target * (1.0 - MASS_RTOL)


def order_key(x: Array) -> Array:
    """Order-preserving ``float32 -> uint32`` map (``-0.0`` and ``0.0`` map to the same key)."""
    k = _math.order_bits(jnp.where(x == 0, jnp.float32(0.0), x))
    return lax.bitcast_convert_type(k, jnp.uint32) ^ _SIGN  # int32 order -> uint32 order


def from_order_key(u: Array) -> Array:
    """Inverse of :func:`order_key`."""
    return _math.from_order_bits(lax.bitcast_convert_type(u ^ _SIGN, jnp.int32))


def _take(values: Array, index: Array) -> Array:
    return jnp.take_along_axis(values, index[..., None], axis=-1)[..., 0]


def kth_candidate(vals: Array, k: Array) -> Array:
    """``float32[...]``: the ``k``-th (1-based) of candidate values ``vals [..., K]``; ``-inf`` if ``k > K``."""
    n = vals.shape[-1]
    return jnp.where(k <= n, _take(vals, jnp.minimum(k, n) - 1), -jnp.inf)


def _bisect(u: Array, predicate: Callable[[Array], Array]) -> Array:
    """Largest ``uint32`` ``T`` with ``predicate(T)`` (``predicate`` monotone decreasing, ``[...]`` in and out)."""

    def body(i, t):
        trial = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        return jnp.where(predicate(trial), trial, t)

    return lax.fori_loop(0, 32, body, jnp.zeros(u.shape[:-1], jnp.uint32))


class Search(NamedTuple):
    """What :func:`cutoff`'s value search reads: keys and weights recomputed from ``x`` in each pass.

    Attributes:
      x: ``float32[..., V]`` the array each pass reads.
      key: elementwise map ``x -> keys`` (also applied to entries gathered from ``x``).
      weight: elementwise map ``x -> weights``.
      floor: ``float32[...]`` finite ``c`` with ``weight >= exp(key - c)`` for every token.
      start: ``float32[...]`` a key whose prefix provably reaches the target (the tokens below it
        hold less than ``1 - target``), the search's first lower end.
      first: ``float32[...]`` or None: with ``two_sided``, a guess at the cut-off, the first key evaluated.
      uncovered: ``bool[...]`` or None: rows that the ``K`` largest keys provably do not cover and
        whose keys are all ``<= 0``. They search without the candidates (which are not computed
        at all when every row is such a row).
      two_sided: the prefix is a window around a centre at key 0 (typical): masses are interpolated
        in the probit of ``(1 + m) / 2`` rather than of ``m``, through key 0 (mass 0).
      window: tokens the search finishes on (one top-``k`` of this size): a wider window settles in
        fewer steps but its top-k costs more (typical at p = 0.9, 64 flat rows of V = 131072:
        windows of 256 / 512 / 1024 / 2048 tokens took 7-9 / 6-7 / 5-8 / 5 steps, measured before every
        step counted; top-p settles in 3-6 steps with 64). Typical's model of the mass above its
        window (``heavy``) settles most flat rows in 1-3 steps whatever the window: 128 there.
      heavy: with ``two_sided``, a thunk returning :class:`Heavy`: the steps then model the mass of the
        window and above it, and add back the exact mass above (see :class:`Heavy`).
      spread: ``float32[...]`` with ``heavy``: the deviation ``s`` of the Gaussian prior ``T(k) = Phi(-k / s)``.
    """

    x: Array
    key: Callable[[Array], Array]
    weight: Callable[[Array], Array]
    floor: Array
    start: Array
    first: Array | None = None
    uncovered: Array | None = None
    two_sided: bool = False
    window: int = 64
    heavy: Callable[[], "Heavy"] | None = None
    spread: Array | None = None


class Heavy(NamedTuple):
    """The tokens a two-sided window (typical) loses above its top end, known exactly from the ``K``
    most probable tokens (one :func:`jaxsample._candidates.top` of the logits).

    The mass ``T(k)`` of the window at key ``k`` *and* everything above it is one-sided and smooth
    (``Phi(-k / s)`` on Gaussian logits of deviation ``s``), where the window's own mass jumps by a
    heavy token's whole weight wherever the top end passes one. The search models ``T`` and adds
    back the exact mass ``U(k)`` above the window, for keys ``k <= limit``.

    Attributes:
      keys: ``float32[..., K]`` ascending keys at which each heavy candidate leaves the window (a
        candidate on the light side, never above the window, holds ``+inf``).
      weights: ``float32[..., K]`` their weights (0 where ``keys`` is ``+inf``).
      limit: ``float32[...]`` keys ``k <= limit`` have every token above the window among the candidates.
    """

    keys: Array
    weights: Array
    limit: Array


def candidate_cutoff(
    vals: Array,
    w_cand: Array | None,
    target: Array | None,
    min_count: Array | None,
    strict: bool,
    complete: Array,
) -> tuple[Array, Array]:
    """The candidate fast path of :func:`cutoff` on the ``K`` largest keys.

    Args:
      vals: ``float32[..., K]`` the largest keys in canonical order (see :func:`jaxsample._candidates.top`).
      w_cand: ``float32[..., K]`` their weights (with ``target``).
      target: ``float32[...]`` or None, as in :func:`cutoff`.
      min_count: ``int32[...]`` (``>= 1``) or None.
      strict: as in :func:`cutoff`.
      complete: ``bool[...]`` rows whose candidates hold every finite key.

    Returns:
      ``(t float32[...], covered bool[...])``: the cut-off, exact where ``covered``.
    """
    k = vals.shape[-1]
    t = jnp.full(vals.shape[:-1], jnp.inf)
    covered = jnp.ones(vals.shape[:-1], bool)
    if target is not None:
        cum = jnp.cumsum(w_cand, axis=-1)
        ok = mass_reached(cum, target[..., None], strict)
        found = jnp.any(ok, axis=-1)
        t = jnp.where(found, _take(vals, jnp.argmax(ok, axis=-1)), -jnp.inf)
        covered &= found | complete
    if min_count is not None:
        t = jnp.minimum(t, kth_candidate(vals, min_count))
        covered &= (min_count <= k) | complete
    return t, covered


def _thunk(a: Array | Callable[[], Array]) -> Callable[[], Array]:
    return a if callable(a) else (lambda: a)


def cutoff(
    keys: Array | Callable[[], Array],
    *,
    weights: Array | Callable[[], Array] | None = None,
    weights_at: Callable[[Array, Array], Array] | None = None,
    target: Array | None = None,
    min_count: Array | None = None,
    strict: bool = False,
    candidates: int = _candidates.DEFAULT_CANDIDATES,
    top: tuple[Array, Array] | None = None,
    search: Search | None = None,
) -> Array:
    """Per-row cut-off key of the smallest prefix meeting every given criterion.

    Args:
      keys: ``float32[..., V]`` filter order, higher first, NaN-free (or a thunk returning them, so
        that keys computed on the fly are computed where they are read, inside the batch-level
        conditionals, instead of being written out as their operand).
      weights: ``float32[..., V]`` non-negative weights (or a thunk returning them, so the full
        array is only built where needed). Required with ``target``.
      weights_at: optional ``(values [..., K], ids [..., K]) -> weights [..., K]`` of the candidates,
        when that is cheaper than gathering from ``weights`` (e.g. ``exp(values - lse)``).
      target: ``float32[...]`` weight the prefix must reach (see :func:`mass_reached`). Rows that the
        caller will ignore should pass 0 so that they count as covered.
      min_count: ``int32[...]`` minimum number of tokens in the prefix (clipped to ``[1, V]``).
      strict: compare the weight with ``>`` instead of ``>=``.
      candidates: static size ``K`` of the fast path.
      top: ``_candidates.top(keys, K)`` if the caller already has it.
      search: with a ``target``, ``keys`` and ``weights`` as functions of one array (:class:`Search`):
        uncovered rows then take a faster exact search on the key value (:func:`_value_search`).

    Returns:
      ``float32[...]`` cut-off ``t``: keep ``keys >= t``. ``-inf`` when no prefix qualifies.
    """
    if target is None and min_count is None:
        raise ValueError("cutoff needs a target, a min_count, or both")
    get_keys, get_weights = _thunk(keys), _thunk(weights)
    vocab = jax.eval_shape(get_keys).shape[-1]
    k = min(int(candidates), vocab)
    kk = None if min_count is None else jnp.clip(min_count, 1, vocab).astype(jnp.int32)

    def bits(w):
        keys = get_keys()
        u = order_key(keys)
        if target is None:
            best = _bisect(u, lambda trial: _math.row_count(u >= trial[..., None]) >= kk)
        else:

            def reached(trial):  # a non-empty prefix that reaches the target (sums as the value search)
                mass, n = _math.masked_sum_count(w, u >= trial[..., None])
                return mass_reached(mass, target, strict) & (n > 0)

            # Prefixes are never empty (hence the max): the bisection may settle below every key.
            best = jnp.minimum(_bisect(u, reached), order_key(jnp.max(keys, axis=-1)))
        return from_order_key(jnp.maximum(best, order_key(jnp.float32(-jnp.inf))))

    def searched(top, active, covered):
        found, ok = _value_search(search, target, strict, top, active)
        return _candidates.choose(ok | covered, lambda: found, lambda: bits(get_weights()))

    def with_count(best, top, none=None):
        # The count criterion is a separate search rather than a second reduction inside each pass;
        # `none`: `top` is a placeholder. A count of 1 asks nothing more: `best` is a key of its row
        # (or -inf), so at most the largest.
        if kk is None:
            return best

        def kth():
            if none is None:
                return kth_largest(get_keys, kk, k, top=top)
            return _math.cond(none, lambda: kth_largest(get_keys, kk, k), lambda: kth_largest(get_keys, kk, k, top=top))

        return _math.cond(jnp.all(kk <= 1), lambda: best, lambda: jnp.minimum(best, kth()))

    def with_candidates(vals, ids, none=None):
        w_cand = None
        if target is not None:
            w_cand = weights_at(vals, ids) if weights_at else jnp.take_along_axis(get_weights(), ids, axis=-1)
        t, covered = candidate_cutoff(vals, w_cand, target, kk, strict, _candidates.complete(vals, vocab))
        if none is not None:  # rows whose K largest keys cannot reach the target are never covered by them
            covered &= ~search.uncovered

        def full():
            if target is None:
                return bits(None)
            best = bits(get_weights()) if search is None else searched((vals, w_cand), ~covered, covered)
            return with_count(best, (vals, ids), none)

        return _candidates.choose(covered, lambda: t, full)

    if search is None or search.uncovered is None or target is None:
        return with_candidates(*(_candidates.top(get_keys(), k) if top is None else top))
    # A batch of rows that search without their candidates (search.uncovered) does not compute them:
    # placeholders stand in (-inf keys; such rows ignore them), so the program holds one search, not two.
    none = jnp.all(search.uncovered)
    placeholder = (jnp.full(search.uncovered.shape + (k,), -jnp.inf), jnp.zeros(search.uncovered.shape + (k,), jnp.int32))
    vals, ids = _math.cond(none, lambda: placeholder, lambda: _candidates.top(get_keys(), k) if top is None else top)
    return with_candidates(vals, ids, none)


def _value_search(
    search: Search, target: Array, strict: bool, top: tuple[Array, Array] | None, active: Array
) -> tuple[Array, Array]:
    """Cut-off for the keys and weights of ``search`` (:class:`Search`) by a search on the key value.

    For ``active`` rows (whose candidates do not resolve them; ``top``: the ``K`` largest keys and
    their weights, or None): a search on the key *value* for a point ``lo`` whose mass ``m(lo)`` (of
    ``key >= lo``) reaches the target with fewer than ``w - 1`` tokens (``w = search.window``, the finish
    window) between ``lo`` and the cut-off, either bounded by mass (every token at or above ``lo``
    weighs at least ``exp(lo - floor)``, so ``m(lo) - target < (w / 2) exp(lo - floor)`` suffices, half
    the window left for the rounding of ``m(lo)``, which on a flat row of 131072 tokens is worth a
    few of its tokens)
    or counted (fewer than ``w`` tokens in the bracket ``[lo, hi)``, ``hi`` a point that misses the
    target; the mass bound alone rarely settles a typical window, whose heavy tokens make the mass
    jump). The ``w`` smallest keys at or above ``lo`` (one top-``w``) and ``m(lo)`` minus their
    cumulative sum then give the cut-off exactly. Each step evaluates the mass and count at or above
    a point (one pass, :func:`jaxsample._math.masked_sum_count`) interpolated linearly in the probit
    of the mass through the last two points (exact for Gaussian logits under top-p, whose probability-weighted law is again
    Gaussian; with ``two_sided``, typical, in the probit of ``(1 + m) / 2``, the first secant through
    key 0 and ``search.first``), kept inside ``[lo, hi)``. ``lo`` starts at ``start`` and ``hi`` just
    above the ``K``-th largest key (above 0 without candidates). A batch of 64 flat rows at
    ``V = 131072`` takes 2-5 steps under top-p (p 0.5-0.99, logits of deviation 1-3) and 5-12 under typical
    (deviation 1-2; 13-15 at deviation 3 and p 0.9-0.95). With ``heavy`` (:class:`Heavy`), the
    first :data:`_MODEL_STEPS` steps of a two-sided search aim at the window's mass through a model of
    the mass of the window and above it instead: each row settles in 1-3 (batches in 3 at deviation 2-3,
    p 0.9-0.95, where they took 6-12); rows whose first step finds no solution in the model keep the
    secant (batches of deviation 1 in 3-4 steps, where they took 7-13 while the secant aimed at the
    bare target). Only active rows drive the loop; each row's steps depend on that row alone.

    Returns:
      ``(t float32[...], ok bool[...])``: ``ok`` marks the rows resolved here; rounding, ties or a
      search that did not settle can leave a row unresolved (the caller then runs the bit bisection).
    """
    x, key, weight = search.x, search.key, search.weight
    w = min(search.window, x.shape[-1])
    floor = search.floor
    # Rows without candidates start from hi just above 0, above every key: m(hi) = n(hi) = 0.
    lo, hi = search.start, jnp.full(search.start.shape, np.finfo(np.float32).smallest_subnormal)
    m_hi, n_hi = jnp.zeros(lo.shape), jnp.zeros(lo.shape, jnp.int32)
    if top is not None:
        vals, w_cand = top
        kth = vals[..., -1]
        # Every token above the k-th largest key is a candidate: m(hi), n(hi) are their mass and count.
        above = vals > kth[..., None]
        own = jnp.zeros(lo.shape, bool) if search.uncovered is None else search.uncovered  # as without candidates
        lo = jnp.where(own, lo, jnp.minimum(lo, kth))
        hi = jnp.where(own, hi, jnp.nextafter(kth, jnp.inf))
        m_hi = jnp.where(own, m_hi, jnp.sum(jnp.where(above, w_cand, 0.0), axis=-1))
        n_hi = jnp.where(own, n_hi, jnp.sum(above, axis=-1, dtype=jnp.int32))
    # m(lo) is not evaluated at the start (NaN): the first interpolation takes a guess instead.
    guess = 1.0 - 0.125 * (1.0 - target)

    def probit(m):
        return _math.probit(jnp.clip(0.5 + 0.5 * m if search.two_sided else m, 1e-6, 1.0 - 1e-6))

    band = w // 2  # tokens between lo and the cut-off that the mass bound may leave
    unknown = x.shape[-1] + w  # n(start) is not counted: conservative

    heavy = search.heavy() if search.heavy is not None and search.two_sided else None
    if heavy is not None:
        # Interval i between consecutive heavy keys, (left_i, right_i], loses the mass lost_i above the window.
        lead = heavy.keys.shape[:-1]
        left = jnp.concatenate([jnp.full(lead + (1,), -jnp.inf), heavy.keys], axis=-1)
        right = jnp.concatenate([heavy.keys, jnp.full(lead + (1,), jnp.inf)], axis=-1)
        lost = jnp.concatenate([jnp.zeros(lead + (1,)), jnp.cumsum(heavy.weights, axis=-1)], axis=-1)

    def settled(lo, hi, m_lo, m_hi, n_lo, n_hi, *points):
        # Fewer than w - 1 tokens between lo and the cut-off: bounded by their mass, or counted.
        # Heavy tokens on lo itself (where the model brackets a jump) leave first, their weight known.
        first = 0.0 if heavy is None else jnp.sum(jnp.where(heavy.keys == lo[..., None], heavy.weights, 0.0), -1)
        near = (m_lo - first - target) * (1.0 + 1e-3) < band * jnp.exp(lo - floor)  # False while m_lo is NaN
        return near | (n_lo - n_hi < w) | (jnp.nextafter(lo, jnp.inf) >= hi) | ~active

    def above(k):  # U(k): the exact mass above the window at keys k [...]
        return jnp.max(jnp.where(left < k[..., None], lost, 0.0), axis=-1)

    def modelled(lo, hi, aim, a, t_a, b, t_b):
        """The next key from the model of T (the window and above it; :class:`Heavy`), NaN where it has none.

        probit(T) is a line in the key: through the last two points where both are exact, through
        the last one at the prior's slope -1/s, or the prior itself. The window's mass T - U is
        aimed at ``aim``: U is constant between consecutive heavy keys, so each such interval has
        its own solution; the largest key that is one wins. A solution at a heavy key itself (the
        mass jumps past the aim there) is bracketed: the key, then the key just above it."""
        slope = -1.0 / search.spread
        z_a, z_b = (_math.probit(jnp.clip(t, 1e-6, 1.0 - 1e-6)) for t in (t_a, t_b))
        secant = (z_b - z_a) / (b - a)
        one = t_b >= 0  # NaN: the last point lies beyond the limit (no model); -1: none evaluated yet
        two = one & (t_a >= 0) & (secant < 0) & jnp.isfinite(secant)
        slope = jnp.where(two, secant, slope)
        at, z_at = jnp.where(one, b, 0.0), jnp.where(one, z_b, 0.0)
        z_aim = _math.probit(jnp.clip(aim[..., None] + lost, 1e-6, 1.0 - 1e-6))
        solved = at[..., None] + (z_aim - z_at[..., None]) / slope[..., None]
        cand = jnp.minimum(solved, right)
        best = jnp.max(jnp.where(cand > left, cand, -jnp.inf), axis=-1)
        jump = jnp.any((cand == best[..., None]) & (solved >= right) & (cand > left), axis=-1)
        mid = jnp.where(jump & (lo >= best), jnp.nextafter(best, jnp.inf), best)
        # Beyond the limit the mass above the window is not known: no solution there.
        usable = jnp.isfinite(mid) & (mid > lo) & (mid < hi) & (best <= heavy.limit) & (one | (t_b < 0))
        return jnp.where(usable, mid, jnp.nan)

    def step(carry, use_model):
        lo, hi, m_lo, m_hi, n_lo, n_hi, a, m_a, b, m_b, t_a, t_b, model = carry
        done = settled(*carry)
        # Secant through the last two points, aimed at the middle of the band that settles, its
        # weight read at lo. Until a point reaches the target, lo is the start, far below the
        # cut-off, and that aim lies on the target itself: secants landed just short of it step
        # after step (top-p: 4 steps where 2 do on flat rows; typical rows outside the model of
        # deviation 1: 6-7 where 3 do, stalling where two points held the same tokens). Such rows
        # read it at their last point when that missed (b == hi, m_a known: not the placeholders
        # of the first step).
        near = jnp.where(jnp.isnan(m_lo) & ~jnp.isnan(m_a) & (b == hi), b, lo)
        aim = target + 0.5 * band * jnp.exp(near - floor)
        z_a, z_b = (probit(jnp.where(jnp.isnan(m), guess, m)) for m in (m_a, m_b))
        mid = b + (a - b) * (z_b - probit(aim)) / (z_b - z_a)
        if use_model:
            # A row whose first step has no solution from the model (the top end of its window lies
            # beyond the candidates) keeps the secant on the window's mass throughout.
            better = modelled(lo, hi, aim, a, t_a, b, t_b)
            model &= ~((t_b == -1.0) & jnp.isnan(better))
            mid = jnp.where(model & ~jnp.isnan(better), better, mid)
        inner = jnp.where(jnp.isfinite(mid) & (mid > lo) & (mid < hi), mid, 0.5 * lo + 0.5 * hi)
        mid = jnp.clip(inner, jnp.nextafter(lo, jnp.inf), hi)
        # Mass and count in one pass (_math.masked_sum_count, rounded as the bisection's); the count
        # settles rows whose heavy tokens make the mass jump past the band.
        m, n = _math.masked_sum_count(weight(x), key(x) >= mid[..., None])
        reached = mass_reached(m, target, strict)
        up = reached & ~done
        down = ~reached & ~done & (mid < hi)
        moved = up | down
        t = jnp.where(model & (mid <= heavy.limit), m + above(mid), jnp.nan) if use_model else jnp.nan
        return (
            jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, m, m_lo), jnp.where(down, m, m_hi),
            jnp.where(up, n, n_lo), jnp.where(down, n, n_hi),
            jnp.where(moved, b, a), jnp.where(moved, m_b, m_a), jnp.where(moved, mid, b), jnp.where(moved, m, m_b),
            jnp.where(moved, t_b, t_a), jnp.where(moved, t, t_b), model,
        )

    # Unrolled: a while loop would carry (and copy) x; a skipped cond costs nothing.
    # (a, m_a) and (b, m_b): the two points evaluated last, b the most recent.
    nan = jnp.full(lo.shape, jnp.nan)
    if search.two_sided:
        # Key 0 (an empty window, mass 0) and a point that puts the first step at search.first.
        aim = target + 0.5 * band * jnp.exp(lo - floor)
        points = (search.first, aim, jnp.zeros(lo.shape), jnp.zeros(lo.shape))
    else:
        points = (lo, nan, hi, m_hi)
    # (t_a, t_b): the model's T at those points (-1: none yet; NaN: not known); model: rows that use it.
    modelling = (nan, jnp.full(lo.shape, -1.0), jnp.ones(lo.shape, bool))
    carry = (lo, hi, nan, m_hi, jnp.full(lo.shape, unknown, jnp.int32), n_hi) + points + modelling
    for i in range(_SEARCH_STEPS):
        use_model = heavy is not None and i < _MODEL_STEPS
        carry = _math.cond(jnp.all(settled(*carry)), lambda c: c, lambda c: step(c, use_model), carry)
    lo, _, m_lo = carry[:3]
    # The w smallest keys at or above lo, ascending; m(key >= v) = m(lo) - the mass below v.
    # Through top_of: the masked keys feed the chunk maxima pass and are not written out.
    neg, ids = _candidates.top_of(x, w, lambda v: jnp.where(key(v) >= lo[..., None], -key(v), -jnp.inf))
    w_win = jnp.where(neg > -jnp.inf, weight(jnp.take_along_axis(x, ids, axis=-1)), 0.0)
    below = jnp.cumsum(w_win, axis=-1) - w_win
    reached = mass_reached(m_lo[..., None] - below, target[..., None], strict) & (neg > -jnp.inf)
    last = jnp.sum(reached, axis=-1) - 1  # reached is a prefix: m(key >= v) falls as v rises
    t = -_take(neg, jnp.maximum(last, 0))
    return t, (last >= 0) & ~_take(reached | (neg == -jnp.inf), jnp.minimum(last + 1, w - 1)) & (last < w - 1)


def kth_largest(
    keys: Array | Callable[[], Array],
    k: Array,
    candidates: int = _candidates.DEFAULT_CANDIDATES,
    top: tuple[Array, Array] | None = None,
) -> Array:
    """``float32[...]`` the ``k``-th largest key per row, ties counted (``k`` clipped to ``[1, V]``).

    Batches where every ``k <= 1`` (the usual ``min_keep``) cost one max reduction (none with ``top``).
    ``keys``: as in :func:`cutoff`, an array or a thunk.
    """
    return _math.cond(
        jnp.all(k <= 1),
        lambda: jnp.max(_thunk(keys)(), axis=-1) if top is None else top[0][..., 0],
        lambda: cutoff(keys, min_count=k, candidates=candidates, top=top),
    )


def keep_top(keys: Array, min_count: Array, candidates: int = _candidates.DEFAULT_CANDIDATES, top=None) -> Array:
    """``bool[..., V]``: the ``min_count [...]`` largest keys of each row, ties kept (a filter's ``min_keep``)."""
    return keys >= kth_largest(keys, min_count, candidates, top)[..., None]


def first_k(
    keys: Array,
    k: Array,
    candidates: int = _candidates.DEFAULT_CANDIDATES,
    top: tuple[Array, Array] | None = None,
) -> Array:
    """``bool[..., V]`` selecting exactly the ``k`` largest keys per row, ties broken by lowest id.

    ``k`` is clipped to ``[1, V]``; entries of ``-inf`` keys may be selected when ``k`` exceeds the
    number of finite keys (callers mask with ``-inf`` anyway). ``top``: ``_candidates.top(keys, K)``
    if the caller already has it.
    """
    vocab = keys.shape[-1]
    kc = min(int(candidates), vocab)
    kk = jnp.clip(k, 1, vocab).astype(jnp.int32)
    vals, ids = _candidates.top(keys, kc) if top is None else top
    covered = (kk <= kc) | _candidates.complete(vals, vocab)

    def fast():
        # Keep the keys above the k-th candidate and, of those tied with it, the ids up to the last
        # tied candidate: candidates list ties in id order, so these are the lowest tied ids.
        last = jnp.minimum(kk, kc) - 1
        t = _take(vals, last)[..., None]
        tied = (jnp.arange(kc) <= last[..., None]) & (vals == t)
        last_id = jnp.max(jnp.where(tied, ids, -1), axis=-1, keepdims=True)
        return (keys > t) | ((keys == t) & (jnp.arange(vocab) <= last_id))

    def full():
        t = cutoff(keys, min_count=kk, candidates=kc, top=(vals, ids))[..., None]
        above = keys >= t
        exact = (_math.row_count(above) == kk) | (t[..., 0] == -jnp.inf)

        def split_ties():
            # Keep the first r tokens tied at t, by id: largest m with #(ties with id < m) < r.
            greater = keys > t
            tied = keys == t
            r = kk - _math.row_count(greater)
            iota = jnp.arange(vocab, dtype=jnp.int32)

            def body(i, m):
                trial = m | (jnp.int32(1) << (vocab.bit_length() - 1 - i))
                n = _math.row_count(tied & (iota < trial[..., None]))
                return jnp.where((trial <= vocab) & (n < r), trial, m)

            m = lax.fori_loop(0, vocab.bit_length(), body, jnp.zeros(kk.shape, jnp.int32))
            return greater | (tied & (iota <= m[..., None]))

        return _math.cond(jnp.all(exact | covered), lambda: above, split_ties)

    return _candidates.choose(covered, fast, full)
