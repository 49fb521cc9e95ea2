"""The band join benchmark's workload (`streamjoin bench band`, whose docstring says why it
looks the way it does): its plans (window cases, rates, ring sizes), the backlog of both streams
built with NumPy as Arrow blocks, and how it is written to Kafka for a ring to read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from streamjoin.bench import report
from streamjoin.engine.block import Block
from streamjoin.job_files import job_file
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block
from streamjoin.services import workloads
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, WindowSpec, load


JOB_FILE = job_file("band.yaml")
T0_MS = 1_700_000_000_000  # the backlog's first event time (any epoch ms would do)

# The SplitJoin paper, section 6 (experimental evaluation), on a 32-core Dell PowerEdge R820
# (4 x Intel E5-4650) with 28 join cores: "SplitJoin instantiated with 28 join cores
# over a 15-min sliding window (shown in Figure 12) sustains an input rate of 4400
# tuples/second, which roughly translates to window sizes of 2^21 for each stream.
# But for the count-based window, if we set the window size to (2^21), SplitJoin can
# process up to 5200 tuples/second, as shown in Figure 16."  4400/s over 900 s is
# 3.96M tuples, ~2^21 per stream: the figures are totals over both streams.
SPLITJOIN = {
    "time": {"tuples_per_s": 4400.0, "window": "15 min (~2^21 tuples per stream at 2200/s each)"},
    "count": {"tuples_per_s": 5200.0, "window": "2^21 tuples per stream"},
}
SPLITJOIN_CORES = 28


@dataclass(frozen=True)
class Case:
    """One backlog: a window and the per-stream event rate its tuples arrive at."""

    kind: str  # "time" | "count"
    size: int  # window: ms (time) or tuples per stream (count)
    rate: float  # tuples/s per stream, in event time
    measure_ms: int  # event time beyond the first full window

    @property
    def name(self) -> str:
        return f"{self.kind}-{int(self.rate)}"

    @property
    def span_ms(self) -> int:
        fill = self.size if self.kind == "time" else int(self.size / self.rate * 1000)
        return fill + self.measure_ms

    def window(self) -> WindowSpec:
        return WindowSpec(range_ms=self.size) if self.kind == "time" else WindowSpec(rows=self.size)


@dataclass(frozen=True)
class Plan:
    runs: tuple[tuple[Case, int], ...]  # (backlog, ring nodes), in order
    round_cap: int  # worker.max_batch_records: tuples the head holds ahead of release
    block_tuples: int  # tuples per Kafka record
    check_triggers: int  # last tuples whose results are recomputed exactly
    consume_repeats: int
    reference_tuples: int  # per stream, for the plain-Python floor
    budget_s: float  # per ring run, after its start
    sample_s: float  # progress sampling interval


_TIME = Case("time", 900_000, 2200.0, 120_000)  # the paper's 4400/s in all
_TIME_HIGH = Case("time", 900_000, 3000.0, 120_000)  # near what a 2-core ring keeps up with
_COUNT = Case("count", 1 << 21, 2600.0, 60_000)  # the paper's 5200/s in all
FULL = Plan(runs=((_TIME, 1), (_TIME, 2), (_TIME_HIGH, 1), (_COUNT, 1)), round_cap=12_000, block_tuples=2_000,
            check_triggers=600, consume_repeats=3, reference_tuples=1_200, budget_s=900.0, sample_s=1.0)
# Quick: small windows and short measured stretches (~14k tuples a backlog), so each ring run is
# mostly its processes' start and stop; its figures say little (the full run is the measurement).
_QTIME = Case("time", 2_000, 1_000.0, 5_000)
_QCOUNT = Case("count", 2_000, 1_000.0, 5_000)
QUICK = Plan(runs=((_QTIME, 1), (_QTIME, 2), (_QCOUNT, 1)), round_cap=4_000, block_tuples=1_000,
             check_triggers=1_000, consume_repeats=1, reference_tuples=150, budget_s=120.0, sample_s=0.2)
MAX_RING_NODES = 64  # ring.max_nodes' upper bound (settings/ring.py RingSpec)


def parse_nodes(text: str) -> tuple[int, ...]:
    """`--nodes` as typed, e.g. "1,2,4": the ring sizes of a scaling curve, distinct and ascending.

    text: comma-separated integers in 1..MAX_RING_NODES (spaces allowed). Raises ValueError
    on anything else, naming what was wrong."""
    return report.parse_counts(text, "--nodes", MAX_RING_NODES, "1,2,4", "ring sizes")


def scaling_plan(plan: Plan, nodes: tuple[int, ...]) -> Plan:
    """`plan` with its runs replaced by a scaling curve: its first case (the time window) on a
    ring of each size in `nodes`, one fresh broker and backlog copy per ring, as every run has."""
    case = plan.runs[0][0]
    return dataclasses.replace(plan, runs=tuple((case, n) for n in nodes))


# ---------------------------------------------------------------- the backlog


@dataclass
class Backlog:
    """A generated input: per stream its columns (in global order within the stream),
    the encoded Kafka records (the sentinel last), and once written, the offsets the
    engine sees and each tuple's arrival (its record's Kafka timestamp, ms)."""

    case: Case
    job: JobSettings  # the base job: windows, blocks format, one partition
    columns: list[dict[str, np.ndarray]]
    records: list[list[bytes]]
    starts: list[np.ndarray]  # per stream, the first tuple of each record but the sentinel
    offsets: list[np.ndarray] = dataclasses.field(default_factory=list)
    arrivals: list[np.ndarray] = dataclasses.field(default_factory=list)

    @property
    def tuples(self) -> int:
        return sum(len(c[s.time_field]) for c, s in zip(self.columns, self.job.streams))

    @property
    def bytes(self) -> int:
        return sum(len(v) for recs in self.records for v in recs)

    def ts(self, i: int) -> np.ndarray:
        return self.columns[i][self.job.streams[i].time_field]

    def full_at(self) -> int:
        """Tuples released (in global order) by the time the window is full."""
        c = self.case
        if c.kind == "time":
            return int(sum(np.searchsorted(self.ts(i), T0_MS + c.size, "left") for i in range(2)))
        # Count: once both streams hold `size` tuples. Global position of stream i's size-th tuple.
        at = []
        for i in range(2):
            t = self.ts(i)[c.size - 1]
            other = self.ts(1 - i)
            at.append(c.size + int(np.searchsorted(other, t, "right" if i == 1 else "left")))
        return max(at)


def base_job(case: Case, round_cap: int) -> JobSettings:
    job = load(JOB_FILE)
    streams = [s.model_copy(update={"format": "blocks", "window": case.window()}) for s in job.streams]
    # Results as Arrow blocks: the peer is an in-memory join that writes no records at all, so our
    # figure leaves per-record encoding out (bench equijoin measures what json costs against blocks).
    return job.model_copy(update={
        "streams": streams, "partitions": 1, "output": job.output.model_copy(update={"format": "blocks"}),
        "worker": job.worker.model_copy(update={"max_batch_records": round_cap}),
        "workload": job.workload.model_copy(update={"rate": case.rate}),
    })


def make_backlog(case: Case, plan: Plan, tick_from_ms: int | None = None, tick_ms: int = 100) -> Backlog:
    """NumPy-generated tuples (services/workloads.py, band kind) cut into Arrow IPC block
    records of `plan.block_tuples`, and after them one sentinel record per stream (see
    `sentinel`). From event time `tick_from_ms` on (if given) a record holds one `tick_ms`
    of event time instead: a tail meant to be written as it happens (bench splitjoin)."""
    job = base_job(case, plan.round_cap)
    columns, records, starts = [], [], []
    for i, spec in enumerate(job.streams):
        rng = np.random.default_rng([job.workload.random_state, i])
        cols = workloads.generate(job, i, rng, T0_MS, T0_MS + case.span_ms, case.rate)
        cuts = record_starts(cols[spec.time_field], plan.block_tuples, tick_from_ms, tick_ms)
        bounds = np.append(cuts, len(cols[spec.time_field])).tolist()
        columns.append(cols)
        starts.append(cuts)
        records.append([encode_block(Block({f: cols[f][a:b] for f in spec.fields}))
                        for a, b in zip(bounds, bounds[1:])])
        records[-1].append(encode_block(sentinel(job, i, cols, T0_MS + case.span_ms)))
    return Backlog(case, job, columns, records, starts)


def record_starts(ts: np.ndarray, block_tuples: int, tick_from_ms: int | None, tick_ms: int) -> np.ndarray:
    """First tuple of each record of one stream (`ts` ascending): every `block_tuples` tuples
    before `tick_from_ms`, every `tick_ms` of event time from it on (empty ticks get no record)."""
    n = len(ts)
    tail = n if tick_from_ms is None else int(np.searchsorted(ts, tick_from_ms, "left"))
    blocks = np.arange(0, tail, block_tuples)
    if tail == n:
        return blocks
    ticks = np.searchsorted(ts, np.arange(tick_from_ms, int(ts[-1]) + 1, tick_ms), "left")
    return np.unique(np.concatenate([blocks, ticks[ticks < n]]))


def sentinel(job: JobSettings, i: int, cols: dict[str, np.ndarray], end_ms: int) -> Block:
    """One tuple after the backlog: later than its end by more than the allowed lateness, so the
    watermark passes every backlog tuple (as further input would), and with values outside the
    domain on opposite sides per stream, so it joins nothing. It is never released itself."""
    spec = job.streams[i]
    far = (-1 if i == 0 else 1) * 1_000_000 * job.workload.value_max
    # Just past the lateness (a long jump in event time would expire or move whole slices at
    # once), and the same for both streams, so the watermark stays short of them.
    ts = end_ms + job.join.allowed_lateness_ms + 1_000
    row = {f: (np.array([ts]) if f == spec.time_field else
               np.array([far], dtype=v.dtype) if v.dtype.kind in "if" else v[:1]) for f, v in cols.items()}
    return Block(row)


def produce_backlog(cluster: kafka.Cluster, job: JobSettings, backlog: Backlog) -> None:
    """Write every record to partition 0 of its stream's topic, at once (see BacklogWriter)."""
    writer = BacklogWriter(cluster, job, backlog)
    for i, recs in enumerate(backlog.records):
        for k in range(len(recs)):
            writer.write(i, k)
    writer.finish()


class BacklogWriter:
    """Writes a backlog's records to partition 0 of their stream's topic, each stream's in
    order, at whatever pace the caller writes them; `finish` sets the backlog's tuple offsets
    ((record offset << BLOCK_SHIFT) | index) and arrivals from what the broker acknowledged."""

    def __init__(self, cluster: kafka.Cluster, job: JobSettings, backlog: Backlog) -> None:
        """job: names the topics (the backlog's own job or a renamed copy of it)."""
        self.job, self.backlog = job, backlog
        self.producer = cluster.producer()
        self.acked = [np.full((len(r), 2), -1, np.int64) for r in backlog.records]  # (offset, timestamp) per record
        self.errors: list[str] = []

    def write(self, i: int, k: int) -> None:
        """Produce record k of stream i (handed to librdkafka, which sends it within its linger)."""
        topic = self.job.topic_of(self.job.streams[i])
        self.producer.produce(topic, value=self.backlog.records[i][k], partition=0, on_delivery=self._delivered(i, k))
        self.producer.poll(0)

    def _delivered(self, i: int, k: int):  # type: ignore[no-untyped-def]
        def cb(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[i][k] = (msg.offset(), msg.timestamp()[1])
        return cb

    def finish(self, timeout_s: float = 120.0) -> None:
        """Wait for every acknowledgement, then close the producer (a broker stopped with a client
        still connected takes seconds to exit); each tuple's offset and arrival then come from its
        record's (the sentinel, last, carries none of the backlog's tuples)."""
        try:
            unsent = self.producer.flush(timeout_s)
        finally:
            self.producer.close()
        if unsent or self.errors:
            raise RuntimeError(f"backlog not written: {self.errors[:3] or 'flush timed out'}")
        backlog = self.backlog
        backlog.offsets, backlog.arrivals = [], []
        for i, cols in enumerate(backlog.columns):
            pos = np.arange(len(cols[self.job.streams[i].time_field]), dtype=np.int64)
            record = np.searchsorted(backlog.starts[i], pos, "right") - 1
            offset, arrival = self.acked[i][record].T
            backlog.offsets.append((offset << BLOCK_SHIFT) + pos - backlog.starts[i][record])
            backlog.arrivals.append(arrival)


def window_tuples(case: Case) -> int:
    """Tuples per stream a full window holds."""
    return int(case.size if case.kind == "count" else case.rate * case.size / 1000)
