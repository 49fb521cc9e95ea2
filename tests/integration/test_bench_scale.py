"""`streamjoin bench equijoin --scale 1,2 --quick`, as a user runs it: one backlog preloaded
without Spark, drained by 1 and then 2 workers, read raw, checked against the reference join;
the report's curve, CPU figures, ratios and plot. Behaviour only: the figures are for docs/benchmarks/equijoin.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.integration]


def test_bench_equijoin_scale_quick_reports_an_exact_curve_with_cpu_and_the_raw_consume_limit(tmp_path: Path) -> None:
    out, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # a fresh embedded broker
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "equijoin", "--scale", "1,2", "--quick",
                           "--json", str(out), "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data

    assert data["exact"] is True and data["ours"]["same_results_every_k"] is True
    runs = data["ours"]["runs"]
    assert set(runs) == {"1", "2"}
    fingerprints = {json.dumps(r["fingerprint"], sort_keys=True) for r in runs.values()}
    assert len(fingerprints) == 1
    reference = data["peers"]["reference"]
    assert reference["ids_equal"] is True and reference["fingerprint"] == runs["1"]["fingerprint"]
    assert runs["1"]["fingerprint"]["results"] > 0 and runs["1"]["fingerprint"]["duplicates"] == 0
    assert all(r["inputs"] == data["backlog"]["tuples"] > 0 and r["restarts"] == 0 for r in runs.values())

    curve = {p["workers"]: p for p in data["ours"]["curve"]}
    assert sorted(curve) == [1, 2]
    for k, point in curve.items():
        assert point["tuples_per_s"] > 0 and point["ideal"] == k
        assert math.isclose(point["speedup"], point["tuples_per_s"] / curve[1]["tuples_per_s"])
        assert point["worker_cpu_us_per_tuple"] > 0 and point["broker_cpu_us_per_tuple"] > 0
        cpu = runs[str(k)]["cpu"]
        assert cpu["workers_s"] > 0 and cpu["broker_s"] > 0 and cpu["workers_since_start_s"] >= cpu["workers_s"]

    consume = data["peers"]["kafka_consume"]
    assert consume["tuples"] == data["backlog"]["tuples"] and consume["tuples_per_s"] > 0
    ratios = data["ratios"]
    for k in (1, 2):
        raw = ratios[f"throughput_{k}w_vs_kafka_consume"]
        assert raw["ours"] == curve[k]["tuples_per_s"] and raw["peer"] == consume["tuples_per_s"]
        assert math.isclose(raw["ratio"], raw["ours"] / raw["peer"])
    assert math.isclose(ratios["speedup_2w_vs_1w"]["ratio"], curve[2]["speedup"])

    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and machine["memory_gb"] > 0
    assert data["parameters"]["mode"] == "quick" and data["parameters"]["tuple_bytes"] == 64
    assert plot.stat().st_size > 10_000
