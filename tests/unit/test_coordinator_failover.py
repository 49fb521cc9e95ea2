"""Who the coordinator declares dead (services/coordinator/main.py): a worker silent for
`coordinator.worker_timeout_ms` while others are heard; nobody while the coordinator hears
no heartbeat at all (the broker is away from it), and after such a silence every worker's
timeout starts again. The Kafka clients are built but never reach a broker."""

from __future__ import annotations

import time

from streamjoin.schemas.control import Heartbeat
from streamjoin.services.io import kafka
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


def test_adaptive_placement_starts_the_policys_moves_at_the_end_of_an_epoch() -> None:
    """coordinator.placement: adaptive: a supplier (backlog over half the buffer) yields a group
    to a consumer (an empty backlog) through the migration protocol, once per epoch, and
    nothing else starts while that move is in flight (the spill paper, section 6)."""
    coordinator = _coordinator()
    coordinator.job = coordinator.job.model_copy(update={"coordinator": coordinator.job.coordinator.model_copy(
        update={"placement": "adaptive", "reorg_epoch_ms": 1000})})
    coordinator.moves = Moves({0: "a", 1: "a", 2: "b"}, {}, epoch=1)
    now_ms = int(time.time() * 1000)
    for worker, backlog, groups in (("a", 4 << 20, [0, 1]), ("b", 0, [2])):
        coordinator.on_heartbeat(Heartbeat(worker=worker, wall_ms=now_ms, groups=groups, epoch=1,
                                           backlog_bytes=backlog, group_bytes=dict.fromkeys(groups, 1000)))
    coordinator.next_epoch_at = 0.0
    coordinator._start_plan = lambda plan: setattr(coordinator, "planned", plan)  # type: ignore[method-assign]
    coordinator._adapt()
    plan = coordinator.planned  # type: ignore[attr-defined]
    assert [(m.source, m.target, m.reason) for m in plan.moves] == [("a", "b", "load")]
    coordinator.moves.move(plan.moves[0].group, "b", ["a", "b"], 0.0)
    coordinator.next_epoch_at = 0.0
    coordinator._adapt()
    assert coordinator.planned.moves == () and "under way" in coordinator.planned.notes[0]  # type: ignore[attr-defined]


def test_a_plans_moves_start_through_the_protocol_and_a_scale_in_victim_is_drained(monkeypatch) -> None:
    from streamjoin.services.coordinator import main
    from streamjoin.services.coordinator.epoch import Move, Plan, ScaleChange

    coordinator = _coordinator()
    coordinator.moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    now = time.monotonic()
    coordinator.last_seen = {"a": now, "b": now}
    stored, told = [], []
    monkeypatch.setattr(main.placing, "store_records", lambda job, out, records: stored.extend(records))
    monkeypatch.setattr(coordinator, "_assign", told.append)
    plan = Plan(0, {}, {}, moves=(Move(0, "a", "b", "scale-in", 10, "why"),),
                scale=ScaleChange("scale-in", "a", "no supplier"))
    coordinator._start_plan(plan)
    assert [(r.group, r.worker, r.moving_from) for r in stored] == [(0, "b", "a")] and told == ["a"]
    assert coordinator.moves.drained == {"a"} and coordinator.history.last_scale_ms == 0
