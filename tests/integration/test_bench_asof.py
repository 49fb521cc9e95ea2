"""`streamjoin bench asof --quick`, as a user runs it: our live as-of join checked by Spark
verify, the backlog replay, the Quix Streams peer judged against the oracle's pairs, PyFlink
reported as not run without its venv, ratios, JSON and plot. Behaviour only: the figures
themselves are for docs/benchmarks/asof.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]

COUNTS = ("missing", "extra", "duplicates", "wrong_version", "missing_row_arrived_later")


def test_bench_asof_quick_reports_our_exact_join_beside_the_peers_judged_by_the_oracle(tmp_path: Path) -> None:
    out, plot = tmp_path / "asof.json", tmp_path / "asof.png"
    # A fresh embedded broker, no PyFlink venv, and the Quix peer from the repository's .venv-quix.
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMJOIN_BOOTSTRAP", "STREAMJOIN_PYFLINK_PYTHON", "STREAMJOIN_QUIX_PYTHON")}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "asof", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["workload"] == "asof" and data["exact"] is True and data["parameters"]["mode"] == "quick"

    ours = data["ours"]
    verdict = ours["live"]["verify"]
    assert verdict["verified"] is True and verdict["results"] == verdict["expected"] > 0
    assert verdict["dead_letter"]["count"] == 0  # rows arrive out of order, but within the lateness
    assert 0 < verdict["unmatched"] < verdict["results"]  # orders of customers without a row, null-padded
    assert 0 <= ours["delay_ms"]["p50"] <= ours["delay_ms"]["p99"]
    replay = ours["replays"]["1"]
    assert replay["identical_to_verified_run"] is True and replay["inputs"] == verdict["inputs"]["total"]
    assert ours["throughput_tuples_per_s"]["1"] == replay["tuples_per_s"] > 0

    oracle = data["oracle"]
    assert oracle["matches_verified"] is True and oracle["pairs"] == verdict["expected"]

    quix = data["peers"]["quix"]
    assert quix["ran"] is True, quix.get("why")
    assert quix["processed"] == quix["tuples"] == verdict["inputs"]["total"] and quix["tuples_per_s"] > 0
    assert all(type(quix[k]) is int and quix[k] >= 0 for k in COUNTS)
    assert quix["results"] == quix["expected"] - quix["missing"] + quix["extra"] + quix["duplicates"]
    assert quix["exact"] is (quix["missing"] == quix["extra"] == quix["duplicates"] == 0)
    assert quix["wrong_version"] <= min(quix["missing"], quix["extra"])
    assert quix["missing_row_arrived_later"] <= quix["missing"]

    pyflink = data["peers"]["pyflink"]
    assert pyflink["ran"] is False and "STREAMJOIN_PYFLINK_PYTHON" in pyflink["why"]

    ratio = data["ratios"]["throughput_1w_vs_quix"]
    assert ratio["ours"] == ours["throughput_tuples_per_s"]["1"] and ratio["peer"] == quix["tuples_per_s"]
    assert math.isclose(ratio["ratio"], ratio["ours"] / ratio["peer"])
    assert not any("pyflink" in name for name in data["ratios"])

    assert data["machine"]["cores"] >= 1 and data["machine"]["versions"]["tansu"]
    assert data["plot"] == str(plot) and plot.stat().st_size > 10_000
