"""`streamjoin bench delay --quick`, as a user runs it: a paced producer feeding 2 workers, then
raw delivery at the same rate; the report's delay percentiles, load figures, ratios and plot, and
the verdict of the reference join. Behaviour only: the figures are for docs/benchmarks/delay.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.integration]


def test_bench_delay_quick_reports_exact_delays_beside_raw_delivery(tmp_path: Path) -> None:
    out, plot = tmp_path / "delay.json", tmp_path / "delay.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # a fresh embedded broker
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "delay", "--quick",
                           "--json", str(out), "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["exact"] is True and data["parameters"]["mode"] == "quick"

    counts = [str(p) for p in data["parameters"]["partitions"]]
    assert list(data["ours"]) == counts and list(data["peers"]["delivery"]) == counts
    for p in counts:
        ours, peer = data["ours"][p], data["peers"]["delivery"][p]
        verdict = ours["verify"]
        assert verdict["verifier"] == "reference" and verdict["verified"] is True
        assert verdict["results"] == verdict["expected"] > 0 and verdict["inputs"]["total"] == ours["inputs"]
        delay = ours["delay"]
        assert 0 < delay["count"] <= verdict["results"]
        assert 0 <= delay["p50_ms"] <= delay["p95_ms"] <= delay["p99_ms"]
        assert ours["cores"]["workers"] > 0 and ours["cores"]["broker"] > 0
        assert ours["cycles_per_s"] > 0 and ours["cycle_ms_mean"] > 0 and ours["broker_cpu_ms_per_cycle"] > 0
        assert 0 < peer["records"] <= peer["inputs"] and peer["delay"]["count"] == peer["records"]
        ratio = data["ratios"][f"p99_{p}p_vs_delivery"]
        assert ratio["ours"] == delay["p99_ms"] and ratio["peer"] == peer["delay"]["p99_ms"]
        assert math.isclose(ratio["ratio"], ratio["ours"] / ratio["peer"])
        assert data["goal_met"][p] is (delay["p99_ms"] <= data["parameters"]["goal_p99_ms"])
    assert data["machine"]["cores"] >= 1
    assert plot.stat().st_size > 10_000
