"""The input our workers joined, as Arrow tables: what the peers that do not
read Kafka (Spark's file source, the reference join) are given, so every
engine joins exactly the same tuples, not merely tuples from the same seed.

One Spark batch read of the input topics through the project's Kafka data
source, the JSON parsed with the verifier's schema of each stream. The same
tables go to the Spark oracles (`oracle_inputs`), which give the results a
peer's are judged against."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin.services.io.kafka import Cluster
from streamjoin.services.spark.input_records import value_schema
from streamjoin.services.spark.kafka_source import NAME as KAFKA
from streamjoin.services.spark.kafka_source import options as kafka_options
from streamjoin.settings import JobSettings

ARRIVAL = "arrival_ms"  # the Kafka record timestamp: when the tuple reached the broker


def export_inputs(spark: SparkSession, job: JobSettings, cluster: Cluster) -> dict[str, pa.Table]:
    """Per stream: partition, offset, arrival_ms and the stream's fields, in arrival order."""
    out = {}
    for spec in job.streams:
        raw = spark.read.format(KAFKA).options(**kafka_options(cluster)).option("topics", job.topic_of(spec)).load()
        parsed = raw.select("partition", "offset", F.col("timestamp_ms").alias(ARRIVAL),
                            F.from_json(F.col("value").cast("string"), value_schema(spec)).alias("v"))
        table = parsed.select("partition", "offset", ARRIVAL, "v.*").toArrow()
        out[spec.name] = table.sort_by([(ARRIVAL, "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    return out


def oracle_inputs(spark: SparkSession, job: JobSettings, tables: dict[str, pa.Table]) -> dict[str, DataFrame]:
    """Per stream, `export_inputs`' tuples as the Spark oracles (services/spark/*_oracle.py) take
    them: partition, offset, key (the stream's one key field), ts and group, its partition (the
    inputs are co-partitioned)."""
    out = {}
    for spec in job.streams:
        t = tables[spec.name]
        out[spec.name] = spark.createDataFrame(pa.table({
            "partition": t["partition"].cast(pa.int32()), "offset": t["offset"].cast(pa.int64()),
            "key": t[spec.key_fields[0]], "ts": t[spec.time_field].cast(pa.int64()),
            "group": t["partition"].cast(pa.int32())}))
    return out
