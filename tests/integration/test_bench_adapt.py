"""`streamjoin bench adapt --quick`, as a user runs it: live fleets on one
embedded broker fed by the paced producer; groups moved through the control
topic, a worker SIGKILLed and failed over, a slowed worker and a rate ramp
under fixed and adaptive placement; every job checked exact (the quick run
uses the plain-Python reference join), ratios, JSON and both PNGs, so the
harness cannot rot. Behaviour only: the figures are for docs/benchmarks/adapt.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.integration]


def _exact(verdict: dict) -> bool:
    return (verdict["verified"] is True and verdict["missing"] == verdict["extra"] == verdict["duplicates"] == 0
            and verdict["results"] == verdict["expected"] > 0)


def test_bench_adapt_quick_reports_exact_moves_failover_and_both_placements(tmp_path: Path) -> None:
    out, plot = tmp_path / "out.json", tmp_path / "adapt.png"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}  # a fresh embedded broker
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "adapt", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["exact"] is True and data["parameters"]["mode"] == "quick"

    migration = data["ours"]["migration"]
    for size in migration["sizes"]:
        assert _exact(size["verify"])
        assert len(size["moves"]) == data["parameters"]["migration"]["moves_per_size"]
        assert all(m["pause_s"] > 0 and m["sender_s"] is not None and m["receiver_s"] is not None
                   for m in size["moves"])
        assert size["coordinator"]["migrations"]["done"] >= len(size["moves"])
        assert {"before", "during", "after"} == set(size["delay"])
        assert size["delay"]["before"]["all"]["count"] > 0
    assert set(migration["goal"]) >= {"pause_p99_s", "met"}

    failover = data["ours"]["failover"]
    assert _exact(failover["verify"])
    assert len(failover["kills"]) == failover["workers"] - 1
    for kill in failover["kills"]:
        assert kill["groups"] and kill["held_s"] > 0 and math.isfinite(kill["producing_again_s"])
    assert failover["coordinator"]["migrations"]["failover"] >= len(failover["kills"][0]["groups"])

    runs = {"skew": (data["ours"]["skew"], data["peers"]["fixed_placement"]["skew"]),
            "ramp": (data["ours"]["ramp"], data["peers"]["fixed_placement"]["ramp"])}
    for adaptive, fixed in runs.values():
        assert (adaptive["placement"], fixed["placement"]) == ("adaptive", "sticky")
        for run in (adaptive, fixed):
            assert _exact(run["verify"])
            assert run["delay"]["count"] > 0 and run["results_per_s"] > 0
            assert len(run["curves"]["t_s"]) == len(run["curves"]["p99_ms"]) == len(run["curves"]["results_per_s"])
            assert run["curves"]["active_workers"] and max(run["curves"]["active_workers"]) >= 1
        assert fixed["adaptations"] == [] and fixed["moves_done"] == 0  # sticky placement moves nothing
        # Sticky placement keeps its groups where they were: both workers hold some (a heartbeat
        # delayed on a loaded machine may hide one for a second, so not at every instant).
        assert max(fixed["curves"]["active_workers"]) == 2

    for r in data["ratios"].values():
        assert math.isclose(r["ratio"], r["ours"] / r["peer"])
    assert data["ratios"]["ramp_active_worker_seconds"]["peer"] == runs["ramp"][1]["active_worker_seconds"]
    assert all(Path(p).stat().st_size > 10_000 for p in data["plots"].values())
    assert data["machine"]["cores"] >= 1
