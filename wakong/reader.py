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
``format`` names the features for other trainers (``seqio``, ``t5x``, ``maxtext``:
:mod:`wakong.features`); ``pack=True`` packs several examples per row (grain's first-fit packing)
with segment ids and positions, ``index`` / ``part`` then being ``[B, max examples per row]``.

Documents for the device noiser (``documents=True``, the default for datasets built with
``output.mode: tokenized``): ``tokens``, ``word_starts``, ``sentence_starts`` ``[B, L]``, ``lengths``
``[B]`` (0 in padding rows), ``noise_keys uint32[B, 2]`` (a threefry key per example, from ``(seed,
epoch, record index, part)``: fresh masks every epoch, the same on any host count or after a
restart), ``index`` / ``part``; :class:`wakong.device_noise.DeviceNoiser` turns them into features
inside the train step. ``L`` is ``min(max_source_len, max_target_len) - 2``, the build's document
capacity.

:func:`global_batches` turns every host's batches into global ``jax.Array`` s on a mesh
(``jax.make_array_from_process_local_data``), keeping the iterator's state; :func:`host_states` and
:func:`restore_host_state` carry every host's state through a checkpoint's metadata (what
``python -m jaxsample train`` saves in its orbax checkpoints).

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

from wakong import features as _features
from wakong import records
from wakong.config import config_from_dict
from wakong.infilling import NoiseConfig, noise_example, pad_features
from wakong.tokenizer import TextTokenizer, load_tokenizer

_KEY_TAG = 0x6E6F6973  # separates noise keys from the host re-noising generator of the same example


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


def dataset_mode(info: dict) -> str:
    """``noised`` or ``tokenized``: what a dataset's records hold (its build's ``output.mode``)."""
    return info["config"].get("output", {}).get("mode", "noised")


def _generator(seed: int, epoch: int, index: int, part: int) -> random.Random:
    state = np.random.SeedSequence([seed, epoch, index, part]).generate_state(2, np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


def noise_key(seed: int, epoch: int, index: int, part: int) -> np.ndarray:
    """``uint32[2]``: the threefry key data that device noising uses for one example in one epoch."""
    return np.random.SeedSequence([seed, epoch, index, part, _KEY_TAG]).generate_state(2, np.uint32)


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
        record["epoch"] = position // self.n_records
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


class _Documents(grain.transforms.Map):
    """Record -> one unnoised document row for the device noiser (see the module docstring)."""

    def __init__(self, seed: int, max_len: int):
        self.seed, self.max_len = seed, max_len

    def map(self, record: dict) -> dict:
        body = record["labels"][1:-1]
        row = self.empty()
        row["tokens"][: len(body)] = body
        row["word_starts"][: len(body)] = record["word_starts"][1:-1]
        row["sentence_starts"][: len(body)] = record["sentence_starts"][1:-1]
        row["lengths"] = np.int32(len(body))
        row["noise_keys"] = noise_key(self.seed, record["epoch"], record["index"], record["part"])
        row["index"], row["part"] = np.int64(record["index"]), np.int32(record["part"])
        return row

    def empty(self) -> dict:
        """A padding row: length 0 (the noiser outputs all padding, no loss), index -1."""
        n = self.max_len
        return {"tokens": np.zeros(n, np.int32), "lengths": np.int32(0), "word_starts": np.zeros(n, bool),
                "sentence_starts": np.zeros(n, bool), "noise_keys": np.zeros(2, np.uint32),
                "index": np.int64(-1), "part": np.int32(-1)}


class _Sequences(grain.transforms.Map):
    """Record -> variable-length ``inputs`` / ``targets`` (with BOS/EOS) for packing."""

    def map(self, record: dict) -> dict:
        return {"inputs": record["input_ids"], "targets": record["labels"], "index": np.int64(record["index"]),
                "part": np.int32(record["part"])}


class _Packed(grain.transforms.Map):
    """A packed row of grain's first-fit packer -> canonical rows (:mod:`wakong.features`), with the
    record indices of its examples in ``index`` / ``part`` (``-1`` after the last)."""

    def __init__(self, max_segments: int):
        self.max_segments = max_segments

    def map(self, row: dict) -> dict:
        out = {}
        for side, key in (("source", "inputs"), ("target", "targets")):
            out[side] = np.asarray(row[key], np.int32)
            out[f"{side}_segments"] = np.asarray(row[f"{key}_segment_ids"], np.int32)
            out[f"{side}_positions"] = np.asarray(row[f"{key}_positions"], np.int32)
        for key, dtype in (("index", np.int64), ("part", np.int32)):
            values = np.full(self.max_segments, -1, dtype)
            values[: len(row[key])] = row[key]
            out[key] = values
        return out


def _stack_padded(elements, *, batch_size: int, empty: dict, layout=None) -> dict:
    rows = list(elements) + [empty] * (batch_size - len(elements))
    batch = {key: np.stack([row[key] for row in rows]) for key in empty}
    return batch if layout is None else layout(batch)


def _canonical_empty(source_len: int, target_len: int, max_segments: int) -> dict:
    row = {}
    for side, n in (("source", source_len), ("target", target_len)):
        row[side] = row[f"{side}_segments"] = row[f"{side}_positions"] = np.zeros(n, np.int32)
    row["index"], row["part"] = np.full(max_segments, -1, np.int64), np.full(max_segments, -1, np.int32)
    return row


class _Layout:
    """Batch -> the features of ``fmt`` (``index`` / ``part`` kept); picklable for grain workers."""

    def __init__(self, fmt: str, pad_id: int, decoder_start_id: int, packed: bool):
        self.fmt, self.packed = fmt, packed
        self.ids = dict(pad_id=pad_id, decoder_start_id=decoder_start_id)

    def __call__(self, batch: dict) -> dict:
        rows = batch if self.packed else _features.canonical_from_hf(batch)
        out = _features.layout(rows, self.fmt, packed=self.packed, **self.ids)
        return {**out, "index": batch["index"], "part": batch["part"]}


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
    documents: bool | None = None,
    format: str = "hf",
    pack: bool = False,
    pack_bins: int | None = None,
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
      documents: yield unnoised documents for the device noiser (default: for tokenized datasets
        read without ``renoise``).
      format: feature names, ``hf`` (default), ``seqio``, ``t5x`` or ``maxtext`` (:mod:`wakong.features`).
      pack: pack several examples per row (grain's first-fit packing) with segment ids and positions.
      pack_bins: rows the packer fills at once (default ``batch_size``); more bins, less padding.
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
    _features.check_format(format)
    info, tokenizer = open_dataset(path, part)
    mode = dataset_mode(info)
    documents = (mode == "tokenized" and renoise is None) if documents is None else bool(documents)
    if mode == "tokenized" and renoise is None and not documents:
        raise ValueError(f"{path} holds tokenized documents (no stored masks): read them with documents=True "
                         "(noised on the device) or renoise=NoiseConfig(...) (noised on the host)")
    if documents and (renoise is not None or pack or format != "hf"):
        raise ValueError("documents are noised on the device: renoise, pack and format do not apply (lay out "
                         "the noiser's features with wakong.features.layout)")
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
    layout = None if format == "hf" and not pack else _Layout(format, tokenizer.pad_id,
                                                               tokenizer.decoder_start_id, pack)
    if documents:
        rows = _Documents(seed, min(source_len, target_len) - 2)
        ds, empty = ds.map(rows), rows.empty()
    elif pack:
        max_segments = target_len // 3  # an example has at least BOS, one token and EOS
        ds = grain.experimental.FirstFitPackIterDataset(
            ds.map(_Sequences()).to_iter_dataset(), length_struct={"inputs": source_len, "targets": target_len},
            num_packing_bins=pack_bins or batch_size, shuffle_bins=False, meta_features=("index", "part"),
            max_sequences_per_bin=max_segments,
        ).map(_Packed(max_segments))
        empty = _canonical_empty(source_len, target_len, max_segments)
    else:
        features = _Features(tokenizer.pad_id, tokenizer.decoder_start_id, source_len, target_len)
        ds, empty = ds.map(features), features.empty()
    batch_fn = functools.partial(_stack_padded, batch_size=batch_size, empty=empty, layout=layout)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)
    ds = ds if pack else ds.to_iter_dataset()  # packing already made an IterDataset
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
        "documents": documents,
        "format": format,
        "pack": pack,
        "pack_bins": (pack_bins or batch_size) if pack else None,
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


def global_batches(batches, mesh=None, *, sharding=None):
    """This host's batches -> global ``jax.Array`` s split by rows over a mesh, across hosts.

    Every host passes its own iterator (:func:`batches` shards by ``jax.process_index()``); each batch
    becomes ``jax.make_array_from_process_local_data(sharding, rows)`` per feature, so the global
    batch has ``process_count`` times the rows. ``sharding`` defaults to rows split over every axis
    of ``mesh``. The returned iterator keeps the wrapped one's ``get_state()`` / ``set_state()``.
    """
    from jax.sharding import NamedSharding, PartitionSpec

    if sharding is None:
        if mesh is None:
            raise ValueError("give a mesh or a sharding for the rows")
        sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    return _GlobalIterator(iter(batches), sharding)


class _GlobalIterator:
    def __init__(self, local, sharding):
        self._local, self.sharding = local, sharding

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        import jax

        return {k: jax.make_array_from_process_local_data(self.sharding, np.asarray(v))
                for k, v in next(self._local).items()}

    def get_state(self):
        return self._local.get_state()

    def set_state(self, state) -> None:
        self._local.set_state(state)


def host_states(iterator) -> list:
    """Every host's ``iterator.get_state()``, in process order, on every host (an allgather): what a
    checkpoint's metadata holds so that each host resumes its own stream."""
    from jaxsample import distributed

    mine = json.dumps(iterator.get_state()).encode()
    return [json.loads(state) for state in distributed.allgather_bytes(mine)]


def restore_host_state(iterator, states) -> bool:
    """Restores this host's state from :func:`host_states`' list; ``False`` (nothing restored) when the
    list is missing or was saved by another number of hosts."""
    from jaxsample import distributed

    if not isinstance(states, list) or len(states) != distributed.process_count():
        return False
    iterator.set_state(states[distributed.process_index()])
    return True
