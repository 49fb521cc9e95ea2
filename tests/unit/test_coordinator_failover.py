"""Who the coordinator declares dead (services/coordinator/main.py): a worker silent for
`coordinator.worker_timeout_ms` while others are heard; nobody while the coordinator hears
no heartbeat at all (the broker is away from it), and after such a silence every worker's
timeout starts again. The Kafka clients are built but never reach a broker."""

from __future__ import annotations

import time

from streamjoin.schemas.control import Heartbeat
from streamjoin.services import kafka
from streamjoin.services.coordinator.main import Coordinator
from streamjoin.services.coordinator.moves import Moves
from streamjoin.settings import load


def _coordinator() -> Coordinator:
    job = load(None, job="cf", bootstrap="127.0.0.1:1", partitions=2,
               streams=[{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                         "window": {"range_ms": 1000}} for n in "rs"],
               coordinator={"heartbeat_timeout_ms": 5000, "worker_timeout_ms": 30000})
    coordinator = Coordinator(job, kafka.Cluster.of(job))
    coordinator.moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    return coordinator


def test_a_worker_silent_past_the_timeout_is_dead_while_others_are_heard() -> None:
    coordinator = _coordinator()
    now = time.monotonic()
    coordinator.last_seen = {"a": now - 31, "b": now - 1}
    assert coordinator.dead() == ["a"]
    coordinator.last_seen["a"] = now - 29
    assert coordinator.dead() == []


def test_nobody_is_dead_while_the_coordinator_hears_nothing_and_timeouts_restart_after() -> None:
    coordinator = _coordinator()
    now = time.monotonic()
    coordinator.last_seen = {"a": now - 100, "b": now - 40}
    assert coordinator.dead() == []  # no heartbeat at all for 40 s: the coordinator is the one cut off
    coordinator.on_heartbeat(Heartbeat(worker="b", wall_ms=0, groups=[1], epoch=1))
    assert coordinator.dead() == []  # "a" gets a whole timeout from now
    coordinator.last_seen["a"] -= 31
    assert coordinator.dead() == ["a"]
