"""Spark `sources` job: a Structured Streaming query that writes seed 000's
workload into every input topic of a job, roughly in real time.

The generator is a streaming Python data source, `streamjoin-workload`. Its
offset is a wall-clock instant: micro-batch n covers the event times
[start.ms, end.ms) and draws, per stream, a Poisson process there
(exponential inter-arrival gaps at `rate` per second; memorylessness makes
the pieces one process) with b-model keys. A batch's tuples come from a
generator seeded by (workload seed, stream, batch number), so a replayed
batch (after a restart from the checkpoint) is the same batch. Spark SQL
turns the tuples into keyed JSON records of the stream's schema, padded to
`tuple_bytes`, and the `streamjoin-kafka` stream writer produces them with
Kafka's default partitioner.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.types import LongType, StringType, StructField, StructType

from services.spark.kafka_source import NAME as KAFKA, jvm_kafka_available, local_session
from streamjoin.settings import JobSettings, StreamSpec

WORKLOAD = "streamjoin-workload"
GENERATED = StructType([StructField("topic", StringType()), StructField("k", LongType()),
                        StructField("ts", LongType())])
TRIGGER = "500 milliseconds"
_METRICS = "records_per_topic"


@dataclass(frozen=True)
class Arrivals(InputPartition):
    """One stream's arrivals in the event-time interval [t0, t1) of micro-batch `batch`."""

    stream: int
    topic: str
    t0: int
    t1: int
    batch: int


def _now_ms() -> int:
    return int(time.time() * 1000)


def poisson_times(rng: np.random.Generator, rate: float, t0: int, t1: int) -> np.ndarray:
    """Arrival instants (ms, float) of a rate-per-second Poisson process in [t0, t1)."""
    mean_gap = 1000.0 / rate
    expected = (t1 - t0) / mean_gap
    gaps = rng.exponential(mean_gap, int(expected + 6 * math.sqrt(expected) + 16))
    times = t0 + np.cumsum(gaps)
    while times[-1] < t1:  # the tail beyond six sigmas: draw on until past the interval
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(mean_gap, len(gaps)))])
    return times[times < t1]


def b_model_keys(rng: np.random.Generator, n: int, skew: float, domain: int) -> np.ndarray:
    """b-model keys in [0, domain): at each of log2(domain) levels the heavy (lower) half wins with `skew`."""
    levels = domain.bit_length() - 1
    light = rng.random((n, levels)) >= skew
    return light.astype(np.int64) @ (np.int64(1) << np.arange(levels, dtype=np.int64))


class WorkloadReader(DataSourceStreamReader):
    def __init__(self, options: dict) -> None:
        self.topics = options["topics"].split(",")
        self.rate = float(options["rate"])
        self.skew = float(options["skew"])
        self.domain = int(options["domain"])
        self.seed = int(options["seed"])
        self.seconds = float(options["seconds"])

    # Offsets: {"batch": n, "ms": event time generated up to, "end": last event time};
    # end == 0 means the clock has not started yet.
    def initialOffset(self) -> dict:
        return {"batch": 0, "ms": 0, "end": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        """Everything up to now (or the end), so batches follow the wall clock.

        Batch 1 is an empty warm-up that starts the Python workers and
        producers. Spark asks for the next offset only after a batch has run,
        so the clock starts once the pipeline is warm and the first real batch
        is not a backlog of tuples generated during start-up."""
        if start["end"] == 0:
            if start["batch"] == 0:
                return {"batch": 1, "ms": 0, "end": 0}
            now = _now_ms()
            return {"batch": start["batch"] + 1, "ms": now, "end": now + int(self.seconds * 1000)}
        now = min(_now_ms(), start["end"])
        return start if now <= start["ms"] else {"batch": start["batch"] + 1, "ms": now, "end": start["end"]}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if end["end"] == 0:  # the warm-up batch: an empty interval per stream
            return [Arrivals(i, t, 0, 0, end["batch"]) for i, t in enumerate(self.topics)]
        t0 = start["ms"] if start["end"] else end["ms"]
        if end["ms"] <= t0:
            return []
        return [Arrivals(i, t, t0, end["ms"], end["batch"]) for i, t in enumerate(self.topics)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Arrivals)
        rng = np.random.default_rng([self.seed, partition.stream, partition.batch])
        ts = np.floor(poisson_times(rng, self.rate, partition.t0, partition.t1)).astype(np.int64)
        keys = b_model_keys(rng, len(ts), self.skew, self.domain)
        topic = pa.array([partition.topic] * len(ts), pa.string())
        yield pa.RecordBatch.from_arrays([topic, pa.array(keys), pa.array(ts)],
                                         schema=to_arrow_schema(GENERATED))


class WorkloadSource(DataSource):
    """Options: topics (comma list, one stream each), rate, skew, domain, seed, seconds."""

    @classmethod
    def name(cls) -> str:
        return WORKLOAD

    def schema(self) -> StructType:
        return GENERATED

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WorkloadReader(self.options)


def _field_value(spec: StreamSpec, name: str, ftype: str, pad: Column) -> Column:
    """What a generated tuple holds in field `name`: key fields carry k, the
    time field the arrival time, other numbers k, and the first free string
    field the padding that brings the record to its size."""
    k, ts = F.col("k"), F.col("ts")
    if name == spec.time_field:
        return ts
    free_strings = [n for n, t in spec.fields.items() if t in ("str", "bytes") and n not in spec.key_fields]
    if name not in spec.key_fields and ftype in ("str", "bytes"):
        return pad if name == free_strings[0] else F.lit("")
    return {"int": k, "float": k.cast("double"), "bool": (k % 2) == 1,
            "str": k.cast("string"), "bytes": k.cast("string")}[ftype]


def _json_value(spec: StreamSpec, tuple_bytes: int) -> Column:
    """Compact JSON of one tuple of `spec`, padded to about `tuple_bytes` bytes."""
    def as_json(pad: Column) -> Column:
        return F.to_json(F.struct(*[_field_value(spec, n, t, pad).alias(n) for n, t in spec.fields.items()]))

    room = F.greatest(F.lit(tuple_bytes) - F.length(as_json(F.lit(""))), F.lit(0))
    return as_json(F.repeat(F.lit("x"), room))


def records(generated: DataFrame, job: JobSettings) -> DataFrame:
    """Generated (topic, k, ts) rows as Kafka records: topic, key = str(k), value = JSON."""
    value = None
    for spec in job.streams:
        this = _json_value(spec, job.workload.tuple_bytes)
        when = F.col("topic") == job.topic_of(spec)
        value = F.when(when, this) if value is None else value.when(when, this)
    return generated.select("topic", F.col("k").cast("string").cast("binary").alias("key"),
                            value.cast("binary").alias("value"))


class _Tracker(StreamingQueryListener):
    """Counts records per topic from each micro-batch's observed metrics and
    notices when the generator has covered its whole interval."""

    def __init__(self, topics: list[str], on_progress: object) -> None:
        self.topics = topics
        self.counts = dict.fromkeys(topics, 0)
        self.query_id: str | None = None
        self.left_ms: int | None = None  # event time still to generate
        self.finished = threading.Event()
        self.on_progress = on_progress

    def onQueryStarted(self, event: object) -> None:
        """Nothing to do: the query id is known once start() returns."""

    def onQueryProgress(self, event: object) -> None:
        p = event.progress
        if str(p.id) != self.query_id:
            return
        metrics = p.observedMetrics.get(_METRICS)
        if metrics is not None:
            for topic, n in zip(self.topics, metrics):
                self.counts[topic] += n
        if p.sources and p.sources[0].endOffset:
            end = json.loads(p.sources[0].endOffset)
            if end["end"]:  # the clock has started
                self.left_ms = end["end"] - end["ms"]
                if self.left_ms <= 0:
                    self.finished.set()
        self.on_progress(self)

    def onQueryTerminated(self, event: object) -> None:
        if str(event.id) == self.query_id:
            self.finished.set()


def _sink_format(spark: SparkSession) -> str:
    """Spark's JVM Kafka sink when it happens to be installed, else ours."""
    return "kafka" if jvm_kafka_available(spark) else KAFKA


def start_query(spark: SparkSession, job: JobSettings, bootstrap: str, seconds: float, rate: float,
                checkpoint: str) -> StreamingQuery:
    """Start the generator → Kafka streaming query."""
    w = job.workload
    generated = (spark.readStream.format(WORKLOAD)
                 .option("topics", ",".join(job.input_topics)).option("rate", rate).option("skew", w.skew)
                 .option("domain", w.domain).option("seed", w.seed).option("seconds", seconds).load())
    out = records(generated, job).observe(
        _METRICS, *[F.count_if(F.col("topic") == t).alias(t) for t in job.input_topics])
    return (out.writeStream.format(_sink_format(spark))
            .option("bootstrap", bootstrap).option("kafka.bootstrap.servers", bootstrap)
            .option("checkpointLocation", checkpoint).trigger(processingTime=TRIGGER).start())


def run_sources(job: JobSettings, bootstrap: str, seconds: float | None = None, rate: float | None = None,
                show_progress: bool = True) -> dict:
    """Write `seconds` of the job's workload into its input topics; returns
    {"records": {stream: n}, "seconds": event-time span generated, "rate": {stream: tuples/s},
    "wall_seconds": time the query ran}."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    seconds = seconds if seconds is not None else job.workload.seconds
    rate = rate if rate is not None else job.workload.rate
    spark = local_session("streamjoin-sources")
    spark.dataSource.register(WorkloadSource)
    topics = job.input_topics
    # Progress goes to stderr: stdout carries the commands' JSON.
    progress = Progress(TextColumn("[bold]sources[/] {task.description}"), BarColumn(), TimeRemainingColumn(),
                        disable=not show_progress, console=Console(stderr=True))
    task = progress.add_task("starting", total=seconds)

    def shown(t: _Tracker) -> None:
        done = seconds - t.left_ms / 1000 if t.left_ms is not None else 0
        progress.update(task, completed=done, description=" ".join(f"{s.name}={t.counts[k]}"
                                                                   for s, k in zip(job.streams, topics)))

    tracker = _Tracker(topics, shown)
    spark.streams.addListener(tracker)
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="streamjoin-sources-") as checkpoint, progress:
            query = start_query(spark, job, bootstrap, seconds, rate, checkpoint)
            tracker.query_id = str(query.id)
            # Progress events lag the batches a little; the query's own end is the backstop.
            while not tracker.finished.wait(0.2) and query.isActive:
                pass
            query.stop()
            if query.exception() is not None:
                raise RuntimeError(f"sources query failed: {query.exception()}")
    finally:
        spark.streams.removeListener(tracker)
    # The generator covered exactly `seconds` of event time (or less if stopped early).
    span = seconds - max(tracker.left_ms if tracker.left_ms is not None else seconds * 1000, 0) / 1000
    names = [s.name for s in job.streams]
    return {
        "records": {n: tracker.counts[t] for n, t in zip(names, topics)},
        "seconds": span,
        "rate": {n: tracker.counts[t] / span if span > 0 else 0.0 for n, t in zip(names, topics)},
        "wall_seconds": time.monotonic() - began,
    }
