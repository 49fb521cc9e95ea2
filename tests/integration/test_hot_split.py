"""A hot key split while data flows, through the real parts: three hash workers with three slots,
a steady input in which one key carries 40% of the tuples. The coordinator finds it hot and
splits it over the slots on the two other workers; the worker holding its group is SIGKILLed
while the split is in force and its groups (the slot on it too) fail over; the input stops
making the key hot, so it cools and merges back. The results are exact against the plain-Python
reference and Spark `verify`, and the coordinator's log shows the split and the merge."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.coordinator.status import snapshot
from streamjoin.services.io import kafka
from streamjoin.topology.partitioner import partition_for
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import metric, wait_until
from tests.integration.kafka_harness import Row, assert_spark_verified, check, produce

pytestmark = pytest.mark.integration

HOT = 7
RATE = 300  # rows a second, event time about wall time


class Input(threading.Thread):
    """RATE rows a second in tenths of a second; while `hot` is set, 40% of them are key HOT."""

    def __init__(self, job, bootstrap: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.job, self.bootstrap = job, bootstrap
        self.hot, self.stop_flag = threading.Event(), threading.Event()
        self.hot.set()
        self.rows = 0

    def run(self) -> None:
        rnd = random.Random(3)
        producer = kafka.Cluster(self.bootstrap).producer()
        started = time.time()
        while not self.stop_flag.is_set():
            now_ms = int((time.time() - started) * 1000) + 10_000
            chunk = [Row(rnd.choice("rs"), HOT if self.hot.is_set() and rnd.random() < 0.4 else rnd.randrange(100, 400),
                         now_ms - rnd.randint(0, 100)) for _ in range(RATE // 10)]
            produce(self.job, self.bootstrap, chunk, producer=producer)
            self.rows += len(chunk)
            time.sleep(0.1)


def _logged(fleet, message: str) -> list[dict]:  # type: ignore[no-untyped-def]
    lines = (fleet.log_dir / "coordinator.log").read_text().splitlines()
    return [json.loads(line) for line in lines if f'"{message}"' in line]


@pytest.mark.spark
@pytest.mark.usefixtures("spark")  # `verify` runs on the session's one JVM, not a JVM of its own
def test_a_hot_key_splits_while_data_flows_survives_a_killed_worker_and_merges_back(
        broker, fleet_for, tmp_path: Path) -> None:
    started = time.monotonic()
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 100}, {"range_ms": 100}], workers=3, partitions=6,
                   coordinator={"hot_key_slots": 3, "hot_key_min_tuples": 200, "reorg_epoch_ms": 2000,
                                "hot_key_share": 0.2, "hot_key_cool_share": 0.1,
                                "heartbeat_timeout_ms": 4000, "worker_timeout_ms": 8000})
    fleet = fleet_for(job, 3)
    cluster = kafka.Cluster(broker.bootstrap)
    group = partition_for(key_bytes(HOT), job.partitions)
    feed = Input(job, broker.bootstrap)
    feed.start()
    try:
        split = wait_until("the hot key split over the other workers' slots", lambda: next(
            (k for k in snapshot(job, cluster)["split_keys"] if k["key"] == str(HOT)), None), timeout=60, fleet=fleet)
        owner = split["workers"][0]
        assert split["factor"] == 3 and owner not in split["workers"][1:], split
        # The split is in force once the group's owner has sent its slots their share of the key.
        wait_until("the group's owner spread the key", lambda: _sent(fleet, owner) > 0, timeout=60, fleet=fleet)
        fleet.restart_workers = False
        fleet.kill(owner, signal.SIGKILL)
        heir = wait_until("the killed worker's group failed over", lambda: next(
            (w["worker"] for w in snapshot(job, cluster)["workers"] if w["worker"] != owner
             and group in w["held_groups"]), None), timeout=60, fleet=fleet)
        # The group's new owner recovered the split with the group (its checkpoint holds the routing).
        wait_until("the group's new owner spread the key", lambda: _sent(fleet, heir) > 0, timeout=60, fleet=fleet)
        feed.hot.clear()
        wait_until("the key merged back", lambda: _logged(fleet, "hot key merged")
                   and not snapshot(job, cluster)["split_keys"], timeout=60, fleet=fleet)
    finally:
        feed.stop_flag.set()
        feed.join(30)
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    port = fleet.metrics_ports["coordinator"]
    assert metric(port, "streamjoin_migrations_total", 'outcome="failover"') >= 1
    receivers = [w for w in ("w0", "w1", "w2") if w != owner]
    assert sum(metric(fleet.metrics_ports[w], "streamjoin_changelog_restores_total") for w in receivers) >= 1
    assert [e["key"] for e in _logged(fleet, "hot key split")][:1] == [str(HOT)]
    assert _logged(fleet, "hot key merged")[0]["episode"] == split["episode"]  # the split outlived the crash
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 1000
    print(f"hot split: {feed.rows} rows, {result.expected} results, split over {split['workers']}, "
          f"{time.monotonic() - started:.0f} s before Spark")
    assert_spark_verified(job, broker.bootstrap, result.expected)


def _sent(fleet, worker: str) -> float:  # type: ignore[no-untyped-def]
    try:
        return metric(fleet.metrics_ports[worker], "streamjoin_split_sent_tuples_total", 'kind="fragmented"')
    except (OSError, IndexError):
        return 0.0
