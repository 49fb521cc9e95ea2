"""The skew bench's workload and jobs (bench/skew.py runs them): the equijoin tuples (64-byte
JSON, Poisson arrivals, two streams r and s joined on key k over a RANGE window) with keys of
`workload.kind: zipf` (services/workloads.py): per case, Zipf keys over the domain with an
exponent, and optionally key 0 carrying a set share of each stream's tuples on top.

A case's input is preloaded as a backlog (bench/backlog.py) into the topics of its source job,
and written live for the live runs at a rate found in the run; a live job's window is sized so
that it holds as many tuples as the backlog's (`window_tuples`): the hot key's pairs per tuple,
which grow with the tuples in a window, are then the same in both.

Every run exists twice: unsplit (`coordinator.hot_key_slots: 0`) and split (slots, and
detection thresholds low and an epoch short enough that the hot key is split within the first
seconds: DETECTION, the same in both). Records are keyed by the join key, so both topics are
co-partitioned by Kafka's partitioner and every key lives in one partition group until split.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamjoin.bench import ours
from streamjoin.bench.backlog import BacklogPlan
from streamjoin.bench.env import BenchEnv
from streamjoin.settings import JobSettings, WindowSpec, load

# The runs' detection: a key at 8% of the input counted over a 1 s epoch (and the one before)
# is hot once `hot_key_min_tuples` (the plan's) of its tuples were seen; it cools below 4%. The
# unsplit runs keep the same thresholds (they detect and report the key, and leave it whole).
DETECTION = {"hot_key_share": 0.08, "hot_key_cool_share": 0.04, "reorg_epoch_ms": 1000}
# A batch's results hold every pair of its hot-key tuples with their partners in the window, so a
# backlog read in the default 200,000-record batches makes result blocks of millions of rows for the
# hot key's group at once (memory and one long transaction); smaller batches keep the runs'
# workers and delays comparable. Both runs take batches of at most this many.
MAX_BATCH_RECORDS = 5000


@dataclass(frozen=True)
class Case:
    """One input: keys Zipf over the domain with `exponent` (0 = uniform), and key 0 taking
    `share` of each stream's tuples on top."""

    exponent: float
    share: float

    @property
    def name(self) -> str:
        return f"zipf{self.exponent:g}-top{round(self.share * 100)}"

    def describe(self) -> str:
        keys = "uniform keys" if self.exponent == 0 else f"Zipf {self.exponent:g} keys"
        return f"{keys}, one key at {self.share:.0%} on top" if self.share else keys


HEADLINE = Case(exponent=0.0, share=0.4)


@dataclass(frozen=True)
class SkewPlan:
    """cases: the sweep (the headline among them); backlog: each case's preloaded input, at
    `event_rate` tuples/s of event time per stream under a `window_ms` RANGE; load: the live
    runs' rate as a share of the unsplit backlog drain's rate; live_seconds: of live input per
    run (headline_seconds for the headline); pyflink: run PyFlink on every case (else on the
    headline only: each run starts its own JVM and an empty job); live_rate_cap: the most tuples/s
    per stream a live run is fed, whatever the drain's rate (None: no cap); hot_key_min_tuples:
    the detection's least count (DETECTION)."""

    cases: tuple[Case, ...]
    backlog_tuples: int
    event_rate: float
    window_ms: int
    load: float
    live_seconds: float
    headline_seconds: float
    partitions: int
    domain: int
    spark_files_per_trigger: int
    pyflink: bool
    workers: int  # per run, unless `bench skew --workers` says otherwise
    hot_key_min_tuples: int
    live_rate_cap: float | None = None
    random_state: int = 17

    @property
    def window_tuples(self) -> float:
        """Tuples of one stream in one window: the same in the backlog and the live runs."""
        return self.event_rate * self.window_ms / 1000

    def backlog(self) -> BacklogPlan:
        event_ms = round(self.backlog_tuples / 2 / self.event_rate * 1000)
        return BacklogPlan(tuples=self.backlog_tuples, event_ms=event_ms, producers=1,
                           chunk_tuples=min(250_000, self.backlog_tuples // 4))

    def live_window_ms(self, rate: float) -> int:
        """The live runs' window at `rate` tuples/s per stream: as many tuples as the backlog's."""
        return max(1, round(self.window_tuples / rate * 1000))


EXPONENTS = (0.8, 1.0, 1.2, 1.5)
SHARES = (0.1, 0.25, 0.4, 0.5)
FULL = SkewPlan(cases=(*(Case(a, 0.0) for a in EXPONENTS), *(Case(0.0, s) for s in SHARES)),
                backlog_tuples=120_000, event_rate=1000, window_ms=20, load=0.8, live_seconds=10,
                headline_seconds=20, partitions=12, domain=4096, spark_files_per_trigger=50, pyflink=False,
                workers=3, hot_key_min_tuples=500)
QUICK = SkewPlan(cases=(HEADLINE,), backlog_tuples=4000, event_rate=500, window_ms=40, load=0.8, live_seconds=3,
                 headline_seconds=3, partitions=4, domain=256, spark_files_per_trigger=8, pyflink=False, workers=2,
                 hot_key_min_tuples=100, live_rate_cap=500)


def coordinator_settings(plan: SkewPlan, slots: int) -> dict:
    """The `coordinator:` settings of a run with `slots` sub-group slots (0 = unsplit)."""
    return DETECTION | {"hot_key_min_tuples": plan.hot_key_min_tuples, "hot_key_slots": slots}


def source_job(env: BenchEnv, plan: SkewPlan, case: Case) -> JobSettings:
    """equijoin.yaml on `case`'s keys with the plan's window and partitions, as job
    `skew-<case>`: the topics the backlog is preloaded into (the runs are named after it)."""
    from streamjoin.job_files import default_job_file

    job = load(default_job_file())
    streams = [s.model_copy(update={"window": WindowSpec(range_ms=plan.window_ms)}) for s in job.streams]
    workload = job.workload.model_copy(update={
        "kind": "zipf", "zipf_exponent": case.exponent, "top_key_share": case.share, "domain": plan.domain,
        "rate": plan.event_rate, "random_state": plan.random_state})
    worker = job.worker.model_copy(update={"max_batch_records": MAX_BATCH_RECORDS})
    job = job.model_copy(update={"streams": streams, "partitions": plan.partitions, "workload": workload,
                                 "worker": worker})
    return ours.fleet_job(job, env, f"skew-{case.name}", 1).model_copy(
        update={"coordinator": job.coordinator.model_copy(update=coordinator_settings(plan, 0))})


def live_job(env: BenchEnv, plan: SkewPlan, source: JobSettings, run: str, workers: int, slots: int,
             rate: float) -> JobSettings:
    """`source` as its own job `<source>-live-<run>` for a live run at `rate` tuples/s per stream:
    the window that holds as many tuples as the backlog's, `slots` hot-key slots."""
    streams = [s.model_copy(update={"window": WindowSpec(range_ms=plan.live_window_ms(rate))}) for s in source.streams]
    job = ours.fleet_job(source.model_copy(update={"streams": streams,
                                                   "workload": source.workload.model_copy(update={"rate": rate})}),
                         env, f"{source.job}-live-{run}", workers)
    return job.model_copy(update={"coordinator": job.coordinator.model_copy(update=coordinator_settings(plan, slots))})
