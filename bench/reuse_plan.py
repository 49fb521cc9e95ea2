"""The reuse benchmark's planning: template queries registered with topology/reuse/planner.py
in each reuse mode, per-query planning times, deployments, and planning against many
registered operators (bench/reuse.py describes the figures)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from streamjoin.bench.env import BenchEnv
from streamjoin.bench.reuse_exec import operator_plan
from streamjoin.schemas.cql_validate import compile_query
from streamjoin.schemas.query import Registration
from streamjoin.bench.query_templates import generate_queries
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from streamjoin.topology.reuse.cost import Statistics
from streamjoin.topology.reuse.operator import for_query
from streamjoin.topology.reuse.planner import Decision, Planner

STRATEGIES = ("none", "exact", "relax")
SEED = 2002  # the benchmark's queries
SYNTHETIC_SEED = 2003  # the queries behind the synthetic operators


def registrations(job: JobSettings, n: int, seed: int, at_ms: int, first: int = 0) -> list[Registration]:
    """n template queries compiled against the catalog, registered at `at_ms` (ids q-<first + i>)."""
    w = job.workload
    out = []
    for i, (text, sink, region, lifetime_s) in enumerate(generate_queries(
            n, seed, job.queries.regions, carriers=w.carriers, carrier_skew=w.carrier_skew, terminals=w.terminals)):
        lifetime_ms = None if lifetime_s is None else int(lifetime_s * 1000)
        out.append(Registration(f"q-{first + i}", text, compile_query(text, job.streams), sink, region,
                                lifetime_ms, at_ms, at_ms))
    return out


@dataclass(frozen=True)
class Planned:
    """A strategy's planner after every registration, its decisions and plan() wall times (ms)."""

    planner: Planner
    decisions: list[Decision]
    plan_ms: list[float]


def plan_all(job: JobSettings, strategy: str, regs: Sequence[Registration], stats: Statistics) -> Planned:
    """Register `regs` one by one with a planner in mode `strategy`."""
    planner = Planner(job.queries.model_copy(update={"reuse": strategy}), job.streams, stats)
    decisions, plan_ms = [], []
    for reg in regs:
        began = time.perf_counter()
        decision = planner.plan(reg)
        plan_ms.append((time.perf_counter() - began) * 1000.0)
        planner.apply(reg, decision)
        decisions.append(decision)
    return Planned(planner, decisions, plan_ms)


def timing(ms: Sequence[float]) -> dict:
    """Median, p99 and total of per-query planning times."""
    return {"median_ms": round(statistics.median(ms), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "total_s": round(sum(ms) / 1000.0, 4), "queries": len(ms)}


def operator_deploy_seconds(env: BenchEnv, job: JobSettings, repeats: int = 3) -> float:
    """Median seconds to create one operator version's topics on the run's broker (the part of a
    deployment this benchmark measures)."""
    reg = registrations(job, 1, SEED, 0)[0]
    seconds = []
    for i in range(repeats):
        version, _ = operator_plan(job, f"deploy-probe{i}", for_query(reg, reg.region))
        began = time.perf_counter()
        topics.ensure(env.cluster.admin(), version)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def planning_figures(planned: Planned, deploy_s: float) -> dict:
    """Decisions by kind, deployments, planning times and the time to deploy."""
    kinds = [d.kind for d in planned.decisions]
    deployments = kinds.count("new") + kinds.count("relax")
    plan = timing(planned.plan_ms)
    return {
        "decisions": {k: kinds.count(k) for k in ("new", "relax", "exact")},
        "deployments": deployments,
        "planning": plan,
        "time_to_deploy": {"seconds": round(plan["total_s"] + deployments * deploy_s, 3),
                           "planning_s": plan["total_s"], "deployments": deployments,
                           "per_deployment_s": round(deploy_s, 4)},
    }


def planning_at_scale(job: JobSettings, stats: Statistics, operators: int, probes: int, at_ms: int) -> dict:
    """Per strategy, plan() wall ms of the first `probes` benchmark queries with `operators`
    operators registered: distinct operators made by registering that many other template
    queries with reuse off, their decisions applied to every strategy's planner alike; the
    probes are planned, not recorded."""
    synthetic = registrations(job, operators, SYNTHETIC_SEED, at_ms, first=1_000_000)
    planners = {s: Planner(job.queries.model_copy(update={"reuse": s}), job.streams, stats) for s in STRATEGIES}
    for reg in synthetic:
        decision = planners["none"].plan(reg)
        for planner in planners.values():
            planner.apply(reg, decision)
    out = {}
    for strategy, planner in planners.items():
        ms, candidates = [], []
        for reg in registrations(job, probes, SEED, at_ms):
            began = time.perf_counter()
            decision = planner.plan(reg)
            ms.append((time.perf_counter() - began) * 1000.0)
            candidates.append(decision.candidates)
        out[strategy] = timing(ms) | {"operators": len(planner.operators()),
                                      "candidates_median": statistics.median(candidates)}
    return out
