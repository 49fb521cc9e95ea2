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

This module runs the parts and writes the report; the plans, jobs and fleets are in
adapt_fleet.py, parts 1-2 in adapt_moves.py, parts 3-4 in adapt_placement.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from streamjoin.bench import report
from streamjoin.bench.adapt_fleet import ADAPTIVE, FAILOVER_TIMEOUTS, FULL, QUICK, THRESHOLD_S, Plan
from streamjoin.bench.adapt_moves import failover, migration_cost
from streamjoin.bench.adapt_placement import rate_ramp, slowed_worker
from streamjoin.bench.env import BenchEnv
from streamjoin.settings import load


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
    from streamjoin.job_files import default_job_file

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
