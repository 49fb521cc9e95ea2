"""Ring safety through the real parts: watermarks that do not depend on fetch order, idle
inputs, and (ring.recovery off) a restarted ring node fenced instead of corrupting output."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamjoin.launcher import (Fleet, committed_offsets, input_end_offsets, wait_drained, wait_layout,
                                 wait_ring_quiet)
from streamjoin.schemas.control import RING_FENCED_EXIT, Heartbeat
from streamjoin.schemas.results import BatchCommit
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import latest_heartbeats, snapshot
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import wait_heartbeats, wait_until
from tests.integration.kafka_harness import Row, check, commits, produce, produced_refs
from tests.integration.ring_harness import band_rows, check_ring, produce_rows, ring_expected
from tests.integration.test_ring import band3, ring_fleet

pytestmark = pytest.mark.integration


def _metrics(fleet: Fleet, name: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_ports[name]}/metrics", timeout=5) as r:
        return r.read().decode()


def test_a_held_back_source_partition_dead_letters_nothing(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    """Every partition but 0 of every source is written first (a backlog far ahead in event
    time) and read by the head; partition 0's records come afterwards. The watermark is the
    min over partitions, so none of them is late and the output is exact."""
    job = band3(broker.bootstrap, tmp_path, ring={"nodes": 1}, coordinator={"expected_workers": 1,
                                                                             "heartbeat_timeout_ms": 5000})
    rows = band_rows(job, 1200, seed=11, span_ms=20_000)
    parts = np.random.default_rng(1011).integers(0, job.partitions, len(rows)).tolist()
    ahead = [k for k, p in enumerate(parts) if p != 0]
    held = [k for k, p in enumerate(parts) if p == 0]
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0"])
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0"])
        produce_rows(job, broker.bootstrap, [rows[k] for k in ahead], partitions=[parts[k] for k in ahead])
        # The head reads the others' backlog, many rounds' worth, before partition 0 moves: it
        # commits its source offsets with every round it releases, so they reach the others' ends.
        others = {tp: end for tp, end in input_end_offsets(job, broker.bootstrap).items() if tp[1] != 0}
        assert sum(others.values()) == len(ahead)
        wait_until("the head read every source partition but 0 to its end",
                   lambda: all(committed_offsets(job, broker.bootstrap, list(others)).get(tp, -1) >= end
                               for tp, end in others.items()), fleet=fleet)
        # ... and holds every tuple of it back: partition 0, empty so far, holds the watermark.
        read_ahead = wait_heartbeats(job, broker.bootstrap, ["w0"], int(time.time() * 1000), fleet=fleet)["w0"][-1]
        produce_rows(job, broker.bootstrap, [rows[k] for k in held], partitions=[0] * len(held))
        wait_ring_quiet(job, broker.bootstrap, fleet)
        result = check_ring(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    assert read_ahead.lag == len(ahead), (read_ahead.lag, len(ahead))
    assert result.dead_letter["late"] == 0, result
    assert result.expected > 100 and result.exact, result


def test_an_idle_stream_lets_groups_progress(broker: embedded.EmbeddedBroker, fleet_for, tmp_path: Path) -> None:
    """Hash mode, join.idle_timeout_ms: stream s writes a few keys early and then nothing (most
    groups never see an s record); r goes on. Once s is idle the groups' watermarks follow r:
    count windows emit, state expires, and the output is exact against the reference."""
    job = make_job(broker.bootstrap, tmp_path, [{"rows": 2}, {"range_ms": 500}], workers=1, partitions=4,
                   join={"allowed_lateness_ms": 100, "idle_timeout_ms": 1000})
    fleet = fleet_for(job, 1)
    produce(job, broker.bootstrap, [Row("s", k, 10_000 + k) for k in range(3)])
    r_rows = [Row("r", k % 7, 10_000 + 10 * k) for k in range(600)]
    for chunk in range(12):  # r keeps coming for a few seconds after s went quiet
        produce(job, broker.bootstrap, r_rows[chunk * 50:(chunk + 1) * 50])
        time.sleep(0.4)
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        marks = [c.watermark for c in commits(job, broker.bootstrap) if isinstance(c, BatchCommit)]
        if marks and max(marks) >= 10_000 + 10 * 599 - 100 - 500:
            break
        time.sleep(0.25)
    result = check(job, broker.bootstrap)
    tuples = sum(w["state_tuples"] or 0 for w in snapshot(job, kafka.Cluster(broker.bootstrap))["workers"])
    assert max(marks) >= 10_000 + 10 * 599 - 100 - 500, marks  # far past s's newest (10_002): r moved it
    assert result.exact, result
    assert result.expected >= 3 * 2, result  # each s tuple joins the 2 r rows of its key's window
    assert tuples <= 7 * 2 + 50, tuples  # r keeps its last 2 rows per key (plus what is not final yet)


def test_without_recovery_a_restarted_ring_node_is_fenced(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    """`ring.recovery: false`. SIGKILL a ring node mid-run; the supervisor restarts it. The new
    incarnation finds its earlier start on the epochs topic, reports the ring failed and exits
    RING_FENCED_EXIT; no node writes a result after that. Every result written is right and
    written once. (With recovery on, test_ring_recovery.py.)"""
    job = band3(broker.bootstrap, tmp_path, ring={"nodes": 2, "recovery": False},
                coordinator={"expected_workers": 2, "heartbeat_timeout_ms": 5000})
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0", "w1"])
    fleet.restart_workers = True
    rows = band_rows(job, 1500, seed=13, span_ms=30_000)
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1"])
        produce_rows(job, broker.bootstrap, rows[:700])
        deadline = time.monotonic() + 60
        while not produced_refs(job, broker.bootstrap) and time.monotonic() < deadline:
            time.sleep(0.5)
        os.kill(fleet.procs["w1"].pid, signal.SIGKILL)
        fleet.procs["w1"].wait(30)
        fleet.supervise()  # restarts w1: a new incarnation
        restarted = fleet.procs["w1"]
        restarted.wait(60)
        fleet.supervise()  # leaves a fenced node down
        produce_rows(job, broker.bootstrap, rows[700:])

        def w0_failed() -> Heartbeat | None:
            beat = latest_heartbeats(job, kafka.Cluster(broker.bootstrap), window_s=3).get("w0")
            return beat if beat is not None and beat.ring_failed else None

        failed = wait_until("w0 reports the ring failed", w0_failed, timeout=30)
        # rows[700:] are on the broker, and w0 has gone round its loop (a heartbeat per pass, the
        # head's tick in each) a few times since: were the ring still running, it would have
        # taken them and released rounds.
        after = wait_heartbeats(job, broker.bootstrap, ["w0"], int(time.time() * 1000), count=4)["w0"]
        status = snapshot(job, kafka.Cluster(broker.bootstrap))
        scraped = _metrics(fleet, "w0")
    finally:
        fleet.stop_all()
    assert all(b.ring_failed == "node-restarted" for b in after), after
    assert {b.ring_round for b in after} == {failed.ring_round}, "the head released rounds after the ring failed"
    assert restarted.returncode == RING_FENCED_EXIT
    assert fleet.procs.get("w1") is None or fleet.procs["w1"] is restarted  # not restarted again
    assert status["ring_failed"] == "node-restarted", status
    assert 'streamjoin_ring_failed{reason="node-restarted"} 1.0' in scraped
    produced = produced_refs(job, broker.bootstrap)
    expected, _ = ring_expected(job, broker.bootstrap, None, every_input=True)
    counts = Counter(produced)
    assert produced, "the ring wrote nothing before the kill: the test proved nothing"
    assert set(counts) <= expected, len(set(counts) - expected)
    assert max(counts.values()) == 1, [r for r, c in counts.items() if c > 1][:3]
