"""Issue 14 through the real parts: a 3-node ring on the 3-way band job survives SIGKILLs of
its head, a middle node and its tail (each restarted by its supervisor, or replaced by a
standby): every node rolls back to the last checkpoint, the head re-drives the logged rounds,
and the results stay exact (the reference, and Spark `verify` as the independent oracle)."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from streamjoin.launcher import Fleet, wait_layout, wait_ring_quiet
from streamjoin.services import broker as embedded
from streamjoin.services import kafka
from streamjoin.services.coordinator.status import latest_heartbeats, snapshot
from tests.integration.ring_harness import band_rows, check_ring, produce_rows
from tests.integration.test_ring import band3, ring_fleet

pytestmark = pytest.mark.integration


def _metric(fleet: Fleet, name: str, metric: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_ports[name]}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{metric} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _kill(fleet: Fleet, name: str) -> None:
    os.kill(fleet.procs[name].pid, signal.SIGKILL)
    fleet.procs[name].wait(30)


def _wait_results(job, bootstrap: str, fleet: Fleet, more_than: int, timeout: float = 90.0) -> None:
    """Until the results topic holds more than `more_than` results (the ring is running)."""
    deadline = time.monotonic() + timeout
    cluster = kafka.Cluster(bootstrap)
    while time.monotonic() < deadline:
        fleet.supervise()
        ends = kafka.end_offsets(cluster, [(job.results_topic, p) for p in range(job.partitions)], "t-ends")
        if sum(ends.values()) > more_than:
            return
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {more_than} results within {timeout}s")


def _written(job, bootstrap: str) -> int:
    ends = kafka.end_offsets(kafka.Cluster(bootstrap), [(job.results_topic, p) for p in range(job.partitions)], "t-ends")
    return sum(ends.values())


@pytest.mark.spark
def test_a_ring_survives_its_head_middle_and_tail_killed(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    from streamjoin.services.spark.verify import run_verify

    job = band3(broker.bootstrap, tmp_path, ring={"nodes": 3, "checkpoint_ms": 1500, "standby_after_ms": 8000},
                coordinator={"expected_workers": 4, "heartbeat_timeout_ms": 3000})
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0", "w1", "w2", "w3"])  # w3: the standby
    fleet.restart_workers = True
    rows = band_rows(job, 2400, seed=14, span_ms=40_000)
    recovered: dict[str, float] = {}
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1", "w2"])
        produce_rows(job, broker.bootstrap, rows[:600])
        _wait_results(job, broker.bootstrap, fleet, 0)
        for step, victim in enumerate(["w0", "w1"]):  # the head, then a middle node: restarted
            _kill(fleet, victim)
            fleet.supervise()
            produce_rows(job, broker.bootstrap, rows[600 * (step + 1):600 * (step + 2)])
            _wait_results(job, broker.bootstrap, fleet, _written(job, broker.bootstrap))
        _kill(fleet, "w2")  # the tail stays down: the standby takes its place
        fleet.procs.pop("w2")
        produce_rows(job, broker.bootstrap, rows[1800:])
        _wait_results(job, broker.bootstrap, fleet, _written(job, broker.bootstrap), timeout=120)
        wait_ring_quiet(job, broker.bootstrap, fleet)
        beats = latest_heartbeats(job, kafka.Cluster(broker.bootstrap), window_s=3)
        recovered = {m: _metric(fleet, "w0", m) for m in (
            "streamjoin_ring_recoveries_total", "streamjoin_ring_rounds_redriven_total",
            "streamjoin_ring_recovery_seconds", "streamjoin_ring_checkpoints_total")}
        replaced = _metric(fleet, "coordinator", "streamjoin_ring_replaced_total")
        status = snapshot(job, kafka.Cluster(broker.bootstrap))
        result = check_ring(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    print("time to recover (head, last rollback):", recovered)
    assert "w2" in beats and beats["w2"].ring_failed == "", beats  # the standby plays w2 now
    assert recovered["streamjoin_ring_recoveries_total"] >= 2, recovered  # the middle's and the tail's restarts
    assert recovered["streamjoin_ring_rounds_redriven_total"] > 0, recovered  # the crash path really ran
    assert recovered["streamjoin_ring_checkpoints_total"] >= 1, recovered
    assert replaced == 1  # the coordinator handed w2 to the standby
    head = next(row for row in status["workers"] if row["worker"] == "w0")
    assert status["ring_epoch"] is not None and head["ring_recovery"]["recoveries"] >= 2, status
    assert head["ring_recovery"]["redriven"] > 0, head
    assert result.expected > 1500, result
    assert result.exact, result
    spark = run_verify(job, kafka.Cluster(broker.bootstrap))  # the independent oracle agrees
    assert spark["verified"] and spark["results"] == result.results, spark
