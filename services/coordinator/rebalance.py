"""`streamjoin rebalance --dry-run`: what the adaptive policy (adapt.py) would do now, and why.

heartbeats -> observations -> plan -> report. `observe` and `dry_run` take what was read (the
placement and the epoch's heartbeats) and the time, so tests call them without a broker;
`read_dry_run` reads both from Kafka. Nothing is applied here: with `coordinator.placement:
adaptive` the coordinator runs the same policy on the heartbeats it reads and starts the moves.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamjoin.schemas.control import Heartbeat
from streamjoin.services.io import kafka
from streamjoin.services.coordinator import placement as placing
from streamjoin.services.coordinator.adapt import plan_epoch
from streamjoin.services.coordinator.epoch import History, Plan, WorkerObservation
from streamjoin.services.coordinator.status import heartbeats_since
from streamjoin.settings import CoordinatorSpec, JobSettings

NOT_APPLIED = ("dry run: nothing was moved. With coordinator.placement: adaptive the coordinator starts such "
               "moves itself at each epoch's end (through the migration protocol); `streamjoin move GROUP --to "
               "WORKER` carries out one by hand")


def observe(placement: Mapping[int, str], beats: Sequence[Heartbeat], now_ms: int,
            settings: CoordinatorSpec) -> list[WorkerObservation]:
    """One observation per worker named by the placement or by a heartbeat.

    placement: group -> owner; beats: the heartbeats read, in any order; now_ms: the epoch's
    end. A worker is alive when its newest heartbeat is younger than `heartbeat_timeout_ms`,
    active when the placement gives it a group (a standby holds none); its backlog samples are
    its heartbeats of the last `reorg_epoch_ms`, its group sizes those of its newest heartbeat
    for the groups placed on it (0 for a group it has not reported). Spill (the spill
    paper, section 6): memory, budget, spilled bytes and groups from its newest
    heartbeat; results and pushes are what its counters grew by across the epoch's heartbeats
    (`grown`). A worker whose heartbeat has no
    memory budget (worker.memory_bytes is never 0) predates spill reports: its memory and
    results are None, so the policy neither counts nor rates it."""
    epoch_start = now_ms - settings.reorg_epoch_ms
    workers = sorted(set(placement.values()) | {b.worker for b in beats})
    out = []
    for worker in workers:
        mine = sorted((b for b in beats if b.worker == worker), key=lambda b: b.wall_ms)
        newest = mine[-1] if mine else None
        epoch = [b for b in mine if b.wall_ms >= epoch_start]
        held = placing.groups_of(dict(placement), worker)
        reported = newest.group_bytes if newest is not None else {}
        spill = newest is not None and newest.memory_budget > 0
        out.append(WorkerObservation(
            worker=worker,
            alive=newest is not None and now_ms - newest.wall_ms < settings.heartbeat_timeout_ms,
            role="active" if held else "standby",
            backlog_samples=tuple(b.backlog_bytes for b in epoch),
            group_bytes={g: reported.get(g, 0) for g in held},
            memory_bytes=newest.memory_bytes if spill and newest else None,
            memory_budget=newest.memory_budget if newest else 0,
            spilled_bytes=newest.spilled_bytes if newest else 0,
            spilled_groups=frozenset(newest.spilled_groups) if newest else frozenset(),
            group_results={g: n for g, n in newest.group_results.items() if g in held} if newest else {},
            # One heartbeat alone shows no growth: no rate rather than a rate of 0.
            results=grown([b.results_total for b in epoch]) if spill and len(epoch) >= 2 else None,
            pushed=grown([b.pushes for b in epoch]) > 0,
        ))
    return out


def grown(totals: Sequence[int]) -> int:
    """What a worker's monotonic counter grew by across its successive reports `totals` (oldest
    first). A report below its predecessor means the worker restarted and counted again from 0,
    so that report's value is all it counted since the restart."""
    return sum(b - a if b >= a else b for a, b in zip(totals, totals[1:]))


def dry_run(job: JobSettings, placement: Mapping[int, str], beats: Sequence[Heartbeat], now_ms: int,
            rng: random.Random) -> dict[str, Any]:
    """The report of what the policy would start now: each worker's role, occupancy, class,
    state bytes and spill (memory, budget, spilled bytes and groups, results and pushes in the
    epoch), and the plan with its reasons (moves, a scale change or an active-disk push order).
    rng: which group a supplier yields."""
    observations = observe(placement, beats, now_ms, job.coordinator)
    plan = plan_epoch(observations, job.coordinator, now_ms, History(), rng, job.worker.spill.push_fraction)
    return {
        "job": job.job,
        "placement": job.coordinator.placement,
        "applied": False,
        "note": NOT_APPLIED,
        "workers": [_worker_row(o, plan) for o in observations],
        "plan": _plan_json(plan),
    }


def read_dry_run(job: JobSettings, cluster: kafka.Cluster, rng: random.Random) -> dict[str, Any]:
    """`dry_run` on the stored placement and the heartbeats of the last epoch (or of the
    heartbeat timeout, when longer: it decides who is alive)."""
    placement, _ = placing.load(job, cluster)
    window_s = max(job.coordinator.reorg_epoch_ms, job.coordinator.heartbeat_timeout_ms) / 1000
    beats = heartbeats_since(job, cluster, window_s)
    return dry_run(job, placement, beats, int(time.time() * 1000), rng)


def _worker_row(o: WorkerObservation, plan: Plan) -> dict[str, Any]:
    samples = o.backlog_samples
    return {
        "worker": o.worker,
        "alive": o.alive,
        "role": o.role,
        "class": plan.load_class.get(o.worker, "dead" if not o.alive else o.role),
        "occupancy": plan.occupancy.get(o.worker),
        "backlog_bytes": sum(samples) / len(samples) if samples else None,
        "backlog_samples": len(samples),
        "groups": len(o.group_bytes),
        "state_bytes": o.state_bytes,
        "memory_bytes": o.memory_bytes,
        "memory_budget": o.memory_budget,
        "spilled_bytes": o.spilled_bytes,
        "spilled_groups": sorted(o.spilled_groups),
        "results_in_epoch": o.results,
        "pushed_in_epoch": o.pushed,
    }


def _plan_json(plan: Plan) -> dict[str, Any]:
    scale, push = plan.scale, plan.push
    return {
        "adaptation": plan.adaptation,
        "scale": {"action": scale.action, "worker": scale.worker, "why": scale.why} if scale else None,
        "push": {"worker": push.worker, "bytes": push.bytes, "why": push.why} if push else None,
        "moves": [{"group": m.group, "from": m.source, "to": m.target, "reason": m.reason,
                   "state_bytes": m.state_bytes, "why": m.why} for m in plan.moves],
        "notes": list(plan.notes),
    }
