"""Workload `window`: a tumbling-window equi-join in hash mode, beside Spark Structured
Streaming's windowed stream-stream join and PyFlink's window join on the same input.

The equijoin workload's two streams (equijoin.yaml: r and s, 64-byte JSON tuples, Poisson
arrivals, b-model keys with bias 0.7, written by Spark `sources` with event time the wall
clock), every stream's window `{tumbling_ms: W}`: a result is a pair of same-key tuples of one
instance [k * W, (k + 1) * W), emitted with its window_start and window_end. The key domain
makes the results about as many as the input tuples (equijoin.domain_for: a tumbling window
of W pairs each tuple with the other stream's tuples of its instance, as many as a sliding
window of W / 2 on either side does).

  ours     a live run: a fleet of the plan's first worker count joins the input as it is
           written at the plan's rate; Spark `verify` checks its output exact (its window
           oracle) and gives its production delay (p50/p95/p99): produced_ms minus the Kafka
           timestamp of the result's newest input. A result comes out as soon as its second
           member is in, so that is the batch interval and the join, not the window's end.
           Then the same topics drained as a backlog by a fresh fleet of each worker count:
           sustained throughput, each output id for id the verified one.
  peers    window_peers.py on the same input, exported from the topics: Spark's windowed join
           and PyFlink's window join (when STREAMJOIN_PYFLINK_PYTHON names its venv), each
           judged pair by pair against the oracle's results, with its backlog throughput.

`--quick` is the same harness, small enough for CI: a 2 s window, 500 tuples/s per stream for
3 s, 4 partitions, 1 worker, Spark's backlog 10 files (2 s of event time) per trigger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from streamjoin.bench import equijoin, ours, report, window_peers
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import export_inputs
from streamjoin.settings import JobSettings, WindowSpec, load


@dataclass(frozen=True)
class WindowPlan:
    window_ms: int  # every stream's tumbling_ms
    rate: float  # tuples/s per stream of the live run
    seconds: float  # of live input
    partitions: int
    workers: tuple[int, ...]  # a backlog replay with each count; the first also runs live
    spark_files_per_trigger: int  # Spark's backlog micro-batch: this many batch intervals of event time per stream


# Full: Nexmark q8's 10 s tumbling window; about 480,000 tuples, so each replay drains for several
# of the progress samples its sustained rate is cut from (every half second).
FULL = WindowPlan(window_ms=10_000, rate=4000, seconds=60, partitions=12, workers=(1, 2), spark_files_per_trigger=50)
# Quick: Spark's backlog in two micro-batches of one window (10 files of 200 ms) per stream.
QUICK = WindowPlan(window_ms=2_000, rate=500, seconds=3, partitions=4, workers=(1,), spark_files_per_trigger=10)


def window_job(env: BenchEnv, plan: WindowPlan) -> JobSettings:
    """equijoin.yaml (and STREAMJOIN_* overrides) with the plan's tumbling window, partitions and
    key domain, renamed for a fleet of the plan's first worker count on `env`'s broker."""
    from streamjoin.job_files import default_job_file

    job = load(default_job_file())
    streams = [s.model_copy(update={"window": WindowSpec(tumbling_ms=plan.window_ms)}) for s in job.streams]
    domain = equijoin.domain_for([ours.Step(plan.rate, plan.seconds)], plan.window_ms // 2, job.workload.skew,
                                 len(streams))
    job = job.model_copy(update={"streams": streams, "partitions": plan.partitions,
                                 "workload": job.workload.model_copy(update={"domain": domain})})
    return ours.fleet_job(job, env, "window", plan.workers[0])


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    job = window_job(env, plan)
    live, replays = ours.live_then_replays(
        env, job, plan.workers, plan.rate, plan.seconds,
        lambda: ours.run_live(env, job, plan.workers[0], plan.rate, plan.seconds, "the live run"))
    with env.phase("exporting the input and the oracle's pairs for the peers"):
        tables = export_inputs(env.spark, job, env.cluster)
        expected = window_peers.expected_pairs(env, job, tables)
    with env.phase("Spark peer: windowed stream-stream join, backlog"):
        spark = window_peers.run_spark(env, job, tables, expected, plan.spark_files_per_trigger)
    with env.phase("PyFlink peer (if STREAMJOIN_PYFLINK_PYTHON names its venv)"):
        flink = window_peers.run_pyflink(job, tables, env.workdir, expected)
    oracle = {"pairs": expected.num_rows, "matches_verified": expected.num_rows == live["verify"]["expected"],
              "window_end_wait_ms": window_peers.window_end_wait(job, expected),
              "how": "services/spark/window_oracle.py (Spark verify's window oracle) over the input exported from "
                     "the topics; window_end_wait_ms: per result, its window's end plus the lateness less its newest "
                     "member's time, the least a join emitting at the window's end would hold it back in event time"}
    figures, exact = ours.figures(live, replays)
    figures["delay_means"] = ("produced_ms minus the Kafka timestamp of the result's newest input: a result comes out "
                              "once both its members are in, not at its window's end")
    return report.judged_report("window", parameters(job, plan, quick), (figures, exact), oracle,
                                {"spark": spark, "pyflink": flink}, plot, plot_path)


def parameters(job: JobSettings, plan: WindowPlan, quick: bool) -> dict:
    w = job.workload
    return {"mode": "quick" if quick else "full", "streams": [s.name for s in job.streams],
            **{k: v for k, v in asdict(plan).items() if k != "workers"}, "workers": list(plan.workers),
            "window": {"tumbling_ms": plan.window_ms}, "join_type": job.join.type,
            "tuple_bytes": w.tuple_bytes, "skew": w.skew, "domain": w.domain, "random_state": w.random_state,
            "batch_ms": job.worker.batch_ms, "allowed_lateness_ms": job.join.allowed_lateness_ms,
            "exactly_once": job.worker.exactly_once, "arrivals": "Poisson",
            "generator": "Spark sources (services/spark/sources.py), event time the wall clock"}


def plot(result: dict, path: Path) -> None:
    """Backlog throughput bars: ours per worker count, each peer that ran (exact or not, said)."""
    params = result["parameters"]
    report.plot_throughput_bars(result, lambda peer: f"{peer['missing']:,} missing, {peer['extra']:,} extra",
                                f"tumbling {params['window_ms'] // 1000} s window join, {params['partitions']} "
                                f"partitions, {params['rate']:,.0f} tuples/s per stream for {params['seconds']:.0f} s",
                                path)
