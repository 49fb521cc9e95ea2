"""Workload `equijoin`: the hash-partitioned window join paper's 2-way equi-join (Table 2 of the paper):
64-byte JSON tuples, Poisson arrivals, b-model keys with bias 0.7, 60
partitions, a 10-minute time window, our workers' 200 ms batch interval.

The paper ran every rate for 20 minutes (10 of warm-up); a run here climbs a
staircase of rates, 20 s each, so the 10-minute window fills but never
expires within a run: a step's probes see every tuple written before it. The
key domain is chosen for the whole staircase so that output is about as
large as input (`domain_for`), and the report states what it came to.

The peers join the same input (`run_peers`): Spark Structured Streaming, one
raw consumer, the reference join, PyFlink from its own venv, Quix Streams'
`join_interval` from its own venv, exactly-once on the same topics, and
Pathway's `interval_join` from its own venv on the same topics; each engine's
exactness is reported beside its throughput. Pathway and ours are compared
twice: from a cold start (launch to the last result) and at steady state.

Beside it, a left join (join.type left) on the same workload: its throughput
beside the inner join's on the same topics, the delay of unmatched rows past
their deadline, and Spark's left outer join as the peer (bench/left_join.py).
Rows are decided only once the window has passed them, so that run has its
own window: the full run's 60 s (at 2000 tuples/s per stream for 90 s), the
quick run's own 2 s (500 tuples/s for 6 s: rows are decided from 4 s of event
time on, window plus lateness, and Spark's left join needs batches after that
to emit its null rows).

`--quick` is the same harness, small enough for CI: one worker, two steps of
2 s under a 10 s window (so the sweep's window does not expire; the left-join
run's does), 4 partitions (Spark `verify` and the exports read every
partition of their topics, one task each), one repetition of the cheap peers,
and a 3 s consumer session for the Quix peer (a shorter group join).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from streamjoin.bench import left_join, ours, report
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import ARRIVAL, export_inputs
from streamjoin.bench.peers import kafka_consume, pathway_peer, pyflink_peer, quix_peer, reference, spark_peer
from streamjoin.settings import JobSettings, WindowSpec, load

THRESHOLD_S = 1.0  # capacity: p99 production delay under this


@dataclass(frozen=True)
class Plan:
    window_ms: int
    partitions: int
    workers: tuple[int, ...]
    steps: tuple[ours.Step, ...]
    consume_repeats: int  # kafka_consume reads (seconds each): the median is reported
    reference_repeats: int  # reference joins (half a minute each on the full input)
    spark_files_per_trigger: int  # backlog micro-batch: this many batch intervals of event time per stream
    left: left_join.LeftPlan  # the left-join figure's run
    quix_consumer: dict = field(default_factory=dict)  # the Quix peer's consumer settings beyond its own
    pathway_threads: int = 2  # Pathway's worker threads: every core of the 2-core machines the figures come from


FULL = Plan(window_ms=600_000, partitions=60, workers=(1, 2),
            steps=tuple(ours.Step(r, 20) for r in (500, 1000, 2000, 4000, 8000)),
            consume_repeats=3, reference_repeats=1, spark_files_per_trigger=150,
            left=left_join.LeftPlan(window_ms=60_000, rate=2000, seconds=90, spark_files_per_trigger=150))
# Quick: the Quix peer's consumer gets a 3 s session (Tansu holds a group join for about half the
# session timeout: 5 s of its start-up at the default 10 s).
# Spark's backlog takes 8 files (1.6 s of event time) per stream per trigger, so the short input
# still makes the few batches its sustained rate needs.
QUICK = Plan(window_ms=10_000, partitions=4, workers=(1,), steps=(ours.Step(500, 2), ours.Step(1000, 2)),
             consume_repeats=1, reference_repeats=1, spark_files_per_trigger=8,
             left=left_join.LeftPlan(window_ms=2_000, rate=500, seconds=6, spark_files_per_trigger=8),
             quix_consumer={"session.timeout.ms": 3_000, "heartbeat.interval.ms": 500})


def domain_for(steps: Sequence[ours.Step], window_ms: int, skew: float, streams: int = 2) -> int:
    """The power-of-two key domain that makes results about as many as input tuples.

    Two tuples of different streams share a b-model key with probability
    c = (skew^2 + (1 - skew)^2)^levels; they join when their times are less
    than a window apart. Pairs are counted on a one-second grid of the
    staircase, so the estimate holds whether or not the window expires."""
    per_second = np.concatenate([np.full(int(s.seconds), s.rate) for s in steps])
    w = max(1, window_ms // 1000)
    cum = np.r_[0.0, np.cumsum(per_second)]
    t = np.arange(len(per_second))
    # Tuples of the other stream less than a window away from each second.
    near = cum[np.minimum(t + w, len(per_second))] - cum[np.maximum(t - w + 1, 0)]
    pairs = float(per_second @ near)
    inputs = streams * float(per_second.sum())
    collide = skew ** 2 + (1 - skew) ** 2
    levels = round(math.log(inputs / pairs) / math.log(collide))
    return 1 << max(1, levels)


def base_job(plan: Plan) -> JobSettings:
    """equijoin.yaml (and STREAMJOIN_* overrides) with the plan's window and domain."""
    from streamjoin.job_files import default_job_file

    job = with_window(load(default_job_file()), plan.window_ms, plan.steps)
    return job.model_copy(update={"partitions": plan.partitions})


def with_window(job: JobSettings, window_ms: int, steps: Sequence[ours.Step]) -> JobSettings:
    """`job` with every stream's window `window_ms` and the key domain `domain_for` the `steps`."""
    streams = [s.model_copy(update={"window": WindowSpec(range_ms=window_ms)}) for s in job.streams]
    domain = domain_for(steps, window_ms, job.workload.skew, len(streams))
    return job.model_copy(update={"streams": streams, "workload": job.workload.model_copy(update={"domain": domain})})


def left_job(job: JobSettings, plan: left_join.LeftPlan, env: BenchEnv) -> JobSettings:
    """The left-join run's job: `job` as a left join with the run's window and domain, renamed."""
    left = with_window(job, plan.window_ms, [ours.Step(plan.rate, plan.seconds)])
    left = left.model_copy(update={"join": left.join.model_copy(update={"type": "left"})})
    return ours.fleet_job(left, env, "equijoin-left", 1)


def parameters(job: JobSettings, plan: Plan, quick: bool) -> dict:
    w = job.workload
    return {
        "mode": "quick" if quick else "full",
        "streams": [s.name for s in job.streams],
        "window_ms": plan.window_ms,
        "tuple_bytes": w.tuple_bytes, "skew": w.skew, "domain": w.domain, "random_state": w.random_state,
        "partitions": job.partitions, "batch_ms": job.worker.batch_ms,
        "allowed_lateness_ms": job.join.allowed_lateness_ms, "exactly_once": job.worker.exactly_once,
        "workers": list(plan.workers),
        "steps": [{"rate_per_stream": s.rate, "seconds": s.seconds} for s in plan.steps],
        "spark_files_per_trigger": plan.spark_files_per_trigger,
        "capacity_rule": f"highest step rate before the first step whose p99 delay is not under {THRESHOLD_S:.0f}s",
        "arrivals": "Poisson", "generator": "Spark sources (services/spark/sources.py), random state + step per step",
    }


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    job = base_job(plan)
    jobs = {k: ours.fleet_job(job, env, f"equijoin-{k}w", k) for k in plan.workers}
    sweeps = {}
    for k in plan.workers:
        with env.phase(f"our sweep with {k} worker(s)"):
            sweeps[k] = ours.run_sweep(env, jobs[k], k, plan.steps, THRESHOLD_S)
    # The peers all read the one input with the most tuples (the longest staircase).
    common_k = max(sweeps, key=lambda k: sweeps[k]["verify"]["inputs"]["total"])
    common = jobs[common_k]
    replays = {}
    for k in plan.workers:
        with env.phase(f"our backlog replay with {k} worker(s)"):
            replays[k] = ours.run_replay(env, common, k)
    with env.phase("our backlog replay with 1 worker writing Arrow blocks (what JSON output costs)"):
        blocks = ours.run_replay(env, common, 1, output_format="blocks")
    peers = run_peers(env, common, sweeps[common_k], plan)
    left = left_join.run(env, left_job(job, plan.left, env), plan.left, THRESHOLD_S * 1000)
    result = assemble(job, plan, quick, sweeps, replays, blocks, common_k, peers, left)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def run_peers(env: BenchEnv, common: JobSettings, sweep: dict, plan: Plan) -> dict:
    """Every peer on the common input; the file-based ones get it exported from Kafka."""
    expected = sweep["verify"]["expected"]
    with env.phase("kafka_consume peer"):
        consume = kafka_consume.run_kafka_consume(env.cluster, common.input_topics, common.partitions,
                                                  plan.consume_repeats)
    first = plan.steps[0]
    with env.phase(f"kafka_consume delivery delay at {first.rate:.0f} tuples/s per stream"):
        consume["delivery"] = kafka_consume.delivery_delay(env.cluster, common, first.rate, first.seconds,
                                                           THRESHOLD_S * 1000)
    with env.phase("exporting the input for the file-based peers"):
        tables = export_inputs(env.spark, common, env.cluster)
    with env.phase("reference peer"):
        floor = reference.run_reference(common, tables, plan.reference_repeats)
    floor["exact"] = floor["results"] == expected
    spark = spark_figures(env, common, tables, sweep, plan)
    with env.phase("PyFlink peer (if STREAMJOIN_PYFLINK_PYTHON names its venv)"):
        flink = pyflink_peer.run_pyflink(common, tables, env.workdir)
    if flink["ran"]:
        flink["exact"] = flink["results"] == expected
    with env.phase("Quix Streams peer (its own venv: STREAMJOIN_QUIX_PYTHON or .venv-quix)"):
        quix = quix_peer.run_quix(common, tables, env.cluster, env.workdir, expected, consumer=plan.quix_consumer)
    with env.phase("Pathway peer (if STREAMJOIN_PATHWAY_PYTHON names its venv)"):
        pathway = pathway_peer.run_pathway(common, tables, env.cluster, env.workdir, expected, plan.pathway_threads)
    return {"spark": spark, "kafka_consume": consume, "reference": floor, "pyflink": flink, "quix": quix,
            "pathway": pathway}


def spark_figures(env: BenchEnv, common: JobSettings, tables: dict, sweep: dict, plan: Plan) -> dict:
    """Spark's backlog throughput (files of one batch interval of event time each) and its delays
    with our sweep's steps replayed at their arrival pace (files of one batch interval of arrivals)."""
    starts = [s["wall_ms"][0] for s in sweep["steps"]]
    ms = common.worker.batch_ms
    predicate = spark_peer.key_equality(common)
    by_time = {s.name: spark_peer.Slices.cut(tables[s.name], s.time_field, ms, starts) for s in common.streams}
    by_arrival = {s.name: spark_peer.Slices.cut(tables[s.name], ARRIVAL, ms, starts) for s in common.streams}
    with env.phase("Spark peer, backlog"):
        backlog = spark_peer.run_backlog(env.spark, common, by_time, predicate, env.workdir / "spark",
                                         plan.spark_files_per_trigger)
    with env.phase("Spark peer, paced like our sweep"):
        paced = spark_peer.run_paced(env.spark, common, by_arrival, sweep["steps"], predicate,
                                     env.workdir / "spark", THRESHOLD_S * 1000)
    expected = sweep["verify"]["expected"]
    return {**backlog, "exact": backlog["results"] == expected, "expected": expected,
            "capacity_per_stream": report.capacity(paced), "capacity_reading": report.capacity_reading(paced),
            "steps": paced,
            "how": f"Structured Streaming stream-stream inner join on Parquet file sources (a file per stream per "
                   f"{ms} ms), watermark {common.join.allowed_lateness_ms} ms, condition k = k and "
                   "t_s < t_r + W and t_r < t_s + W, foreachBatch collecting every column; backlog: "
                   f"{plan.spark_files_per_trigger} files per trigger; paced: every new file each trigger"}


def assemble(job: JobSettings, plan: Plan, quick: bool, sweeps: dict, replays: dict, blocks: dict, common_k: int,
             peers: dict, left: dict) -> dict:
    """The report: our figures, the peers', their ratios; `blocks` is the 1-worker replay writing Arrow
    blocks, `left` the left-join figure (left_join.run), whose ratios join the others as left_join_*."""
    capacity = {str(k): report.capacity(s["steps"]) for k, s in sweeps.items()}
    reading = {str(k): report.capacity_reading(s["steps"]) for k, s in sweeps.items()}
    throughput = {str(k): r["tuples_per_s"] for k, r in replays.items()}
    cold = {str(k): r["cold_start_tuples_per_s"] for k, r in replays.items()}
    exact = (all(s["verify"]["verified"] for s in sweeps.values())
             and all(r["identical_to_verified_run"] for r in [*replays.values(), blocks]) and left["exact"])
    ours_figures = {
        "capacity_per_stream": capacity,
        "capacity_reading": reading,
        "throughput_tuples_per_s": throughput,
        "cold_start_tuples_per_s": cold,
        "sweeps": {str(k): s for k, s in sweeps.items()},
        "replays": {str(k): r for k, r in replays.items()},
        "replay_blocks_1w": blocks,
        "common_input": f"the {common_k}-worker sweep's input topics",
    }
    return {"workload": "equijoin", "exact": exact, "parameters": parameters(job, plan, quick),
            "ours": ours_figures, "peers": peers, "left_join": left,
            "ratios": ratios(capacity, throughput, peers) | pathway_ratios(cold, throughput, peers["pathway"]) | {"json_vs_blocks_1w": report.ratio(
                replays[1]["tuples_per_s"] if 1 in replays else None, blocks["tuples_per_s"],
                f"backlog throughput, results as {job.output.format} records vs Arrow blocks", "tuples/s")}
            | {f"left_join_{k}": r for k, r in left_join.ratios(left).items()}}


def ratios(capacity: dict, throughput: dict, peers: dict) -> dict:
    """Ours over each peer, per worker count, each with the two figures it divides."""
    spark, consume, floor = peers["spark"], peers["kafka_consume"], peers["reference"]
    out = {}
    for k, tps in throughput.items():
        out[f"throughput_{k}w_vs_spark"] = report.ratio(tps, spark["tuples_per_s"], "backlog throughput", "tuples/s")
        out[f"throughput_{k}w_vs_kafka_consume"] = report.ratio(tps, consume["tuples_per_s"],
                                                                "backlog throughput vs raw consumption", "tuples/s")
        out[f"throughput_{k}w_vs_reference"] = report.ratio(tps, floor["tuples_per_s"], "throughput", "tuples/s")
        for name in ("pyflink", "quix"):
            if peers[name]["ran"]:
                out[f"throughput_{k}w_vs_{name}"] = report.ratio(tps, peers[name]["tuples_per_s"],
                                                                 "backlog throughput", "tuples/s")
    for k, cap in capacity.items():
        out[f"capacity_{k}w_vs_spark"] = report.ratio(cap, spark["capacity_per_stream"],
                                                      f"rate per stream with p99 delay < {THRESHOLD_S:.0f}s",
                                                      "tuples/s per stream")
        both = None if cap is None else 2 * cap
        out[f"capacity_{k}w_vs_kafka_consume"] = report.ratio(both, consume["tuples_per_s"],
                                                              "input rate at capacity (both streams) vs raw "
                                                              "consumption", "tuples/s")
    return out


def pathway_ratios(cold: dict, throughput: dict, pathway: dict) -> dict:
    """Ours over Pathway per worker count, from a cold start and at steady state (none if it did not run)."""
    if not pathway["ran"]:
        return {}
    out = {}
    for k in throughput:
        out[f"cold_start_{k}w_vs_pathway"] = report.ratio(cold[k], pathway["cold_start_tuples_per_s"],
                                                          "backlog from launch to the last result", "tuples/s")
        out[f"throughput_{k}w_vs_pathway"] = report.ratio(throughput[k], pathway["tuples_per_s"],
                                                          "backlog throughput, 10%-90% of the input", "tuples/s")
    return out


def plot(result: dict, path: Path) -> None:
    series = [_series(f"ours, {k} worker(s)", s["steps"]) for k, s in result["ours"]["sweeps"].items()]
    series.append(_series("Spark Structured Streaming", result["peers"]["spark"]["steps"]))
    series.append(_series("sources -> raw consumer, no join (kafka_consume)",
                           [result["peers"]["kafka_consume"]["delivery"]]))
    p = result["parameters"]
    report.plot_delay_curves(series, THRESHOLD_S * 1000,
                             f"equijoin ({p['mode']}): {p['window_ms'] // 1000}s window, {p['partitions']} "
                             f"partitions, b-model {p['skew']}, {p['tuple_bytes']}-byte tuples", path)


def _series(label: str, steps: Sequence[dict]) -> dict:
    served = [s for s in steps if s["delay"]["count"]]
    return {"label": label, "rate": [s["rate_per_stream"] for s in served],
            "mean_ms": [s["delay"]["mean_ms"] for s in served], "p99_ms": [s["delay"]["p99_ms"] for s in served]}
