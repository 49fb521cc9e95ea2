"""`streamjoin bench psp --quick` as a user runs it: rings of N = 1 and 2 on
the 3-way image join, Spark verify on each, the cost model beside, so the
harness cannot rot. Behaviour only: the figures are for docs/benchmarks/psp.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]


def test_bench_psp_quick_reports_exact_rings_beside_the_model(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "latency.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "psp", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert data["exact"] is True
    rings = data["ours"]["rings"]
    assert [r["nodes"] for r in rings] == [1, 2]
    for r in rings:
        assert r["verify"]["verified"] is True and r["verify"]["results"] == r["verify"]["expected"] > 0
        assert r["latency_ms"]["count"] == r["verify"]["results"]  # every result was metered once
        assert r["predicted_latency_ms"] > 0
    model = data["peers"]["cost_model"]
    assert [row["N"] for row in model["rows"]] == list(range(1, len(model["rows"]) + 1))
    for summary in (model, data["model_at_paper_settings"]):
        _assert_model_consistent(summary)
    speedup = data["ratios"]["speedup_N2_over_N1"]
    assert math.isclose(speedup["ratio"], rings[0]["latency_ms"]["mean_ms"] / rings[1]["latency_ms"]["mean_ms"])
    assert data["peers"]["kafka_consume"]["bytes_per_s"] > 0
    assert plot.stat().st_size > 10_000


def _assert_model_consistent(summary: dict) -> None:
    """Each row keeps up exactly when its capacity covers the offered load (the streams'
    rates summed), and best_N is the least-latency N among those (else the N of most
    capacity), as engine/psp/cost_model.py defines them."""
    offered = sum(summary["measurements"]["rates"].values())
    rows = summary["rows"]
    assert offered > 0 and rows
    for row in rows:
        assert row["keeps_up"] == (row["capacity"] >= offered), row
    fitting = [r for r in rows if r["keeps_up"]]
    best = (min(fitting, key=lambda r: (r["latency_s"], r["N"])) if fitting
            else max(rows, key=lambda r: (r["capacity"], -r["N"])))
    assert summary["best_N"] == best["N"]
