"""`streamjoin bench nexmark --quick`, as a user runs it: Nexmark's q3, q8 and q20 drained as a
backlog and joined at a paced rate, every run judged exact against Nexmark's SQL in Spark; PyFlink
(from the repository's .venv-pyflink, which ops/setup.sh builds) and Spark Structured Streaming
judged the same way, their per-core figures and ratios present, Flink's and Feldera's published
figures quoted, the goal stated. Behaviour only: the figures are for docs/benchmarks/nexmark.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def test_bench_nexmark_quick_reports_exact_queries_beside_pyflink_spark_and_published_figures(tmp_path: Path) -> None:
    if not (REPO / ".venv-pyflink" / "bin" / "python").exists() and not os.environ.get("STREAMJOIN_PYFLINK_PYTHON"):
        pytest.fail("PyFlink's venv is missing: run ops/setup.sh (it builds .venv-pyflink)")
    out, plot = tmp_path / "nexmark.json", tmp_path / "nexmark.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # a fresh embedded broker
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "nexmark", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["workload"] == "nexmark" and data["exact"] is True and data["parameters"]["mode"] == "quick"
    kinds = data["parameters"]["events_per_kind"]
    assert kinds == {"persons": 100, "auctions": 300, "bids": 4600}  # 5,000 events in Nexmark's proportions

    for q in ("q3", "q8", "q20"):
        query = data["queries"][q]
        backlog, paced = query["ours"]["backlog"], query["ours"]["paced"]
        assert backlog["exact"] is True and backlog["results"] == backlog["expected"] > 0, q
        assert backlog["missing"] == backlog["extra"] == backlog["duplicates"] == backlog["result_id_duplicates"] == 0
        assert backlog["window_covers_leads"] is True
        assert backlog["events_per_worker_cpu_s"] > 0 and backlog["cpu"]["broker_s"] is not None
        assert paced["exact"] is True and paced["results"] == paced["expected"] > 0
        assert 0 <= paced["delay_ms"]["p50_ms"] <= paced["delay_ms"]["p99_ms"]

        pyflink = query["pyflink"]
        assert pyflink["exact"] is True and pyflink["results"] == backlog["expected"], q
        assert pyflink["events_per_cpu_s_gross"] > 0 and pyflink["events_per_cpu_s"] is None  # start-up not measured
        ratio = data["ratios"][f"{q}_per_core_vs_pyflink"]
        assert ratio["ours"] == backlog["events_per_worker_cpu_s"] and ratio["peer"] == pyflink["events_per_cpu_s_gross"]
        assert math.isclose(ratio["ratio"], ratio["ours"] / ratio["peer"])
        assert query["published"]["flink_1_13_per_core"] == data["published"]["flink"]["per_core"][q]
        assert set(data["goal"]["per_query"][q]) == {"flink_published", "pyflink_same_run"}

    spark = data["peers"]["spark"]["queries"]
    assert spark["q8"]["ran"] is False and "aggregat" in spark["q8"]["why"]
    assert spark["q3"]["ran"] is False and "quick" in spark["q3"]["why"]
    assert spark["q20"]["ran"] is True and spark["q20"]["exact"] is True and spark["q20"]["events_per_cpu_s"] > 0
    assert data["queries"]["q20"]["as_of_join_would_miss"] > 0  # bids naming an auction not created yet
    assert data["published"]["feldera"]["cores"] == 16 and "hardware" in data["published"]["flink"]
    assert isinstance(data["goal"]["met"], bool)
    assert data["plot"] == str(plot) and plot.stat().st_size > 10_000
