"""`streamjoin bench equijoin --quick`, as a user runs it: the harness end to
end (our sweep and replay, Spark verify, every peer, the left-join figure
beside Spark's left outer join, ratios, JSON, plot), so it cannot rot.
Behaviour only: the figures themselves are for docs/benchmarks/equijoin.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]


def test_bench_equijoin_quick_reports_exact_figures_peers_and_ratios(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "curve.png"
    # A fresh embedded broker, no PyFlink venv (the quick run stays a CI run) and the Quix peer from the
    # repository's .venv-quix (ops/setup.sh makes it), not from whatever STREAMJOIN_QUIX_PYTHON names.
    # Pathway runs where STREAMJOIN_PATHWAY_PYTHON names its venv (optional: a large install).
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMJOIN_BOOTSTRAP", "STREAMJOIN_PYFLINK_PYTHON", "STREAMJOIN_QUIX_PYTHON")}
    with_pathway = bool(env.get("STREAMJOIN_PATHWAY_PYTHON"))
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
    assert {"spark", "kafka_consume", "reference", "pyflink", "quix", "pathway"} <= set(peers)
    assert peers["spark"]["exact"] is True and peers["spark"]["tuples_per_s"] > 0
    assert peers["kafka_consume"]["tuples_per_s"] > 0 and peers["kafka_consume"]["bytes_per_s"] > 0
    assert peers["kafka_consume"]["delivery"]["delay"]["count"] > 0
    assert peers["reference"]["exact"] is True
    assert peers["pyflink"]["ran"] is False and "STREAMJOIN_PYFLINK_PYTHON" in peers["pyflink"]["why"]
    quix = peers["quix"]
    assert quix["ran"] is True, quix.get("why")
    assert quix["tuples_per_s"] > 0 and quix["processed"] == quix["tuples"] == sweep["verify"]["inputs"]["total"]
    # Exactness is judged, not assumed: the rule's pairs are the verified results, and the counts add up.
    assert quix["rule_matches_verified"] is True and quix["expected"] == sweep["verify"]["expected"]
    assert all(type(quix[k]) is int and quix[k] >= 0 for k in ("missing", "extra", "duplicates"))
    assert quix["results"] == quix["expected"] - quix["missing"] + quix["extra"] + quix["duplicates"]
    assert quix["exact"] is (quix["missing"] == quix["extra"] == quix["duplicates"] == 0)
    # What Quix misses is what its look-back cannot see: pairs whose newer member it read first.
    assert quix["missing_newer_arrived_first"] == quix["missing"]
    assert data["ratios"]["throughput_1w_vs_quix"]["peer"] == quix["tuples_per_s"]
    check_pathway(data, with_pathway)

    left = data["left_join"]
    assert left["exact"] is True
    live = left["ours"]["live"]["verify"]
    assert live["verified"] is True and live["join_type"] == "left"
    assert left["ours"]["unmatched"] == live["unmatched"] > 0  # null-padded rows were emitted and checked
    assert all(math.isfinite(left["ours"]["unmatched_delay_ms"][q]) for q in ("p50", "p99"))
    replays = left["ours"]["replays"]
    assert replays["left"]["identical_to_verified_run"] is True
    assert replays["inner"]["left_output_less_unmatched"] is True
    assert replays["left"]["inputs"] == replays["inner"]["inputs"] == live["inputs"]["total"]
    assert all(tps > 0 for tps in left["ours"]["throughput_tuples_per_s"].values())
    spark_left = left["peers"]["spark"]
    assert spark_left["exact_matches"] is True and spark_left["tuples_per_s"] > 0
    assert spark_left["unmatched_delay"]["count"] > 0

    ratios = data["ratios"]
    assert ratios["left_join_left_vs_spark_left"]["peer"] == spark_left["tuples_per_s"]
    assert ratios["left_join_left_vs_inner"]["ours"] == left["ours"]["throughput_tuples_per_s"]["left"]
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


def check_pathway(data: dict, ran: bool) -> None:
    """Where its venv is named, Pathway joined the same input, its exactness judged pair by pair and
    its two figures beside ours; elsewhere it says why it did not run and has no ratio."""
    pathway, ratios, sweep = data["peers"]["pathway"], data["ratios"], data["ours"]["sweeps"]["1"]
    if not ran:
        assert pathway["ran"] is False and "STREAMJOIN_PATHWAY_PYTHON" in pathway["why"]
        assert not [k for k in ratios if k.endswith("_vs_pathway")]
        return
    assert pathway["ran"] is True, pathway.get("why")
    assert pathway["processed"] == pathway["tuples"] == sweep["verify"]["inputs"]["total"]
    assert pathway["rule_matches_verified"] is True and pathway["expected"] == sweep["verify"]["expected"]
    assert all(type(pathway[k]) is int and pathway[k] >= 0 for k in ("missing", "extra", "duplicates", "retracted"))
    assert pathway["results"] == pathway["expected"] - pathway["missing"] + pathway["extra"] + pathway["duplicates"]
    assert pathway["exact"] is (pathway["missing"] == pathway["extra"] == pathway["duplicates"]
                                == pathway["retracted"] == 0)
    assert 0 < pathway["startup_seconds"] < pathway["wall_seconds"]
    assert pathway["cold_start_tuples_per_s"] > 0 and pathway["tuples_per_s"] > 0
    cold, steady = ratios["cold_start_1w_vs_pathway"], ratios["throughput_1w_vs_pathway"]
    assert cold["ours"] == data["ours"]["cold_start_tuples_per_s"]["1"] > 0
    assert cold["peer"] == pathway["cold_start_tuples_per_s"]
    assert steady["ours"] == data["ours"]["throughput_tuples_per_s"]["1"]
    assert steady["peer"] == pathway["tuples_per_s"]
