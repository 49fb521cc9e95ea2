"""`streamjoin bench band --quick`, as a user runs it: backlogs of the
handshake/SplitJoin band join into fresh brokers, rings of 1 and 2 worker
processes joining them with time and count windows, the exactness check,
every peer, ratios, JSON and plot, so the harness cannot rot. Behaviour
only: the figures themselves are for docs/benchmarks/band.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.integration]


def test_bench_band_quick_reports_exact_runs_peers_and_ratios(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "band.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # fresh embedded brokers
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "band", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data

    assert data["exact"] is True
    runs = data["ours"]["runs"]
    assert {(r["window"], r["nodes"]) for r in runs} == {("time", 1), ("time", 2), ("count", 1)}
    for r in runs:
        assert r["exact"] is True and r["finished"] is True and r["dead_letters"] == 0 and r["restarts"] == 0
        check = r["check"]
        assert check["missing"] == check["extra"] == check["duplicates"] == 0
        assert check["results"] == check["expected"] > 0 and check["checked_triggers"] >= 400
        assert r["tuples_per_s"] is not None and r["tuples_per_s"] > 0
    assert data["ours"]["time_window"]["tuples_per_s"] > 0 and data["ours"]["count_window"]["tuples_per_s"] > 0

    peers = data["peers"]
    published = peers["splitjoin_published"]  # constants from the paper: the ratios below must use them
    assert peers["kafka_consume"]["bytes_per_s"] > 0 and peers["kafka_consume"]["tuples"] > 0
    assert peers["reference"]["tuples_per_s"] > 0 and peers["reference"]["checker_agrees_with_reference"] is True

    ratios = data["ratios"]
    assert "time_vs_reference" in ratios
    for r in runs:  # every run against every peer, named by window, rate per stream and ring size
        key = f"{r['window']}_r{int(r['rate_per_stream'])}_n{r['nodes']}"
        assert ratios[f"{key}_vs_splitjoin"]["ours"] == r["tuples_per_s"]
        assert ratios[f"{key}_vs_splitjoin"]["peer"] == published[r["window"]]["tuples_per_s"]
        assert ratios[f"{key}_vs_splitjoin_per_core"]["peer"] == published[r["window"]]["per_core_tuples_per_s"]
        assert ratios[f"{key}_vs_kafka_consume"]["peer"] == peers["kafka_consume"]["bytes_per_s"]
    for r in ratios.values():
        if r["ours"] is not None and r["peer"]:
            assert math.isclose(r["ratio"], r["ours"] / r["peer"])
        else:
            assert r["ratio"] is None

    assert data["parameters"]["mode"] == "quick" and data["machine"]["cores"] >= 1
    assert plot.stat().st_size > 10_000
