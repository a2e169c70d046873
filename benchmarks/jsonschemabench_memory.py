"""Device bytes of the grammar tables on a subset of the pinned JSONSchemaBench sample, array by array.

Run: ``python -m benchmarks.jsonschemabench_memory [--every 3] [--timeout 30] [--vocab 8000]``

Compiles every ``--every``-th schema of the sample (defaults, the benchmark's 8k byte-level BPE,
the compile cache cleared before each, ``--timeout`` seconds per compile), stacks each grammar
alone (``stack([g])``, the benchmark's device MiB) and prints the p50 / p90 / max MiB and, per
table array, its total over the subset, its share, and its dtype and shape for the median grammar.
Device bytes are deterministic: the numbers do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal

import numpy as np

from benchmarks.jsonschemabench import _alarm, _Timeout, train_tokenizer
from benchmarks.jsonschemabench_sample import load
from jaxsample import structured as st
from jaxsample.structured import tables as _tables


def _arrays(tables) -> dict:
    return {f.name: getattr(tables, f.name) for f in dataclasses.fields(tables) if f.name not in _tables._STATIC}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--timeout", type=int, default=30)
    p.add_argument("--vocab", type=int, default=8000)
    args = p.parse_args(argv)
    records = load()[1][:: args.every]
    tok = train_tokenizer(args.vocab)
    vocab = st.Vocabulary.from_tokenizer(tok, eos_ids=[0], size=tok.get_vocab_size())
    signal.signal(signal.SIGALRM, _alarm)
    found = []
    for rec in records:
        st.grammar_cache.clear()
        signal.alarm(args.timeout)
        try:
            g = st.compile_json_schema(rec["schema"], vocab)
        except (_Timeout, Exception):
            continue
        finally:
            signal.alarm(0)
        arrays = _arrays(st.stack([g]))
        found.append({k: (a.dtype.itemsize * a.size, str(a.dtype), a.shape) for k, a in arrays.items()})
    total = np.array([sum(b for b, _, _ in f.values()) for f in found])
    median = found[int(np.argsort(total)[len(total) // 2])]
    mib = " / ".join(f"{v / 2**20:.3g}" for v in np.percentile(total, [50, 90, 100]))
    print(f"{len(found)} of {len(records)} schemas compiled (sample indices 0, {args.every}, {2 * args.every}, ...; "
          f"{args.timeout} s each): device MiB p50 / p90 / max {mib}")
    print("| array | total MiB | share | median grammar |\n|---|---|---|---|")
    for name in sorted(found[0], key=lambda k: -sum(f[k][0] for f in found)):
        s = sum(f[name][0] for f in found)
        size, dtype, shape = median[name]
        print(f"| `{name}` | {s / 2**20:.2f} | {s / total.sum():.1%} | {size / 1024:.1f} KiB `{dtype}{list(shape)}` |")


if __name__ == "__main__":
    main()
