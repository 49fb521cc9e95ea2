"""Parts 3 and 4 of the `adapt` benchmark (bench/adapt.py): fixed against adaptive placement
under a slowed worker (skew) and under a rate ramp, with delay, results and active workers over
time."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Sequence

import numpy as np

from streamjoin.bench import ours, report
from streamjoin.bench.adapt_fleet import ADAPTIVE, THRESHOLD_S, Plan, base_job, constant, finish, log_events
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.paced import PacedInput, RateSchedule
from streamjoin.launcher import Fleet, write_job
from streamjoin.schemas import control
from streamjoin.services.coordinator.status import heartbeats_since
from streamjoin.settings import JobSettings


# ---------------------------------------------------------------- parts 3 and 4: placement runs


class Slowdown(threading.Thread):
    """Stops a process (SIGSTOP) for `stopped_s` of every `period_s` until `stop()`, which
    leaves it running (SIGCONT)."""

    def __init__(self, pid: int, stopped_s: float, period_s: float) -> None:
        super().__init__(daemon=True, name=f"slowdown-{pid}")
        self.pid, self.stopped_s, self.period_s = pid, stopped_s, period_s
        self._stop_flag = threading.Event()

    def run(self) -> None:
        while not self._stop_flag.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self._stop_flag.wait(self.stopped_s)
            os.kill(self.pid, signal.SIGCONT)
            self._stop_flag.wait(self.period_s - self.stopped_s)

    def stop(self) -> None:
        self._stop_flag.set()
        self.join(30)


def placement_run(env: BenchEnv, plan: Plan, name: str, placement: str, workers: int, schedule: RateSchedule,
                  steps: Sequence[ours.Step], slow: tuple[float, float] | None) -> dict:
    """A fleet of `workers` fed by `schedule` (its time 0 is the measured span's start, after `plan.warm_s`),
    started sticky and switched to `placement` when the span begins; `slow` stops the last worker
    for that many seconds of every period throughout. The span's curves and totals."""
    seconds = sum(s.seconds for s in steps)
    adaptive = ADAPTIVE | {"placement": placement}
    job = base_job(env, name, workers, plan.partitions, [ours.Step(steps[0].rate, plan.warm_s), *steps], plan.window_ms,
                   adaptive | {"placement": "sticky"})
    fleet, ids = ours.start_fleet(env, job, workers)
    feed = PacedInput(job, env.bootstrap, schedule, seed=job.workload.random_state)
    feed.start()
    slowdown = Slowdown(fleet.procs[ids[-1]].pid, *slow) if slow else None
    if slowdown:
        slowdown.start()
    time.sleep(plan.warm_s)
    run_job = job.model_copy(update={"coordinator": job.coordinator.model_copy(update=adaptive)})
    write_job(run_job, fleet.job_file)
    fleet.kill("coordinator", signal.SIGTERM)
    fleet.start_coordinator()
    feed.begin_span()
    since_ms = int(time.time() * 1000)
    time.sleep(seconds)
    until_ms = int(time.time() * 1000)
    if slowdown:
        slowdown.stop()
    done = finish(env, job, fleet, feed, plan.verifier)
    beats = heartbeats_since(job, env.cluster, (time.time() * 1000 - since_ms) / 1000 + 30)
    return summarise_run(run_job, plan, placement, feed, fleet, beats, done, since_ms, until_ms)


def summarise_run(job: JobSettings, plan: Plan, placement: str, feed: PacedInput, fleet: Fleet,
                  beats: list[control.Heartbeat], done: dict, since_ms: int, until_ms: int) -> dict:
    """The measured span [since_ms, until_ms): delay and results/s per bucket, active workers and
    the input rate per second, the span's totals and the adaptations the coordinator started."""
    timing = done.pop("timing")
    threshold_ms = THRESHOLD_S * 1000
    inside = (timing["newest_ms"] >= since_ms) & (timing["newest_ms"] < until_ms)
    produced = (timing["produced_ms"] >= since_ms) & (timing["produced_ms"] < until_ms)
    seconds = (until_ms - since_ms) / 1000
    t_active, active = active_workers(beats, since_ms, until_ms, job.coordinator.heartbeat_timeout_ms)
    t_rate, rate = feed.written_per_second(since_ms)
    keep = (t_rate >= 0) & (t_rate < seconds)
    return {"job": job.job, "placement": placement, "seconds": seconds,
            "delay": report.delay_stats(timing["delay_ms"][inside], threshold_ms),
            "results_per_s": float(produced.sum() / seconds),
            "active_worker_seconds": float(active.sum()), "active_workers_mean": float(active.mean()),
            "curves": {"t_s": bucket_starts(seconds, plan.bucket_s),
                       **over_time(timing, since_ms, seconds, plan.bucket_s, threshold_ms),
                       "active_t_s": t_active.tolist(), "active_workers": active.tolist(),
                       "rate_t_s": t_rate[keep].tolist(), "rate_per_stream": rate[keep].tolist()},
            "adaptations": [{k: e.get(k) for k in ("timestamp", "adaptation", "scale", "moves")}
                            for e in log_events(fleet, "adaptation started")],
            "moves_done": len(log_events(fleet, "move done")), **done}


def bucket_starts(seconds: float, bucket_s: float) -> list[float]:
    return np.arange(0, seconds, bucket_s).tolist()


def over_time(timing: dict, since_ms: int, seconds: float, bucket_s: float, threshold_ms: float) -> dict:
    """Per bucket of `bucket_s` from `since_ms`: p50/p99 delay of the results whose newest input
    arrived in it, and results produced per second in it."""
    starts = bucket_starts(seconds, bucket_s)
    arrived = (timing["newest_ms"] - since_ms) / 1000
    made = (timing["produced_ms"] - since_ms) / 1000
    p50, p99, per_s = [], [], []
    for t in starts:
        stats = report.delay_stats(timing["delay_ms"][(arrived >= t) & (arrived < t + bucket_s)], threshold_ms)
        p50.append(stats["p50_ms"])
        p99.append(stats["p99_ms"])
        per_s.append(float(((made >= t) & (made < t + bucket_s)).sum() / bucket_s))
    return {"p50_ms": p50, "p99_ms": p99, "results_per_s": per_s}


def active_workers(beats: list[control.Heartbeat], since_ms: int, until_ms: int,
                   timeout_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Once a second over [since_ms, until_ms): how many workers hold a group, as their newest
    heartbeat younger than `timeout_ms` says (what `streamjoin status` shows at that instant)."""
    grid = np.arange(since_ms, until_ms, 1000)
    newest: dict[str, control.Heartbeat] = {}
    ordered = iter(sorted(beats, key=lambda b: b.wall_ms))
    pending = next(ordered, None)
    counts = []
    for t in grid:
        while pending is not None and pending.wall_ms <= t:
            newest[pending.worker] = pending
            pending = next(ordered, None)
        counts.append(sum(1 for b in newest.values() if b.groups and t - b.wall_ms < timeout_ms))
    return (grid - since_ms) / 1000, np.array(counts)


def slowed_worker(env: BenchEnv, plan: Plan, placement: str) -> dict:
    """Part 3: 2 workers at a constant rate, the second stopped for most of every period."""
    steps = (ours.Step(plan.skew_rate, plan.skew_seconds),)
    out = placement_run(env, plan, f"adapt-slow-{placement}", placement, 2, constant(plan.skew_rate), steps,
                        plan.slow)
    return {"rate_per_stream": plan.skew_rate, "slowed": {"worker": "worker-1", "stopped_s": plan.slow[0],
                                                          "period_s": plan.slow[1]}, **out}


def rate_ramp(env: BenchEnv, plan: Plan, placement: str) -> dict:
    """Part 4: `plan.ramp`'s rates in turn (the first also during the warm-up) on `ramp_workers`."""
    ends = np.cumsum([s.seconds for s in plan.ramp])
    rates = [s.rate for s in plan.ramp]

    def schedule(t: float) -> float:  # the warm-up (t < 0) runs at the first rate
        return rates[min(int(np.searchsorted(ends, max(t, 0.0), side="right")), len(rates) - 1)]

    out = placement_run(env, plan, f"adapt-ramp-{placement}", placement, plan.ramp_workers, schedule, plan.ramp,
                        None)
    return {"steps": [{"rate_per_stream": s.rate, "seconds": s.seconds} for s in plan.ramp],
            "workers": plan.ramp_workers, **out}
