"""The adaptive placement policy, pure (no Kafka, no clock): what the coordinator would do at
the end of one reorganisation epoch, and why.

Two papers, one decision per epoch:

- Seed 000 (sections IV-C and V-A): load balancing and the degree of declustering. A worker's
  load is its average buffer occupancy over the epoch; it is a supplier above
  `supplier_occupancy`, a consumer below `consumer_occupancy`, neutral between. Each supplier
  yields one group to a consumer. With no supplier the degree shrinks (an active worker is
  drained to standby); with more than `scale_lambda` x consumers suppliers it grows (a standby
  is activated).
- Seed 003 (sections 5.1, 5.2 and 6): memory balancing. When M_least / M_most <
  `memory_balance_theta`, about (M_most - M_least) / 2 of window state moves from the fullest
  to the emptiest worker, at most once per `memory_balance_interval_ms`, and never beside
  another adaptation (section 6, restriction 1: one adaptation at a time).

Seed 000's step comes first: backlog is the throughput signal, and it runs every epoch. Memory
balancing takes an epoch in which seed 000 decides nothing. No adaptation starts while one is
under way (`History.in_flight`). Call `plan_epoch` once per reorganisation epoch
(`coordinator.reorg_epoch_ms`): "one group per supplier" is per call.

Only alive workers take part: a dead worker is neither a source nor a target (its groups are
failover's business). Active workers hold groups; standbys heartbeat and hold nothing, and are
the reserve a scale-out draws on (the Helm chart's replica count is the maximum).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from streamjoin.settings import CoordinatorSpec

Role = Literal["active", "standby"]
LoadClass = Literal["supplier", "consumer", "neutral"]
MoveReason = Literal["load", "scale-in", "memory"]
SEED000_LOAD = "seed 000 IV-C"
SEED000_DEGREE = "seed 000 V-A"
SEED003_MEMORY = "seed 003 5.1"


@dataclass(frozen=True)
class WorkerObservation:
    """What the coordinator saw of one worker during the epoch.

    worker: its id. alive: it heartbeated within `coordinator.heartbeat_timeout_ms`.
    role: active (holds groups) or standby (heartbeats, holds nothing).
    backlog_samples: the backlog bytes its heartbeats reported during the epoch (seed 000 IV-C
    samples the buffer at the end of each distribution epoch and averages the samples).
    group_bytes: window state bytes of each group it holds."""

    worker: str
    alive: bool
    role: Role
    backlog_samples: tuple[int, ...] = ()
    group_bytes: Mapping[int, int] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        return sum(self.group_bytes.values())


@dataclass(frozen=True)
class History:
    """When the previous adaptations started (ms on the caller's clock; None: never) and whether
    one is still under way (a migration in flight)."""

    last_scale_ms: int | None = None
    last_memory_ms: int | None = None
    in_flight: bool = False

    def after(self, plan: "Plan") -> "History":
        """This history once `plan` has started (its migrations are then in flight)."""
        return replace(
            self,
            last_scale_ms=plan.now_ms if plan.scale is not None else self.last_scale_ms,
            last_memory_ms=plan.now_ms if plan.adaptation == "memory" else self.last_memory_ms,
            in_flight=self.in_flight or bool(plan.moves),
        )


@dataclass(frozen=True)
class Move:
    """Group `group` (`state_bytes` of window) goes from worker `source` to worker `target`."""

    group: int
    source: str
    target: str
    reason: MoveReason
    state_bytes: int
    why: str


@dataclass(frozen=True)
class ScaleChange:
    """scale-out: standby `worker` becomes active; scale-in: active `worker` is drained to standby."""

    action: Literal["scale-out", "scale-in"]
    worker: str
    why: str


@dataclass(frozen=True)
class Plan:
    """One epoch's decision. occupancy/load_class: per alive active worker (occupancy None when
    it reported no backlog sample in the epoch); notes: what was considered and not done, and why."""

    now_ms: int
    occupancy: dict[str, float | None]
    load_class: dict[str, LoadClass]
    moves: tuple[Move, ...] = ()
    scale: ScaleChange | None = None
    notes: tuple[str, ...] = ()

    @property
    def adaptation(self) -> Literal["load", "scale-in", "memory"] | None:
        """The one adaptation this plan starts: seed 000's reorganisation (moves and a
        scale-out), a scale-in (a drain), seed 003's memory balancing, or none."""
        if self.scale is not None and self.scale.action == "scale-in":
            return "scale-in"
        if self.moves:
            return "memory" if self.moves[0].reason == "memory" else "load"
        return "load" if self.scale is not None else None


# ------------------------------------------------------------------ load signal
def occupancy(backlog_samples: Sequence[int], buffer_bytes: int) -> float | None:
    """Seed 000 IV-C: the average of the buffer sizes sampled over the epoch divided by the
    buffer's capacity (`coordinator.buffer_bytes`); None with no sample. It may exceed 1: Kafka
    holds what a bounded buffer would have refused."""
    if not backlog_samples:
        return None
    return sum(backlog_samples) / len(backlog_samples) / buffer_bytes


def classify(occ: float | None, settings: CoordinatorSpec) -> LoadClass:
    """Seed 000 IV-C: supplier above theta_s, consumer below theta_c, neutral otherwise. A
    worker with no sample is neutral: nothing says it is overloaded or idle."""
    if occ is None:
        return "neutral"
    if occ > settings.supplier_occupancy:
        return "supplier"
    if occ < settings.consumer_occupancy:
        return "consumer"
    return "neutral"


def _cooling(last_ms: int | None, now_ms: int, cooldown_ms: int) -> int:
    """Milliseconds left of a cool-down that started at `last_ms` (0: over, or never started)."""
    return 0 if last_ms is None else max(0, last_ms + cooldown_ms - now_ms)


# ------------------------------------------------------------------ the epoch
def plan_epoch(observations: Sequence[WorkerObservation], settings: CoordinatorSpec, now_ms: int,
               history: History, rng: random.Random) -> Plan:
    """The adaptation to start at the end of this reorganisation epoch.

    observations: every known worker, dead ones included; settings: the job's coordinator
    section; now_ms: the epoch's end on the caller's clock (cool-downs are measured on it);
    history: the previous adaptations; rng: the only source of randomness (which group a
    supplier yields), injected so a plan can be replayed."""
    active = sorted((o for o in observations if o.alive and o.role == "active"), key=lambda o: o.worker)
    occ = {o.worker: occupancy(o.backlog_samples, settings.buffer_bytes) for o in active}
    classes = {w: classify(x, settings) for w, x in occ.items()}
    base = Plan(now_ms, occ, classes)
    if history.in_flight:
        return replace(base, notes=("an adaptation is still under way: no other starts beside it "
                                    "(seed 003 section 6)",))
    standbys = sorted(o.worker for o in observations if o.alive and o.role == "standby")
    load = _plan_load(base, active, standbys, settings, history, rng)
    if load.adaptation is not None:
        return load
    return _plan_memory(load, active, settings, history)


def _plan_load(plan: Plan, active: list[WorkerObservation], standbys: list[str], settings: CoordinatorSpec,
               history: History, rng: random.Random) -> Plan:
    """Seed 000: the degree of declustering (V-A), then one group from each supplier (IV-C)."""
    suppliers = [w for w in plan.load_class if plan.load_class[w] == "supplier"]
    consumers = [w for w in plan.load_class if plan.load_class[w] == "consumer"]
    if not active:
        return replace(plan, notes=("no alive active worker: nothing to balance",))
    if not suppliers:
        return _scale_in(plan, active, settings, history)
    takers = sorted(consumers, key=lambda w: (plan.occupancy[w] or 0.0, w))
    scale: ScaleChange | None = None
    notes: list[str] = []
    if len(suppliers) > settings.scale_lambda * len(consumers):
        scale, note = _scale_out(plan, standbys, len(suppliers), len(consumers), settings, history)
        notes += [note] if note else []
        if scale is not None:
            takers = [scale.worker, *takers]  # it holds nothing: the emptiest consumer, served first
    moves, skipped = _load_moves(plan, {o.worker: o for o in active}, suppliers, takers, settings, rng)
    return replace(plan, moves=tuple(moves), scale=scale, notes=tuple(notes + skipped))


def _scale_in(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec, history: History) -> Plan:
    """Seed 000 V-A: no supplier, so the degree shrinks by one: drain the active worker with
    the least state (the cheapest to move) onto the others."""
    if len(active) < 2:
        return replace(plan, notes=(f"no supplier, but {active[0].worker} is the only active worker: it stays",))
    left = _cooling(history.last_scale_ms, plan.now_ms, settings.scale_cooldown_ms)
    if left:
        return replace(plan, notes=(f"no supplier: scale in waits {left / 1000:.1f} s more for "
                                    f"coordinator.scale_cooldown_ms ({SEED000_DEGREE})",))
    victim = min(active, key=lambda o: (o.state_bytes, plan.occupancy[o.worker] or 0.0, o.worker))
    why = (f"no worker is a supplier (occupancy > {settings.supplier_occupancy}): the degree of declustering "
           f"shrinks by one; {victim.worker} holds the least state ({victim.state_bytes} bytes) and is drained to "
           f"standby ({SEED000_DEGREE})")
    moves = _drain(victim, [o for o in active if o is not victim])
    return replace(plan, moves=tuple(moves), scale=ScaleChange("scale-in", victim.worker, why))


def _drain(victim: WorkerObservation, others: list[WorkerObservation]) -> list[Move]:
    """Every group of `victim`, largest first, each to the remaining worker holding the least
    state once the earlier moves are counted (longest-processing-time first)."""
    held = {o.worker: o.state_bytes for o in others}
    moves = []
    for group, size in sorted(victim.group_bytes.items(), key=lambda gs: (-gs[1], gs[0])):
        target = min(held, key=lambda w: (held[w], w))
        held[target] += size
        moves.append(Move(group, victim.worker, target, "scale-in", size,
                          f"{victim.worker} is drained (scale in); {target} holds the least state "
                          f"({held[target] - size} bytes before this group)"))
    return moves


def _scale_out(plan: Plan, standbys: list[str], suppliers: int, consumers: int, settings: CoordinatorSpec,
               history: History) -> tuple[ScaleChange | None, str]:
    """Seed 000 V-A: suppliers > lambda x consumers, so the degree grows by one standby. Returns
    the change, or None and the reason it is not made."""
    wanted = (f"{suppliers} supplier(s) > coordinator.scale_lambda {settings.scale_lambda} x {consumers} "
              "consumer(s)")
    if not standbys:
        return None, f"{wanted}, but no standby is left: the replica count is the maximum ({SEED000_DEGREE})"
    left = _cooling(history.last_scale_ms, plan.now_ms, settings.scale_cooldown_ms)
    if left:
        return None, f"{wanted}: scale out waits {left / 1000:.1f} s more for coordinator.scale_cooldown_ms"
    return ScaleChange("scale-out", standbys[0], f"{wanted}: {standbys[0]} becomes active ({SEED000_DEGREE})"), ""


def _load_moves(plan: Plan, active: Mapping[str, WorkerObservation], suppliers: list[str], takers: list[str],
                settings: CoordinatorSpec, rng: random.Random) -> tuple[list[Move], list[str]]:
    """Seed 000 IV-C: one scan pairs each supplier (most loaded first) with the next of `takers`
    (the consumers in the order they are served); each supplier yields one group, each consumer
    receives at most one. A supplier holding a single group keeps it: moving it would move the
    overload, not share it."""
    by_load = sorted(suppliers, key=lambda w: (-(plan.occupancy[w] or 0.0), w))
    free = iter(takers)
    moves: list[Move] = []
    notes: list[str] = []
    for supplier in by_load:
        groups = active[supplier].group_bytes
        if len(groups) < 2:
            notes.append(f"{supplier} is a supplier but holds {len(groups)} group(s): it keeps it")
            continue
        consumer = next(free, None)
        if consumer is None:
            notes.append(f"{supplier} is a supplier but no consumer is left to take a group ({SEED000_LOAD})")
            continue
        group = _yielded_group(groups, settings.yield_group, rng)
        moves.append(Move(group, supplier, consumer, "load", groups[group], _load_why(plan, supplier, consumer,
                                                                                   group, len(groups), settings)))
    return moves, notes


def _yielded_group(group_bytes: Mapping[int, int], how: str, rng: random.Random) -> int:
    """The group a supplier yields: random (seed 000 IV-C) or the one with the most state."""
    if how == "heaviest":
        return min(group_bytes, key=lambda g: (-group_bytes[g], g))
    return rng.choice(sorted(group_bytes))


def _load_why(plan: Plan, supplier: str, consumer: str, group: int, held: int, settings: CoordinatorSpec) -> str:
    consumer_occ = plan.occupancy.get(consumer)
    taker = (f"{consumer}, a consumer (occupancy {consumer_occ:.3f} < {settings.consumer_occupancy})"
             if consumer_occ is not None else f"{consumer}, the standby just activated")
    return (f"{supplier} is a supplier (occupancy {plan.occupancy[supplier]:.3f} > {settings.supplier_occupancy}): "
            f"it yields group {group} ({settings.yield_group} of its {held}) to {taker} ({SEED000_LOAD})")


# ------------------------------------------------------------------ memory
def _plan_memory(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec, history: History) -> Plan:
    """Seed 003 5.1: when M_least / M_most < theta_d, move (M_most - M_least) / 2 of state from
    the fullest worker (the sender) to the emptiest (the receiver); 5.2: at most once per
    `memory_balance_interval_ms`."""
    if len(active) < 2:
        return plan
    ordered = sorted(active, key=lambda o: (o.state_bytes, o.worker))
    receiver, sender = ordered[0], ordered[-1]
    most, least = sender.state_bytes, receiver.state_bytes
    if most == 0 or least / most >= settings.memory_balance_theta:
        return plan
    ratio = f"M_least / M_most = {least}/{most} = {least / most:.3f} < {settings.memory_balance_theta}"
    left = _cooling(history.last_memory_ms, plan.now_ms, settings.memory_balance_interval_ms)
    if left:
        return replace(plan, notes=plan.notes + (f"{ratio}: memory balancing waits {left / 1000:.1f} s more for "
                                                 "coordinator.memory_balance_interval_ms (seed 003 5.2)",))
    chosen = half_the_gap(sender.group_bytes, (most - least) / 2)
    if not chosen:
        return replace(plan, notes=plan.notes + (f"{ratio}, but every group of {sender.worker} is at least the gap "
                                                 "it would close: moving one would not narrow it",))
    why = (f"{ratio}: move about (M_most - M_least) / 2 = {(most - least) / 2:.0f} bytes from {sender.worker} "
           f"(fullest) to {receiver.worker} (emptiest) ({SEED003_MEMORY})")
    moves = tuple(Move(g, sender.worker, receiver.worker, "memory", sender.group_bytes[g], why) for g in chosen)
    return replace(plan, moves=moves)


def half_the_gap(group_bytes: Mapping[int, int], target: float) -> list[int]:
    """Groups whose bytes add up close to `target` (seed 003's half gap), at group granularity:
    largest first, each taken when it brings the total closer to the target (its size is below
    twice what is left). The total never exceeds twice the target, so the gap always narrows;
    a group left out is at least twice what remains."""
    chosen, remaining = [], target
    for group, size in sorted(group_bytes.items(), key=lambda gs: (-gs[1], gs[0])):
        if 0 < size < 2 * remaining:
            chosen.append(group)
            remaining -= size
    return chosen
