"""The adaptive placement policy (services/coordinator/adapt.py): the cluster join paper's load
balancing and degree of declustering, the spill paper's memory balancing and its disk adaptations, rule by rule
on hand-built epochs, then as Hypothesis properties over random ones; and the dry run that reports it
(services/coordinator/rebalance.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Message
from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.schemas import control
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.adapt import DEFAULT_PUSH_FRACTION, plan_epoch
from streamjoin.services.coordinator.epoch import DISK_RULE, LOAD_RULE, History, Plan, PushOrder, WorkerObservation
from streamjoin.services.coordinator.load_balance import classify, occupancy
from streamjoin.services.coordinator.memory_balance import half_the_gap, output_rates
from streamjoin.services.coordinator.rebalance import dry_run, grown, observe
from streamjoin.services.io.intake import RecordBuffer
from streamjoin.services.hash.main import Worker
from streamjoin.settings import CoordinatorSpec, load
from tests.profiles import examples

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


# ------------------------------------------------------------------ load signal (cluster join paper IV-C)
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


# ------------------------------------------------------------------ load balancing (cluster join paper IV-C)
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


# ------------------------------------------------------------------ degree of declustering (cluster join paper V-A)
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


# ------------------------------------------------------------------ memory balancing (spill paper 5.1-5.2)
def neutral_pair(full: dict[int, int], empty: dict[int, int]) -> list[WorkerObservation]:
    """Two neutral workers (one has a supplier's backlog, the other a consumer's would trigger
    load balancing), so only memory balancing can act."""
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


@hsettings(max_examples=examples(200), deadline=None)
@given(epochs())
def test_every_plan_keeps_the_rules(epoch: tuple[list[WorkerObservation], CoordinatorSpec, History, int]) -> None:
    observations, settings, history, seed = epoch
    check_plan(plan_epoch(observations, settings, NOW, history, random.Random(seed)), observations, settings, history)


@hsettings(max_examples=examples(50), deadline=None)
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


# ------------------------------------------------------------------ disk adaptation (spill paper 6)
COOLED = History(last_scale_ms=NOW)  # so a scale-in does not take the epoch


def spilling(name: str, groups: dict[int, int], memory: int | None = None, spilled: tuple[int, ...] = (),
             budget: int = 1000, on_disk: int = 0, results: int | None = None, pushed: bool = False,
             backlog: int = BUSY) -> WorkerObservation:
    """An alive active worker that reports spill; memory defaults to all its state."""
    return WorkerObservation(name, True, "active", (backlog,), groups,
                             memory_bytes=sum(groups.values()) if memory is None else memory, memory_budget=budget,
                             spilled_bytes=on_disk, spilled_groups=frozenset(spilled), results=results,
                             pushed=pushed)


def test_lazy_disk_never_moves_a_group_with_generations_on_disk() -> None:
    full = {1: 400, 2: 300, 3: 200, 4: 100}
    workers = [spilling("full", full, spilled=(1,)), spilling("empty", {9: 200})]
    lazy = plan(workers, COOLED)
    # half the gap is 400: group 1 would fit exactly, but it is on disk; 2 (300) then 4 (100) come closest
    assert lazy.adaptation == "memory" and [m.group for m in lazy.moves] == [2, 4]
    assert DISK_RULE in lazy.moves[0].why and "restriction 2" in lazy.moves[0].why
    assert [m.group for m in plan(workers, COOLED, disk_adaptation="local").moves] == [1]  # local's choice


def test_lazy_disk_says_so_when_only_spilled_groups_could_narrow_the_gap() -> None:
    # the gap is 850: group 2 (900) would widen it the other way, group 1 (50) would narrow it but is on disk
    p = plan([spilling("full", {1: 50, 2: 900}, spilled=(1,)), spilling("empty", {9: 100})], COOLED)
    assert p.moves == () and any("would not narrow" in n and "generations on disk" in n for n in p.notes)


def test_lazy_disk_balances_window_bytes_in_memory_local_all_state() -> None:
    # full holds 1000 bytes of window, 550 of them in memory: in memory the workers are balanced
    workers = [spilling("full", {1: 600, 2: 400}, memory=550), spilling("empty", {9: 500})]
    assert plan(workers, COOLED).moves == ()
    assert plan(workers, COOLED, disk_adaptation="local").adaptation == "memory"
    in_memory = [spilling("full", {1: 600, 2: 400}, memory=1000), spilling("empty", {9: 500}, memory=100)]
    assert "window bytes in memory" in plan(in_memory, COOLED).moves[0].why


def test_lazy_disk_moves_the_productive_groups_first() -> None:
    # half the gap is 400; largest first would move group 1 alone. P_s / P_o: 1: 400/4 = 100,
    # 2: 300/30 = 10, 3: 200/40 = 5, 4: 100 with no results (infinitely unproductive).
    full = {1: 400, 2: 300, 3: 200, 4: 100}
    produced = {1: 4, 2: 30, 3: 40}
    for mode in ("lazy-disk", "active-disk"):
        workers = [replace(spilling("full", full), group_results=produced), spilling("empty", {9: 200})]
        p = plan(workers, COOLED, disk_adaptation=mode)
        # 3 (200 < 2 x 400), then 2 (300 < 2 x 200 left); then 100 over: nothing else is below 2 x -100
        assert [m.group for m in p.moves] == [3, 2] and "productive groups first" in p.moves[0].why
    local = [replace(spilling("full", full), group_results=produced), spilling("empty", {9: 200})]
    assert [m.group for m in plan(local, COOLED, disk_adaptation="local").moves] == [1]


def test_policy_moves_of_seed_000_spare_spilled_groups_too() -> None:
    supplier = spilling("a", {1: 10, 2: 20, 3: 30}, spilled=(1, 2), backlog=HOT)
    for seed in range(5):
        (move,) = plan([supplier, spilling("b", {4: 10}, backlog=IDLE)], seed=seed).moves
        assert move.group == 3 and "stay" in move.why
    stuck = spilling("a", {1: 10, 2: 20}, spilled=(1, 2), backlog=HOT)
    p = plan([stuck, spilling("b", {4: 10}, backlog=IDLE)])
    assert p.moves == () and any("never moves" in n for n in p.notes)
    # no supplier: scale in drains the worker with least state among those holding no spilled group
    drain = plan([spilling("small", {1: 5}, spilled=(1,), backlog=IDLE), spilling("big", {2: 50}, backlog=IDLE)])
    assert drain.scale is not None and drain.scale.worker == "big" and drain.moves[0].group == 2
    assert plan([spilling("small", {1: 5}, spilled=(1,), backlog=IDLE), spilling("big", {2: 50}, backlog=IDLE)],
                disk_adaptation="local").scale.worker == "small"  # type: ignore[union-attr]


def test_no_memory_balancing_in_an_epoch_in_which_its_sender_or_receiver_pushed() -> None:
    for pusher in ("full", "empty"):
        workers = [spilling("full", {1: 600, 2: 400}, pushed=pusher == "full"),
                   spilling("empty", {9: 100}, pushed=pusher == "empty")]
        p = plan(workers, COOLED)
        assert p.moves == () and any(f"{pusher} pushed" in n and "restriction 1" in n for n in p.notes)
        assert plan(workers, COOLED, disk_adaptation="local").adaptation == "memory"  # local ignores spill
    bystander = [spilling("full", {1: 600, 2: 400}), spilling("empty", {9: 100}), spilling("mid", {7: 500},
                                                                                             pushed=True)]
    assert plan(bystander, COOLED).adaptation == "memory"  # only the two involved workers count


EPOCH_S = DEFAULTS.reorg_epoch_ms / 1000


def rated(fast: int, slow: int, budget: int = 800, memory: int = 1000, on_disk: int = 0) -> list[WorkerObservation]:
    """Two workers balanced in memory, two groups each; `fast` and `slow` results in the epoch."""
    return [spilling("fast", {1: memory // 2, 2: memory // 2}, budget=budget, results=fast, on_disk=on_disk),
            spilling("slow", {3: memory // 2, 4: memory // 2}, budget=budget, results=slow, on_disk=on_disk)]


def active_disk(observations: list[WorkerObservation], history: History = COOLED,
                push_fraction: float = DEFAULT_PUSH_FRACTION, **coordinator: object) -> Plan:
    return plan_epoch(observations, CoordinatorSpec(disk_adaptation="active-disk", **coordinator), NOW, history,
                      random.Random(0), push_fraction)


def test_output_rate_is_results_per_second_per_group() -> None:
    assert output_rates(rated(8000, 2000), DEFAULTS.reorg_epoch_ms) == {"fast": 8000 / EPOCH_S / 2,
                                                                          "slow": 2000 / EPOCH_S / 2}
    no_count = WorkerObservation("x", True, "active", (), {1: 1}, memory_bytes=1)
    assert output_rates([no_count], DEFAULTS.reorg_epoch_ms) == {}


def test_active_disk_orders_the_slowest_worker_to_push() -> None:
    p = active_disk(rated(8000, 2000))  # 200 vs 50 results/s per group: 4 > theta_f 2
    # M_q = 2000, M_c = 1600: min(0.3 x 1000, 400) = 300
    assert p.push == PushOrder("slow", 300, p.push.why) and p.adaptation == "disk" and p.moves == ()  # type: ignore
    why = p.push.why  # type: ignore[union-attr]
    assert DISK_RULE in why and "theta_f 2.0" in why and "M_q - M_c = 2000 - 1600" in why
    assert active_disk(rated(8000, 0)).push.worker == "slow"  # type: ignore[union-attr]  # Min_rate 0: diverged


def test_the_push_is_capped_by_what_the_cluster_lacks() -> None:
    # budgets 900: M_q - M_c = 2000 - 1800 = 200 < 0.3 x 1000
    assert active_disk(rated(8000, 2000, budget=900)).push.bytes == 200  # type: ignore[union-attr]
    # spilled bytes count in the query's need: M_q = 2000 + 2 x 500, M_c = 1800
    assert active_disk(rated(8000, 2000, budget=900, on_disk=500)).push.bytes == 300  # type: ignore[union-attr]
    assert active_disk(rated(8000, 2000), push_fraction=0.1).push.bytes == 100  # type: ignore[union-attr]


def test_no_push_when_the_cluster_memory_holds_the_query() -> None:
    for budget in (1000, 5000):  # M_q = M_c, M_q < M_c
        p = active_disk(rated(8000, 2000, budget=budget))
        assert p.push is None and any("M_q" in n and "holds the query" in n for n in p.notes)


def test_no_push_while_rates_are_within_theta_f() -> None:
    assert active_disk(rated(8000, 4000)).push is None  # exactly 2: not above
    assert active_disk(rated(8000, 3000)).push is not None
    assert active_disk(rated(8000, 3000), output_rate_theta=3.0).push is None
    assert active_disk(rated(0, 0)).push is None  # every rate 0: no signal


def test_no_push_beside_a_move_or_while_one_is_in_flight() -> None:
    assert active_disk(rated(8000, 2000), History(last_scale_ms=NOW, in_flight=True)).push is None
    unbalanced = [spilling("fast", {1: 600, 2: 400}, budget=100, results=8000),
                  spilling("slow", {3: 100}, budget=100, results=0)]
    p = active_disk(unbalanced)
    assert p.adaptation == "memory" and p.push is None
    waiting = active_disk(unbalanced, History(last_scale_ms=NOW, last_memory_ms=NOW - 1_000))
    assert waiting.moves == () and waiting.push is None  # balancing only waits: it acts soon
    load = active_disk([spilling("fast", {1: 500, 2: 500}, results=8000, backlog=HOT),
                        spilling("slow", {3: 500, 4: 500}, results=0, backlog=IDLE)])
    assert load.adaptation == "load" and load.push is None


def test_lazy_disk_and_local_order_no_push() -> None:
    for mode in ("lazy-disk", "local"):
        assert plan(rated(8000, 2000), COOLED, disk_adaptation=mode).push is None


def test_push_orders_wait_for_the_memory_balance_interval() -> None:
    first = active_disk(rated(8000, 2000))
    after = COOLED.after(first)
    assert after.last_push_ms == NOW and not after.in_flight  # a push is no migration
    again = active_disk(rated(8000, 2000), replace(after, last_push_ms=NOW - 44_999))
    assert again.push is None and any("waits" in n and "memory_balance_interval_ms" in n for n in again.notes)
    assert active_disk(rated(8000, 2000), replace(after, last_push_ms=NOW - 45_000)).push is not None


def test_local_keeps_todays_plan_whatever_the_spill_fields_say() -> None:
    plain = [active("full", BUSY, {1: 400, 2: 300, 3: 200, 4: 100}), active("empty", BUSY, {9: 200})]
    spilled = [replace(plain[0], memory_bytes=10, memory_budget=5, spilled_bytes=900,
                       spilled_groups=frozenset({1, 2}), results=9, pushed=True),
               replace(plain[1], memory_bytes=200, memory_budget=5, results=0)]
    assert plan(spilled, COOLED, disk_adaptation="local") == plan(plain, COOLED, disk_adaptation="local")


@st.composite
def disk_epochs(draw: st.DrawFn) -> tuple[list[WorkerObservation], CoordinatorSpec, History, int, float]:
    """`epochs` with spill reports: memory, budget, bytes and groups on disk, results, pushes."""
    observations, settings, history, seed = draw(epochs())
    spilled = []
    for o in observations:
        if not draw(st.booleans()) and o.group_bytes:
            spilled.append(o)  # an older worker: no spill report
            continue
        groups = sorted(o.group_bytes)
        spilled.append(replace(
            o, memory_bytes=draw(st.integers(0, max(o.state_bytes, 1))), memory_budget=draw(st.integers(1, 4 * MIB)),
            spilled_bytes=draw(st.integers(0, 4 * MIB)),
            spilled_groups=frozenset(draw(st.lists(st.sampled_from(groups), unique=True))) if groups else frozenset(),
            results=draw(st.sampled_from([None, 0, 1_000]) | st.integers(0, 100_000)), pushed=draw(st.booleans())))
    settings = settings.model_copy(update={
        "disk_adaptation": draw(st.sampled_from(["local", "lazy-disk", "active-disk"])),
        "output_rate_theta": draw(st.sampled_from([1.5, 2.0, 10.0]))})
    history = replace(history, last_push_ms=draw(st.none() | st.integers(NOW - 90_000, NOW)))
    return spilled, settings, history, seed, draw(st.sampled_from([DEFAULT_PUSH_FRACTION, 0.1, 1.0]))


@st.composite
def rate_epochs(draw: st.DrawFn) -> tuple[list[WorkerObservation], CoordinatorSpec, History, int, float]:
    """Epochs where load balancing has nothing to do (neutral backlogs, scaling cooling down), so memory
    balancing and active-disk's output rates decide: many of them push."""
    groups = iter(range(1000))
    observations = []
    for name in NAMES[:draw(st.integers(2, 5))]:
        held = {next(groups): draw(st.integers(0, MIB)) for _ in range(draw(st.integers(1, 4)))}
        observations.append(spilling(
            name, held, memory=draw(st.just(MIB // 2) | st.integers(0, MIB)),  # often balanced in memory
            spilled=tuple(draw(st.lists(st.sampled_from(sorted(held))))), budget=draw(st.integers(1, MIB)),
            on_disk=draw(st.integers(0, MIB)), results=draw(st.none() | st.integers(0, 50_000)),
            pushed=draw(st.booleans()) and draw(st.booleans())))
    settings = CoordinatorSpec(disk_adaptation=draw(st.sampled_from(["lazy-disk", "active-disk"])),
                               memory_balance_theta=draw(st.sampled_from([0.0, 0.5, 0.8])),
                               output_rate_theta=draw(st.sampled_from([1.5, 2.0, 10.0])))
    last = st.none() | st.integers(NOW - 90_000, NOW)
    history = History(NOW, draw(last), draw(st.booleans()) and draw(st.booleans()), draw(last))
    return observations, settings, history, draw(st.integers(0, 2**32)), draw(st.sampled_from([0.1, 0.3, 1.0]))


def strip_spill(o: WorkerObservation) -> WorkerObservation:
    return WorkerObservation(o.worker, o.alive, o.role, o.backlog_samples, o.group_bytes)


@hsettings(max_examples=examples(200), deadline=None)
@given(disk_epochs() | rate_epochs())
def test_disk_adaptation_keeps_its_restrictions(epoch: tuple) -> None:
    """Under lazy-disk and active-disk no policy move takes a group with generations on disk; a
    plan never both moves and pushes; only active-disk pushes, outside an in-flight adaptation
    and its cool-down, at most push_fraction x the worker's memory and M_q - M_c; under local
    the spill reports change nothing."""
    observations, settings, history, seed, fraction = epoch
    p = plan_epoch(observations, settings, NOW, history, random.Random(seed), fraction)
    workers = by_name(observations)
    if settings.disk_adaptation != "local":
        assert not any(m.group in workers[m.source].spilled_groups for m in p.moves), "a spilled group moved"
    else:
        bare = [strip_spill(o) for o in observations]
        assert p == plan_epoch(bare, settings, NOW, history, random.Random(seed), fraction)
    assert not (p.moves and p.push), "moves and a push in one epoch"
    if p.push is not None:
        assert settings.disk_adaptation == "active-disk" and not history.in_flight and p.scale is None
        assert history.last_push_ms is None or NOW - history.last_push_ms >= settings.memory_balance_interval_ms
        pusher = workers[p.push.worker]
        reporting = [o for o in observations if o.alive and o.role == "active" and o.memory_bytes is not None]
        lack = sum(o.memory + o.spilled_bytes for o in reporting) - sum(o.memory_budget for o in reporting)
        assert pusher.alive and pusher.role == "active" and pusher in reporting
        assert 0 < p.push.bytes <= min(fraction * pusher.memory, lack)
        rates = output_rates(reporting, settings.reorg_epoch_ms)
        assert rates[pusher.worker] == min(rates.values())


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
    assert LOAD_RULE in move["why"] and report["plan"]["adaptation"] == "load"


def test_the_hash_workers_heartbeat_carries_its_backlog_and_group_bytes(tmp_path: Path, monkeypatch) -> None:
    """What the worker knows cheaply: fetched-but-unjoined bytes, the consumer lag priced at the
    mean record size, and the window bytes of each owned group."""
    job = load("streamjoin/jobs/equijoin.yaml", bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    w = Worker(job, kafka.Cluster("127.0.0.1:1"), "w0", metrics_port=0)
    sent: list[bytes] = []
    monkeypatch.setattr(w, "control_out", type("Out", (), {
        "produce": lambda self, topic, value, key, partition: sent.append(value), "poll": lambda self, t: 0})())
    monkeypatch.setattr(w, "_records_behind", lambda: 3)  # the consumer's lag, without a broker
    w.groups = {4, 9}
    w.record_size.records, w.record_size.bytes = 2, 100  # 50 bytes a record so far
    pending = RecordBuffer()
    pending.add(Message(topic=job.topic_of(job.streams[0]), partition=4, offset=0, value=b"x" * 7), 4)  # 7 bytes fetched
    w.pending = {0: pending}
    w.store.observe(9, 1_000, inserted=5, results=12)  # P_o of an owned group; 4 has no statistics yet
    w.store.observe(11, 1_000, inserted=5, results=99)  # not owned: not reported
    w._heartbeat()
    beat = control.decode_control(sent[-1])
    assert isinstance(beat, control.Heartbeat)
    assert beat.lag == 4 and beat.backlog_bytes == 7 + 3 * 50
    assert beat.group_bytes == {4: 0, 9: 0}  # owned, not read yet
    assert beat.group_results == {9: 12}
    w.store.rocksdb.close()


def test_the_dry_run_reads_the_placement_and_an_epoch_of_heartbeats(monkeypatch) -> None:
    """read_dry_run's wiring: the stored placement, heartbeats of max(epoch, heartbeat timeout)."""
    from streamjoin.services.coordinator import rebalance

    job = load("streamjoin/jobs/equijoin.yaml", coordinator={"reorg_epoch_ms": 5_000, "heartbeat_timeout_ms": 8_000})
    asked: list[float] = []

    def heartbeats_since(job: object, cluster: object, window_s: float) -> list[control.Heartbeat]:
        asked.append(window_s)
        return [beat("a", 0, 0, {0: 1, 1: 2})]

    monkeypatch.setattr(rebalance.placing, "load", lambda job, cluster: ({0: "a", 1: "a"}, 1))
    monkeypatch.setattr(rebalance, "heartbeats_since", heartbeats_since)
    report = rebalance.read_dry_run(job, kafka.Cluster("127.0.0.1:1"), random.Random(0))
    assert asked == [8.0]
    assert [(r["worker"], r["alive"], r["groups"]) for r in report["workers"]] == [("a", False, 2)]  # beat from 1970


def spill_beat(worker: str, wall_ms: int, results: int, pushes: int, **fields: object) -> control.Heartbeat:
    return control.Heartbeat(worker=worker, wall_ms=wall_ms, groups=[1], group_bytes={1: 100}, memory_budget=1000,
                             results_total=results, pushes=pushes, **fields)  # type: ignore[arg-type]


def test_results_and_pushes_are_what_the_counters_grew_by_in_the_epoch() -> None:
    assert grown([10, 15, 40]) == 30
    assert grown([10, 15, 3, 7]) == 5 + 3 + 4  # restarted after 15: it counted 3 from 0, then 4 more
    assert grown([5]) == 0 and grown([]) == 0
    beats = [spill_beat("a", NOW - 30_000, 0, 0),  # before the epoch
             spill_beat("a", NOW - 9_000, 100, 2), spill_beat("a", NOW - 5_000, 20, 0),  # restarted
             spill_beat("a", NOW - 1_000, 50, 1, memory_bytes=70, spilled_bytes=30, spilled_groups=[1],
                        group_results={1: 44, 7: 3}),  # 7 is not a's in the placement: dropped
             spill_beat("b", NOW - 1_000, 500, 4)]
    obs = {o.worker: o for o in observe({1: "a", 2: "b"}, beats, NOW, DEFAULTS)}
    a, b = obs["a"], obs["b"]
    assert a.results == 50 and a.pushed and a.memory_bytes == 70 and a.memory_budget == 1000
    assert a.spilled_bytes == 30 and a.spilled_groups == frozenset({1}) and a.group_results == {1: 44}
    assert b.results is None and not b.pushed  # one heartbeat in the epoch: no growth to see
    steady = [spill_beat("c", NOW - 5_000, 9, 3), spill_beat("c", NOW - 1_000, 19, 3)]
    (c,) = observe({3: "c"}, steady, NOW, DEFAULTS)
    assert c.results == 10 and not c.pushed


def test_an_old_workers_heartbeat_gives_no_memory_and_no_rate() -> None:
    beats = [beat("a", NOW - 2_000, 0, {1: 50}), beat("a", NOW - 1_000, 0, {1: 70})]  # no memory budget
    (a,) = observe({1: "a"}, beats, NOW, DEFAULTS)
    assert a.memory_bytes is None and a.memory == 70 and a.results is None


def test_dry_run_shows_a_push_order() -> None:
    job = load(None, job="dry", partitions=4, coordinator={"disk_adaptation": "active-disk"},
               worker={"spill": {"push_fraction": 0.5}}, streams=[
                   {"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                    "window": {"range_ms": 1000}} for n in "rs"])
    placement = {0: "fast", 1: "fast", 2: "slow", 3: "slow"}
    beats = []  # both suppliers, no consumer and no standby: load balancing can do nothing, memory is balanced
    for worker, groups, rate in (("fast", {0: 500, 1: 500}, 8000), ("slow", {2: 500, 3: 500}, 1000)):
        for i, t in enumerate((NOW - 10_000, NOW - 100)):
            beats.append(control.Heartbeat(worker=worker, wall_ms=t, groups=sorted(groups), group_bytes=groups,
                                           backlog_bytes=HOT, memory_bytes=1000, memory_budget=600,
                                           results_total=i * rate))
    report = dry_run(job, placement, beats, NOW, random.Random(0))
    rows = {r["worker"]: r for r in report["workers"]}
    assert rows["slow"]["results_in_epoch"] == 1000 and rows["slow"]["memory_budget"] == 600
    assert rows["fast"]["memory_bytes"] == 1000 and rows["fast"]["pushed_in_epoch"] is False
    push = report["plan"]["push"]
    # M_q - M_c = 2000 - 1200 = 800; 0.5 x 1000 = 500
    assert report["plan"]["adaptation"] == "disk" and (push["worker"], push["bytes"]) == ("slow", 500)
    assert DISK_RULE in push["why"] and report["plan"]["moves"] == []


def test_the_coordinator_sends_a_push_order_on_the_control_topic(monkeypatch) -> None:
    """main.py carries out a push order: control.PushGroups to the worker, counted, and its time
    kept in the history for the next order's cool-down; no migration starts."""
    from streamjoin.services import metrics
    from streamjoin.services.coordinator.main import Coordinator
    from streamjoin.services.coordinator.moves import Moves

    job = load(None, job="push", bootstrap="127.0.0.1:1", partitions=2, streams=[
        {"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
         "window": {"range_ms": 1000}} for n in "rs"])
    coordinator = Coordinator(job, kafka.Cluster.of(job))
    coordinator.moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    sent: list[tuple[str, bytes, bytes]] = []
    monkeypatch.setattr(coordinator, "out", type("Out", (), {
        "produce": lambda self, topic, value, key, partition: sent.append((topic, key, value)),
        "poll": lambda self, t: 0})())
    before = metrics.PUSH_ORDERS._value.get()
    coordinator._start_plan(Plan(NOW, {}, {}, push=PushOrder("b", 300, "slowest (spill paper, section 6)")))
    ((topic, key, value),) = sent
    assert topic == job.control_topic and key == b"push-groups"
    assert control.decode_control(value) == control.PushGroups(worker="b", bytes=300, why="slowest (spill paper, section 6)")
    assert metrics.PUSH_ORDERS._value.get() == before + 1
    assert coordinator.history.last_push_ms == NOW and not coordinator.history.in_flight
    assert not coordinator.moves.moving
