"""Training: loss alignment and masking, optimizer and schedule, overfitting, determinism, resumption."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxsample.models import Bart, DecoderLM, get_config
from jaxsample.models import checkpoint as ckpt
from jaxsample.models import train as T

SMALL = dict(vocab_size=97, d_model=64, num_heads=4, d_ff=128, max_len=32, dropout_rate=0.1)
# One layer each: the layer stack itself is tested in test_models.py; compiling gradients is what costs here.
LM = DecoderLM(get_config("decoder", "tiny", num_layers=1, **SMALL))
BART = Bart(get_config("bart", "tiny", encoder_layers=1, decoder_layers=1, **SMALL))
STEPS = 60
TC = T.TrainConfig(num_steps=STEPS, warmup_steps=5, learning_rate=1e-2, log_every=10, seed=3)


def _lm_batch(seed):
    x = np.random.default_rng(seed).integers(4, 97, size=(4, 12)).astype(np.int32)
    return {"input_ids": x, "loss_mask": np.ones(x.shape, bool)}


def _bart_batch(seed):
    rng = np.random.default_rng(seed)
    lens = np.array([12, 9, 6, 3])
    labels = np.where(np.arange(12) < lens[:, None] - 1, rng.integers(4, 97, size=(4, 12)), 1)
    labels[np.arange(4), lens - 1] = 2  # EOS ends the labels, then padding
    src_len = np.array([10, 7, 10, 4])
    src = np.where(np.arange(10) < src_len[:, None], rng.integers(4, 97, size=(4, 10)), 1)
    return {
        "input_ids": src.astype(np.int32),
        "attention_mask": np.arange(10) < src_len[:, None],
        "decoder_input_ids": np.asarray(T.shift_right(labels, 2, 1)),
        "labels": labels.astype(np.int32),
        "loss_mask": labels != 1,
    }


@jax.jit
def _bart_loss_and_logits(params, batch):
    logits = BART(params, batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"]).logits
    return T.bart_loss(BART, params, batch), logits


@jax.jit
def _lm_loss_and_logits(params, batch):
    return T.lm_loss(LM, params, batch), LM(params, batch["input_ids"]).logits

LM_BATCHES = [_lm_batch(0), _lm_batch(1)]
BART_BATCHES = [_bart_batch(2), _bart_batch(3)]


def _stream(batches, start=0, stop=None):
    return itertools.islice(itertools.cycle(batches), start, stop)


@pytest.fixture(scope="module")
def lm_run():
    return T.train(LM, LM.init(jax.random.key(0)), _stream(LM_BATCHES), TC)


@pytest.fixture(scope="module")
def bart_run():
    return T.train(BART, BART.init(jax.random.key(0)), _stream(BART_BATCHES), TC)


def _log_softmax_at(logits, targets):
    return np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(targets)[..., None], -1)[..., 0]


# ------------------------------------------------------------------------------------------ losses
def test_masked_cross_entropy_is_token_weighted_mean():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]], [[0.2, 0.2, 0.6], [1 / 3, 1 / 3, 1 / 3]]]))
    targets = jnp.array([[0, 1], [2, 0]])
    mask = jnp.array([[True, True], [True, False]])
    loss, m = T.masked_cross_entropy(logits, targets, mask)
    np.testing.assert_allclose(loss, -(np.log(0.5) + np.log(0.8) + np.log(0.6)) / 3, rtol=1e-6)
    assert float(m["accuracy"]) == 1.0 and float(m["tokens"]) == 3.0
    empty, _ = T.masked_cross_entropy(logits, targets, jnp.zeros((2, 2), bool))
    assert float(empty) == 0.0


def test_shift_right():
    np.testing.assert_array_equal(T.shift_right(np.array([[5, 6, 2, -1]]), 2, 1), [[2, 5, 6, 2]])


def test_bart_loss_scores_each_position_against_its_label_and_ignores_padding():
    params = BART.init(jax.random.key(1))
    batch = BART_BATCHES[0]
    (loss, m), logits = _bart_loss_and_logits(params, batch)
    lp = _log_softmax_at(logits, batch["labels"])
    mask = batch["loss_mask"]
    np.testing.assert_allclose(loss, -lp[mask].mean(), rtol=1e-5)
    assert float(m["tokens"]) == 12 + 9 + 6 + 3  # labels up to and including EOS, nothing after
    # The label after EOS is not trained: changing it does not change the loss (hence its gradient).
    altered = dict(batch, labels=np.where(mask, batch["labels"], 50))
    np.testing.assert_array_equal(_bart_loss_and_logits(params, altered)[0][0], loss)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        T.bart_loss(BART, params, {k: v for k, v in batch.items() if k != "decoder_input_ids"})


def test_lm_loss_predicts_the_next_token_and_handles_left_padding():
    params = LM.init(jax.random.key(2))
    x = LM_BATCHES[0]["input_ids"]
    mask = np.random.default_rng(4).random(x.shape) < 0.7
    (loss, _), logits = _lm_loss_and_logits(params, {"input_ids": x, "loss_mask": mask})
    lp = _log_softmax_at(logits[:, :-1], x[:, 1:])
    np.testing.assert_allclose(loss, -lp[mask[:, 1:]].mean(), rtol=1e-5)
    # Column 0 has no prediction: toggling it changes nothing.
    flipped = mask.copy()
    flipped[:, 0] = ~flipped[:, 0]
    np.testing.assert_array_equal(_lm_loss_and_logits(params, {"input_ids": x, "loss_mask": flipped})[0][0], loss)
    # Left padding with an attention mask gives the loss of the unpadded rows.
    padded = np.concatenate([np.ones((4, 3), np.int32), x], axis=1)
    am = np.arange(15) >= 3
    pm = np.concatenate([np.ones((4, 3), bool), mask], axis=1)  # loss_mask on padding is overridden
    left = {"input_ids": padded, "attention_mask": np.broadcast_to(am, (4, 15)), "loss_mask": pm}
    np.testing.assert_allclose(jax.jit(T.lm_loss, static_argnums=0)(LM, params, left)[0], loss, rtol=1e-5)
    with pytest.raises(ValueError, match="loss_mask"):
        T.lm_loss(LM, params, {"input_ids": x})


# ----------------------------------------------------------------------------- optimizer, schedule
def test_schedule_warmup_and_cosine_decay():
    lr = T.schedule(T.TrainConfig(num_steps=100, warmup_steps=10, learning_rate=1e-3, final_lr_ratio=0.1))
    np.testing.assert_allclose([lr(0), lr(5), lr(10), lr(100)], [0.0, 5e-4, 1e-3, 1e-4], rtol=1e-6)
    assert lr(50) < lr(20) < lr(10)


def test_weight_decay_applies_to_matrices_only():
    opt = T.make_optimizer(T.TrainConfig(num_steps=10, warmup_steps=0, learning_rate=0.1, weight_decay=0.5))
    params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2), "scale": jnp.ones(2)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zeros, opt.init(params), params)
    np.testing.assert_allclose(updates["kernel"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["bias"], 0.0)
    np.testing.assert_array_equal(updates["scale"], 0.0)


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_steps=0), "num_steps"), (dict(warmup_steps=2000), "warmup_steps"),
    (dict(learning_rate=0.0), "learning_rate"), (dict(final_lr_ratio=2.0), "final_lr_ratio"),
    (dict(log_every=0), "log_every"),
])
def test_train_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        T.TrainConfig(**kwargs)


# ------------------------------------------------------------------------------------------ loops
def test_lm_overfits_a_tiny_dataset(lm_run):
    loss = lm_run.history["loss"]
    assert lm_run.step == STEPS and len(loss) == STEPS
    assert loss[0] > 4.0 and loss[-1] < 0.1 * loss[0], loss[::10]
    np.testing.assert_array_equal(lm_run.history["step"], np.arange(STEPS))
    np.testing.assert_allclose(lm_run.history["learning_rate"][[0, 5]], [0.0, 1e-2], rtol=1e-6)
    assert (lm_run.history["tokens"] == 4 * 11).all() and np.isfinite(lm_run.history["grad_norm"]).all()


def test_bart_overfits_a_tiny_dataset(bart_run):
    loss = bart_run.history["loss"]
    assert loss[0] > 4.0 and loss[-1] < 0.1 * loss[0], loss[::10]
    assert bart_run.history["accuracy"][-1] > 0.95


@pytest.mark.slow
def test_first_step_metrics_use_the_step_dropout_key_and_unclipped_gradients(lm_run):
    init = LM.init(jax.random.key(0))
    key = jax.random.fold_in(jax.random.key(TC.seed), 0)
    grads = jax.jit(jax.grad(lambda p: T.lm_loss(LM, p, LM_BATCHES[0], key)[0]))(init)
    norm = float(optax.tree.norm(grads))
    assert norm > TC.clip_norm  # so a clipped norm would differ
    np.testing.assert_allclose(lm_run.history["grad_norm"][0], norm, rtol=1e-4)


def test_training_is_deterministic_for_a_seed(lm_run):
    init = LM.init(jax.random.key(0))
    again = T.train(LM, init, _stream(LM_BATCHES), TC)
    np.testing.assert_array_equal(again.history["loss"], lm_run.history["loss"])
    jax.tree.map(np.testing.assert_array_equal, again.params, lm_run.params)
    # The seed drives dropout: another seed gives another trajectory from the same initialisation.
    other = T.train(LM, init, _stream(LM_BATCHES, 0, 3), dataclasses.replace(TC, seed=4))
    assert not np.array_equal(other.history["loss"][1:3], lm_run.history["loss"][1:3])
    # train() copies its inputs before donating: the caller's params are still usable.
    assert np.isfinite(np.asarray(jax.tree.leaves(init)[0])).all()


def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(lm_run, tmp_path):
    seen = []
    half = T.train(LM, LM.init(jax.random.key(0)), _stream(LM_BATCHES, 0, STEPS // 2), TC,
                   callback=lambda step, m: seen.append((step, m["loss"])), checkpoint_dir=str(tmp_path),
                   checkpoint_every=20)
    assert half.step == STEPS // 2  # the stream ran out before num_steps
    assert [s for s, _ in seen] == [10, 20, 30]
    np.testing.assert_array_equal([v for _, v in seen], lm_run.history["loss"][[9, 19, 29]])
    assert ckpt.steps(str(tmp_path)) == [20, 30]  # every 20 steps and at the end
    restored = ckpt.restore(str(tmp_path), LM.config, optimizer=T.make_optimizer(TC))
    rest = T.train(LM, restored.params, _stream(LM_BATCHES, STEPS // 2), TC, opt_state=restored.opt_state,
                   start_step=restored.step)
    assert rest.step == STEPS
    np.testing.assert_array_equal(rest.history["step"], np.arange(STEPS // 2, STEPS))
    np.testing.assert_array_equal(rest.history["loss"], lm_run.history["loss"][STEPS // 2:])
    jax.tree.map(np.testing.assert_array_equal, rest.params, lm_run.params)


def _progressions(rng, n, length, cfg):
    """Rows ``a + b * t`` over the ordinary ids ``[4, V - 1)``: a masked token is inferable from context."""
    span = cfg.vocab_size - 5
    a, b = rng.integers(0, span, size=(n, 1)), rng.integers(1, 6, size=(n, 1))
    return (4 + (a + b * np.arange(length)) % span).astype(np.int32)


def _denoising_batch(rng, cfg, n=32, length=20):
    """Text-infilling-like batch: ~25% of tokens become <mask>; the decoder rebuilds the row + EOS."""
    clean = _progressions(rng, n, length, cfg)
    src = np.where(rng.random(clean.shape) < 0.25, cfg.mask_id, clean)
    labels = np.concatenate([clean, np.full((n, 1), cfg.eos_id, np.int32)], axis=1)
    return {
        "input_ids": src, "attention_mask": np.ones(src.shape, bool), "labels": labels,
        "decoder_input_ids": np.asarray(T.shift_right(labels, cfg.decoder_start_id, cfg.pad_id)),
        "loss_mask": np.ones(labels.shape, bool),
    }


@pytest.mark.slow
def test_tiny_bart_learns_to_denoise_and_decodes_greedily_with_the_cache():
    """End to end on the named ``tiny`` config: train, then greedy-decode held-out rows step by step."""
    model = Bart(get_config("bart", "tiny"))
    cfg, rng = model.config, np.random.default_rng(0)
    tc = T.TrainConfig(num_steps=800, warmup_steps=40, learning_rate=3e-3, log_every=100)
    result = T.train(model, model.init(jax.random.key(0)), (_denoising_batch(rng, cfg) for _ in range(800)), tc)
    assert result.history["loss"][-20:].mean() < 0.02 * result.history["loss"][0]

    test = _denoising_batch(np.random.default_rng(1), cfg, n=16)
    L = test["labels"].shape[1]

    @jax.jit
    def greedy(params, src, mask):
        cache = model.encode(params, src, mask, L)
        tok = jnp.full((src.shape[0],), cfg.decoder_start_id, jnp.int32)

        def body(t, carry):
            tok, cache, out = carry
            step = model.apply_step(params, tok[:, None], jnp.full((src.shape[0], 1), t), cache)
            nxt = jnp.argmax(step.logits[:, 0], axis=-1).astype(jnp.int32)
            return nxt, step.cache, out.at[:, t].set(nxt)

        return jax.lax.fori_loop(0, L, body, (tok, cache, jnp.zeros((src.shape[0], L), jnp.int32)))[2]

    decoded = np.asarray(greedy(result.params, test["input_ids"], test["attention_mask"]))
    teacher_forced = jax.jit(T.bart_loss, static_argnums=0)(model, result.params, test)[1]["accuracy"]
    assert teacher_forced > 0.95
    assert (decoded == test["labels"]).mean() > 0.75  # lower: one wrong guess derails the rest of a row
    # Self-consistency: the full forward pass over the decoded rows predicts exactly those tokens.
    own = np.asarray(T.shift_right(decoded, cfg.decoder_start_id, cfg.pad_id))
    logits = jax.jit(model.__call__)(result.params, test["input_ids"], test["attention_mask"], own).logits
    np.testing.assert_array_equal(np.argmax(logits, axis=-1), decoded)


def test_non_finite_loss_stops_training_before_any_checkpoint(tmp_path):
    params = jax.tree.map(lambda x: x * jnp.nan if x.ndim >= 2 else x, LM.init(jax.random.key(0)))
    config = dataclasses.replace(TC, num_steps=4, warmup_steps=1, log_every=2)
    with pytest.raises(T.NonFiniteLossError, match="loss is nan at step 0"):
        T.train(LM, params, _stream(LM_BATCHES), config, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())
    assert issubclass(T.NonFiniteLossError, ValueError)  # the CLI prints one line
