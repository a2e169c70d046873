"""Reliability sweeps: every numeric parameter of every public sampler function, stage, preset
builder and config kind, given NaN, infinities, strings, bools and huge ints.

The parameter lists are generated from signatures, ``Stage.params`` and dataclass type hints, so a
new parameter is swept without editing this file; a new public function or stage factory must be
added to the call tables below (a test fails until it is). Each bad value must either raise a
``ValueError`` naming the parameter, or (for values with a documented meaning, such as
``top_k=inf`` or ``temperature=3e38``) give an output that keeps the contract: no NaN, no row left
without a finite logit, tokens in range. Under ``jit`` every value must keep the contract.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
import warnings

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import _noise, presets, stages
from jaxsample.chain import Selector, chain
from jaxsample import config as _config

NEG = -np.inf
V = 5
# Hard rows: an ordinary row, a row with one finite logit, a row that overflows to -inf under a
# tiny temperature. The history covers every token, so infinite penalties hit whole rows.
LOGITS = jnp.array(
    [[0.0, 1.0, 2.0, 3.0, -1.0], [NEG, NEG, 2.5, NEG, NEG], [-5.0, -6.0, -7.0, -8.0, -9.0]], jnp.float32
)
B = LOGITS.shape[0]
HISTORY = jnp.array([[0, 1, 2, 3, 4], [2, 2, 2, -1, -1], [0, 1, 2, 3, 4]], jnp.int32)
POS = jnp.array([0, 3, 7], jnp.int32)
DATA = dict(logits=LOGITS, history=HISTORY, key=jax.random.key(0), encoder_ids=HISTORY, cond=LOGITS,
            uncond=LOGITS[::-1])

EAGER_BAD = {"nan": float("nan"), "str": "0.5", "bool": True, "none": None}
EAGER_EXTREME = {"inf": float("inf"), "-inf": float("-inf"), "2**31": 2**31, "2**63": 2**63, "-2**63": -(2**63)}
TRACED = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-38, 2.0**31, 0.0], np.float32)


def check_contract(out, logits=LOGITS) -> None:
    """No NaN, every row keeps a sampleable (``> -inf``) logit, tokens in range and sampleable in the input."""
    outs = out if isinstance(out, tuple) else (out,)
    first = np.asarray(outs[0])
    if first.dtype.kind == "f" and first.shape == logits.shape:
        assert not np.isnan(first).any(), "NaN in the output"
        assert (first > -np.inf).any(-1).all(), f"a row lost every sampleable logit: {first}"
    elif first.dtype.kind in "iu":
        assert ((first >= 0) & (first < logits.shape[-1])).all(), f"token out of range: {first}"
        picked = np.take_along_axis(np.asarray(logits), first.reshape(-1, 1), -1)
        assert (picked > -np.inf).all(), f"a removed token was returned: {first}"


def expect_error_or_contract(fn, name: str, must_raise: bool) -> None:
    try:
        out = fn()
    except ValueError as err:
        assert name in str(err), f"ValueError does not name {name!r}: {err}"
        return
    assert not must_raise, f"{name}: accepted"
    check_contract(out)


# ------------------------------------------------------------------------------------------ noise
def test_unit_uniform_is_open_for_extreme_bit_patterns():
    bits = jnp.array([0, 1, 0xFF, 0xFFFFFF7F] + list(range(0xFFFFFF80, 0x100000000, 13)) + [0xFFFFFFFF], jnp.uint32)
    u = np.asarray(_noise._to_unit_open(bits))
    assert ((u > 0) & (u < 1)).all()
    g = np.asarray(_noise._gumbel_from_bits(bits))
    assert np.isfinite(g).all(), g


@pytest.mark.parametrize("word", [0, 0xFFFFFF80, 0xFFFFFFFF])
def test_one_finite_logit_always_wins_whatever_the_noise(monkeypatch, word):
    const = lambda keys, n_or_ids: jnp.full(  # noqa: E731
        keys.shape + ((n_or_ids,) if isinstance(n_or_ids, int) else n_or_ids.shape[-1:]), word, jnp.uint32)
    monkeypatch.setattr(_noise, "bits_all", const)
    monkeypatch.setattr(_noise, "bits_at", const)
    x = jnp.full((2, 7), NEG).at[:, 4].set(1.5)
    assert np.asarray(js.categorical(jax.random.key(3), x)).tolist() == [4, 4]
    assert np.asarray(js.categorical(jax.random.key(3), x, candidates=2)).tolist() == [4, 4]


# ------------------------------------------------------------------------------ sampler functions
_ZEROS = jnp.zeros(B)
FUNCTIONS = {  # the non-swept arguments of each public function that takes numeric parameters
    "temperature": dict(temp=0.7),
    "dynamic_temperature": dict(temp=0.7, delta=0.5),
    "top_k": dict(k=3), "top_p": dict(p=0.9), "min_p": dict(p=0.1), "typical": dict(p=0.9),
    "top_n_sigma": dict(n=1.0), "top_h": dict(top_h=0.5), "p_less": {},
    "epsilon_cutoff": dict(epsilon=0.01), "eta_cutoff": dict(epsilon=0.01),
    "xtc": dict(probability=0.5, threshold=0.1),
    "penalties": dict(repeat=1.2, frequency=0.1, presence=0.1),
    "dry": dict(multiplier=0.8),
    "encoder_repetition_penalty": dict(penalty=1.2),
    "classifier_free_guidance": dict(scale=1.5), "classifier_free_guidance_logits": dict(scale=1.5),
    "mirostat": dict(mu=jnp.full(B, 10.0), tau=5.0, eta=0.1),
    "mirostat_v2": dict(mu=jnp.full(B, 10.0), tau=5.0, eta=0.1),
    "adaptive_p": dict(weighted_sum=_ZEROS, total_weight=_ZEROS, target=0.5, decay=0.9),
    "min_tokens": dict(position=POS, min_tokens=2, stop_ids=jnp.array([1])),
    "forced_eos": dict(position=POS, max_new_tokens=3, eos_ids=jnp.array([1])),
    "forced_bos": dict(position=POS, bos_id=0),
    "exponential_decay_length_penalty": dict(position=POS, start=2, factor=1.1, eos_ids=jnp.array([1])),
    "suppress_tokens_at_begin": dict(ids=jnp.array([1]), position=POS, begin_index=0),
    "ignore_eos": dict(eos_ids=jnp.array([1]), ignore=True),
    "logit_bias": dict(ids=jnp.array([1]), values=jnp.array([2.0])),
    "sequence_bias": dict(sequences=((1, 2),), biases=0.5),
}
# token ids, histories and state are data, not parameters
NOT_PARAMS = set(DATA) | {"ids", "eos_ids", "stop_ids", "mask", "bias", "values", "mu", "weighted_sum",
                          "total_weight", "position", "clamp"}
# public callables without numeric parameters, or not sampler functions
NO_PARAMS = {"greedy", "categorical", "chain", "compute_logprobs", "log_softmax", "remove_inf_nan",
             "allowed_tokens", "suppress_tokens", "bad_words", "no_repeat_ngram", "encoder_no_repeat_ngram",
             "infill", "infill_table", "infill_table_from_tokenizer", "token_pieces",
             "token_mask", "gather_logprobs", "step_logprobs", "top_logprobs", "adaptive_p_init",
             "dry_sequence_breakers",
             # watermark detection and SynthID helpers take tokens and validated configs (test_watermark.py,
             # test_synthid.py); watermark's own per-row parameters are swept through stages.watermark
             "detect_watermark", "greenlist", "synthid_config", "synthid_g_values", "synthid_init", "synthid_mask",
             "synthid_mean_score", "synthid_watermark", "synthid_weighted_mean_score", "watermark", "watermark_config"}


def _call(name: str, kw: dict):
    fn = getattr(js, name)
    if name == "sequence_bias" and not isinstance(kw["biases"], (str, type(None))):  # one bias per sequence
        kw = {**kw, "biases": jnp.reshape(jnp.asarray(kw["biases"], jnp.float32), (1,))
              if isinstance(kw["biases"], jax.Array) else [kw["biases"]]}
    args = {p: kw[p] if p in kw else DATA[p] for p in inspect.signature(fn).parameters if p in kw or p in DATA}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(**args)


def _numeric(name: str) -> list[str]:
    sig = inspect.signature(getattr(js, name))
    return [p.name for p in sig.parameters.values() if p.name not in NOT_PARAMS and "ArrayLike" in str(p.annotation)]


BOOL_PARAMS = {"ignore"}  # documented as bool or 0/1
FUNCTION_PARAMS = [(f, p) for f in FUNCTIONS for p in _numeric(f)]


def test_every_public_function_is_in_the_sweep():
    functions = {n for n in js.__all__ if inspect.isfunction(getattr(js, n))}
    assert functions - set(FUNCTIONS) - NO_PARAMS == set(), "add new public functions to FUNCTIONS or NO_PARAMS"


@pytest.mark.parametrize("fn,param", FUNCTION_PARAMS, ids=[f"{f}.{p}" for f, p in FUNCTION_PARAMS])
def test_function_parameters_reject_or_keep_the_contract(fn, param):
    for label, value in EAGER_BAD.items():
        if label == "bool" and param in BOOL_PARAMS:
            continue
        expect_error_or_contract(lambda: _call(fn, {**FUNCTIONS[fn], param: value}), param, must_raise=True)
    for value in EAGER_EXTREME.values():
        expect_error_or_contract(lambda: _call(fn, {**FUNCTIONS[fn], param: value}), param, must_raise=False)
    traced = jax.jit(lambda v: _call(fn, {**FUNCTIONS[fn], param: v}))
    for value in TRACED:
        check_contract(traced(jnp.float32(value)))


_JITTED: dict = {}


@hypothesis.given(
    case=st.sampled_from(FUNCTION_PARAMS),
    value=st.floats(width=32, allow_nan=True, allow_infinity=True)
    | st.sampled_from([2.0**31, 2.0**63, -(2.0**63), 3e38, 1e-38, -1e-38]),
    row=st.integers(0, B - 1),
)
def test_property_any_traced_value_keeps_the_contract(case, value, row):
    """Hypothesis over every function parameter: one row gets an arbitrary (non-finite, huge, tiny)
    value, the others the base value; the output keeps the contract in every row."""
    fn, param = case
    if case not in _JITTED:
        _JITTED[case] = jax.jit(lambda v: _call(fn, {**FUNCTIONS[fn], param: v}))
    base = np.float32(np.asarray(FUNCTIONS[fn].get(param, 1.0), np.float32).reshape(-1)[0]) \
        if param in FUNCTIONS[fn] else np.float32(1.0)
    values = np.full(B, base, np.float32)
    values[row] = np.float32(value)
    check_contract(_JITTED[case](jnp.asarray(values if fn != "sequence_bias" else values[:1])))


def test_none_parameter_is_named():
    with pytest.raises(ValueError, match="^p "):
        js.top_p(LOGITS, None)


@pytest.mark.parametrize("fn", ["top_p", "top_k", "typical", "categorical"])
def test_zero_candidates_is_a_value_error(fn):
    args = (jax.random.key(0), LOGITS) if fn == "categorical" else (LOGITS, 0.5)
    with pytest.raises(ValueError, match="candidates must be >= 1"):
        getattr(js, fn)(*args, candidates=0)


# ------------------------------------------------------------------------------------ extremes
def test_penalties_never_empty_a_row_and_leave_absent_tokens_alone():
    x = jnp.array([[1.0, -2.0, 3.0, 0.5]])
    hist = jnp.array([[0, 1, 2, 3]])
    for kw in (dict(repeat=np.inf), dict(frequency=np.inf), dict(presence=np.inf), dict(frequency=-np.inf)):
        out = np.asarray(jax.jit(lambda h, **k: js.penalties(x, h, **k))(hist, **kw))
        assert (out > -np.inf).any() and not np.isnan(out).any(), (kw, out)
    absent = jnp.array([[0, -1, -1, -1]])
    for kw in (dict(repeat=np.inf), dict(repeat=np.nan), dict(frequency=np.nan), dict(presence=-np.inf)):
        out = np.asarray(jax.jit(lambda **k: js.penalties(x, absent, **{n: jnp.float32(v) for n, v in k.items()}))(**kw))
        np.testing.assert_array_equal(out[0, 1:], np.asarray(x)[0, 1:], err_msg=str(kw))


@pytest.mark.parametrize("temp", [3e38, 1e-38, np.inf])
def test_extreme_temperatures_keep_a_finite_logit(temp):
    for fn in (lambda x, t: js.temperature(x, t), lambda x, t: js.dynamic_temperature(x, t, 0.5)):
        out = np.asarray(jax.jit(fn)(LOGITS, jnp.float32(temp)))
        assert np.isfinite(out).any(-1).all() and not np.isnan(out).any(), out
    # the t -> 0 limit of a row that overflows is greedy on it
    assert np.isfinite(np.asarray(js.temperature(LOGITS, 1e-38))[2]).tolist() == [True, False, False, False, False]


def test_top_n_sigma_infinite_n_keeps_the_maxima_of_flat_rows():
    x = jnp.array([[1.0, 1.0, NEG], [NEG, 2.0, NEG]])
    out = np.asarray(jax.jit(js.top_n_sigma)(x, jnp.float32(np.inf)))
    np.testing.assert_array_equal(out, np.asarray(x))


@pytest.mark.parametrize("fn,param", [("top_k", "k"), ("top_p", "min_keep"), ("min_p", "min_keep"),
                                      ("typical", "min_keep"), ("epsilon_cutoff", "min_keep"),
                                      ("eta_cutoff", "min_keep"), ("p_less", "min_keep"), ("xtc", "min_keep"),
                                      ("dry", "allowed_length"), ("penalties", "last_n")])
def test_huge_integers_saturate_like_infinity(fn, param):
    """Integer parameters beyond int32 mean what ``inf`` means (no ``OverflowError``)."""
    big = np.asarray(_call(fn, {**FUNCTIONS[fn], param: 2**40}))
    inf = np.asarray(_call(fn, {**FUNCTIONS[fn], param: float("inf")}))
    np.testing.assert_array_equal(big, inf)


# --------------------------------------------------------------------------------------- stages
_TABLE = js.infill_table([b"a", b"b", b"ab", b"c", b""], eog_ids=[4])
STAGES = {  # factory -> arguments that build it (static parts); default () for the others
    "bad_words": ((((1, 2),),), {}),
    "encoder_no_repeat_ngram": ((2,), {}),
    "no_repeat_ngram": ((2,), {}),
    "exponential_decay_length_penalty": ((2, 1.1, (1,)), {}),
    "forced_bos": ((0,), {}),
    "forced_eos": ((3, (1,)), {}),
    "infill": ((_TABLE,), {}),
    "sequence_bias": ((((1, 2),), (0.5,)), {}),
    "penalties": ((), dict(last_n=-1)),
    "dry": ((), dict(last_n=-1)),
    "reasoning_budget": (((5,), (6,)), {}),
    "synthid_watermark": ((2, (11, 12, 13)), dict(sampling_table_size=64, context_history_size=16)),
}
NOT_STAGES = {"MIN_KEEP", "grammar"}  # a constant; grammar needs compiled grammar tables (test_structured_stage)


def _sampler(name: str):
    args, kwargs = STAGES.get(name, ((), {}))
    part = getattr(stages, name)(*args, **kwargs)
    if isinstance(part, Selector):
        return chain(select=part)
    return chain(part, select=stages.greedy())


def _stage_params(name: str) -> list[str]:
    sampler = _sampler(name)
    return [p.name for p in sampler.param_specs().values() if p.capacity is None and not p.shared]


def test_every_stage_factory_is_in_the_sweep():
    assert set(stages.__all__) - NOT_STAGES == set(STAGE_NAMES)


STAGE_NAMES = sorted(set(stages.__all__) - NOT_STAGES)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_parameters_reject_or_keep_the_contract(name):
    sampler = _sampler(name)
    names = _stage_params(name)
    for param in names:
        for value in EAGER_BAD.values():
            with pytest.raises(ValueError, match=param):
                sampler.params((B,), **{param: value})
        for value in EAGER_EXTREME.values():
            try:
                sampler.params((B,), **{param: value})
            except ValueError as err:
                assert param in str(err), err

    def step(params):
        state = sampler.init(params, vocab_size=V, prompt=HISTORY, encoder_ids=HISTORY, history_size=32)
        tokens, processed, _ = sampler.sample(LOGITS, state, params)
        return tokens, processed

    step = jax.jit(step)
    base = sampler.params((B,))
    for param in names:
        if param in ("seed", "seed_stream"):  # the chain's random stream, not the stage's (tests/test_chain.py)
            continue
        for value in TRACED:
            tokens, processed = step({**base, param: jnp.full((B,), value).astype(base[param].dtype)})
            check_contract(processed)  # forced stages may pick a token removed in the input
            check_contract(np.asarray(tokens), logits=processed)


# -------------------------------------------------------------------------------------- builders
BUILDERS = {"llama_cpp": presets.llama_cpp, "vllm": presets.vllm, "hf": presets.hf}
BUILDER_BASE = {"hf": dict(do_sample=True)}


def _scalar_fields(builder) -> list[tuple[str, str]]:
    out = []
    for p in inspect.signature(builder).parameters.values():
        options = {a.strip() for a in str(p.annotation).split("|")} - {"None"}
        if options in ({"float"}, {"int"}):
            out.append((p.name, options.pop()))
    return out


BUILDER_FIELDS = [(b, f, t) for b in BUILDERS for f, t in _scalar_fields(BUILDERS[b])]


@pytest.mark.parametrize("builder,field,kind", BUILDER_FIELDS, ids=[f"{b}.{f}" for b, f, _ in BUILDER_FIELDS])
def test_builder_fields_are_checked_by_the_users_name(builder, field, kind):
    build = BUILDERS[builder]
    bad = [float("nan"), float("inf"), float("-inf"), "0.5", True]
    bad += [2**31, 2**63, 1.5] if kind == "int" else []
    for value in bad + [2**63]:  # a huge float is finite: an error naming the field, or a preset
        try:
            build(**{**BUILDER_BASE.get(builder, {}), field: value})
        except ValueError as err:
            assert str(err).lstrip("`").startswith(field), err
        else:
            assert value not in bad, f"{field}={value!r} accepted"


def test_builder_messages_use_llama_cpp_names_and_check_bias():
    with pytest.raises(ValueError, match="^typ_p must be >= 0"):
        presets.llama_cpp(typ_p=-0.5)
    with pytest.raises(ValueError, match=r"^logit_bias\[5\] must be a finite number"):
        presets.vllm(logit_bias={5: float("nan")})
    assert presets.vllm(logit_bias={5: float("inf")}).values["logit_bias_values"] == [100.0]
    with pytest.raises(ValueError, match="candidates must be >= 1"):
        presets.vllm(candidates=0)


# --------------------------------------------------------------------------------------- configs
def _config_kinds():
    from jaxsample.evaluation import configs as ec
    from jaxsample.jobs import train as train_job
    from wakong import config as wc

    return {  # kind -> (dataclass, minimal valid mapping)
        "decoding": (ec.DecodingConfig, {"strategy": "group_beam", "num_beams": 4}),
        "eval": (ec.EvalConfig, {"checkpoint": "ckpt"}),
        "train": (train_job.TrainJobConfig, {}),
        "wakong.build": (wc.BuildConfig, {}),
    }


def _numeric_paths(cls, prefix=()):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _numeric_paths(hint, prefix + (f.name,))
            continue
        options = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
        if options in ({int}, {float}):
            yield prefix + (f.name,), options.pop()


CONFIG_FIELDS = [(k, path, t) for k, (cls, _) in _config_kinds().items() for path, t in _numeric_paths(cls)]


def _nested(path, value, base):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return data


@pytest.mark.parametrize("kind,path,typ", CONFIG_FIELDS, ids=[f"{k}:{'.'.join(p)}" for k, p, _ in CONFIG_FIELDS])
def test_config_fields_reject_non_finite_and_ill_typed_values(kind, path, typ):
    cls, base = _config_kinds()[kind]
    bad = [float("nan"), float("inf"), float("-inf"), "1", True] + ([2**63, 1.5] if typ is int else [])
    for value in bad + [2**63]:
        try:
            _config.build(cls, _nested(path, value, base))
        except ValueError as err:
            assert path[-1] in str(err), err
        else:
            assert value not in bad, f"{'.'.join(path)}={value!r} accepted"


def _model_fields():
    from jaxsample.models.configs import BartConfig, DecoderConfig

    return [(cls.arch, f.name) for cls in (BartConfig, DecoderConfig) for f in dataclasses.fields(cls)
            if f.type in ("int", "float")]


MODEL_FIELDS = _model_fields()


@pytest.mark.parametrize("arch,field", MODEL_FIELDS, ids=[f"{a}.{f}" for a, f in MODEL_FIELDS])
def test_model_config_fields_reject_non_finite_and_ill_typed_values(arch, field):
    from jaxsample.models import get_config

    bad = [float("nan"), float("inf"), float("-inf"), "1", True]
    for value in bad + [2**63]:
        try:
            get_config(arch, "tiny", **{field: value})
        except ValueError as err:
            assert field in str(err), err
        else:
            assert value not in bad, f"{field}={value!r} accepted"


def test_config_headers_and_flags_are_typed(tmp_path):
    from jaxsample.evaluation import configs as ec

    path = tmp_path / "s.yaml"
    path.write_text("version: true\nkind: sampler\necosystem: vllm\n")
    with pytest.raises(ValueError, match="version True is not supported"):
        ec.load_sampler(str(path))
    with pytest.raises(ValueError, match="early_stopping"):
        ec.DecodingConfig(strategy="beam", early_stopping=0)
    path.write_text("version: 1\nkind: sampler\necosystem: llama.cpp\nsettings: {temp: '0.7'}\n")
    with pytest.raises(ValueError, match="settings.temp must be a finite number"):
        ec.load_sampler(str(path))
