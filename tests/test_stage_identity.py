"""Stage identity is structural: a second value of any user-visible default never recompiles.

Every stage factory is swept. For each, a second stage is built from fresh objects (lists instead of
tuples, new arrays) with every *value* field changed (the fields that only set parameter defaults:
``dataclasses.field(compare=False)``). The two stages must be equal and hash alike, a ``jit`` taking
the sampler as a static argument must trace once for both, and the cached program must be exactly
what a fresh trace of the second sampler gives (no default leaked into the trace as a constant). Static structure (windows, n-gram orders, token-id tables, candidate counts) is the rest
of a stage's fields, and changing it does give a different stage.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.chain import Selector, chain
from tests._helpers import CountingJit

B, V = 2, 8
_PIECES = [b"a", b"b", b"ab", b"c", b"ca", b"", b"d", b""]

# Arguments of the factories that need some (lists on purpose: they must be as good as tuples).
ARGS = {
    "bad_words": lambda: ([[1, 2], [3]],),
    "encoder_no_repeat_ngram": lambda: (2,),
    "no_repeat_ngram": lambda: (2,),
    "exponential_decay_length_penalty": lambda: (2, 1.1, [1]),
    "forced_bos": lambda: (0,),
    "forced_eos": lambda: (3, [1]),
    "infill": lambda: (js.infill_table(list(_PIECES), eog_ids=[7]),),
    "sequence_bias": lambda: ([[1, 2], [4]], [0.5, -1.0]),
    "reasoning_budget": lambda: ([5], [6]),
    "synthid_watermark": lambda: (2, [11, 12, 13], 16, 0, 64),
    "logit_bias": lambda: ([1, 2], [0.5, -1.0]),
    "allowed_tokens": lambda: ([1, 2, 3],),
    "suppress_tokens": lambda: ([4],),
    "suppress_tokens_at_begin": lambda: ([3],),
    "ignore_eos": lambda: ([1],),
    "min_tokens": lambda: (2, [1]),
    "dry": lambda: (0.5, 1.75, 2, 8, [[1], [2, 3]]),
    "penalties": lambda: (8, 1.2),
}
KWARGS = {"logit_bias": dict(capacity=2), "allowed_tokens": dict(capacity=2), "min_tokens": dict(capacity=1)}
FACTORIES = sorted(set(stages.__all__) - {"MIN_KEEP"})


def _build(name: str):
    return getattr(stages, name)(*ARGS.get(name, lambda: ())(), **KWARGS.get(name, {}))


def _other(value):
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 + 0.0625
    if isinstance(value, tuple):
        return tuple(_other(v) for v in value)
    raise TypeError(f"no other value for {value!r}")


def _second(stage):
    """``stage`` rebuilt from fresh objects with every default changed."""
    changes = {f.name: _other(getattr(stage, f.name)) for f in dataclasses.fields(stage)
               if not f.compare and f.init and f.name != "table"}
    return dataclasses.replace(stage, **changes), changes


def _run(sampler, params):
    state = sampler.init(params, vocab_size=V, prompt=jnp.array([[1, 2, 3, 1], [4, 4, -1, 2]]),
                         encoder_ids=jnp.array([[1, 2, 3], [3, 3, 3]]), history_size=32)
    logits = jnp.log(jnp.arange(1.0, V + 1.0)) * jnp.array([[1.0], [-0.5]])
    tokens, processed, state = sampler.sample(logits, state, params)
    return tokens, processed, sampler.accept(tokens, state, params)


def _sampler(part):
    return chain(select=part) if isinstance(part, Selector) else chain(part, select=stages.categorical())


def test_every_factory_is_swept():
    assert set(FACTORIES) == set(stages.__all__) - {"MIN_KEEP"}
    for name in FACTORIES:
        assert dataclasses.is_dataclass(_build(name)), f"stages.{name} is not a frozen dataclass"


@pytest.mark.parametrize("name", FACTORIES)
def test_a_second_value_is_the_same_stage_and_never_retraces(name):
    first = _build(name)
    second, changed = _second(_build(name))  # fresh objects: built again from new lists
    assert second == first and hash(second) == hash(first)
    a, b = _sampler(first), _sampler(second)
    assert a == b and hash(a) == hash(b)
    defaults_a = {p.name: p.default for p in a.param_specs().values()}
    defaults_b = {p.name: p.default for p in b.param_specs().values()}
    if changed:  # every changed field is a parameter default (and only that)
        assert defaults_a != defaults_b, f"{name}: fields {sorted(changed)} are not parameter defaults"

    # jit's trace cache is its compile cache's key (a program is compiled per trace): counting traces
    # is counting compilations, so the sweep traces only and compiles nothing (a compile per factory
    # was half of this module's time; the stages' programs run in their own modules' tests).
    step = CountingJit(_run, static_argnums=0)
    params_a, params_b = a.params((B,), seed=jnp.array([1, 2])), b.params((B,), seed=jnp.array([1, 2]))
    cached = step.trace(a, params_a)
    step.trace(b, params_b)
    assert step.traces == 1, f"stages.{name}: a second value recompiled"
    # no default leaks into the program as a constant: a fresh trace of the second sampler is the
    # cached program of the first
    fresh = jax.make_jaxpr(lambda p: _run(b, p))(params_a)
    assert str(cached.jaxpr) == str(fresh), f"stages.{name}: a default is baked into the compiled step"


def test_structure_is_part_of_the_identity():
    assert stages.top_k(40) == stages.top_k(20)  # values: the same stage
    assert stages.top_k(exact=True) != stages.top_k()
    assert stages.top_p(candidates=32) != stages.top_p()
    assert stages.penalties(64) != stages.penalties(32)
    assert stages.bad_words([[1, 2]]) != stages.bad_words([[1, 3]])
    assert stages.infill(js.infill_table(list(_PIECES), eog_ids=[7])) != stages.infill(
        js.infill_table(list(_PIECES), eog_ids=[6]))
    assert stages.temperature(name="t2") != stages.temperature()
