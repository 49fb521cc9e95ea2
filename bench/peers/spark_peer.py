"""Spark Structured Streaming's stream-stream join on the same input, fed
through its best native path: Parquet files of the exported input tuples,
one file per stream per slice of arrival time (the workers' batch interval),
read by the file source. Typed columns spare Spark the JSON parsing our
workers do.

Semantics. Each stream gets an event-time column and a watermark of
`join.allowed_lateness_ms`; the join condition is the workload's predicate
AND, for every ordered pair of streams (i, j), t_j < t_i + W_i. Since
T = max t, that is exactly our window rule T - t_i < W_i for every i, and
Spark's inner joins emit matches eagerly, as ours do; the watermark only
bounds state (and, for the left outer join of bench/left_join.py, decides
when a row with no partner comes out null-padded: once the watermark passes
t + W, as ours). The output keeps every column of every input (ours carries
the payload into its results too) and is collected into the driver as Arrow
by `foreachBatch`.

A tumbling or hopping window join (the job's window_instance) is Spark's
windowed stream-stream join instead: each stream gets Spark's `window()` of
its event time (in the event time's place, watermark and all), and the join
condition is the workload's predicate AND equal windows. Spark's inner join
emits those eagerly too; the watermark bounds the state by the window's end.

Two runs:
  backlog  every file written up front, `files_per_trigger` files per stream
           per micro-batch: sustained tuples/s (the count must equal the
           verifier's expected results);
  paced    the files of each of our sweep steps released at the pace their
           tuples reached Kafka, a released_ms column stamped at the
           release; a result's delay is when the driver holds it minus the
           release of its newest input (ours: produced_ms minus the Kafka
           timestamp of its newest input). Steps stop once Spark cannot
           catch up with one within a minute.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from streamjoin.bench.inputs import ARRIVAL
from streamjoin.bench.report import delay_stats, overloaded, sustained_rate
from streamjoin.settings import JobSettings

RELEASED, STEP, EVENT_TIME = "released_ms", "step", "event_time"
WINDOW = "window"  # a window join's instance: Spark's window() of the event time, a struct (start, end)

# The workload's predicate over the prefixed streams: names -> Column.
Predicate = Callable[[Sequence[str]], Column]


def col(stream: str, name: str) -> Column:
    return F.col(f"{stream}_{name}")


def key_equality(job: JobSettings) -> Predicate:
    """Equal key fields between consecutive streams (equality is transitive)."""
    def predicate(names: Sequence[str]) -> Column:
        specs = {s.name: s for s in job.streams}
        terms = [col(a, ka) == col(b, kb) for a, b in zip(names, names[1:])
                 for ka, kb in zip(specs[a].key_fields, specs[b].key_fields)]
        return reduce(Column.__and__, terms)
    return predicate


def window_condition(names: Sequence[str], windows_ms: Sequence[int]) -> Column:
    """AND over ordered pairs: t_j < t_i + W_i, i.e. T - t_i < W_i for all i with T = max t."""
    terms = [col(b, EVENT_TIME) < col(a, EVENT_TIME) + F.expr(f"INTERVAL {w / 1000} SECONDS")
             for a, w in zip(names, windows_ms) for b in names if b != a]
    return reduce(Column.__and__, terms)


def instance_condition(names: Sequence[str]) -> Column:
    """Consecutive streams in one window instance (equal is transitive): a window join's rule."""
    return reduce(Column.__and__, [col(a, WINDOW) == col(b, WINDOW) for a, b in zip(names, names[1:])])


# ---------------------------------------------------------------- files


@dataclass
class Slices:
    """One stream's tuples cut into files of `slice_ms` of one time column (the backlog cuts by
    event time, the paced run by arrival); `step` per row from the sweep's wall windows."""

    table: pa.Table
    bounds: np.ndarray  # row offsets: slice i is rows bounds[i]:bounds[i+1]
    starts_ms: np.ndarray  # arrival instant each slice begins at

    @classmethod
    def cut(cls, table: pa.Table, by: str, slice_ms: int, step_starts_ms: Sequence[int]) -> "Slices":
        arrival = table.column(ARRIVAL).to_numpy()
        steps = np.searchsorted(np.asarray(step_starts_ms), arrival, side="right") - 1
        table = table.append_column(STEP, pa.array(steps, pa.int32()))
        table = table.append_column(RELEASED, pa.array(np.zeros(len(arrival), np.int64)))
        table = table.sort_by([(by, "ascending")])
        slot = table.column(by).to_numpy() // slice_ms
        firsts = np.flatnonzero(np.r_[True, slot[1:] != slot[:-1]]) if len(slot) else np.empty(0, np.int64)
        return cls(table, np.r_[firsts, len(slot)], slot[firsts] * slice_ms)

    def __len__(self) -> int:
        return len(self.starts_ms)

    def rows(self, i: int, released_ms: int | None = None) -> pa.Table:
        part = self.table.slice(int(self.bounds[i]), int(self.bounds[i + 1] - self.bounds[i]))
        if released_ms is None:
            return part
        return part.set_column(part.schema.get_field_index(RELEASED), RELEASED,
                               pa.array(np.full(part.num_rows, released_ms, np.int64)))

    def step_of(self, i: int) -> int:
        return int(self.table.column(STEP)[int(self.bounds[i])].as_py())


def write_file(directory: Path, name: str, table: pa.Table, mtime_ms: int | None = None) -> None:
    """Write, then rename into place: the file source must never see half a file."""
    staging = directory.parent / f".{directory.name}-staging"
    staging.mkdir(parents=True, exist_ok=True)
    tmp = staging / name
    pq.write_table(table, tmp)
    if mtime_ms is not None:  # the file source takes files oldest first
        os.utime(tmp, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    os.replace(tmp, directory / name)


# ---------------------------------------------------------------- the query


@dataclass
class Sink:
    """foreachBatch target: collects each batch's output, keeps counts, delays and steps."""

    names: Sequence[str]
    results: int = 0
    delays: list[np.ndarray] = field(default_factory=list)
    steps: list[np.ndarray] = field(default_factory=list)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        out = batch.toArrow()  # every column: the whole output reaches the driver
        self.take(out, time.time() * 1000)

    def take(self, out: pa.Table, held_ms: float) -> None:
        """Count one batch's output `out`, which the driver holds since `held_ms`."""
        if out.num_rows == 0:
            return
        newest = np.max([out.column(f"{n}_{RELEASED}").to_numpy() for n in self.names], axis=0)
        self.results += out.num_rows
        self.delays.append(held_ms - newest)
        self.steps.append(np.max([out.column(f"{n}_{STEP}").to_numpy() for n in self.names], axis=0))

    def step_delays(self, step: int) -> np.ndarray:
        if not self.delays:
            return np.empty(0)
        delays, steps = np.concatenate(self.delays), np.concatenate(self.steps)
        return delays[steps == step]


def _stream(spark: SparkSession, path: Path, schema: pa.Schema, name: str, time_field: str, lateness_ms: int,
            files_per_trigger: int | None, instance: tuple[int, int] | None) -> DataFrame:
    from pyspark.sql.pandas.types import from_arrow_schema

    reader = spark.readStream.schema(from_arrow_schema(schema))
    if files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    df = reader.parquet(str(path))
    df = df.select(*[F.col(c).alias(f"{name}_{c}") for c in df.columns])
    df = (df.withColumn(f"{name}_{EVENT_TIME}", F.timestamp_millis(col(name, time_field)))
          .withWatermark(f"{name}_{EVENT_TIME}", f"{lateness_ms} milliseconds"))
    if instance is None:
        return df
    size, slide = instance
    # The window carries the watermark on; Spark allows one event-time column per stream.
    return df.withColumn(f"{name}_{WINDOW}", F.window(col(name, EVENT_TIME), f"{size} milliseconds",
                                                      f"{slide} milliseconds")).drop(f"{name}_{EVENT_TIME}")


def start_join(spark: SparkSession, job: JobSettings, dirs: dict[str, Path], schemas: dict[str, pa.Schema],
               predicate: Predicate, sink: Sink, checkpoint: Path, files_per_trigger: int | None,
               how: str = "inner") -> StreamingQuery:
    """The streaming join of the files under `dirs`, each batch into `sink`; `how`: Spark's join
    type (inner, or left_outer: a time-interval outer join, which the watermarks make possible).
    A job with window instances joins on `window()` (the module docstring)."""
    names = [s.name for s in job.streams]
    instance = job.window_instance
    frames = [_stream(spark, dirs[s.name], schemas[s.name], s.name, s.time_field, job.join.allowed_lateness_ms,
                      files_per_trigger, instance) for s in job.streams]
    windows = [s.window.range_ms for s in job.streams]
    if instance is None and any(w is None for w in windows):
        raise ValueError("the Spark peer joins time windows only (Spark has no count-window stream join)")
    joined = frames[0]
    for j in range(1, len(frames)):
        # Each join gets the conditions among the streams it brings together, so Spark can expire its state.
        time_rule = (instance_condition(names[:j + 1]) if instance is not None
                     else window_condition(names[:j + 1], windows[:j + 1]))
        cond = predicate(names[:j + 1]) & time_rule
        joined = joined.join(frames[j], cond, how)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    return joined.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start()


# Spark runs its batch without input right after the last data batch when the watermark moved;
# if none comes in this long, none is coming (the watermark did not move).
SETTLE_S = 20.0


class Progress:
    """Input rows Spark has processed, from the query's progress reports."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query
        self.samples: list[tuple[float, float]] = []  # (batch end, epoch s; cumulative input rows)

    def rows(self) -> int:
        if self.query.exception() is not None:
            raise RuntimeError(f"Spark peer query failed: {self.query.exception()}")
        done, samples = 0, []
        for p in sorted(self.query.recentProgress, key=lambda p: p.batchId):
            done += p.numInputRows
            end = datetime.fromisoformat(p.timestamp).timestamp() + p.durationMs.get("triggerExecution", 0) / 1000
            samples.append((end, float(done)))
        self.samples = samples
        return done

    def settle(self, timeout: float) -> bool:
        """Until a batch without input has run after the last one with input, or `timeout`
        seconds: Spark runs one when the last data moved the watermark, and outer joins emit
        the null rows the watermark decided in it (a loaded run's last data batch may hold
        most of the input, so its null rows come only then)."""
        deadline = time.monotonic() + timeout
        while True:
            reports = sorted(self.query.recentProgress, key=lambda p: p.batchId)
            if reports and reports[-1].numInputRows == 0 and any(p.numInputRows for p in reports):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def wait_for(self, rows: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.rows() < rows:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


# ---------------------------------------------------------------- the two runs


def run_backlog(spark: SparkSession, job: JobSettings, slices: dict[str, Slices], predicate: Predicate,
                workdir: Path, files_per_trigger: int, timeout: float = 3600, how: str = "inner",
                sink: Sink | None = None) -> dict:
    """Everything written first, then the query drains it: sustained tuples/s and the result count
    (`sink`'s; default: a Sink of every row). `how`: Spark's join type (start_join)."""
    dirs = {n: workdir / "backlog" / n for n in slices}
    for name, s in slices.items():
        dirs[name].mkdir(parents=True)
        for i in range(len(s)):
            write_file(dirs[name], f"{i:08d}.parquet", s.rows(i), mtime_ms=int(s.starts_ms[i]))
    total = sum(s.table.num_rows for s in slices.values())
    sink = sink or Sink([s.name for s in job.streams])
    query = start_join(spark, job, dirs, {n: s.table.schema for n, s in slices.items()}, predicate, sink,
                       workdir / "backlog-checkpoint", files_per_trigger, how)
    try:
        progress = Progress(query)
        drained = progress.wait_for(total, timeout)
    finally:
        query.stop()
    t0 = progress.samples[0][0] if progress.samples else 0.0
    samples = [(t - t0, n) for t, n in progress.samples]
    return {"tuples_per_s": sustained_rate(samples), "inputs": total, "results": sink.results,
            "drained": drained, "batches": len(samples), "wall_seconds": round(samples[-1][0], 2) if samples else None,
            "files_per_trigger": files_per_trigger}


def run_paced(spark: SparkSession, job: JobSettings, slices: dict[str, Slices], steps: Sequence[dict],
              predicate: Predicate, workdir: Path, threshold_ms: float, catch_up_s: float = 60, how: str = "inner",
              sink: Sink | None = None) -> list[dict]:
    """Our sweep's steps replayed at their arrival pace; per step exact delay statistics of the
    rows `sink` times (default: a Sink of every row). Stops after a step Spark has not caught up
    with `catch_up_s` after its last file. `how`: Spark's join type (start_join)."""
    dirs = {n: workdir / "paced" / n for n in slices}
    for d in dirs.values():
        d.mkdir(parents=True)
    sink = sink or Sink([s.name for s in job.streams])
    schemas = {n: s.table.schema for n, s in slices.items()}
    query = start_join(spark, job, dirs, schemas, predicate, sink, workdir / "paced-checkpoint", None, how)
    out: list[dict] = []
    try:
        progress = Progress(query)
        released = _warm_up(job, dirs, schemas, progress)
        for index, step in enumerate(steps):
            released += _release_step(slices, dirs, index)
            drained = progress.wait_for(released, catch_up_s)
            stats = delay_stats(sink.step_delays(index), threshold_ms)
            out.append({"rate_per_stream": step["rate_per_stream"], "delay": stats, "caught_up": drained,
                        "overloaded": not drained or overloaded(stats)})
            if not drained:
                break
        if how != "inner":
            progress.settle(SETTLE_S)
    finally:
        query.stop()
    return out


def _warm_up(job: JobSettings, dirs: dict[str, Path], schemas: dict[str, pa.Schema], progress: Progress) -> int:
    """One row per stream that joins nothing, long before the data: Spark plans and compiles the
    query on it, so the first step's delays are not the query's start-up."""
    for i, spec in enumerate(job.streams):
        row = {f.name: [None] for f in schemas[spec.name]}
        row.update({"partition": [-1], "offset": [-1], ARRIVAL: [0], STEP: [-1], RELEASED: [0],
                    spec.time_field: [0]})
        row.update({k: [-1 - i] for k in spec.key_fields})
        write_file(dirs[spec.name], "warm-up.parquet", pa.table(row, schema=schemas[spec.name]))
    rows = len(job.streams)
    if not progress.wait_for(rows, 300):
        raise TimeoutError("the Spark peer query did not start within 300s")
    return rows


def _release_step(slices: dict[str, Slices], dirs: dict[str, Path], step: int) -> int:
    """Writes the step's slices as their arrival times come due (relative to the step's first slice)."""
    plan = sorted((int(s.starts_ms[i]), name, i) for name, s in slices.items() for i in range(len(s))
                  if s.step_of(i) == step)
    if not plan:
        return 0
    first_ms, began = plan[0][0], time.time() * 1000
    rows = 0
    for start_ms, name, i in plan:
        due = began + (start_ms - first_ms)
        time.sleep(max(0.0, (due - time.time() * 1000) / 1000))
        part = slices[name].rows(i, released_ms=int(time.time() * 1000))
        write_file(dirs[name], f"{step:03d}-{i:08d}.parquet", part)
        rows += part.num_rows
    return rows
