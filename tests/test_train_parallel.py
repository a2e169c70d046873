"""Sharded training: 1 device == 8 simulated devices (data parallel and FSDP), gradient accumulation,
bf16 compute, evaluation in the loop, early stopping, and resuming onto another mesh."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxsample.models import Bart, get_config
from jaxsample.models import checkpoint as ckpt
from jaxsample.models import parallel as P
from jaxsample.models import train as T
from tests._devices import eight_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(vocab_size=96, d_model=64, num_heads=4, d_ff=128, max_len=16, encoder_layers=1, decoder_layers=1,
             dropout_rate=0.1)
BART = Bart(get_config("bart", "tiny", **SMALL))
STEPS = 20
TC = T.TrainConfig(num_steps=STEPS, warmup_steps=2, learning_rate=1e-2, log_every=5, seed=1)
ROWS = 16  # global batch: 8 devices x 2 rows, or 2 micro-batches of 8


def batch(seed: int, rows: int = ROWS) -> dict:
    """A BART batch with ragged sources and targets (padding rows included)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 13, rows)
    lens[-1] = 0  # a row without labels (a padding row of the reader)
    labels = np.where(np.arange(12) < lens[:, None] - 1, rng.integers(4, 95, (rows, 12)), 1)
    labels[np.arange(rows), np.maximum(lens - 1, 0)] = np.where(lens > 0, 2, 1)
    src_len = rng.integers(1, 11, rows)
    src = np.where(np.arange(10) < src_len[:, None], rng.integers(4, 95, (rows, 10)), 1)
    return {"input_ids": src.astype(np.int32), "attention_mask": np.arange(10) < src_len[:, None],
            "decoder_input_ids": np.asarray(T.shift_right(labels, 2, 1)), "labels": labels.astype(np.int32),
            "loss_mask": labels != 1}


def run(parallel=None, steps=STEPS, start=0, **kwargs):
    params = BART.init(jax.random.key(0))
    return T.train(BART, params, (batch(s) for s in range(start, steps)), TC, parallel=parallel, **kwargs)


_EIGHT = textwrap.dedent("""
    import sys, json
    import numpy as np, jax
    assert jax.device_count() == 8, jax.devices()
    sys.path.insert(0, {tests!r})
    from test_train_parallel import run, P, BART, TC, T, ckpt
    out = {{}}
    # a checkpoint written on one device restores onto the 8-device FSDP mesh
    fsdp = P.ParallelConfig(mode="fsdp", fsdp_min_size=256)
    p_sh, o_sh = P.state_shardings_of(BART, T.make_optimizer(TC), P.make_mesh(), fsdp)
    like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        jax.eval_shape(BART.init, jax.random.key(0)), p_sh)
    restored = ckpt.restore(sys.argv[2], BART.config, params_like=like)
    out["restored_sharded"] = sum(1 for x in jax.tree.leaves(restored.params) if not x.sharding.is_fully_replicated)
    out["restored_sum"] = float(sum(np.asarray(x, np.float64).sum() for x in jax.tree.leaves(restored.params)))
    for name, par in [("data", P.ParallelConfig()), ("fsdp", P.ParallelConfig(mode="fsdp", fsdp_min_size=256)),
                      ("fsdp_accum", P.ParallelConfig(mode="fsdp", grad_accum=2, fsdp_min_size=256))]:
        res = run(par)
        out[name] = res.history["loss"].tolist()
        leaves = jax.tree.leaves(res.params)
        out[name + "_sharded"] = sum(1 for x in leaves if not x.sharding.is_fully_replicated)
        out[name + "_param0"] = np.asarray(leaves[0]).ravel()[:8].tolist()
    json.dump(out, open(sys.argv[1], "w"))
""")


@pytest.fixture(scope="module")
def one_device():
    return run()


@pytest.mark.multiprocess
def test_one_and_eight_devices_give_the_same_losses_data_parallel_and_fsdp(one_device, tmp_path):
    env = eight_devices()
    target = tmp_path / "eight.json"
    ckpt.save(str(tmp_path / "ckpt"), STEPS, one_device.params, BART.config)
    proc = subprocess.run([sys.executable, "-c", _EIGHT.format(tests=os.path.join(ROOT, "tests")), str(target),
                           str(tmp_path / "ckpt")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    eight = json.loads(target.read_text())
    accum = run(P.ParallelConfig(grad_accum=2))  # micro-batches draw their own dropout keys
    for name, want in (("data", one_device), ("fsdp", one_device), ("fsdp_accum", accum)):
        assert len(want.history["loss"]) == STEPS and want.history["loss"][-1] < want.history["loss"][0]
        np.testing.assert_allclose(eight[name], want.history["loss"], rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_allclose(eight[name + "_param0"], np.asarray(jax.tree.leaves(want.params)[0]).ravel()[:8],
                                   rtol=1e-4, atol=1e-5, err_msg=name)
    assert eight["restored_sharded"] > 0
    assert eight["restored_sum"] == pytest.approx(sum(np.asarray(x, np.float64).sum()
                                                      for x in jax.tree.leaves(one_device.params)), rel=1e-12)
    assert eight["data_sharded"] == 0  # replicated parameters
    assert eight["fsdp_sharded"] > 0 and eight["fsdp_accum_sharded"] == eight["fsdp_sharded"]


def test_gradient_accumulation_equals_the_whole_batch(one_device):
    # Training through the accumulating step (one static grad_accum: 4 runs the same scan, and its
    # gradient is checked exactly below).
    two = run(P.ParallelConfig(grad_accum=2), steps=3)
    # Dropout keys differ per micro-batch, so compare the exact gradient without dropout.
    params, b = BART.init(jax.random.key(0)), batch(0)
    opt = T.make_optimizer(TC)

    def grads(accum):
        obj = lambda p, mb, key: T.bart_loss(BART, p, mb, None)  # noqa: E731
        return jax.jit(lambda p: P.accumulated_grads(obj, p, b, None, accum))(params)

    g1, m1 = grads(1)
    for accum in (2, 4):
        g, m = grads(accum)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-6), g, g1)
        np.testing.assert_allclose(m["loss"], m1["loss"], rtol=1e-5)
        assert float(m["tokens"]) == float(m1["tokens"])
    assert np.isfinite(two.history["loss"]).all()
    del opt


def test_bf16_compute_keeps_float32_master_weights():
    model = Bart(get_config("bart", "tiny", **{**SMALL, "dtype": "bfloat16"}))
    res = T.train(model, model.init(jax.random.key(0)), (batch(s) for s in range(8)),
                  T.TrainConfig(num_steps=8, warmup_steps=1, learning_rate=1e-2, log_every=4),
                  parallel=P.ParallelConfig())
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(res.params))
    assert res.history["loss"][-1] < res.history["loss"][0]


def test_evaluation_in_the_loop_and_early_stopping(one_device):
    held = [batch(100 + i) for i in range(2)]
    step_fn = T.make_eval_step(BART)
    seen = []
    res = run(evaluate=lambda p: T.evaluate_batches(step_fn, p, held), eval_every=5,
              on_eval=lambda s, m: seen.append(s))
    assert seen == [5, 10, 15, 20] and [e["step"] for e in res.evals] == seen
    np.testing.assert_array_equal(res.history["loss"], one_device.history["loss"])  # evaluation changes nothing
    direct = T.evaluate_batches(step_fn, one_device.params, held)
    assert res.evals[-1]["loss"] == pytest.approx(direct["loss"], rel=1e-6)
    assert direct["tokens"] == sum(int(b["loss_mask"].sum()) for b in held)
    # Patience 1 with an evaluation that never improves: stops at the second evaluation.
    worse = iter(range(100))
    stopped = run(evaluate=lambda p: {"loss": float(next(worse)), "accuracy": 0.0, "tokens": 1.0}, eval_every=3,
                  early_stopping=1)
    assert stopped.stopped_early and stopped.step == 6


def test_resume_onto_another_mesh_restores_the_same_values(one_device, tmp_path):
    fsdp = P.ParallelConfig(mode="fsdp", fsdp_min_size=256)
    half = run(fsdp, steps=STEPS // 2, checkpoint_dir=str(tmp_path), data_state=lambda: {"next": STEPS // 2})
    saved = ckpt.restore(str(tmp_path), BART.config, optimizer=T.make_optimizer(TC))
    assert saved.step == STEPS // 2 and saved.metadata["data_state"] == {"next": STEPS // 2}
    # onto an explicit (here one-device) mesh with FSDP shardings
    mesh = P.make_mesh(jax.devices()[:1])
    p_sh, o_sh = P.state_shardings_of(BART, T.make_optimizer(TC), mesh, fsdp)
    like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        jax.eval_shape(BART.init, jax.random.key(0)), p_sh)
    again = ckpt.restore(str(tmp_path), BART.config, optimizer=T.make_optimizer(TC), params_like=like)
    jax.tree.map(np.testing.assert_array_equal, again.params, saved.params)
    rest = T.train(BART, saved.params, (batch(s) for s in range(STEPS // 2, STEPS)), TC, opt_state=saved.opt_state,
                   start_step=saved.step, parallel=fsdp)
    np.testing.assert_allclose(np.concatenate([half.history["loss"], rest.history["loss"]]),
                               one_device.history["loss"], rtol=1e-5, atol=1e-6)
    del o_sh


def test_bad_parallel_settings_name_the_field():
    with pytest.raises(ValueError, match="parallel.mode"):
        P.ParallelConfig(mode="tensor")
    with pytest.raises(ValueError, match="parallel.grad_accum"):
        P.ParallelConfig(grad_accum=0)
    with pytest.raises(ValueError, match=r"batch_size 12 must be divisible"):
        P.check_batch_size(12, P.make_mesh(), P.ParallelConfig(grad_accum=8))
