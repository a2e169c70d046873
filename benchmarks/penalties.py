"""Timings of the history-based processors: ``python -m benchmarks.penalties [--quick]``.

Reports the minimum wall time over repeated jitted calls (robust on a shared machine) (after compilation) on the default backend for
a batch of ``B`` rows, vocabulary ``V`` and history length ``T``. DRY is timed on three kinds of
history: random tokens (short repeats, the common case), a model stuck in a 10-token loop (long
repeats, DRY's worst case and the case it exists for), and all rows off (``multiplier = 0``).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsample as js

_dry_module = sys.modules["jaxsample.dry"]


def _time(fn, *args, reps: int = 20) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def _histories(b: int, t: int, v: int, kind: str) -> jnp.ndarray:
    rng = np.random.default_rng(0)
    if kind == "random":
        return jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    phrase = rng.integers(0, v, (b, 10))
    return jnp.asarray(np.tile(phrase, (1, -(-t // 10)))[:, :t], jnp.int32)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small shapes only")
    args = parser.parse_args(argv)
    b, v = 8, 32_000
    lengths = [64, 256] if args.quick else [64, 256, 1024, 4096]
    x = jnp.asarray(np.random.default_rng(1).normal(size=(b, v)), jnp.float32)
    print(f"backend={jax.default_backend()} B={b} V={v}; best of 20, ms per call")

    pen = jax.jit(js.penalties)
    ngram = jax.jit(js.no_repeat_ngram, static_argnums=2)
    dry = jax.jit(js.dry, static_argnums=6)
    breakers = ((0,), (1,), (2, 3))
    for t in lengths:
        h = _histories(b, t, v, "random")
        loop = _histories(b, t, v, "loop")
        row = {
            "penalties": _time(pen, x, h, 1.1, 0.1, 0.1, -1),
            "no_repeat_ngram(3)": _time(ngram, x, h, 3),
            "dry random": _time(dry, x, h, 0.8, 1.75, 2, -1, breakers),
            "dry loop": _time(dry, x, loop, 0.8, 1.75, 2, -1, breakers),
            "dry off": _time(dry, x, loop, 0.0, 1.75, 2, -1, breakers),
        }
        print(f"T={t:5d}  " + "  ".join(f"{k} {ms:8.3f}" for k, ms in row.items()))

    if not args.quick:
        t = 1024
        loop = _histories(b, t, v, "loop")[..., ::-1]
        limit = jnp.full((b,), t, jnp.int32)
        for chunk in (8, 16, 32, 64, 128):
            f = jax.jit(lambda r, lim, c=chunk: _dry_module._suffix_matches(r, lim, c))
            ms = _time(f, loop, limit)
            print(f"suffix matches, loop history T={t}, no saturation cap (O(T^2)), chunk {chunk:3d}: {ms:8.3f} ms")


if __name__ == "__main__":
    main()
