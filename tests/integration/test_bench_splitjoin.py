"""`streamjoin bench splitjoin --quick`, as a user runs it: SplitJoin with 2 cores
on time and count windows, the precision knob (punctuate_every 1, 16 and 0), the PSP
ring on the same backlogs, every run checked exact and ordered, ratios, JSON and plot, so the
harness cannot rot. Behaviour only: the figures themselves are for docs/benchmarks/splitjoin.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.integration]


def test_bench_splitjoin_quick_reports_exact_ordered_runs_peers_and_ratios(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "splitjoin.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # fresh embedded brokers
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "splitjoin", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["exact"] is True and data["ordered"] is True

    params = data["parameters"]
    assert params["mode"] == "quick" and params["cores"] == [2] and params["precisions"] == [1, 16, 0]
    runs = data["ours"]["runs"]
    k = params["precision_cores"]
    expected = {(w, c, 1) for w in ("time", "count") for c in params["cores"]} | {("time", k, p) for p in (16, 0)}
    assert {(r["window"], r["cores"], r["punctuate_every"]) for r in runs} == expected and len(runs) == len(expected)
    assert {(r["role"], r["punctuate_every"]) for r in runs if r["role"] != "sweep"} == {
        ("precision", p) for p in (16, 0)}  # quick: the knob's strict run is the sweep's
    for r in runs:
        assert r["exact"] is True and r["finished"] is True and r["dead_letters"] == 0 and r["restarts"] == 0
        check = r["check"]
        assert check["missing"] == check["extra"] == check["duplicates"] == 0
        assert check["results"] == check["expected"] > 0
        order = r["order"]
        assert order["duplicates"] == order["unknown_members"] == 0 and order["results"] > 0
        assert r["order_promised"] is (r["punctuate_every"] > 0)
        if r["order_promised"]:
            assert r["ordered"] is True and order["out_of_order"] == 0
        assert r["tuples_per_s"] is not None and r["tuples_per_s"] > 0
        lat = r["latency"]
        for part in ("visiting", "core", "merger_added"):
            assert lat[part]["count"] > 0 and lat[part]["p50_ms"] is not None and lat[part]["p99_ms"] is not None
    for kind in ("time", "count"):
        assert [f["cores"] for f in data["ours"][f"{kind}_vs_cores"]] == [2]
    assert [f["punctuate_every"] for f in data["ours"]["precision"]] == [1, 16, 0]

    peers = data["peers"]
    published = peers["splitjoin_published"]
    rings = peers["ring"]["runs"]
    assert {r["window"] for r in rings} == {"time", "count"}
    for r in rings:
        assert r["exact"] is True and r["tuples_per_s"] is not None and r["tuples_per_s"] > 0

    ratios = data["ratios"]
    for r in runs:  # every run against the ring on its backlog and against the paper
        key = f"{r['window']}_k{r['cores']}_p{r['punctuate_every']}"
        ring = next(x for x in rings if x["window"] == r["window"])
        assert ratios[f"{key}_vs_ring"]["ours"] == r["tuples_per_s"]
        assert ratios[f"{key}_vs_ring"]["peer"] == ring["tuples_per_s"]
        assert ratios[f"{key}_vs_paper"]["peer"] == published[r["window"]]["tuples_per_s"]
        assert ratios[f"{key}_vs_paper_per_core"]["peer"] == published[r["window"]]["per_core_tuples_per_s"]
        if r["window"] == "time" and r["cores"] == k and r["punctuate_every"] != 1:
            assert f"{key}_vs_p1" in ratios and f"{key}_visiting_p99_vs_p1" in ratios
    for r in ratios.values():
        if r["ours"] is not None and r["peer"]:
            assert math.isclose(r["ratio"], r["ours"] / r["peer"])
        else:
            assert r["ratio"] is None

    assert data["machine"]["cores"] >= 1 and params["machine_cpu_count"] >= 1
    assert plot.stat().st_size > 10_000
