"""`streamjoin bench reuse --quick` as a user runs it: Spark `sources` writes the airline
workload, 100 template queries are planned with reuse off, exact-only and relaxed, every
operator runs in process, and each strategy's outputs are checked against the queries
joined alone. Behaviour only: the figures are for docs/benchmarks/reuse.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]
STRATEGIES = ("none", "exact", "relax")


def test_bench_reuse_quick_is_exact_and_relaxing_saves(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "reuse", "--quick", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data  # the same report on stdout and in the file
    assert data["exact"] is True
    assert data["parameters"]["mode"] == "quick" and list(data["ratios"]) == ["100"]
    figures = {"none": data["peers"]["100"]["none"], **data["ours"]["100"]}
    for strategy in STRATEGIES:
        found = figures[strategy]["exactness"]
        assert found["queries_checked"] > 0 and found["results"] > 0, strategy
        assert found["missing"] == found["extra"] == found["duplicates"] == found["differing_values"] == 0, strategy
        assert found["all_queries"] == {"queries_checked": 100, "count_mismatches": 0, "checksum_mismatches": 0}
    none, exact, relax = (figures[s] for s in STRATEGIES)
    assert none["operators"] == 100 and none["deployments"] == 100
    assert relax["operators"] < exact["operators"] <= none["operators"]
    assert relax["network"]["weighted_byte_ms"] < none["network"]["weighted_byte_ms"]
    assert relax["network"]["crossing_bytes"] < none["network"]["crossing_bytes"]
    assert relax["kafka_bytes"] < none["kafka_bytes"]
    ratio = data["ratios"]["100"]["relax_vs_none"]["network_weighted"]
    assert ratio["ratio"] == pytest.approx(ratio["ours"] / ratio["peer"])
    assert relax["decisions"]["relax"] > 0 and sum(relax["decisions"].values()) == 100
    scale = data["planning_at_scale"]
    assert all(scale["strategies"][s]["operators"] == scale["synthetic_operators"] for s in STRATEGIES)
