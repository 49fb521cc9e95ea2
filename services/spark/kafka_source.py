"""Kafka for Spark without the JVM connector: PySpark 4 Python data sources
that run confluent-kafka inside the executors.

`streamjoin-kafka` is one data source with
  - a batch reader: options `bootstrap`, `client` (JSON object of the job's
    librdkafka settings, see `options`), `topics` (comma list), `isolation`
    (read_committed | read_uncommitted, default read_committed) and
    `timeout_s` (how long a partition may sit below its planned end, e.g.
    behind an open transaction, before the read fails; default 60). It reads
    every partition from its low to its high watermark as of planning, one
    Spark partition per Kafka partition, into `RECORD_SCHEMA` rows;
  - a batch and a streaming writer: options `bootstrap` and `client`; input columns
    `topic`, `key`, `value` and optionally `partition`. Records are keyed with
    Kafka's default (murmur2) partitioner, so a key lands in the same
    partition index of every input topic, as the workers expect.

`local_session` builds the small local Spark the jobs run on (its own output
in a log file: services/spark/session.py) and registers the source;
`jvm_kafka_available` says whether the JVM connector is on the classpath
anyway, so callers may prefer it without ever requiring it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType

from streamjoin.services.io.kafka import Cluster
from streamjoin.services.spark.session import default_log_path, start_context

NAME = "streamjoin-kafka"
RECORD_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp_ms", LongType()),  # the Kafka record timestamp
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", MapType(StringType(), StringType())),
])
# Rows per Arrow batch handed to Spark; one consume() call fills at most this many.
_CHUNK = 20_000


@dataclass(frozen=True)
class KafkaSlice(InputPartition):
    """One Kafka partition's records [start, end): one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class ProducedCount(WriterCommitMessage):
    records: int


def options(cluster: Cluster) -> dict[str, str]:
    """Spark options that reach `cluster` with the job's client settings, for this source
    (`bootstrap`, `client`) and for Spark's JVM Kafka connector (`kafka.<property>`).

    Secrets travel revealed: the executors' Python workers build the clients. Spark 4 shows
    no Python data source's options in its plans (tests/unit/test_kafka_settings.py); of the
    JVM connector's options (used only where it is installed) it redacts those whose names
    match spark.redaction.regex (password, secret, token)."""
    jvm = {f"kafka.{k}": str(v) for k, v in cluster.client.items()}
    return {"bootstrap": cluster.bootstrap, "client": json.dumps(dict(cluster.client)),
            "kafka.bootstrap.servers": cluster.bootstrap, **jvm}


def _cluster(options: dict) -> Cluster:
    return Cluster(_option(options, "bootstrap"), json.loads(options.get("client") or "{}"))


def _option(options: dict, name: str) -> str:
    value = options.get(name)
    if not value:
        raise ValueError(f"the {NAME} data source needs option {name!r}")
    return value


class KafkaReader(DataSourceReader):
    def __init__(self, options: dict, schema: StructType) -> None:
        self.cluster = _cluster(options)
        self.topics = [t.strip() for t in _option(options, "topics").split(",") if t.strip()]
        self.isolation = options.get("isolation", "read_committed")
        self.timeout_s = float(options.get("timeout_s", "60"))
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        """Captures every partition's end offset now: the read is this snapshot."""
        ends = _end_offsets(self.cluster, self.isolation, self.topics, self.timeout_s)
        starts = _start_offsets(self.cluster, list(ends))
        return [KafkaSlice(t, p, starts[t, p], end) for (t, p), end in sorted(ends.items()) if end > starts[t, p]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no records at all Spark still runs one task, with a plain InputPartition.
        if isinstance(partition, KafkaSlice):
            yield from _read_slice(self.cluster, self.isolation, self.timeout_s, partition,
                                   to_arrow_schema(self.schema, timezone="UTC"))


def _end_offsets(cluster: Cluster, isolation: str, topics: list[str], timeout_s: float) -> dict[tuple[str, int], int]:
    """End offset of every partition of `topics`, as the brokers' fetch responses state it
    (services.io.kafka.end_offsets: the true end on Tansu too)."""
    from streamjoin.services.io.kafka import end_offsets

    metadata = cluster.admin().list_topics(timeout=30).topics
    missing = [t for t in topics if t not in metadata or metadata[t].error is not None]
    if missing:
        raise ValueError(f"topics {missing} do not exist on {cluster.bootstrap}")
    partitions = [(t, p) for t in topics for p in sorted(metadata[t].partitions)]
    return end_offsets(cluster, partitions, f"streamjoin-plan-{uuid.uuid4().hex}", isolation, timeout_s)


def _start_offsets(cluster: Cluster, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Low watermarks in one request; read tasks then start at a number, as the
    symbolic OFFSET_BEGINNING costs each task a slow offset lookup of its own."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    client = cluster.admin()  # held until the answers are in: a collected client never resolves its futures
    futures = client.list_offsets({TopicPartition(t, p): OffsetSpec.earliest() for t, p in partitions},
                                  request_timeout=30)
    return {(tp.topic, tp.partition): f.result(timeout=60).offset for tp, f in futures.items()}


def _read_slice(cluster: Cluster, isolation: str, timeout_s: float, part: KafkaSlice,
                schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import KafkaException, TopicPartition

    c = cluster.consumer(f"streamjoin-read-{uuid.uuid4().hex}", **{"isolation.level": isolation})
    tp = TopicPartition(part.topic, part.partition)
    try:
        c.assign([TopicPartition(part.topic, part.partition, part.start)])
        position, idle_since = part.start, time.monotonic()
        while position < part.end:
            records = []
            # consume() waits for a full chunk or the timeout: keep the timeout short.
            for m in c.consume(num_messages=_CHUNK, timeout=0.02):
                err = m.error()
                if err is None and m.offset() < part.end:
                    records.append(m)
                elif err is not None:
                    raise KafkaException(err)
            if records:
                yield _to_batch(part, records, schema)
            # The position also moves past transaction markers and aborted records,
            # which are never delivered: message offsets alone could stop short of `end`.
            now = c.position([tp])[0].offset
            if now > position:
                position, idle_since = now, time.monotonic()
            elif time.monotonic() - idle_since > timeout_s:
                raise TimeoutError(
                    f"{part.topic}[{part.partition}] stuck at offset {position} below the planned end "
                    f"{part.end} for {timeout_s}s (an open transaction under {isolation}?)")
    finally:
        c.close()


def _to_batch(part: KafkaSlice, records: list, schema: pa.Schema) -> pa.RecordBatch:
    n = len(records)
    # Kafka allows a header key twice, a Spark map does not: the last one wins.
    headers = [
        list({k: None if v is None else v.decode("utf-8", "replace") for k, v in m.headers() or ()}.items())
        for m in records
    ]
    arrays = [
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array([m.offset() for m in records], pa.int64()),
        pa.array([m.timestamp()[1] for m in records], pa.int64()),
        pa.array([m.key() for m in records], pa.binary()),
        pa.array([m.value() for m in records], pa.binary()),
        pa.array(headers, schema.field("headers").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# One producer per Spark Python worker and cluster, kept across tasks: a fresh
# idempotent producer per micro-batch task delivers its first record 0.5-1 s
# after stamping it on Tansu (measured), which was most of the demo's delay.
_PRODUCERS: dict[str, Any] = {}


def _shared_producer(cluster: Cluster) -> Any:
    key = repr(sorted((cluster.bootstrap, *map(str, cluster.client.items()))))
    if key not in _PRODUCERS:
        _PRODUCERS[key] = cluster.producer()
    return _PRODUCERS[key]


class _Producing:
    """Write side shared by the batch and the streaming writer."""

    def __init__(self, options: dict, schema: StructType) -> None:
        self.cluster = _cluster(options)
        names = set(schema.fieldNames())
        missing = {"topic", "key", "value"} - names
        if missing:
            raise ValueError(f"{NAME} writes columns topic, key, value[, partition]; missing {sorted(missing)}")
        self.with_partition = "partition" in names

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ProducedCount:
        """Produce every row, then flush: the task's commit message means 'all acknowledged'."""
        errors: list[str] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        p = _shared_producer(self.cluster)
        count = 0
        for batch in iterator:
            cols = batch.to_pydict()
            parts = cols["partition"] if self.with_partition else [None] * batch.num_rows
            for topic, key, value, part in zip(cols["topic"], cols["key"], cols["value"], parts):
                _produce(p, topic, key, value, part, delivered)
            count += batch.num_rows
        left = p.flush(60)
        if left or errors:
            raise RuntimeError(f"{NAME}: {left} records undelivered, {len(errors)} failed: {errors[:3]}")
        return ProducedCount(count)


def _produce(p: object, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
             on_delivery: object) -> None:
    kwargs = {} if partition is None else {"partition": int(partition)}
    while True:
        try:
            p.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
            p.poll(0)
            return
        except BufferError:  # local queue full: let deliveries drain, then retry
            p.poll(0.05)


class KafkaBatchWriter(_Producing, DataSourceArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing left to do: every task flushed its producer before reporting success."""


class KafkaStreamWriter(_Producing, DataSourceStreamArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing left to do: every task flushed its producer before reporting success."""


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return RECORD_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> KafkaBatchWriter:
        return KafkaBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        return KafkaStreamWriter(self.options, schema)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaDataSource)


def jvm_kafka_available(spark: SparkSession) -> bool:
    """Is Spark's own Kafka connector (format "kafka") on the classpath?"""
    try:
        return bool(spark.sparkContext._jvm.org.apache.spark.util.Utils.classIsLoadable(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider"))
    except Exception:  # Spark Connect or no py4j gateway: only the Python source exists
        return False


def _workers_see_driver_path() -> None:
    """Python workers unpickle data sources and import UDFs (`module:callable` in the job)
    by name: give them the driver's import path, so what the driver imports they import."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    driver = [str(Path(p or ".").resolve()) for p in sys.path if Path(p or ".").is_dir()]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*driver, *paths]))


# The small local Spark every job runs on.
_LOCAL_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def local_session(app: str = "streamjoin", log_path: Path | None = None) -> SparkSession:
    """The small local Spark every job runs on, source registered: the one already running,
    else a new one named `app`. The first Spark of this process sends its own output to
    `log_path` (default: session.default_log_path(); see services/spark/session.py)."""
    _workers_see_driver_path()
    if SparkContext._active_spark_context is None:
        conf = SparkConf().setAll(list(_LOCAL_CONF.items())).setAppName(app)
        start_context(conf, log_path or default_log_path())
    spark = SparkSession.builder.getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    register(spark)
    return spark
