"""One generate: HF-style dispatch, DecodingOptions, padding conventions, no recompiles for per-request
values, beam_indices, data-parallel decoding over a mesh (8 simulated CPU devices in a subprocess)."""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample import chain, stages
from jaxsample.decoding import (
    BIGRAM,
    BeamOutput,
    DecodingOptions,
    RankedOutput,
    TinyDecoder,
    beam_search,
    contrastive_search,
    generate,
    sample_and_rank,
)
from tests._devices import eight_devices
from tests._helpers import counting_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = TinyDecoder(vocab_size=13, d_model=16, num_layers=1, num_heads=2)


@functools.cache
def net_params():
    return jax.jit(NET.init_params)(jax.random.key(4), scale=3.0)


V = 7
TABLE = {"logits": jnp.asarray(np.random.default_rng(1).standard_normal((V, V)).astype(np.float32) * 2.0)}
SAMPLER = chain(stages.temperature(1.0), select=stages.categorical())


def _rows(out):
    return [np.asarray(out.tokens[b, : int(out.lengths[b])]).tolist() for b in range(out.tokens.shape[0])]


# ------------------------------------------------------------------------------------------ padding
LEFT = np.array([[-1, -1, 3, 4], [5, 6, 7, 8], [-1, 2, 9, 1]])
ALONE = [[3, 4], [5, 6, 7, 8], [2, 9, 1]]


def test_left_padded_batch_equals_each_row_alone_greedy_and_beam():
    kw = dict(max_new_tokens=4, eos_ids=0)
    # each row alone: batch 1, right-padded to the same width (one compilation for the three rows)
    solo = [[p + [-1] * (4 - len(p))] for p in ALONE]
    alone = [_rows(generate(NET.model, net_params(), p, **kw))[0] for p in solo]
    assert _rows(generate(NET.model, net_params(), LEFT, **kw)) == alone
    hf_ids = np.where(LEFT < 0, 0, LEFT)  # HF: pad id 0 under an attention mask
    assert _rows(generate(NET.model, net_params(), hf_ids, attention_mask=LEFT >= 0, **kw)) == alone
    beams = beam_search(NET.model, net_params(), hf_ids, attention_mask=(LEFT >= 0).astype(int), num_beams=3, **kw)
    for b, p in enumerate(solo):
        one = beam_search(NET.model, net_params(), p, num_beams=3, **kw)
        np.testing.assert_array_equal(beams.tokens[b], one.tokens[0])
        np.testing.assert_allclose(beams.scores[b], one.scores[0], rtol=1e-5)


@pytest.mark.parametrize(
    "prompt,mask,match",
    [
        ([[-1, 3, -1]], None, "both sides"),
        ([[3, -1, 4]], None, "between its tokens"),
        ([[0, 3, 0]], [[0, 1, 0]], "both sides"),
        ([[3, 4]], [[1, 2]], "0 \\(padding\\) and 1"),
        ([[3, 4]], [[1]], "shape"),
        ([[-1, 4]], [[1, 1]], "-1 entries"),
        ([[0, 0]], [[0, 0]], "at least one token"),
    ],
)
def test_ambiguous_padding_is_a_value_error(prompt, mask, match):
    with pytest.raises(ValueError, match=match):
        generate(BIGRAM, TABLE, prompt, attention_mask=mask, max_new_tokens=2)


def test_explicit_pad_id_leading_some_rows_without_a_mask_is_ambiguous():
    with pytest.raises(ValueError, match="row 0 starts with pad_id=0"):
        generate(BIGRAM, TABLE, [[0, 0, 3], [4, 5, 6]], pad_id=0, max_new_tokens=2)
    ok = generate(BIGRAM, TABLE, [[0, 0, 3], [4, 5, 6]], pad_id=0, attention_mask=[[0, 0, 1], [1, 1, 1]], max_new_tokens=2)
    assert _rows(ok) == [_rows(generate(BIGRAM, TABLE, [[3]], max_new_tokens=2))[0],
                         _rows(generate(BIGRAM, TABLE, [[4, 5, 6]], max_new_tokens=2))[0]]


def test_prompt_lengths_and_attention_mask_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        generate(BIGRAM, TABLE, [[1, 2]], [2], attention_mask=[[1, 1]], max_new_tokens=2)


# ------------------------------------------------------------------------------ one generate, options
def test_generate_dispatches_like_hf():
    prompt = jnp.array([[1, 2], [3, -1]])
    kw = dict(max_new_tokens=4, eos_ids=0)
    greedy = generate(BIGRAM, TABLE, prompt, num_beams=1, **kw)
    assert _rows(greedy) == _rows(generate(BIGRAM, TABLE, prompt, **kw))
    beams = generate(BIGRAM, TABLE, prompt, num_beams=3, num_return_sequences=2, length_penalty=0.5, **kw)
    ref = beam_search(BIGRAM, TABLE, prompt, num_beams=3, num_return_sequences=2, length_penalty=0.5, **kw)
    assert isinstance(beams, BeamOutput)
    np.testing.assert_array_equal(beams.tokens, ref.tokens)
    groups = generate(BIGRAM, TABLE, prompt, num_beams=4, num_beam_groups=2, diversity_penalty=1.0, **kw)
    assert groups.tokens.shape == (2, 1, 4)
    hid = {"logits": TABLE["logits"], "hidden": jnp.eye(V)}
    con = generate(BIGRAM, hid, prompt, penalty_alpha=0.6, top_k=3, **kw)
    np.testing.assert_array_equal(con.tokens, contrastive_search(BIGRAM, hid, prompt, penalty_alpha=0.6, top_k=3, **kw).tokens)
    sp = {"seed": jnp.array([3, 4])}
    ranked = generate(BIGRAM, TABLE, prompt, n=2, best_of=3, sampler=SAMPLER, sampler_params=sp, **kw)
    assert isinstance(ranked, RankedOutput)
    np.testing.assert_array_equal(
        ranked.tokens, sample_and_rank(BIGRAM, TABLE, prompt, n=2, best_of=3, sampler=SAMPLER, sampler_params=sp, **kw).tokens
    )
    # do_sample: True without a chain samples plainly; False makes a sampling chain greedy
    sampled = generate(BIGRAM, TABLE, prompt, do_sample=True, sampler_params=sp, **kw)
    assert _rows(sampled) == _rows(generate(BIGRAM, TABLE, prompt, sampler=chain(select=stages.categorical()),
                                            sampler_params=sp, **kw))
    assert _rows(generate(BIGRAM, TABLE, prompt, sampler=SAMPLER, do_sample=False, **kw)) == _rows(greedy)
    hf_samples = generate(BIGRAM, TABLE, prompt, do_sample=True, num_return_sequences=3, sampler_params=sp, **kw)
    assert hf_samples.tokens.shape == (2, 3, 4)


def test_speculative_through_generate():
    out = generate(BIGRAM, TABLE, [[1]], draft_model=BIGRAM, draft_params=TABLE, num_draft_tokens=2, max_new_tokens=5)
    assert _rows(out) == _rows(generate(BIGRAM, TABLE, [[1]], max_new_tokens=5))


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(num_beams=4, num_beam_groups=3), "divisible"),
        (dict(num_beams=2, num_return_sequences=3), "num_return_sequences"),
        (dict(num_beams=2, do_sample=True, num_beam_groups=2), "num_beam_groups"),
        (dict(early_stopping="sometimes"), "early_stopping"),
        (dict(n=3, best_of=2), "best_of"),
        (dict(penalty_alpha=1.5, top_k=3), "penalty_alpha"),
        (dict(num_beams=2, n=2), "n / best_of"),
        (dict(rank_by="luck"), "rank_by"),
        (dict(num_beams=0), "num_beams"),
        (dict(unknown_option=1), "unknown_option"),
    ],
)
def test_options_are_validated_in_one_place(options, match):
    with pytest.raises(ValueError, match=match):
        generate(BIGRAM, TABLE, [[1]], max_new_tokens=2, **options)


def test_hf_mapping_errors_name_the_option():
    with pytest.raises(ValueError, match="top_k"):
        DecodingOptions(max_new_tokens=2, top_k=5).strategy()
    with pytest.raises(ValueError, match="do_sample"):
        DecodingOptions(max_new_tokens=2, num_return_sequences=2).strategy()
    with pytest.raises(ValueError, match="num_return_sequences"):
        beam_search(BIGRAM, TABLE, [[1]], num_beams=1, num_return_sequences=2, max_new_tokens=2)
    opts = DecodingOptions(max_new_tokens=2, num_beams=2)
    assert generate(BIGRAM, TABLE, [[1]], options=opts, num_return_sequences=2).tokens.shape == (1, 2, 2)


# --------------------------------------------------------------------------------------- recompiles
COUNTING, _TRACES = counting_model(BIGRAM)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_pad_id_eos_ids_and_budgets_never_recompile(num_beams):
    counts = []
    for pad, eos, budget in ((0, [1, -1], [3, 4]), (5, [2, 6], [1, 6]), (-3, [-1, -1], [6, 0])):
        out = generate(COUNTING, TABLE, [[1, 2], [3, -1]], num_beams=num_beams, max_new_tokens=jnp.array(budget),
                       max_tokens=6, eos_ids=jnp.array(eos), pad_id=pad, length_penalty=float(pad))
        tokens = np.asarray(out.tokens).reshape(2, -1, 6)
        lengths = np.asarray(out.lengths).reshape(2, -1)
        for b in range(2):
            assert np.all(tokens[b, :, lengths[b].max():] == pad)
        counts.append(len(_TRACES))
    assert counts[0] > 0 and counts[0] == counts[1] == counts[2]


# ------------------------------------------------------------------------------------- beam_indices
def test_beam_indices_follow_the_parent_rows():
    k = 3
    out = beam_search(BIGRAM, TABLE, [[1, 2], [3, -1]], num_beams=k, num_return_sequences=k, max_new_tokens=5, eos_ids=0)
    for b in range(2):
        for r in range(k):
            n = int(out.lengths[b, r])
            idx = np.asarray(out.beam_indices[b, r])
            assert idx[0] == b * k  # only the first beam is alive at step 0
            assert np.all((idx[:n] >= b * k) & (idx[:n] < (b + 1) * k))
            assert np.all(idx[n:] == -1)


# ------------------------------------------------------------------------------------ data parallel
_MESH_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from jaxsample.decoding import TinyDecoder, beam_search, generate
    assert jax.device_count() == 8
    net = TinyDecoder(vocab_size=13, d_model=16, num_layers=1, num_heads=2)
    params = net.init_params(jax.random.key(4), scale=3.0)
    prompt = np.array([[1 + i % 5, 2, 3 + i % 3, -1][: 3 + i % 2] + [-1] * (1 - i % 2) for i in range(16)])
    mesh = Mesh(np.array(jax.devices()), ("data",))
    ref = generate(net.model, params, prompt, max_new_tokens=5, eos_ids=0)
    got = generate(net.model, params, prompt, max_new_tokens=5, eos_ids=0, mesh=mesh)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    assert len(got.tokens.sharding.device_set) == 8
    assert {s.data.shape for s in got.tokens.addressable_shards} == {(2, 5)}, [s.data.shape for s in got.tokens.addressable_shards]
    sharded = jax.device_put(jnp.asarray(prompt), NamedSharding(mesh, PartitionSpec("data")))
    again = generate(net.model, params, sharded, max_new_tokens=5, eos_ids=0)   # mesh found on the prompt
    np.testing.assert_array_equal(again.tokens, ref.tokens)
    assert {s.data.shape for s in again.tokens.addressable_shards} == {(2, 5)}
    beams = beam_search(net.model, params, prompt, num_beams=2, max_new_tokens=4, mesh=mesh)
    np.testing.assert_array_equal(beams.tokens, beam_search(net.model, params, prompt, num_beams=2, max_new_tokens=4).tokens)
    assert len(beams.tokens.sharding.device_set) == 8
    try:
        generate(net.model, params, prompt[:5], max_new_tokens=2, mesh=mesh)
    except ValueError as e:
        assert "divisible" in str(e)
    else:
        raise AssertionError("no error for 5 rows on 8 devices")
    print("OK")
""")


@pytest.mark.multiprocess
def test_generate_runs_data_parallel_over_a_mesh_of_eight_devices():
    env = eight_devices()
    proc = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
