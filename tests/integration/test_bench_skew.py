"""`streamjoin bench skew --quick`, as a user runs it: one key at 40% of the input, the unsplit
job's backlog drain checked by Spark verify, its live run verified with its p99 delay, the
split job's runs the same way (its splits and what went to the slots reported), the
Spark peer on the same input, ratios, JSON and plot. Behaviour only: the figures themselves are
for docs/benchmarks/skew.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]

CASE = "zipf0-top40"


def verified(v: dict) -> bool:
    return v["verified"] is True and v["missing"] == v["extra"] == v["duplicates"] == 0 and v["results"] > 0


def test_bench_skew_quick_reports_both_runs_exact_beside_the_spark_peer(tmp_path: Path) -> None:
    out, plot = tmp_path / "skew.json", tmp_path / "skew.png"
    # A fresh embedded broker, and no PyFlink venv: that peer reports why it did not run.
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMJOIN_BOOTSTRAP", "STREAMJOIN_PYFLINK_PYTHON")}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "skew", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["workload"] == "skew" and data["exact"] is True and data["parameters"]["mode"] == "quick"
    assert data["ours"]["headline"] == CASE and list(data["ours"]["cases"]) == [CASE]

    case = data["ours"]["cases"][CASE]
    unsplit = case["unsplit"]
    backlog = unsplit["backlog"]
    assert verified(backlog["verify"]) and backlog["inputs"] == backlog["verify"]["inputs"]["total"]
    assert backlog["results"] == backlog["verify"]["expected"]
    assert backlog["verify"]["results"] > backlog["inputs"]  # the hot key's pairs outnumber the tuples
    assert backlog["tuples_per_s_steady"] > 0 and 0.1 <= backlog["steady_from"] < 0.9
    live = unsplit["live"]
    assert verified(live["verify"]) and live["verify"]["dead_letter"]["count"] == 0
    assert 0 <= live["verify"]["delay_ms"]["p50"] <= live["verify"]["delay_ms"]["p99"]
    # The coordinator finds the key hot, split or not; unsplit, no group applies a split.
    assert {h["key"] for h in live["hot_keys"]} == {"0"}
    assert live["splits"] == [] and backlog["splits"] == []

    split = case["split"]
    ratios = data["ratios"]
    assert verified(split["live"]["verify"])
    assert split["backlog"]["identical_to_verified_run"] is True
    assert split["backlog"]["steady_from"] == backlog["steady_from"] and split["backlog"]["tuples_per_s_steady"] > 0
    # Tuples went to the slots exactly when a group applied a split (within these short runs the
    # coordinator may not split yet: the full run's page says when it did), and were metered.
    for run in (split["backlog"], split["live"]):
        sent = run["split"].get("replicated_tuples", 0) + run["split"].get("fragmented_tuples", 0)
        assert bool(run["splits"]) == (sent > 0) == (run["split"]["split_topic_bytes"] > 0), run
    assert "replicated_tuples" not in backlog["split"] and backlog["split"]["split_topic_bytes"] == 0
    tput = ratios[f"{CASE}_split_vs_unsplit_throughput"]
    assert tput["ours"] == split["backlog"]["tuples_per_s_steady"]
    assert tput["peer"] == backlog["tuples_per_s_steady"]
    assert math.isclose(tput["ratio"], tput["ours"] / tput["peer"])
    p99 = ratios[f"{CASE}_unsplit_vs_split_p99"]
    split_p99 = split["live"]["verify"]["delay_ms"]["p99"]
    assert math.isclose(p99["ratio"], live["verify"]["delay_ms"]["p99"] / split_p99)
    assert data["acceptance"]["met"] is False  # two workers, not the headline's three

    peers = data["peers"][CASE]
    spark = peers["spark"]
    assert spark["exact"] is True and spark["results"] == backlog["verify"]["expected"]
    assert spark["inputs"] == backlog["inputs"] and spark["tuples_per_s"] > 0
    ratio = ratios[f"{CASE}_unsplit_vs_spark_throughput"]
    assert ratio["ours"] == backlog["tuples_per_s"] and ratio["peer"] == spark["tuples_per_s"]
    assert math.isclose(ratio["ratio"], ratio["ours"] / ratio["peer"])
    assert peers["pyflink"]["ran"] is False and "STREAMJOIN_PYFLINK_PYTHON" in peers["pyflink"]["why"]

    assert data["machine"]["cores"] >= 1 and data["machine"]["versions"]["tansu"]
    assert data["plot"] == str(plot) and plot.stat().st_size > 10_000
