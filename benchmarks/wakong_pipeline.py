"""End-to-end throughput of the wakong pipeline: text in -> ArrayRecord shards + manifest out.

Corpus: Python's own documentation (``pydoc_data.topics``, 79 topics, ~465k characters), once and
repeated; configs: the article's defaults (sentence examples, word-level Wakong) and the BART recipe
(512-token documents, 30% token infilling + sentence permutation + 10% random tokens).

``tokens/s`` = target tokens written / wall-clock seconds of ``wakong.pipeline.build`` (reading,
decoding, sentence splitting, tokenising, noising, serialising, writing, manifest; grain worker start-up
included). The tokenizer is trained once beforehand and timed separately, as is a cold ``wakong build``
run of the whole CLI in a fresh process.

    python benchmarks/wakong_pipeline.py --repeat 20 --workers 0 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from wakong.config import load_config  # noqa: E402
from wakong.pipeline import build, training_texts  # noqa: E402
from wakong.sources import PydocSource  # noqa: E402
from wakong.tokenizer import train_tokenizer  # noqa: E402

CONFIGS = {"article": "configs/wakong/article.yaml", "bart": "configs/wakong/bart.yaml"}


def _run(config_name: str, repeat: int, workers: int, tokenizer) -> dict:
    config = load_config(os.path.join(ROOT, CONFIGS[config_name]), ["input.format=pydoc"])
    with tempfile.TemporaryDirectory() as out:
        start, cpu = time.perf_counter(), time.process_time()
        manifest = build(PydocSource(repeat), out, config, tokenizer=tokenizer, workers=workers)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        size = sum(s["bytes"] for s in manifest["shards"])
    c = manifest["counts"]
    return {
        "config": config_name,
        "corpus": f"pydoc x{repeat}",
        "workers": workers,
        "records": c["records_in"],
        "examples": c["examples"],
        "tokens": c["tokens"],
        "seconds": round(seconds, 3),
        "tokens_per_second": round(c["tokens"] / seconds),
        # CPU of this process only: with workers it is just the writer; without, the whole pipeline.
        "main_cpu_seconds": round(cpu, 3),
        "shard_mb": round(size / 2**20, 2),
    }


def _cold_cli() -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        command = ["build", "--corpus", "pydoc", "--out", out, "--no-progress", "--no-plots"]
        done = subprocess.run(
            [sys.executable, "-m", "wakong.cli", *command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        seconds = time.perf_counter() - start
        with open(os.path.join(out, "manifest-00000-of-00001.json")) as f:
            tokens = json.load(f)["counts"]["tokens"]
    assert "records in" in done.stdout
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_second": round(tokens / seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="copies of the corpus for the large run")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="grain worker counts")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-cold", action="store_true", help="skip the cold CLI run")
    args = parser.parse_args()

    load_before = os.getloadavg()
    config = load_config(os.path.join(ROOT, CONFIGS["article"]), ["input.format=pydoc"])
    start = time.perf_counter()
    tokenizer = train_tokenizer(training_texts(PydocSource(), config), vocab_size=8192)
    training = time.perf_counter() - start
    rows = []
    for name in args.configs:
        for repeat in (1, args.repeat):
            for workers in args.workers:
                rows.append(_run(name, repeat, workers, tokenizer))
                print(json.dumps(rows[-1]), file=sys.stderr)
    cold = None if args.no_cold else _cold_cli()
    result = {
        "cpu_count": os.cpu_count(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "tokenizer_training_seconds": round(training, 2),
        "runs": rows,
        "cold_cli_pydoc": cold,
    }
    print("| config | corpus | workers | examples | tokens | wall s | tokens/s | main-process CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['config']} | {r['corpus']} | {r['workers']} | {r['examples']:,} | {r['tokens']:,} | "
            f"{r['seconds']:.2f} | {r['tokens_per_second']:,} | {r['main_cpu_seconds']:.2f} |"
        )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
