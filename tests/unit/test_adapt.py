"""The adaptive placement policy (services/coordinator/adapt.py): seed 000's load balancing and
degree of declustering, seed 003's memory balancing, rule by rule on hand-built epochs, then as
Hypothesis properties over random ones; and the dry run that reports it
(services/coordinator/rebalance.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.schemas import control
from streamjoin.services import kafka
from streamjoin.services.coordinator.adapt import (
    History, Plan, WorkerObservation, classify, half_the_gap, occupancy, plan_epoch,
)
from streamjoin.services.coordinator.rebalance import dry_run, observe
from streamjoin.services.worker.intake import RecordBuffer
from streamjoin.services.worker.main import Worker
from streamjoin.settings import CoordinatorSpec, load

MIB = 1 << 20
NOW = 1_000_000
DEFAULTS = CoordinatorSpec()


def active(name: str, backlog: int, groups: dict[int, int], alive: bool = True) -> WorkerObservation:
    return WorkerObservation(name, alive, "active", (backlog,), groups)


def standby(name: str, alive: bool = True) -> WorkerObservation:
    return WorkerObservation(name, alive, "standby", (0,), {})


def plan(observations: list[WorkerObservation], history: History = History(), seed: int = 0,
         **coordinator: object) -> Plan:
    return plan_epoch(observations, CoordinatorSpec(**coordinator), NOW, history, random.Random(seed))


HOT = MIB  # occupancy 1.0: a supplier
IDLE = 0  # occupancy 0: a consumer
BUSY = MIB // 4  # occupancy 0.25: neutral


# ------------------------------------------------------------------ load signal (seed 000 IV-C)
def test_occupancy_is_the_epochs_mean_backlog_over_the_buffer() -> None:
    assert occupancy((0, MIB), MIB) == 0.5
    assert occupancy((3 * MIB,), MIB) == 3.0  # Kafka holds more than a bounded buffer would
    assert occupancy((), MIB) is None


def test_supplier_above_half_consumer_below_one_percent_else_neutral() -> None:
    assert classify(0.5, DEFAULTS) == "neutral"  # strictly above theta_s
    assert classify(0.5001, DEFAULTS) == "supplier"
    assert classify(0.01, DEFAULTS) == "neutral"  # strictly below theta_c
    assert classify(0.0099, DEFAULTS) == "consumer"
    assert classify(None, DEFAULTS) == "neutral"  # nothing observed says neither


# ------------------------------------------------------------------ load balancing (seed 000 IV-C)
def test_a_supplier_yields_one_group_to_a_consumer() -> None:
    p = plan([active("a", HOT, {1: 10, 2: 20, 3: 30}), active("b", IDLE, {4: 10}), active("c", BUSY, {5: 10})])
    assert p.load_class == {"a": "supplier", "b": "consumer", "c": "neutral"}
    assert [(m.source, m.target, m.reason) for m in p.moves] == [("a", "b", "load")]
    assert p.moves[0].group in (1, 2, 3) and "supplier" in p.moves[0].why and p.scale is None


def test_the_random_group_comes_from_the_injected_rng() -> None:
    observations = [active("a", HOT, {g: 10 for g in range(20)}), active("b", IDLE, {30: 10})]
    chosen = {plan(observations, seed=s).moves[0].group for s in range(10)}
    assert len(chosen) > 1  # random, not always the same group
    assert plan(observations, seed=3).moves == plan(observations, seed=3).moves  # replayable


def test_heaviest_yields_the_group_with_most_state() -> None:
    p = plan([active("a", HOT, {1: 10, 2: 99, 3: 30}), active("b", IDLE, {4: 10})], yield_group="heaviest")
    assert p.moves[0].group == 2 and p.moves[0].state_bytes == 99


def test_most_loaded_supplier_is_paired_with_least_loaded_consumer() -> None:
    p = plan([active("a", HOT, {1: 1, 2: 1}), active("b", 2 * HOT, {3: 1, 4: 1}),
              active("c", 10, {5: 1}), active("d", IDLE, {6: 1})])
    assert sorted((m.source, m.target) for m in p.moves) == [("a", "c"), ("b", "d")]


def test_each_consumer_takes_at_most_one_group() -> None:
    p = plan([active("a", HOT, {1: 1, 2: 1}), active("b", HOT, {3: 1, 4: 1}), active("c", IDLE, {5: 1})],
             scale_lambda=2)  # 2 suppliers are not > 2 x 1 consumer: no scale-out
    assert [(m.source, m.target) for m in p.moves] == [("a", "c")]
    assert any("no consumer is left" in n for n in p.notes)


def test_a_supplier_with_one_group_keeps_it() -> None:
    p = plan([active("a", HOT, {1: 10}), active("b", IDLE, {2: 10})])
    assert p.moves == () and any("holds 1 group" in n for n in p.notes)


def test_dead_workers_neither_give_nor_take() -> None:
    p = plan([active("a", HOT, {1: 1, 2: 1}), active("b", IDLE, {3: 1}, alive=False), standby("c", alive=False),
              active("d", BUSY, {4: 1})])
    assert p.moves == () and p.scale is None  # the only consumer is dead; so is the only standby
    assert "b" not in p.load_class


# ------------------------------------------------------------------ degree of declustering (seed 000 V-A)
def test_scale_out_when_suppliers_exceed_lambda_times_consumers() -> None:
    workers = [active("a", HOT, {1: 1, 2: 1}), active("b", HOT, {3: 1, 4: 1}), active("c", IDLE, {5: 1}),
               standby("s1"), standby("s0")]
    p = plan(workers)
    assert p.scale is not None and (p.scale.action, p.scale.worker) == ("scale-out", "s0")
    assert sorted(m.target for m in p.moves) == ["c", "s0"]  # the new worker takes a group at once
    assert plan(workers, scale_lambda=2).scale is None  # 2 > 2 x 1 is false


def test_scale_out_without_a_standby_says_the_replica_count_is_the_maximum() -> None:
    p = plan([active("a", HOT, {1: 1, 2: 1}), active("b", BUSY, {3: 1})])
    assert p.scale is None and any("no standby" in n for n in p.notes)


def test_scale_in_when_no_supplier_drains_the_worker_with_least_state() -> None:
    p = plan([active("a", BUSY, {1: 50, 2: 50}), active("b", IDLE, {3: 30, 4: 20}), active("c", IDLE, {5: 60})])
    assert p.scale is not None and (p.scale.action, p.scale.worker) == ("scale-in", "b")
    assert {m.group for m in p.moves} == {3, 4} and {m.reason for m in p.moves} == {"scale-in"}
    assert [(m.group, m.target) for m in p.moves] == [(3, "c"), (4, "c")]  # c holds less than a (100): 60, then 90


def test_the_last_active_worker_is_never_drained() -> None:
    p = plan([active("a", IDLE, {1: 1}), standby("s")])
    assert p.scale is None and p.moves == ()


def test_scaling_waits_for_its_cool_down() -> None:
    workers = [active("a", IDLE, {1: 1}), active("b", IDLE, {2: 1})]
    recent = History(last_scale_ms=NOW - DEFAULTS.scale_cooldown_ms + 1)
    assert plan(workers, recent).scale is None
    assert plan(workers, History(last_scale_ms=NOW - DEFAULTS.scale_cooldown_ms)).scale is not None
    hot = [active("a", HOT, {1: 1, 2: 1}), active("b", BUSY, {3: 1}), standby("s")]
    assert plan(hot, recent).scale is None and plan(hot).scale is not None


# ------------------------------------------------------------------ memory balancing (seed 003 5.1-5.2)
def neutral_pair(full: dict[int, int], empty: dict[int, int]) -> list[WorkerObservation]:
    """Two neutral workers (one has a supplier's backlog, the other a consumer's would trigger
    seed 000), so only memory balancing can act."""
    return [active("full", BUSY, full), active("empty", BUSY, empty)]


def test_memory_balancing_moves_half_the_gap_from_fullest_to_emptiest() -> None:
    p = plan(neutral_pair({1: 400, 2: 300, 3: 200, 4: 100}, {9: 200}), History(last_scale_ms=NOW))
    # M_least / M_most = 200 / 1000 < 0.8: move about 400 bytes (largest first: 400 fits exactly)
    assert p.adaptation == "memory" and [(m.group, m.source, m.target) for m in p.moves] == [(1, "full", "empty")]


def test_memory_balancing_fires_only_below_theta() -> None:
    tens = {g: 100 for g in range(2, 11)}
    at_theta = neutral_pair({1: 100} | tens, {99: 800})  # 800 / 1000 = 0.8: not below
    assert plan(at_theta, History(last_scale_ms=NOW)).moves == ()
    below = neutral_pair({1: 101} | tens, {99: 800})  # 800 / 1001
    assert plan(below, History(last_scale_ms=NOW)).adaptation == "memory"
    assert plan(below, History(last_scale_ms=NOW), memory_balance_theta=0).moves == ()  # 0: off


def test_memory_balancing_waits_45_s_between_runs() -> None:
    workers = neutral_pair({1: 600, 2: 400}, {9: 100})
    assert plan(workers, History(last_scale_ms=NOW, last_memory_ms=NOW - 44_999)).moves == ()
    assert plan(workers, History(last_scale_ms=NOW, last_memory_ms=NOW - 45_000)).adaptation == "memory"


def test_memory_balancing_never_runs_beside_another_adaptation() -> None:
    imbalanced = {1: 600, 2: 400}
    load = plan([active("full", HOT, imbalanced), active("empty", IDLE, {9: 1})])
    assert load.adaptation == "load" and {m.reason for m in load.moves} == {"load"}
    busy = plan(neutral_pair(imbalanced, {9: 1}), History(last_scale_ms=NOW, in_flight=True))
    assert busy.moves == () and busy.scale is None and "under way" in busy.notes[0]


def test_a_group_larger_than_the_gap_is_not_moved() -> None:
    p = plan(neutral_pair({1: 1000}, {9: 10}), History(last_scale_ms=NOW))
    assert p.moves == () and any("would not narrow" in n for n in p.notes)


def test_half_the_gap_takes_largest_first_while_it_gets_closer() -> None:
    assert half_the_gap({1: 400, 2: 300, 3: 200, 4: 100}, 400) == [1]
    assert half_the_gap({1: 300, 2: 250, 3: 100}, 400) == [1, 3]
    assert half_the_gap({1: 500}, 300) == [1]  # overshoots by 200, closer than staying 300 short
    assert half_the_gap({1: 600}, 300) == []  # would leave the gap as wide the other way
    assert half_the_gap({1: 0, 2: 0}, 300) == []


# ------------------------------------------------------------------ history
def test_history_records_what_a_plan_started() -> None:
    scaled = plan([active("a", IDLE, {1: 5}), active("b", IDLE, {2: 1})])
    after = History().after(scaled)
    assert after.last_scale_ms == NOW and after.last_memory_ms is None and after.in_flight
    scaling_cools = History(last_scale_ms=NOW)  # so a scale-in does not take the epoch
    memory = plan(neutral_pair({1: 600, 2: 400}, {9: 100}), scaling_cools)
    assert scaling_cools.after(memory) == History(last_scale_ms=NOW, last_memory_ms=NOW, in_flight=True)
    assert History().after(plan([active("a", BUSY, {1: 1})])) == History()


# ------------------------------------------------------------------ properties
NAMES = [f"w{i}" for i in range(6)]


@st.composite
def epochs(draw: st.DrawFn) -> tuple[list[WorkerObservation], CoordinatorSpec, History, int]:
    groups = iter(range(1000))
    observations = []
    for name in NAMES[:draw(st.integers(1, 6))]:
        role = draw(st.sampled_from(["active", "active", "standby"]))
        held = {next(groups): draw(st.integers(0, 5 * MIB)) for _ in range(draw(st.integers(0, 6)))}
        samples = tuple(draw(st.lists(st.sampled_from([IDLE, 5_000, BUSY, HOT, 3 * MIB]) | st.integers(0, 3 * MIB),
                                      max_size=3)))
        observations.append(WorkerObservation(name, draw(st.booleans()) or draw(st.booleans()), role, samples,
                                              held if role == "active" else {}))
    theta_c = draw(st.sampled_from([0.0, 0.01, 0.2]))
    settings = CoordinatorSpec(
        consumer_occupancy=theta_c, supplier_occupancy=draw(st.sampled_from([0.3, 0.5, 0.9])),
        scale_lambda=draw(st.sampled_from([0.5, 1.0, 2.0])), yield_group=draw(st.sampled_from(["random", "heaviest"])),
        memory_balance_theta=draw(st.sampled_from([0.0, 0.5, 0.8, 1.0])))
    last = st.none() | st.integers(NOW - 90_000, NOW)
    history = History(draw(last), draw(last), draw(st.booleans()) and draw(st.booleans()))
    return observations, settings, history, draw(st.integers(0, 2**32))


def by_name(observations: list[WorkerObservation]) -> dict[str, WorkerObservation]:
    return {o.worker: o for o in observations}


def check_plan(p: Plan, observations: list[WorkerObservation], settings: CoordinatorSpec, history: History) -> None:
    """Every property a plan keeps, whatever the epoch."""
    workers = by_name(observations)
    sources, targets = {m.source for m in p.moves}, {m.target for m in p.moves}
    assert not sources & targets, "a worker yields and receives in one epoch"
    assert all(workers[w].alive for w in sources | targets), "a dead worker takes part"
    assert all(m.group in workers[m.source].group_bytes for m in p.moves), "a move of a group its source lacks"
    assert len({m.group for m in p.moves}) == len(p.moves), "a group moved twice"
    reasons = {m.reason for m in p.moves}
    assert len(reasons) <= 1, f"two adaptations at once: {reasons}"
    if history.in_flight:
        assert p.moves == () and p.scale is None, "an adaptation started beside one under way"
    if p.scale is not None:
        assert history.last_scale_ms is None or NOW - history.last_scale_ms >= settings.scale_cooldown_ms
        want_role = "standby" if p.scale.action == "scale-out" else "active"
        assert workers[p.scale.worker].alive and workers[p.scale.worker].role == want_role
    if p.scale is not None and p.scale.action == "scale-in":
        assert reasons <= {"scale-in"} and sources <= {p.scale.worker}
        assert {m.group for m in p.moves} == set(workers[p.scale.worker].group_bytes), "a drain left a group"
        assert not any(c == "supplier" for c in p.load_class.values())
    if "load" in reasons:
        check_load_moves(p, settings)
    if "memory" in reasons:
        assert p.scale is None
        assert history.last_memory_ms is None or NOW - history.last_memory_ms >= settings.memory_balance_interval_ms
    if p.adaptation in (None, "memory"):
        check_memory(p, observations, settings, history)


def check_load_moves(p: Plan, settings: CoordinatorSpec) -> None:
    sources = [m.source for m in p.moves]
    targets = [m.target for m in p.moves]
    assert len(set(sources)) == len(sources), "a supplier yielded two groups"
    assert len(set(targets)) == len(targets), "a consumer received two groups"
    assert all(p.load_class[s] == "supplier" for s in sources), "a group left a non-supplier"
    new = p.scale.worker if p.scale is not None else None
    assert all(t == new or p.load_class[t] == "consumer" for t in targets), "a group went to a non-consumer"
    if p.scale is not None:
        suppliers = sum(c == "supplier" for c in p.load_class.values())
        consumers = sum(c == "consumer" for c in p.load_class.values())
        assert suppliers > settings.scale_lambda * consumers


def check_memory(p: Plan, observations: list[WorkerObservation], settings: CoordinatorSpec, history: History) -> None:
    """Memory balancing fires exactly when M_least / M_most < theta (when nothing else acts, none
    is under way, its interval has passed and a group can narrow the gap), moving about half the gap."""
    live = sorted((o for o in observations if o.alive and o.role == "active"), key=lambda o: (o.state_bytes, o.worker))
    moved = sum(m.state_bytes for m in p.moves)
    if len(live) < 2 or live[-1].state_bytes == 0:
        assert p.moves == ()
        return
    receiver, sender = live[0], live[-1]
    gap = sender.state_bytes - receiver.state_bytes
    due = history.last_memory_ms is None or NOW - history.last_memory_ms >= settings.memory_balance_interval_ms
    below = receiver.state_bytes / sender.state_bytes < settings.memory_balance_theta
    narrowing = any(0 < b < gap for b in sender.group_bytes.values())
    assert bool(p.moves) == (below and due and narrowing and not history.in_flight)
    if p.moves:
        assert {(m.source, m.target) for m in p.moves} == {(sender.worker, receiver.worker)}
        assert abs(gap - 2 * moved) < gap, "the gap did not narrow"
        short = gap / 2 - moved
        left = [b for g, b in sender.group_bytes.items() if b > 0 and g not in {m.group for m in p.moves}]
        assert short <= 0 or all(b >= 2 * short for b in left), "a group that would get closer to half the gap stayed"


@hsettings(max_examples=400, deadline=None)
@given(epochs())
def test_every_plan_keeps_the_rules(epoch: tuple[list[WorkerObservation], CoordinatorSpec, History, int]) -> None:
    observations, settings, history, seed = epoch
    check_plan(plan_epoch(observations, settings, NOW, history, random.Random(seed)), observations, settings, history)


@hsettings(max_examples=100, deadline=None)
@given(st.lists(epochs(), min_size=2, max_size=8), st.lists(st.integers(1_000, 60_000), min_size=8, max_size=8))
def test_cool_downs_hold_over_a_run_of_epochs(runs: list, gaps: list[int]) -> None:
    """Consecutive epochs (each one's migrations done before the next): scale changes are at
    least scale_cooldown_ms apart and memory balancings at least memory_balance_interval_ms."""
    settings = CoordinatorSpec()
    history, now = History(), NOW
    scaled: list[int] = []
    balanced: list[int] = []
    for (observations, _, _, seed), gap in zip(runs, gaps):
        now += gap
        p = plan_epoch(observations, settings, now, history, random.Random(seed))
        scaled += [now] if p.scale is not None else []
        balanced += [now] if p.adaptation == "memory" else []
        history = replace(history.after(p), in_flight=False)
    assert all(b - a >= settings.scale_cooldown_ms for a, b in zip(scaled, scaled[1:]))
    assert all(b - a >= settings.memory_balance_interval_ms for a, b in zip(balanced, balanced[1:]))


# ------------------------------------------------------------------ the dry run
def beat(worker: str, wall_ms: int, backlog: int, group_bytes: dict[int, int]) -> control.Heartbeat:
    return control.Heartbeat(worker=worker, wall_ms=wall_ms, groups=sorted(group_bytes), backlog_bytes=backlog,
                             group_bytes=group_bytes)


def test_observations_come_from_the_epochs_heartbeats_and_the_placement() -> None:
    placement = {1: "a", 2: "a", 3: "b", 4: "gone"}
    beats = [beat("a", NOW - 30_000, 9 * MIB, {1: 5, 2: 6}),  # before the epoch: not a sample
             beat("a", NOW - 2_000, MIB, {1: 50, 2: 60}), beat("a", NOW - 1_000, 0, {1: 70}),
             beat("b", NOW - 500, 7, {3: 9}), beat("s", NOW - 100, 0, {}),
             beat("gone", NOW - 15_000, 0, {4: 1})]
    obs = {o.worker: o for o in observe(placement, beats, NOW, DEFAULTS)}
    assert obs["a"].backlog_samples == (MIB, 0) and dict(obs["a"].group_bytes) == {1: 70, 2: 0}
    assert obs["a"].role == "active" and obs["s"].role == "standby" and obs["s"].alive
    assert not obs["gone"].alive and obs["gone"].role == "active"


def test_an_old_workers_heartbeat_still_decodes() -> None:
    old = b'{"type":"heartbeat","worker":"w0","wall_ms":5,"groups":[1],"lag":3,"state_bytes":10}'
    decoded = control.decode_control(old)
    assert isinstance(decoded, control.Heartbeat)
    assert decoded.backlog_bytes == 0 and decoded.group_bytes == {}


def test_dry_run_reports_workers_and_the_plan_with_reasons() -> None:
    job = load(None, job="dry", partitions=4, streams=[
        {"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
         "window": {"range_ms": 1000}} for n in "rs"])
    placement = {0: "a", 1: "a", 2: "a", 3: "b"}
    beats = [beat("a", NOW - 100, 2 * MIB, {0: 10, 1: 20, 2: 30}), beat("b", NOW - 100, 0, {3: 5}),
             beat("c", NOW - 100, 0, {})]
    report = dry_run(job, placement, beats, NOW, random.Random(1))
    assert report["applied"] is False and "migration protocol" in report["note"]
    rows = {r["worker"]: r for r in report["workers"]}
    assert rows["a"]["class"] == "supplier" and rows["a"]["occupancy"] == 2.0 and rows["a"]["state_bytes"] == 60
    assert rows["b"]["class"] == "consumer" and rows["c"]["class"] == "standby" and rows["c"]["role"] == "standby"
    (move,) = report["plan"]["moves"]
    assert (move["from"], move["to"], move["reason"]) == ("a", "b", "load") and move["group"] in (0, 1, 2)
    assert "seed 000" in move["why"] and report["plan"]["adaptation"] == "load"


def test_the_hash_workers_heartbeat_carries_its_backlog_and_group_bytes(tmp_path: Path, monkeypatch) -> None:
    """What the worker knows cheaply: fetched-but-unjoined bytes, the consumer lag priced at the
    mean record size, and the window bytes of each owned group."""
    job = load("streamjoin/jobs/seed000.yaml", bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    w = Worker(job, kafka.Cluster("127.0.0.1:1"), "w0", metrics_port=0)
    sent: list[bytes] = []
    monkeypatch.setattr(w, "control_out", type("Out", (), {
        "produce": lambda self, topic, value, key, partition: sent.append(value), "poll": lambda self, t: 0})())
    monkeypatch.setattr(w, "_records_behind", lambda: 3)  # the consumer's lag, without a broker
    w.groups = {4, 9}
    w.record_size.records, w.record_size.bytes = 2, 100  # 50 bytes a record so far
    pending = RecordBuffer()
    pending.values, pending.offsets = [b"x" * 7], [0]  # one fetched record of 7 bytes
    w.pending = {0: pending}
    w._heartbeat()
    beat = control.decode_control(sent[-1])
    assert isinstance(beat, control.Heartbeat)
    assert beat.lag == 4 and beat.backlog_bytes == 7 + 3 * 50
    assert beat.group_bytes == {4: 0, 9: 0}  # owned, not read yet
    w.store.store.close()


def test_the_dry_run_reads_the_placement_and_an_epoch_of_heartbeats(monkeypatch) -> None:
    """read_dry_run's wiring: the stored placement, heartbeats of max(epoch, heartbeat timeout)."""
    from streamjoin.services.coordinator import rebalance

    job = load("streamjoin/jobs/seed000.yaml", coordinator={"reorg_epoch_ms": 5_000, "heartbeat_timeout_ms": 8_000})
    asked: list[float] = []

    def heartbeats_since(job: object, cluster: object, window_s: float) -> list[control.Heartbeat]:
        asked.append(window_s)
        return [beat("a", 0, 0, {0: 1, 1: 2})]

    monkeypatch.setattr(rebalance.placing, "load", lambda job, cluster: ({0: "a", 1: "a"}, 1))
    monkeypatch.setattr(rebalance, "heartbeats_since", heartbeats_since)
    report = rebalance.read_dry_run(job, kafka.Cluster("127.0.0.1:1"), random.Random(0))
    assert asked == [8.0]
    assert [(r["worker"], r["alive"], r["groups"]) for r in report["workers"]] == [("a", False, 2)]  # beat from 1970
