"""``wakong build --runner beam`` on Beam's DirectRunner against the in-process build, side by side.

Same corpus (Python's docs, repeated), config and tokenizer (trained once beforehand) for every mode;
rounds alternate the modes so that the machine's load hits each alike. Modes: ``local``
(``wakong.pipeline.build``, one process), ``beam`` (``wakong.beam.build``, DirectRunner in this
process), ``beam xN`` (DirectRunner with N worker processes). Wall time is the whole library call
(Beam's start-up included); every mode must write the same shards (their sha256 are compared).

    python -m benchmarks.wakong_beam --repeat 10 --num-shards 8 --workers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from wakong import beam, pipeline  # noqa: E402
from wakong.config import load_config  # noqa: E402
from wakong.sources import PydocSource  # noqa: E402


def _time(mode: str, source, config, tok, workers: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        if mode == "local":
            manifest = pipeline.build(source, out, config, tokenizer=tok)
        else:
            options = beam.pipeline_options(workers=workers if mode != "beam" else 0)
            manifest = beam.build(source, out, config, tokenizer=tok, options=options)
            manifest = manifest["parts"][0]
        return time.perf_counter() - start, manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="article", help="shipped wakong config")
    parser.add_argument("--repeat", type=int, default=10, help="copies of the pydoc corpus")
    parser.add_argument("--num-shards", type=int, default=8, help="output shards (Beam tasks)")
    parser.add_argument("--workers", type=int, default=2, help="DirectRunner worker processes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    path = os.path.join(ROOT, "configs", "wakong", f"{args.config}.yaml")
    config = load_config(path, ["input.format=pydoc", f"output.num_shards={args.num_shards}"])
    source = PydocSource(args.repeat)
    tok = pipeline.resolve_tokenizer(config, source)
    modes = ["local", "beam", f"beam x{args.workers}"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    shards, tokens, loads = {}, None, []
    for _ in range(args.rounds):
        for mode in modes:
            loads.append(os.getloadavg()[0])
            seconds, manifest = _time(mode, source, config, tok, args.workers)
            times[mode].append(seconds)
            shards[mode] = [s["sha256"] for s in manifest["shards"]]
            tokens = manifest["counts"]["tokens"]
    assert all(s == shards["local"] for s in shards.values()), "the modes wrote different shards"
    base = statistics.median(times["local"])
    print(f"{args.config}, pydoc x{args.repeat}, {args.num_shards} shards, {tokens:,} label tokens; "
          f"{args.rounds} rounds; load average {min(loads):.1f}-{max(loads):.1f}; shards identical in every mode")
    print("| mode | wall s (median, min-max) | tokens/s | vs local |")
    print("|---|---|---:|---:|")
    for mode in modes:
        t = times[mode]
        med = statistics.median(t)
        print(f"| {mode} | {med:.2f} ({min(t):.2f}-{max(t):.2f}) | {tokens / med:,.0f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
