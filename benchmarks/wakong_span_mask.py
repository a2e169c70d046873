"""Throughput of ``wakong.span_mask`` against the reference ``wakong==1.1.1``, in sequences per second.

    /work/venv/bin/python benchmarks/wakong_span_mask.py [--seq-len 512] [--batch 1024 4096 16384]
        [--rounds 5] [--reference-python /work/wakong_ref_venv/bin/python]

* reference: ``generate_mask_scheme(rng, seq_len)`` timed inside the reference's own interpreter
  (a subprocess of ``--reference-python``, default ``$WAKONG_REFERENCE_PYTHON``); without it, our
  bit-exact port (same calls, same speed) timed by the same snippet with this checkout on the path;
* ``span_mask``: one jitted call per batch of ``--batch`` rows of ``--seq-len`` words (masks for
  every row, blocked until ready), best of three runs of ``--calls`` calls after as many warm-up
  calls (steady-state throughput, as in a data pipeline).

The reference is single-threaded; XLA:CPU may split ``span_mask``'s larger fusions across cores, but
running it with one intra-op thread gives the same times here, so the ratio is per core (the CPU
time is printed next to the wall time). Reference and ``span_mask``
timings alternate for ``--rounds`` rounds, so that both sides see the same load of a shared machine;
the summary gives the median ratio.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

REFERENCE_SNIPPET = """
import random, sys, time
import wakong
seq_len, n = int(sys.argv[1]), int(sys.argv[2])
best = float("inf")
for rep in range(3):
    rng = random.Random(rep)
    t0 = time.perf_counter()
    for _ in range(n):
        wakong.generate_mask_scheme(rng, seq_len)
    best = min(best, time.perf_counter() - t0)
print(best / n)
"""


def scheme_seconds(python: str, seq_len: int, n: int, path: str | None = None) -> float:
    """Seconds per ``wakong.generate_mask_scheme`` call (best of 3 runs of ``n``), timed in a fresh
    interpreter ``python`` importing ``wakong`` from its own environment, or from ``path`` if given."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = path
    cmd = [python, "-c", REFERENCE_SNIPPET, str(seq_len), str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd="/")
    return float(out.stdout.strip())


def port_seconds(seq_len: int, n: int) -> float:
    """Seconds per scheme of our bit-exact port (this checkout's ``wakong``), timed the same way."""
    return scheme_seconds(sys.executable, seq_len, n, path=str(pathlib.Path(__file__).resolve().parents[1]))


def span_mask_timer(seq_len: int, batch: int, calls: int):
    """Compiles ``span_mask`` for one batch size; returns ``(compile s, time())`` where ``time()`` gives
    the best ``(wall s / row, CPU s / row)`` of three runs of ``calls`` calls, after ``calls`` warm-up
    calls (the allocator settles: a fresh process page-faults on new buffers for its first calls)."""
    import jax
    import jax.numpy as jnp

    import wakong

    fn = jax.jit(lambda keys, lengths: wakong.span_mask(keys, lengths, seq_len))
    lengths = jnp.full((batch,), seq_len, jnp.int32)
    inputs = [jax.random.split(jax.random.key(i), batch) for i in range(5)]
    t0 = time.perf_counter()
    jax.block_until_ready(fn(inputs[0], lengths))
    compile_s = time.perf_counter() - t0

    def timed() -> tuple[float, float]:
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(calls):
            out = fn(inputs[i % len(inputs)], lengths)
        jax.block_until_ready(out)
        return (time.perf_counter() - w0) / calls / batch, (time.process_time() - c0) / calls / batch

    def run() -> tuple[float, float]:
        timed()  # warm-up
        walls, cpus = zip(*(timed() for _ in range(3)))
        return min(walls), min(cpus)

    return compile_s, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved reference / span_mask rounds")
    parser.add_argument("--schemes", type=int, default=5000, help="schemes per reference timing")
    parser.add_argument("--calls", type=int, default=20, help="span_mask calls per timed run")
    parser.add_argument("--reference-python", default=os.environ.get("WAKONG_REFERENCE_PYTHON"))
    args = parser.parse_args()
    load = tuple(round(x, 2) for x in os.getloadavg())
    print(f"load average {load}, {os.cpu_count()} CPUs, seq_len {args.seq_len}")
    port = port_seconds(args.seq_len, args.schemes)
    print(f"bit-exact port (same timing): {port * 1e6:.1f} us/scheme")
    timers = {}
    for batch in args.batch:
        compile_s, timers[batch] = span_mask_timer(args.seq_len, batch, args.calls)
        print(f"span_mask B={batch}: compiled in {compile_s:.1f} s")
    ratios = {batch: [] for batch in args.batch}
    for r in range(args.rounds):  # interleaved, so that both sides see the same machine load
        if args.reference_python:
            base, label = scheme_seconds(args.reference_python, args.seq_len, args.schemes), "reference"
        else:
            base, label = port_seconds(args.seq_len, args.schemes), "port"
        line = [f"round {r}: {label} {base * 1e6:5.1f} us/scheme ({1 / base:8,.0f} seq/s)"]
        for batch, run in timers.items():
            wall, cpu = run()
            ratios[batch].append(base / wall)
            rate = f"{1 / wall:10,.0f} seq/s, {base / wall:5.1f}x"
            line.append(f"B={batch}: {wall * 1e9:5.0f} ns/row ({cpu * 1e9:4.0f} CPU), {rate}")
        print(" | ".join(line), flush=True)
    for batch, values in ratios.items():
        values = sorted(values)
        print(
            f"B={batch}: span_mask / {label} sequences per second (one core each): "
            f"median {values[len(values) // 2]:.1f}x (min {values[0]:.1f}x, max {values[-1]:.1f}x, "
            f"{len(values)} rounds)"
        )


if __name__ == "__main__":
    sys.exit(main())
