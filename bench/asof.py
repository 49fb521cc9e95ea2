"""Workload `asof`: the as-of (temporal) stream-table join in hash mode, beside Quix Streams'
`join_asof` and PyFlink's event-time temporal join on the same input.

A stream of orders joins a table of customers whose rows change all the time and arrive out of
order within the allowed lateness (bench/asof_workload.py). Each order joins the row of its
customer valid at its time, once the table's watermark has passed that time; a left join
null-pads the orders of customers without a row.

  ours     a live run: a fleet of the plan's first worker count joins the input as it is written
           at the plan's rate; Spark `verify` checks its output exact (its own as-of oracle) and
           gives its production delay (p50/p95/p99: an order comes out once the table's
           watermark has passed it, so about the lateness after it arrived). Then the same
           topics drained as a backlog by a fresh fleet of each worker count: sustained
           throughput, each output id for id the verified one.
  peers    asof_peers.py on the same input: Quix Streams from its own venv on the same topics,
           PyFlink on CSV files of them (when STREAMJOIN_PYFLINK_PYTHON names its venv); each
           one's results judged against the oracle's pairs (services/spark/asof_oracle.py on the
           exported input). A peer that joins an order with the newest row it has seen rather
           than the row valid at the order's time shows it as missing and extra results.

`--quick` is the same harness, small enough for CI: 60 customers, 400 tuples/s per stream for
3 s, 4 partitions, 1 worker, a 3 s consumer session for the Quix peer.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from streamjoin.bench import asof_peers, ours, report
from streamjoin.bench.asof_workload import (FULL, QUICK, STREAM, TABLE, AsofPlan, asof_job, draw, expected_pairs,
                                            write_live)
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import export_inputs
from streamjoin.settings import JobSettings


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    job = asof_job(env, plan)
    live, replays = ours.live_then_replays(env, job, plan.workers, plan.rate, plan.seconds,
                                           lambda: run_live(env, job, plan))
    with env.phase("exporting the input and the oracle's pairs for the peers"):
        tables = export_inputs(env.spark, job, env.cluster)
        expected, undecided = expected_pairs(env.spark, job, tables)
    # The store keeps every row of the run: no row expires before an order needs it.
    grace_ms = int(plan.seconds * 1000) + 4 * plan.lateness_ms
    with env.phase("Quix Streams peer (its own venv: STREAMJOIN_QUIX_PYTHON or .venv-quix)"):
        quix = asof_peers.run_quix(job, tables, env.cluster, env.workdir, expected, grace_ms, plan.quix_consumer)
    with env.phase("PyFlink peer (if STREAMJOIN_PYFLINK_PYTHON names its venv)"):
        flink = asof_peers.run_pyflink(job, tables, env.workdir, expected)
    oracle = {"pairs": expected.num_rows, "undecided_orders": undecided,
              "matches_verified": expected.num_rows == live["verify"]["expected"] and undecided == 0,
              "how": "services/spark/asof_oracle.py (Spark verify's as-of oracle) over the input exported from the "
                     "topics, each group's final table watermark its newest row's time less the lateness"}
    return report.judged_report("asof", parameters(job, plan, quick), ours.figures(live, replays), oracle,
                                {"quix": quix, "pyflink": flink}, plot, plot_path)


def run_live(env: BenchEnv, job: JobSettings, plan: AsofPlan) -> dict:
    """A fleet joining the input as it is written; Spark `verify`'s report on its whole output."""
    fleet, _ = ours.start_fleet(env, job, plan.workers[0])
    written = write_live(env.cluster, job, plan, draw(plan))
    restarts, verdict = ours.drained_and_verified(env, job, fleet, plan.seconds, "the live run")
    return {"job": job.job, "workers": plan.workers[0], **written, "restarts": restarts,
            "verify": {k: verdict.get(k) for k in (*ours.VERIFY_KEYS, "unmatched")}}


def parameters(job: JobSettings, plan: AsofPlan, quick: bool) -> dict:
    return {"mode": "quick" if quick else "full", "stream": STREAM, "table": TABLE, "join_type": job.join.type,
            **{k: v for k, v in asdict(plan).items() if k not in ("quix_consumer", "join_type")},
            "workers": list(plan.workers), "batch_ms": job.worker.batch_ms, "exactly_once": job.worker.exactly_once,
            "arrivals": "Poisson", "generator": "bench/asof_workload.py (NumPy), written live a 100 ms tick at a time",
            "customers_with_rows": plan.customers - plan.without_rows}


def plot(result: dict, path: Path) -> None:
    """Backlog throughput bars: ours per worker count, each peer that ran (exact or not, said)."""
    params = result["parameters"]
    report.plot_throughput_bars(result, lambda peer: f"{peer['wrong_version']:,} orders joined wrong",
                                f"as-of {params['join_type']} join, {params['partitions']} partitions, "
                                f"{params['customers']:,} customers, {params['rate']:,.0f} tuples/s per stream for "
                                f"{params['seconds']:.0f} s", path)
