"""Spark `sources` job: a Structured Streaming query that writes a job's
generated workload (services/workloads.py) into every input topic, roughly
in real time.

The generator is a streaming Python data source, `streamjoin-workload`. Its
offset is a wall-clock instant: micro-batch n covers the event times
[start.ms, end.ms) and draws, per stream, `workloads.generate` there (a
Poisson process: memorylessness makes the pieces one process). A batch's
tuples come from a generator seeded by (workload random_state, stream, batch number),
so a replayed batch (after a restart from the checkpoint) is the same batch.
The reader yields the generated columns, one column per (stream, field) and
nulls in the other streams' columns. Then, by the stream's `format`:

  blocks       Arrow IPC streams of the stream's fields (schemas.codecs
               arrow_schema), many tuples per record, record key null;
  json (else)  Spark SQL's to_json, one record per tuple, record key = the
               key fields' values ("a,b"), null for a stream without keys
               (Kafka then spreads the records over the partitions).

The `streamjoin-kafka` stream writer produces them with Kafka's default
partitioner.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import reduce
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.types import (BinaryType, BooleanType, DataType, DoubleType, LongType, StringType, StructField,
                               StructType)

from streamjoin.schemas.codecs import arrow_schema
from streamjoin.services.io.kafka import Cluster
from streamjoin.services.spark.kafka_source import NAME as KAFKA, jvm_kafka_available, local_session
from streamjoin.services.spark.kafka_source import options as kafka_options
from streamjoin.services.workloads import Columns, airline_stream, generate, group_key_field
from streamjoin.settings import JobSettings, StreamSpec

WORKLOAD = "streamjoin-workload"
TRIGGER = "500 milliseconds"
RECORDS = StructType([StructField("topic", StringType()), StructField("key", BinaryType()),
                      StructField("value", BinaryType())])
# Observed metrics (tuples per topic), one per record format present.
_JSON_TUPLES, _BLOCK_TUPLES = "json_tuples", "block_tuples"
# Kafka's default max.message.bytes: block records stay well below it and worker.max_record_bytes.
_KAFKA_RECORD_BYTES = 1 << 20
_SPARK_TYPES: dict[str, DataType] = {"int": LongType(), "float": DoubleType(), "str": StringType(),
                                     "bool": BooleanType(), "bytes": BinaryType()}


@dataclass(frozen=True)
class Arrivals(InputPartition):
    """One stream's arrivals in the event-time interval [t0, t1) of micro-batch `batch`."""

    stream: int
    t0: int
    t1: int
    batch: int


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------- generated columns


def column(stream: int, field: str) -> str:
    """Generated column of a stream's field. Field names never start with a digit, so no two clash."""
    return f"s{stream}_{field}"


def generated_schema(job: JobSettings) -> StructType:
    """topic, then every stream's fields (Spark types; bytes as binary)."""
    return StructType([StructField("topic", StringType())] + [
        StructField(column(i, n), _SPARK_TYPES[t]) for i, s in enumerate(job.streams) for n, t in s.fields.items()])


def arrow_bytes(values: np.ndarray) -> pa.Array:
    """Fixed-width NumPy bytes ('S') as an Arrow binary array, every byte kept:
    pa.array would strip trailing NUL bytes (an image's last pixels)."""
    n, width = len(values), values.dtype.itemsize
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(np.ascontiguousarray(values).tobytes())])


def generated_batch(job: JobSettings, stream: int, cols: Columns, schema: pa.Schema) -> pa.RecordBatch:
    """One stream's generated tuples as a row batch of `schema` (generated_schema in Arrow)."""
    n = len(cols[job.streams[stream].time_field])
    mine = {column(stream, f): v for f, v in cols.items()}
    arrays = [pa.repeat(pa.scalar(job.topic_of(job.streams[stream]), pa.string()), n)]
    for f in list(schema)[1:]:
        v = mine.get(f.name)
        arrays.append(pa.nulls(n, f.type) if v is None else arrow_bytes(v) if v.dtype.kind == "S"
                      else pa.array(v, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class WorkloadReader(DataSourceStreamReader):
    def __init__(self, options: dict, schema: StructType) -> None:
        self.job = JobSettings.model_validate_json(options["job"])
        self.rate = float(options["rate"])
        self.seconds = float(options["seconds"])
        self.arrow_schema = to_arrow_schema(schema)

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
        streams = range(len(self.job.streams))
        if end["end"] == 0:  # the warm-up batch: an empty interval per stream
            return [Arrivals(i, 0, 0, end["batch"]) for i in streams]
        t0 = start["ms"] if start["end"] else end["ms"]
        if end["ms"] <= t0:
            return []
        return [Arrivals(i, t0, end["ms"], end["batch"]) for i in streams]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Arrivals)
        rng = np.random.default_rng([self.job.workload.random_state, partition.stream, partition.batch])
        cols = generate(self.job, partition.stream, rng, partition.t0, partition.t1, self.rate)
        yield generated_batch(self.job, partition.stream, cols, self.arrow_schema)


class WorkloadSource(DataSource):
    """Options: job (JobSettings as JSON), rate (tuples/s per stream), seconds."""

    @classmethod
    def name(cls) -> str:
        return WORKLOAD

    def schema(self) -> StructType:
        return generated_schema(JobSettings.model_validate_json(self.options["job"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WorkloadReader(self.options, schema)


# ---------------------------------------------------------------- Kafka records


def records(generated: DataFrame, job: JobSettings) -> DataFrame:
    """Generated rows as Kafka records (topic, key, value, partition), each stream in its
    format; observes the tuples per topic."""
    parts = []
    for fmt, observed, encode in ((False, _JSON_TUPLES, _json_records), (True, _BLOCK_TUPLES, _block_records)):
        specs = [(i, s) for i, s in enumerate(job.streams) if (s.format == "blocks") == fmt]
        if specs:
            topics = [job.topic_of(s) for _, s in specs]
            mine = generated.filter(F.col("topic").isin(topics))
            counted = mine.observe(observed, *[F.count_if(F.col("topic") == t).alias(t) for t in topics])
            parts.append(encode(counted, job, specs))
    return _spread_unkeyed(reduce(DataFrame.unionByName, parts), job.partitions)


def _spread_unkeyed(records: DataFrame, partitions: int) -> DataFrame:
    """A `partition` column: for unkeyed records (ring streams) a hash of the value over all
    `partitions`, for keyed ones null (Kafka's default partitioner). Every source partition
    then receives records; one that never did would hold a ring's watermark back for good
    while `join.idle_timeout_ms` is off."""
    spread = F.pmod(F.xxhash64(F.col("value")), F.lit(partitions)).cast("int")
    return records.withColumn("partition", F.when(F.col("key").isNull(), spread).otherwise(F.lit(None).cast("int")))


def _json_records(generated: DataFrame, job: JobSettings, specs: list[tuple[int, StreamSpec]]) -> DataFrame:
    """One compact JSON object per tuple (bytes fields as strings, as JSON producers write them)."""
    key = value = None
    for i, spec in specs:
        when = F.col("topic") == job.topic_of(spec)
        fields = [(F.col(column(i, n)).cast("string") if t == "bytes" else F.col(column(i, n))).alias(n)
                  for n, t in spec.fields.items()]
        this_key = (F.concat_ws(",", *[F.col(column(i, k)).cast("string") for k in spec.key_fields])
                    if spec.key_fields else F.lit(None).cast("string"))
        this_value = F.to_json(F.struct(*fields))
        key = F.when(when, this_key) if key is None else key.when(when, this_key)
        value = F.when(when, this_value) if value is None else value.when(when, this_value)
    return generated.select("topic", key.cast("binary").alias("key"), value.cast("binary").alias("value"))


def _block_records(generated: DataFrame, job: JobSettings, specs: list[tuple[int, StreamSpec]]) -> DataFrame:
    budget = min(job.worker.max_record_bytes, _KAFKA_RECORD_BYTES) // 2
    return generated.mapInArrow(_block_encoder([(i, job.topic_of(s), s) for i, s in specs], budget), RECORDS)


def _block_encoder(targets: list[tuple[int, str, StreamSpec]],
                   budget: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: generated row batches -> block records of about `budget` bytes at most."""
    out_schema = to_arrow_schema(RECORDS)

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i, topic, spec in targets:
                rows = pa.Table.from_batches([batch.filter(pc.equal(batch.column("topic"), topic))])
                if rows.num_rows == 0:
                    continue
                table = rows.select([column(i, n) for n in spec.fields]).rename_columns(list(spec.fields))
                values = block_values(spec, table, budget)
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(pa.scalar(topic, pa.string()), len(values)), pa.nulls(len(values), pa.binary()),
                     pa.array(values, pa.binary())], schema=out_schema)

    return encode


def block_values(spec: StreamSpec, table: pa.Table, budget: int) -> list[bytes]:
    """The stream's tuples (columns named by field) as Arrow IPC stream records of
    schemas.codecs.arrow_schema(spec), each holding about `budget` bytes of tuples at most."""
    table = table.select(list(spec.fields)).cast(arrow_schema(spec))
    rows = max(1, budget // max(1, table.nbytes // max(1, table.num_rows)))
    return [_ipc(table.slice(lo, rows)) for lo in range(0, table.num_rows, rows)]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class _Tracker(StreamingQueryListener):
    """Counts tuples per topic from each micro-batch's observed metrics and
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
        for name in (_JSON_TUPLES, _BLOCK_TUPLES):
            metrics = p.observedMetrics.get(name)
            for topic, n in (metrics.asDict() if metrics is not None else {}).items():
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


def _check_formats(job: JobSettings) -> None:
    """Images are binary: JSON records carry bytes fields as text, so they need blocks. Every
    generated value must fit its stream's max_field_bytes, or workers would dead-letter it.
    The productivity workload (partition groups of different productivity, for state spill and memory
    balancing) draws its keys into each stream's one int or str key field, airline generates its four
    streams by name and fields: say so before Spark starts."""
    if job.workload.kind == "productivity":
        for spec in job.streams:
            group_key_field(spec)
    if job.workload.kind == "airline":
        for spec in job.streams:
            airline_stream(spec)
    images = job.workload.kind == "images"
    bad = [s.name for s in job.streams if s.format != "blocks" and "bytes" in s.fields.values()]
    if images and bad:
        raise ValueError(f"workload.kind images writes binary images: give streams {bad} format: blocks")
    longest = 3 * job.workload.pixels if images else job.workload.tuple_bytes
    narrow = [f"streams.{i}.max_field_bytes={s.max_field_bytes}" for i, s in enumerate(job.streams)
              if s.max_field_bytes < longest and {"str", "bytes"} & set(s.fields.values())]
    if narrow:
        what = f"workload.pixels={job.workload.pixels} images" if images else f"workload.tuple_bytes={job.workload.tuple_bytes}"
        raise ValueError(f"{what} make values of up to {longest} bytes, longer than {', '.join(narrow)}: "
                         "workers would dead-letter them as oversize")


def _sink_format(spark: SparkSession) -> str:
    """Spark's JVM Kafka sink when it happens to be installed, else ours."""
    return "kafka" if jvm_kafka_available(spark) else KAFKA


def start_query(spark: SparkSession, job: JobSettings, cluster: Cluster, seconds: float, rate: float,
                checkpoint: str) -> StreamingQuery:
    """Start the generator → Kafka streaming query."""
    generated = (spark.readStream.format(WORKLOAD).option("job", job.model_dump_json())
                 .option("rate", rate).option("seconds", seconds).load())
    return (records(generated, job).writeStream.format(_sink_format(spark))
            .options(**kafka_options(cluster))
            .option("checkpointLocation", checkpoint).trigger(processingTime=TRIGGER).start())


def run_sources(job: JobSettings, cluster: Cluster, seconds: float | None = None, rate: float | None = None,
                show_progress: bool = True) -> dict:
    """Write `seconds` of the job's workload into its input topics; returns
    {"records": {stream: tuples written}, "seconds": event-time span generated,
    "rate": {stream: tuples/s}, "wall_seconds": time the query ran}. (Block-format
    streams hold many tuples per Kafka record: "records" counts tuples.)"""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    _check_formats(job)
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
            query = start_query(spark, job, cluster, seconds, rate, checkpoint)
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
