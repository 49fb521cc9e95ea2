"""`streamjoin bench equijoin --scale 1,2,4,8,12`: the scale-out curve of the
hash-partitioned equijoin on one pre-loaded backlog, so anyone with a bigger
machine can reproduce it.

1. **Backlog.** `backlog.preload` writes the equijoin workload (64-byte JSON
   tuples, b-model keys with bias 0.7, Poisson arrivals) into the input
   topics with several producer processes, no Spark: the full plan writes
   about 20M tuples spanning 32 minutes of event time against the 10-minute
   window, so windows fill and expire during every drain; `--quick` writes
   60k tuples over 30 s against a 5 s window on 12 partitions with one
   producer process.
2. **Drains.** For each worker count k, a fresh job (own name, results,
   consumer group and state) reads the same input topics with a fresh fleet
   of k workers. Its committed offsets are sampled every 0.1 s with the CPU
   seconds (user + system, psutil) of its workers, its coordinator and the
   broker process. Throughput and CPU are taken between the first sample that shows
   a committed offset and the one that shows every input committed: the
   processes' start-up is left out. CPU per tuple is CPU seconds over that
   span divided by the tuples committed in it (µs per tuple, that is CPU
   seconds per million tuples).
3. **Exactness.** The result ids of every k are read back: each run must
   hold no duplicate and the same set as every other run (a SHA-256 over
   the sorted ids; the ids are hashes of the inputs' topic, partition and
   offset, so runs over the same topics agree id for id). The quick plan
   also runs engine/reference.py over the inputs read back from Kafka and
   compares its result ids.
4. **Raw consumption.** `kafka_consume` reads the same topics with the
   workers' consumer settings: the delivery limit any consumer of these
   topics lives under, and each k's ratio to it.

Speedup is each k's tuples/s over the smallest k's, beside the ideal
k / k_min. Tansu keeps every record in memory until it exits: the full plan
holds the backlog (1.4 GB) plus each run's results (about 20M JSON records
of 374 bytes, 7.5 GB, per k); each run reports its `result_bytes`.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil
import pyarrow as pa
from confluent_kafka import TopicPartition

from streamjoin.bench import equijoin, ours, report
from streamjoin.bench.backlog import BacklogPlan, preload
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.peers import kafka_consume
from streamjoin.bench.peers.reference import ref_tuples
from streamjoin.engine.block import OFF, PART
from streamjoin.engine.reference import RefWindow, reference_join
from streamjoin.engine.result_ids import result_ids
from streamjoin.launcher import Fleet, forwarded_partitions, input_end_offsets
from streamjoin.schemas.codecs import DECODERS
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RESULT_ID_HI, RESULT_ID_LO
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, load

_READ_PARTITIONS = 8  # results partitions read back at a time: bounds the records held at once
SAMPLE_S = 0.1  # a drain's sampling period: one OffsetFetch request and a psutil read of each process


@dataclass(frozen=True)
class ScalePlan:
    """backlog: what is preloaded; window_ms: every stream's window; partitions: of every topic;
    consume_repeats: raw-consume reads (the median is reported); reference: check the result ids
    against engine/reference.py (naive Python: small backlogs only); drain_timeout_s: per drain."""

    backlog: BacklogPlan
    window_ms: int
    partitions: int
    consume_repeats: int
    reference: bool
    drain_timeout_s: float


FULL = ScalePlan(BacklogPlan(tuples=20_000_000, event_ms=32 * 60_000, producers=8), window_ms=600_000,
                 partitions=60, consume_repeats=3, reference=False, drain_timeout_s=3600.0)
QUICK = ScalePlan(BacklogPlan(tuples=20_000, event_ms=30_000, producers=1, chunk_tuples=5_000), window_ms=5_000,
                  partitions=12, consume_repeats=1, reference=True, drain_timeout_s=300.0)


def plan_for(quick: bool) -> ScalePlan:
    return QUICK if quick else FULL


def parse_workers(text: str, limit: int) -> tuple[int, ...]:
    """`--scale` as typed, e.g. "1,2,4,8,12": worker counts, distinct and ascending.

    text: comma-separated integers in 1..limit (spaces allowed); limit: the plan's partitions
    (a worker beyond them would hold no group). Raises ValueError naming what was wrong."""
    return report.parse_counts(text, "--scale", limit, "1,2,4,8,12", "worker counts", " (the partitions of this plan)")


def run(env: BenchEnv, quick: bool, plot_path: Path | None, worker_counts: Sequence[int] = (1, 2),
        plan: ScalePlan | None = None) -> dict:
    """Preload once, drain it with each of `worker_counts` workers, read it raw; the report (a
    bench workload's `run`, so `bench.run_bench` frames it like every other).

    plan: the sizes (default: QUICK with `quick`, else FULL)."""
    plan = plan or plan_for(quick)
    job = scale_job(plan, env)
    cluster = kafka.Cluster.of(job, env.bootstrap)
    # The backlog ends a minute before now: no tuple is ahead of the workers' clock (join.max_future_ms).
    start_ms = (int(time.time()) - 60) * 1000 - plan.backlog.event_ms
    with env.phase(f"preloading about {plan.backlog.tuples:,} tuples with {plan.backlog.producers} producers"):
        loaded = preload(job, cluster, plan.backlog, start_ms, env.console)
    runs = {}
    for k in worker_counts:
        with env.phase(f"draining the backlog with {k} worker(s)"):
            runs[k] = drain(env, job, k, plan.drain_timeout_s)
    with env.phase("kafka_consume peer: the raw-consume limit of the same topics"):
        consume = kafka_consume.run_kafka_consume(cluster, job.input_topics, job.partitions, plan.consume_repeats)
    floor = None
    if plan.reference:
        with env.phase("reference join over the inputs read back"):
            floor = reference_results(cluster, job)
    result = assemble(job, plan, quick, loaded, runs, consume, floor)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def scale_job(plan: ScalePlan, env: BenchEnv) -> JobSettings:
    """equijoin.yaml (and STREAMJOIN_* overrides) with the plan's window and partitions, the key
    domain that makes output about as large as input over the backlog, on the run's broker."""
    from streamjoin.job_files import default_job_file

    job = load(default_job_file())
    rate = plan.backlog.rate(len(job.streams))
    job = equijoin.with_window(job, plan.window_ms, [ours.Step(rate, plan.backlog.event_ms / 1000)])
    return ours.fleet_job(job.model_copy(update={"partitions": plan.partitions}), env, "equijoin-scale", 1)


# ---------------------------------------------------------------- one drain


@dataclass(frozen=True)
class Sample:
    """One look at a drain: seconds since the fleet started, inputs committed, and the CPU
    seconds so far of the workers (summed), the coordinator and the broker (None: not found)."""

    t: float
    done: int
    workers_s: float
    coordinator_s: float
    broker_s: float | None


class CpuMeter:
    """Samples a fleet's progress with the CPU seconds of its processes and the broker's."""

    def __init__(self, fleet: Fleet, workers: Sequence[str], bootstrap: str) -> None:
        self.workers = [psutil.Process(fleet.procs[w].pid) for w in workers]
        self.coordinator = psutil.Process(fleet.procs["coordinator"].pid)
        self.broker = broker_process(bootstrap)
        self.began = time.monotonic()

    def sample(self, done: int) -> Sample:
        return Sample(time.monotonic() - self.began, done, sum(map(cpu_seconds, self.workers)),
                      cpu_seconds(self.coordinator), cpu_seconds(self.broker) if self.broker else None)


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of `process` so far; NaN once it is gone (a restarted worker)."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return float("nan")
    return times.user + times.system


def broker_process(bootstrap: str) -> psutil.Process | None:
    """The embedded broker serving `bootstrap`: the child of this process listening on its port."""
    port = bootstrap.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "--listener-url" in cmd and cmd[cmd.index("--listener-url") + 1].endswith(f":{port}"):
            return child
    return None


def reader_job(source: JobSettings, env: BenchEnv, workers: int) -> JobSettings:
    """A fresh job (own results, consumer group, state) on `source`'s input topics, for `workers`."""
    job = ours.fleet_job(source, env, f"{source.job}-{workers}w", workers)
    return job.model_copy(update={"streams": [s.model_copy(update={"topic": source.topic_of(s)})
                                              for s in source.streams]})


def drain(env: BenchEnv, source: JobSettings, workers: int, timeout_s: float) -> dict:
    """A fresh fleet of `workers` drains `source`'s input; its throughput, CPU and result fingerprint."""
    job = reader_job(source, env, workers)
    fleet, ids = ours.start_fleet(env, job, workers, wait=False)
    samples = sample_drain(job, env.bootstrap, fleet, CpuMeter(fleet, ids, env.bootstrap), timeout_s)
    fleet.assert_running()
    restarts = fleet.restarts
    fleet.stop_all()
    return {"job": job.job, "workers": workers, "restarts": restarts, **drain_figures(samples),
            **read_back(kafka.Cluster.of(job, env.bootstrap), job)}


def sample_drain(job: JobSettings, bootstrap: str, fleet: Fleet, meter: CpuMeter, timeout_s: float) -> list[Sample]:
    """`meter`'s samples every SAMPLE_S until the job has committed every input record (the input's
    end offsets as of the start: a backlog does not grow), then every record it re-routed through
    its by-key topics (final once the inputs are committed). Raises TimeoutError after `timeout_s`."""
    ends = input_end_offsets(job, bootstrap)
    total = sum(ends.values())
    cluster = kafka.Cluster.of(job, bootstrap)
    # One consumer of the job's group, never subscribed, asks for its committed offsets: one
    # OffsetFetch request per sample, where launcher.wait_drained builds a client per look.
    consumer = cluster.consumer(job.consumer_group)
    forwarded: dict[tuple[str, int], int] = {}
    samples: list[Sample] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if time.monotonic() > deadline:
                left = total - samples[-1].done if samples else total
                raise TimeoutError(f"{job.job}: {left} of {total} inputs (or re-routed records) still uncommitted "
                                   f"after {timeout_s:.0f}s; services' last warnings: {fleet.complaints()}")
            fleet.assert_running()
            wanted = ends | forwarded
            committed = {(tp.topic, tp.partition): max(tp.offset, 0)
                         for tp in consumer.committed([TopicPartition(t, p) for t, p in wanted], timeout=30)}
            samples.append(meter.sample(sum(min(committed[k], end) for k, end in ends.items())))
            if samples[-1].done >= total:
                if not forwarded and forwarded_partitions(job):
                    forwarded = {k: e for k, e in kafka.end_offsets(cluster, forwarded_partitions(job),
                                                                    f"{job.consumer_group}-probe").items() if e}
                    if forwarded:
                        continue
                if all(committed.get(k, 0) >= end for k, end in forwarded.items()):
                    break
            time.sleep(SAMPLE_S)
    finally:
        consumer.close()
    return samples


def drain_figures(samples: Sequence[Sample]) -> dict:
    """Throughput and CPU between the first sample showing a commit and the last (every input
    committed). A drain done within one sample falls back to the sample before it."""
    last = samples[-1]
    first = next(i for i, s in enumerate(samples) if s.done > 0)
    start = samples[first - 1 if samples[first].done == last.done and first else first]
    tuples, seconds = last.done - start.done, last.t - start.t
    workers_s = last.workers_s - start.workers_s
    broker_s = None if last.broker_s is None or start.broker_s is None else last.broker_s - start.broker_s
    return {
        "inputs": int(last.done), "drain_seconds": round(seconds, 2), "drained_tuples": int(tuples),
        "tuples_per_s": _per(tuples, seconds),
        "tuples_per_s_10_90": report.sustained_rate([(s.t, s.done) for s in samples]),
        "cpu": {"workers_s": _finite(workers_s), "coordinator_s": _finite(last.coordinator_s - start.coordinator_s),
                "broker_s": broker_s,
                "workers_us_per_tuple": _per(workers_s * 1e6, tuples),
                "broker_us_per_tuple": None if broker_s is None else _per(broker_s * 1e6, tuples),
                "workers_cores_busy": _per(workers_s, seconds),
                "broker_cores_busy": None if broker_s is None else _per(broker_s, seconds),
                "workers_since_start_s": _finite(last.workers_s)},
    }


def _per(a: float, b: float) -> float | None:
    return a / b if b > 0 and np.isfinite(a) else None


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


# ---------------------------------------------------------------- exactness


def read_back(cluster: kafka.Cluster, job: JobSettings) -> dict:
    """`job`'s results read back a few partitions at a time (bounding the records held at once):
    the fingerprint of their ids and the bytes of their records (what the broker holds per run)."""
    layout, got, size = result_layout(job), [], 0
    for lo in range(0, job.partitions, _READ_PARTITIONS):
        starts = dict.fromkeys(range(lo, min(lo + _READ_PARTITIONS, job.partitions)), 0)
        values = [m.value() for m in kafka.read_partitions(cluster, job.results_topic, starts,
                                                            f"{job.consumer_group}-bench-read")]
        decoded = decode_results(layout, job.output.format, values)
        if decoded.rejects:
            raise ValueError(f"{len(decoded.rejects)} records of {job.results_topic} are no results: "
                             f"{decoded.rejects[:3]}")
        got.append(np.stack([decoded.columns[RESULT_ID_HI], decoded.columns[RESULT_ID_LO]], axis=1))
        size += sum(map(len, values))
    ids = sorted_ids(np.concatenate(got) if got else np.empty((0, 2), np.uint64))
    return {"fingerprint": fingerprint(ids), "result_bytes": size}


def sorted_ids(ids: np.ndarray) -> np.ndarray:
    """(hi, lo) id rows (n x 2) sorted by hi then lo, as contiguous uint64: what `fingerprint` hashes."""
    return np.ascontiguousarray(ids[np.lexsort((ids[:, 1], ids[:, 0]))].astype(np.uint64))


def fingerprint(ids: np.ndarray) -> dict:
    """Sorted (hi, lo) id rows -> results, duplicates and a SHA-256 of the rows: equal digests, equal sets."""
    duplicates = int(np.count_nonzero((ids[1:] == ids[:-1]).all(axis=1))) if len(ids) else 0
    return {"results": int(len(ids)), "duplicates": duplicates, "sha256": hashlib.sha256(ids.tobytes()).hexdigest()}


def input_tables(cluster: kafka.Cluster, job: JobSettings) -> dict[str, pa.Table]:
    """Every input tuple as the reference peer reads it: partition, offset, key and time fields."""
    tables = {}
    for spec in job.streams:
        topic = job.topic_of(spec)
        records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                        f"{job.consumer_group}-bench-inputs")
        part = np.array([m.partition() for m in records], np.int32)
        off = np.array([m.offset() for m in records], np.int64)
        decoded = DECODERS[spec.format](spec, [m.value() for m in records], part, off, np.zeros(len(off), np.int64))
        if decoded.rejects:
            raise ValueError(f"{len(decoded.rejects)} records of {topic} are no tuples: {decoded.rejects[:3]}")
        block = decoded.block
        tables[spec.name] = pa.table({"partition": block[PART], "offset": block[OFF],
                                      **{f: block[f] for f in [*spec.key_fields, spec.time_field]}})
    return tables


def reference_results(cluster: kafka.Cluster, job: JobSettings) -> dict:
    """engine/reference.py's join of the inputs read back from Kafka: its result count and the
    fingerprint of the ids its results would carry."""
    combos = reference_join(ref_tuples(job, input_tables(cluster, job)),
                            [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams])
    m = len(job.streams)
    refs = np.array([[n for ref in combo for n in ref[1:]] for combo in combos], np.int64).reshape(len(combos), 2 * m)
    hi, lo = result_ids(job.input_topics, [refs[:, 2 * i] for i in range(m)], [refs[:, 2 * i + 1] for i in range(m)])
    return {"how": "engine/reference.py reference_join over every input read back from Kafka, one process",
            "fingerprint": fingerprint(sorted_ids(np.stack([hi, lo], axis=1)))}


# ---------------------------------------------------------------- the report


def assemble(job: JobSettings, plan: ScalePlan, quick: bool, loaded: dict, runs: dict[int, dict], consume: dict,
             floor: dict | None) -> dict:
    """The report: each k's run and the curve, the raw-consume peer, ratios, and the verdict."""
    base = min(runs)
    digests = {r["fingerprint"]["sha256"] for r in runs.values()}
    if floor is not None:
        floor = {**floor, "ids_equal": digests == {floor["fingerprint"]["sha256"]}}
    exact = (len(digests) == 1 and all(r["fingerprint"]["duplicates"] == 0 and r["fingerprint"]["results"] > 0
                                       for r in runs.values()) and (floor is None or floor["ids_equal"]))
    ratios = {}
    for k, r in runs.items():
        ratios[f"speedup_{k}w_vs_{base}w"] = report.ratio(r["tuples_per_s"], runs[base]["tuples_per_s"],
                                                          f"backlog throughput, {k} vs {base} worker(s)", "tuples/s")
        ratios[f"throughput_{k}w_vs_kafka_consume"] = report.ratio(
            r["tuples_per_s"], consume["tuples_per_s"], "backlog throughput vs raw consumption of the same topics",
            "tuples/s")
    return {"workload": "equijoin", "run": "scale", "exact": exact, "parameters": parameters(job, plan, quick, runs),
            "backlog": loaded,
            "ours": {"curve": [curve_point(k, runs[k], runs[base], base) for k in sorted(runs)],
                     "throughput_tuples_per_s": {str(k): r["tuples_per_s"] for k, r in runs.items()},
                     "runs": {str(k): r for k, r in runs.items()},
                     "same_results_every_k": len(digests) == 1},
            "peers": {"kafka_consume": consume,
                      "reference": floor or {"ran": False, "why": "naive nested loops: run on the quick plan only"}},
            "ratios": ratios}


def curve_point(k: int, run: dict, base_run: dict, base: int) -> dict:
    """One row of the curve: tuples/s, speedup over the smallest count and the ideal, CPU per tuple."""
    speedup = report.ratio(run["tuples_per_s"], base_run["tuples_per_s"], "speedup", "tuples/s")["ratio"]
    cpu = run["cpu"]
    return {"workers": k, "tuples_per_s": run["tuples_per_s"], "speedup": speedup, "ideal": k / base,
            "efficiency": None if speedup is None else speedup / (k / base),
            "worker_cpu_us_per_tuple": cpu["workers_us_per_tuple"], "broker_cpu_us_per_tuple": cpu["broker_us_per_tuple"],
            "worker_cores_busy": cpu["workers_cores_busy"], "broker_cores_busy": cpu["broker_cores_busy"]}


def parameters(job: JobSettings, plan: ScalePlan, quick: bool, runs: dict[int, dict]) -> dict:
    w, b = job.workload, plan.backlog
    return {
        "mode": "quick" if quick else "full", "streams": [s.name for s in job.streams],
        "window_ms": plan.window_ms, "partitions": job.partitions, "tuple_bytes": w.tuple_bytes, "skew": w.skew,
        "domain": w.domain, "random_state": w.random_state, "batch_ms": job.worker.batch_ms,
        "allowed_lateness_ms": job.join.allowed_lateness_ms, "exactly_once": job.worker.exactly_once,
        "output_format": job.output.format, "worker_counts": sorted(runs),
        "backlog": {"tuples": b.tuples, "event_ms": b.event_ms, "rate_per_stream": b.rate(len(job.streams)),
                    "producers": b.producers, "arrivals": "Poisson", "keys": "b-model",
                    "generator": "bench/backlog.py (NumPy, Arrow JSON, murmur2 partitions), no Spark"},
        "timing": "from the first sample showing a committed offset to the one showing every input committed "
                  f"(a sample every {SAMPLE_S} s plus the time it takes)",
        "cpu": "psutil user + system seconds of the processes over the same span; us per tuple = CPU s per million",
    }


def plot(result: dict, path: Path) -> None:
    """Tuples/s per worker count beside the raw-consume limit, and speedup beside the ideal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["ours"]["curve"]
    k = [p["workers"] for p in curve]
    fig, (rate_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    rate_ax.plot(k, [p["tuples_per_s"] for p in curve], "o-", label="ours: backlog drained")
    rate_ax.axhline(result["peers"]["kafka_consume"]["tuples_per_s"], color="grey", linestyle="--",
                    label="raw consume, one consumer (kafka_consume)")
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_xlabel("workers")
    rate_ax.set_ylabel("tuples/s")
    speed_ax.plot(k, [p["speedup"] for p in curve], "o-", label="speedup")
    speed_ax.plot(k, [p["ideal"] for p in curve], ":", color="grey", label="ideal")
    speed_ax.set_xlabel("workers")
    speed_ax.set_ylabel(f"speedup over {k[0]} worker(s)")
    p = result["parameters"]
    fig.suptitle(f"equijoin scale-out ({p['mode']}): {result['backlog']['tuples']:,} tuples, {p['partitions']} "
                 f"partitions, {p['window_ms'] // 1000}s window; {os.cpu_count()} cores", fontsize=10)
    for ax in (rate_ax, speed_ax):
        ax.set_xticks(k)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
