"""Fixed-shape BART training batches from a built dataset, sharded by host and resumable.

:func:`batches` returns a grain ``IterDataset``; its iterator's ``get_state()`` is a small JSON-able dict
and ``set_state()`` resumes exactly after the last batch returned (no duplicates, no gaps)::

    ds = batches("data/", batch_size=32, seed=0, num_epochs=None)
    it = iter(ds)
    batch = next(it)            # dict of numpy arrays, shapes fixed for jit
    state = it.get_state()      # save with the model checkpoint; later: it.set_state(state)

A state records the pipeline it belongs to -- the dataset (its manifest's shards, tokenizer and
settings), ``batch_size``, ``seed``, ``shuffle``, ``num_epochs``, the host share or ``part``,
``drop_remainder``, ``renoise``, the padded lengths and ``workers`` -- and ``set_state`` refuses a state
of another pipeline with a ``ValueError`` naming what differs (restore with the same arguments; a
state cannot move between worker counts, whose grain states differ), or one that is not a state of
this reader at all.

Pipeline: ArrayRecord shards -> shuffle(seed) (a fresh permutation per epoch) -> repeat(num_epochs) ->
decode (and optionally re-noise) -> ``[process_index::process_count]`` -> pad to fixed shapes -> batch.
Re-noising (``renoise=NoiseConfig(...)``) draws new masks every epoch from the stored original tokens,
with a generator that depends only on ``(seed, epoch, record index, part)`` -- never on the host count,
the shuffle order or restarts. Without it the masks written by the build are used.

Batches hold ``input_ids``, ``attention_mask`` ``[B, max_source_len]``; ``decoder_input_ids``,
``decoder_attention_mask``, ``labels``, ``loss_mask`` ``[B, max_target_len]``; ``index`` / ``part``
``[B]`` (the example's record index, ``-1`` in padding rows). With ``drop_remainder=False`` the last
batch of a finite run is completed with padding rows (``loss_mask`` all False), so no example is lost.
For multi-host training use ``num_epochs=None`` so every host yields the same number of batches.

Hosts read a dataset in one of two ways: every host reads all parts (a shared filesystem) and takes
every ``process_count``-th example of the shuffled stream (the default), or each host reads the part
it built, whole (``part=jax.process_index()``: hosts without a shared filesystem; parts hold different
numbers of examples, so train with ``num_epochs=None`` there too).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random

import grain
import numpy as np

from wakong import records
from wakong.config import config_from_dict
from wakong.infilling import NoiseConfig, noise_example, pad_features
from wakong.tokenizer import TextTokenizer, load_tokenizer


def open_dataset(path: str | os.PathLike, part: int | None = None) -> tuple[dict, TextTokenizer]:
    """The combined manifest of a dataset directory (or of one ``part``) and its checked tokenizer."""
    path = os.fspath(path)
    info = records.read_manifests(path, part)
    config = config_from_dict(info["config"])
    tokenizer = load_tokenizer(os.path.join(path, info["tokenizer"]["file"]), config.tokenizer.special)
    if tokenizer.sha256 != info["tokenizer"]["sha256"]:
        raise records.DatasetError(f"{path}/tokenizer.json does not match the sha256 in the manifest")
    return info, tokenizer


def record_example(record: dict) -> list[list[tuple[int, ...]]]:
    """The original example (sentences of words of token ids) stored in a record's labels."""
    body = record["labels"][1:-1].tolist()
    words = np.flatnonzero(record["word_starts"][1:-1]).tolist() + [len(body)]
    sentence_starts = set(np.flatnonzero(record["sentence_starts"][1:-1]).tolist())
    example: list = []
    for a, b in zip(words[:-1], words[1:]):
        if a in sentence_starts or not example:
            example.append([])
        example[-1].append(tuple(body[a:b]))
    return example


def _generator(seed: int, epoch: int, index: int, part: int) -> random.Random:
    state = np.random.SeedSequence([seed, epoch, index, part]).generate_state(2, np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


class ShardSource:
    """grain's ``ArrayRecordDataSource`` over a dataset's shards (``open_dataset``'s ``info``); a read
    that fails (a corrupt shard) raises ``DatasetError`` naming the shard."""

    def __init__(self, info: dict):
        self.files = list(info["files"])
        self._ends = np.cumsum([s["records"] for p in info["parts"] for s in p["shards"]])
        self._source = grain.sources.ArrayRecordDataSource(self.files)

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> bytes:
        try:
            return self._source[index]
        except Exception as err:  # ArrayRecord/riegeli raise RuntimeError for damaged chunks
            file = self.files[min(int(np.searchsorted(self._ends, index, side="right")), len(self.files) - 1)]
            reason = " ".join(str(err).split())[:300]
            raise records.DatasetError(f"shard {file} is corrupt or unreadable: {reason}") from None


class _Decode(grain.transforms.MapWithIndex):
    """Stream position + record bytes -> record dict, re-noised for the position's epoch if asked."""

    def __init__(
        self, n_records: int, seed: int, renoise: NoiseConfig | None, tokenizer: TextTokenizer, source_body: int
    ):
        self.n_records, self.seed, self.renoise = n_records, seed, renoise
        self.tokenizer, self.source_body = tokenizer, source_body

    def map_with_index(self, position: int, data: bytes) -> dict:
        record = records.decode_record(data)
        if self.renoise is not None:
            rng = _generator(self.seed, position // self.n_records, record["index"], record["part"])
            tok = self.tokenizer
            options = dict(mask_id=tok.mask_id, vocab=tok.random_ids, max_source=self.source_body)
            noised = noise_example(record_example(record), rng, self.renoise, **options)
            record = {
                **record,
                "input_ids": np.asarray([tok.bos_id, *noised.source, tok.eos_id], np.int32),
                "labels": np.asarray([tok.bos_id, *noised.target, tok.eos_id], np.int32),
            }
        return record


class _Features(grain.transforms.Map):
    def __init__(self, pad_id: int, decoder_start_id: int, max_source_len: int, max_target_len: int):
        self.kwargs = dict(
            pad_id=pad_id,
            decoder_start_id=decoder_start_id,
            max_source_len=max_source_len,
            max_target_len=max_target_len,
        )

    def map(self, record: dict) -> dict:
        features = pad_features(record["input_ids"], record["labels"], **self.kwargs)
        features["index"] = np.int64(record["index"])
        features["part"] = np.int32(record["part"])
        return features

    def empty(self) -> dict:
        """A padding row: all pad, no attention, no loss, index -1."""
        features = pad_features([], [], **self.kwargs)
        features["input_ids"][:] = features["decoder_input_ids"][:] = self.kwargs["pad_id"]
        features["index"], features["part"] = np.int64(-1), np.int32(-1)
        return features


def _stack_padded(elements, *, batch_size: int, empty: dict) -> dict:
    rows = list(elements) + [empty] * (batch_size - len(elements))
    return {key: np.stack([row[key] for row in rows]) for key in empty}


def batches(
    path: str | os.PathLike,
    *,
    batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    process_index: int | None = None,
    process_count: int | None = None,
    part: int | None = None,
    drop_remainder: bool = False,
    renoise: NoiseConfig | None = None,
    max_source_len: int | None = None,
    max_target_len: int | None = None,
    workers: int = 0,
) -> grain.IterDataset:
    """Fixed-shape training batches of a built dataset (see the module docstring).

    Args:
      path: dataset directory (all its parts are read).
      batch_size: rows per batch on this host.
      seed: shuffle (and re-noise) seed.
      shuffle: shuffle records, with a new permutation each epoch.
      num_epochs: passes over the data; ``None`` repeats forever.
      process_index, process_count: this host's share; default ``jax.process_index()/process_count()``.
      part: read only the part built by process ``part`` and all of it, instead of sharing every part
        (hosts without a shared filesystem, each holding the part it built: ``part=jax.process_index()``).
      drop_remainder: drop a final partial batch instead of padding it.
      renoise: draw new masks each epoch with this noise config (default: the build's masks).
      max_source_len, max_target_len: padded lengths, at least the build's (default: the build's).
      workers: grain worker processes (0: in this process).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}")
    if part is not None:
        if process_index is not None or process_count is not None:
            raise ValueError("give part (read one part whole) or process_index/process_count, not both")
        process_index, process_count = 0, 1
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    info, tokenizer = open_dataset(path, part)
    built = config_from_dict(info["config"]).examples
    source_len = built.max_source_len if max_source_len is None else max_source_len
    target_len = built.max_target_len if max_target_len is None else max_target_len
    if source_len < built.max_source_len or target_len < built.max_target_len:
        raise ValueError(
            f"max_source_len/max_target_len {source_len}/{target_len} are below the build's "
            f"{built.max_source_len}/{built.max_target_len}; rebuild the dataset for shorter examples"
        )
    ds = grain.MapDataset.source(ShardSource(info))
    n_records = len(ds)
    if n_records == 0:
        raise records.DatasetError(f"{path} holds no examples")
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    ds = ds.map_with_index(_Decode(n_records, seed, renoise, tokenizer, built.max_source_len - 2))
    ds = ds[process_index::process_count]
    features = _Features(tokenizer.pad_id, tokenizer.decoder_start_id, source_len, target_len)
    ds = ds.map(features)
    batch_fn = functools.partial(_stack_padded, batch_size=batch_size, empty=features.empty())
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn).to_iter_dataset()
    ds = mp_prefetch(ds, workers) if workers > 0 else ds
    pipeline = {
        "dataset": dataset_id(info),
        "batch_size": batch_size,
        "seed": seed,
        "shuffle": shuffle,
        "num_epochs": num_epochs,
        "process_index": process_index,
        "process_count": process_count,
        "part": part,
        "drop_remainder": drop_remainder,
        "renoise": None if renoise is None else _digest(dataclasses.asdict(renoise)),
        "max_source_len": source_len,
        "max_target_len": target_len,
        "workers": workers,
    }
    return _Tied(ds, pipeline)


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def dataset_id(info: dict) -> str:
    """A short hash of what a dataset's examples depend on: its parts' shards, tokenizer and settings."""
    parts = [(p["process_index"], p["process_count"], p["shards"]) for p in info["parts"]]
    return _digest([parts, info["tokenizer"]["sha256"], info["config_fingerprint"], info["seed"]])


class _TiedIterator(grain.DatasetIterator):
    """Batches of the parent; states carry the pipeline's description and are checked on restore."""

    def __init__(self, parent: grain.DatasetIterator, pipeline: dict):
        super().__init__(parent)
        self._pipeline = pipeline

    def __next__(self):
        return next(self._parent)

    def get_state(self) -> dict:
        return {"wakong_reader": dict(self._pipeline), "grain": self._parent.get_state()}

    def set_state(self, state) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("wakong_reader"), dict) or "grain" not in state:
            raise ValueError(
                "not a state of wakong.reader.batches (expected a dict with 'wakong_reader' and 'grain', from "
                f"get_state()); got {_short(state)}"
            )
        saved = state["wakong_reader"]
        differ = [f"{k} {saved.get(k)!r} != {v!r}" for k, v in self._pipeline.items() if saved.get(k) != v]
        if differ:
            raise ValueError(
                "the state was saved by another reader pipeline (saved != this one): " + "; ".join(differ)
                + ". Restore it into batches() with the same dataset and arguments"
            )
        try:
            self._parent.set_state(state["grain"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            reason = f"{type(err).__name__}: {err}"
            raise ValueError(f"the reader state is damaged: grain cannot restore it ({reason})") from None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Tied(grain.IterDataset):
    """``parent`` whose iterators tie their states to ``pipeline`` (see :class:`_TiedIterator`)."""

    def __init__(self, parent: grain.IterDataset, pipeline: dict):
        super().__init__(parent)
        self._pipeline = pipeline

    def __iter__(self) -> _TiedIterator:
        return _TiedIterator(self._parent.__iter__(), self._pipeline)


def mp_prefetch(ds: grain.IterDataset, workers: int, **options) -> grain.IterDataset:
    """``ds.mp_prefetch`` with ``workers`` grain worker processes (``options``: more
    ``grain.MultiprocessingOptions``), after marking absl flags parsed, which the workers read."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, **options))
