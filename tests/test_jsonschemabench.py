"""The pinned JSONSchemaBench sample and a smoke run of its benchmark (small vocabulary, two schemas)."""

import collections

import pytest

from benchmarks import jsonschemabench
from benchmarks.jsonschemabench_sample import PER_SPLIT, SPLITS, load


def test_sample_is_pinned_with_provenance():
    provenance, records = load()
    assert len(provenance["commit"]) == 40 and provenance["repo"].endswith("guidance-ai/jsonschemabench")
    assert "MIT" in provenance["license"] and "Random(0)" in provenance["sampling"]
    assert collections.Counter(r["split"] for r in records) == {s: PER_SPLIT for s in SPLITS}
    assert len({(r["split"], r["name"]) for r in records}) == len(records) == 253
    tests = [t for r in records for t in r["tests"]]
    assert sum(t["valid"] for t in tests) > 300 and all(set(t) == {"valid", "data"} for t in tests)


def test_benchmark_smoke(capsys):
    pytest.importorskip("jsonschema")
    stats = jsonschemabench.main(["--vocab", "400", "--limit", "3", "--samples", "2", "--repeats", "1",
                                  "--engines", "jaxsample"])  # fmt: skip
    s = stats["jaxsample"]
    assert len(s["times"]) + sum(s["errors"].values()) == 3
    assert s["outputs"][0] == s["outputs"][1]  # every finished output is valid
    assert s["valid"][0] == s["valid"][1] and s["invalid_acc"][0] == 0
    assert "| jaxsample | " in capsys.readouterr().out
