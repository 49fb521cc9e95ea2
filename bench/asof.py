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
    with env.phase(f"our live run: {plan.workers[0]} worker(s), {plan.rate:.0f} tuples/s per stream for "
                   f"{plan.seconds:.0f}s"):
        live = run_live(env, job, plan)
    replays = {}
    for k in plan.workers:
        with env.phase(f"our backlog replay with {k} worker(s)"):
            replays[k] = ours.run_replay(env, job, k)
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
    result = assemble(job, plan, quick, live, replays, {"quix": quix, "pyflink": flink}, oracle)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


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


def assemble(job: JobSettings, plan: AsofPlan, quick: bool, live: dict, replays: dict, peers: dict,
             oracle: dict) -> dict:
    """The report: our live run and replays, the peers judged against the oracle, the ratios."""
    throughput = {str(k): r["tuples_per_s"] for k, r in replays.items()}
    exact = bool(live["verify"]["verified"] and all(r["identical_to_verified_run"] for r in replays.values()))
    ratios = {}
    for k, tps in throughput.items():
        for name, peer in peers.items():
            if peer["ran"]:
                ratios[f"throughput_{k}w_vs_{name}"] = report.ratio(tps, peer["tuples_per_s"], "backlog throughput",
                                                                    "tuples/s")
    return {"workload": "asof", "exact": exact, "parameters": parameters(job, plan, quick),
            "ours": {"throughput_tuples_per_s": throughput, "delay_ms": live["verify"]["delay_ms"], "live": live,
                     "replays": {str(k): r for k, r in replays.items()}},
            "oracle": oracle, "peers": peers, "ratios": ratios}


def plot(result: dict, path: Path) -> None:
    """Backlog throughput bars: ours per worker count, each peer that ran (exact or not, said)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"streamjoin, {k} worker(s)\nexact", tps) for k, tps in result["ours"]["throughput_tuples_per_s"].items()]
    for name, peer in result["peers"].items():
        if peer["ran"]:
            verdict = "exact" if peer["exact"] else f"{peer['wrong_version']:,} orders joined wrong"
            bars.append((f"{name}\n{verdict}", peer["tuples_per_s"] or 0))
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(bars), 4.5))
    ax.bar(range(len(bars)), [v for _, v in bars], color=[f"C{i}" for i in range(len(bars))])
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_ylabel("backlog throughput (tuples/s)")
    params = result["parameters"]
    ax.set_title(f"as-of {params['join_type']} join, {params['partitions']} partitions, "
                 f"{params['customers']:,} customers, {params['rate']:,.0f} tuples/s per stream for "
                 f"{params['seconds']:.0f} s", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
