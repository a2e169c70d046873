"""The evaluation runner on a tiny random BART: files, metrics, determinism, mesh == pmap, 1 vs 8 devices."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxsample.evaluation import DataParallel, DatasetConfig, EvalConfig, RowPlan, evaluate, format_table, row_keys
from jaxsample.evaluation import data as eval_data
from tests._devices import eight_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = {"name": "sample", "strategy": "sample", "num_return": 2,
          "sampler": {"ecosystem": "hf", "settings": {"do_sample": True, "top_k": 0}}}
BEAM = {"name": "beam", "strategy": "beam", "num_beams": 2, "num_return": 2}
DECODING = ("greedy", SAMPLE, BEAM)


def _write_fixture(root: str) -> dict:
    """A held-out pydoc dataset (300-token BPE, <= 24 tokens) and a random 1+1-layer BART checkpoint."""
    from jaxsample.models import checkpoint, get_config, make_model
    from wakong.reader import open_dataset

    spec = DatasetConfig(path=os.path.join(root, "data"), corpus="pydoc", build="demo", split="heldout",
                         build_set=("tokenizer.vocab_size=300", "examples.max_source_len=24",
                                    "examples.max_target_len=24"), max_rows=6)
    eval_data.prepare(spec)
    _, tok = open_dataset(spec.path)
    ids = {f"{r}_id": getattr(tok, f"{r}_id") for r in ("bos", "pad", "eos", "mask", "decoder_start")}
    cfg = get_config("bart", "tiny", vocab_size=tok.vocab_size, d_model=32, num_heads=2, d_ff=64, encoder_layers=1,
                     decoder_layers=1, max_len=32, **ids)
    checkpoint.save(os.path.join(root, "ckpt"), 0, make_model(cfg).init(jax.random.key(1)), cfg)
    other = dataclasses.replace(cfg, eos_id=5)
    checkpoint.save(os.path.join(root, "other"), 0, make_model(other).init(jax.random.key(1)), other)
    return {"checkpoint": os.path.join(root, "ckpt"), "data": spec.path, "other": os.path.join(root, "other")}


def _config(paths: dict, **kw) -> EvalConfig:
    base = dict(checkpoint=paths["checkpoint"], dataset=DatasetConfig(path=paths["data"], max_rows=6),
                decoding=DECODING, per_device_batch_size=2, seed=3)
    return EvalConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return _write_fixture(str(tmp_path_factory.mktemp("eval")))


@pytest.fixture(scope="module")
def mesh_results(paths, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("out"))
    return evaluate(_config(paths, output_dir=out), log=None), out


def test_results_files_and_metrics(paths, mesh_results):
    results, out = mesh_results
    assert sorted(results["configs"]) == ["beam", "greedy", "sample"]
    for name, k in (("greedy", 1), ("sample", 2), ("beam", 2)):
        o = results["outputs"][name]
        assert o["tokens"].shape == (6, k, 24) and o["lengths"].shape == (6, k)
        m = results["configs"][name]
        for key in ("exact_match", "infill_exact_match", "faithful", "token_accuracy", "distinct_1", "distinct_2"):
            assert 0.0 <= m[key] <= 1.0, key
        assert m["timing"]["generated_tokens"] == int(o["lengths"].sum())
        assert m["logprob_per_token"] < 0
    assert results["configs"]["greedy"]["self_bleu"] is None  # one output per row
    assert 0 <= results["configs"]["sample"]["self_bleu"] < 100  # a random model's samples differ
    saved = json.load(open(os.path.join(out, "results.json")))
    assert saved["configs"]["beam"]["exact_match"] == results["configs"]["beam"]["exact_match"]
    assert saved["settings"]["rows"] == 6 and "outputs" not in saved
    lines = [json.loads(x) for x in open(os.path.join(out, "outputs.jsonl"))]
    assert len(lines) == 3 * 6
    first = next(x for x in lines if x["config"] == "sample" and x["row"] == 4)
    o = results["outputs"]["sample"]
    assert first["ids"][1] == o["tokens"][4, 1, : o["lengths"][4, 1]].tolist()
    table = open(os.path.join(out, "summary.md")).read()
    assert table.startswith(format_table(results)) and "| sample | sample |" in table
    rows = eval_data.load_rows(paths["data"], max_rows=1)
    src, ref = rows.arrays["input_ids"][0], rows.arrays["labels"][0]
    text = lambda ids: rows.tokenizer.decode([t for t in ids if t > 2]).strip()  # noqa: E731  (no <s> <pad> </s>)
    assert f"* source:    {text(src)}\n  reference: {text(ref)}\n" in table


def test_reference_likelihood_equals_the_training_loss(paths, mesh_results):
    from jaxsample.models import checkpoint, make_model
    from jaxsample.models import train as T

    ckpt = checkpoint.restore(paths["checkpoint"])
    rows = eval_data.load_rows(paths["data"], max_rows=6).arrays
    batch = {k: rows[k] for k in ("input_ids", "attention_mask", "labels", "loss_mask")}
    batch["decoder_input_ids"] = np.asarray(T.shift_right(rows["labels"], ckpt.config.decoder_start_id,
                                                          ckpt.config.pad_id))
    loss, _ = T.bart_loss(make_model(ckpt.config), ckpt.params, batch)
    assert mesh_results[0]["reference"]["nll_per_token"] == pytest.approx(float(loss), rel=1e-5)


def test_rerun_reuses_compilations_and_seed_changes_only_samples(paths, mesh_results):
    again = evaluate(_config(paths, seed=4, metrics=("exact_match",)), log=None)  # seed is traced
    assert all(m["timing"]["compile_seconds"] == 0.0 for m in again["configs"].values())
    base, other = mesh_results[0]["outputs"], again["outputs"]
    for name in ("greedy", "beam"):
        np.testing.assert_array_equal(other[name]["tokens"], base[name]["tokens"])
    assert not np.array_equal(other["sample"]["tokens"], base["sample"]["tokens"])


_EIGHT_DEVICES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax
    assert jax.device_count() == 8, jax.devices()
    sys.path.insert(0, {tests!r})
    from test_eval_runner import _config
    from jaxsample.evaluation import evaluate
    paths = json.loads(sys.argv[1])
    out = {{}}
    for mode in ("mesh", "pmap"):
        res = evaluate(_config(paths, parallel=mode, metrics=("exact_match",)), log=None)
        assert res["settings"]["devices"] == 8
        for name, o in res["outputs"].items():
            for key, value in o.items():
                out[f"{{mode}}/{{name}}/{{key}}"] = value
    np.savez(sys.argv[2], **out)
""")


@pytest.mark.multiprocess
def test_one_and_eight_devices_mesh_and_pmap_give_the_same_outputs(paths, mesh_results, tmp_path):
    """8 simulated CPU devices (mesh and pmap paths, one step of 8 blocks) == 1 device (3 steps)."""
    env = eight_devices()
    script = _EIGHT_DEVICES.format(tests=os.path.join(ROOT, "tests"))
    target = str(tmp_path / "eight.npz")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(paths), target], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    eight = np.load(target)
    for mode in ("mesh", "pmap"):
        for name, out in mesh_results[0]["outputs"].items():
            for key in ("tokens", "lengths", "reason"):
                np.testing.assert_array_equal(eight[f"{mode}/{name}/{key}"], out[key], err_msg=f"{mode}/{name}/{key}")


@pytest.mark.parametrize("devices,processes", [(1, 1), (4, 1), (4, 2), (8, 4)])
def test_row_plan_gives_every_row_once_in_the_same_blocks(devices, processes):
    rows, block = 21, 3
    plans = [RowPlan(rows, block, devices, h, processes) for h in range(processes)]
    got = np.concatenate([p.local_rows().reshape(-1) for p in plans])
    assert sorted(got[got >= 0].tolist()) == list(range(rows))
    for p in plans:  # every per-device batch is one block of consecutive rows, whatever the layout
        blocks = p.local_rows().reshape(-1, block)
        for b in blocks[blocks[:, 0] >= 0]:
            assert b[0] % block == 0 and all(b[b >= 0] == b[0] + np.arange((b >= 0).sum()))


def test_row_keys_depend_only_on_the_row():
    a = np.asarray(row_keys(7, jax.numpy.array([5, 2, -1])))
    b = np.asarray(row_keys(7, jax.numpy.array([0, 2, 5])))
    assert a[0] == b[2] and a[1] == b[1] and a[2] == b[0]  # padding rows take row 0's seed
    many = np.asarray(row_keys(7, jax.numpy.array([2]), 3))
    assert many.shape == (1, 3) and len(set(many[0].tolist())) == 3 and (many >= 0).all()
    assert not np.array_equal(row_keys(8, jax.numpy.array([2])), row_keys(7, jax.numpy.array([2])))


def test_data_parallel_rejects_a_plan_for_other_devices():
    runner = DataParallel("mesh")
    with pytest.raises(ValueError, match="local devices"):
        runner.run("k", lambda s, x: x, {}, {"x": np.zeros((4, 1))}, RowPlan(4, 1, 2 * len(runner.devices)))


def test_runner_errors_name_the_problem(paths):
    with pytest.raises(FileNotFoundError, match="holds no built dataset"):
        evaluate(_config(paths, dataset=DatasetConfig(path=os.path.join(paths["data"], "missing"))), log=None)
    with pytest.raises(ValueError, match="max_len=32"):
        evaluate(_config(paths, max_new_tokens=40, decoding=("greedy",)), log=None)
    with pytest.raises(ValueError, match="tokenizer"):  # a checkpoint for another vocabulary layout
        evaluate(_config(paths, checkpoint=paths["other"]), log=None)
    with pytest.raises(ValueError, match=r"decoding\[1\].*num_beams"):
        evaluate(_config(paths, decoding=("greedy", {"name": "g", "strategy": "greedy", "num_beams": 3})), log=None)
