"""Rebuilds the pinned JSONSchemaBench sample in ``benchmarks/data/`` from a local checkout.

Run: ``python -m benchmarks.jsonschemabench_sample /path/to/guidance-ai/jsonschemabench``

The sample: 23 schemas drawn with ``random.Random(SEED)`` from each of 11 splits of MaskBench
(``maskbench/data/<split>---*.json`` as listed by ``git ls-tree``: the JSONSchemaBench schemas with their valid/invalid test
instances), in sorted file order. One JSON record per line: ``split``, ``name`` (file stem),
``schema``, ``tests`` (``[{"valid": bool, "data": ...}]``). The first line is the provenance.
Nothing is downloaded at run time; :mod:`benchmarks.jsonschemabench` reads the committed file.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

SPLITS = ("Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
          "Kubernetes", "Snowplow", "JsonSchemaStore", "WashingtonPost", "MCPspec")  # fmt: skip
PER_SPLIT = 23
SEED = 0
OUT = Path(__file__).resolve().parent / "data" / "jsonschemabench_sample.jsonl.gz"


def build(checkout: Path) -> list[dict]:
    """Records of the sample (provenance first)."""
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    listing = subprocess.run(["git", "-C", str(checkout), "ls-tree", "--name-only", "HEAD", "maskbench/data/"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    files = sorted(Path(x).name for x in listing if x.endswith(".json"))
    records = [{
        "provenance": {
            "repo": "https://github.com/guidance-ai/jsonschemabench",
            "commit": commit,
            "path": "maskbench/data",
            "license": "MIT (dataset card of epfl-dlab/JSONSchemaBench on Hugging Face; the GitHub repo has no "
                       "LICENSE file; schemas were collected from public sources, see the paper arXiv:2501.10868)",
            "sampling": f"random.Random({SEED}).sample(sorted files of each split, {PER_SPLIT})",
            "splits": list(SPLITS),
        }
    }]  # fmt: skip
    rng = random.Random(SEED)
    for split in SPLITS:
        names = [f for f in files if f.startswith(split + "---")]
        for f in rng.sample(names, PER_SPLIT):
            d = json.loads(subprocess.run(["git", "-C", str(checkout), "show", f"HEAD:maskbench/data/{f}"],
                                          capture_output=True, check=True).stdout)  # fmt: skip
            tests = [{"valid": bool(t["valid"]), "data": t["data"]} for t in d.get("tests", [])]
            records.append({"split": split, "name": f[: -len(".json")].split("---", 1)[1], "schema": d["schema"], "tests": tests})
    return records


def load(path: Path = OUT) -> tuple[dict, list[dict]]:
    """``(provenance, records)`` of the committed sample."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(x) for x in f]
    return lines[0]["provenance"], lines[1:]


if __name__ == "__main__":
    recs = build(Path(sys.argv[1]))
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime=0: byte-identical rebuilds
        f.write("".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in recs).encode())
    print(f"{len(recs) - 1} schemas -> {OUT} ({OUT.stat().st_size} bytes)")
