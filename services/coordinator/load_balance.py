"""Load balancing and the degree of declustering, after the cluster join paper (sections
IV-C and V-A): a worker's load is its average buffer occupancy over the epoch; it is a
supplier above `supplier_occupancy`, a consumer below `consumer_occupancy`, neutral between.
Each supplier yields one group to a consumer. With no supplier the degree shrinks (an active
worker is drained to standby); with more than `scale_lambda` x consumers suppliers it grows (a
standby is activated).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from streamjoin.services.coordinator.epoch import (
    DEGREE_RULE, DISK_RULE, LOAD_RULE, History, LoadClass, Move, Plan, ScaleChange, WorkerObservation, cooldown_left,
    movable, pinned,
)
from streamjoin.settings import CoordinatorSpec


def occupancy(backlog_samples: Sequence[int], buffer_bytes: int) -> float | None:
    """Section IV-C: the average of the buffer sizes sampled over the epoch divided by the
    buffer's capacity (`coordinator.buffer_bytes`); None with no sample. It may exceed 1: Kafka
    holds what a bounded buffer would have refused."""
    if not backlog_samples:
        return None
    return sum(backlog_samples) / len(backlog_samples) / buffer_bytes


def classify(occ: float | None, settings: CoordinatorSpec) -> LoadClass:
    """Section IV-C: supplier above theta_s, consumer below theta_c, neutral otherwise. A
    worker with no sample is neutral: nothing says it is overloaded or idle."""
    if occ is None:
        return "neutral"
    if occ > settings.supplier_occupancy:
        return "supplier"
    if occ < settings.consumer_occupancy:
        return "consumer"
    return "neutral"


def plan_load(plan: Plan, active: list[WorkerObservation], standbys: list[str], settings: CoordinatorSpec,
              history: History, rng: random.Random) -> Plan:
    """The degree of declustering (V-A), then one group from each supplier (IV-C)."""
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
    """Section V-A: no supplier, so the degree shrinks by one: drain the active worker with
    the least state (the cheapest to move) onto the others."""
    if len(active) < 2:
        return replace(plan, notes=(f"no supplier, but {active[0].worker} is the only active worker: it stays",))
    left = cooldown_left(history.last_scale_ms, plan.now_ms, settings.scale_cooldown_ms)
    if left:
        return replace(plan, notes=(f"no supplier: scale in waits {left / 1000:.1f} s more for "
                                    f"coordinator.scale_cooldown_ms ({DEGREE_RULE})",))
    drainable = [o for o in active if not pinned(o, settings)]
    if not drainable:
        return replace(plan, notes=(f"no supplier, but every active worker holds groups with generations on disk, "
                                    f"which {settings.disk_adaptation} never moves: none is drained "
                                    f"({DEGREE_RULE}; {DISK_RULE}, restriction 2)",))
    victim = min(drainable, key=lambda o: (o.state_bytes, plan.occupancy[o.worker] or 0.0, o.worker))
    spared = len(active) - len(drainable)
    among = f" of the {len(drainable)} holding no group with generations on disk ({DISK_RULE})" if spared else ""
    why = (f"no worker is a supplier (occupancy > {settings.supplier_occupancy}): the degree of declustering "
           f"shrinks by one; {victim.worker} holds the least state{among} ({victim.state_bytes} bytes) and is "
           f"drained to standby ({DEGREE_RULE})")
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
    """Section V-A: suppliers > lambda x consumers, so the degree grows by one standby. Returns
    the change, or None and the reason it is not made."""
    wanted = (f"{suppliers} supplier(s) > coordinator.scale_lambda {settings.scale_lambda} x {consumers} "
              "consumer(s)")
    if not standbys:
        return None, f"{wanted}, but no standby is left: the replica count is the maximum ({DEGREE_RULE})"
    left = cooldown_left(history.last_scale_ms, plan.now_ms, settings.scale_cooldown_ms)
    if left:
        return None, f"{wanted}: scale out waits {left / 1000:.1f} s more for coordinator.scale_cooldown_ms"
    return ScaleChange("scale-out", standbys[0], f"{wanted}: {standbys[0]} becomes active ({DEGREE_RULE})"), ""


def _load_moves(plan: Plan, active: Mapping[str, WorkerObservation], suppliers: list[str], takers: list[str],
                settings: CoordinatorSpec, rng: random.Random) -> tuple[list[Move], list[str]]:
    """Section IV-C: one scan pairs each supplier (most loaded first) with the next of `takers`
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
                         f"{settings.disk_adaptation} never moves ({DISK_RULE}, restriction 2)")
            continue
        consumer = next(free, None)
        if consumer is None:
            notes.append(f"{supplier} is a supplier but no consumer is left to take a group ({LOAD_RULE})")
            continue
        group = _yielded_group(free_groups, settings.yield_group, rng)
        moves.append(Move(group, supplier, consumer, "load", groups[group],
                          _load_why(plan, supplier, consumer, group, len(free_groups), len(groups) - len(free_groups),
                                    settings)))
    return moves, notes


def _yielded_group(group_bytes: Mapping[int, int], how: str, rng: random.Random) -> int:
    """The group a supplier yields: random (section IV-C) or the one with the most state."""
    if how == "heaviest":
        return min(group_bytes, key=lambda g: (-group_bytes[g], g))
    return rng.choice(sorted(group_bytes))


def _load_why(plan: Plan, supplier: str, consumer: str, group: int, held: int, kept: int,
              settings: CoordinatorSpec) -> str:
    """held: the supplier's groups it could yield; kept: those with generations on disk it keeps."""
    consumer_occ = plan.occupancy.get(consumer)
    taker = (f"{consumer}, a consumer (occupancy {consumer_occ:.3f} < {settings.consumer_occupancy})"
             if consumer_occ is not None else f"{consumer}, the standby just activated")
    staying = f"; its {kept} with generations on disk stay ({DISK_RULE}, restriction 2)" if kept else ""
    return (f"{supplier} is a supplier (occupancy {plan.occupancy[supplier]:.3f} > {settings.supplier_occupancy}): "
            f"it yields group {group} ({settings.yield_group} of its {held}{staying}) to {taker} ({LOAD_RULE})")
