"""Stages for the truncation filters and the adaptive selectors (mirostat v1/v2, adaptive-p)."""

from __future__ import annotations

import functools as _functools

import jax.numpy as _jnp

from jaxsample import _forms, _validate
from jaxsample import cutoffs as _cutoffs
from jaxsample.mirostat import adaptive_p as _adaptive_p
from jaxsample.mirostat import adaptive_p_init as _adaptive_p_init
from jaxsample.mirostat import mirostat as _mirostat_v1
from jaxsample.mirostat import mirostat_v2 as _mirostat_v2
from jaxsample import truncation as _truncation
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import Form, Param, Selector, Stage, cached, stateless

#: Shared by every filter that keeps a minimum number of tokens (llama.cpp ``min_keep``).
MIN_KEEP = Param("min_keep", 1, _jnp.int32, lo=0)


def _idle_form(off) -> Form:
    """Candidate form of a filter for rows where it is off (``off: params -> bool[B]``): the identity."""
    return Form(lambda c, s, p, info: (c, s), handles=off)


@cached
def top_k(
    default: int = 0, *, exact: bool = False, candidates: int = DEFAULT_CANDIDATES, name: str = "top_k"
) -> Stage:
    """:func:`jaxsample.top_k` reading ``top_k`` (``<= 0`` off); ``exact=True`` is llama.cpp's exactly-k."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    fn = _functools.partial(_truncation.top_k, exact=exact, candidates=candidates)
    form = Form(
        update=lambda c, s, p, info: (_forms.top_k(c, p["top_k"], exact), s),
        enter=lambda x, s, p, info: _forms.top_k_entry(x, p["top_k"], exact, candidates),
        k=candidates,
    )
    return stateless(name, fn, (Param("top_k", default, _jnp.int32),), form=form, nan_free=True)


@cached
def top_p(default: float = 1.0, *, candidates: int = DEFAULT_CANDIDATES, name: str = "top_p") -> Stage:
    """:func:`jaxsample.top_p` reading ``top_p`` (``>= 1`` off) and ``min_keep``."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    fn = _functools.partial(_truncation.top_p, candidates=candidates)
    form = Form(
        update=lambda c, s, p, info: (_forms.top_p(c, _jnp.maximum(p["top_p"], 0.0), p["min_keep"]), s),
        enter=lambda x, s, p, info: _forms.top_p_entry(x, _jnp.maximum(p["top_p"], 0.0), p["min_keep"], candidates),
        k=candidates,
    )
    return stateless(name, fn, (Param("top_p", default, lo=0.0), MIN_KEEP), form=form, nan_free=True)


@cached
def min_p(default: float = 0.0, *, name: str = "min_p") -> Stage:
    """:func:`jaxsample.min_p` reading ``min_p`` (``<= 0`` off) and ``min_keep``."""
    form = Form(lambda c, s, p, info: (_forms.min_p(c, _jnp.maximum(p["min_p"], 0.0), p["min_keep"]), s))
    return stateless(name, _truncation.min_p, (Param("min_p", default, lo=0.0), MIN_KEEP), form=form, nan_free=True)


@cached
def typical(default: float = 1.0, *, candidates: int = DEFAULT_CANDIDATES, name: str = "typical") -> Stage:
    """:func:`jaxsample.typical` reading ``typical_p`` (``>= 1`` off) and ``min_keep``."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)
    fn = _functools.partial(_truncation.typical, candidates=candidates)
    form = _idle_form(lambda p: p["typical_p"] >= 1)
    return stateless(name, fn, (Param("typical_p", default, lo=0.0), MIN_KEEP), form=form, nan_free=True)


@cached
def top_n_sigma(default: float = -1.0, *, name: str = "top_n_sigma") -> Stage:
    """:func:`jaxsample.top_n_sigma` reading ``top_n_sigma`` (``<= 0`` off)."""
    form = _idle_form(lambda p: p["top_n_sigma"] <= 0)
    return stateless(name, _truncation.top_n_sigma, (Param("top_n_sigma", default),), form=form, nan_free=True)


@cached
def top_h(default: float = 0.0, *, top_n: int = 100, name: str = "top_h") -> Stage:
    """:func:`jaxsample.top_h` reading ``top_h`` (``0`` off, at most 1)."""
    fn = _functools.partial(_truncation.top_h, top_n=top_n)
    return stateless(name, fn, (Param("top_h", default, lo=0.0, hi=1.0),), nan_free=True)


@cached
def epsilon_cutoff(default: float = 0.0, *, name: str = "epsilon_cutoff") -> Stage:
    """:func:`jaxsample.epsilon_cutoff` reading ``epsilon_cutoff`` (``0`` off) and ``min_keep``."""
    form = _idle_form(lambda p: p["epsilon_cutoff"] <= 0)
    return stateless(name, _cutoffs.epsilon_cutoff, (Param("epsilon_cutoff", default, lo=0.0), MIN_KEEP), form=form, nan_free=True)


@cached
def eta_cutoff(default: float = 0.0, *, name: str = "eta_cutoff") -> Stage:
    """:func:`jaxsample.eta_cutoff` reading ``eta_cutoff`` (``0`` off) and ``min_keep``."""
    form = _idle_form(lambda p: p["eta_cutoff"] <= 0)
    return stateless(name, _cutoffs.eta_cutoff, (Param("eta_cutoff", default, lo=0.0), MIN_KEEP), form=form, nan_free=True)


@cached
def p_less(*, name: str = "p_less") -> Stage:
    """:func:`jaxsample.p_less` (no off value: include the stage only when wanted) reading ``min_keep``."""
    return stateless(name, _cutoffs.p_less, (MIN_KEEP,), nan_free=True)


@cached
def xtc(probability: float = 0.0, threshold: float = 0.1, *, name: str = "xtc") -> Stage:
    """:func:`jaxsample.xtc` reading ``xtc_probability`` (``<= 0`` off), ``xtc_threshold``, ``min_keep``."""
    params = (Param("xtc_probability", probability, lo=0.0), Param("xtc_threshold", threshold), MIN_KEEP)
    form = _idle_form(lambda p: (p["xtc_probability"] <= 0) | (p["xtc_threshold"] > 0.5))
    return stateless(name, _cutoffs.xtc, params, keyed=True, form=form, nan_free=True)


@cached
def mirostat(
    tau: float = 5.0,
    eta: float = 0.1,
    *,
    m: int = 100,
    n_vocab: int | None = None,
    candidates: int = DEFAULT_CANDIDATES,
    name: str = "mirostat",
) -> Selector:
    """Mirostat v1 selector reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]`` starts at ``2 * tau``."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)

    def select(x, mu, p, info):
        return _mirostat_v1(
            info.key, x, mu, p["mirostat_tau"], p["mirostat_eta"], m, n_vocab, candidates=candidates
        )

    return Selector(
        name, select, (Param("mirostat_tau", tau), Param("mirostat_eta", eta)),
        init=lambda info: 2.0 * info.params["mirostat_tau"],
    )


@cached
def mirostat_v2(
    tau: float = 5.0, eta: float = 0.1, *, candidates: int = DEFAULT_CANDIDATES, name: str = "mirostat_v2"
) -> Selector:
    """Mirostat v2 selector reading ``mirostat_tau``, ``mirostat_eta``; state ``mu [B]`` starts at ``2 * tau``."""
    candidates = _validate.static_int(candidates, "candidates", lo=1)

    def select(x, mu, p, info):
        return _mirostat_v2(info.key, x, mu, p["mirostat_tau"], p["mirostat_eta"], candidates=candidates)

    return Selector(
        name, select, (Param("mirostat_tau", tau), Param("mirostat_eta", eta)),
        init=lambda info: 2.0 * info.params["mirostat_tau"],
    )


@cached
def adaptive_p(
    target: float = -1.0, decay: float = 0.9, *, candidates: int = DEFAULT_CANDIDATES, name: str = "adaptive_p"
) -> Selector:
    """Adaptive-p selector reading ``adaptive_p_target`` (``< 0`` off: plain ``dist``), ``adaptive_p_decay``.

    State: :class:`jaxsample.mirostat.AdaptivePState` ``[B]``, initialised at the converged EMA.
    """
    candidates = _validate.static_int(candidates, "candidates", lo=1)

    def select(x, state, p, info):
        return _adaptive_p(
            info.key, x, *state, p["adaptive_p_target"], p["adaptive_p_decay"], candidates=candidates
        )

    def init(info):
        return _adaptive_p_init(info.params["adaptive_p_target"], info.params["adaptive_p_decay"])

    params = (Param("adaptive_p_target", target), Param("adaptive_p_decay", decay, lo=0.0, hi=0.99))
    return Selector(name, select, params, init=init)
