"""End-to-end throughput of ``wakong build``: text in -> ArrayRecord shards + manifest out.

Corpus: Python's own documentation (``pydoc_data.topics``, 79 topics, ~465k characters), repeated;
configs: the article's defaults (sentence examples, word-level Wakong, exact ``wakong==1.1.1`` draws)
and the BART recipe (512-token documents, 30% token infilling + sentence permutation + 10% random
tokens).

Side by side, in this process, alternating for ``--rounds`` rounds so that both see the same load:

* ``reference``: the straightforward per-record path -- one record per ``make_outcomes`` call, the
  record's text encoded whole (no word cache), :func:`wakong.infilling.noise_example` example by
  example; in process;
* ``build``: the shipped path (batches of records, cached word tokenisation, vectorised noising and
  serialisation) with ``workers`` = 0, 1, 2 (worker interpreters building whole shards; their
  start-up is included).

Both write byte-identical shards (checked every run). ``tokens/s`` = label tokens written / wall
seconds of ``wakong.pipeline.build`` (reading, decoding, sentence splitting, tokenising, noising,
serialising, writing, sha256, manifest); ``CPU s`` = CPU seconds of this process and its workers.
The tokenizer is trained once beforehand. Medians over the rounds; the load average is recorded
before and after. ``--cold`` also times a whole ``wakong build --corpus pydoc`` in a fresh process
(imports, tokenizer training, build, report).

    python benchmarks/wakong_pipeline.py --repeat 20 --workers 0 1 2 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from wakong import examples, shards  # noqa: E402
from wakong.config import load_config  # noqa: E402
from wakong.pipeline import build, training_texts  # noqa: E402
from wakong.sources import PydocSource  # noqa: E402
from wakong.tokenizer import train_tokenizer  # noqa: E402

CONFIGS = {"article": "configs/wakong/article.yaml", "bart": "configs/wakong/bart.yaml"}


@contextlib.contextmanager
def _reference_path(tokenizer):
    """The straightforward path: a record per call, whole-text encoding, noise_example per example."""
    saved = shards.BATCH, examples._fast, tokenizer._cache
    shards.BATCH, examples._fast, tokenizer._cache = 1, (lambda noise: False), None
    try:
        yield
    finally:
        shards.BATCH, examples._fast, tokenizer._cache = saved


def _run(config_name: str, repeat: int, workers: int, tokenizer, reference: bool = False) -> dict:
    config = load_config(os.path.join(ROOT, CONFIGS[config_name]), ["input.format=pydoc"])
    with tempfile.TemporaryDirectory() as out, (_reference_path(tokenizer) if reference else contextlib.nullcontext()):
        before, start = os.times(), time.perf_counter()
        manifest = build(PydocSource(repeat), out, config, tokenizer=tokenizer, workers=workers)
        seconds, after = time.perf_counter() - start, os.times()
    cpu = sum(after[:4]) - sum(before[:4])  # user + system, this process and its (waited-for) workers
    return {
        "config": config_name,
        "path": "reference" if reference else "build",
        "repeat": repeat,
        "workers": workers,
        "examples": manifest["counts"]["examples"],
        "tokens": manifest["counts"]["tokens"],
        "seconds": seconds,
        "cpu_seconds": cpu,
        "shards": hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest(),
    }


def _cold_cli() -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        command = ["build", "--corpus", "pydoc", "--out", out, "--no-progress", "--no-plots"]
        subprocess.run([sys.executable, "-m", "wakong.cli", *command], cwd=ROOT, capture_output=True, check=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="copies of the corpus")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="worker counts of the build")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians are reported)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-reference", action="store_true", help="skip the reference path")
    parser.add_argument("--cold", action="store_true", help="also time a cold `wakong build --corpus pydoc`")
    args = parser.parse_args()

    load_before = os.getloadavg()
    config = load_config(os.path.join(ROOT, CONFIGS["article"]), ["input.format=pydoc"])
    tokenizer = train_tokenizer(training_texts(PydocSource(), config), vocab_size=8192)
    runs = []
    for _ in range(args.rounds):
        for name in args.configs:
            variants = [(0, True)] * (not args.no_reference) + [(w, False) for w in args.workers]
            for workers, reference in variants:
                runs.append(_run(name, args.repeat, workers, tokenizer, reference))
                print(json.dumps(runs[-1]), file=sys.stderr)
    for name in args.configs:
        digests = {r["shards"] for r in runs if r["config"] == name}
        assert len(digests) == 1, f"{name}: the paths or worker counts wrote different shards"
    rows = {}
    for r in runs:
        rows.setdefault((r["config"], r["path"], r["workers"]), []).append(r)
    print(f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print("| config | path | workers | examples | tokens | wall s | tokens/s | CPU s | tokens / CPU s | vs reference |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, path, workers), group in rows.items():
        seconds = statistics.median(r["seconds"] for r in group)
        cpu = statistics.median(r["cpu_seconds"] for r in group)
        tokens = group[0]["tokens"]
        base = rows.get((name, "reference", 0))
        ratio = f"{statistics.median(r['seconds'] for r in base) / seconds:.1f}x" if base else "-"
        print(f"| {name} | {path} | {workers} | {group[0]['examples']:,} | {tokens:,} | {seconds:.2f} | "
              f"{tokens / seconds:,.0f} | {cpu:.2f} | {tokens / cpu:,.0f} | {ratio} |")
    if args.cold:
        print(f"cold `wakong build --corpus pydoc` (fresh process, tokenizer training included): {_cold_cli():.2f} s")


if __name__ == "__main__":
    main()
