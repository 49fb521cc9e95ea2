"""What the quick runs of the benchmarks whose peers are judged against an oracle (bench asof,
bench window) share: the command run as a user runs it, and the checks of the report's common
part (our live run verified, its replay identical, the oracle agreeing with verify, PyFlink not
run without its venv, the ratio to the peer that ran, the machine and the plot)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path


def run_quick(workload: str, tmp_path: Path, unset: tuple[str, ...] = ()) -> tuple[dict, Path]:
    """`streamjoin bench WORKLOAD --quick` on a fresh embedded broker without PyFlink's venv
    (nor the variables `unset`): its report, checked to be the JSON it printed, and the plot."""
    out, plot = tmp_path / f"{workload}.json", tmp_path / f"{workload}.png"
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMJOIN_BOOTSTRAP", "STREAMJOIN_PYFLINK_PYTHON", *unset)}
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", workload, "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["workload"] == workload and data["exact"] is True and data["parameters"]["mode"] == "quick"
    return data, plot


def check_ours_and_oracle(data: dict) -> dict:
    """Our live run verified exact with its delay, the 1-worker replay identical to it, and the
    oracle's pairs as many as verify expected; returns verify's report."""
    ours = data["ours"]
    verdict = ours["live"]["verify"]
    assert verdict["verified"] is True and verdict["results"] == verdict["expected"] > 0
    assert verdict["missing"] == verdict["extra"] == verdict["duplicates"] == verdict["bad_ids"] == 0
    assert 0 <= ours["delay_ms"]["p50"] <= ours["delay_ms"]["p95"] <= ours["delay_ms"]["p99"]
    replay = ours["replays"]["1"]
    assert replay["identical_to_verified_run"] is True and replay["inputs"] == verdict["inputs"]["total"]
    assert ours["throughput_tuples_per_s"]["1"] == replay["tuples_per_s"] > 0
    assert data["oracle"]["matches_verified"] is True and data["oracle"]["pairs"] == verdict["expected"]
    return verdict


def check_peer_counts(peer: dict, verdict: dict) -> None:
    """A peer that ran on all of the input, its counts adding up to its results."""
    assert peer["ran"] is True, peer.get("why")
    assert peer["tuples"] == verdict["inputs"]["total"] and peer["tuples_per_s"] > 0
    assert peer["expected"] == verdict["expected"]
    assert peer["results"] == peer["expected"] - peer["missing"] + peer["extra"] + peer["duplicates"]
    assert peer["exact"] is (peer["missing"] == peer["extra"] == peer["duplicates"] == 0)


def check_ratio_machine_plot(data: dict, peer: str, plot: Path) -> None:
    """PyFlink not run (no venv) and in no ratio; our 1-worker throughput over `peer`'s, with
    both figures; the machine; the plot written."""
    pyflink = data["peers"]["pyflink"]
    assert pyflink["ran"] is False and "STREAMJOIN_PYFLINK_PYTHON" in pyflink["why"]
    ratio = data["ratios"][f"throughput_1w_vs_{peer}"]
    assert ratio["ours"] == data["ours"]["throughput_tuples_per_s"]["1"]
    assert ratio["peer"] == data["peers"][peer]["tuples_per_s"]
    assert math.isclose(ratio["ratio"], ratio["ours"] / ratio["peer"])
    assert not any("pyflink" in name for name in data["ratios"])
    assert data["machine"]["cores"] >= 1 and data["machine"]["versions"]["tansu"]
    assert data["plot"] == str(plot) and plot.stat().st_size > 10_000
