"""The hash-partitioned join as real processes on the embedded broker:
60 partitions, 2-3 workers, checked against the plain-Python reference."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import pytest

from streamjoin.services.io import kafka
from streamjoin.topology import topics
from streamjoin.services.coordinator.status import snapshot
from streamjoin.launcher import wait_drained
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import (feed_in_two_batches, lose_disk_and_rewind, metric, wait_heartbeats,
                                             wait_metric)
from tests.integration.kafka_harness import Row, check, produce

pytestmark = pytest.mark.integration


def rows_out_of_order(streams: str, n: int, keys: int, seed: int, lag_ms: int = 0) -> list[Row]:
    """Event times jitter within each topic; `lag_ms` holds the last stream back so topics
    interleave badly (its records are written after records far newer on the others)."""
    rnd = random.Random(seed)
    rows = [Row(rnd.choice(streams), rnd.randrange(keys), 10_000 + i * 5 + rnd.randint(-300, 0)) for i in range(n)]
    late_stream = streams[-1]
    return sorted(rows, key=lambda r: r.ts + (lag_ms if r.stream == late_stream else 0))


def test_two_way_time_window_with_bad_input(broker, fleet_for, tmp_path) -> None:
    """Started on a backlog, so a group reads rows far apart in time in one batch: the rows an
    hour... far behind their partitions' earlier rows, with the other stream moved on, are
    still late (judged in the batch's canonical order), and bad records are dead letters."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 400}, {"range_ms": 250}], workers=2,
                   join={"allowed_lateness_ms": 1000}, worker={"max_record_bytes": 512})
    rows = rows_out_of_order("rs", 6000, 100, seed=1, lag_ms=800)
    # Far behind every watermark once the streams have moved on (two thirds in): late.
    late = [Row("r", 7, 1_000), Row("s", 9, 2_000)]
    bad = [
        ("it.r", b"1", b"{not json"),
        ("it.r", b"2", json.dumps({"k": 2, "pad": "x"}).encode()),  # missing ts
        ("it.s", b"3", json.dumps({"k": "three", "ts": 20_000, "pad": "x"}).encode()),  # mistyped key
        ("it.s", b"4", json.dumps({"k": 4, "ts": 20_000, "pad": "x" * 600}).encode()),  # oversize
    ]
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
    produce(job, broker.bootstrap, rows[:4000] + late + rows[4000:], raw=bad)
    fleet = fleet_for(job, 2)
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 1000  # a join that produced nothing would prove nothing
    assert result.dead_letter["late"] == 2
    assert result.dead_letter["malformed"] == 3
    assert result.dead_letter["oversize"] == 1


def test_three_way_count_windows(broker, fleet_for, tmp_path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"rows": 3}, {"rows": 2}, {"range_ms": 300}], workers=3,
                   join={"allowed_lateness_ms": 500})
    fleet = fleet_for(job, 3)
    produce(job, broker.bootstrap, rows_out_of_order("rst", 6000, 200, seed=2, lag_ms=200))
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 500


def test_three_way_time_windows(broker, fleet_for, tmp_path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 300}] * 3, workers=2)
    fleet = fleet_for(job, 2)
    produce(job, broker.bootstrap, rows_out_of_order("rst", 6000, 40, seed=3, lag_ms=400))
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 500


def _produce_steadily(job, bootstrap, rows: list[Row], seconds: float) -> threading.Thread:
    def run() -> None:
        producer = kafka.Cluster(bootstrap).producer()
        chunk = max(1, len(rows) // int(seconds * 10))
        for i in range(0, len(rows), chunk):
            produce(job, bootstrap, rows[i:i + chunk], producer=producer)
            time.sleep(0.1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("changelog", [True, False], ids=["from-changelog", "replaying-history"])
def test_worker_with_its_disk_gone_rebuilds_from_kafka(broker, fleet_for, tmp_path, changelog: bool) -> None:
    """A worker whose RocksDB is gone rebuilds every group from its changelog and replays no
    batch (worker.changelog, the default), or without a changelog replays every batch the
    commits topic holds, each with nothing missing. Either way it must commit the input
    offsets again: the group's offsets are rewound first, so offsets that do not land leave
    the input undrained."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=1, partitions=4,
                   worker={"changelog": changelog})
    fleet = fleet_for(job, 1)
    rows = rows_out_of_order("rs", 3000, 50, seed=8)
    batches = feed_in_two_batches(job, broker.bootstrap, fleet, rows)
    assert len(batches) >= 2 * job.partitions
    lose_disk_and_rewind(job, broker.bootstrap, fleet, "w0")
    fleet.start_worker("w0")
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    port = fleet.metrics_ports["w0"]
    replayed, restored = (metric(port, "streamjoin_recovered_batches_total"),
                          metric(port, "streamjoin_changelog_restores_total"))
    assert (replayed, restored) == ((0, job.partitions) if changelog else (len(batches), 0))
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 1000


def test_coordinator_restart_keeps_placement(broker, fleet_for, tmp_path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=2)
    fleet = fleet_for(job, 2)
    before = snapshot(job, kafka.Cluster(broker.bootstrap))
    fleet.kill("coordinator", signal.SIGKILL)
    fleet.start_coordinator()
    produce(job, broker.bootstrap, rows_out_of_order("rs", 3000, 200, seed=5))
    # The new coordinator has loaded the placement and read both workers' heartbeats: had it
    # lost the placement, it would have made a new one (epoch 2) by now.
    port = fleet.metrics_ports["coordinator"]
    wait_metric(port, "streamjoin_coordinator_groups_placed", 60, timeout=60)
    wait_metric(port, "streamjoin_coordinator_workers_alive", 2, timeout=60)
    # It has answered a heartbeat of each worker (any assignment it sent went out before its
    # gauge moved): two heartbeat rounds later, each worker has applied it and beaten it back.
    beats = wait_heartbeats(job, broker.bootstrap, ["w0", "w1"], int(time.time() * 1000), count=2, fleet=fleet)
    after = snapshot(job, kafka.Cluster(broker.bootstrap))
    assert after["epoch"] == before["epoch"] == 1
    placed = {w["worker"]: w["placed_groups"] for w in after["workers"]}
    assert placed == {w["worker"]: w["placed_groups"] for w in before["workers"]}
    assert sorted(g for groups in placed.values() for g in groups) == list(range(60))
    # The workers still hold what they held, at the first epoch: no assignment moved anything.
    assert {w: b[-1].groups for w, b in beats.items()} == placed
    assert {b.epoch for bs in beats.values() for b in bs} == {1}
    # The new coordinator loaded the stored placement; only the first one made one.
    log = (fleet.log_dir / "coordinator.log").read_text()
    assert log.count("placement made") == 1 and log.count("coordinator started") == 2, log[-2000:]
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    assert check(job, broker.bootstrap).exact
