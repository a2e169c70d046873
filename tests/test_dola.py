"""DoLa: HF's candidate-layer rules, the contrast against a NumPy transcription of HF's
``_dola_select_contrast`` / ``_relative_top_filter``, and the decoding loop against a from-scratch
reference on the Flax decoder and BART (early exits through the models' ``apply_step_exits``)."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import presets
from jaxsample.decoding import Model, dola_generate
from jaxsample.decoding.dola import _divergence, candidate_layers, contrast
from jaxsample.models import Bart, DecoderLM
from jaxsample.models.configs import get_config


@pytest.mark.parametrize(
    "spec,n,tied,expected",
    [
        ("low", 1, True, (0,)),
        ("low", 2, True, (1,)),
        ("high", 2, True, (1,)),
        ("low", 4, True, (2,)),  # start == N // 2
        ("low", 12, True, (2, 4)),
        ("low", 12, False, (0, 2, 4)),
        ("high", 12, True, (6, 8, 10)),
        ("high", 7, True, (3, 5)),
        ("low", 48, True, (2, 4, 6, 8, 10, 12, 14, 16, 18)),  # N > 40: range(start, 20, 2)
        ("high", 48, False, (28, 30, 32, 34, 36, 38, 40, 42, 44, 46)),  # range(N - 20, N, 2)
        ([0, 3, 12, 20], 12, True, (0, 3)),  # indices >= N dropped
    ],
)
def test_candidate_layers_follow_hf(spec, n, tied, expected):
    assert candidate_layers(spec, n, tied) == expected


@pytest.mark.parametrize("spec", ["middle", [-1], [12], None])
def test_candidate_layers_errors(spec):
    with pytest.raises(ValueError, match="dola_layers"):
        candidate_layers(spec, 12, True)
    with pytest.raises(ValueError, match="selects no layer"):  # HF would fail on an empty stack
        candidate_layers("low", 3, True)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _hf_contrast(final, layers, relative_top=0.1):
    """HF's algorithm for one row: final [V], layers [J, V] (batch of one)."""
    p_final = np.exp(_log_softmax(final))
    p_layers = np.exp(_log_softmax(layers))
    avg = 0.5 * (p_final[None] + p_layers)
    kl1 = (avg * (np.log(avg) - _log_softmax(final)[None])).mean(-1)
    kl2 = (avg * (np.log(avg) - _log_softmax(layers))).mean(-1)
    base = layers[int(np.argmax(0.5 * (kl1 + kl2)))]
    s, b = _log_softmax(final), _log_softmax(base)
    thresh = min(s.max(), s.max() + np.log(relative_top))
    b = np.where(s < thresh, -1e-3, b)
    s = np.where(s < thresh, -np.inf, s)
    return s - b


_contrast = jax.jit(contrast)


def test_contrast_matches_hf_per_row():
    rng = np.random.default_rng(0)
    final = rng.standard_normal((3, 20)) * 2
    layers = rng.standard_normal((3, 4, 20)) * 2
    rt = np.array([0.1, 0.5, 1.0])
    got = np.asarray(_contrast(final, layers, rt))
    for b in range(3):
        np.testing.assert_allclose(got[b], _hf_contrast(final[b], layers[b], rt[b]), rtol=1e-5, atol=1e-5)
    # a single candidate is contrasted directly (HF's shortcut), and the choice is per row
    one = np.asarray(_contrast(final, layers[:, 2:3], np.full(3, 0.1)))
    np.testing.assert_allclose(one[1], _hf_contrast(final[1], layers[1, 2:3]), rtol=1e-5, atol=1e-5)


def test_contrast_picks_the_most_divergent_layer_by_hand():
    final = np.log([0.5, 0.4, 0.1])
    near, far = np.log([0.5, 0.3, 0.2]), np.log([0.1, 0.1, 0.8])
    got = np.asarray(_contrast(final, np.stack([near, far]), 0.1))
    np.testing.assert_allclose(got, np.log([0.5, 0.4, 0.1]) - np.log([0.1, 0.1, 0.8]), rtol=1e-6)


LM = DecoderLM(get_config("decoder", "tiny", vocab_size=40, d_model=16, d_ff=32, num_layers=6, num_heads=2))


@functools.cache
def lm_params():
    return jax.jit(LM.init)(jax.random.key(3))


DOLA_MODEL = Model(LM.apply_step, LM.init_cache, LM.early_exit)
_WIDTH = 12


@functools.partial(jax.jit, static_argnums=2)
def _exits(tokens, length, layers):
    """Early exits at the last of ``length`` tokens of ``tokens [W]``, recomputed from scratch (no cache reuse)."""
    pos = jnp.where(jnp.arange(_WIDTH) < length, jnp.arange(_WIDTH), -1)
    o = LM.apply_step_exits(lm_params(), tokens[None], pos[None], LM.init_cache(1, _WIDTH), layers)
    return o.logits[0, length - 1], o.layer_logits[0, length - 1]


def _last_exits(seq, layers):
    final, early = _exits(jnp.asarray(seq + [0] * (_WIDTH - len(seq))), len(seq), layers)
    return np.asarray(final), np.asarray(early)


def _reference_greedy(prompt, layers, n, relative_top=0.1, penalty=1.0):
    """HF's loop: contrast, HF repetition penalty, argmax."""
    seq, out = list(prompt), []
    for _ in range(n):
        x = _hf_contrast(*_last_exits(seq, layers), relative_top)
        for t in set(seq):
            x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
        tok = int(np.argmax(x))
        seq.append(tok)
        out.append(tok)
    return out


def test_greedy_matches_reference():
    prompts = [[5, 6, 7], [9]]
    padded = np.array([[5, 6, 7], [9, -1, -1]])
    with pytest.warns(UserWarning, match="repetition_penalty"):
        out = dola_generate(DOLA_MODEL, lm_params(), padded, dola_layers="high", max_new_tokens=5)
    for b, p in enumerate(prompts):
        assert np.asarray(out.tokens[b]).tolist() == _reference_greedy(p, (3, 5), 5)


def test_preset_with_repetition_penalty_matches_reference_without_warning():
    p = presets.hf(dola_layers="high", repetition_penalty=1.2)
    assert p.strategy == {"dola_layers": "high"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dola_generate(
            DOLA_MODEL, lm_params(), [[5, 6, 7]], max_new_tokens=6, sampler=p.sampler,
            sampler_params=p.params((1,)), **p.strategy,
        )
    assert np.asarray(out.tokens[0]).tolist() == _reference_greedy([5, 6, 7], (3, 5), 6, penalty=1.2)
    with pytest.raises(ValueError, match="dola_layers"):
        presets.hf(dola_layers="high", force_words_ids=[[1]], repetition_penalty=1.2)
    with pytest.warns(UserWarning, match="recommended value for DoLa"):
        presets.hf(dola_layers="low")


def test_sampling_is_seeded_and_stays_in_the_relative_top():
    p = presets.hf(dola_layers="high", do_sample=True, top_k=0, repetition_penalty=1.2)
    run = lambda seed, rt: dola_generate(  # noqa: E731
        DOLA_MODEL, lm_params(), [[5, 6, 7]] * 4, max_new_tokens=1, relative_top=rt, sampler=p.sampler,
        sampler_params=p.params((4,), seed=np.array(seed)), **p.strategy,
    ).tokens[:, 0]
    a, b = run([1, 2, 3, 4], 0.3), run([1, 2, 3, 4], 0.3)
    np.testing.assert_array_equal(a, b)
    exits = _last_exits([5, 6, 7], (3, 5))
    allowed = np.isfinite(_hf_contrast(*exits, 0.3))
    draws = np.asarray(run(list(range(4)), 0.3))
    assert allowed[draws].all()
    only = np.flatnonzero(np.isfinite(_hf_contrast(*exits, 1.0)))
    np.testing.assert_array_equal(np.asarray(run(list(range(4)), 1.0)), np.full(4, only[0]))  # rt = 1: the argmax


_TRACES = []


def _counting_exits(params, tokens, positions, cache, layers):
    _TRACES.append(1)
    return LM.apply_step_exits(params, tokens, positions, cache, layers)


def test_new_relative_top_never_recompiles():
    from jaxsample.decoding import EarlyExit

    model = Model(LM.apply_step, LM.init_cache, EarlyExit(6, True, _counting_exits))
    counts = []
    for rt in ([0.1, 0.2], [0.5, 1.0], [0.05, 0.3]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jax.block_until_ready(dola_generate(model, lm_params(), [[1, 2], [3, 4]], dola_layers="high",
                                                relative_top=jnp.array(rt), max_new_tokens=3))
        counts.append(len(_TRACES))
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]


def test_encoder_decoder_one_step_matches_reference():
    bart = Bart(get_config("bart", "tiny", vocab_size=40, d_model=16, d_ff=32, encoder_layers=1, decoder_layers=4,
                           num_heads=2))
    params = jax.jit(bart.init)(jax.random.key(1))
    cache = jax.jit(bart.encode, static_argnums=3)(params, jnp.array([[0, 9, 12, 2]]), None, 8)
    start = bart.config.decoder_start_id
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = dola_generate(Model(bart.apply_step, None, bart.early_exit), params, [[start]], dola_layers="high",
                            max_new_tokens=1, cache=cache)
    o = jax.jit(bart.apply_step_exits, static_argnums=4)(params, jnp.array([[start]]), jnp.array([[0]]), cache, (2,))
    want = int(np.argmax(_hf_contrast(np.asarray(o.logits[0, 0]), np.asarray(o.layer_logits[0, 0]))))
    assert int(out.tokens[0, 0]) == want


def test_errors():
    with pytest.raises(ValueError, match="early_exit"):
        dola_generate(Model(LM.apply_step, LM.init_cache), lm_params(), [[1]], dola_layers="high", max_new_tokens=1)
    with pytest.raises(ValueError, match="relative_top"):
        dola_generate(DOLA_MODEL, lm_params(), [[1]], dola_layers="high", relative_top=0.0, max_new_tokens=1)
    with pytest.raises(ValueError, match="exits"):
        LM.apply_step_exits(lm_params(), jnp.array([[1]]), jnp.array([[0]]), LM.init_cache(1, 4), (7,))



def test_layer_divergence_is_the_same_alone_and_in_a_batch():
    # The divergence that picks the layer is a mean over the vocabulary: through _math.row_sum it
    # sums in one order in every batch size (jnp.mean's changed with the shape: 63 of 64 rows
    # differed alone and in the batch at V = 1000), so a row's layer never depends on its neighbours.
    rng = np.random.default_rng(7)
    b, j, v = 64, 3, 1000
    final = jax.nn.log_softmax(jnp.asarray(rng.normal(0, 3, (b, v)), jnp.float32))
    early = jax.nn.log_softmax(jnp.asarray(rng.normal(0, 3, (b, j, v)), jnp.float32))
    divergence = jax.jit(_divergence)
    batch = np.asarray(divergence(final, early))
    for i in range(0, b, 7):
        np.testing.assert_array_equal(np.asarray(divergence(final[i : i + 1], early[i : i + 1]))[0], batch[i])
