"""Top-p (nucleus): keep the smallest set of most probable tokens whose probability reaches ``p``.

The cut-off is searched without a sort (:mod:`jaxsample._threshold`): the cumulative mass of the
``K`` largest logits when the nucleus lies among them, else an exact search on the logit value
(secant steps in the probit of the mass, finished on the 64 smallest logits above the lower end it
settles on, :func:`jaxsample._threshold._value_search`; the bit bisection if that fails).
The stage is an entry of the candidate fast path (after it, a row's nucleus is its candidates)
and has a candidate form (top-p after another filter).

Bit-exactness of the form: the dense core normalises a complete row (every finite logit among the
candidates) over its candidates, :func:`_log_normaliser`, and sums probabilities in candidate
order, exactly what the form does.

Sharding/TPU: rows are independent; shard the batch axis. The candidates are one ``lax.top_k``
over a whole vocabulary row. Skipping off batches, the exact fallback and each search step are
batch-level ``lax.cond``s (an all-reduce of one bool under GSPMD; both branches under ``vmap``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxsample import _candidates, _fastpath, _math, _threshold, _validate
from jaxsample._candidates import DEFAULT_CANDIDATES, Candidates
from jaxsample._types import Array, Float, Int
from jaxsample.chain import MIN_KEEP, Param, Stage, static_int


def _probs(vals: Array, lse: Array) -> Array:
    """Probabilities of logits ``[*B, K]`` given the row's log-normaliser ``[*B, 1]``.

    In a row holding ``+inf`` logits each of them gets weight 1 (the first one alone reaches any
    target ``<= 1``, and every ``+inf`` token is tied at the cut-off), all others 0.
    """
    certain = jnp.isposinf(lse)
    probs = jnp.exp(vals - jnp.where(jnp.isfinite(lse), lse, 0.0))  # empty rows: exp(-inf) = 0
    return jnp.where(certain, (vals == jnp.inf).astype(jnp.float32), probs)


def _log_normaliser(x: Array, top: tuple[Array, Array], read=_math.identity) -> Array:
    """``float32[*B, 1]`` logsumexp of each row of ``read(x)``, over its candidates when they hold every finite logit."""
    complete = _candidates.complete(top[0], x.shape[-1])[..., None]
    # The largest candidate is the row maximum: no max pass over the vocabulary.
    dense = _math.if_any(
        ~complete, lambda: _math.logsumexp(read(x), top[0][..., :1]), lambda: jnp.zeros(complete.shape)
    )
    return jnp.where(complete, _math.logsumexp(top[0]), dense)


def _cut(x: Array, p: Array, min_count: Array, candidates: int, top, read=_math.identity) -> Array:
    """``float32[*B]`` cut-off (keep ``read(x) >= t``) for ``p >= 0`` and ``min_count >= 1``.

    ``read``: applied wherever ``x`` is read (the NaN map of a public call), inside the conditionals,
    which on XLA:CPU take their operands from memory: no mapped copy of ``x`` is written.
    """
    lse = _log_normaliser(x, top, read)
    off = p >= 1
    target = jnp.where(off, 0.0, p)
    # Rows with an infinite lse are covered by the candidates: the search never reads them.
    c = jnp.where(jnp.isfinite(lse), lse, 0.0)
    # Every token below lse + log((1 - p) / V) holds less than (1 - p) / V.
    start = c[..., 0] + jnp.log(jnp.maximum(1.0 - target, 0.0) / x.shape[-1])
    search = _threshold.Search(x, read, lambda v: jnp.exp(read(v) - c), c[..., 0], start)
    t = _threshold.cutoff(
        lambda: read(x),
        weights=lambda: _probs(read(x), lse),
        weights_at=lambda vals, ids: _probs(vals, lse),
        target=target,
        min_count=min_count,
        candidates=candidates,
        top=top,
        search=search,
    )
    return jnp.where(off, -jnp.inf, t)


def _values(p: Array, min_keep: Array) -> tuple[Array, Array]:
    """``(p, min_count)``: ``p`` clamped to ``>= 0`` (NaN: off), ``min_keep`` to ``>= 1``."""
    return jnp.maximum(_math.nan_to(p, 1.0), 0.0), jnp.maximum(min_keep, 1)


def _top_p(x: Array, p: Array, min_keep: Array, candidates: int, read=_math.identity) -> Array:
    """The core on float32 ``x [*B, V]`` (NaN-free after ``read``, see :func:`_cut`), ``p float32[*B]``,
    ``min_keep int32[*B]``."""
    p, min_count = _values(p, min_keep)

    def apply():
        t = _cut(x, p, min_count, candidates, _candidates.top_of(x, candidates, read), read)
        # NaN >= t is False: the same as keeping read(x) (the NaN map), which XLA would share with the
        # candidates' pass and write out.
        return _math.keep(x, x >= t[..., None])

    return _math.if_any(p < 1, apply, lambda: read(x))


def top_p(
    logits: Float["*B V"], p: Float["*B"] | float, min_keep: Int["*B"] | int = 1, *,
    candidates: int = DEFAULT_CANDIDATES,
) -> Float["*B V"]:
    """Nucleus sampling: keeps the smallest set of most probable tokens whose probability sums to ``>= p``.

    The token that crosses ``p`` is kept, as are tokens tied with it; masses within
    :data:`jaxsample._threshold.MASS_RTOL` of ``p`` count as reaching it. This is llama.cpp ``top_p``
    (``cum >= p``) and, up to float rounding at the boundary, HF ``TopPLogitsWarper`` / vLLM
    (remove tokens whose ascending cumulative mass is ``<= 1 - p``). Probabilities are the softmax of
    the row as given (after any earlier filter, i.e. renormalised after top-k).

    Args:
      logits: ``[..., V]``.
      p: scalar or ``[...]``; ``p >= 1`` is off, ``p <= 0`` keeps the most probable token(s).
        ``ValueError`` if concretely ``< 0``.
      min_keep: keep at least this many most probable tokens (integer ``>= 0``, scalar or ``[...]``).
      candidates: static size of the fast path; a row whose nucleus does not fit takes the exact
        value search.

    Returns:
      ``[..., V]`` logits in the input dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    >>> (top_p(x, 0.7) > -jnp.inf).tolist()
    [False, False, True, True]
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    x, dtype = _math.prepare(logits, map_nan=False)
    batch = x.shape[:-1]
    p = _validate.probability(p, batch, "p (top_p)")
    min_keep = _validate.min_keep(min_keep, batch, "top_p")
    return _math.restore(_top_p(x, p, min_keep, candidates, _math.clean), dtype)


@dataclasses.dataclass(frozen=True)
class TopP(Stage, _fastpath.CandidateEntry):
    """:func:`top_p` reading ``top_p`` (``>= 1`` off) and ``min_keep``."""

    default: float = dataclasses.field(default=1.0, compare=False)
    _: dataclasses.KW_ONLY
    candidates: int = static_int(DEFAULT_CANDIDATES)
    name: str = "top_p"

    @property
    def params(self) -> tuple[Param, ...]:
        return (Param("top_p", self.default, lo=0.0), MIN_KEEP)

    @property
    def candidate_count(self) -> int:
        return self.candidates

    def update(self, x, state, params, info):
        return _top_p(x, params["top_p"], params["min_keep"], self.candidates), state

    def enter_candidates(self, x, state, params, info):
        p, min_count = _values(params["top_p"], params["min_keep"])

        def filtered(top):
            t = _cut(x, p, min_count, self.candidates, top)
            return top[0] >= t[..., None], t

        return _fastpath.enter(x, p < 1, self.candidates, filtered, lambda top, t: _math.keep(x, x >= t[..., None]))

    def on_candidates(self, c: Candidates, state, params, info):
        """Top-p of complete candidates: the dense core's candidate path, verbatim."""
        p, min_count = _values(params["top_p"], params["min_keep"])
        off = p >= 1
        w = _probs(c.vals, _math.logsumexp(c.vals))
        complete = jnp.ones(off.shape, bool)
        t, _ = _threshold.candidate_cutoff(c.vals, w, jnp.where(off, 0.0, p), min_count, False, complete)
        return c.mask(c.vals >= jnp.where(off, -jnp.inf, t)[..., None]), state
