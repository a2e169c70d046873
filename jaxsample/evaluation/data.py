"""Evaluation and training data: built wakong datasets, built on demand from the ``pydoc`` corpus.

:func:`prepare` returns a dataset directory for a :class:`~jaxsample.evaluation.configs.DatasetConfig`:
an existing build is used as is; with ``corpus: pydoc`` the corpus (or its ``train`` / ``heldout``
split by topic) is built into ``path`` with :func:`wakong.pipeline.build`, unless ``path`` already
holds a build of the same records with the same settings and tokenizer. :func:`load_rows` reads a
dataset's examples in order as fixed-shape arrays (:func:`wakong.reader.batches`).
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Sequence

import numpy as np

from jaxsample.evaluation.configs import DatasetConfig, resolve


class SplitSource:
    """Records ``i`` of ``source`` with ``i % every == 0`` (``heldout``), the others (``train``) or all."""

    def __init__(self, source: Sequence[bytes], split: str, every: int):
        self.source, self.split, self.every = source, split, every
        n = len(source)
        held = np.arange(n) % every == 0
        self.indices = np.arange(n) if split == "all" else np.flatnonzero(held if split == "heldout" else ~held)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> bytes:
        return self.source[int(self.indices[i])]

    def describe(self) -> dict:
        inner = getattr(self.source, "describe", dict)()
        return {**inner, "split": self.split, "holdout_every": self.every}


def _manifest(path: str) -> dict | None:
    from wakong import records

    try:
        return records.read_manifests(path)
    except records.DatasetError:
        return None


def prepare(spec: DatasetConfig, *, relative_to: str | None = None, tokenizer=None,
            log: Callable[[str], None] | None = None) -> str:
    """The dataset directory of ``spec``, built from its corpus first if needed (see the module docstring).

    Args:
      relative_to: the config file ``spec`` comes from (resolves ``spec.build``).
      tokenizer: a :class:`wakong.tokenizer.TextTokenizer` to build with (overrides ``spec.tokenizer``).
      log: called with a line when a build happens.

    Raises:
      FileNotFoundError: no dataset at ``spec.path`` and no corpus to build one from.
    """
    from wakong import pipeline
    from wakong.config import load_config
    from wakong.sources import PydocSource
    from wakong.tokenizer import load_tokenizer

    found = _manifest(spec.path)
    if spec.corpus is None:
        if found is None:
            raise FileNotFoundError(
                f"dataset.path {spec.path} holds no built dataset (build one with `wakong build`, "
                "or set dataset.corpus: pydoc)"
            )
        return spec.path
    build_file = resolve(spec.build, "wakong", relative_to) if spec.build else None
    config = load_config(build_file, list(spec.build_set) + ["input.format=pydoc"])
    source = SplitSource(PydocSource(), spec.split, spec.holdout_every)
    if tokenizer is None and spec.tokenizer:
        tokenizer = load_tokenizer(spec.tokenizer, config.tokenizer.special)
    if found is not None and _same_build(found, config, source, tokenizer):
        return spec.path
    if log is not None:
        log(f"building {spec.corpus} ({spec.split}, {len(source)} records) into {spec.path}")
    pipeline.build(source, spec.path, config, tokenizer=tokenizer, overwrite=True)
    return spec.path


def _same_build(manifest: dict, config, source: SplitSource, tokenizer) -> bool:
    part = manifest["parts"][0]
    same = part["config_fingerprint"] == config.fingerprint() and part["source"] == {
        **source.describe(), "records": len(source)}
    return same and (tokenizer is None or manifest["tokenizer"]["sha256"] == tokenizer.sha256)


class Rows(NamedTuple):
    """Examples of a dataset as host arrays, in dataset order."""

    arrays: dict[str, np.ndarray]  # input_ids/attention_mask [R, S]; labels/loss_mask [R, T]; index/part [R]
    tokenizer: object  # wakong.tokenizer.TextTokenizer


def load_rows(path: str, *, max_rows: int | None = None, max_source_len: int | None = None,
              max_target_len: int | None = None) -> Rows:
    """The first ``max_rows`` examples of a built dataset (every shard, in order; no shuffling).

    Every host reads the same rows (evaluation sets are small); the runner splits the work.
    """
    from wakong.reader import batches, open_dataset

    _, tokenizer = open_dataset(path)
    keys = ("input_ids", "attention_mask", "labels", "loss_mask", "index", "part")
    chunks: dict[str, list] = {k: [] for k in keys}
    got = 0
    for batch in batches(path, batch_size=256, shuffle=False, num_epochs=1, process_index=0, process_count=1,
                         max_source_len=max_source_len, max_target_len=max_target_len):
        real = batch["index"] >= 0
        for k in keys:
            chunks[k].append(batch[k][real])
        got += int(real.sum())
        if max_rows is not None and got >= max_rows:
            break
    arrays = {k: np.concatenate(v)[:max_rows] for k, v in chunks.items()}
    if not len(arrays["index"]):
        raise ValueError(f"{path} holds no examples")
    return Rows(arrays, tokenizer)
