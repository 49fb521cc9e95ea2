"""`streamjoin bench splitjoin`: SplitJoin mode (the SplitJoin paper's design) on the handshake /
SplitJoin band join, against our PSP ring on the same input in the same run
and against SplitJoin's published sustained rates.

The join and the backlogs are bench band's (bench/band.py: R(x, y,
z) and S(a, b, c, d), values uniform in 1..10^4, r.x within 10 of s.a and r.y
within 10 of s.b; a 15-minute time window and a 2^21-tuple count window; Arrow
IPC block records, one partition per input topic, a sentinel after the end).
Per window, one backlog serves every run: first the ring (bench band's ring
run, `ring_nodes` nodes), then SplitJoin with k = 1, 2, 4 cores (and 8, 16, ...
up to the machine's CPU count in the full run), each k with strict order
(`punctuate_every` 1). The precision knob runs at one k on a time window of its
own (`precision_case`): punctuate_every 1, 16, 256, 4096 and 0 (unordered). In
the full run that window is 60 s, not 15 minutes: what the knob costs is
punctuation and merging per released tuple, which the window's size does not
change, and five more runs at the paper's window would double the bench's time.

One SplitJoin run, on a broker of its own (Tansu keeps every record in memory):
1. backlog: every record but the last `live_ms` of event time is written first;
   k cores (`streamjoin worker --core I`) and the merger start on it. Progress
   is the slowest core's `streamjoin_splitjoin_core_through` (every core probes
   every tuple), sampled every `sample_s`. Sustained throughput is the tuples
   from the one that fills the window to the last one the pre-written part lets
   go (the watermark, the older stream's newest time less the lateness), over
   the time from the slowest core passing the first to the later of it passing
   the second and the merger writing the last of their results.
2. live tail: once the merger has released the pre-written part (its
   RoundRelease on the commits topic), the last `live_ms` of event time is
   written as it happens, one record per stream per `tick_ms`, then the
   sentinel. Visiting latency (the SplitJoin paper, section 6: T_match - max(t_r, t_s)) is
   measured on the results whose newer member is live: the Kafka timestamp of
   the merger's result record minus the newest arrival (the Kafka timestamp of
   each member's input record). Its two parts: the core's (`produced_ms` minus
   that arrival) and the merger's added latency (its write minus `produced_ms`),
   the latter also from the merger's histogram, as a cross-check. The tail's
   rate is the backlog's; a k whose throughput is below it falls behind, which
   the latency shows, and so does `released_after_live_s` (from the last live
   record to the merger's release of everything, within RELEASE_POLL_S).
3. checks, on the whole results topic (one partition, read back in chunks):
   exact: the last `check_triggers` tuples' results against bench band's NumPy
   brute force (missing = extra = duplicate = 0), every result's members found
   in the backlog, no duplicate pair anywhere, nothing dead-lettered, no
   restart, everything released in the budget; ordered: the results in input
   order, i.e. by (probing member's place, partner's place) in the order
   (ts, stream, partition, offset), strictly ascending. Order is promised for
   punctuate_every > 0 and only measured for 0. The report's `exact` is true
   when every run is exact, and ordered where order is promised.

Allowed lateness is 0 in the SplitJoin jobs (the ring keeps the band job's
200 ms): each stream is one partition in event-time order, so nothing can be
late, and the input order's wait for the other stream's progress is then the
only watermark wait inside the visiting latency.

Ratios: SplitJoin over the ring on the same backlog (sustained tuples/s once the
window is full), over SplitJoin's published 4,400 (time) and 5,200 (count)
tuples/s on 28 cores, total and per core; the knob's runs over its punctuate-1
run. The full run takes about an hour here (6 SplitJoin runs and 2 rings, each
filling a 15-minute or 2^21-tuple window, and the knob's 5 short runs);
`--quick` runs one run per figure family: k = 2 on each window (strict order)
and, at k = 2, punctuate_every 16 and 0 on the time window's backlog, beside the
ring on both, on 2 s / 2,000-tuple windows (4 s of event time at 1,000
tuples/s per stream) with a 0.5 s live tail, each on a broker of its own, so its
time is mostly the runs' processes starting and stopping.

This module runs the plan and writes the report; one SplitJoin run, its plans and its
checks are in splitjoin_run.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamjoin.bench import band, band_workload, report
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.splitjoin_run import CPU_COUNT, FULL, QUICK, Plan, run_splitjoin


# ---------------------------------------------------------------- the workload


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    runs: list[dict] = []
    rings: list[dict] = []
    for case, ring, settings in backlog_runs(plan):
        with env.phase(f"generating the {case.name} backlog ({case.span_ms / 1000:.0f}s of event time)"):
            backlog = band_workload.make_backlog(case, plan.base, plan.live_from(case), plan.tick_ms)
        if ring:
            rings.append(band.run_ring(env, backlog, plan.ring_nodes, plan.base, consume=False)["run"])
        for cores, every, role in settings:
            runs.append(run_splitjoin(env, backlog, plan, cores, every) | {"role": role})
        del backlog  # the next one is as large
    peers = {"ring": band.summarise(rings), "splitjoin_published": band.splitjoin_published()}
    result = {
        "workload": "splitjoin",
        "exact": all(r["exact"] and (r["ordered"] or not r["order_promised"]) for r in runs)
        and all(r["exact"] for r in rings),
        "ordered": all(r["ordered"] for r in runs if r["order_promised"]),
        "parameters": parameters(plan, quick),
        "ours": summarise(runs, plan),
        "peers": peers,
        "ratios": ratios(runs, rings, plan),
    }
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def backlog_runs(plan: Plan) -> list[tuple[band_workload.Case, bool, list[tuple[int, int, str]]]]:
    """Per backlog: its case, whether the ring runs on it, and its SplitJoin runs as (cores,
    punctuate_every, role); role "sweep" is the k sweep (strict order), "precision" the knob."""
    knob = [(plan.precision_k, p, "precision") for p in (1, *plan.precisions)]
    out = []
    for case in (plan.time, plan.count):
        settings = [(k, 1, "sweep") for k in plan.ks]
        if case == plan.precision_case:  # the knob shares the sweep's strict-order run
            settings += [setting for setting in knob if setting[1] != 1]
        out.append((case, True, settings))
    if plan.precision_case not in (plan.time, plan.count):
        out.append((plan.precision_case, False, knob))
    return out


def parameters(plan: Plan, quick: bool) -> dict:
    return band.parameters(plan.base, quick) | {
        "runs": [{"window": c.kind, "window_size": c.size, "rate_per_stream": c.rate, "event_time_s": c.span_ms / 1000,
                  "live_tail_s": plan.live_ms / 1000} for c in (plan.time, plan.count)],
        "cores": list(plan.ks), "precision_cores": plan.precision_k, "precisions": [1, *plan.precisions],
        "precision_window_ms": plan.precision_case.size, "precision_rate_per_stream": plan.precision_case.rate,
        "ring_nodes": plan.ring_nodes, "batch_ms": plan.batch_ms, "live_tick_ms": plan.tick_ms,
        "splitjoin_allowed_lateness_ms": 0, "machine_cpu_count": CPU_COUNT,
        "sustainable_rule": "R per stream is sustainable when SplitJoin (or the ring) processes at least 2R "
                            "tuples/s (both streams) once the window is full",
        "throughput_rule": "tuples from the one that fills the window to the end of the pre-written part, over the "
                           "time the slowest core and the merger took for them",
        "visiting_latency": "results whose newer member was written live (the last live_tail_s of event time, at "
                            "the backlog's rate): merger write (result record timestamp) - max(t_r, t_s), t the "
                            "member's input record timestamp",
    }


def summarise(runs: list[dict], plan: Plan) -> dict:
    """Throughput and latency against k per window (the strict-order runs), the precision knob,
    and per window the best rate."""
    out: dict = {"runs": runs}
    for kind in ("time", "count"):
        sweep = [r for r in runs if r["window"] == kind and r["role"] == "sweep"]
        out[f"{kind}_vs_cores"] = [_figures(r) for r in sweep]
        measured = [r for r in sweep if r["tuples_per_s"] is not None]
        if measured:
            best = max(measured, key=lambda r: r["tuples_per_s"])
            out[f"{kind}_window"] = {"tuples_per_s": best["tuples_per_s"], "cores": best["cores"],
                                     "per_core_tuples_per_s": best["tuples_per_s"] / band.MACHINE_CORES}
    out["precision"] = [_figures(r) for r in knob_runs(runs, plan)]
    return out


def knob_runs(runs: list[dict], plan: Plan) -> list[dict]:
    """The precision knob's runs, punctuate_every 1 first (on a shared backlog, the sweep's run at its k)."""
    size = plan.precision_case.size
    return [r for r in runs if r["window"] == "time" and r["window_size"] == size and r["cores"] == plan.precision_k
            and (r["role"] == "precision" or r["punctuate_every"] == 1)]


def _figures(run: dict) -> dict:
    """One run's headline figures."""
    lat = run["latency"]
    return {"cores": run["cores"], "punctuate_every": run["punctuate_every"], "tuples_per_s": run["tuples_per_s"],
            "sustainable": run["sustainable"], "exact": run["exact"], "ordered": run["ordered"],
            "visiting_p50_ms": lat["visiting"]["p50_ms"], "visiting_p99_ms": lat["visiting"]["p99_ms"],
            "core_p50_ms": lat["core"]["p50_ms"], "merger_added_p50_ms": lat["merger_added"]["p50_ms"],
            "merger_added_p99_ms": lat["merger_added"]["p99_ms"]}


def ratios(runs: list[dict], rings: list[dict], plan: Plan) -> dict:
    """SplitJoin over the ring on the same backlog, over the paper (total and per core); the
    knob's runs over its punctuate-1 run. Each ratio carries the figures it divides."""
    paper = band.splitjoin_published()
    out = {}
    for r in runs:
        key, rate = run_key(r), r["tuples_per_s"]
        ring = next((x for x in rings if x["window"] == r["window"] and x["window_size"] == r["window_size"]), None)
        if ring is None:  # the knob's own backlog: neither the ring's nor the paper's window
            continue
        out[f"{key}_vs_ring"] = report.ratio(rate, ring["tuples_per_s"], f"sustained tuples/s, full window, same "
                                             f"backlog: SplitJoin vs our PSP ring of {ring['nodes']} node(s)",
                                             "tuples/s")
        out[f"{key}_vs_paper"] = report.ratio(rate, paper[r["window"]]["tuples_per_s"],
                                              "sustained tuples/s, both streams, full window", "tuples/s")
        out[f"{key}_vs_paper_per_core"] = report.ratio(
            None if rate is None else rate / band.MACHINE_CORES, paper[r["window"]]["per_core_tuples_per_s"],
            f"per core: ours over {band.MACHINE_CORES} cores, "
            f"SplitJoin over {band_workload.SPLITJOIN_CORES} join cores",
            "tuples/s/core")
    knob = knob_runs(runs, plan)
    strict = next((r for r in knob if r["punctuate_every"] == 1), None)
    for r in knob:
        if strict is None or r is strict:
            continue
        key = run_key(r)
        out[f"{key}_vs_p1"] = report.ratio(r["tuples_per_s"], strict["tuples_per_s"],
                                           "sustained tuples/s vs strict order (punctuate_every 1)", "tuples/s")
        out[f"{key}_visiting_p99_vs_p1"] = report.ratio(r["latency"]["visiting"]["p99_ms"],
                                                        strict["latency"]["visiting"]["p99_ms"],
                                                        "visiting latency p99 vs strict order", "ms")
    return out


def run_key(run: dict) -> str:
    """A run's name in `ratios`: window, cores, punctuation (e.g. time_k2_p1). Unique among the
    keys: the knob's own backlog has no ring or paper ratio, and only its other runs have `_vs_p1`."""
    return f"{run['window']}_k{run['cores']}_p{run['punctuate_every']}"


def plot(result: dict, path: Path) -> None:
    """Three panels: throughput against k (the ring and the paper as lines), visiting latency
    against k, and the precision knob's throughput and latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ours_, peers = result["ours"], result["peers"]
    fig, (ax_t, ax_l, ax_p) = plt.subplots(1, 3, figsize=(17, 4.8))
    for c, kind in enumerate(("time", "count")):
        sweep = [f for f in ours_[f"{kind}_vs_cores"] if f["tuples_per_s"] is not None]
        ks = [f["cores"] for f in sweep]
        ax_t.plot(ks, [f["tuples_per_s"] for f in sweep], "o-", color=f"C{c}", label=f"SplitJoin, {kind} window")
        ring = next((r for r in peers["ring"]["runs"] if r["window"] == kind), None)
        if ring is not None and ring["tuples_per_s"]:
            ax_t.axhline(ring["tuples_per_s"], color=f"C{c}", linestyle="--", alpha=0.7,
                         label=f"PSP ring, {ring['nodes']} node, {kind}")
        paper = peers["splitjoin_published"][kind]["tuples_per_s"]
        ax_t.axhline(paper, color=f"C{c}", linestyle=":", alpha=0.7, label=f"paper, 28 cores, {kind} ({paper:g}/s)")
        lat = [f for f in ours_[f"{kind}_vs_cores"] if f["visiting_p50_ms"] is not None]
        ks = [f["cores"] for f in lat]
        ax_l.plot(ks, [f["visiting_p50_ms"] for f in lat], "o-", color=f"C{c}", label=f"{kind}: visiting p50")
        ax_l.plot(ks, [f["visiting_p99_ms"] for f in lat], "s--", color=f"C{c}", label=f"{kind}: visiting p99")
        ax_l.plot(ks, [f["merger_added_p50_ms"] for f in lat], "^:", color=f"C{c}", label=f"{kind}: merger added p50")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["parameters"]["cores"], [str(k) for k in result["parameters"]["cores"]])
        ax.set_xlabel("SplitJoin cores (k)")
        ax.set_yscale("log")  # before the formatters: setting a scale resets them
        ax.yaxis.set_major_formatter(plain)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    ax_t.set_ylabel("sustained tuples/s (both streams)")
    ax_t.set_title("throughput, full window")
    ax_l.yaxis.set_minor_formatter(plain)  # latencies span about a decade: label the minor ticks too
    ax_l.tick_params(axis="y", which="minor", labelsize=6)
    ax_l.set_ylabel("ms")
    ax_l.set_title("visiting latency (live tail)")
    knob = ours_["precision"]
    labels = [str(f["punctuate_every"]) if f["punctuate_every"] else "0 (unordered)" for f in knob]
    x = np.arange(len(knob))
    ax_p.bar(x, [f["tuples_per_s"] or 0 for f in knob], color="C2", alpha=0.6, label="tuples/s")
    ax_p.set_xticks(x, labels)
    params = result["parameters"]
    ax_p.set_xlabel(f"punctuate_every ({params['precision_cores']} cores, "
                    f"{params['precision_window_ms'] / 1000:g} s time window)")
    ax_p.set_ylabel("sustained tuples/s")
    ax_r = ax_p.twinx()
    ax_r.plot(x, [f["visiting_p50_ms"] for f in knob], "o-", color="C3", label="visiting p50 (ms)")
    ax_r.plot(x, [f["visiting_p99_ms"] for f in knob], "s--", color="C3", label="visiting p99 (ms)")
    ax_r.set_ylabel("ms")
    ax_p.set_title("precision knob")
    handles = ax_p.get_legend_handles_labels()[0] + ax_r.get_legend_handles_labels()[0]
    ax_p.legend(handles, [h.get_label() for h in handles], fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
