"""One run of the SplitJoin benchmark (`streamjoin bench splitjoin`, whose docstring describes
the method): the plans, the input order's layout, k cores and the merger on a broker of their
own, the live tail, reading the merged results back, and the run's exactness, order,
throughput and latency."""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

import numpy as np

from streamjoin.bench import band, band_check, band_workload, ours, report
from streamjoin.bench.env import BenchEnv
from streamjoin.launcher import Fleet, write_job
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import PRODUCED_MS, RoundRelease, decode_commit
from streamjoin.services.io import kafka
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

    time: band_workload.Case
    count: band_workload.Case
    ks: tuple[int, ...]  # cores per run of the k sweep (strict order)
    precision_case: band_workload.Case  # the knob's backlog (a time window; `time` itself shares that backlog's runs)
    precision_k: int  # the knob's runs: cores
    precisions: tuple[int, ...]  # punctuate_every values besides 1 (0: unordered)
    live_ms: int  # event time at each backlog's end written as it happens (visiting latency)
    tick_ms: int  # event time per live record
    batch_ms: int  # splitjoin.batch_ms
    ring_nodes: int  # the peer ring's size
    base: band_workload.Plan  # block size, round cap, checked tuples, budget per run and sampling; the ring's plan too

    def live_from(self, case: band_workload.Case) -> int:
        """Event time from which a backlog of `case` is written live."""
        return band_workload.T0_MS + case.span_ms - self.live_ms


def _ks() -> tuple[int, ...]:
    """1, 2 and 4 cores and each further power of 2 the machine has CPUs for (64 at most)."""
    return (1, 2, 4, *(k for k in (8, 16, 32, 64) if k <= CPU_COUNT))


_PRECISIONS = (16, 256, 4096, 0)
_PRECISION_K = 2 if CPU_COUNT < 4 else 4
# Full: the paper's windows and rates (band's FULL cases), with 30 s of live tail beyond band's measured stretch.
# The knob's window is 60 s at the paper's rate, its measured stretch twice that.
FULL = Plan(time=band_workload.Case("time", 900_000, 2200.0, 150_000),
            count=band_workload.Case("count", 1 << 21, 2600.0, 90_000), ks=_ks(),
            precision_case=band_workload.Case("time", 60_000, 2200.0, 120_000),
            precision_k=_PRECISION_K, precisions=_PRECISIONS, live_ms=30_000, tick_ms=50,
            batch_ms=50, ring_nodes=1,
            base=dataclasses.replace(band_workload.FULL, runs=(), check_triggers=600, budget_s=1800.0, sample_s=1.0))
# Quick: one run per figure family, each mostly its processes' start and stop: the 2-core sweep
# on each window (strict order), and at those 2 cores the knob's coarse punctuation (16, the
# default) and no order (0), on 2 s / 2,000-tuple windows with 2 s measured; its figures say
# little (the full run is the measurement).
_QUICK_TIME = band_workload.Case("time", 2_000, 1000.0, 2_000)
QUICK = Plan(time=_QUICK_TIME, count=band_workload.Case("count", 2_000, 1000.0, 2_000), ks=(2,),
             precision_case=_QUICK_TIME, precision_k=2, precisions=(16, 0), live_ms=500, tick_ms=50, batch_ms=50,
             ring_nodes=1,
             base=dataclasses.replace(band_workload.QUICK, runs=(), check_triggers=1_000, budget_s=60.0, sample_s=0.1))


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
    def of(cls, backlog: band_workload.Backlog, live_from: int, lateness_ms: int) -> "Layout":
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


def splitjoin_job(backlog: band_workload.Backlog, env: BenchEnv, plan: Plan, cores: int,
                  punctuate_every: int) -> JobSettings:
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


def write_live(writer: band_workload.BacklogWriter, backlog: band_workload.Backlog, layout: Layout, plan: Plan) -> None:
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


def run_splitjoin(env: BenchEnv, backlog: band_workload.Backlog, plan: Plan, cores: int, punctuate_every: int) -> dict:
    """One run on a fresh broker: the pre-written part for throughput, the live tail for latency, the checks."""
    case = backlog.case
    name = f"{case.name}: SplitJoin, {cores} core(s), punctuate_every {punctuate_every}"
    with band.fresh_broker(env, f"sj-{case.name}-k{cores}-p{punctuate_every}") as here, ExitStack() as stack:
        job = splitjoin_job(backlog, here, plan, cores, punctuate_every)
        layout = Layout.of(backlog, plan.live_from(case), job.join.allowed_lateness_ms)
        topics.ensure(here.cluster.admin(), job)
        writer = band_workload.BacklogWriter(here.cluster, job, backlog)
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
                end = band_workload.T0_MS + case.span_ms
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


def read_merged(cluster: kafka.Cluster, job: JobSettings, backlog: band_workload.Backlog, layout: Layout) -> Merged:
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
                parts[c].append(band_check.tuple_index(backlog.offsets[i], cols[f"{names[i]}.offset"].astype(np.int64)))
            parts["produced_ms"].append(cols[PRODUCED_MS].astype(np.int64))
            parts["written_ms"].append(np.full(len(cols[PRODUCED_MS]), m.timestamp()[1], np.int64))
    got = {c: np.concatenate(v) if v else np.empty(0, np.int64) for c, v in parts.items()}
    known = (got["r"] >= 0) & (got["s"] >= 0)
    rank_r = np.where(known, layout.ranks[0][np.maximum(got["r"], 0)], -1)
    rank_s = np.where(known, layout.ranks[1][np.maximum(got["s"], 0)], -1)
    return Merged(got["r"], got["s"], got["produced_ms"], got["written_ms"],
                  np.maximum(rank_r, rank_s), np.minimum(rank_r, rank_s))


def exactness(backlog: band_workload.Backlog, merged: Merged, triggers: int) -> dict:
    """Bench band's brute-force check of the results of the last `triggers` tuples."""
    cut = band_check.cut_time(backlog, triggers)
    known = (merged.r >= 0) & (merged.s >= 0)
    newest = np.maximum(backlog.ts(0)[np.maximum(merged.r, 0)], backlog.ts(1)[np.maximum(merged.s, 0)])
    recent = known & (newest >= cut)
    return band_check.compare_tail(backlog, cut, np.stack([merged.r[recent], merged.s[recent]], axis=1))


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


def sustained(samples: list[tuple[float, float]], backlog: band_workload.Backlog, layout: Layout, merged: Merged
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


def latencies(merged: Merged, backlog: band_workload.Backlog, layout: Layout, histogram: ours.Histogram | None) -> dict:
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
