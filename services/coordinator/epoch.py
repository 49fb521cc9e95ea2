"""What one reorganisation epoch's plan is made of: the coordinator's observation of each
worker, the history of earlier adaptations, the moves, scale changes and push orders a plan
starts, and the rules (`pinned`, `movable`, `memory_signal`) that every adaptation reads the
same way. The decisions themselves live in load_balance.py and memory_balance.py; adapt.py
picks the epoch's one adaptation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from streamjoin.settings import CoordinatorSpec

Role = Literal["active", "standby"]
LoadClass = Literal["supplier", "consumer", "neutral"]
MoveReason = Literal["load", "scale-in", "memory"]
# The rule each decision follows, as its `why` names it (docs/papers.md cites the papers).
LOAD_RULE = "cluster join paper, section IV-C"
DEGREE_RULE = "cluster join paper, section V-A"
MEMORY_RULE = "spill paper, section 5.1"
DISK_RULE = "spill paper, section 6"


@dataclass(frozen=True)
class WorkerObservation:
    """What the coordinator saw of one worker during the epoch.

    worker: its id. alive: it heartbeated within `coordinator.heartbeat_timeout_ms`.
    role: active (holds groups) or standby (heartbeats, holds nothing).
    backlog_samples: the backlog bytes its heartbeats reported during the epoch (the
    cluster join paper, section IV-C, samples the buffer at the end of each distribution
    epoch and averages the samples).
    group_bytes: window state bytes of each group it holds.
    The spill fields come from its newest heartbeat (spill paper, section 6):
    memory_bytes: window bytes in memory (None: the worker does not report spill, see
    `memory`); memory_budget:
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
        """Window bytes in memory (the spill paper's M_u). A worker that does not
        report spill keeps its whole window in memory, so then it is all its state."""
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
    """Active-disk (spill paper, section 6): worker `worker` pushes at least `bytes` of in-memory window
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
        """The one adaptation this plan starts: load balancing (moves and a scale-out), a
        scale-in (a drain), memory balancing, an active-disk push order, or none."""
        if self.scale is not None and self.scale.action == "scale-in":
            return "scale-in"
        if self.moves:
            return "memory" if self.moves[0].reason == "memory" else "load"
        if self.push is not None:
            return "disk"
        return "load" if self.scale is not None else None


def cooldown_left(last_ms: int | None, now_ms: int, cooldown_ms: int) -> int:
    """Milliseconds left of a cool-down that started at `last_ms` (0: over, or never started)."""
    return 0 if last_ms is None else max(0, last_ms + cooldown_ms - now_ms)


def pinned(o: WorkerObservation, settings: CoordinatorSpec) -> frozenset[int]:
    """The groups of `o` no policy move may take: under lazy-disk and active-disk those with
    generations on disk (spill paper, section 6, restriction 2: moving them would
    complicate their clean-up); none under local."""
    if settings.disk_adaptation == "local":
        return frozenset()
    return o.spilled_groups & frozenset(o.group_bytes)


def movable(o: WorkerObservation, settings: CoordinatorSpec) -> dict[int, int]:
    """The groups of `o` a policy move may take, with their state bytes."""
    kept = pinned(o, settings)
    return {g: b for g, b in o.group_bytes.items() if g not in kept}


def memory_signal(o: WorkerObservation, settings: CoordinatorSpec) -> int:
    """The spill paper's memory of a worker: all its window state under local (spill
    ignored), its window bytes in memory under lazy-disk and active-disk (what spill frees)."""
    return o.state_bytes if settings.disk_adaptation == "local" else o.memory


def noted(plan: Plan, note: str) -> Plan:
    """`plan` with `note` (something considered and not done, and why) added."""
    return replace(plan, notes=plan.notes + (note,))
