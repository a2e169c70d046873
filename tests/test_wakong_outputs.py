"""What trainers consume from a wakong dataset: tokenized builds read as documents for the device
noiser, feature names per trainer (HF, seqio, t5x, MaxText), packing with segment ids and positions,
global ``jax.Array`` batches on 8 simulated devices and resuming from an orbax checkpoint."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from tests._helpers import dataset_records
from wakong import features as F
from wakong import records
from wakong.config import load_config
from wakong.device_noise import DeviceNoiser
from wakong.infilling import NoiseConfig
from wakong.pipeline import build, training_texts
from wakong.reader import batches, dataset_mode, noise_key
from wakong.sources import PydocSource, TextSource
from wakong.tokenizer import train_tokenizer
from tests._devices import eight_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["examples.max_source_len=64", "examples.max_target_len=64", "examples.min_words=3",
         "output.num_shards=2", "input.split=paragraph"]
ONE = dict(process_index=0, process_count=1)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(training_texts(PydocSource(), load_config(overrides=["input.format=pydoc"])),
                           vocab_size=1000)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, tokenizer):
    """The same corpus built noised and tokenized (sentence examples, word-level Wakong)."""
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("outputs")
    corpus = root / "docs.txt"
    corpus.write_text("\n\n".join(" ".join(topics[n].split()) for n in sorted(topics)[:12]) + "\n")
    out = {}
    for mode in ("noised", "tokenized"):
        config = load_config(overrides=SMALL + [f"output.mode={mode}"])
        build(TextSource([str(corpus)], "paragraph"), root / mode, config, tokenizer=tokenizer)
        out[mode] = str(root / mode)
    return out


def _by_key(recs):
    return {(r["index"], r["part"]): r for r in recs}


def test_tokenized_build_writes_unnoised_documents_and_says_so(datasets):
    noised, tokenized = (records.read_manifests(datasets[m]) for m in ("noised", "tokenized"))
    assert dataset_mode(noised) == "noised" and dataset_mode(tokenized) == "tokenized"
    assert noised["config_fingerprint"] != tokenized["config_fingerprint"]
    for key in ("records_in", "records_written", "examples", "tokens"):
        assert noised["counts"][key] == tokenized["counts"][key]
    assert tokenized["counts"]["source_tokens"] == 0
    a, b = _by_key(dataset_records(datasets["noised"])), _by_key(dataset_records(datasets["tokenized"]))
    assert a.keys() == b.keys()
    for key, rec in b.items():
        assert rec["input_ids"].size == 0
        for field in ("labels", "word_starts", "sentence_starts"):
            np.testing.assert_array_equal(rec[field], a[key][field])


def test_cli_build_mode_flag(tmp_path, tokenizer):
    from wakong import cli

    tok = tmp_path / "tok.json"
    tokenizer.save(tok)
    corpus = tmp_path / "c.txt"
    corpus.write_text("one two three four five.\nsix seven eight nine ten.\n")
    args = ["build", str(corpus), "--tokenizer", str(tok), "--no-progress", "--no-plots", "--mode"]
    assert cli.main(args + ["tokenized", "--out", str(tmp_path / "d")]) == 0
    assert dataset_mode(records.read_manifests(str(tmp_path / "d"))) == "tokenized"
    with pytest.raises(SystemExit):  # argparse names the flag
        cli.main(args + ["bogus", "--out", str(tmp_path / "e")])


def test_documents_feed_the_device_noiser(datasets, tokenizer):
    path = datasets["tokenized"]
    stored = _by_key(dataset_records(path))
    out = list(batches(path, batch_size=16, seed=4, num_epochs=2, **ONE))
    first = out[0]
    assert {k: v.shape for k, v in first.items()} == {
        "tokens": (16, 62), "lengths": (16,), "word_starts": (16, 62), "sentence_starts": (16, 62),
        "noise_keys": (16, 2), "index": (16,), "part": (16,)}
    assert first["noise_keys"].dtype == np.uint32
    seen = {}
    n = len(stored)
    for position, (b, row) in enumerate((b, r) for b in out for r in range(16) if b["index"][r] >= 0):
        key = (int(b["index"][row]), int(b["part"][row]))
        rec, length = stored[key], int(b["lengths"][row])
        np.testing.assert_array_equal(b["tokens"][row, :length], rec["labels"][1:-1])
        np.testing.assert_array_equal(b["word_starts"][row, :length], rec["word_starts"][1:-1])
        np.testing.assert_array_equal(b["noise_keys"][row], noise_key(4, position // n, *key))
        seen.setdefault(key, []).append(tuple(b["noise_keys"][row]))
    assert len(seen) == n and all(len(v) == 2 and v[0] != v[1] for v in seen.values())  # fresh keys per epoch
    # Host independence: host 1 of 2 gets the same keys for the same examples and epochs.
    other = {}
    for b in batches(path, batch_size=16, seed=4, num_epochs=2, process_index=1, process_count=2):
        for row in np.flatnonzero(b["index"] >= 0):
            other.setdefault((int(b["index"][row]), int(b["part"][row])), []).append(tuple(b["noise_keys"][row]))
    assert other and all(set(v) <= set(seen[k]) for k, v in other.items())
    # The noiser turns them into features whose labels are the stored documents.
    config = load_config(overrides=SMALL).noise
    noiser = DeviceNoiser.create(config, tokenizer, max_source_len=64, max_target_len=64)
    feats = jax.jit(noiser)(noiser.params(config, tokenizer.random_ids), first["noise_keys"], first)
    for row in range(16):
        if first["index"][row] >= 0:
            rec = stored[(int(first["index"][row]), int(first["part"][row]))]
            labels = np.asarray(feats["labels"])[row][np.asarray(feats["loss_mask"])[row]]
            np.testing.assert_array_equal(labels, rec["labels"])


def test_reading_options_for_tokenized_datasets(datasets):
    path = datasets["tokenized"]
    with pytest.raises(ValueError, match="tokenized documents"):
        batches(path, batch_size=4, documents=False, **ONE)
    with pytest.raises(ValueError, match="noised on the device"):
        batches(path, batch_size=4, format="t5x", **ONE)
    with pytest.raises(ValueError, match="format must be one of"):
        batches(datasets["noised"], batch_size=4, format="fairseq", **ONE)
    host = next(iter(batches(path, batch_size=4, renoise=NoiseConfig(), **ONE)))  # host noising still works
    assert host["input_ids"].shape == (4, 64) and host["attention_mask"].sum() > 0


# --------------------------------------------------------------------------- feature names and packing

NAMES = {
    "hf": {"input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels", "loss_mask"},
    "seqio": {"inputs", "targets"},
    "t5x": {"encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"},
    "maxtext": {"inputs", "inputs_segmentation", "inputs_position", "targets", "targets_segmentation",
                "targets_position"},
}
PACKED = {
    "hf": {"segment_ids", "position_ids", "decoder_segment_ids", "decoder_position_ids"},
    "seqio": {"inputs_segment_ids", "inputs_positions", "targets_segment_ids", "targets_positions"},
    "t5x": {"encoder_segment_ids", "decoder_segment_ids", "encoder_positions", "decoder_positions"},
    "maxtext": set(),
}


def _examples(batch_list):
    """``{(index, part): (source ids, label ids)}`` of unpacked HF batches."""
    out = {}
    for b in batch_list:
        for row in np.flatnonzero(b["index"] >= 0):
            out[(int(b["index"][row]), int(b["part"][row]))] = (
                b["input_ids"][row][b["attention_mask"][row] == 1], b["labels"][row][b["loss_mask"][row]])
    return out


@pytest.mark.parametrize("fmt", F.FORMATS)
@pytest.mark.parametrize("pack", [False, True])
def test_feature_names_per_format(datasets, tokenizer, fmt, pack):
    b = next(iter(batches(datasets["noised"], batch_size=8, format=fmt, pack=pack, **ONE)))
    assert set(b) == NAMES[fmt] | (PACKED[fmt] if pack else set()) | {"index", "part"}
    width = 128 if fmt == "maxtext" else None
    assert all(v.shape[0] == 8 for v in b.values())
    if width:
        assert b["inputs"].shape == (8, width)


def test_layouts_carry_the_same_examples(datasets, tokenizer):
    path = datasets["noised"]
    hf = list(batches(path, batch_size=8, seed=2, **ONE))
    examples = _examples(hf)
    start = tokenizer.decoder_start_id
    for fmt in ("seqio", "t5x", "maxtext"):
        for pack in (False, True):
            seen = set()
            for b in batches(path, batch_size=8, seed=2, format=fmt, pack=pack, **ONE):
                for row in range(8):
                    for seg, key in enumerate(zip(np.atleast_1d(b["index"][row]), np.atleast_1d(b["part"][row])),
                                              start=1):
                        if key[0] < 0:
                            continue
                        key = (int(key[0]), int(key[1]))
                        src, labels = examples[key]
                        seen.add(key)
                        _check_example(b, fmt, pack, row, seg, src, labels, start)
            assert seen == set(examples), (fmt, pack)


def _check_example(b, fmt, pack, row, seg, src, labels, start):
    if fmt == "maxtext":
        segment = b["inputs_segmentation"][row] == seg
        seq = b["inputs"][row][segment]
        np.testing.assert_array_equal(seq, np.concatenate([src, labels]))
        np.testing.assert_array_equal(b["inputs_position"][row][segment], np.arange(len(seq)))
        scored = b["targets_segmentation"][row] == seg
        np.testing.assert_array_equal(b["targets"][row][scored], labels)  # loss on the labels exactly
        return
    names = {"seqio": ("inputs", "targets", "inputs_segment_ids", "targets_segment_ids", None),
             "t5x": ("encoder_input_tokens", "decoder_target_tokens", "encoder_segment_ids", "decoder_segment_ids",
                     "decoder_input_tokens")}[fmt]
    s_seg = b[names[2]][row] == seg if pack else np.arange(b[names[0]].shape[1]) < len(src)
    t_seg = b[names[3]][row] == seg if pack else np.arange(b[names[1]].shape[1]) < len(labels)
    np.testing.assert_array_equal(b[names[0]][row][s_seg], src)
    np.testing.assert_array_equal(b[names[1]][row][t_seg], labels)
    if names[4]:
        np.testing.assert_array_equal(b[names[4]][row][t_seg], np.concatenate([[start], labels[:-1]]))
        np.testing.assert_array_equal(b["decoder_loss_weights"][row][t_seg], 1)


def test_packing_loses_nothing_and_keeps_examples_apart(datasets, tokenizer):
    path = datasets["noised"]
    examples = _examples(batches(path, batch_size=8, seed=6, **ONE))
    packed = list(batches(path, batch_size=8, seed=6, pack=True, **ONE))
    keys = [(int(i), int(p)) for b in packed for i, p in zip(b["index"].ravel(), b["part"].ravel()) if i >= 0]
    assert len(keys) == len(set(keys)) == len(examples)  # every example exactly once
    assert sum((b["index"] >= 0).any(axis=1).sum() for b in packed) < 0.8 * len(examples)  # fewer rows
    for b in packed:
        masks = F.attention_masks(b["segment_ids"], b["decoder_segment_ids"], b["decoder_position_ids"])
        for row in range(8):
            segs = b["segment_ids"][row]
            assert (np.diff(segs[segs > 0]) >= 0).all()
            for seg, index in enumerate(b["index"][row][b["index"][row] >= 0], start=1):
                src, labels = examples[(int(index), int(b["part"][row][seg - 1]))]
                s, t = segs == seg, b["decoder_segment_ids"][row] == seg
                np.testing.assert_array_equal(b["input_ids"][row][s], src)
                np.testing.assert_array_equal(b["labels"][row][t], labels)
                np.testing.assert_array_equal(b["position_ids"][row][s], np.arange(len(src)))
                np.testing.assert_array_equal(b["decoder_position_ids"][row][t], np.arange(len(labels)))
                np.testing.assert_array_equal(b["decoder_input_ids"][row][t],
                                              np.concatenate([[tokenizer.decoder_start_id], labels[:-1]]))
                # Attention never crosses examples: encoder and cross attention see exactly this
                # example's source, the decoder this example's earlier tokens.
                assert (masks["encoder"][row][s] == s[None, :]).all()
                assert (masks["cross"][row][t] == s[None, :]).all()
                tri = np.tril(np.ones((t.sum(), t.sum()), bool))
                np.testing.assert_array_equal(masks["decoder"][row][np.ix_(t, t)], tri)
                assert not masks["decoder"][row][t][:, ~t].any()
            pad = segs == 0
            assert (b["input_ids"][row][pad] == tokenizer.pad_id).all() and not masks["encoder"][row][pad].any()


def test_packed_and_document_readers_resume_exactly(datasets):
    for path, options in ((datasets["noised"], dict(pack=True, format="t5x")), (datasets["tokenized"], {})):
        make = lambda: batches(path, batch_size=4, seed=3, num_epochs=2, **options, **ONE)  # noqa: E731
        full = list(make())
        it = iter(make())
        head = [next(it) for _ in range(3)]
        resumed = iter(make())
        resumed.set_state(json.loads(json.dumps(it.get_state())))
        tail = list(resumed)
        assert len(head) + len(tail) == len(full)
        for a, b in zip(tail, full[3:]):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    unpacked = iter(batches(datasets["noised"], batch_size=4, seed=3, num_epochs=2, format="t5x", **ONE))
    with pytest.raises(ValueError, match="pack True != False"):  # a packed reader's state elsewhere
        unpacked.set_state(_packed_state(datasets["noised"]))


def _packed_state(path):
    it = iter(batches(path, batch_size=4, seed=3, num_epochs=2, pack=True, format="t5x", **ONE))
    next(it)
    return it.get_state()


# --------------------------------------------------------------------------- global arrays, 8 devices

_EIGHT = textwrap.dedent("""
    import json, sys
    import numpy as np, jax
    assert jax.device_count() == 8
    from jax.sharding import Mesh
    from wakong.config import load_config
    from wakong.device_noise import DeviceNoiser
    from wakong.reader import batches, global_batches, host_states, open_dataset, restore_host_state
    from jaxsample.models import checkpoint as ckpt, get_config, make_model

    path, out_dir = sys.argv[1], sys.argv[2]
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "fsdp"))
    make = lambda: global_batches(batches(path, batch_size=16, seed=1, num_epochs=None), mesh)
    it = make()
    local = batches(path, batch_size=16, seed=1, num_epochs=None)
    first, expect = next(it), next(iter(local))
    out = {"shape": list(first["tokens"].shape), "devices": len(first["tokens"].sharding.device_set),
           "rows_per_device": sorted({s.data.shape[0] for s in first["tokens"].addressable_shards}),
           "equal": all(np.array_equal(np.asarray(first[k]), expect[k]) for k in expect)}
    # Device noising on the sharded batch equals noising the host arrays.
    info, tok = open_dataset(path)
    noise = load_config(overrides=["output.mode=tokenized"]).noise
    noiser = DeviceNoiser.create(noise, tok, max_source_len=64, max_target_len=64)
    params = noiser.params(noise, tok.random_ids)
    step = jax.jit(noiser)
    sharded = step(params, first["noise_keys"], first)
    plain = step(params, expect["noise_keys"], {k: v for k, v in expect.items()})
    out["noised_equal"] = all(np.array_equal(np.asarray(sharded[k]), np.asarray(plain[k])) for k in plain)
    out["noised_sharded"] = len(sharded["input_ids"].sharding.device_set)
    # The iterator state rides in the model's orbax checkpoint and resumes exactly.
    next(it)
    cfg = get_config("decoder", "tiny", d_model=32, d_ff=64, num_layers=1, vocab_size=64)
    ckpt.save(out_dir, 2, make_model(cfg).init(jax.random.key(0)), cfg, metadata={"data_state": host_states(it)})
    after = [next(it) for _ in range(3)]
    resumed = make()
    out["restored"] = restore_host_state(resumed, ckpt.read_metadata(out_dir)["data_state"])
    out["resume_equal"] = all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]))
                              for a, b in zip(after, [next(resumed) for _ in range(3)]) for k in a)
    print(json.dumps(out))
""")


@pytest.mark.multiprocess
def test_global_batches_on_eight_devices_and_orbax_resume(datasets, tmp_path):
    env = eight_devices()
    proc = subprocess.run([sys.executable, "-c", _EIGHT, datasets["tokenized"], str(tmp_path / "ckpt")], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"shape": [16, 62], "devices": 8, "rows_per_device": [2], "equal": True, "noised_equal": True,
                   "noised_sharded": 8, "restored": True, "resume_equal": True}


def test_docs_device_noising_and_worked_example_run(tmp_path, monkeypatch, tokenizer):
    # docs/wakong.md sections 7 and 9: the worked example's build command on a small Parquet file (64-token
    # documents instead of the bart config's 512), then its Python blocks on the tokenized dataset at docs/.
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    import shlex

    from pydoc_data.topics import topics

    from wakong.cli import main

    page = (pathlib.Path(ROOT) / "docs" / "wakong.md").read_text()
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M) if "DeviceNoiser" in b]
    assert len(blocks) == 2
    (command,) = [b for b in re.findall(r"^```bash\n(.*?)^```", page, flags=re.S | re.M) if "data.parquet" in b]
    argv = shlex.split(command.replace("\\\n", " ").splitlines()[0], comments=True)
    assert argv[:2] == ["wakong", "build"] and "tokenized" in argv
    pq.write_table(pa.table({"id": range(12), "text": [" ".join(topics[n].split()) for n in sorted(topics)[:12]]}),
                   tmp_path / "data.parquet", row_group_size=5)
    tokenizer.save(tmp_path / "tok.json")
    monkeypatch.chdir(tmp_path)
    small = ["--tokenizer", "tok.json", "--no-progress", "--no-plots", "--set", "examples.max_source_len=64",
             "--set", "examples.max_target_len=64"]
    assert main([*argv[1:], *small]) == 0
    assert dataset_mode(records.read_manifests("docs")) == "tokenized"
    namespace: dict = {}
    exec(compile(blocks[0], "wakong.md[section 7]", "exec"), namespace)
    assert namespace["features"]["input_ids"].shape == (32, 64)
    exec(compile(blocks[1], "wakong.md[section 9]", "exec"), namespace)
    assert namespace["batch"]["encoder_input_tokens"].shape == (32 * jax.process_count(), 64)
