"""jaxsample's BART on packed rows (segment ids) and the ``train`` job noising tokenized documents on
the device, resumed exactly from its orbax checkpoint."""

import jax
import numpy as np
import pytest

from jaxsample.evaluation import data as _data
from jaxsample.evaluation.configs import DatasetConfig
from jaxsample.jobs import train as train_job
from jaxsample.models import Bart, get_config
from jaxsample.models import train as T
from jaxsample.models.train import TrainConfig
from wakong import features as F

SMALL = dict(vocab_size=96, d_model=32, num_heads=2, d_ff=64, max_len=32, encoder_layers=1, decoder_layers=2,
             dropout_rate=0.0, attention_dropout_rate=0.0)


def _rows(examples, s, t, packed):
    """Canonical rows: one example per row, or all of them in one packed row."""
    groups = [examples] if packed else [[e] for e in examples]
    rows = {k: np.zeros((len(groups), n), np.int32) for k, n in
            (("source", s), ("source_segments", s), ("source_positions", s),
             ("target", t), ("target_segments", t), ("target_positions", t))}
    for r, group in enumerate(groups):
        at = {"source": 0, "target": 0}
        for seg, pair in enumerate(group, start=1):
            for side, ids in zip(("source", "target"), pair):
                n = len(ids)
                rows[side][r, at[side] : at[side] + n] = ids
                rows[f"{side}_segments"][r, at[side] : at[side] + n] = seg
                rows[f"{side}_positions"][r, at[side] : at[side] + n] = np.arange(n)
                at[side] += n
    return rows


def test_packed_rows_train_like_separate_rows():
    model = Bart(get_config("bart", "tiny", **SMALL))
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    examples = [(rng.integers(5, 90, rng.integers(2, 8)), rng.integers(5, 90, rng.integers(2, 9))) for _ in range(3)]
    ids = dict(pad_id=model.config.pad_id, decoder_start_id=model.config.decoder_start_id)
    separate = F.layout(_rows(examples, 24, 28, False), "hf", packed=False, **ids)
    packed = F.layout(_rows(examples, 24, 28, True), "hf", packed=True, **ids)
    loss_a, m_a = T.bart_loss(model, params, separate)
    loss_b, m_b = T.bart_loss(model, params, packed)
    assert float(m_a["tokens"]) == float(m_b["tokens"]) == sum(len(e[1]) for e in examples)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=2e-5)
    # Token by token: each packed example's logits are its own row's logits (no attention across examples).
    out_a = model(params, separate["input_ids"], separate["attention_mask"], separate["decoder_input_ids"]).logits
    positions = np.where(packed["decoder_segment_ids"] > 0, packed["decoder_position_ids"], -1)
    out_b = model(params, packed["input_ids"], packed["attention_mask"], packed["decoder_input_ids"], positions,
                  encoder_positions=packed["position_ids"], encoder_segment_ids=packed["segment_ids"],
                  decoder_segment_ids=packed["decoder_segment_ids"]).logits
    for seg, (_, labels) in enumerate(examples, start=1):
        np.testing.assert_allclose(np.asarray(out_b[0])[packed["decoder_segment_ids"][0] == seg],
                                   np.asarray(out_a[seg - 1])[: len(labels)], atol=2e-5)
    with pytest.raises(ValueError, match="packed BART"):
        T.bart_loss(model, params, {k: v for k, v in packed.items() if k != "position_ids"})


MODEL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1, "max_len": 64,
         "dropout_rate": 0.0, "attention_dropout_rate": 0.0}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """The demo's pydoc training set built as tokenized documents."""
    spec = DatasetConfig(path=str(tmp_path_factory.mktemp("docs") / "train"), corpus="pydoc", build="demo",
                         build_set=("output.mode=tokenized",), split="train")
    _data.prepare(spec)
    return spec


def _job(out, data, steps, **over):
    base = dict(out=str(out), seed=2, data=data, batch_size=8, checkpoint_every=3, noising="device",
                model=train_job.ModelSection(overrides=MODEL),
                train=TrainConfig(num_steps=steps, learning_rate=3e-3, warmup_steps=2, log_every=1))
    return train_job.TrainJobConfig(**{**base, **over})


QUIET = dict(progress=False, log=lambda _: None)


def test_train_job_noises_tokenized_documents_on_the_device(tmp_path, documents):
    run = train_job.run(_job(tmp_path / "run", documents, 3), **QUIET)
    assert len(run.history["loss"]) == 3 and np.isfinite(run.history["loss"]).all()
    assert min(run.history["tokens"]) > 0
    with pytest.raises(ValueError, match="tokenized documents"):  # no stored masks to read on the host
        train_job.run(_job(tmp_path / "host", documents, 3, noising="host", renoise=False), **QUIET)
    with pytest.raises(ValueError, match="noising must be host or device"):
        _job(tmp_path, documents, 2, noising="tpu")


@pytest.mark.slow
def test_train_job_with_device_noising_resumes_exactly(tmp_path, documents):
    full = train_job.run(_job(tmp_path / "full", documents, 6), **QUIET)
    train_job.run(_job(tmp_path / "cut", documents, 3), **QUIET)  # stops after the step-3 checkpoint
    resumed = train_job.run(_job(tmp_path / "cut", documents, 6), **QUIET)
    np.testing.assert_allclose(resumed.history["loss"], full.history["loss"], rtol=1e-5)
