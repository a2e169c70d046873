"""Models: configs, parameter counts, the decode contract (prefill/step == full forward), cache semantics."""

import dataclasses
import functools
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsample as js
from jaxsample import stages
from jaxsample.models import (
    Bart,
    DecoderLM,
    StepOutput,
    config_from_dict,
    get_config,
    load_config,
    make_model,
    positions_from_mask,
)
from jaxsample.models import layers
from tests._helpers import assert_single_trace

SMALL = dict(vocab_size=97, d_model=32, num_heads=4, d_ff=64, max_len=32)
DEC = DecoderLM(get_config("decoder", "tiny", num_layers=2, **SMALL))
BART = Bart(get_config("bart", "tiny", encoder_layers=2, decoder_layers=2, **SMALL))


@functools.cache
def dec_params():
    return DEC.init(jax.random.key(0))


@functools.cache
def bart_params():
    return BART.init(jax.random.key(1))


L = 16  # decode cache length used throughout

dec_full = jax.jit(DEC.__call__)
dec_step = jax.jit(DEC.apply_step)
bart_full = jax.jit(BART.__call__)
bart_encode = jax.jit(BART.encode, static_argnums=3)
bart_step = jax.jit(BART.apply_step)
ATOL = 2e-5


def _rows(seed, b, n):
    return np.random.default_rng(seed).integers(4, SMALL["vocab_size"], size=(b, n)).astype(np.int32)


# ----------------------------------------------------------------------------------------- configs
def test_named_configs_sizes_and_special_ids():
    base = get_config("bart", "base")
    dims = (base.d_model, base.num_heads, base.d_ff, base.encoder_layers, base.decoder_layers)
    assert dims == (768, 12, 3072, 6, 6)
    assert (base.vocab_size, base.bos_id, base.pad_id, base.eos_id, base.mask_id, base.decoder_start_id) == (
        50265, 0, 1, 2, 50264, 2)
    gpt = get_config("decoder", "base")
    assert (gpt.num_layers, gpt.d_model, gpt.vocab_size, gpt.decoder_start_id) == (12, 768, 50257, gpt.bos_id)
    tiny = get_config("decoder", "tiny", vocab_size=300, pad_id=0)
    assert tiny.mask_id == 299 and tiny.pad_id == 0 and tiny.head_dim == 32
    assert hash(tiny) == hash(get_config("decoder", "tiny", vocab_size=300, pad_id=0))  # jit-static


@pytest.mark.parametrize("overrides, field", [
    (dict(d_model=100, num_heads=3), "divisible"),
    (dict(pad_id=512), "pad_id"),
    (dict(dtype="float16"), "dtype"),
    (dict(dropout_rate=1.0), "dropout_rate"),
    (dict(num_layer=3), "num_layer"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        get_config("decoder", "tiny", **overrides)


def test_config_dict_round_trip_and_unknown_names():
    for arch in ("decoder", "bart"):
        cfg = get_config(arch, "small", dtype="bfloat16")
        assert config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="arch"):
        get_config("gpt", "tiny")
    with pytest.raises(ValueError, match="size"):
        get_config("bart", "huge")


def test_yaml_configs_mirror_configs_py():
    files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "models", "*.yaml")))
    assert len(files) == 6
    for path in files:
        arch, size = os.path.basename(path)[:-5].split("_")
        assert load_config(path) == get_config(arch, size), path


def test_base_parameter_counts_match_bart_base_and_gpt2_small():
    def count(cfg):
        shapes = jax.eval_shape(make_model(cfg).init, jax.random.key(0))
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))

    # facebook/bart-base has 139,420,416 parameters with 1026-row position tables (fairseq offset 2);
    # ours have 1024 rows and a trainable logits bias of V entries.
    assert count(get_config("bart", "base")) == 139_420_416 - 2 * 2 * 768 + 50265
    # GPT-2 small has 124,439,808 parameters including a 1024 x 768 learned position table (RoPE here).
    assert count(get_config("decoder", "base")) == 124_439_808 - 1024 * 768


# --------------------------------------------------------------------------------- step contract
def _check_cache_leaves(cache, b):
    for leaf in jax.tree.leaves(cache):
        assert leaf.shape[0] == b


B, N, S = 3, 10, 8  # canonical shapes (rows, decoder length, encoder length): shared compilations


def test_step_output_shapes_dtypes_and_stable_cache_structure():
    cache = DEC.init_cache(B, L)
    out = dec_step(dec_params(), _rows(0, B, N), np.tile(np.arange(N), (B, 1)), cache)
    assert isinstance(out, StepOutput)
    assert out.logits.shape == (B, N, 97) and out.logits.dtype == jnp.float32
    assert out.hidden.shape == (B, N, 32) and out.hidden.dtype == jnp.float32
    _check_cache_leaves(out.cache, B)
    assert jax.tree.structure(out.cache) == jax.tree.structure(cache)
    spec = lambda tree: jax.tree.map(lambda a: (a.shape, a.dtype), tree)  # noqa: E731
    assert spec(out.cache) == spec(cache)

    bcache = bart_encode(bart_params(), _rows(1, B, S), np.ones((B, S), bool), L)
    bout = bart_step(bart_params(), np.full((B, 1), 2), np.zeros((B, 1), np.int32), bcache)
    assert bout.logits.shape == (B, 1, 97) and bout.hidden.shape == (B, 1, 32)
    _check_cache_leaves(bout.cache, B)
    assert jax.tree.structure(bout.cache) == jax.tree.structure(bcache)
    assert bcache.encoded.shape == (B, S, 32) and bcache.cross[1].k.shape == (B, S, 4, 8)


def _full_positions(lengths):
    return np.where(np.arange(N) < np.asarray(lengths)[:, None], np.arange(N), -1)


def _decode_by_steps(step, params, cache, seqs, lengths, prompt_lengths, chunk=N):
    """Prefill right-padded prompts (in chunks of ``chunk`` columns), then one token per step, ragged rows.

    Returns logits [B, N, V]; row ``r`` is filled below ``lengths[r]``.
    """
    out = np.zeros((B, N, SMALL["vocab_size"]), np.float32)
    plen = np.asarray(prompt_lengths)
    for start in range(0, N, chunk):
        idx = np.arange(start, start + chunk)
        real = idx < plen[:, None]
        res = step(params, np.where(real, seqs[:, idx], 1), np.where(real, idx, -1), cache)
        cache, logits = res.cache, np.asarray(res.logits)
        for r in range(B):
            out[r, idx[real[r]]] = logits[r, real[r]]
    cur = plen.copy()
    while (cur < np.asarray(lengths)).any():
        active = cur < np.asarray(lengths)
        toks = seqs[np.arange(B), np.minimum(cur, N - 1)][:, None]
        res = step(params, toks, np.where(active, cur, -1)[:, None], cache)
        cache = res.cache
        out[active, cur[active]] = np.asarray(res.logits)[active, 0]
        cur = cur + active
    return out, cache


def _assert_rows_close(got, want, lengths):
    for r, n in enumerate(lengths):
        np.testing.assert_allclose(got[r, :n], want[r, :n], atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("prompt_lengths, chunk", [([3, 5, 1], N), ([4, 2, 9], 5), ([1, 1, 1], N)])
def test_decoder_prefill_and_steps_equal_full_forward(prompt_lengths, chunk):
    lengths = [9, 7, 10]
    seqs = _rows(2, B, N)
    full = np.asarray(dec_full(dec_params(), seqs, _full_positions(lengths)).logits)
    got, cache = _decode_by_steps(dec_step, dec_params(), DEC.init_cache(B, L), seqs, lengths, prompt_lengths, chunk)
    _assert_rows_close(got, full, lengths)
    np.testing.assert_array_equal(cache.written, np.arange(L) < np.array(lengths)[:, None])


def _bart_prefill_and_steps_equal_full_forward(model, params, full_fn, encode_fn, step_fn):
    src, src_mask = _rows(3, B, S), np.arange(S) < np.array([[5], [8], [2]])
    lengths = [6, 10, 3]
    dec = _rows(4, B, N)
    dec[:, 0] = model.config.decoder_start_id
    inputs = (src, src_mask, dec, _full_positions(lengths))
    full = np.asarray(full_fn(params, *inputs).logits)
    cache = encode_fn(params, src, src_mask, L)
    got, _ = _decode_by_steps(step_fn, params, cache, dec, lengths, [1, 4, 2])
    _assert_rows_close(got, full, lengths)
    return full, inputs, lengths


def test_bart_prefill_and_steps_equal_full_forward_with_ragged_encoder_and_decoder():
    _bart_prefill_and_steps_equal_full_forward(BART, bart_params(), bart_full, bart_encode, bart_step)


def test_pre_layer_norm_bart_mbart_variant():
    model = Bart(dataclasses.replace(BART.config, norm_first=True))
    params = model.init(jax.random.key(1))
    assert {"encoder_final_norm", "decoder_final_norm"} <= set(params) and not {"encoder_final_norm"} & set(bart_params())
    full, inputs, lengths = _bart_prefill_and_steps_equal_full_forward(
        model, params, jax.jit(model.__call__), jax.jit(model.encode, static_argnums=3), jax.jit(model.apply_step))
    shared = {k: v for k, v in params.items() if not k.endswith("final_norm")}  # same weights, post-LN order
    post = np.asarray(bart_full(shared, *inputs).logits)
    real = lambda x: np.concatenate([x[r, :n] for r, n in enumerate(lengths)])  # noqa: E731  (no padded positions)
    assert np.isfinite(full).all() and not np.allclose(real(post), real(full), rtol=1e-2, atol=0)


def test_padding_never_changes_a_row():
    """Left padding, interleaved padding and encoder padding are invisible to the real tokens."""
    seqs = _rows(5, B, N)
    ref = np.asarray(dec_full(dec_params(), seqs, _full_positions([6, 6, 6])).logits)[0, :6]
    pos = np.array([-1, 0, 1, -1, -1, 2, 3, 4, 5, -1])
    toks = seqs.copy()
    toks[0, pos >= 0] = seqs[0, :6]
    toks[0, pos < 0] = 1
    positions = np.stack([pos, np.arange(N), np.arange(N)])
    got = np.asarray(dec_full(dec_params(), toks, positions).logits)[0]
    np.testing.assert_allclose(got[pos >= 0], ref, atol=ATOL)
    res = dec_step(dec_params(), toks, positions, DEC.init_cache(B, L))
    np.testing.assert_allclose(np.asarray(res.logits)[0, pos >= 0], ref, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(res.cache.written)[0], np.arange(L) < 6)

    src, dec = _rows(6, B, S), _rows(7, B, N)
    src[1, :4] = src[0, :4]
    dec[1] = dec[0]
    mask = np.arange(S) < np.array([[4], [7], [8]])
    src[1, 4:] = 1  # row 1 = row 0 + 3 padding tokens (masked) + 1 more masked slot
    mask[1] = np.arange(S) < 4
    logits = np.asarray(bart_full(bart_params(), src, mask, dec).logits)
    np.testing.assert_allclose(logits[1], logits[0], atol=ATOL)


def test_rotary_positions_are_relative():
    """With RoPE, shifting every position of a row by a constant leaves the decoder's logits unchanged."""
    seqs = _rows(20, B, N)
    ref = dec_full(dec_params(), seqs).logits
    shifted = dec_full(dec_params(), seqs, np.arange(N) + np.array([[0], [7], [21]])).logits
    np.testing.assert_allclose(shifted, ref, atol=1e-4)


def test_rows_are_independent_and_cache_rows_gather():
    seqs = _rows(7, B, N)
    pos = np.tile(np.arange(N), (B, 1))
    batch = dec_step(dec_params(), seqs, pos, DEC.init_cache(B, L))
    perm = np.array([1, 2, 0])
    moved = dec_step(dec_params(), seqs[perm], pos, DEC.init_cache(B, L))
    np.testing.assert_allclose(moved.logits, batch.logits[perm], atol=ATOL)
    # Reordering rows of the cache with x[idx] (beam search) == stepping the original rows.
    idx = np.array([2, 0, 0])
    nxt = _rows(8, B, 1)
    got = dec_step(dec_params(), nxt, np.full((B, 1), N), jax.tree.map(lambda x: x[idx], batch.cache)).logits
    for i in range(B):
        ref = dec_step(dec_params(), np.full((B, 1), nxt[i, 0]), np.full((B, 1), N), batch.cache).logits
        np.testing.assert_allclose(got[i], ref[idx[i]], atol=ATOL)


def test_rewinding_a_row_ignores_stale_slots():
    """Re-feeding position 3 after decoding up to 9 equals decoding the new prefix from scratch."""
    seqs = _rows(9, B, N)
    cache = dec_step(dec_params(), seqs, np.tile(np.arange(N), (B, 1)), DEC.init_cache(B, L)).cache
    new_tok = (seqs[:, 3:4] + 1) % SMALL["vocab_size"]
    rewound = dec_step(dec_params(), new_tok, np.full((B, 1), 3), cache).logits
    fresh = seqs.copy()
    fresh[:, 3] = new_tok[:, 0]
    ref = dec_full(dec_params(), fresh, _full_positions([4] * B)).logits[:, 3:4]
    np.testing.assert_allclose(rewound, ref, atol=ATOL)


def test_positions_beyond_the_cache_are_not_written():
    cache = DEC.init_cache(B, L)
    out = dec_step(dec_params(), _rows(10, B, 1), np.array([[L], [-1], [L + 5]]), cache)
    assert not np.asarray(out.cache.written).any()
    for a, b in zip(jax.tree.leaves(out.cache.layers), jax.tree.leaves(cache.layers)):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(np.asarray(out.logits)).all()


def test_new_positions_do_not_retrace():
    cache = DEC.init_cache(B, L)
    toks = _rows(11, B, 1)
    calls = [(dec_params(), toks, np.array(p)[:, None], cache) for p in [(0, 3, 1), (5, -1, 2), (15, 2, 0)]]
    assert_single_trace(DEC.apply_step, calls)


def test_bfloat16_compute_close_to_float32():
    low = make_model(dataclasses.replace(BART.config, dtype="bfloat16"))
    args = (_rows(13, B, S), np.ones((B, S), bool), _rows(14, B, N))
    ref = bart_full(bart_params(), *args).logits
    out = jax.jit(low.__call__)(bart_params(), *args)
    assert out.logits.dtype == jnp.float32 and out.hidden.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(out.logits - ref))) < 0.05 * float(jnp.max(jnp.abs(ref)))
    cache = jax.eval_shape(lambda p, ids, mask: low.encode(p, ids, mask, L), bart_params(), *args[:2])
    assert cache.decoder.layers[0].k.dtype == jnp.bfloat16 and cache.encoder_mask.dtype == jnp.bool_
    dec = make_model(dataclasses.replace(DEC.config, dtype="bfloat16"))
    assert dec.init_cache(1, L).layers[0].v.dtype == jnp.bfloat16


def test_dropout_needs_a_key_and_is_reproducible():
    drop = DecoderLM(dataclasses.replace(DEC.config, dropout_rate=0.3, attention_dropout_rate=0.1))
    run = jax.jit(lambda params, x, key: drop(params, x, dropout_rng=key).logits)
    x = _rows(15, B, N)
    a, b = run(dec_params(), x, jax.random.key(0)), run(dec_params(), x, jax.random.key(1))
    assert not np.allclose(a, b) and not np.allclose(a, dec_full(dec_params(), x).logits)
    np.testing.assert_array_equal(a, run(dec_params(), x, jax.random.key(0)))


def test_input_validation():
    with pytest.raises(ValueError, match="max_len"):
        DEC.init_cache(1, 33)
    with pytest.raises(ValueError, match="positions"):
        DEC.apply_step(dec_params(), np.zeros((1, 2), np.int32), np.zeros((1, 3), np.int32), DEC.init_cache(1, L))
    with pytest.raises(ValueError, match="batch"):
        DEC.apply_step(dec_params(), np.zeros((2, 1), np.int32), np.zeros((2, 1), np.int32), DEC.init_cache(1, L))
    with pytest.raises(ValueError, match="max_len"):
        BART.encode(bart_params(), np.zeros((1, 40), np.int32), None, L)
    with pytest.raises(TypeError):
        make_model({"arch": "bart"})


def test_positions_from_mask():
    np.testing.assert_array_equal(
        positions_from_mask(np.array([[1, 1, 0], [0, 1, 1]], bool)), [[0, 1, -1], [-1, 0, 1]])


def test_cache_write_helpers():
    w = layers.cache_write(jnp.array([[2, -1, 0]]), 4)
    np.testing.assert_array_equal(w.hit, [[True, False, True, False]])
    cache = jnp.zeros((1, 4, 1, 1))
    new = jnp.array([10.0, 20.0, 30.0]).reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(layers.write(cache, new, w)[0, :, 0, 0], [30.0, 0.0, 10.0, 0.0])
    mask = layers.cache_mask(jnp.array([[1, -1]]), jnp.array([[True, True, True, False]]))
    np.testing.assert_array_equal(mask, [[[True, True, False, False], [False, False, False, False]]])


# ---------------------------------------------------------------------------- sampler integration
def _generate(model, params, sampler, prompt, prompt_len, steps, cache):
    """A minimal jitted decode loop: prefill, then ``steps`` sampled tokens per row (ragged prompts)."""

    @jax.jit
    def run(params, prompt, prompt_len, cache, sp):
        b, p = prompt.shape
        pos = jnp.where(jnp.arange(p) < prompt_len[:, None], jnp.arange(p), -1)
        out = model.apply_step(params, prompt, pos, cache)
        logits = jnp.take_along_axis(out.logits, (prompt_len - 1)[:, None, None], axis=1)[:, 0]
        state = sampler.init(sp, vocab_size=logits.shape[-1], prompt=jnp.where(pos >= 0, prompt, -1))

        def body(i, carry):
            logits, cache, state, tokens = carry
            tok, _, state = sampler.sample(logits, state, sp)
            res = model.apply_step(params, tok[:, None], (prompt_len + i)[:, None], cache)
            return res.logits[:, 0], res.cache, state, tokens.at[:, i].set(tok)

        carry = (logits, out.cache, state, jnp.zeros((b, steps), jnp.int32))
        return jax.lax.fori_loop(0, steps, body, carry)[3]

    return run(params, prompt, prompt_len, cache, sampler.params((prompt.shape[0],), temperature=0.0))


@pytest.mark.parametrize("arch", ["decoder", pytest.param("bart", marks=pytest.mark.slow)])
def test_greedy_generation_with_a_sampler_matches_full_forward(arch):
    sampler = js.chain(stages.temperature(1.0), select=stages.categorical())
    prompt_len = np.array([3, 1])
    if arch == "decoder":
        model, params, prompt = DEC, dec_params(), _rows(17, 2, 3)
        cache = model.init_cache(2, L)
    else:
        model, params = BART, bart_params()
        prompt = np.concatenate([np.full((2, 1), 2), _rows(18, 2, 2)], axis=1)
        src, src_mask = _rows(19, 2, 6), np.arange(6) < np.array([[6], [3]])
        cache = bart_encode(params, src, src_mask, L)
    tokens = np.asarray(_generate(model, params, sampler, prompt, prompt_len, 5, cache))
    for r in range(2):
        seq = np.concatenate([prompt[r, : prompt_len[r]], tokens[r]])[None]
        if arch == "decoder":
            logits = dec_full(params, seq).logits
        else:
            logits = bart_full(params, src[r : r + 1], src_mask[r : r + 1], seq).logits
        want = np.asarray(jnp.argmax(logits[0, prompt_len[r] - 1 : -1], axis=-1))
        np.testing.assert_array_equal(tokens[r], want)
