"""The first compile of a new process: the vocabulary analysis built vs read from the on-disk cache.

Run: ``python -m benchmarks.vocab_cache [--vocab 8000 32000 128000] [--repeats 3]``

Every grammar compiled for a vocabulary needs its analysis (:mod:`jaxsample.structured.trie`: the
byte trie and its unary paths, quotient tries of the byte partitions the grammar's states use, and
for recursive grammars the suffix ids of the token strings). A process builds it on its first
compile and keeps it in memory; with :func:`~jaxsample.structured.grammar_cache.set_directory` it
is also kept in ``*.vocab`` files and a new process reads it. Per vocabulary size, for a regular
schema, a recursive ``$ref`` tree and JSON mode (:data:`benchmarks.structured.SCHEMAS`), this
times in one process, best of ``--repeats``:

* **built**: the first compile with the in-memory analysis dropped (as a new process) and no
  directory: the analysis is built;
* **read**: the same with the analysis in a directory (grammar files removed, so the grammar itself
  is compiled): the analysis is read;
* **warm**: the analysis already in memory (every later compile of the process).

Vocabulary: :func:`benchmarks.structured.make_vocab` (a trained byte-level BPE extended with
synthetic two-token pieces past ~9k tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.structured import SCHEMAS, make_vocab  # noqa: E402
from jaxsample import structured as st  # noqa: E402
from jaxsample.structured import grammar_cache, trie  # noqa: E402

CASES = {"extraction": SCHEMAS["extraction"], "tree (recursive)": SCHEMAS["tree"], "json_mode (recursive)": True}


def _first_compile(schema, vocab, *, directory: Path | None, keep_index: bool, reads: bool = False) -> float:
    """Seconds to compile ``schema`` and upload its device tables, with the grammar itself not cached
    (``reads``: ``RuntimeError`` unless the analysis was read from ``directory``, none of it built)."""
    grammar_cache.clear()
    if directory is not None:
        for p in directory.glob("*.grammar"):
            p.unlink()
    if not keep_index:
        trie._cached_index.cache_clear()
    grammar_cache.set_directory(directory)
    try:
        t = time.perf_counter()
        jax.block_until_ready(jax.device_put(st.stack([st.compile_json_schema(schema, vocab)])))
        seconds = time.perf_counter() - t
        info = grammar_cache.info()
        if reads and (info["vocab_disk_hits"] == 0 or info["vocab_disk_writes"] or info["vocab_disk_errors"]):
            raise RuntimeError(f"the vocabulary analysis was not read from the directory: {info}")
        return seconds
    finally:
        grammar_cache.set_directory(None)


def measure(vocab, repeats: int = 3) -> tuple[list, float]:
    """``(rows, MiB of *.vocab files)``: per case ``(name, built s, read s, warm s)``, best of ``repeats``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, schema in CASES.items():
            _first_compile(schema, vocab, directory=d, keep_index=False)  # writes the analysis it needs
            built = min(_first_compile(schema, vocab, directory=None, keep_index=False) for _ in range(repeats))
            read = min(_first_compile(schema, vocab, directory=d, keep_index=False, reads=True) for _ in range(repeats))
            warm = min(_first_compile(schema, vocab, directory=None, keep_index=True) for _ in range(repeats))
            rows.append((name, built, read, warm))
        size = sum(p.stat().st_size for p in d.glob("*.vocab")) / 2**20
    trie._cached_index.cache_clear()
    return rows, size


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[8000, 32000, 128000])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {jax.devices()[0].platform}")
    print(f"{'V':>7} {'grammar':22} {'built ms':>9} {'read ms':>8} {'warm ms':>8} {'built/read':>10}")
    out = {}
    for size in args.vocab:
        _, vocab, _ = make_vocab(size)
        rows, mib = measure(vocab, args.repeats)
        for name, built, read, warm in rows:
            print(f"{vocab.size:7d} {name:22} {built * 1e3:9.0f} {read * 1e3:8.0f} {warm * 1e3:8.0f} {built / read:9.1f}x")
        print(f"{'':7} ({mib:.1f} MiB of *.vocab files for these grammars)")
        out[size] = (rows, mib)
    return out


if __name__ == "__main__":
    main()
