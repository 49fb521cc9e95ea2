"""`streamjoin bench band`: the handshake / SplitJoin band join (seed 001,
section 6) on our PSP ring, against SplitJoin's published sustained rates.

The join is streamjoin/jobs/band.yaml: R(x int, y float, z char[20]) and
S(a int, b float, c double, d bool), values uniform in 1..10^4, predicate
r.x BETWEEN s.a-10 AND s.a+10 AND r.y BETWEEN s.b-10 AND s.b+10, run in ring
mode with `ring.nodes` fixed. Two windows, as in the paper: 15 minutes of
event time, and 2^21 tuples per stream.

Ring sizes: the plan's runs fix them (FULL: N = 1, 2 on the time window, 1 on
the others; QUICK: 1 and 2 on a 5 s time window, 1 on a 5,000-tuple count
window, each backlog 10 s of event time at 1,000 tuples/s per stream).
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
"""

from __future__ import annotations

import dataclasses
import os
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.engine.block import Block
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block
from streamjoin.schemas.result_codec import decode_results, result_layout
from streamjoin.schemas.results import RoundRelease, decode_commit
from streamjoin.services import broker as embedded
from streamjoin.services import kafka, workloads
from streamjoin.bench import ours, report
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.peers.kafka_consume import run_kafka_consume
from streamjoin.launcher import Fleet, wait_ring_quiet
from streamjoin.settings import JobSettings, WindowSpec, load
from streamjoin.topology import topics

JOB_FILE = Path(__file__).resolve().parents[1] / "jobs" / "band.yaml"
T0_MS = 1_700_000_000_000  # the backlog's first event time (any epoch ms would do)
TUPLES_IN = "streamjoin_tuples_in"
MACHINE_CORES = len(os.sched_getaffinity(0))  # what our per-core figures divide by

# Seed 001, section 6 (experimental evaluation), on a 32-core Dell PowerEdge R820
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
# Quick: small windows and short measured stretches (~20k tuples a backlog), so each ring run is
# mostly its processes' start and stop; its figures say little (the full run is the measurement).
_QTIME = Case("time", 5_000, 1_000.0, 5_000)
_QCOUNT = Case("count", 5_000, 1_000.0, 5_000)
QUICK = Plan(runs=((_QTIME, 1), (_QTIME, 2), (_QCOUNT, 1)), round_cap=4_000, block_tuples=1_000,
             check_triggers=1_500, consume_repeats=1, reference_tuples=150, budget_s=120.0, sample_s=0.2)
MAX_RING_NODES = 64  # ring.max_nodes' upper bound (settings/job.py RingSpec)


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
        rng = np.random.default_rng([job.workload.seed, i])
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


# ---------------------------------------------------------------- one ring run


def ring_job(backlog: Backlog, env: BenchEnv, nodes: int, recovery: bool = True) -> JobSettings:
    """The bench's ring job: `nodes` fixed; `recovery`: ring.recovery (round log and checkpoints)."""
    job = ours.fleet_job(backlog.job, env, f"band-{backlog.case.name}-n{nodes}", nodes)
    return job.model_copy(update={"ring": job.ring.model_copy(update={"nodes": nodes, "max_nodes": nodes,
                                                                      "recovery": recovery})})


def metric_total(port: int, family: str = TUPLES_IN) -> float:
    """One process's metric `family` summed over its labels (a counter's _total, a gauge's value);
    by default the ring head's streamjoin_tuples_in_total: tuples released into the ring."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
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


# ---------------------------------------------------------------- exactness


def cut_time(backlog: Backlog, k: int) -> int:
    """The event time from which on at least k tuples (of both streams) remain: they are checked."""
    every = np.concatenate([backlog.ts(0), backlog.ts(1)])
    return int(np.partition(every, len(every) - k)[len(every) - k])


def check_tail(cluster: kafka.Cluster, job: JobSettings, backlog: Backlog, k: int, finished: bool) -> dict:
    """Results of every tuple with ts >= the cut, recomputed by brute force, against the results topic."""
    if not finished:
        return {"exact": False, "why": "the backlog was not finished within the budget", "last_produced_s": None}
    cut = cut_time(backlog, k)
    results = results_since(cluster, job, cut)
    produced = results["produced_ms"]
    recent = results["event_time"] >= cut
    observed = np.stack([tuple_index(backlog.offsets[i], results[f"{s.name}.offset"][recent])
                         for i, s in enumerate(job.streams)], axis=1) if recent.any() else np.empty((0, 2), np.int64)
    return compare_tail(backlog, cut, observed) | {
        "last_produced_s": float(produced.max()) / 1000 if len(produced) else None}


def compare_tail(backlog: Backlog, cut: int, observed: np.ndarray) -> dict:
    """`observed`: (r index, s index) of every result read whose event time is >= `cut`, against
    the brute force's; missing, extra and duplicate results."""
    exp, obs = pair_keys(expected_pairs(backlog, cut)), pair_keys(observed)
    unique = np.unique(obs)
    missing = int(len(np.setdiff1d(exp, unique)))
    extra = int(len(np.setdiff1d(unique, exp)))
    duplicates = int(len(obs) - len(unique))
    triggers = int(sum((backlog.ts(i) >= cut).sum() for i in range(2)))
    return {"exact": missing == extra == duplicates == 0, "checked_triggers": triggers, "from_event_time": cut,
            "expected": int(len(exp)), "results": int(len(obs)), "missing": missing, "extra": extra,
            "duplicates": duplicates, "how": "NumPy brute force: every trigger against every tuple of the other "
            "stream before it in the global order and inside its window"}


def tuple_index(offsets: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Positions of engine offsets in a stream's backlog (-1 for an offset that is not there)."""
    at = np.minimum(np.searchsorted(offsets, wanted), len(offsets) - 1)
    return np.where(offsets[at] == wanted, at, -1)


def pair_keys(pairs: np.ndarray) -> np.ndarray:
    """(r index, s index) rows as one int64 each."""
    return pairs[:, 0].astype(np.int64) * (1 << 32) + pairs[:, 1].astype(np.int64)


def results_since(cluster: kafka.Cluster, job: JobSettings, cut: int, margin_rounds: int = 3) -> dict[str, np.ndarray]:
    """Results of the rounds that may hold triggers at or after `cut`, read from the end of each
    results partition backwards. A round releases the tuples below its watermark (its release
    record on the commits topic), so a result's event time lies in its round's span; nodes'
    results of adjacent rounds may interleave, so reading goes back to results older than the
    watermark `margin_rounds` rounds before the first round that matters."""
    releases = sorted((c.round, c.watermark) for c in _commits(cluster, job) if isinstance(c, RoundRelease))
    needed = [i for i, (_, wm) in enumerate(releases) if wm > cut]
    floor = releases[max(0, needed[0] - margin_rounds)][1] if needed else None
    topic, group = job.results_topic, f"{job.consumer_group}-bench-results"
    layout = result_layout(job)
    ends = kafka.end_offsets(cluster, [(topic, p) for p in range(job.partitions)], group)
    parts = []
    for p in range(job.partitions):
        back = 256
        while True:
            start = max(0, ends[(topic, p)] - back)
            values = [m.value() for m in kafka.read_partition(cluster, topic, p, start, group)]
            decoded = decode_results(layout, job.output.format, values).columns
            times = decoded["event_time"]
            if start == 0 or floor is None or (len(times) and times[0] < floor):
                break
            back *= 4
        parts.append(decoded)
    return {name: np.concatenate([d[name] for d in parts]) for name in parts[0]}


def _commits(cluster: kafka.Cluster, job: JobSettings) -> list:
    topic = job.commits_topic
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                    f"{job.consumer_group}-bench-commits")
    return [decode_commit(m.value()) for m in records]


def expected_pairs(backlog: Backlog, cut: int, cells: int = 1 << 24) -> np.ndarray:
    """(r index, s index) of every result whose newest member has ts >= cut, by brute force:
    each such trigger against every tuple of the other stream before it in the global order
    (ts, stream, partition, offset) and inside its window, with the job's terms evaluated as
    the engine does (|float64(left) - float64(right)| <= within). The first term is evaluated
    on every pair, the rest on the pairs it lets through."""
    out = []
    for i in range(2):
        j = 1 - i
        mine, theirs = backlog.ts(i), backlog.ts(j)
        trig = np.flatnonzero(mine >= cut)
        if not len(trig):
            continue
        # Tuples of j before trigger t: ts < T, or ts == T when j's stream index is lower.
        hi = np.searchsorted(theirs, mine[trig], "right" if j < i else "left")
        lo = (np.searchsorted(theirs, mine[trig] - backlog.case.size, "right") if backlog.case.kind == "time"
              else np.maximum(hi - backlog.case.size, 0))
        step = max(1, cells // max(int(hi.max() - lo.min()), 1))
        terms = _terms(backlog, i, j)
        for a in range(0, len(trig), step):
            t, lo_t, hi_t = trig[a:a + step], lo[a:a + step], hi[a:a + step]
            cand = np.arange(int(lo_t.min()), int(hi_t.max()))
            rows, cols = np.nonzero(terms[0](t[:, None], cand[None, :]))
            keep = (cand[cols] >= lo_t[rows]) & (cand[cols] < hi_t[rows])
            for term in terms[1:]:
                keep &= term(t[rows], cand[cols])
            pair = np.stack([t[rows[keep]], cand[cols[keep]]], axis=1)
            out.append(pair if i == 0 else pair[:, ::-1])
    return np.concatenate(out) if out else np.empty((0, 2), np.int64)


@dataclass(frozen=True)
class _Band:
    """One band term between trigger stream i and candidate stream j, on tuple indexes (broadcasting)."""

    mine: np.ndarray  # stream i's field, float64
    theirs: np.ndarray  # stream j's field, float64
    within: float
    left_is_mine: bool

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        left, right = (self.mine[a], self.theirs[b]) if self.left_is_mine else (self.theirs[b], self.mine[a])
        return np.abs(left - right) <= self.within


def _terms(backlog: Backlog, i: int, j: int) -> list[_Band]:
    names = [s.name for s in backlog.job.streams]
    out = []
    for term in backlog.job.join.predicate:
        (ls, lf), (_, rf) = term.left.split(".", 1), term.right.split(".", 1)
        left_is_mine = names.index(ls) == i
        mine_f, theirs_f = (lf, rf) if left_is_mine else (rf, lf)
        out.append(_Band(backlog.columns[i][mine_f].astype(np.float64), backlog.columns[j][theirs_f].astype(np.float64),
                         float(term.within), left_is_mine))
    return out


# ---------------------------------------------------------------- peers


def run_reference(backlog: Backlog, n: int) -> dict:
    """The floor: engine/reference.py's reference_theta_join (plain Python, every pair) on the
    first n tuples of each stream with the run's window; also checks this module's brute force
    against it on the same slice."""
    job, case = backlog.job, backlog.case
    cols = [{f: v[:n] for f, v in c.items()} for c in backlog.columns]
    small = dataclasses.replace(backlog, columns=cols, records=[], offsets=[])
    streams = [[ThetaTuple((job.topic_of(spec), 0, k), int(c[spec.time_field][k]),
                           {f: c[f][k].item() for f in spec.fields if f != spec.time_field})
                for k in range(len(c[spec.time_field]))] for spec, c in zip(job.streams, cols)]
    windows = [RefWindow(range_ms=case.size) if case.kind == "time" else RefWindow(rows=case.size)] * 2
    began = time.perf_counter()
    found = reference_theta_join(streams, windows, _reference_predicate(job))
    seconds = time.perf_counter() - began
    mine = {((job.topic_of(job.streams[0]), 0, int(a)), (job.topic_of(job.streams[1]), 0, int(b)))
            for a, b in expected_pairs(small, int(min(small.ts(0)[0], small.ts(1)[0])))}
    tuples = sum(len(s) for s in streams)
    pairs = len(streams[0]) * len(streams[1])
    per_window = window_tuples(case)
    return {
        "tuples_per_s": tuples / seconds, "pair_checks_per_s": pairs / seconds,
        "implied_tuples_per_s_at_full_window": pairs / seconds / per_window,
        "tuples": tuples, "results": len(found), "seconds": round(seconds, 3),
        "checker_agrees_with_reference": mine == found,
        "how": f"engine/reference.py reference_theta_join on the first {n} tuples of each stream of the "
               f"{case.name} backlog (all inside one window, so every r-s pair is checked); one process. A "
               "tuple at full window meets the other stream's whole window, so the implied rate is "
               f"pair checks/s / {per_window:,} (the window's tuples per stream)",
    }


def window_tuples(case: Case) -> int:
    """Tuples per stream a full window holds."""
    return int(case.size if case.kind == "count" else case.rate * case.size / 1000)


def _reference_predicate(job: JobSettings):  # type: ignore[no-untyped-def]
    """The job's band terms as reference_theta_join's pair predicate (streams i < j)."""
    names = [s.name for s in job.streams]
    terms = [(names.index(t.left.split(".")[0]), t.left.split(".", 1)[1], names.index(t.right.split(".")[0]),
              t.right.split(".", 1)[1], float(t.within)) for t in job.join.predicate]

    def holds(i: int, a: ThetaTuple, j: int, b: ThetaTuple) -> bool:
        fields = {i: a.fields, j: b.fields}
        return all(abs(float(fields[ls][lf]) - float(fields[rs][rf])) <= w for ls, lf, rs, rf, w in terms
                   if {ls, rs} == {i, j})
    return holds


def splitjoin_published() -> dict:
    return {
        kind: {**fig, "cores": SPLITJOIN_CORES, "per_core_tuples_per_s": fig["tuples_per_s"] / SPLITJOIN_CORES}
        for kind, fig in SPLITJOIN.items()
    } | {
        "source": "seed 001 (SplitJoin, /work/shared/seeds/splitjoin-coordination-free.txt), section 6 "
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
