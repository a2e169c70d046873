"""Exactness against HuggingFace ``generate`` on a deterministic bigram model (skipped without torch).

The same ``[V, V]`` logits table drives a tiny torch ``PreTrainedModel`` (logits of every position =
``table[token]``) and :data:`jaxsample.decoding.BIGRAM`, so greedy, beam search and group beam
search must return the same tokens (and beam scores) as ``transformers``' own implementations.
Group beam search is compared only with transformers < 4.56 (later versions moved it to the Hub).
"""

import functools
import importlib.metadata

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample.decoding import BIGRAM, beam_search, generate, group_beam_search

V = 10
EOS = 3
PAD = V - 1  # a token the tables make impossible, so padding is never mistaken for a generated token


@functools.cache
def _torch_bigram():
    """torch and the bigram ``PreTrainedModel`` class, built by the worker that runs these tests (importing
    torch and transformers at collection cost every xdist worker ~7 CPU-seconds)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class _BigramConfig(PretrainedConfig):
        model_type = "jaxsample-bigram"

        def __init__(self, vocab_size=V, **kwargs):
            super().__init__(**kwargs)
            self.vocab_size = vocab_size

    class _TorchBigram(PreTrainedModel, GenerationMixin):
        config_class = _BigramConfig

        def __init__(self, config, table):
            super().__init__(config)
            self.table = torch.nn.Parameter(torch.tensor(np.asarray(table)), requires_grad=False)

        def forward(self, input_ids, attention_mask=None, **kwargs):
            return CausalLMOutputWithPast(logits=self.table[input_ids])

        def prepare_inputs_for_generation(self, input_ids, **kwargs):
            return {"input_ids": input_ids}

    return torch, _TorchBigram, _BigramConfig


def _transformers_version():
    try:
        return tuple(int(x) for x in importlib.metadata.version("transformers").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)  # the tests skip in _hf


def _table(seed, scale=1.5):
    table = scale * np.random.default_rng(seed).standard_normal((V, V))
    table[:, PAD] = -30.0
    return table.astype(np.float32)


def _hf(table, prompt, **kwargs):
    torch, model_class, config_class = _torch_bigram()
    model = model_class(config_class(), table).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompt),
            attention_mask=torch.ones(np.shape(prompt), dtype=torch.long),
            use_cache=False,
            pad_token_id=PAD,
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
            **kwargs,
        )
    return out.sequences[:, len(prompt[0]) :].numpy(), out


def _strip(row):
    row = list(row)
    while row and row[-1] == PAD:
        row.pop()
    return row


PROMPTS = np.array([[1, 5, 2], [7, 0, 9], [4, 4, 8]])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eos", [[EOS], [EOS, 6]])
def test_greedy_matches_hf(seed, eos):
    table = _table(seed)
    hf, _ = _hf(table, PROMPTS, max_new_tokens=6, min_new_tokens=2, eos_token_id=eos)
    ours = generate(
        BIGRAM,
        {"logits": jnp.asarray(table)},
        PROMPTS,
        max_new_tokens=6,
        min_new_tokens=2,
        eos_ids=eos,
        pad_id=PAD,
    )
    for b in range(len(PROMPTS)):
        assert list(np.asarray(ours.tokens[b, : int(ours.lengths[b])])) == _strip(hf[b])


BEAM_CASES = [
    # (seed, num_beams, length_penalty, early_stopping, num_return_sequences, max_new_tokens)
    (0, 2, 1.0, False, 1, 6),
    (1, 3, 1.0, False, 3, 7),
    (2, 4, 0.0, True, 2, 6),
    (3, 4, 2.0, "never", 4, 6),
    (4, 3, -0.5, False, 2, 5),
    (5, 5, 1.0, "never", 5, 8),
    (6, 2, 0.7, True, 2, 4),
]


def _beam_rows(ours, r):
    return [
        list(np.asarray(ours.tokens[b, i, : int(ours.lengths[b, i])]))
        for b in range(len(PROMPTS))
        for i in range(r)
    ]


def _assert_same_hypotheses(ours, hf, hf_scores, r, hf_beam_indices=None):
    """Same hypotheses with the same scores per prompt, best first. Bigram sequences that permute the
    same transitions tie exactly; torch.topk orders ties differently from lax.top_k, so hypotheses
    are compared per prompt as lists sorted by (score, tokens). With ``hf_beam_indices`` (HF's
    ``beam_indices``, ``-1`` padded) each hypothesis's beam indices must match too."""
    rows = _beam_rows(ours, r)
    ours_scores = np.asarray(ours.scores).reshape(-1)
    if hf_beam_indices is not None:
        mine_idx = [np.asarray(ours.beam_indices[b, i, : int(ours.lengths[b, i])]).tolist()
                    for b in range(len(PROMPTS)) for i in range(r)]
        theirs_idx = [[int(x) for x in row if x >= 0] for row in hf_beam_indices]
        for b in range(len(PROMPTS)):
            sl = slice(b * r, (b + 1) * r)
            mine = sorted((round(float(s), 4), tuple(t), tuple(i)) for s, t, i in
                          zip(ours_scores[sl], rows[sl], mine_idx[sl]))
            theirs = sorted((round(float(s), 4), tuple(int(t) for t in _strip(row)), tuple(i)) for s, row, i in
                            zip(hf_scores[sl], hf[sl], theirs_idx[sl]))
            assert [m[:2] for m in mine] == [t[:2] for t in theirs]
            # tied hypotheses (same score and tokens) may come from different beams: compare where unique
            unique = [m for m in mine if sum(x[:2] == m[:2] for x in mine) == 1]
            for m in unique:
                assert m in theirs, (m, theirs)
    np.testing.assert_allclose(ours_scores, hf_scores, rtol=1e-5, atol=1e-5)
    for b in range(len(PROMPTS)):
        sl = slice(b * r, (b + 1) * r)
        mine = sorted(
            (round(float(s), 4), tuple(int(t) for t in row)) for s, row in zip(ours_scores[sl], rows[sl])
        )
        theirs = sorted(
            (round(float(s), 4), tuple(int(t) for t in _strip(row))) for s, row in zip(hf_scores[sl], hf[sl])
        )
        assert mine == theirs


@pytest.mark.parametrize("case", BEAM_CASES)
def test_beam_search_matches_hf(case):
    seed, k, lp, early, r, n = case
    table = _table(seed, scale=1.0)
    kw = dict(num_beams=k, length_penalty=lp, early_stopping=early, num_return_sequences=r, max_new_tokens=n)
    hf, out = _hf(table, PROMPTS, eos_token_id=EOS, **kw)
    ours = beam_search(BIGRAM, {"logits": jnp.asarray(table)}, PROMPTS, eos_ids=EOS, pad_id=PAD, **kw)
    # beam_indices name beam slots; in case 5 running beams tie exactly (bigram paths permuting the same
    # transitions) and torch.topk orders ties differently from lax.top_k, so slots differ there
    idx = out.beam_indices.numpy() if seed != 5 else None
    _assert_same_hypotheses(ours, hf, out.sequences_scores.numpy(), r, idx)


@pytest.mark.parametrize("seed", [7, 8])
def test_beam_search_with_two_eos_ids_and_min_new_tokens_matches_hf(seed):
    # two EOS ids: (1 + 2) * K candidates per step; min_new_tokens masks both on the log-probs
    table = _table(seed, scale=1.0)
    kw = dict(num_beams=3, num_return_sequences=3, max_new_tokens=6, length_penalty=1.0)
    hf, out = _hf(table, PROMPTS, eos_token_id=[EOS, 6], min_new_tokens=2, **kw)
    ours = beam_search(
        BIGRAM, {"logits": jnp.asarray(table)}, PROMPTS, eos_ids=[EOS, 6], min_new_tokens=2, pad_id=PAD, **kw
    )
    _assert_same_hypotheses(ours, hf, out.sequences_scores.numpy(), 3)


@pytest.mark.skipif(
    _transformers_version() >= (4, 56),
    reason="group beam search left transformers' tree in 4.56 (Hub custom_generate)",
)
@pytest.mark.parametrize(
    "case",
    [
        # (seed, num_beams, groups, diversity, length_penalty, early_stopping, num_return, max_new_tokens)
        (0, 4, 2, 1.0, 1.0, False, 2, 6),
        (1, 6, 3, 0.5, 1.0, True, 3, 6),
        (2, 4, 4, 2.0, 0.0, "never", 4, 5),
        (3, 6, 2, 0.3, 2.0, False, 6, 7),
    ],
)
def test_group_beam_search_matches_hf(case):
    seed, k, g, div, lp, early, r, n = case
    table = _table(seed, scale=1.0)
    kw = dict(
        num_beams=k, num_beam_groups=g, diversity_penalty=div, length_penalty=lp, early_stopping=early,
        num_return_sequences=r, max_new_tokens=n,
    )
    hf, out = _hf(table, PROMPTS, eos_token_id=EOS, **kw)
    ours = group_beam_search(BIGRAM, {"logits": jnp.asarray(table)}, PROMPTS, eos_ids=EOS, pad_id=PAD, **kw)
    _assert_same_hypotheses(ours, hf, out.sequences_scores.numpy(), r)
