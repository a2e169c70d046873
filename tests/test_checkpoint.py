"""Orbax checkpoints: exact round trip, config verification, atomicity (incomplete saves are never loaded)."""

import dataclasses
import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsample.models import checkpoint as ckpt
from jaxsample.models import get_config, make_model
from jaxsample.models import train as T

CFG = get_config("bart", "tiny", vocab_size=97, d_model=32, num_heads=4, d_ff=64, max_len=32,
                 encoder_layers=1, decoder_layers=1)
MODEL = make_model(CFG)


@functools.cache
def model_params():
    return MODEL.init(jax.random.key(0))


OPT = T.make_optimizer(T.TrainConfig(num_steps=10, warmup_steps=2))


def _shifted(tree, delta):
    return jax.tree.map(lambda x: x + delta, tree)


def _assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def test_round_trip_params_optimizer_state_config_and_step(tmp_path):
    d = str(tmp_path)
    params = model_params()
    opt_state = jax.jit(OPT.update)(params, OPT.init(params), params)[1]  # non-trivial moments and counts
    path = ckpt.save(d, 3, params, CFG, opt_state=opt_state)
    assert path == os.path.join(d, "3") and os.path.isfile(os.path.join(path, "commit_success.txt"))
    ckpt.save(d, 8, _shifted(model_params(), 1.0), CFG)
    assert ckpt.steps(d) == [3, 8] and ckpt.latest_step(d) == 8

    latest = ckpt.restore(d, CFG)
    assert latest.step == 8 and latest.config == CFG and latest.opt_state is None
    _assert_same(latest.params, _shifted(model_params(), 1.0))

    first = ckpt.restore(d, step=3, optimizer=OPT)  # config=None: take what was saved
    assert first.config == CFG
    _assert_same(first.params, model_params())
    _assert_same(first.opt_state, opt_state)
    with pytest.raises(ValueError, match="optimizer state"):
        ckpt.restore(d, CFG, step=8, optimizer=OPT)


def test_restore_into_a_given_abstract_target_keeps_its_sharding(tmp_path):
    ckpt.save(str(tmp_path), 1, model_params(), CFG)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), model_params())
    restored = ckpt.restore(str(tmp_path), CFG, params_like=like).params
    _assert_same(restored, model_params())
    assert all(x.sharding == sharding for x in jax.tree.leaves(restored))


def test_config_mismatch_names_the_fields(tmp_path):
    ckpt.save(str(tmp_path), 1, model_params(), CFG)
    with pytest.raises(ValueError, match=r"d_ff: saved 64 != expected 128"):
        ckpt.restore(str(tmp_path), dataclasses.replace(CFG, d_ff=128))
    with pytest.raises(ValueError, match="pad_id"):
        ckpt.restore(str(tmp_path), dataclasses.replace(CFG, pad_id=3))
    with pytest.raises(ValueError, match="arch"):
        ckpt.restore(str(tmp_path), get_config("decoder", "tiny"))


def test_missing_and_duplicate_steps(tmp_path):
    d = str(tmp_path / "none")
    assert ckpt.steps(d) == [] and ckpt.latest_step(d) is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.restore(d, CFG)
    ckpt.save(d, 2, model_params(), CFG)
    with pytest.raises(FileNotFoundError, match=r"available: \[2\]"):
        ckpt.restore(d, CFG, step=5)
    with pytest.raises(ValueError, match="already exists"):
        ckpt.save(d, 2, model_params(), CFG)
    with pytest.raises(ValueError, match="step"):
        ckpt.save(d, -1, model_params(), CFG)


def test_incomplete_checkpoints_are_never_loaded(tmp_path):
    d = str(tmp_path)
    ckpt.save(d, 1, model_params(), CFG)
    # What an interrupted save leaves behind: orbax's temporary directory, or (on file systems
    # without atomic rename, or after a partial copy) a step directory without the commit marker.
    shutil.copytree(os.path.join(d, "1"), os.path.join(d, "5.orbax-checkpoint-tmp-1234"))
    shutil.copytree(os.path.join(d, "1"), os.path.join(d, "7"))
    os.remove(os.path.join(d, "7", "commit_success.txt"))
    assert ckpt.steps(d) == [1]
    assert ckpt.restore(d, CFG).step == 1
    with pytest.raises(FileNotFoundError):
        ckpt.restore(d, CFG, step=7)


def test_a_save_that_fails_before_commit_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    atomicity = pytest.importorskip("orbax.checkpoint._src.path.atomicity")
    d = str(tmp_path)
    ckpt.save(d, 1, model_params(), CFG)

    async def crash(self, *args, **kwargs):
        raise OSError("simulated crash before the commit")

    with monkeypatch.context() as m:
        m.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", crash)
        with pytest.raises(OSError, match="simulated crash"):
            ckpt.save(d, 2, _shifted(model_params(), 1.0), CFG)
    assert ckpt.steps(d) == [1]
    _assert_same(ckpt.restore(d, CFG).params, model_params())
    ckpt.save(d, 2, _shifted(model_params(), 2.0), CFG)  # the leftover temporary directory does not block a retry
    _assert_same(ckpt.restore(d, CFG).params, _shifted(model_params(), 2.0))


def test_max_to_keep_prunes_old_steps(tmp_path):
    d = str(tmp_path)
    for step in range(4):
        ckpt.save(d, step, _shifted(model_params(), float(step)), CFG, max_to_keep=2)
    assert ckpt.steps(d) == [2, 3]
    _assert_same(ckpt.restore(d, CFG).params, _shifted(model_params(), 3.0))


def test_bfloat16_compute_config_restores_float32_params(tmp_path):
    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    ckpt.save(str(tmp_path), 1, model_params(), cfg)
    restored = ckpt.restore(str(tmp_path), cfg)
    assert {x.dtype for x in jax.tree.leaves(restored.params)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match="dtype"):
        ckpt.restore(str(tmp_path), CFG)
