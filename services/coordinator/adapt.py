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
- Seed 003 section 6 (`disk_adaptation`), how balancing lives with the workers' spill. local:
  each worker spills on its own and the policy ignores spill (memory = all window state).
  lazy-disk: memory = window bytes in memory; no policy move takes a group with generations on
  disk (restriction 2), balancing does not start in an epoch in which its sender or receiver
  pushed (restriction 1), and it moves the sender's productive groups (smallest P_s / P_o)
  first, so what spill later pushes on either side is the less productive state.
  active-disk: lazy-disk, and once memory needs no move, a
  worker whose output rate per group lags (Max_rate / Min_rate > `output_rate_theta`) is told
  to push its least productive groups, at most M_q - M_c bytes.

Seed 000's step comes first: backlog is the throughput signal, and it runs every epoch. Memory
balancing takes an epoch in which seed 000 decides nothing; an active-disk push one in which
neither moves anything. No adaptation starts while one is under way (`History.in_flight`).
Call `plan_epoch` once per reorganisation epoch (`coordinator.reorg_epoch_ms`): "one group per
supplier" is per call.

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
from streamjoin.settings.job import SpillSpec
from streamjoin.state.spill import unproductivity

Role = Literal["active", "standby"]
LoadClass = Literal["supplier", "consumer", "neutral"]
MoveReason = Literal["load", "scale-in", "memory"]
SEED000_LOAD = "seed 000 IV-C"
SEED000_DEGREE = "seed 000 V-A"
SEED003_MEMORY = "seed 003 5.1"
SEED003_DISK = "seed 003 6"
# worker.spill.push_fraction's default, for callers that plan without a job's worker section.
DEFAULT_PUSH_FRACTION: float = SpillSpec.model_fields["push_fraction"].default


@dataclass(frozen=True)
class WorkerObservation:
    """What the coordinator saw of one worker during the epoch.

    worker: its id. alive: it heartbeated within `coordinator.heartbeat_timeout_ms`.
    role: active (holds groups) or standby (heartbeats, holds nothing).
    backlog_samples: the backlog bytes its heartbeats reported during the epoch (seed 000 IV-C
    samples the buffer at the end of each distribution epoch and averages the samples).
    group_bytes: window state bytes of each group it holds.
    The spill fields come from its newest heartbeat (seed 003 6): memory_bytes: window bytes in
    memory (None: the worker does not report spill, see `memory`); memory_budget:
    worker.memory_bytes; spilled_bytes: window bytes on disk only; spilled_groups: groups with
    generations on disk; results: results it produced during the epoch (None: fewer than two of
    its heartbeats in the epoch, or no spill report); pushed: it pushed state to disk during the
    epoch; group_results: results each group produced since the worker took it (P_o; a group
    absent has no statistics yet)."""

    worker: str
    alive: bool
    role: Role
    backlog_samples: tuple[int, ...] = ()
    group_bytes: Mapping[int, int] = field(default_factory=dict)
    memory_bytes: int | None = None
    memory_budget: int = 0
    spilled_bytes: int = 0
    spilled_groups: frozenset[int] = frozenset()
    results: int | None = None
    pushed: bool = False
    group_results: Mapping[int, int] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        return sum(self.group_bytes.values())

    @property
    def memory(self) -> int:
        """Window bytes in memory (seed 003 6's M_u). A worker that does not report spill keeps
        its whole window in memory, so then it is all its state."""
        return self.state_bytes if self.memory_bytes is None else self.memory_bytes


@dataclass(frozen=True)
class History:
    """When the previous adaptations started (ms on the caller's clock; None: never), whether
    one is still under way (a migration in flight), and when the coordinator last ordered a
    push (active-disk)."""

    last_scale_ms: int | None = None
    last_memory_ms: int | None = None
    in_flight: bool = False
    last_push_ms: int | None = None

    def after(self, plan: "Plan") -> "History":
        """This history once `plan` has started (its migrations are then in flight; a push order
        is the worker's own work, no migration)."""
        return replace(
            self,
            last_scale_ms=plan.now_ms if plan.scale is not None else self.last_scale_ms,
            last_memory_ms=plan.now_ms if plan.adaptation == "memory" else self.last_memory_ms,
            in_flight=self.in_flight or bool(plan.moves),
            last_push_ms=plan.now_ms if plan.push is not None else self.last_push_ms,
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
class PushOrder:
    """Active-disk (seed 003 6): worker `worker` pushes at least `bytes` of in-memory window
    state to disk, least productive groups first (control.PushGroups)."""

    worker: str
    bytes: int
    why: str


@dataclass(frozen=True)
class Plan:
    """One epoch's decision. occupancy/load_class: per alive active worker (occupancy None when
    it reported no backlog sample in the epoch); push: an active-disk push order (never beside
    moves); notes: what was considered and not done, and why."""

    now_ms: int
    occupancy: dict[str, float | None]
    load_class: dict[str, LoadClass]
    moves: tuple[Move, ...] = ()
    scale: ScaleChange | None = None
    push: PushOrder | None = None
    notes: tuple[str, ...] = ()

    @property
    def adaptation(self) -> Literal["load", "scale-in", "memory", "disk"] | None:
        """The one adaptation this plan starts: seed 000's reorganisation (moves and a
        scale-out), a scale-in (a drain), seed 003's memory balancing, an active-disk push
        order, or none."""
        if self.scale is not None and self.scale.action == "scale-in":
            return "scale-in"
        if self.moves:
            return "memory" if self.moves[0].reason == "memory" else "load"
        if self.push is not None:
            return "disk"
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


def pinned(o: WorkerObservation, settings: CoordinatorSpec) -> frozenset[int]:
    """The groups of `o` no policy move may take: under lazy-disk and active-disk those with
    generations on disk (seed 003 6, restriction 2: moving them would complicate their
    clean-up); none under local."""
    if settings.disk_adaptation == "local":
        return frozenset()
    return o.spilled_groups & frozenset(o.group_bytes)


def movable(o: WorkerObservation, settings: CoordinatorSpec) -> dict[int, int]:
    """The groups of `o` a policy move may take, with their state bytes."""
    kept = pinned(o, settings)
    return {g: b for g, b in o.group_bytes.items() if g not in kept}


def memory_signal(o: WorkerObservation, settings: CoordinatorSpec) -> int:
    """Seed 003's memory of a worker: all its window state under local (today's behaviour, spill
    ignored), its window bytes in memory under lazy-disk and active-disk (what spill frees)."""
    return o.state_bytes if settings.disk_adaptation == "local" else o.memory


# ------------------------------------------------------------------ the epoch
def plan_epoch(observations: Sequence[WorkerObservation], settings: CoordinatorSpec, now_ms: int,
               history: History, rng: random.Random, push_fraction: float = DEFAULT_PUSH_FRACTION) -> Plan:
    """The adaptation to start at the end of this reorganisation epoch.

    observations: every known worker, dead ones included; settings: the job's coordinator
    section; now_ms: the epoch's end on the caller's clock (cool-downs are measured on it);
    history: the previous adaptations; rng: the only source of randomness (which group a
    supplier yields), injected so a plan can be replayed; push_fraction: the job's
    worker.spill.push_fraction, the share of a worker's memory an active-disk push order asks
    for at most."""
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
    memory, settled = _plan_memory(load, active, settings, history)
    if memory.moves or not settled or settings.disk_adaptation != "active-disk":
        return memory
    return _plan_push(memory, active, settings, history, push_fraction)


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
    drainable = [o for o in active if not pinned(o, settings)]
    if not drainable:
        return replace(plan, notes=(f"no supplier, but every active worker holds groups with generations on disk, "
                                    f"which {settings.disk_adaptation} never moves: none is drained "
                                    f"({SEED000_DEGREE}; {SEED003_DISK}, restriction 2)",))
    victim = min(drainable, key=lambda o: (o.state_bytes, plan.occupancy[o.worker] or 0.0, o.worker))
    spared = len(active) - len(drainable)
    among = f" of the {len(drainable)} holding no group with generations on disk ({SEED003_DISK})" if spared else ""
    why = (f"no worker is a supplier (occupancy > {settings.supplier_occupancy}): the degree of declustering "
           f"shrinks by one; {victim.worker} holds the least state{among} ({victim.state_bytes} bytes) and is "
           f"drained to standby ({SEED000_DEGREE})")
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
        free_groups = movable(active[supplier], settings)
        if not free_groups:
            notes.append(f"{supplier} is a supplier but every group it holds has generations on disk, which "
                         f"{settings.disk_adaptation} never moves ({SEED003_DISK}, restriction 2)")
            continue
        consumer = next(free, None)
        if consumer is None:
            notes.append(f"{supplier} is a supplier but no consumer is left to take a group ({SEED000_LOAD})")
            continue
        group = _yielded_group(free_groups, settings.yield_group, rng)
        moves.append(Move(group, supplier, consumer, "load", groups[group],
                          _load_why(plan, supplier, consumer, group, len(free_groups), len(groups) - len(free_groups),
                                    settings)))
    return moves, notes


def _yielded_group(group_bytes: Mapping[int, int], how: str, rng: random.Random) -> int:
    """The group a supplier yields: random (seed 000 IV-C) or the one with the most state."""
    if how == "heaviest":
        return min(group_bytes, key=lambda g: (-group_bytes[g], g))
    return rng.choice(sorted(group_bytes))


def _load_why(plan: Plan, supplier: str, consumer: str, group: int, held: int, kept: int,
              settings: CoordinatorSpec) -> str:
    """held: the supplier's groups it could yield; kept: those with generations on disk it keeps."""
    consumer_occ = plan.occupancy.get(consumer)
    taker = (f"{consumer}, a consumer (occupancy {consumer_occ:.3f} < {settings.consumer_occupancy})"
             if consumer_occ is not None else f"{consumer}, the standby just activated")
    staying = f"; its {kept} with generations on disk stay ({SEED003_DISK}, restriction 2)" if kept else ""
    return (f"{supplier} is a supplier (occupancy {plan.occupancy[supplier]:.3f} > {settings.supplier_occupancy}): "
            f"it yields group {group} ({settings.yield_group} of its {held}{staying}) to {taker} ({SEED000_LOAD})")


# ------------------------------------------------------------------ memory
def _plan_memory(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec,
                 history: History) -> tuple[Plan, bool]:
    """Seed 003 5.1: when M_least / M_most < theta_d, move (M_most - M_least) / 2 of state from
    the fullest worker (the sender) to the emptiest (the receiver); 5.2: at most once per
    `memory_balance_interval_ms`. Under lazy-disk and active-disk (section 6) M is the window
    bytes in memory, the sender's groups with generations on disk stay (restriction 2), and no
    balancing starts in an epoch in which the sender or the receiver pushed (restriction 1).

    Returns the plan and whether memory is settled: balanced, or unbalanced in a way no move
    can narrow. It is not settled while balancing moves or only waits (its interval, a push):
    active-disk then orders no push, since balancing will act soon (one adaptation at a time)."""
    if len(active) < 2:
        return plan, True
    ordered = sorted(active, key=lambda o: (memory_signal(o, settings), o.worker))
    receiver, sender = ordered[0], ordered[-1]
    most, least = memory_signal(sender, settings), memory_signal(receiver, settings)
    if most == 0 or least / most >= settings.memory_balance_theta:
        return plan, True
    ratio = f"M_least / M_most = {least}/{most} = {least / most:.3f} < {settings.memory_balance_theta}"
    if settings.disk_adaptation != "local":
        ratio = f"{ratio} (window bytes in memory, {settings.disk_adaptation})"
    left = _cooling(history.last_memory_ms, plan.now_ms, settings.memory_balance_interval_ms)
    if left:
        return _noted(plan, f"{ratio}: memory balancing waits {left / 1000:.1f} s more for "
                            "coordinator.memory_balance_interval_ms (seed 003 5.2)"), False
    pushers = [o.worker for o in (sender, receiver) if o.pushed]
    if pushers and settings.disk_adaptation != "local":
        return _noted(plan, f"{ratio}, but {' and '.join(pushers)} pushed state to disk in this epoch: memory "
                            f"balancing waits for an epoch without a push ({SEED003_DISK}, restriction 1: one "
                            "adaptation at a time)"), False
    kept = pinned(sender, settings)
    staying = (f" ({len(kept)} of its groups have generations on disk and stay: {SEED003_DISK}, restriction 2)"
               if kept else "")
    candidates, target = movable(sender, settings), (most - least) / 2
    by_productivity = settings.disk_adaptation != "local"  # seed 003 6 moves the productive groups
    chosen = half_the_gap(candidates, target,
                          productive_first(candidates, sender.group_results) if by_productivity else None)
    if not chosen:
        return _noted(plan, f"{ratio}, but every group of {sender.worker} that may move{staying} is at least the "
                            "gap it would close: moving one would not narrow it"), True
    picked = ", its productive groups first (smallest P_s / P_o)" if by_productivity else ""
    why = (f"{ratio}: move about (M_most - M_least) / 2 = {target:.0f} bytes from {sender.worker} "
           f"(fullest) to {receiver.worker} (emptiest){picked}{staying} ({SEED003_MEMORY})")
    moves = tuple(Move(g, sender.worker, receiver.worker, "memory", sender.group_bytes[g], why) for g in chosen)
    return replace(plan, moves=moves), False


def _noted(plan: Plan, note: str) -> Plan:
    """`plan` with `note` (something considered and not done, and why) added."""
    return replace(plan, notes=plan.notes + (note,))


def half_the_gap(group_bytes: Mapping[int, int], target: float, order: Sequence[int] | None = None) -> list[int]:
    """Groups whose bytes add up close to `target` (seed 003's half gap), at group granularity:
    in `order` (default: largest first), each taken when it brings the total closer to the
    target (its size is below twice what is left). The total never exceeds twice the target,
    so the gap always narrows; a group left out is at least twice what remains."""
    if order is None:
        order = sorted(group_bytes, key=lambda g: (-group_bytes[g], g))
    chosen, remaining = [], target
    for group in order:
        size = group_bytes[group]
        if 0 < size < 2 * remaining:
            chosen.append(group)
            remaining -= size
    return chosen


def productive_first(group_bytes: Mapping[int, int], group_results: Mapping[int, int]) -> list[int]:
    """The groups of `group_bytes` in seed 003 6's move order for lazy-disk and active-disk: the
    productive first (smallest P_s / P_o, bytes per result; the larger group first among equals),
    then the groups that produced nothing or have no statistics, largest first."""
    return sorted(group_bytes, key=lambda g: (unproductivity(group_bytes[g], group_results.get(g, 0)),
                                              -group_bytes[g], g))


# ------------------------------------------------------------------ active-disk
def output_rates(active: list[WorkerObservation], epoch_ms: int) -> dict[str, float]:
    """Seed 003 6: a worker's average output rate, the results it produced in the epoch (the
    sampling time) per second, divided by the number of partition groups it holds. Only workers
    with a results count and at least one group have one."""
    return {o.worker: o.results / (epoch_ms / 1000) / len(o.group_bytes)
            for o in active if o.results is not None and o.group_bytes}


def _plan_push(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec, history: History,
               push_fraction: float) -> Plan:
    """Seed 003 6, active-disk, in an epoch whose memory is settled and that moves nothing: when
    Max_rate / Min_rate > theta_f (a Min_rate of 0 below a Max_rate above 0 counts as diverged;
    all 0 is no signal), the worker with the lowest rate pushes min(push_fraction x its memory,
    M_q - M_c) bytes, where M_q = in-memory plus spilled bytes of the workers reporting spill
    (the query's memory need) and M_c = their budgets; none when M_q <= M_c (the cluster's
    memory holds the query). At most one order per `memory_balance_interval_ms`, so a push
    shows in the next epochs' rates before another is ordered."""
    # Only workers reporting spill take part: the others neither count in M_q and M_c nor obey a push.
    reporting = [o for o in active if o.memory_bytes is not None]
    rates = output_rates(reporting, settings.reorg_epoch_ms)
    if len(rates) < 2 or max(rates.values()) == 0:
        return plan
    fastest, slowest = max(rates.values()), min(rates.values())
    if slowest > 0 and fastest / slowest <= settings.output_rate_theta:
        return plan
    spread = (f"Max_rate / Min_rate = {fastest:.3g} / {slowest:.3g} results/s per group "
              f"{'= ' + format(fastest / slowest, '.3g') if slowest else '(Min_rate 0)'} > theta_f "
              f"{settings.output_rate_theta}")
    need = sum(o.memory + o.spilled_bytes for o in reporting)
    budget = sum(o.memory_budget for o in reporting)
    if need <= budget:
        return _noted(plan, f"{spread}, but M_q = {need} <= M_c = {budget} bytes: the cluster's memory holds the "
                            f"query, nothing is pushed ({SEED003_DISK}, active-disk)")
    left = _cooling(history.last_push_ms, plan.now_ms, settings.memory_balance_interval_ms)
    if left:
        return _noted(plan, f"{spread}: the next push order waits {left / 1000:.1f} s more for "
                            f"coordinator.memory_balance_interval_ms ({SEED003_DISK}, active-disk)")
    # Among equally slow workers the one holding most in memory frees most for the others.
    lowest = min((o for o in reporting if o.worker in rates),
                 key=lambda o: (rates[o.worker], -o.memory, o.worker))
    amount = int(min(push_fraction * lowest.memory, need - budget))
    if amount <= 0:
        return _noted(plan, f"{spread}: {lowest.worker} has the lowest rate but holds nothing in memory to push "
                            f"({SEED003_DISK}, active-disk)")
    why = (f"{spread}: {lowest.worker} has the lowest rate ({rates[lowest.worker]:.3g} over "
           f"{len(lowest.group_bytes)} groups) and pushes min(push_fraction {push_fraction} x {lowest.memory}, "
           f"M_q - M_c = {need} - {budget}) = {amount} bytes, least productive groups first, leaving memory to "
           f"the more productive groups ({SEED003_DISK}, active-disk)")
    return replace(plan, push=PushOrder(lowest.worker, amount, why))
