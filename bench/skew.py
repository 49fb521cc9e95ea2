"""Workload `skew`: hot-key splitting in hash mode, the same job with and without it, beside
Spark Structured Streaming and PyFlink on the same input.

Each case is one input (bench/skew_workload.py): the equijoin tuples with Zipf keys (exponents
0.8 to 1.5) or uniform keys with one key carrying 10% to 50% of each stream on top, joined over
a RANGE window of a few tuples per key, so the hot key's pairs dominate the output. Per case
(bench/skew_runs.py), every run with a fleet of the plan's workers (3 by default, `--workers`):

  1. the case's input preloaded as a backlog (bench/backlog.py, no Spark);
  2. backlog drains, unsplit (`coordinator.hot_key_slots: 0`) and split (workers - 1 slots, low
     detection thresholds, a 1 s epoch): throughput at steady state, from the share of the input
     the split run had committed when it split to 90%; Spark verify checks the unsplit output
     exact, the split output must be the same id for id; the splitting counters (tuples and
     bytes replicated to the sub-groups) are the price;
  3. live runs, unsplit and split, fed at the plan's load (a share) of the unsplit drain's rate,
     each with a window of as many tuples as the backlog's; Spark verify: exact, p99 production
     delay; the keys the coordinator found hot (and split);
  4. the peers on the exported backlog: Spark's backlog join on every case, PyFlink on the
     headline case (on every case with the plan's `pyflink`).

The headline is one key at 40% of the input on 3 workers: split throughput over unsplit, and
unsplit p99 over split p99 (the acceptance asks for at least 2 and 2, exact: `acceptance`).

`--quick`: the headline case only, 2 workers, a backlog of 4,000 tuples, live runs of 3 s at
500 tuples/s per stream at most, 4 partitions.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from streamjoin.bench import report
from streamjoin.bench.backlog import preload
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.skew_runs import backlog_run, live_run, peers, steady, verify_backlog
from streamjoin.bench.skew_workload import (DETECTION, EXPONENTS, FULL, HEADLINE, MAX_BATCH_RECORDS, QUICK, SHARES,
                                            Case, SkewPlan, coordinator_settings, live_job, source_job)

GOAL = 2.0  # the acceptance: split throughput >= 2x unsplit, split p99 <= half of unsplit's, on the headline


def run(env: BenchEnv, quick: bool, plot_path: Path | None, workers: int | None = None,
        headline: bool = False) -> dict:
    """Every case of the plan (`quick`: QUICK; `headline`: its headline case alone) with `workers`
    per run (default: the plan's)."""
    plan = QUICK if quick else FULL
    if headline:
        plan = dataclasses.replace(plan, cases=(HEADLINE,))
    k = workers or plan.workers
    cases = {}
    for case in plan.cases:
        with env.phase(f"case {case.name} ({case.describe()}), {k} workers"):
            cases[case.name] = run_case(env, plan, case, k)
    result = assemble(plan, quick, k, cases)
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def run_case(env: BenchEnv, plan: SkewPlan, case: Case, workers: int) -> dict:
    """`case`'s backlog preloaded; our backlog and live runs of it, unsplit and split; the peers on it."""
    runs = {"unsplit": 0, "split": max(1, workers - 1)}
    source = source_job(env, plan, case)
    backlog_plan = plan.backlog()
    # The backlog ends a minute before now: no tuple is ahead of the workers' clock (join.max_future_ms).
    start_ms = (int(time.time()) - 60) * 1000 - backlog_plan.event_ms
    with env.phase(f"{case.name}: preloading about {backlog_plan.tuples:,} tuples"):
        loaded = preload(source, env.cluster, backlog_plan, start_ms, env.console)
    backlog, ids = {}, {}
    for run, slots in runs.items():
        with env.phase(f"{case.name}: {run} backlog drain, {workers} workers"):
            backlog[run], ids[run] = backlog_run(env, source, workers, run, coordinator_settings(plan, slots))
    backlog["unsplit"]["verify"] = verify_backlog(env, source, workers, "unsplit", coordinator_settings(plan, 0))
    backlog["split"]["identical_to_verified_run"] = bool(np.array_equal(ids["split"], ids["unsplit"]))
    steady(backlog, _first_split_s(backlog["split"]))
    unsplit_rate = backlog["unsplit"]["tuples_per_s_steady"] or backlog["unsplit"]["tuples_per_s"]
    rate = min(plan.load * unsplit_rate / 2, plan.live_rate_cap or float("inf"))
    seconds = plan.headline_seconds if case == HEADLINE else plan.live_seconds
    live = {}
    for run, slots in runs.items():
        job = live_job(env, plan, source, run, workers, slots, rate)
        with env.phase(f"{case.name}: {run} live, {rate:,.0f} tuples/s per stream for {seconds:.0f}s"):
            live[run] = live_run(env, job, workers, rate, seconds)
    out = {run: {"backlog": backlog[run], "live": live[run]} for run in runs}
    expected = backlog["unsplit"]["verify"]["expected"]
    out["peers"] = peers(env, source, plan, case, expected, pyflink=plan.pyflink or case == HEADLINE)
    return {"case": {"exponent": case.exponent, "top_key_share": case.share, "describe": case.describe(),
                     "backlog": loaded, "live_rate_per_stream": rate, "live_window_ms": plan.live_window_ms(rate),
                     "live_seconds": seconds}, **out}


def _first_split_s(run: dict) -> float | None:
    """Seconds after the split backlog run's start at which its first key was split."""
    return min((e["after_s"] for e in run["splits"]), default=None)


# ---------------------------------------------------------------- the report


def exact_runs(case: dict) -> list[bool]:
    """Each of our runs of a case exact: Spark-verified (the live runs, the unsplit backlog run),
    or the verified output id for id (the split backlog run)."""
    checks = [_verified(case["unsplit"]["backlog"]["verify"])]
    for run in ("unsplit", "split"):
        checks.append(_verified(case[run]["live"]["verify"]))
    checks.append(case["split"]["backlog"]["identical_to_verified_run"])
    return checks


def _verified(v: dict) -> bool:
    return bool(v["verified"] and v["missing"] == v["extra"] == v["duplicates"] == 0)


def ratios(name: str, case: dict, peers: dict) -> dict:
    """The case's ratios: split over unsplit (throughput; p99 the other way round), ours over each
    of the case's `peers`."""
    out = split_ratios(name, case)
    for peer_name, peer in peers.items():
        if not peer.get("ran", True) or not peer.get("tuples_per_s"):
            continue
        for run in ("unsplit", "split"):
            out[f"{name}_{run}_vs_{peer_name}_throughput"] = report.ratio(
                case[run]["backlog"]["tuples_per_s"], peer["tuples_per_s"], "backlog throughput (10%-90%)",
                "tuples/s")
    return out


def split_ratios(name: str, case: dict) -> dict:
    """Split over unsplit: steady backlog throughput, and p99 delay the other way round."""
    out = {}
    unsplit, split = case["unsplit"], case["split"]
    out[f"{name}_split_vs_unsplit_throughput"] = report.ratio(
        split["backlog"]["tuples_per_s_steady"], unsplit["backlog"]["tuples_per_s_steady"],
        "backlog throughput at steady state, split over unsplit", "tuples/s")
    out[f"{name}_unsplit_vs_split_p99"] = report.ratio(
        unsplit["live"]["verify"]["delay_ms"]["p99"], split["live"]["verify"]["delay_ms"]["p99"],
        "p99 production delay at the paced rate, unsplit over split (above 1: split is faster)", "ms")
    return out


def acceptance(cases: dict, workers: int) -> dict:
    """The headline's goal: with one key at 40% on 3 workers, split throughput >= 2x and split p99
    <= half of unsplit's, every run exact."""
    name = HEADLINE.name
    case = cases.get(name)
    what = f"one key at 40% on 3 workers: split throughput >= {GOAL:g}x unsplit, p99 <= 1/{GOAL:g} of unsplit, exact"
    if case is None:
        return {"what": what, "met": None, "why": "no headline case"}
    r = split_ratios(name, case)
    tput, p99 = (r[f"{name}_split_vs_unsplit_throughput"]["ratio"], r[f"{name}_unsplit_vs_split_p99"]["ratio"])
    met = bool(workers == 3 and all(exact_runs(case)) and tput is not None and p99 is not None
               and tput >= GOAL and p99 >= GOAL)
    return {"what": what, "workers": workers, "throughput_ratio": tput, "p99_ratio": p99, "met": met}


def parameters(plan: SkewPlan, quick: bool, workers: int) -> dict:
    return {"mode": "quick" if quick else "full", "workers": workers, "slots_split": max(1, workers - 1),
            "cases": [{"name": c.name, "exponent": c.exponent, "top_key_share": c.share} for c in plan.cases],
            "headline": HEADLINE.name, "backlog_tuples": plan.backlog_tuples,
            "backlog_event_rate_per_stream": plan.event_rate, "window_ms": plan.window_ms,
            "window_tuples_per_stream": plan.window_tuples, "live_load": plan.load,
            "live_rate": f"{plan.load:g} x the unsplit backlog drain's steady rate, per stream; the live window "
                         "holds as many tuples as the backlog's",
            "live_seconds": plan.live_seconds, "headline_live_seconds": plan.headline_seconds,
            "partitions": plan.partitions, "domain": plan.domain, "random_state": plan.random_state,
            "max_batch_records": MAX_BATCH_RECORDS,
            "live_rate_cap_per_stream": plan.live_rate_cap,
            "detection": DETECTION | {"hot_key_min_tuples": plan.hot_key_min_tuples},
            "spark_files_per_trigger": plan.spark_files_per_trigger, "arrivals": "Poisson",
            "generator": "services/workloads.py kind zipf: the backlog by bench/backlog.py, the live input by "
                         "bench/paced.py (100 ms ticks)",
            "steady_state": "committed offsets sampled every 0.5 s; throughput from the share of the input the split "
                            "run had committed when its first key was split (at least 10%) to 90%, the same share "
                            "for both runs"}


def assemble(plan: SkewPlan, quick: bool, workers: int, cases: dict) -> dict:
    peers = {name: case.pop("peers") for name, case in cases.items()}
    all_ratios = {}
    for name, case in cases.items():
        all_ratios |= ratios(name, case, peers[name])
    return {"workload": "skew", "exact": all(all(exact_runs(c)) for c in cases.values()),
            "parameters": parameters(plan, quick, workers), "ours": {"cases": cases, "headline": HEADLINE.name},
            "peers": peers, "ratios": all_ratios, "acceptance": acceptance(cases, workers)}


# ---------------------------------------------------------------- the plot


def plot(result: dict, path: Path) -> None:
    """Throughput (top) and p99 delay (bottom) by Zipf exponent (left) and by the top key's share
    (right): unsplit, split, and the peers' throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases, peers = result["ours"]["cases"], result["peers"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    sweeps = [("Zipf exponent (no extra key)", [(c, cases.get(Case(c, 0.0).name)) for c in EXPONENTS]),
              ("share of the input on one key (uniform keys besides)",
               [(s * 100, cases.get(Case(0.0, s).name)) for s in SHARES])]
    for col, (label, points) in enumerate(sweeps):
        points = [(x, c) for x, c in points if c is not None]
        names = [Case(x, 0.0).name if col == 0 else Case(0.0, x / 100).name for x, _ in points]
        xs = [x for x, _ in points]
        series = {"unsplit": [c["unsplit"]["backlog"]["tuples_per_s_steady"] for _, c in points]}
        delays = {"unsplit": [c["unsplit"]["live"]["verify"]["delay_ms"]["p99"] for _, c in points]}
        series["split"] = [c["split"]["backlog"]["tuples_per_s_steady"] for _, c in points]
        delays["split"] = [c["split"]["live"]["verify"]["delay_ms"]["p99"] for _, c in points]
        for peer in ("spark", "pyflink"):
            series[peer] = [peers[n][peer].get("tuples_per_s") if peers[n][peer].get("ran", True) else None
                            for n in names]
        for i, (who, ys) in enumerate(series.items()):
            kept = [(x, y) for x, y in zip(xs, ys) if y]
            if kept:
                axes[0][col].plot(*zip(*kept), "o-" if i < 2 else "s--", color=f"C{i}", label=who)
        for i, (who, ys) in enumerate(delays.items()):
            axes[1][col].plot(xs, ys, "o-", color=f"C{i}", label=f"{who}: p99")
        axes[0][col].set_ylabel("backlog throughput (tuples/s)")
        axes[1][col].set_ylabel("p99 production delay (ms)")
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel(label)
        for row in (0, 1):
            axes[row][col].grid(alpha=0.3, which="both")
            axes[row][col].legend(fontsize=8)
    p = result["parameters"]
    fig.suptitle(f"skew ({p['mode']}): {p['workers']} workers, {p['partitions']} partitions, windows of "
                 f"{p['window_tuples_per_stream']:g} tuples per stream; p99 at {p['live_load']:g}x the unsplit drain "
                 "rate", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
