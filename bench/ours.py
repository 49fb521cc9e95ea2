"""Our side of a benchmark, for any hash-partitioned job: the rate sweep
(capacity and the delay-versus-rate curve) and the backlog replay (sustained
throughput).

Sweep. One job and one fleet per worker count; Spark `sources` writes a
staircase of rising rates into it, a step at a time, and the workers drain
each step before the next starts. Afterwards Spark `verify` checks the whole
run's output exact, and every result's delay is computed from the results
topic and the inputs' Kafka timestamps (the verifier's definition:
produced_ms minus the timestamp of the result's newest input), so each step
gets exact percentiles, assigned by the arrival of the result's newest
input. The verifier's overall percentiles cross-check them.

Live. `run_live` joins one rate of fresh input as it is written, checked by
Spark `verify` (exact, and every result's production delay). `fleet_delays`
reads the workers' own delay histograms (Prometheus), for runs that only need
counts, means and shares under a bucket edge.

Replay. A second job reads the same input topics from offset 0 with a fresh
fleet: a backlog, so the committed offsets climb as fast as the workers can
join. Its output must equal the verified run's output id for id (same input
topics, so the same result ids). Two rates: sustained (committed offsets
between 10% and 90% done) and from a cold start (launch to every input
committed). `replay` is the same drain with another join
type on the input (its caller checks the output, e.g. an inner replay of a
left join's input against that output less its rows alone).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, ref_columns
from streamjoin.services.io import kafka
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.report import delay_stats, overloaded, sustained_rate
from streamjoin.launcher import Fleet, wait_drained, write_job
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

DELAY_METRIC = "streamjoin_production_delay_seconds"
VERIFY_KEYS = ("verified", "missing", "extra", "duplicates", "bad_ids", "lost", "expected", "results", "inputs",
               "dead_letter", "delay_ms")


# replay's `observe`: (the fleet, still running; progress samples; the processes' start, epoch s) -> figures.
Observer = Callable[[Fleet, list[tuple[float, float]], float], dict]


@dataclass(frozen=True)
class Step:
    rate: float  # target tuples/s per stream
    seconds: float


# ---------------------------------------------------------------- live delay histograms


@dataclass(frozen=True)
class Histogram:
    """A worker's `streamjoin_production_delay_seconds`: cumulative bucket counts (upper edges in
    seconds, +inf last) and the sum. Exact for the count, the mean and the share under a bucket
    edge; percentiles are interpolated within buckets (Prometheus' histogram_quantile), so runs
    that need exact percentiles compute them from the topics (`result_delays`)."""

    edges: np.ndarray
    cumulative: np.ndarray
    total: float

    def __sub__(self, other: "Histogram") -> "Histogram":
        return Histogram(self.edges, self.cumulative - other.cumulative, self.total - other.total)

    def __add__(self, other: "Histogram") -> "Histogram":
        return Histogram(self.edges, self.cumulative + other.cumulative, self.total + other.total)

    @property
    def count(self) -> int:
        return int(self.cumulative[-1])

    def quantile_ms(self, q: float) -> float | None:
        """Linear within the bucket holding rank q; beyond the last finite edge, that edge (a lower bound)."""
        if self.count == 0:
            return None
        rank = q * self.count
        i = int(np.searchsorted(self.cumulative, rank, side="left"))
        if i >= len(self.edges) - 1:
            return float(self.edges[-2] * 1000)
        lo_edge = self.edges[i - 1] if i else 0.0
        lo_count = self.cumulative[i - 1] if i else 0
        inside = self.cumulative[i] - lo_count
        share = (rank - lo_count) / inside if inside else 1.0
        return float((lo_edge + (self.edges[i] - lo_edge) * share) * 1000)

    def stats(self, threshold_s: float) -> dict:
        """delay_stats' keys: exact count, mean and share at or under the threshold (a bucket
        edge); interpolated percentiles."""
        if self.count == 0:
            return {"count": 0, "mean_ms": None, "p50_ms": None, "p95_ms": None, "p99_ms": None,
                    "under_threshold": None}
        at = int(np.searchsorted(self.edges, threshold_s))
        if at >= len(self.edges) or not np.isclose(self.edges[at], threshold_s):
            raise ValueError(f"threshold {threshold_s}s is not a bucket edge of {DELAY_METRIC}: {self.edges}")
        return {"count": self.count, "mean_ms": self.total / self.count * 1000,
                "p50_ms": self.quantile_ms(0.5), "p95_ms": self.quantile_ms(0.95), "p99_ms": self.quantile_ms(0.99),
                "under_threshold": float(self.cumulative[at] / self.count)}


def metrics_page(port: int, wait_s: float = 0.0) -> str:
    """The text of the /metrics page on `port`, retried for up to `wait_s` while nothing listens
    there yet (a process restarted moments before the scrape is still starting)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        except urllib.error.URLError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def scrape_delays(port: int, metric: str = DELAY_METRIC) -> Histogram:
    """One worker's production-delay histogram (or another delay histogram) from its /metrics."""
    text = metrics_page(port)
    buckets: dict[float, float] = {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    edges = np.array(sorted(buckets))
    return Histogram(edges, np.array([buckets[e] for e in edges]), total)


def scrape_counters(port: int, names: Sequence[str], by: str | None = None) -> dict[str, float]:
    """One process's counters (or gauges) named `names` (sample names: a counter's end in _total)
    from its /metrics, each summed over its labels, or with `by` per value of that label (keys
    "name:value"); a name it does not export counts 0 (without `by`) or is absent."""
    text = metrics_page(port)
    out = {} if by else dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                key = f"{sample.name}:{sample.labels.get(by, '')}" if by else sample.name
                out[key] = out.get(key, 0.0) + sample.value
    return out


def fleet_delays(fleet: Fleet, workers: Sequence[str], metric: str = DELAY_METRIC) -> Histogram:
    """The fleet's histograms summed: scrape before and after a stretch and subtract."""
    hists = [scrape_delays(fleet.metrics_ports[w], metric) for w in workers]
    out = hists[0]
    for h in hists[1:]:
        out = out + h
    return out


# ---------------------------------------------------------------- fleets


def start_fleet(env: BenchEnv, job: JobSettings, workers: int, wait: bool = True) -> tuple[Fleet, list[str]]:
    """Topics, coordinator and `workers` workers on `job` (and their ids); with `wait`, returns once
    every group is placed."""
    job_dir = env.workdir / job.job
    topics.ensure(env.cluster.admin(), job)
    fleet = Fleet(job, write_job(job, job_dir / "job.yaml"), env.bootstrap, job_dir / "logs")
    env.stack.callback(fleet.stop_all)
    ids = [f"worker-{i}" for i in range(workers)]
    fleet.start_coordinator()
    for w in ids:
        fleet.start_worker(w)
    if wait:
        fleet.wait_assigned(ids)
    return fleet, ids


def drained_and_verified(env: BenchEnv, job: JobSettings, fleet: Fleet, seconds: float, what: str) -> tuple[int, dict]:
    """Once `fleet` has drained the input written live over `seconds`: the fleet stopped (so
    that verify gets the cores), its restarts and Spark `verify`'s report on the whole output."""
    from streamjoin.services.spark.verify import run_verify

    wait_drained(job, env.bootstrap, fleet, timeout=max(300.0, 10 * seconds))
    fleet.assert_running()
    restarts = fleet.restarts
    fleet.stop_all()
    with env.phase(f"Spark verify of {what}"):
        return restarts, run_verify(job, env.cluster)


def run_live(env: BenchEnv, job: JobSettings, workers: int, rate: float, seconds: float, what: str,
             keys: Sequence[str] = ()) -> dict:
    """A fleet of `workers` on fresh input that Spark `sources` writes at `rate` tuples/s per
    stream for `seconds`, event time the wall clock; Spark `verify`'s report on the output
    (VERIFY_KEYS and `keys`), and when the run began. `what`: the run, for the progress lines."""
    from streamjoin.services.spark.sources import run_sources

    fleet, ids = start_fleet(env, job, workers, wait=False)
    env.spark  # Spark's JVM starts (seconds) while the fleet's processes do
    fleet.wait_assigned(ids)
    began_ms = int(time.time() * 1000)
    produced = run_sources(job, env.cluster, seconds=seconds, rate=rate)
    restarts, verdict = drained_and_verified(env, job, fleet, seconds, what)
    return {"job": job.job, "workers": workers, "inputs": sum(produced["records"].values()),
            "rate_per_stream": float(np.mean(list(produced["rate"].values()))), "began_ms": began_ms,
            "restarts": restarts, "verify": {k: verdict.get(k) for k in (*VERIFY_KEYS, *keys)}}


def live_then_replays(env: BenchEnv, job: JobSettings, workers: Sequence[int], rate: float, seconds: float,
                      live_run: Callable[[], dict]) -> tuple[dict, dict[int, dict]]:
    """`live_run()`: the live run's report (a fleet of `workers[0]` on input written at `rate`
    tuples/s per stream for `seconds`); then `job`'s input replayed as a backlog by a fresh
    fleet of each count in `workers` (run_replay), by count."""
    with env.phase(f"our live run: {workers[0]} worker(s), {rate:.0f} tuples/s per stream for {seconds:.0f}s"):
        live = live_run()
    replays = {}
    for k in workers:
        with env.phase(f"our backlog replay with {k} worker(s)"):
            replays[k] = run_replay(env, job, k)
    return live, replays


def figures(live: dict, replays: dict[int, dict]) -> tuple[dict, bool]:
    """A report's `ours` from `live_then_replays`: throughput by worker count, the live run's
    production delay, both runs; and whether all was exact (the live run verified, every
    replay identical to it)."""
    exact = bool(live["verify"]["verified"] and all(r["identical_to_verified_run"] for r in replays.values()))
    return {"throughput_tuples_per_s": {str(k): r["tuples_per_s"] for k, r in replays.items()},
            "delay_ms": live["verify"]["delay_ms"], "live": live,
            "replays": {str(k): r for k, r in replays.items()}}, exact


def fleet_job(job: JobSettings, env: BenchEnv, name: str, workers: int) -> JobSettings:
    """`job` renamed (own results, control and consumer group), with its own state and expected workers."""
    return job.model_copy(update={
        "job": name, "bootstrap": env.bootstrap,
        "worker": job.worker.model_copy(update={"state_dir": env.workdir / name / "state"}),
        "coordinator": job.coordinator.model_copy(update={"expected_workers": workers}),
    })


# ---------------------------------------------------------------- the sweep


def run_sweep(env: BenchEnv, job: JobSettings, workers: int, steps: Sequence[Step], threshold_s: float) -> dict:
    """The whole staircase on a fresh fleet of `workers`: every step, so the curve shows the
    knee and the key domain planned for the whole staircase holds; returns the steps with
    exact delays, the verifier's report and how often a worker had to be restarted."""
    from streamjoin.services.spark.sources import run_sources
    from streamjoin.services.spark.verify import run_verify

    fleet, _ = start_fleet(env, job, workers)
    done: list[dict] = []
    for i, step in enumerate(steps):
        env.console.print(f"[bold cyan]bench[/] {workers} worker(s): step {i + 1}/{len(steps)}, "
                          f"{step.rate:.0f} tuples/s per stream for {step.seconds:.0f}s")
        began_ms = time.time() * 1000
        # A seed per step: every step draws fresh keys, not the previous step's again.
        step_job = job.model_copy(update={"workload": job.workload.model_copy(update={"random_state": job.workload.random_state + i})})
        produced = run_sources(step_job, env.cluster, seconds=step.seconds, rate=step.rate)
        written_ms = time.time() * 1000
        wait_drained(job, env.bootstrap, fleet, timeout=max(300.0, 20 * step.seconds))
        done.append(_step_record(step, produced, began_ms, written_ms, time.time() - written_ms / 1000))
    fleet.assert_running()
    restarts = fleet.restarts
    fleet.stop_all()
    with env.phase(f"Spark verify of the {workers}-worker sweep"):
        verdict = run_verify(job, env.cluster)
    delays_ms, newest_ms = result_delays(env.cluster, job)
    _judge_steps(done, delays_ms, newest_ms, threshold_s * 1000)
    inputs = verdict["inputs"]["total"]
    return {"job": job.job, "workers": workers, "steps": done, "restarts": restarts,
            "output_per_input": verdict["results"] / inputs if inputs else None,
            "delay_all_steps": delay_stats(delays_ms, threshold_s * 1000),
            "verify": {k: verdict.get(k) for k in VERIFY_KEYS}}


def _step_record(step: Step, produced: dict, began_ms: float, written_ms: float, drain_s: float) -> dict:
    return {
        "target_rate_per_stream": step.rate,
        "rate_per_stream": float(np.mean(list(produced["rate"].values()))),
        "seconds": produced["seconds"],
        "inputs": sum(produced["records"].values()),
        "wall_ms": [int(began_ms), int(written_ms)],
        "drain_after_sources_s": round(drain_s, 2),
    }


def _judge_steps(steps: list[dict], delays_ms: np.ndarray, newest_ms: np.ndarray, threshold_ms: float) -> None:
    """Each step's exact delays: the results whose newest input arrived during the step."""
    starts = np.array([s["wall_ms"][0] for s in steps])
    step_of = np.searchsorted(starts, newest_ms, side="right") - 1
    for i, step in enumerate(steps):
        step["delay"] = delay_stats(delays_ms[step_of == i], threshold_ms)
        step["overloaded"] = overloaded(step["delay"])


# ---------------------------------------------------------------- the replay


def run_replay(env: BenchEnv, source: JobSettings, workers: int, output_format: str | None = None) -> dict:
    """Sustained throughput: a fresh fleet drains `source`'s whole input as a backlog, writing
    results in `output_format` (default: the job's); its output must be `source`'s verified
    output, id for id."""
    figures, ids = replay(env, source, workers, output_format)
    return {**figures, "identical_to_verified_run": bool(np.array_equal(ids, result_ids(env.cluster, source)))}


def replay_job(env: BenchEnv, source: JobSettings, workers: int, output_format: str | None = None,
               join_type: str | None = None, name: str | None = None, coordinator: dict | None = None) -> JobSettings:
    """The job `replay` runs: `source`'s input topics under its own name (default: derived from
    the source's, the count, the format and the join type), writing `output_format` and joining
    `join_type` (defaults: the source's), with `coordinator` settings over the source's."""
    fmt = output_format or source.output.format
    suffix = f"-{join_type}" if join_type else ""
    job = fleet_job(source, env, name or f"{source.job}-replay{workers}-{fmt}{suffix}", workers).model_copy(update={
        "streams": [s.model_copy(update={"topic": source.topic_of(s)}) for s in source.streams],
        "output": source.output.model_copy(update={"format": fmt}),
        "join": source.join.model_copy(update={"type": join_type or source.join.type})})
    return job.model_copy(update={"coordinator": job.coordinator.model_copy(update=coordinator or {})})


def replay(env: BenchEnv, source: JobSettings, workers: int, output_format: str | None = None,
           join_type: str | None = None, name: str | None = None, coordinator: dict | None = None,
           observe: Observer | None = None) -> tuple[dict, np.ndarray]:
    """A fresh fleet of `workers` drains `source`'s whole input as a backlog (the job
    `replay_job` makes of the arguments); its figures (sustained tuples/s) and its result ids
    (result_ids), for the caller to check.

    observe: called once drained, before the fleet stops (its metrics are still up), with the
    fleet, the progress samples (seconds since the processes started, tuples committed) and that
    start as epoch seconds; its dict joins the figures."""
    job = replay_job(env, source, workers, output_format, join_type, name, coordinator)
    fmt = job.output.format
    samples: list[tuple[float, float]] = []
    began, began_wall = time.monotonic(), time.time()
    # Sampling starts with the processes: the 10%-90% cut then leaves start-up out, however short the backlog.
    fleet, _ = start_fleet(env, job, workers, wait=False)
    wait_drained(job, env.bootstrap, fleet, timeout=3600,
                 on_progress=lambda done, total: samples.append((time.monotonic() - began, done)))
    fleet.assert_running()
    observed = observe(fleet, samples, began_wall) if observe is not None else {}
    restarts = fleet.restarts
    fleet.stop_all()
    ids = result_ids(env.cluster, job)
    total = samples[-1][1] if samples else 0
    wall = samples[-1][0] if samples else None
    # Cold start: launch to the sample that saw every input committed, with its results.
    return {"job": job.job, "workers": workers, "output_format": fmt, "join_type": job.join.type,
            "inputs": int(total), "wall_seconds": round(wall, 2) if wall else None,
            "cold_start_tuples_per_s": total / wall if wall else None,
            "tuples_per_s": sustained_rate(samples), "restarts": restarts, "results": int(len(ids)),
            **observed}, ids


# ---------------------------------------------------------------- reading the topics back


def read_results(cluster: kafka.Cluster, job: JobSettings, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The given columns of every result in the job's results topic, in its output format."""
    records = kafka.read_partitions(cluster, job.results_topic, dict.fromkeys(range(job.group_count), 0),
                                    f"{job.consumer_group}-bench-read")
    decoded = decode_results(result_layout(job), job.output.format, [m.value() for m in records])
    if decoded.rejects:
        raise ValueError(f"{len(decoded.rejects)} records of {job.results_topic} are no results: {decoded.rejects[:3]}")
    return {c: decoded.columns[c] for c in columns}


def result_ids(cluster: kafka.Cluster, job: JobSettings) -> np.ndarray:
    """Every result's 128-bit id as sorted (hi, lo) rows."""
    ids = read_results(cluster, job, [RESULT_ID_HI, RESULT_ID_LO])
    pairs = np.stack([ids[RESULT_ID_HI], ids[RESULT_ID_LO]], axis=1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def arrivals(cluster: kafka.Cluster, job: JobSettings, topic: str) -> tuple[np.ndarray, np.ndarray]:
    """(partition << 40 | offset) sorted, and the Kafka timestamp of each, for every record of `topic`."""
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                    f"{job.consumer_group}-bench-arrivals")
    ref = np.array([(m.partition() << 40) | m.offset() for m in records], np.int64)
    ts = np.array([m.timestamp()[1] for m in records], np.int64)
    order = np.argsort(ref)
    return ref[order], ts[order]


def result_delays(cluster: kafka.Cluster, job: JobSettings) -> tuple[np.ndarray, np.ndarray]:
    """Per result: production delay (ms) and the Kafka timestamp of its newest input."""
    timing = result_timings(cluster, job)
    return timing["delay_ms"], timing["newest_ms"]


def result_timings(cluster: kafka.Cluster, job: JobSettings) -> dict[str, np.ndarray]:
    """Per result, in one read of the topics: `delay_ms` (produced_ms minus `newest_ms`, the
    Kafka timestamp of its newest input), `produced_ms`, and `group`: its first stream's input
    partition, which is its partition group when the inputs are co-partitioned."""
    refs = [c for s in job.streams for c in ref_columns(s.name)[:2]]
    res = read_results(cluster, job, [PRODUCED_MS, *refs])
    newest = np.full(len(res[PRODUCED_MS]), np.iinfo(np.int64).min)
    for spec in job.streams:
        keys, ts = arrivals(cluster, job, job.topic_of(spec))
        part, off = (res[c].astype(np.int64) for c in ref_columns(spec.name)[:2])
        newest = np.maximum(newest, ts[np.searchsorted(keys, (part << 40) | off)])
    produced = res[PRODUCED_MS].astype(np.int64)
    return {"delay_ms": (produced - newest).astype(np.float64), "newest_ms": newest, "produced_ms": produced,
            "group": res[refs[0]].astype(np.int64)}
