"""`streamjoin bench equijoin --quick`, as a user runs it: the harness end to
end (our sweep and replay, Spark verify, every peer, ratios, JSON, plot), so
it cannot rot. Behaviour only: the figures themselves are for the README."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_bench_equijoin_quick_reports_exact_figures_peers_and_ratios(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "curve.png"
    # A fresh embedded broker, and no PyFlink venv: the quick run stays a CI run.
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMJOIN_BOOTSTRAP", "STREAMJOIN_PYFLINK_PYTHON")}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "equijoin", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data

    assert data["exact"] is True
    sweep = data["ours"]["sweeps"]["1"]
    assert sweep["verify"]["verified"] is True and sweep["verify"]["results"] == sweep["verify"]["expected"] > 0
    assert all(s["delay"]["count"] > 0 for s in sweep["steps"])
    assert data["ours"]["replays"]["1"]["identical_to_verified_run"] is True

    peers = data["peers"]
    assert {"spark", "kafka_consume", "reference", "pyflink"} <= set(peers)
    assert peers["spark"]["exact"] is True and peers["spark"]["tuples_per_s"] > 0
    assert peers["kafka_consume"]["tuples_per_s"] > 0 and peers["kafka_consume"]["bytes_per_s"] > 0
    assert peers["kafka_consume"]["delivery"]["delay"]["count"] > 0
    assert peers["reference"]["exact"] is True
    assert peers["pyflink"]["ran"] is False and "STREAMJOIN_PYFLINK_PYTHON" in peers["pyflink"]["why"]

    ratios = data["ratios"]
    consume = ratios["throughput_1w_vs_kafka_consume"]
    assert consume["ours"] == data["ours"]["throughput_tuples_per_s"]["1"]
    assert consume["peer"] == peers["kafka_consume"]["tuples_per_s"]
    assert ratios["throughput_1w_vs_spark"]["peer"] == peers["spark"]["tuples_per_s"]
    for r in ratios.values():
        if r["ours"] is not None and r["peer"]:
            assert math.isclose(r["ratio"], r["ours"] / r["peer"])
        else:
            assert r["ratio"] is None

    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["memory_gb"] > 0
    assert all(machine["versions"][k] for k in ("python", "pyspark", "confluent_kafka", "tansu", "java"))
    assert data["parameters"]["mode"] == "quick" and data["parameters"]["tuple_bytes"] == 64
    assert plot.stat().st_size > 10_000
