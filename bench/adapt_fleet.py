"""What every part of the `adapt` benchmark (bench/adapt.py) runs on: its plans and goals,
the job and fleet of one part, finishing a part (drain, exactness), and what the coordinator and
the workers report (counters, log events, held groups)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Sequence

from prometheus_client.parser import text_string_to_metric_families

from streamjoin.bench import ours
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.equijoin import domain_for
from streamjoin.bench.exact import Verifier, check_exact
from streamjoin.bench.paced import PacedInput, RateSchedule
from streamjoin.launcher import Fleet, wait_drained
from streamjoin.services.coordinator.status import latest_heartbeats
from streamjoin.settings import JobSettings, WindowSpec, load


THRESHOLD_S = 1.0  # production delay under this counts as served in time (the other benchmarks' rule)
PAUSE_GOAL_S, PAUSE_GOAL_BYTES = 0.5, 5_000_000  # the goal: p99 pause for a 5 MB group under 500 ms
FAILOVER_GOAL_S = 10.0  # the goal: lost groups produce again within 10 s of the SIGKILL
MOVE_TIMEOUT_S = 180.0
# Failover: a SIGKILLed worker is declared dead after 6 s of silence; a slow one is not (4 s).
FAILOVER_TIMEOUTS = {"worker_timeout_ms": 6000, "heartbeat_timeout_ms": 4000}
# The adaptive coordinator of parts 3 and 4. Occupancy thresholds are lower than the paper's
# 0.5 / 0.01 of a 1 MiB buffer: a worker that keeps up shows 10-30 KB of backlog between batches
# here (at 0.01 MiB it would never be a consumer), and a worker that lags by seconds 0.2-0.5 MiB.
ADAPTIVE = {"placement": "adaptive", "reorg_epoch_ms": 5000, "buffer_bytes": 1 << 20,
            "supplier_occupancy": 0.2, "consumer_occupancy": 0.05, "scale_cooldown_ms": 15_000}


@dataclass(frozen=True)
class Size:
    """One state size of the migration part: `rate` tuples/s per stream and the window."""

    rate: float
    window_ms: int


@dataclass(frozen=True)
class Plan:
    verifier: Verifier
    partitions: int  # groups of every job (2 per worker in part 1)
    sizes: tuple[Size, ...]  # part 1
    moves: int  # part 1: moves per size
    settle_s: float  # part 1 and 2: steady seconds around each move / kill
    failover_workers: int
    failover_rate: float
    window_ms: int  # parts 2-4
    skew_rate: float
    skew_seconds: float
    slow: tuple[float, float]  # part 3: the slowed worker is stopped this many seconds of every period
    ramp: tuple[ours.Step, ...]
    ramp_workers: int
    warm_s: float  # parts 3-4: input flowing before the coordinator restarts with the run's placement
    bucket_s: float  # width of a point of the curves over time


# Part 1's sizes: a group holds rate x 2 streams x window / 4 groups tuples, about 230 bytes each
# in state here, so about 1, 5 and 20 MB per group.
FULL = Plan(verifier="spark", partitions=4,
            sizes=(Size(1000, 9_000), Size(2000, 22_000), Size(4000, 43_000)), moves=6, settle_s=5.0,
            failover_workers=3, failover_rate=1500, window_ms=30_000,
            skew_rate=1500, skew_seconds=90, slow=(3.2, 4.0),
            ramp=(ours.Step(1500, 45), ours.Step(4000, 60), ours.Step(1500, 60)), ramp_workers=3,
            warm_s=10.0, bucket_s=5.0)
QUICK = Plan(verifier="reference", partitions=4, sizes=(Size(300, 3000),), moves=2, settle_s=1.5,
             failover_workers=2, failover_rate=300, window_ms=3000,
             skew_rate=300, skew_seconds=9, slow=(1.6, 2.0),
             ramp=(ours.Step(200, 3), ours.Step(500, 3), ours.Step(200, 3)), ramp_workers=2,
             warm_s=2.0, bucket_s=1.5)


# ---------------------------------------------------------------- jobs and fleets


def base_job(env: BenchEnv, name: str, workers: int, partitions: int, steps: Sequence[ours.Step], window_ms: int,
             coordinator: dict | None = None) -> JobSettings:
    """equijoin.yaml with `partitions` groups, `window_ms` windows, the key domain that makes output about
    as large as input over `steps`, and `coordinator` settings, as its own job for `workers` workers."""
    from streamjoin.job_files import default_job_file

    job = load(default_job_file())
    streams = [s.model_copy(update={"window": WindowSpec(range_ms=window_ms)}) for s in job.streams]
    domain = domain_for(steps, window_ms, job.workload.skew, len(streams))
    job = ours.fleet_job(job.model_copy(update={
        "streams": streams, "partitions": partitions,
        "workload": job.workload.model_copy(update={"domain": domain})}), env, name, workers)
    return job.model_copy(update={"coordinator": job.coordinator.model_copy(update=coordinator or {})})


def finish(env: BenchEnv, job: JobSettings, fleet: Fleet, feed: PacedInput, verifier: Verifier) -> dict:
    """Stop the input, let the fleet drain it, read the coordinator's counters, stop the fleet and
    check the output; the verdict, the drain time and the per-result timings."""
    feed.stop()
    stopped = time.monotonic()
    wait_drained(job, env.bootstrap, fleet, timeout=600)
    drain_s = time.monotonic() - stopped
    counters = coordinator_counters(fleet)
    fleet.stop_all()
    with env.phase(f"checking {job.job} exact ({verifier})"):
        verdict = check_exact(job, env.cluster, verifier)
    return {"verify": verdict, "drain_after_input_s": round(drain_s, 2), "coordinator": counters,
            "inputs": feed.tuples, "timing": ours.result_timings(env.cluster, job)}


def coordinator_counters(fleet: Fleet) -> dict:
    """The coordinator's migration counters: moves by outcome and window bytes moved."""
    # Parts 3 and 4 restart the coordinator: at the end of a short run its page may not be up yet.
    text = ours.metrics_page(fleet.metrics_ports["coordinator"], wait_s=60.0)
    out: dict = {"migrations": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "streamjoin_migrations_total":
                out["migrations"][sample.labels["outcome"]] = int(sample.value)
            elif sample.name == "streamjoin_migrated_bytes_total":
                out["migrated_bytes"] = int(sample.value)
    return out


def log_events(fleet: Fleet, event: str) -> list[dict]:
    """The coordinator's structured log lines (JSON) whose event is `event`, oldest first."""
    path = fleet.log_dir / "coordinator.log"
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"event": "{event}"' in line:
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a concurrent write or a kill
                continue
    return found


def held(job: JobSettings, env: BenchEnv) -> dict[str, list[int]]:
    """Each worker's groups as its newest heartbeat of the last few seconds says."""
    return {w: b.groups for w, b in latest_heartbeats(job, env.cluster, window_s=5).items()}


def constant(rate: float) -> RateSchedule:
    return lambda _t: rate
