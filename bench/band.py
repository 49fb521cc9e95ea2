"""`streamjoin bench band`: the handshake / SplitJoin band join (the SplitJoin
paper, section 6) on our PSP ring, against SplitJoin's published sustained rates.

The join is streamjoin/jobs/band.yaml: R(x int, y float, z char[20]) and
S(a int, b float, c double, d bool), values uniform in 1..10^4, predicate
r.x BETWEEN s.a-10 AND s.a+10 AND r.y BETWEEN s.b-10 AND s.b+10, run in ring
mode with `ring.nodes` fixed. Two windows, as in the paper: 15 minutes of
event time, and 2^21 tuples per stream.

Ring sizes: the plan's runs fix them (FULL: N = 1, 2 on the time window, 1 on
the others; QUICK: 1 and 2 on a 2 s time window, 1 on a 2,000-tuple count
window, each backlog 7 s of event time at 1,000 tuples/s per stream).
`--nodes 1,2,4` runs a scaling curve instead: the plan's time window on a
ring of each size, and the report's `scaling` gives each N's sustained
tuples/s and its ratio to the smallest N (N=1 when listed). Each ring is its own process per node, so N above the machine's
cores measures contention as much as scaling.

Sustained input rate, without waiting 15 minutes. Event time is not wall
time: a backlog whose event times span the window plus a measured stretch at
R tuples/s per stream is written to Kafka first, then a fresh ring reads it
as fast as it can. Progress is the head's `streamjoin_tuples_in_total`
(tuples released into the ring), sampled every second; the sustained rate is
what the ring processes once the window is full: from the first sample past
the tuple that fills it to the last result produced (`produced_ms`), so the
last round's work counts. R is sustainable when that rate is at least the
offered 2R. A run the ring is slower on than its budget ends there and
reports the full-window rate measured so far.

What the backlog looks like, and why:
- `format: blocks` for both streams (in the bench's job copy): records are
  Arrow IPC blocks of the stream's fields (schemas/codecs.encode_block), so
  loading the backlog is NumPy and Arrow, and the head does not spend the run
  parsing JSON. The figures therefore leave per-record decoding out; the
  paper's tuples never were serialised either.
- one partition per input topic: a stream's backlog is then in event-time
  order, so reading it fast cannot make tuples late. (With several
  partitions the consumer reads them unevenly, and the watermark, the newest
  event time seen, would run ahead of the slower partitions.)
- `worker.max_batch_records` bounds what the head takes ahead of release, so
  rounds stay near that many tuples and the rate is the one a live stream at
  that rate would see with rounds that size: a round of C tuples takes C/X
  seconds, and at X >= 2R no more than C tuples arrive meanwhile.

Exactness on every run: for the last `check_triggers` tuples (their results
depend only on the window before them) the exact result set is recomputed by
brute force with NumPy, pair by pair over the whole window, and compared with
the results topic: missing, extra and duplicate must be 0, nothing may be
dead-lettered, and every backlog tuple must have been released. The brute
force is itself checked against engine/reference.py on the reference slice.

Each ring run gets its own embedded broker (Tansu keeps every record in
memory and a 15-minute run writes tens of millions of results), stopped
after the run; the backlog is written to it again, which takes seconds.

This module runs the rings and writes the report; the plans and the backlog are in
band_workload.py, the exactness check in band_check.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.bench import ours, report
from streamjoin.bench.band_check import check_tail, run_reference
from streamjoin.bench.band_workload import (FULL, JOB_FILE, QUICK, SPLITJOIN, SPLITJOIN_CORES, Backlog, Plan,
                                            make_backlog, produce_backlog, scaling_plan)
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.peers.kafka_consume import run_kafka_consume
from streamjoin.launcher import Fleet, wait_ring_quiet
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics


TUPLES_IN = "streamjoin_tuples_in"
MACHINE_CORES = len(os.sched_getaffinity(0))  # what our per-core figures divide by


# ---------------------------------------------------------------- one ring run


def ring_job(backlog: Backlog, env: BenchEnv, nodes: int, recovery: bool = True) -> JobSettings:
    """The bench's ring job: `nodes` fixed; `recovery`: ring.recovery (round log and checkpoints)."""
    job = ours.fleet_job(backlog.job, env, f"band-{backlog.case.name}-n{nodes}", nodes)
    return job.model_copy(update={"ring": job.ring.model_copy(update={"nodes": nodes, "max_nodes": nodes,
                                                                      "recovery": recovery})})


def metric_total(port: int, family: str = TUPLES_IN) -> float:
    """One process's metric `family` summed over its labels (a counter's _total, a gauge's value);
    by default the ring head's streamjoin_tuples_in_total: tuples released into the ring."""
    text = ours.metrics_page(port)
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == family
               for s in f.samples if s.name in (family, f"{family}_total"))


def sample_progress(fleet: Fleet, progress: Callable[[], float], done_when: Callable[[float], bool], budget_s: float,
                    every_s: float = 0.5) -> list[tuple[float, float]]:
    """(epoch s, `progress()`: tuples done) every `every_s` from the processes' start until
    `done_when(tuples done)` or the budget is spent (0 while a /metrics is not up yet)."""
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        fleet.assert_running()
        try:
            done = progress()
        except OSError:
            done = 0.0
        samples.append((time.time(), done))
        if done_when(done):
            break
        time.sleep(every_s)
    return samples


@contextmanager
def fresh_broker(env: BenchEnv, name: str) -> Iterator[BenchEnv]:
    """`env` on a broker of its own, stopped (and its memory freed) on exit."""
    broker = embedded.start(log_path=env.workdir / f"broker-{name}.log")
    try:
        yield dataclasses.replace(env, bootstrap=broker.bootstrap)
    finally:
        broker.stop()


def run_ring(env: BenchEnv, backlog: Backlog, nodes: int, plan: Plan, consume: bool, recovery: bool = True) -> dict:
    """Backlog into a fresh broker, a ring of `nodes` reads it; sustained rate and the exactness check.
    With `consume`, the raw-consumption peer reads the same topics first; `recovery`: ring.recovery."""
    case = backlog.case
    with fresh_broker(env, f"{case.name}-n{nodes}") as here, ExitStack() as stack:
        job = ring_job(backlog, here, nodes, recovery)
        topics.ensure(here.cluster.admin(), job)
        with env.phase(f"{case.name}: writing {backlog.tuples:,} tuples ({backlog.bytes / 1e6:.0f} MB)"):
            produce_backlog(here.cluster, job, backlog)
        peer = None
        if consume:
            with env.phase(f"{case.name}: raw consumption of the input topics"):
                peer = run_kafka_consume(here.cluster, job.input_topics, job.partitions, plan.consume_repeats)
        with env.phase(f"{case.name}: ring of {nodes} starts and joins the backlog"):
            # Sampling starts with the processes: the ring reads the backlog as soon as its layout is set.
            fleet, ids = ours.start_fleet(here, job, nodes, wait=False)
            stack.callback(fleet.stop_all)
            began, load_before = time.time(), report.load_average()
            port = fleet.metrics_ports[ids[0]]
            samples = sample_progress(fleet, lambda: metric_total(port), lambda done: done >= backlog.tuples,
                                      plan.budget_s, plan.sample_s)
            finished = samples[-1][1] >= backlog.tuples
            if finished:
                wait_ring_quiet(job, here.bootstrap, fleet, timeout=max(120.0, plan.budget_s / 4))
            restarts, load_after = fleet.restarts, report.load_average()
            fleet.stop_all()
        with env.phase(f"{case.name}: exactness check of the last {plan.check_triggers} tuples"):
            check = check_tail(here.cluster, job, backlog, plan.check_triggers, finished)
        dead = sum(kafka.end_offsets(here.cluster, [(job.dead_letter_topic, p) for p in range(job.partitions)],
                                     f"{job.consumer_group}-bench-dead").values())
    rate = full_window_rate(samples, backlog.full_at(), check["last_produced_s"] if finished else None)
    offered = 2 * case.rate
    exact = bool(finished and check["exact"] and dead == 0 and restarts == 0)
    out = {
        "window": case.kind, "window_size": case.size, "nodes": nodes, "recovery": recovery,
        "rate_per_stream": case.rate, "offered_tuples_per_s": offered,
        "tuples_per_s": rate, "sustainable": rate is not None and rate >= offered,
        "per_core_tuples_per_s": None if rate is None else rate / MACHINE_CORES,
        "tuples_per_s_10_90": report.sustained_rate([s for s in samples if s[1] >= backlog.full_at()]),
        "samples_with_full_window": sum(s[1] >= backlog.full_at() for s in samples),
        "input_tuples": backlog.tuples, "window_full_after_tuples": backlog.full_at(),
        "input_bytes": backlog.bytes, "finished": finished,
        "wall_seconds": round(samples[-1][0] - began, 1), "restarts": restarts, "dead_letters": dead,
        "load_average_before_after": [load_before, load_after],
        "exact": exact, "check": {k: v for k, v in check.items() if k != "last_produced_s"},
        "progress": thin(samples, began),
    }
    return {"run": out, "kafka_consume": peer}


def full_window_rate(samples: list[tuple[float, float]], full_at: int, last_produced_s: float | None) -> float | None:
    """Tuples/s from when the window filled to the end: the last result produced if the backlog
    was finished, else the last sample."""
    t_full = crossing(samples, full_at)
    if t_full is None:
        return None
    end_t, end_done = samples[-1]
    if last_produced_s is not None:
        end_t = max(end_t, last_produced_s)
    return (end_done - full_at) / (end_t - t_full) if end_t > t_full and end_done > full_at else None


def crossing(samples: list[tuple[float, float]], count: float) -> float | None:
    """When the progress samples (time, tuples done) passed `count` (None if they never did),
    interpolated between the two samples around it (a round can carry the count past it
    between samples)."""
    after = next((k for k, s in enumerate(samples) if s[1] >= count), None)
    if after is None:
        return None
    t1, d1 = samples[after]
    t0, d0 = samples[after - 1] if after else (t1, d1)
    return t1 if d1 == d0 else t0 + (count - d0) / (d1 - d0) * (t1 - t0)


def thin(samples: list[tuple[float, float]], began: float, keep: int = 200) -> list[list[float]]:
    """At most `keep` progress samples (seconds since start, tuples released), for the report and plot."""
    step = max(1, len(samples) // keep)
    picked = samples[::step] + ([samples[-1]] if len(samples) % step != 1 else [])
    return [[round(t - began, 2), int(d)] for t, d in picked]


def splitjoin_published() -> dict:
    return {
        kind: {**fig, "cores": SPLITJOIN_CORES, "per_core_tuples_per_s": fig["tuples_per_s"] / SPLITJOIN_CORES}
        for kind, fig in SPLITJOIN.items()
    } | {
        "source": "the SplitJoin paper (/work/shared/seeds/splitjoin-coordination-free.txt), section 6 "
                  "(experimental evaluation), Figures 12 and 16: 28 join cores on a 32-core Dell PowerEdge R820 "
                  "(4 x Intel E5-4650); time window 15 min, count window 2^21 tuples per stream",
        "note": "published figures, not run here; totals over both streams (4400/s x 900 s / 2 ~ 2^21 per stream)",
    }


# ---------------------------------------------------------------- the workload


def run(env: BenchEnv, quick: bool, plot_path: Path | None, nodes: tuple[int, ...] | None = None,
        durability: bool = False) -> dict:
    """The workload. nodes: ring sizes (see parse_nodes) to run as a scaling curve on the plan's
    time window instead of the plan's own runs; the report then has a `scaling` section.
    durability: every run once more with ring.recovery off (no round log, no checkpoints); the
    report's `durability` section gives both rates and their ratio, what crash recovery costs."""
    plan = QUICK if quick else FULL
    if nodes:
        plan = scaling_plan(plan, nodes)
    runs: list[dict] = []
    consume = floor = None
    cases = list(dict.fromkeys(case for case, _ in plan.runs))
    for case in cases:
        with env.phase(f"generating the {case.name} backlog ({case.span_ms / 1000:.0f}s of event time)"):
            backlog = make_backlog(case, plan)
        if floor is None:
            with env.phase("reference peer"):
                floor = run_reference(backlog, plan.reference_tuples)
        for c, size in plan.runs:
            for recovery in (True, False) if durability else (True,):
                if c != case:
                    continue
                got = run_ring(env, backlog, size, plan, consume=consume is None, recovery=recovery)
                consume = consume or {**got["kafka_consume"], "backlog": case.name,
                                      "input_tuples": backlog.tuples, "input_bytes": backlog.bytes}
                runs.append(got["run"])
        del backlog  # the next one is as large
    assert consume is not None and floor is not None
    off = [r for r in runs if not r["recovery"]]
    runs = [r for r in runs if r["recovery"]]
    peers = {"splitjoin_published": splitjoin_published(), "kafka_consume": consume, "reference": floor}
    result = {
        "workload": "band",
        "exact": all(r["exact"] for r in runs) and floor["checker_agrees_with_reference"],
        "parameters": parameters(plan, quick),
        "ours": summarise(runs),
        "peers": peers,
        "ratios": ratios(runs, peers),
    }
    if off:
        result["durability"] = durability_cost(runs, off)
    if nodes:
        result["scaling"] = curve = scaling(runs)
        result["ratios"] |= {f"{run_key(r)}_vs_n{curve['base_nodes']}": point["vs_base"]
                             for r, point in zip(runs, curve["curve"])}
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def parameters(plan: Plan, quick: bool) -> dict:
    job = load(JOB_FILE)
    return {
        "mode": "quick" if quick else "full",
        "join": "R(x int, y float, z char[20]) x S(a int, b float, c double, d bool), values uniform in "
                f"1..{job.workload.value_max}",
        "predicate": [t.model_dump(exclude_none=True) for t in job.join.predicate],
        "runs": [{"window": c.kind, "window_size": c.size, "rate_per_stream": c.rate,
                  "event_time_s": c.span_ms / 1000, "measured_event_time_s": c.measure_ms / 1000, "nodes": n}
                 for c, n in plan.runs],
        "format": "blocks (Arrow IPC, schemas/codecs.encode_block), "
                  f"{plan.block_tuples} tuples per record, one partition per input topic",
        "round_cap_tuples": plan.round_cap, "round_ms": job.ring.round_ms,
        "allowed_lateness_ms": job.join.allowed_lateness_ms, "arrivals": "Poisson (event time)",
        "check_triggers": plan.check_triggers, "budget_s_per_run": plan.budget_s, "machine_cores": MACHINE_CORES,
        "sustainable_rule": "R per stream is sustainable when the ring processes at least 2R tuples/s "
                            "(both streams) once the window is full",
    }


def summarise(runs: list[dict]) -> dict:
    """Per window kind: the best measured rate and the highest sustainable offered rate."""
    out: dict = {"runs": runs}
    for kind in ("time", "count"):
        mine = [r for r in runs if r["window"] == kind and r["tuples_per_s"] is not None]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["tuples_per_s"])
        ok = [r for r in mine if r["sustainable"] and r["exact"]]
        out[f"{kind}_window"] = {
            "tuples_per_s": best["tuples_per_s"], "nodes": best["nodes"],
            "per_core_tuples_per_s": best["tuples_per_s"] / MACHINE_CORES,
            "highest_sustainable_tuples_per_s": max((r["offered_tuples_per_s"] for r in ok), default=None),
        }
    return out


def scaling(runs: list[dict]) -> dict:
    """The curve of a --nodes run (its runs differ in ring size only): per N the sustained
    tuples/s and, as a ratio with both figures, that over the smallest ring's (N=1 when run)."""
    base = min(runs, key=lambda r: r["nodes"])
    curve = [{"nodes": r["nodes"], "tuples_per_s": r["tuples_per_s"], "sustainable": r["sustainable"],
              "exact": r["exact"],
              "vs_base": report.ratio(r["tuples_per_s"], base["tuples_per_s"],
                                      f"sustained input rate, both streams, full window, N={r['nodes']} over "
                                      f"N={base['nodes']}", "tuples/s")} for r in runs]
    return {"window": base["window"], "window_size": base["window_size"], "rate_per_stream": base["rate_per_stream"],
            "base_nodes": base["nodes"], "curve": curve}


def durability_cost(on: list[dict], off: list[dict]) -> dict:
    """Per run, the sustained rate with ring.recovery on beside the same run with it off, and
    their ratio (1.0: recovery is free; the runs differ in that setting only)."""
    pairs = []
    for with_log, without in zip(on, off):
        pairs.append({"run": run_key(with_log), "exact_on": with_log["exact"], "exact_off": without["exact"],
                      "on_vs_off": report.ratio(with_log["tuples_per_s"], without["tuples_per_s"],
                                                "sustained input rate with ring.recovery on over off", "tuples/s")})
    return {"what": "round log flushed before every round enters the ring, a checkpoint every ring.checkpoint_ms "
                    "(releases held until the ring drains)", "runs": pairs}


def ratios(runs: list[dict], peers: dict) -> dict:
    """Ours over each peer, per run, each ratio with the two figures it divides."""
    sj, consume, floor = peers["splitjoin_published"], peers["kafka_consume"], peers["reference"]
    out = {}
    for r in runs:
        key, rate = run_key(r), r["tuples_per_s"]
        paper = sj[r["window"]]
        out[f"{key}_vs_splitjoin"] = report.ratio(rate, paper["tuples_per_s"],
                                                  "sustained input rate, both streams, full window", "tuples/s")
        out[f"{key}_vs_splitjoin_per_core"] = report.ratio(
            None if rate is None else rate / MACHINE_CORES, paper["per_core_tuples_per_s"],
            f"per core: ours over {MACHINE_CORES} cores, SplitJoin over {SPLITJOIN_CORES} join cores", "tuples/s/core")
        bytes_per_s = None if rate is None else rate * r["input_bytes"] / r["input_tuples"]
        out[f"{key}_vs_kafka_consume"] = report.ratio(bytes_per_s, consume["bytes_per_s"],
                                                      "input bytes/s joined vs read raw by one consumer", "bytes/s")
    time_runs = [r for r in runs if r["window"] == "time" and r["tuples_per_s"] is not None]
    if time_runs:
        best = max(time_runs, key=lambda r: r["tuples_per_s"])
        out["time_vs_reference"] = report.ratio(best["tuples_per_s"], floor["implied_tuples_per_s_at_full_window"],
                                                "tuples/s at the full window vs the plain-Python reference's "
                                                "pair rate over the same window", "tuples/s")
    return out


def run_key(run: dict) -> str:
    """A run's name in `ratios`: window kind, rate per stream, ring size (e.g. time_r2200_n1)."""
    return f"{run['window']}_r{int(run['rate_per_stream'])}_n{run['nodes']}"


def plot(result: dict, path: Path) -> None:
    """Processed tuples/s over the run for every ring, window kinds side by side, with the
    offered rate and SplitJoin's published figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["ours"]["runs"]
    kinds = [k for k in ("time", "count") if any(r["window"] == k for r in runs)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, r in enumerate(x for x in runs if x["window"] == kind):
            p = np.array(r["progress"], dtype=np.float64)
            if len(p) < 3:
                continue
            rate = np.diff(p[:, 1]) / np.maximum(np.diff(p[:, 0]), 1e-9)
            smooth = np.convolve(rate, np.ones(5) / 5, mode="same")
            ax.plot(p[1:, 1] / r["window_full_after_tuples"], smooth, color=f"C{i}",
                    label=f"ours, {r['nodes']} node(s), R={r['rate_per_stream']:g}/s")
            ax.axhline(r["offered_tuples_per_s"], color=f"C{i}", linestyle=":", alpha=0.6)
        paper = result["peers"]["splitjoin_published"][kind]["tuples_per_s"]
        ax.axhline(paper, color="red", linestyle="--", label=f"SplitJoin, 28 cores ({paper:g}/s)")
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("tuples released / tuples that fill the window")
        ax.set_ylabel("tuples/s processed (both streams)")
        ax.set_title(f"{kind} window" + (" (15 min)" if kind == "time" and result["parameters"]["mode"] == "full"
                                         else ""))
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
