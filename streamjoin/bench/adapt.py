"""Workload `adapt`: partition groups that move, on the `equijoin` workload's
equi-join (64-byte JSON tuples, b-model keys, bias 0.7, 200 ms batches), each
part on its own job and fleet on the run's one embedded broker, fed live by a
paced background producer (bench/paced.py: event time about wall time):

1. migration cost: 2 workers; for each state size (window length x rate),
   groups are moved one at a time with the control topic's MoveGroup request
   (what `streamjoin move` sends). Per move: the coordinator's pause (its
   `move done` log line: from the move's start to the receiver's heartbeat
   holding the group) and the group's state bytes; the p99 production delay
   of the results whose newest input arrived before, during and after it.
2. failover: SIGKILL a worker (never restarted) with small timeouts; the time
   until a live worker holds each lost group (its heartbeats) and until each
   lost group produces a result again (the results topic).
3. skew: one worker slowed (SIGSTOPped for most of every period: a pod on
   an oversubscribed node), with fixed placement (`placement: sticky`) and
   with the adaptive coordinator; delay and results/s over time.
4. rate ramp: 1,500 -> 4,000 -> 1,500 tuples/s per stream, a fleet of the
   same maximum size, sticky vs adaptive; active workers over time.

The fixed-placement runs of parts 3 and 4 are the peer: the ratios divide the
adaptive figure by the fixed one. Every job's output is checked exact (Spark
`verify` in full runs, the plain-Python reference join in `--quick`), and the
top-level `exact` is the AND of all of them.

Parts 3 and 4 start each fleet under sticky placement and restart the
coordinator with the run's placement once the input flows: an adaptive
coordinator's first epoch would otherwise see the idle start-up (no
supplier) and scale in at once, whatever the load that follows.

`--plot P` writes two PNGs beside P: `<stem>-skew<suffix>` (delay over
time, both placements) and `<stem>-ramp<suffix>` (rate, active workers and
delay over time, both placements).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.bench import ours, report
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.equijoin import domain_for
from streamjoin.bench.exact import Verifier, check_exact
from streamjoin.bench.paced import PacedInput, RateSchedule
from streamjoin.launcher import Fleet, wait_drained, write_job
from streamjoin.schemas import control
from streamjoin.services.coordinator.status import heartbeats_since, latest_heartbeats
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


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    """The four parts on `env`'s broker (`quick`: the CI plan), the report, and with `plot_path`
    the two PNGs beside it."""
    plan = QUICK if quick else FULL
    with env.phase("part 1: migration cost"):
        migration = migration_cost(env, plan)
    with env.phase("part 2: failover"):
        failed_over = failover(env, plan)
    skew, ramp = {}, {}
    for placement in ("sticky", "adaptive"):
        with env.phase(f"part 3: one worker slowed, {placement} placement"):
            skew[placement] = slowed_worker(env, plan, placement)
    for placement in ("sticky", "adaptive"):
        with env.phase(f"part 4: rate ramp, {placement} placement"):
            ramp[placement] = rate_ramp(env, plan, placement)
    result = assemble(plan, quick, migration, failed_over, skew, ramp)
    if plot_path is not None:
        result["plots"] = plot(result, plot_path)
    return result


# ---------------------------------------------------------------- jobs and fleets


def base_job(env: BenchEnv, name: str, workers: int, partitions: int, steps: Sequence[ours.Step], window_ms: int,
             coordinator: dict | None = None) -> JobSettings:
    """seed000.yaml with `partitions` groups, `window_ms` windows, the key domain that makes output about
    as large as input over `steps`, and `coordinator` settings, as its own job for `workers` workers."""
    from streamjoin.cli import default_job_file

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
    url = f"http://127.0.0.1:{fleet.metrics_ports['coordinator']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
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


# ---------------------------------------------------------------- part 1: migration cost


def migration_cost(env: BenchEnv, plan: Plan) -> dict:
    """Part 1 at every state size; the goal is judged at the size whose groups are nearest 5 MB."""
    runs = [migration_run(env, plan, size, i) for i, size in enumerate(plan.sizes)]
    nearest = min(runs, key=lambda r: abs(r["state_bytes_median"] - PAUSE_GOAL_BYTES))
    p99 = nearest["pause_s"]["p99"]
    return {"sizes": runs, "goal": {
        "what": f"p99 migration pause of a ~{PAUSE_GOAL_BYTES / 1e6:.0f} MB group under {PAUSE_GOAL_S * 1000:.0f} ms",
        "judged_at_state_bytes": nearest["state_bytes_median"], "pause_p99_s": p99, "met": p99 < PAUSE_GOAL_S}}


def migration_run(env: BenchEnv, plan: Plan, size: Size, index: int) -> dict:
    """One state size: the window fills, then `plan.moves` moves, `settle_s` apart, alternating groups."""
    window_s = size.window_ms / 1000
    span = window_s + plan.settle_s + plan.moves * (plan.settle_s + 2)
    job = base_job(env, f"adapt-move{index}", 2, plan.partitions, [ours.Step(size.rate, span)], size.window_ms)
    fleet, ids = ours.start_fleet(env, job, 2)
    feed = PacedInput(job, env.bootstrap, constant(size.rate), seed=job.workload.seed)
    feed.start()
    env.console.print(f"[bold cyan]bench[/] {size.rate:.0f} tuples/s per stream, {window_s:.0f}s window: "
                      f"filling it, then {plan.moves} moves")
    time.sleep(window_s + plan.settle_s)
    owners = {g: w for w, groups in held(job, env).items() for g in groups}
    moves = []
    for m in range(plan.moves):
        group = m % plan.partitions
        target = next(w for w in ids if w != owners[group])
        moves.append(move(env, job, fleet, group, target))
        owners[group] = target
        time.sleep(plan.settle_s)
    done = finish(env, job, fleet, feed, plan.verifier)
    beats = sorted(heartbeats_since(job, env.cluster, time.time() - moves[0]["started_ms"] / 1000 + 30),
                   key=lambda b: b.wall_ms)
    return summarise_moves(job, size, [m | pause_stages(m, beats) for m in moves], done, plan.settle_s)


def move(env: BenchEnv, job: JobSettings, fleet: Fleet, group: int, target: str) -> dict:
    """Move `group` to `target` as `streamjoin move` does (a MoveGroup request on the control
    topic) and wait for the coordinator's `move done`; the move's start, pause, where the pause
    went, and the group's state bytes (its sender's last heartbeat before the move)."""
    seen = len(log_events(fleet, "move done"))
    state_bytes = next(b.group_bytes.get(group, 0) for b in latest_heartbeats(job, env.cluster, window_s=5).values()
                       if group in b.groups)
    producer = env.cluster.producer()
    started_ms = int(time.time() * 1000)
    producer.produce(job.control_topic, value=control.encode(control.MoveGroup(group=group, to=target)),
                     key=b"request", partition=0)
    producer.flush(30)
    deadline = time.monotonic() + MOVE_TIMEOUT_S
    while not log_events(fleet, "move done")[seen:]:
        fleet.assert_running()
        if time.monotonic() > deadline:
            raise TimeoutError(f"moving group {group} to {target} did not finish in {MOVE_TIMEOUT_S:.0f}s: "
                               f"{fleet.complaints()}")
        time.sleep(0.1)
    done = log_events(fleet, "move done")[seen]
    return {"group": group, "from": done["sender"], "to": target, "started_ms": started_ms,
            "pause_s": done["pause_s"], "state_bytes": state_bytes, "coordinator_state_bytes": done["state_bytes"]}


def pause_stages(m: dict, beats: list[control.Heartbeat]) -> dict:
    """Where move `m`'s time went, from the workers' heartbeats (a worker sends one as soon as it
    applies an assignment): `sender_s` from our request (so it includes the request reaching the
    coordinator, before the coordinator's pause starts) to the sender's first heartbeat without
    the group (its last cycle committed), `receiver_s` from then to the receiver's first heartbeat
    holding it (fenced, restored from the changelog, fetching from the barrier)."""
    after = [b for b in beats if b.wall_ms >= m["started_ms"]]
    released = next((b.wall_ms for b in after if b.worker == m["from"] and m["group"] not in b.groups), None)
    taken = next((b.wall_ms for b in after if b.worker == m["to"] and m["group"] in b.groups), None)
    if released is None or taken is None:
        return {"sender_s": None, "receiver_s": None}
    return {"sender_s": (released - m["started_ms"]) / 1000, "receiver_s": (taken - released) / 1000}


def summarise_moves(job: JobSettings, size: Size, moves: list[dict], done: dict, settle_s: float) -> dict:
    """Pauses and bytes of one size's moves, and the delays before, during and after them (all
    groups, and the moved group alone), each result placed by the arrival of its newest input."""
    timing = done.pop("timing")
    pauses = np.array([m["pause_s"] for m in moves])
    state = np.array([m["state_bytes"] for m in moves])
    phases: dict[str, dict[str, list[np.ndarray]]] = {p: {"all": [], "moved": []}
                                                      for p in ("before", "during", "after")}
    settle_ms = settle_s * 1000
    for m in moves:
        start, end = m["started_ms"], m["started_ms"] + m["pause_s"] * 1000
        spans = {"before": (start - settle_ms, start), "during": (start, end), "after": (end, end + settle_ms)}
        for phase, (lo, hi) in spans.items():
            inside = (timing["newest_ms"] >= lo) & (timing["newest_ms"] < hi)
            phases[phase]["all"].append(timing["delay_ms"][inside])
            phases[phase]["moved"].append(timing["delay_ms"][inside & (timing["group"] == m["group"])])
    delay = {phase: {which: report.delay_stats(np.concatenate(parts), THRESHOLD_S * 1000)
                     for which, parts in by.items()} for phase, by in phases.items()}
    return {"job": job.job, "rate_per_stream": size.rate, "window_ms": size.window_ms,
            "state_bytes_median": float(np.median(state)),
            "pause_s": {"p50": float(np.percentile(pauses, 50)), "p99": float(np.percentile(pauses, 99)),
                        "max": float(pauses.max())},
            "pause_per_mb_s": float(np.median(pauses / np.maximum(state / 1e6, 1e-9))),
            "moves": moves, "delay": delay, **done}


# ---------------------------------------------------------------- part 2: failover


def failover(env: BenchEnv, plan: Plan) -> dict:
    """SIGKILL workers one at a time (never restarted) until one is left; per kill, how long
    until the lost groups are held and produce again."""
    job = base_job(env, "adapt-failover", plan.failover_workers, plan.partitions,
                   [ours.Step(plan.failover_rate, 60)], plan.window_ms, FAILOVER_TIMEOUTS)
    fleet, ids = ours.start_fleet(env, job, plan.failover_workers)
    fleet.restart_workers = False
    began_ms = int(time.time() * 1000)
    feed = PacedInput(job, env.bootstrap, constant(plan.failover_rate), seed=job.workload.seed)
    feed.start()
    time.sleep(plan.settle_s * 2)
    alive, kills = list(ids), []
    while len(alive) > 1:
        victim = alive.pop()
        lost = held(job, env)[victim]
        killed_ms = int(time.time() * 1000)
        fleet.kill(victim, signal.SIGKILL)
        wait_taken(job, env, fleet, set(lost), alive)
        kills.append({"worker": victim, "groups": lost, "killed_ms": killed_ms, "survivors": list(alive)})
        time.sleep(plan.settle_s)
    done = finish(env, job, fleet, feed, plan.verifier)
    beats = heartbeats_since(job, env.cluster, (time.time() * 1000 - began_ms) / 1000 + 30)
    timing = done.pop("timing")
    measured = [failover_times(kill, beats, timing) for kill in kills]
    worst = max(k["producing_again_s"] for k in measured)
    return {"job": job.job, "workers": plan.failover_workers, "rate_per_stream": plan.failover_rate,
            **FAILOVER_TIMEOUTS, "kills": measured,
            "producing_again_s_median": float(np.median([k["producing_again_s"] for k in measured])),
            "goal": {"what": f"lost groups produce again within {FAILOVER_GOAL_S:.0f} s of the SIGKILL",
                     "worst_s": worst, "met": worst < FAILOVER_GOAL_S}, **done}


def wait_taken(job: JobSettings, env: BenchEnv, fleet: Fleet, lost: set[int], alive: list[str]) -> None:
    """Until workers of `alive` hold every group of `lost`."""
    deadline = time.monotonic() + 120
    while not lost <= {g for w, groups in held(job, env).items() if w in alive for g in groups}:
        fleet.assert_running()
        if time.monotonic() > deadline:
            raise TimeoutError(f"groups {sorted(lost)} were not failed over within 120 s: {fleet.complaints()}")
        time.sleep(0.5)


def failover_times(kill: dict, beats: list[control.Heartbeat], timing: dict) -> dict:
    """Per lost group: seconds from the kill to the first heartbeat of a survivor holding it, and
    to its first result produced after the kill; the kill's figure is the slowest group's."""
    killed = kill["killed_ms"]
    per_group = {}
    for g in kill["groups"]:
        holding = [b.wall_ms for b in beats if b.worker in kill["survivors"] and b.wall_ms > killed and g in b.groups]
        produced = timing["produced_ms"][(timing["group"] == g) & (timing["produced_ms"] > killed)]
        per_group[str(g)] = {"held_s": (min(holding) - killed) / 1000 if holding else None,
                             "first_result_s": (int(produced.min()) - killed) / 1000 if len(produced) else None}
    firsts = [v["first_result_s"] for v in per_group.values()]
    holds = [v["held_s"] for v in per_group.values()]
    return {**kill, "per_group": per_group,
            "held_s": max(h if h is not None else float("inf") for h in holds),
            "producing_again_s": max(f if f is not None else float("inf") for f in firsts)}


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
    feed = PacedInput(job, env.bootstrap, schedule, seed=job.workload.seed)
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


# ---------------------------------------------------------------- the report


def assemble(plan: Plan, quick: bool, migration: dict, failed_over: dict, skew: dict, ramp: dict) -> dict:
    verdicts = ([r["verify"] for r in migration["sizes"]] + [failed_over["verify"]]
                + [r["verify"] for r in (*skew.values(), *ramp.values())])
    exact = all(v["verified"] and v["missing"] == v["extra"] == v["duplicates"] == 0 for v in verdicts)
    ratios = {
        "skew_p99_delay": report.ratio(skew["adaptive"]["delay"]["p99_ms"], skew["sticky"]["delay"]["p99_ms"],
                                       "p99 production delay, one worker slowed, adaptive vs fixed", "ms"),
        "skew_throughput": report.ratio(skew["adaptive"]["results_per_s"], skew["sticky"]["results_per_s"],
                                        "results/s over the span, one worker slowed, adaptive vs fixed", "results/s"),
        "ramp_p99_delay": report.ratio(ramp["adaptive"]["delay"]["p99_ms"], ramp["sticky"]["delay"]["p99_ms"],
                                       "p99 production delay over the ramp, adaptive vs fixed", "ms"),
        "ramp_throughput": report.ratio(ramp["adaptive"]["results_per_s"], ramp["sticky"]["results_per_s"],
                                        "results/s over the ramp, adaptive vs fixed", "results/s"),
        "ramp_active_worker_seconds": report.ratio(ramp["adaptive"]["active_worker_seconds"],
                                                   ramp["sticky"]["active_worker_seconds"],
                                                   "active-worker-seconds over the ramp, adaptive vs fixed",
                                                   "worker-seconds"),
    }
    return {"workload": "adapt", "exact": exact, "parameters": parameters(plan, quick),
            "ours": {"migration": migration, "failover": failed_over, "skew": skew["adaptive"],
                     "ramp": ramp["adaptive"]},
            "peers": {"fixed_placement": {"skew": skew["sticky"], "ramp": ramp["sticky"]}},
            "ratios": ratios}


def parameters(plan: Plan, quick: bool) -> dict:
    from streamjoin.cli import default_job_file

    job = load(default_job_file())
    return {
        "mode": "quick" if quick else "full", "verifier": plan.verifier, "partitions": plan.partitions,
        "tuple_bytes": job.workload.tuple_bytes, "key_skew": job.workload.skew, "batch_ms": job.worker.batch_ms,
        "heartbeat_ms": job.worker.heartbeat_ms, "arrivals": "Poisson, event time = arrival (wall) time",
        "generator": "bench/paced.py: a background thread, one produce_batch per stream every 100 ms",
        "migration": {"workers": 2, "sizes": [{"rate_per_stream": s.rate, "window_ms": s.window_ms}
                                              for s in plan.sizes],
                      "moves_per_size": plan.moves, "settle_s": plan.settle_s,
                      "how": "MoveGroup on the control topic (as `streamjoin move`), one group at a time; pause "
                             "from the coordinator's `move done` log line, state bytes from the sender's last "
                             "heartbeat before the move"},
        "failover": {"workers": plan.failover_workers, "rate_per_stream": plan.failover_rate, **FAILOVER_TIMEOUTS,
                     "window_ms": plan.window_ms, "restart_workers": False},
        "skew": {"workers": 2, "rate_per_stream": plan.skew_rate, "seconds": plan.skew_seconds,
                 "window_ms": plan.window_ms, "slowed": "worker-1 SIGSTOPped %.1f s of every %.1f s" % plan.slow},
        "ramp": {"workers": plan.ramp_workers, "window_ms": plan.window_ms,
                 "steps": [{"rate_per_stream": s.rate, "seconds": s.seconds} for s in plan.ramp]},
        "adaptive_coordinator": ADAPTIVE,
        "warm_s": plan.warm_s, "bucket_s": plan.bucket_s, "delay_threshold_s": THRESHOLD_S,
    }


def plot(result: dict, path: Path) -> dict:
    """The skew and ramp PNGs beside `path`; their paths."""
    skew = path.with_name(f"{path.stem}-skew{path.suffix}")
    ramp = path.with_name(f"{path.stem}-ramp{path.suffix}")
    runs = {"skew": (result["peers"]["fixed_placement"]["skew"], result["ours"]["skew"]),
            "ramp": (result["peers"]["fixed_placement"]["ramp"], result["ours"]["ramp"])}
    plot_skew(runs["skew"], result["parameters"], skew)
    plot_ramp(runs["ramp"], result["parameters"], ramp)
    return {"skew": str(skew), "ramp": str(ramp)}


def _figure(rows: int):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(rows, 1, figsize=(9, 3.2 * rows), sharex=True, squeeze=False)


def _delay_axis(ax, runs: Sequence[dict]) -> None:  # type: ignore[no-untyped-def]
    for i, r in enumerate(runs):
        c = r["curves"]
        ax.plot(c["t_s"], c["p50_ms"], "o-", color=f"C{i}", label=f"{r['placement']}: p50")
        ax.plot(c["t_s"], c["p99_ms"], "s--", color=f"C{i}", alpha=0.7, label=f"{r['placement']}: p99")
    ax.axhline(THRESHOLD_S * 1000, color="red", linestyle=":", label=f"{THRESHOLD_S:.0f} s")
    ax.set_yscale("log")
    ax.set_ylabel("production delay (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=3)


def _save(plt, fig, path: Path, title: str) -> None:  # type: ignore[no-untyped-def]
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_skew(runs: Sequence[dict], params: dict, path: Path) -> None:
    """Delay over time (p50 solid, p99 dashed) and results/s, fixed and adaptive placement."""
    plt, fig, axes = _figure(2)
    _delay_axis(axes[0][0], runs)
    for i, r in enumerate(runs):
        axes[1][0].plot(r["curves"]["t_s"], r["curves"]["results_per_s"], "o-", color=f"C{i}", label=r["placement"])
    axes[1][0].set_ylabel("results/s")
    axes[1][0].set_xlabel("seconds since the coordinator took the run's placement")
    axes[1][0].grid(alpha=0.3)
    axes[1][0].legend(fontsize=8)
    s = params["skew"]
    _save(plt, fig, path, f"adapt ({params['mode']}): {s['slowed']}, {s['rate_per_stream']:.0f} tuples/s per "
                          f"stream, {params['partitions']} groups on 2 workers")


def plot_ramp(runs: Sequence[dict], params: dict, path: Path) -> None:
    """Input rate and active workers over time, then delay over time, fixed and adaptive placement."""
    plt, fig, axes = _figure(2)
    ax = axes[0][0]
    rate_ax = ax.twinx()
    for i, r in enumerate(runs):
        c = r["curves"]
        ax.step(c["active_t_s"], c["active_workers"], where="post", color=f"C{i}", label=f"{r['placement']}: active")
        rate_ax.plot(c["rate_t_s"], c["rate_per_stream"], color=f"C{i}", alpha=0.35, linewidth=1)
    ax.set_ylabel("active workers (step)")
    rate_ax.set_ylabel("input tuples/s per stream (faint)")
    ax.set_ylim(0, params["ramp"]["workers"] + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    _delay_axis(axes[1][0], runs)
    axes[1][0].set_xlabel("seconds since the coordinator took the run's placement")
    rates = " -> ".join(f"{s['rate_per_stream']:.0f}" for s in params["ramp"]["steps"])
    _save(plt, fig, path, f"adapt ({params['mode']}): rate ramp {rates} tuples/s per stream, "
                          f"{params['ramp']['workers']} workers at most")
