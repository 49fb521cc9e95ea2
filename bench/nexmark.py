"""Workload `nexmark`: Nexmark's join queries q3, q8 and q20 as streamjoin jobs, beside PyFlink and
Spark Structured Streaming on the same events, and Flink's and Feldera's published figures.

  events   the Nexmark model (bench/nexmark_model.py) written into three topics as a backlog by
           several producer processes (bench/nexmark_write.py): persons keyed by id, auctions by
           seller, bids by auction; exported once from the topics (Spark) for the oracle and the
           peers, so every engine joins the very records our fleets joined.
  oracle   Nexmark's SQL of each query in Spark over the export (bench/nexmark_queries.py).
  backlog  per query, a fresh one-worker fleet of its shipped job drains the topics; the CPU
           seconds of the worker and of the broker are sampled apart (psutil) between the first
           commit and the last: throughput per core is events per CPU second (events/s over cores
           busy). Its results judged against the oracle, and its result ids free of duplicates.
  paced    the first events again (same order per partition, so the same offsets) into fresh
           topics at a fixed rate, the three queries' fleets running at once: each result's
           production delay (produced_ms less the Kafka timestamp of its newest input), each
           query's results judged against the oracle on that prefix.
  peers    bench/nexmark_peers.py: PyFlink (each query in Flink SQL, one process) and Spark
           Structured Streaming (q3 and q20) on files of the export, judged against the oracle.
  quoted   Flink 1.13's own Nexmark figures (throughput per core) and Feldera's run against
           Flink, with their hardware, beside ours; the goal (Flink's per-core figure on q8 and
           q20, PyFlink's in the same run on all three) said met or not.

Events a query reads are the records of its topics (q3 and q8: persons and auctions; q20: bids
and auctions). Flink's published figure counts all events of Nexmark's one generated stream, for
every query: `nexmark_events_per_worker_cpu_s` gives ours in that count too.

`--quick`: 5,000 events at 500 events/s of event time on 4 partitions, all of them paced at 2,500/s.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from streamjoin.bench import nexmark_peers, nexmark_queries as nq, ours, report, scale
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import export_inputs
from streamjoin.bench.nexmark_model import KINDS, NexmarkModel
from streamjoin.bench.nexmark_write import EventPlan, write_events, write_paced
from streamjoin.launcher import wait_drained
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology import topics


@dataclass(frozen=True)
class NexmarkPlan:
    events: int  # of all kinds
    chunk_events: int  # drawn at a time
    producers: int  # backlog producer processes
    rate: float  # events/s of event time (Nexmark's firstEventRate)
    paced_events: int  # the first this many are written again, paced
    paced_rate: float  # events/s the paced run writes
    partitions: int
    out_of_order_group: int  # Nexmark's outOfOrderGroupSize
    spark_queries: tuple[str, ...] = ("q3", "q8", "q20")  # Spark Structured Streaming runs what it can of these
    drain_timeout_s: float = 1800.0
    random_state: int = 7


FULL = NexmarkPlan(events=1_000_000, chunk_events=100_000, producers=2, rate=10_000, paced_events=300_000,
                   paced_rate=10_000, partitions=12, out_of_order_group=1000)
# Quick: Spark Structured Streaming on q20 alone and PyFlink without its start-up measured (the
# suite's time); its figures are then gross, start-up included.
QUICK = NexmarkPlan(events=5_000, chunk_events=5_000, producers=1, rate=500, paced_events=5_000, paced_rate=2_500,
                    partitions=4, out_of_order_group=50, spark_queries=("q20",), drain_timeout_s=300.0)

# Flink 1.13's Nexmark results (github nexmark/nexmark, README): throughput per core, events/s.
FLINK_PUBLISHED = {"q3": 152_120, "q8": 146_140, "q20": 18_980}
FLINK_HARDWARE = ("Flink 1.13, 3 worker machines of 8 cores and 32 GB (8 TaskManagers of one slot, parallelism 8), "
                  "RocksDB with incremental checkpoints, exactly-once checkpoints every 3 minutes, mini-batch 2 s; "
                  "100M events from Nexmark's generator inside the job (no broker, no JSON), blackhole sinks; "
                  "cores: CPU measured on every worker node")
# Feldera's run against Flink on one machine (feldera.com/blog/nexmark-vs-flink): events/s, 16 cores each.
FELDERA_PUBLISHED = {"q3": {"feldera": 6.61e6, "flink": 2.04e6}, "q20": {"feldera": 1.35e6, "flink": 0.27e6}}
FELDERA_CORES = 16
FELDERA_HARDWARE = ("one 64-core Threadripper 3990X, 256 GB: Feldera as one process with 16 worker threads, Flink as "
                    "8 TaskManagers of 2 cores; 100M events")
GOAL = "at least Flink's published per-core throughput on q8 and q20, and ahead of PyFlink in the same run on all three"


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    span_ms = int(plan.events / plan.rate * 1000)
    # The events end a minute before now: none is ahead of the workers' clock (join.max_future_ms).
    model = NexmarkModel(rate=plan.rate, base_ms=(int(time.time()) - 60) * 1000 - span_ms,
                         out_of_order_group=plan.out_of_order_group, random_state=plan.random_state)
    events = nq.events_job(env, "nexmark", plan.partitions)
    with env.phase(f"writing {plan.events:,} Nexmark events with {plan.producers} producer(s)"):
        written = write_events(events, env.cluster, model, EventPlan(plan.events, plan.chunk_events, plan.producers),
                               env.console)
    with env.phase("exporting the events and running Nexmark's SQL in Spark (the oracle)"):
        # One read of each topic into Arrow, then Spark SQL on frames made from it: the queries
        # never go back to Kafka (each pass would run the Kafka source's Python tasks again).
        tables = export_inputs(env.spark, events, env.cluster)
        frames = {k: env.spark.createDataFrame(t).cache() for k, t in tables.items()}
        nq.register_views(env.spark, frames)
        expected = {q: nq.expected(env.spark, q) for q in nq.QUERIES}
        as_of = {q: nq.as_of_misses(env.spark, q) for q in nq.QUERIES}
    backlog = {}
    for q in nq.QUERIES:
        with env.phase(f"{q}: our backlog drain, 1 worker"):
            backlog[q] = drain(env, q, events, expected[q], model, plan.drain_timeout_s)
    with env.phase(f"paced run: the first {plan.paced_events:,} events again at {plan.paced_rate:,.0f}/s, the "
                   "three queries at once"):
        paced = run_paced(env, plan, model, frames, expected)
    for f in frames.values():
        f.unpersist()
    with env.phase("PyFlink: q3, q8 and q20 in Flink SQL (its venv: STREAMJOIN_PYFLINK_PYTHON or .venv-pyflink)"):
        pyflink = nexmark_peers.run_pyflink(tables, env.workdir, nq.QUERIES, events.join.allowed_lateness_ms,
                                            expected, measure_startup=not quick)
    with env.phase("Spark Structured Streaming: the queries it runs"):
        spark = nexmark_peers.run_spark(env.spark, tables, env.workdir, plan.spark_queries, expected)
    result = assemble(plan, quick, model, written, tables, backlog, paced, {"pyflink": pyflink, "spark": spark},
                      as_of)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def drain(env: BenchEnv, query: str, events: JobSettings, expected_rows: pa.Table, model: NexmarkModel,
          timeout_s: float) -> dict:
    """Query `query`'s job drained by a fresh one-worker fleet: throughput, CPU apart, the verdict."""
    job = nq.query_job(env, query, events, f"nexmark-{query}")
    run = scale.drain(env, job, 1, timeout_s)
    judged = nq.judge(expected_rows, nq.our_results(env.cluster, scale.reader_job(job, env, 1), query))
    cpu = run["cpu"]
    broker = cpu["broker_s"]
    return {**{k: run[k] for k in ("job", "inputs", "drained_tuples", "drain_seconds", "tuples_per_s", "restarts")},
            "cpu": cpu,
            "events_per_worker_cpu_s": report_per(run["drained_tuples"], cpu["workers_s"]),
            "events_per_cpu_s_with_broker": report_per(run["drained_tuples"],
                                                       None if broker is None else cpu["workers_s"] + broker),
            "result_id_duplicates": run["fingerprint"]["duplicates"], "window_covers_leads": nq.covers_leads(
                job, query, model), **judged, "exact": judged["exact"] and run["fingerprint"]["duplicates"] == 0}


def report_per(events: int, cpu_s: float | None) -> float | None:
    return events / cpu_s if cpu_s else None


def run_paced(env: BenchEnv, plan: NexmarkPlan, model: NexmarkModel, frames: dict, expected: dict) -> dict:
    """The first `plan.paced_events` events again, into fresh topics at `plan.paced_rate`, each
    query's fleet joining them as they arrive; judged against Nexmark's SQL on that prefix (the
    exported events before each partition's end offset in the fresh topics: the same order per
    partition, so the same offsets), which is `expected` when the prefix is every event."""
    events = nq.events_job(env, "nexmark-paced", plan.partitions)
    topics.ensure(env.cluster.admin(), events)
    fleets = {}
    for q in nq.QUERIES:
        job = nq.query_job(env, q, events, f"nexmark-paced-{q}")
        fleet, ids = ours.start_fleet(env, job, 1)
        fleets[q] = (job, fleet, scale.CpuMeter(fleet, ids, env.bootstrap))
    before = {q: meter.sample(0) for q, (_, _, meter) in fleets.items()}
    written = write_paced(events, env.cluster, model, EventPlan(plan.paced_events, plan.chunk_events, 1),
                          plan.paced_rate)
    ends = {s.name: {p: e for (_, p), e in kafka.end_offsets(
        env.cluster, [(events.topic_of(s), p) for p in range(events.partitions)], "nexmark-paced-ends").items()}
        for s in events.streams}
    whole = plan.paced_events == plan.events
    if not whole:
        nq.register_views(env.spark, frames, ends)
    out: dict = {"written": written}
    for q, (job, fleet, meter) in fleets.items():
        wait_drained(job, env.bootstrap, fleet, timeout=max(300.0, 10 * written["seconds"]))
        fleet.assert_running()
        after = meter.sample(0)
        fleet.stop_all()
        timing = ours.result_timings(env.cluster, job)
        judged = nq.judge(expected[q] if whole else nq.expected(env.spark, q), nq.our_results(env.cluster, job, q))
        out[q] = {"job": job.job, "restarts": fleet.restarts, "rate": written["events_per_s"],
                  "delay_ms": report.delay_stats(timing["delay_ms"], 1000.0),
                  "worker_cores_busy": (after.workers_s - before[q].workers_s) / (after.t - before[q].t), **judged}
    return out


def assemble(plan: NexmarkPlan, quick: bool, model: NexmarkModel, written: dict, tables: dict, backlog: dict,
             paced: dict, peers: dict, as_of: dict) -> dict:
    """The report: per query ours (backlog, paced), the peers, the published figures, ratios, the goal."""
    total_events = sum(t.num_rows for t in tables.values())
    queries, ratios = {}, {}
    for q in nq.QUERIES:
        mine = backlog[q]
        per_core = mine["events_per_worker_cpu_s"]
        flink = peers["pyflink"]["queries"][q] if peers["pyflink"]["ran"] else {"ran": False}
        spark = peers["spark"]["queries"].get(q, {"ran": False}) if peers["spark"]["ran"] else {"ran": False}
        published = {"flink_1_13_per_core": FLINK_PUBLISHED[q]}
        if q in FELDERA_PUBLISHED:
            published |= {f"{k}_per_core": v / FELDERA_CORES for k, v in FELDERA_PUBLISHED[q].items()}
        queries[q] = {
            "ours": {"backlog": mine, "paced": paced[q],
                     "nexmark_events_per_worker_cpu_s": report_per(
                         total_events * mine["drained_tuples"] / mine["inputs"], mine["cpu"]["workers_s"])},
            "pyflink": flink, "spark": spark, "published": published, "as_of_join_would_miss": as_of[q]}
        ratios[f"{q}_per_core_vs_pyflink"] = report.ratio(
            per_core, flink.get("events_per_cpu_s") or flink.get("events_per_cpu_s_gross"),
            "events per CPU second (PyFlink's net of its start-up where measured, else gross)", "events/s per core")
        ratios[f"{q}_per_core_vs_spark"] = report.ratio(per_core, spark.get("events_per_cpu_s"),
                                                        "events per CPU second", "events/s per core")
        ratios[f"{q}_per_core_vs_flink_published"] = report.ratio(per_core, FLINK_PUBLISHED[q],
                                                                  "events per CPU second (Flink: published, all "
                                                                  "Nexmark events)", "events/s per core")
    goal = {q: {"flink_published": (q == "q3") or _at_least(queries[q]["ours"]["backlog"]["events_per_worker_cpu_s"],
                                                             FLINK_PUBLISHED[q]),
                "pyflink_same_run": _at_least(queries[q]["ours"]["backlog"]["events_per_worker_cpu_s"],
                                              ratios[f"{q}_per_core_vs_pyflink"]["peer"])} for q in nq.QUERIES}
    exact = all(backlog[q]["exact"] and paced[q]["exact"] and backlog[q]["window_covers_leads"] for q in nq.QUERIES)
    return {"workload": "nexmark", "exact": exact,
            "parameters": {"mode": "quick" if quick else "full", **asdict(plan), "model": asdict(model),
                           "events_per_kind": {k: tables[k].num_rows for k in KINDS}, "written": written},
            "queries": queries, "ours": {q: queries[q]["ours"] for q in nq.QUERIES},
            "peers": peers, "ratios": ratios,
            "published": {"flink": {"per_core": FLINK_PUBLISHED, "hardware": FLINK_HARDWARE},
                          "feldera": {"events_per_s": FELDERA_PUBLISHED, "cores": FELDERA_CORES,
                                      "hardware": FELDERA_HARDWARE}},
            "goal": {"what": GOAL, "per_query": goal,
                     "met": all(all(g.values()) for g in goal.values())}}


def _at_least(ours_figure: float | None, theirs: float | None) -> bool:
    return ours_figure is not None and theirs is not None and ours_figure >= theirs


def plot(result: dict, path: Path) -> None:
    """Events per CPU second per query: ours (worker; worker and broker), PyFlink, Spark, Flink's published."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("streamjoin, worker CPU", lambda q: q["ours"]["backlog"]["events_per_worker_cpu_s"]),
              ("streamjoin, worker + broker CPU", lambda q: q["ours"]["backlog"]["events_per_cpu_s_with_broker"]),
              ("PyFlink, same run", lambda q: q["pyflink"].get("events_per_cpu_s") or q["pyflink"].get(
                  "events_per_cpu_s_gross")),
              ("Spark Structured Streaming, same run", lambda q: q["spark"].get("events_per_cpu_s")),
              ("Flink 1.13, published", lambda q: q["published"]["flink_1_13_per_core"])]
    names = list(result["queries"])
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(series)
    for i, (label, value) in enumerate(series):
        heights = [value(result["queries"][q]) or 0 for q in names]
        ax.bar(np.arange(len(names)) + (i - (len(series) - 1) / 2) * width, heights, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("events per CPU second (events/s per core)")
    p = result["parameters"]
    ax.set_title(f"Nexmark joins ({p['mode']}): {p['events']:,} events, {p['partitions']} partitions, one worker; "
                 "ours and the peers from the same run,\nFlink 1.13: its published figure (3 machines of 8 cores)",
                 fontsize=9)
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
