"""Workload `delay`: production delay at the low end. A paced
producer (bench/paced.py, not Spark: event time about wall time, a tick every
100 ms) writes the equijoin workload at a steady rate into a fleet of 2 hash
workers with exactly-once on, once per partition count. Per run, over the
measured span after a warm-up:

- the production delay of every result (its `produced_ms` minus the Kafka
  timestamp of its newest input, read back from the topics), p50/p95/p99;
- the cores busy (psutil user + system) of the workers and the broker, and
  the workers' cycles (each one Kafka transaction) from their /metrics, so
  the broker's CPU per cycle is on the record: on Tansu it grows with the
  partitions a transaction touches, which is what sets the delay here.

The peer is raw delivery at the same rate into the same number of
partitions: one tuned consumer reading what the same paced producer writes,
no join (peers/kafka_consume.hold_delays). It is the floor under any
consumer's delay on this broker. Every job's output is checked exact (Spark
`verify` in full runs, the plain-Python reference join in `--quick`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.bench import ours, report
from streamjoin.bench.adapt_fleet import base_job, constant
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.exact import Verifier, check_exact
from streamjoin.bench.paced import PacedInput
from streamjoin.bench.peers.kafka_consume import hold_delays
from streamjoin.bench.scale import CpuMeter
from streamjoin.launcher import Fleet, wait_drained
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

GOAL_P99_MS = 250.0  # the goal: p99 at 5,000 tuples/s per stream with 2 workers, on this machine
THRESHOLD_MS = 1000.0  # the other benchmarks' "served in time"
CYCLES_METRIC = "streamjoin_batch_seconds"  # observed once per worker cycle (one transaction)
# A span's per-cycle figures need cycles and broker CPU to divide: a short span on a loaded machine
# can see none (a first cycle slow to come, the broker's CPU read in 10 ms clock ticks), so it lasts
# until it has these, however long its planned seconds.
MIN_SPAN_CYCLES = 10
SPAN_GRACE_S = 120.0  # past the planned seconds: a span still short of them then is reported as it is
POLL_S = 0.1


@dataclass(frozen=True)
class DelayPlan:
    verifier: Verifier
    rate: float  # tuples/s per stream
    seconds: float  # the measured span
    warm_s: float  # input flowing before the span begins (windows filling, batch interval settling)
    window_ms: int
    workers: int
    partitions: tuple[int, ...]  # one run each


FULL = DelayPlan(verifier="spark", rate=5000, seconds=60, warm_s=10, window_ms=60_000, workers=2, partitions=(8, 60))
QUICK = DelayPlan(verifier="reference", rate=300, seconds=3, warm_s=1, window_ms=2000, workers=2, partitions=(4,))


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    """Each partition count's joined run and its delivery peer on `env`'s broker (`quick`: the CI
    plan); the report, and with `plot_path` a PNG of the percentiles."""
    plan = QUICK if quick else FULL
    runs: dict[str, dict] = {}
    for partitions in plan.partitions:
        with env.phase(f"{partitions} partitions: 2 workers joining {plan.rate:.0f} tuples/s per stream"):
            ours_run = joined(env, plan, partitions)
        with env.phase(f"{partitions} partitions: raw delivery at the same rate"):
            peer_run = delivery(env, plan, partitions)
        runs[str(partitions)] = {"ours": ours_run, "peer": peer_run}
    result = assemble(plan, quick, runs)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def paced_job(env: BenchEnv, plan: DelayPlan, name: str, partitions: int) -> JobSettings:
    """equijoin.yaml as its own job with `partitions` groups and the plan's window, its key domain
    sized so results are about as many as inputs over the run."""
    steps = [ours.Step(plan.rate, plan.warm_s + plan.seconds)]
    return base_job(env, name, plan.workers, partitions, steps, plan.window_ms, {"placement": "sticky"})


def joined(env: BenchEnv, plan: DelayPlan, partitions: int) -> dict:
    """A fleet fed at the plan's rate: the span's delay, CPU and cycles; the output's verdict."""
    job = paced_job(env, plan, f"delay-{partitions}p", partitions)
    fleet, ids = ours.start_fleet(env, job, plan.workers)
    feed = PacedInput(job, env.bootstrap, constant(plan.rate), seed=job.workload.random_state)
    feed.start()
    time.sleep(plan.warm_s)
    wait_first_cycles(fleet, ids, SPAN_GRACE_S)  # the span measures running workers, not their start
    feed.begin_span()
    since_ms = int(time.time() * 1000)
    load = span_load(env, fleet, ids, plan.seconds)
    until_ms = int(time.time() * 1000)
    feed.stop()
    wait_drained(job, env.bootstrap, fleet, timeout=600)
    fleet.stop_all()
    verdict = check_exact(job, env.cluster, plan.verifier)
    timing = ours.result_timings(env.cluster, job)
    inside = (timing["newest_ms"] >= since_ms) & (timing["newest_ms"] < until_ms)
    return {"job": job.job, "partitions": partitions, "inputs": feed.tuples,
            "delay": report.delay_stats(timing["delay_ms"][inside], THRESHOLD_MS), **load, "verify": verdict}


def span_load(env: BenchEnv, fleet: Fleet, workers: list[str], seconds: float) -> dict:
    """Waits `seconds`, and on until the fleet has done MIN_SPAN_CYCLES cycles and the broker's CPU
    has moved (SPAN_GRACE_S at most); the cores busy of the workers and the broker over the span,
    the workers' cycles per second and mean cycle time, and the broker's CPU per cycle."""
    meter = CpuMeter(fleet, workers, env.bootstrap)
    first, cycles_before = meter.sample(0), fleet_cycles(fleet, workers)
    time.sleep(seconds)
    deadline = time.monotonic() + SPAN_GRACE_S
    while True:
        last, cycles_after = meter.sample(0), fleet_cycles(fleet, workers)
        enough_cycles = cycles_after[0] - cycles_before[0] >= MIN_SPAN_CYCLES
        broker_moved = first.broker_s is None or last.broker_s is None or last.broker_s > first.broker_s
        if enough_cycles and broker_moved or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    span = last.t - first.t
    cycles, cycle_s = (after - before for after, before in zip(cycles_after, cycles_before))
    broker_s = None if first.broker_s is None or last.broker_s is None else last.broker_s - first.broker_s
    return {"seconds": span,
            "cores": {"workers": (last.workers_s - first.workers_s) / span,
                      "broker": None if broker_s is None else broker_s / span},
            "cycles_per_s": cycles / span,
            "cycle_ms_mean": cycle_s / cycles * 1000 if cycles else None,
            "broker_cpu_ms_per_cycle": broker_s / cycles * 1000 if cycles and broker_s is not None else None}


def wait_first_cycles(fleet: Fleet, workers: list[str], timeout_s: float) -> None:
    """Returns once every worker has done a cycle, or after `timeout_s` (the span then shows it)."""
    deadline = time.monotonic() + timeout_s
    while not all(fleet_cycles(fleet, [w])[0] for w in workers) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def fleet_cycles(fleet: Fleet, workers: list[str]) -> tuple[float, float]:
    """The workers' cycles so far and the seconds they took, summed over the fleet."""
    count = total = 0.0
    for w in workers:
        text = ours.metrics_page(fleet.metrics_ports[w])
        for family in text_string_to_metric_families(text):
            if family.name == CYCLES_METRIC:
                for sample in family.samples:
                    if sample.name.endswith("_count"):
                        count += sample.value
                    elif sample.name.endswith("_sum"):
                        total += sample.value
    return count, total


def delivery(env: BenchEnv, plan: DelayPlan, partitions: int) -> dict:
    """The peer: the same paced input read by one consumer with the workers' settings, no join."""
    job = paced_job(env, plan, f"delay-{partitions}p-delivery", partitions)
    topics.ensure(env.cluster.admin(), job)
    held: list[np.ndarray] = []
    stop = threading.Event()
    reader = threading.Thread(target=hold_delays, args=(env.cluster, job, held, stop), daemon=True)
    reader.start()
    feed = PacedInput(job, env.bootstrap, constant(plan.rate), seed=job.workload.random_state)
    feed.start()
    time.sleep(plan.warm_s)
    skip = sum(map(len, held))  # the warm-up's records
    time.sleep(plan.seconds)
    feed.stop()
    deadline = time.monotonic() + 60
    while sum(map(len, held)) < feed.tuples and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join()
    delays = np.concatenate(held)[skip:] if held else np.empty(0)
    return {"job": job.job, "partitions": partitions, "records": int(len(delays)), "inputs": feed.tuples,
            "delay": report.delay_stats(delays, THRESHOLD_MS)}


def assemble(plan: DelayPlan, quick: bool, runs: dict[str, dict]) -> dict:
    """The report: every run, the p99 ratios against delivery, and whether each run met the goal."""
    ratios = {f"p99_{p}p_vs_delivery": report.ratio(r["ours"]["delay"]["p99_ms"], r["peer"]["delay"]["p99_ms"],
                                                    "production delay p99", "ms") for p, r in runs.items()}
    goal = {p: r["ours"]["delay"]["p99_ms"] is not None and r["ours"]["delay"]["p99_ms"] <= GOAL_P99_MS
            for p, r in runs.items()}
    return {"exact": all(r["ours"]["verify"].get("verified") is True for r in runs.values()),
            "parameters": {"mode": "quick" if quick else "full", "verifier": plan.verifier,
                           "rate_per_stream": plan.rate, "seconds": plan.seconds, "warm_s": plan.warm_s,
                           "window_ms": plan.window_ms, "workers": plan.workers, "partitions": list(plan.partitions),
                           "exactly_once": True, "goal_p99_ms": GOAL_P99_MS,
                           "delay": "result produced_ms minus the Kafka timestamp of its newest input"},
           "ours": {p: r["ours"] for p, r in runs.items()},
           "peers": {"delivery": {p: r["peer"] for p, r in runs.items()}},
           "ratios": ratios, "goal_met": goal}


def plot(result: dict, path: Path) -> None:
    """p50/p95/p99 per partition count, ours beside raw delivery, the goal as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:.0f}")
    counts = list(result["ours"])
    quantiles = ("p50_ms", "p95_ms", "p99_ms")
    fig, axes = plt.subplots(1, len(counts), figsize=(4.5 * len(counts), 4.5), squeeze=False)
    for ax, p in zip(axes[0], counts):
        x = np.arange(len(quantiles))
        for shift, (label, stats) in zip((-0.2, 0.2), (("2 workers, joined", result["ours"][p]["delay"]),
                                                      ("raw delivery", result["peers"]["delivery"][p]["delay"]))):
            ax.bar(x + shift, [stats[q] or 0 for q in quantiles], 0.4, label=label)
        ax.axhline(GOAL_P99_MS, color="red", linestyle=":", label=f"goal: p99 <= {GOAL_P99_MS:.0f} ms")
        ax.set_xticks(x, ["p50", "p95", "p99"])
        cores = result["ours"][p]["cores"]
        busy = "" if cores["broker"] is None else f" (broker {cores['broker']:.2f} cores busy)"
        ax.set_title(f"{p} partitions{busy}", fontsize=10)
        ax.set_ylabel("production delay (ms)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    params = result["parameters"]
    fig.suptitle(f"{params['rate_per_stream']:.0f} tuples/s per stream, {params['workers']} workers, exactly-once",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
