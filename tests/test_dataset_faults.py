"""Reliability of built datasets and reader states: corruption found by ``wakong inspect --verify`` and
reported in one line naming the file (also when sample examples hit it), old manifests without hashes,
and reader states tied to their pipeline (mismatches and garbage refused with a clear ValueError)."""

import json
import os
import shutil

import pytest

from tests.test_pipeline import SMALL, built, corpus, tokenizer  # noqa: F401  (fixtures)
from wakong import records
from wakong.cli import main
from wakong.config import load_config
from wakong.pipeline import build
from wakong.reader import batches
from wakong.sources import TextSource


@pytest.fixture()
def copy(tmp_path, built):  # noqa: F811
    out = tmp_path / "data"
    shutil.copytree(built, out)
    return out


def _flip(path: str, offset: int) -> None:
    data = bytearray(open(path, "rb").read())
    data[offset % len(data)] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert err.startswith("wakong: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ---------------------------------------------------------------- corruption


def test_manifest_records_every_shard_hash_and_verify_passes(built, capsys):  # noqa: F811
    info = records.read_manifests(built)
    assert all(len(s["sha256"]) == 64 for p in info["parts"] for s in p["shards"])
    assert records.verify_shards(info) == sum(s["bytes"] for p in info["parts"] for s in p["shards"])
    assert main(["inspect", built, "--verify", "--examples", "0"]) == 0
    assert "every sha256 matches" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_verify_finds_a_flipped_byte_anywhere(copy, capsys, where):
    shard = records.read_manifests(str(copy))["files"][1]
    size = os.path.getsize(shard)
    _flip(shard, {"start": 70, "middle": size // 2, "end": size - 10}[where])
    assert main(["inspect", str(copy), "--verify", "--examples", "0"]) == 1
    _one_line_error(capsys, shard, "is corrupt")


def test_sample_examples_hitting_damage_give_one_line(copy, capsys):
    shard = records.read_manifests(str(copy))["files"][0]
    _flip(shard, 70)  # inside the first chunk: reading the first examples fails
    assert main(["inspect", str(copy), "--examples", "3"]) == 1
    _one_line_error(capsys, shard, "corrupt or unreadable")
    with pytest.raises(records.DatasetError, match="corrupt or unreadable"):
        records.read_shard(shard)


def test_training_batches_hitting_damage_name_the_shard(copy):
    shard = records.read_manifests(str(copy))["files"][1]
    _flip(shard, 70)
    with pytest.raises(records.DatasetError, match=f"shard {shard} is corrupt or unreadable"):
        list(batches(str(copy), batch_size=8, shuffle=False, process_index=0, process_count=1))


def test_damaged_record_bytes_are_a_dataset_error(built):  # noqa: F811
    data = records.encode_record(3, 0, [0, 7, 2], [0, 7, 8, 2], [0, 1, 1, 0], [0, 1, 0, 0])
    assert records.decode_record(data)["index"] == 3
    for damaged, message in ((data[:-1], "damaged"), (data + b"x", "damaged"), (data[:10], "shorter than its header"),
                             (b"XXXX" + data[4:], "not a wakong example record")):
        with pytest.raises(records.DatasetError, match=message):
            records.decode_record(damaged)


def test_truncated_or_missing_shard_is_named(copy, capsys):
    shard = records.read_manifests(str(copy))["files"][2]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    assert main(["inspect", str(copy)]) == 1
    _one_line_error(capsys, shard, "size differs")
    os.remove(shard)
    assert main(["inspect", str(copy), "--verify"]) == 1
    _one_line_error(capsys, shard, "missing")


def test_datasets_without_hashes_stay_readable_and_verify_refuses_clearly(copy, capsys):
    for name in [records.manifest_name(0, 1)]:
        path = copy / name
        manifest = json.loads(path.read_text())
        for shard in manifest["shards"]:
            del shard["sha256"]
        path.write_text(json.dumps(manifest))
    assert main(["inspect", str(copy), "--examples", "1"]) == 0  # still readable
    assert len(list(batches(str(copy), batch_size=64, process_index=0, process_count=1))) > 0
    capsys.readouterr()
    assert main(["inspect", str(copy), "--verify"]) == 1
    _one_line_error(capsys, "records no sha256", "rebuild to verify")


# ---------------------------------------------------------------- reader states


def _reader(path, **kw):
    args = dict(batch_size=8, seed=5, num_epochs=2, process_index=0, process_count=1)
    return batches(path, **{**args, **kw})


def _state_after(path, steps=3, **kw):
    it = iter(_reader(path, **kw))
    for _ in range(steps):
        next(it)
    return json.loads(json.dumps(it.get_state()))


def test_state_records_its_pipeline_and_resumes_exactly(built):  # noqa: F811
    state = _state_after(built)
    assert state["wakong_reader"]["batch_size"] == 8 and state["wakong_reader"]["workers"] == 0
    rest = list(_reader(built))[3:]
    resumed = iter(_reader(built))
    resumed.set_state(state)
    assert [b["index"].tolist() for b in resumed] == [b["index"].tolist() for b in rest]


@pytest.mark.parametrize("changed,message", [
    (dict(batch_size=4), "batch_size 8 != 4"),
    (dict(seed=6), "seed 5 != 6"),
    (dict(num_epochs=3), "num_epochs 2 != 3"),
    (dict(shuffle=False), "shuffle True != False"),
    (dict(process_index=1, process_count=2), "process_count 1 != 2"),
    (dict(drop_remainder=True), "drop_remainder False != True"),
    (dict(max_target_len=80), "max_target_len 64 != 80"),
])
def test_state_restored_into_another_pipeline_is_refused(built, changed, message):  # noqa: F811
    state = _state_after(built)
    it = iter(_reader(built, **changed))
    with pytest.raises(ValueError, match="another reader pipeline") as info:
        it.set_state(state)
    assert message in str(info.value)


def test_state_of_another_dataset_is_refused(built, tmp_path, corpus, tokenizer):  # noqa: F811
    other = tmp_path / "other"
    build(TextSource([corpus], "paragraph"), other, load_config(overrides=SMALL + ["input.split=paragraph", "seed=9"]),
          tokenizer=tokenizer)
    with pytest.raises(ValueError, match="dataset"):
        iter(_reader(str(other))).set_state(_state_after(built))


def test_worker_count_change_is_refused_both_ways(built):  # noqa: F811
    in_process = _state_after(built, steps=1)
    with_workers = dict(in_process, wakong_reader={**in_process["wakong_reader"], "workers": 2})
    with pytest.raises(ValueError, match="workers 0 != 2"):
        iter(_reader(built, workers=2)).set_state(in_process)  # refused before any worker starts
    with pytest.raises(ValueError, match="workers 2 != 0"):
        iter(_reader(built)).set_state(with_workers)


@pytest.mark.slow
def test_worker_state_resumes_and_is_refused_in_process(built):  # noqa: F811
    it = iter(_reader(built, workers=2))
    head = [next(it) for _ in range(2)]
    state = it.get_state()
    assert state["wakong_reader"]["workers"] == 2
    with pytest.raises(ValueError, match="workers 2 != 0"):
        iter(_reader(built)).set_state(state)
    resumed = iter(_reader(built, workers=2))
    resumed.set_state(state)
    full = list(_reader(built))
    assert [b["index"].tolist() for b in head + list(resumed)] == [b["index"].tolist() for b in full]


@pytest.mark.parametrize("garbage", [None, 3, "state", {}, {"next_index": 4}, {"grain": {}},
                                     {"wakong_reader": "x", "grain": {}}])
def test_garbage_state_is_a_clear_value_error(built, garbage):  # noqa: F811
    with pytest.raises(ValueError, match="not a state of wakong.reader.batches"):
        iter(_reader(built)).set_state(garbage)


def test_damaged_inner_state_is_a_clear_value_error(built):  # noqa: F811
    state = _state_after(built)
    for inner in ({}, {"parent": None}, "x"):
        with pytest.raises(ValueError, match="reader state is damaged"):
            iter(_reader(built)).set_state({**state, "grain": inner})
