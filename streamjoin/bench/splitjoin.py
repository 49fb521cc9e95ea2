"""`streamjoin bench splitjoin`: SplitJoin mode (seed 001) on the handshake /
SplitJoin band join, against our PSP ring on the same input in the same run
and against SplitJoin's published sustained rates.

The join and the backlogs are bench band's (streamjoin/bench/band.py: R(x, y,
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
   sentinel. Visiting latency (seed 001, section 6: T_match - max(t_r, t_s)) is
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
`--quick` runs the same 12 runs on 5 s / 5,000-tuple windows (10 s of event
time at 1,000 tuples/s per stream) with a 0.5 s live tail, each on a broker of
its own, so its time is mostly the runs' processes starting and stopping.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from streamjoin.bench import band, ours, report
from streamjoin.bench.env import BenchEnv
from streamjoin.launcher import Fleet, write_job
from streamjoin.schemas.result_codec import decode_results, result_layout
from streamjoin.schemas.results import PRODUCED_MS, RoundRelease, decode_commit
from streamjoin.services import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

CORE_THROUGH = "streamjoin_splitjoin_core_through"  # input sequence below which the core has probed everything
MERGER_LATENCY = "streamjoin_splitjoin_merger_added_latency_seconds"
MERGER = "merger"  # the merger's process name and its RoundRelease node
LATENCY_THRESHOLD_MS = 1_000.0  # delay_stats' "under_threshold": the share of results out within a second
RESULT_CHUNK = 200  # result records read back per consumer (a record holds up to 50,000 results)
RELEASE_POLL_S = 0.5  # how often the commits topic is read while waiting for the merger
CPU_COUNT = os.cpu_count() or 1


@dataclass(frozen=True)
class Plan:
    """What one bench run does: two backlogs (bench band's cases, a live tail at their end), the
    cores and precisions tried on them, and bench band's plan for what the runs share."""

    time: band.Case
    count: band.Case
    ks: tuple[int, ...]  # cores per run of the k sweep (strict order)
    precision_case: band.Case  # the knob's backlog (a time window; `time` itself shares that backlog's runs)
    precision_k: int  # the knob's runs: cores
    precisions: tuple[int, ...]  # punctuate_every values besides 1 (0: unordered)
    live_ms: int  # event time at each backlog's end written as it happens (visiting latency)
    tick_ms: int  # event time per live record
    batch_ms: int  # splitjoin.batch_ms
    ring_nodes: int  # the peer ring's size
    base: band.Plan  # block size, round cap, checked tuples, budget per run and sampling; the ring's plan too

    def live_from(self, case: band.Case) -> int:
        """Event time from which a backlog of `case` is written live."""
        return band.T0_MS + case.span_ms - self.live_ms


def _ks(quick: bool) -> tuple[int, ...]:
    """1, 2 and 4 cores; the full run adds each further power of 2 the machine has CPUs for (64 at most)."""
    more = () if quick else tuple(k for k in (8, 16, 32, 64) if k <= CPU_COUNT)
    return (1, 2, 4, *more)


_PRECISIONS = (16, 256, 4096, 0)
_PRECISION_K = 2 if CPU_COUNT < 4 else 4
# Full: the paper's windows and rates (band's FULL cases), with 30 s of live tail beyond band's measured stretch.
# The knob's window is 60 s at the paper's rate, its measured stretch twice that.
FULL = Plan(time=band.Case("time", 900_000, 2200.0, 150_000), count=band.Case("count", 1 << 21, 2600.0, 90_000),
            ks=_ks(quick=False), precision_case=band.Case("time", 60_000, 2200.0, 120_000),
            precision_k=_PRECISION_K, precisions=_PRECISIONS, live_ms=30_000, tick_ms=50,
            batch_ms=50, ring_nodes=1,
            base=dataclasses.replace(band.FULL, runs=(), check_triggers=600, budget_s=1800.0, sample_s=1.0))
# Quick: small windows and a short live tail, so each of the 12 runs is mostly its processes' start and
# stop; the measured stretch is ~9k tuples, a fraction of a second at these windows, so the quick
# figures say little (the full run is the measurement).
_QUICK_TIME = band.Case("time", 5_000, 1000.0, 5_000)
QUICK = Plan(time=_QUICK_TIME, count=band.Case("count", 5_000, 1000.0, 5_000), ks=_ks(quick=True),
             precision_case=_QUICK_TIME, precision_k=2, precisions=_PRECISIONS, live_ms=500, tick_ms=50, batch_ms=50,
             ring_nodes=1,
             base=dataclasses.replace(band.QUICK, runs=(), check_triggers=2_000, budget_s=60.0, sample_s=0.1))


# ---------------------------------------------------------------- the input order


@dataclass(frozen=True)
class Layout:
    """Where a backlog's tuples stand in the input order, and which are written live."""

    ranks: list[np.ndarray]  # per stream, each tuple's place in (ts, stream, partition, offset)
    live_records: list[int]  # per stream, its first live record
    prewritten_watermark: int  # what the pre-written part lets go: tuples below it
    released_before_live: int  # how many tuples that is (a prefix of the input order)
    live_rank: int  # tuples before the first live one in the input order

    @classmethod
    def of(cls, backlog: band.Backlog, live_from: int, lateness_ms: int) -> "Layout":
        """live_from: the event time from which the backlog is written live; lateness_ms: the job's
        allowed lateness (the input order's watermark trails the older stream's newest time by it)."""
        r, s = backlog.ts(0), backlog.ts(1)
        # One partition per stream: the order is (ts, stream, index); r precedes s at equal ts.
        ranks = [np.arange(len(r)) + np.searchsorted(s, r, "left"), np.arange(len(s)) + np.searchsorted(r, s, "right")]
        first = [int(np.searchsorted(backlog.ts(i), live_from, "left")) for i in range(2)]
        records = [int(np.searchsorted(backlog.starts[i], first[i], "left")) for i in range(2)]
        # The input order's watermark once the pre-written part is read: the older stream's newest less the lateness.
        watermark = min(int(backlog.ts(i)[first[i] - 1]) for i in range(2)) - lateness_ms
        released = sum(int(np.searchsorted(backlog.ts(i), watermark, "left")) for i in range(2))
        return cls(ranks, records, watermark, released, sum(first))


# ---------------------------------------------------------------- one SplitJoin run


def splitjoin_job(backlog: band.Backlog, env: BenchEnv, plan: Plan, cores: int, punctuate_every: int) -> JobSettings:
    """The backlog's job in splitjoin mode, renamed for this run and checked as a job file is: `cores`
    cores (also max_cores), `punctuate_every`, the plan's batch_ms, allowed lateness 0."""
    name = f"sj-{backlog.case.name}-k{cores}-p{punctuate_every}"
    job = ours.fleet_job(backlog.job, env, name, cores)
    job = job.model_copy(update={
        "join": job.join.model_copy(update={"mode": "splitjoin", "allowed_lateness_ms": 0}),
        "splitjoin": job.splitjoin.model_copy(update={"cores": cores, "max_cores": cores, "batch_ms": plan.batch_ms,
                                                      "punctuate_every": punctuate_every}),
    })
    return JobSettings.model_validate(job.job_file_data())


def start_splitjoin(env: BenchEnv, job: JobSettings, cores: int) -> Fleet:
    """Cores 0..cores-1 and the merger as processes (topics must exist)."""
    job_dir = env.workdir / job.job
    fleet = Fleet(job, write_job(job, job_dir / "job.yaml"), env.bootstrap, job_dir / "logs")
    for position in range(cores):
        fleet.start_core(position)
    fleet.start_merger()
    return fleet


@dataclass
class MergerReleases:
    """The merger's release watermark (RoundRelease records, node "merger", on the commits
    topic: every input below it has all its results written), read as the topic grows, at
    most every RELEASE_POLL_S."""

    cluster: kafka.Cluster
    job: JobSettings
    watermark: int = int(np.iinfo(np.int64).min)
    next_offset: int = 0
    read_at: float = 0.0

    def reached(self, watermark: int) -> bool:
        """Whether the merger has released every input below `watermark` (reads the topic if not yet)."""
        if self.watermark < watermark and time.monotonic() - self.read_at >= RELEASE_POLL_S:
            self._read()
        return self.watermark >= watermark

    def _read(self) -> None:
        records = kafka.read_partitions(self.cluster, self.job.commits_topic, {0: self.next_offset},
                                        f"{self.job.consumer_group}-bench-releases")
        for m in records:
            self.next_offset = m.offset() + 1
            commit = decode_commit(m.value())
            if isinstance(commit, RoundRelease) and commit.node == MERGER:
                self.watermark = max(self.watermark, commit.watermark)
        self.read_at = time.monotonic()


def slowest_core(fleet: Fleet, cores: int) -> Callable[[], float]:
    """Progress: the lowest `through` of the cores (every core probes every tuple)."""
    ports = [fleet.metrics_ports[f"core-{i}"] for i in range(cores)]
    return lambda: min(band.metric_total(port, CORE_THROUGH) for port in ports)


def write_live(writer: band.BacklogWriter, backlog: band.Backlog, layout: Layout, plan: Plan) -> None:
    """The live records, each when its tick of event time has passed (event time runs with the
    wall clock from now), the streams interleaved; then the sentinels."""
    live_from = plan.live_from(backlog.case)
    due = sorted((live_from + ((int(backlog.ts(i)[start]) - live_from) // plan.tick_ms + 1) * plan.tick_ms, i, k)
                 for i in range(2) for k, start in enumerate(backlog.starts[i][layout.live_records[i]:].tolist(),
                                                             layout.live_records[i]))
    began = time.monotonic()
    for at, i, k in due:
        time.sleep(max(0.0, began + (at - live_from) / 1000 - time.monotonic()))
        writer.write(i, k)
    for i in range(2):
        writer.write(i, len(backlog.records[i]) - 1)


def run_splitjoin(env: BenchEnv, backlog: band.Backlog, plan: Plan, cores: int, punctuate_every: int) -> dict:
    """One run on a fresh broker: the pre-written part for throughput, the live tail for latency, the checks."""
    case = backlog.case
    name = f"{case.name}: SplitJoin, {cores} core(s), punctuate_every {punctuate_every}"
    with band.fresh_broker(env, f"sj-{case.name}-k{cores}-p{punctuate_every}") as here, ExitStack() as stack:
        job = splitjoin_job(backlog, here, plan, cores, punctuate_every)
        layout = Layout.of(backlog, plan.live_from(case), job.join.allowed_lateness_ms)
        topics.ensure(here.cluster.admin(), job)
        writer = band.BacklogWriter(here.cluster, job, backlog)
        with env.phase(f"{name}: writing {layout.live_rank:,} of {backlog.tuples:,} tuples ahead"):
            for i in range(2):
                for k in range(layout.live_records[i]):
                    writer.write(i, k)
            writer.producer.flush(120)
        releases = MergerReleases(here.cluster, job)
        with env.phase(f"{name}: joining the backlog"):
            fleet = start_splitjoin(here, job, cores)
            stack.callback(fleet.stop_all)
            began, load_before = time.time(), report.load_average()
            progress = slowest_core(fleet, cores)
            samples = band.sample_progress(fleet, progress, lambda _: releases.reached(layout.prewritten_watermark),
                                           plan.base.budget_s, plan.base.sample_s)
            caught_up = releases.reached(layout.prewritten_watermark)
        finished, drained_s = False, None
        if caught_up:
            with env.phase(f"{name}: {backlog.tuples - layout.live_rank:,} tuples live over {plan.live_ms / 1000:g}s"):
                live_began = time.time()
                write_live(writer, backlog, layout, plan)
                live_written = time.time()
                end = band.T0_MS + case.span_ms
                samples += band.sample_progress(fleet, progress, lambda _: releases.reached(end),
                                                plan.base.budget_s, plan.base.sample_s)
                finished = releases.reached(end)
                drained_s = round(samples[-1][0] - live_written, 2) if finished else None
        histogram = merger_histogram(fleet)
        restarts, load_after = fleet.restarts, report.load_average()
        fleet.stop_all()
        writer.finish()
        with env.phase(f"{name}: checks (exact, ordered) and latency"):
            merged = read_merged(here.cluster, job, backlog, layout)
            check = exactness(backlog, merged, plan.base.check_triggers) if finished else {
                "exact": False, "why": "the merger did not release the whole backlog within the budget"}
            order = order_check(merged)
        dead = sum(kafka.end_offsets(here.cluster, [(job.dead_letter_topic, p) for p in range(job.partitions)],
                                     f"{job.consumer_group}-bench-dead").values())
    rate = sustained(samples, backlog, layout, merged)
    exact = bool(finished and check["exact"] and order["unknown_members"] == 0 and order["duplicates"] == 0
                 and dead == 0 and restarts == 0)
    latency = latencies(merged, backlog, layout, histogram)
    return {
        "window": case.kind, "window_size": case.size, "cores": cores, "punctuate_every": punctuate_every,
        "rate_per_stream": case.rate, "offered_tuples_per_s": 2 * case.rate,
        "tuples_per_s": rate, "sustainable": rate is not None and rate >= 2 * case.rate,
        "per_core_tuples_per_s": None if rate is None else rate / band.MACHINE_CORES,
        "input_tuples": backlog.tuples, "window_full_after_tuples": backlog.full_at(),
        "measured_through_tuples": layout.released_before_live, "live_tuples": backlog.tuples - layout.live_rank,
        "finished": finished, "restarts": restarts, "dead_letters": dead,
        "wall_seconds": round(samples[-1][0] - began, 1),
        "live_began_s": round(live_began - began, 1) if caught_up else None,
        "released_after_live_s": drained_s,
        "load_average_before_after": [load_before, load_after],
        "exact": exact, "check": check,
        "ordered": order["ordered"], "order_promised": punctuate_every > 0, "order": order,
        "latency": latency, "progress": band.thin(samples, began),
    }


# ---------------------------------------------------------------- reading the results back


@dataclass(frozen=True)
class Merged:
    """Every result on the results topic, in topic order: its members' backlog indexes (-1:
    not in the backlog), the core's produced_ms and the merger's write (record timestamp)."""

    r: np.ndarray
    s: np.ndarray
    produced_ms: np.ndarray
    written_ms: np.ndarray
    probe: np.ndarray  # the newer member's place in the input order
    partner: np.ndarray  # the older member's


def read_merged(cluster: kafka.Cluster, job: JobSettings, backlog: band.Backlog, layout: Layout) -> Merged:
    """The one-partition results topic, RESULT_CHUNK records per read (a full run writes tens of
    millions of results), decoded a record at a time to pair each result with its record's
    timestamp; only the columns the checks need are kept."""
    topic, group = job.results_topic, f"{job.consumer_group}-bench-merged"
    end = kafka.end_offsets(cluster, [(topic, 0)], group)[(topic, 0)]
    res_layout, names = result_layout(job), [s.name for s in job.streams]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ("r", "s", "produced_ms", "written_ms")}
    for start in range(0, end, RESULT_CHUNK):
        for m in kafka.read_partitions(cluster, topic, {0: start}, group, ends={0: min(end, start + RESULT_CHUNK)}):
            decoded = decode_results(res_layout, job.output.format, [m.value()])
            if decoded.rejects:
                raise ValueError(f"{topic} offset {m.offset()} is no result record: {decoded.rejects[0]}")
            cols = decoded.columns
            for c, i in (("r", 0), ("s", 1)):
                parts[c].append(band.tuple_index(backlog.offsets[i], cols[f"{names[i]}.offset"].astype(np.int64)))
            parts["produced_ms"].append(cols[PRODUCED_MS].astype(np.int64))
            parts["written_ms"].append(np.full(len(cols[PRODUCED_MS]), m.timestamp()[1], np.int64))
    got = {c: np.concatenate(v) if v else np.empty(0, np.int64) for c, v in parts.items()}
    known = (got["r"] >= 0) & (got["s"] >= 0)
    rank_r = np.where(known, layout.ranks[0][np.maximum(got["r"], 0)], -1)
    rank_s = np.where(known, layout.ranks[1][np.maximum(got["s"], 0)], -1)
    return Merged(got["r"], got["s"], got["produced_ms"], got["written_ms"],
                  np.maximum(rank_r, rank_s), np.minimum(rank_r, rank_s))


def exactness(backlog: band.Backlog, merged: Merged, triggers: int) -> dict:
    """Bench band's brute-force check of the results of the last `triggers` tuples."""
    cut = band.cut_time(backlog, triggers)
    known = (merged.r >= 0) & (merged.s >= 0)
    newest = np.maximum(backlog.ts(0)[np.maximum(merged.r, 0)], backlog.ts(1)[np.maximum(merged.s, 0)])
    recent = known & (newest >= cut)
    return band.compare_tail(backlog, cut, np.stack([merged.r[recent], merged.s[recent]], axis=1))


def order_check(merged: Merged) -> dict:
    """Whether the topic order is the input order: (probe, partner) strictly ascending."""
    keys = merged.probe.astype(np.int64) * (1 << 32) + merged.partner
    steps = np.diff(keys)
    back = np.flatnonzero(steps < 0)
    return {
        "ordered": bool(len(back) == 0 and not (steps == 0).any()), "results": int(len(keys)),
        "out_of_order": int(len(back)), "duplicates": int(len(keys) - len(np.unique(keys))),
        "unknown_members": int(((merged.r < 0) | (merged.s < 0)).sum()),
        "first_out_of_order_at": int(back[0]) + 1 if len(back) else None,
        "how": "results topic in offset order; key (probing member's place, partner's place) in the input order "
               "(ts, stream, partition, offset); ordered: strictly ascending",
    }


# ---------------------------------------------------------------- figures of one run


def sustained(samples: list[tuple[float, float]], backlog: band.Backlog, layout: Layout, merged: Merged
              ) -> float | None:
    """Tuples/s from the slowest core passing the window's fill to the later of its passing the
    pre-written part's end and the merger writing that part's last result."""
    full, end = backlog.full_at(), layout.released_before_live
    t_full, t_cores = band.crossing(samples, full), band.crossing(samples, end)
    if t_full is None or t_cores is None or end <= full:
        return None
    written = merged.written_ms[(merged.probe >= 0) & (merged.probe < end)]
    t_end = max(t_cores, float(written.max()) / 1000 if len(written) else t_cores)
    return (end - full) / (t_end - t_full) if t_end > t_full else None


def latencies(merged: Merged, backlog: band.Backlog, layout: Layout, histogram: ours.Histogram | None) -> dict:
    """Visiting latency of the results whose newer member was written live, its core and merger
    parts (exact, from the topics), and the merger's histogram over the whole run."""
    live = merged.probe >= layout.live_rank
    newest = np.maximum(backlog.arrivals[0][merged.r[live]], backlog.arrivals[1][merged.s[live]])
    written, produced = merged.written_ms[live], merged.produced_ms[live]
    hist = None
    if histogram is not None and len(histogram.edges) and histogram.count:
        hist = {"count": histogram.count, "mean_ms": histogram.total / histogram.count * 1000,
                "p50_ms": histogram.quantile_ms(0.5), "p99_ms": histogram.quantile_ms(0.99),
                "how": f"{MERGER_LATENCY} at the run's end, every result; percentiles interpolated in buckets"}
    return {
        "visiting": report.delay_stats((written - newest).astype(np.float64), LATENCY_THRESHOLD_MS),
        "core": report.delay_stats((produced - newest).astype(np.float64), LATENCY_THRESHOLD_MS),
        "merger_added": report.delay_stats((written - produced).astype(np.float64), LATENCY_THRESHOLD_MS),
        "merger_histogram": hist,
        "how": "results whose newer member was written live: visiting = the merger's result record timestamp - "
               "max(t_r, t_s), t the member's input record timestamp; core = produced_ms - max(t_r, t_s); "
               "merger_added = record timestamp - produced_ms; under_threshold: share under "
               f"{LATENCY_THRESHOLD_MS:.0f} ms",
    }


def merger_histogram(fleet: Fleet) -> ours.Histogram | None:
    """The merger's added-latency histogram, None if its /metrics does not answer."""
    try:
        return ours.scrape_delays(fleet.metrics_ports[MERGER], MERGER_LATENCY)
    except OSError:
        return None


# ---------------------------------------------------------------- the workload


def run(env: BenchEnv, quick: bool, plot_path: Path | None) -> dict:
    plan = QUICK if quick else FULL
    runs: list[dict] = []
    rings: list[dict] = []
    for case, ring, settings in backlog_runs(plan):
        with env.phase(f"generating the {case.name} backlog ({case.span_ms / 1000:.0f}s of event time)"):
            backlog = band.make_backlog(case, plan.base, plan.live_from(case), plan.tick_ms)
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


def backlog_runs(plan: Plan) -> list[tuple[band.Case, bool, list[tuple[int, int, str]]]]:
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
            f"per core: ours over {band.MACHINE_CORES} cores, SplitJoin over {band.SPLITJOIN_CORES} join cores",
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
