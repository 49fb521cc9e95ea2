"""What `verify` reads of a job's inputs: its input records, decoded into the
tuples the workers see (with their identities, times and key groups), and its
dead letters, which say which of them the join never took.

Hash mode reads JSON records (`decode_inputs`, `key_groups`,
`decode_dead_letters`, together `hash_inputs`); ring and splitjoin modes read
JSON or block records a tuple at a time (`decode_tuples`,
`decode_ring_dead_letters`, `mark_dead`). Either way `accepted_inputs` is what
the oracles join.
"""

from __future__ import annotations

from functools import reduce
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, BooleanType, DataType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType)

from streamjoin.engine.predicates import UDF_ERROR
from streamjoin.schemas.codecs import BLOCK_SHIFT, arrow_schema
from streamjoin.schemas.results import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC
from streamjoin.services.spark.join_columns import all_of
from streamjoin.settings import JobSettings, StreamSpec

# Field types as JSON records carry them (bytes as text), for from_json.
_SPARK_TYPES: dict[str, DataType] = {"int": LongType(), "float": DoubleType(), "str": StringType(),
                                     "bool": BooleanType(), "bytes": StringType()}
# Field types of decoded ring-mode tuples: bytes are bytes (UDFs compare them), whatever the format.
_TUPLE_TYPES: dict[str, DataType] = _SPARK_TYPES | {"bytes": BinaryType()}


# ---------------------------------------------------------------- hash mode


def value_schema(spec: StreamSpec) -> StructType:
    """A stream's JSON record value as from_json reads it (bytes fields as text)."""
    return StructType([StructField(n, _SPARK_TYPES[t]) for n, t in spec.fields.items()])


def decode_inputs(raw: DataFrame, spec: StreamSpec, table: bool = False) -> DataFrame:
    """partition, offset, arrival (Kafka timestamp), key, ts, ok (parsed with every field present);
    for an as-of join's `table` also `deleted`: a tombstone (null value) is the deletion of the
    row its record key spells, at its Kafka timestamp (services/io/tombstones.py)."""
    v = F.from_json(F.col("value").cast("string"), value_schema(spec))
    parsed = raw.select("topic", "partition", "offset", F.col("timestamp_ms").alias("arrival"), v.alias("v"),
                        F.col("key").alias("record_key"), F.col("value").isNull().alias("tombstone"))
    keys = [F.col(f"v.{k}") for k in spec.key_fields]
    key = keys[0] if len(keys) == 1 else F.struct(*keys)
    ts, ok = F.col(f"v.{spec.time_field}"), reduce(lambda a, b: a & b, [F.col(f"v.{n}").isNotNull() for n in spec.fields])
    extra = []
    if table:
        tomb_key, tomb_ok = _tombstone_key(spec)
        key = F.when(F.col("tombstone"), tomb_key).otherwise(key)
        ts = F.when(F.col("tombstone"), F.col("arrival")).otherwise(ts)
        ok = F.when(F.col("tombstone"), tomb_ok).otherwise(ok)
        extra = [F.col("tombstone").alias("deleted")]
    return parsed.select("topic", "partition", "offset", "arrival", key.alias("key"), ts.alias("ts"),
                         F.coalesce(ok, F.lit(False)).alias("ok"), *extra)


def _tombstone_key(spec: StreamSpec) -> tuple[Column, Column]:
    """A tombstone's key, read from its record key's text (the key fields joined by ","), and
    whether the text spells one exactly (an int's canonical digits, true/false)."""
    text = F.col("record_key").cast("string")
    parts = F.split(text, ",", -1)
    values = []
    for i, name in enumerate(spec.key_fields):
        part = text if len(spec.key_fields) == 1 else parts.getItem(i)
        ftype = spec.fields[name]
        if ftype == "int":
            number = part.cast("long")
            values.append(F.when(number.cast("string") == part, number).alias(name))
        elif ftype == "bool":
            values.append(F.when(part == "true", F.lit(True)).when(part == "false", F.lit(False)).alias(name))
        else:
            values.append(part.alias(name))
    whole = F.lit(True) if len(spec.key_fields) == 1 else F.size(parts) == len(spec.key_fields)
    ok = reduce(lambda a, b: a & b, [c.isNotNull() for c in values], whole & text.isNotNull())
    return (values[0] if len(values) == 1 else F.struct(*values)), ok


def key_groups(decoded: DataFrame, spec: StreamSpec, partitions: int) -> DataFrame:
    """decoded (decode_inputs) + `group`: the partition group of each tuple's join key, Kafka's
    murmur2 of the canonical key text mod `partitions`. Workers join a record there whichever
    partition it came in on (a misrouted one travels through the by-key topic); its refs keep
    the partition it came in on, so groups come from keys, not refs."""
    key = F.col("key")
    text = (key.cast("string") if len(spec.key_fields) == 1
            else F.concat_ws(",", *[key[k].cast("string") for k in spec.key_fields]))
    return decoded.withColumn("group", _partition_of(partitions)(text))


def _partition_of(partitions: int) -> Callable[[Column], Column]:
    """A Spark function: key text -> the partition Kafka's default partitioner picks among `partitions`."""
    def partition(texts: pd.Series) -> pd.Series:
        from streamjoin.topology.partitioner import partitions_for_keys

        return pd.Series(partitions_for_keys(pa.array(texts.fillna(""), pa.string()), partitions))

    return F.pandas_udf(partition, IntegerType())


def decode_dead_letters(raw: DataFrame) -> DataFrame:
    """topic, partition, offset of the input each dead letter stands for, and its reason (one row per input)."""
    h = F.col("headers")
    return (raw.select(h[H_TOPIC].alias("topic"), h[H_PARTITION].cast("int").alias("partition"),
                       h[H_OFFSET].cast("long").alias("offset"), h[H_REASON].alias("reason"))
            .groupBy("topic", "partition", "offset").agg(F.min("reason").alias("reason")))


def hash_inputs(raw: DataFrame, job: JobSettings) -> tuple[list[DataFrame], DataFrame]:
    """Hash mode: per stream, its input records decoded (decode_inputs) with their `group`
    (key_groups) and `reason`, that of the dead letter standing for the record (null: none);
    and the dead letters. Whatever the reason (malformed, late, oversize, misrouted, ...), a
    dead-lettered record was not joined."""
    dead = decode_dead_letters(raw.filter(F.col("topic") == job.dead_letter_topic)).localCheckpoint()
    decoded = [key_groups(decode_inputs(raw.filter(F.col("topic") == job.topic_of(s)), s, s.name == job.join.table),
                          s, job.partitions)
               .join(dead, ["topic", "partition", "offset"], "left") for s in job.streams]
    return decoded, dead


def accepted_inputs(decoded: DataFrame) -> DataFrame:
    """The tuples the join takes: decoded whole and not dead-lettered."""
    return decoded.filter(F.col("ok") & F.col("reason").isNull())


# ---------------------------------------------------------------- ring and splitjoin modes


def tuple_schema(spec: StreamSpec) -> StructType:
    """A decoded ring-mode input tuple (see decode_tuples)."""
    return StructType([
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("record_offset", LongType()), StructField("offset", LongType()),
        StructField("arrival", LongType()), StructField("ts", LongType()), StructField("ok", BooleanType()),
        StructField("v", StructType([StructField(n, _TUPLE_TYPES[t]) for n, t in spec.fields.items()]))])


def decode_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    """One row per input tuple (tuple_schema): its record's offset, its own offset (the
    record's; in a block record (record offset << BLOCK_SHIFT) | index, as
    schemas.codecs.decode_blocks numbers them), arrival (Kafka timestamp), ts, ok
    (decoded with every field present) and v, the fields. A block record that does
    not decode is one row, not ok."""
    return _block_tuples(raw, spec) if spec.format == "blocks" else _json_tuples(raw, spec)


def _json_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    parsed = raw.select("topic", "partition", "offset", F.col("timestamp_ms").alias("arrival"),
                        F.from_json(F.col("value").cast("string"), value_schema(spec)).alias("j"))
    ok = all_of([F.col("j")[n].isNotNull() for n in spec.fields])
    # JSON carries bytes as text; the engine (Arrow's JSON reader) takes the text's UTF-8 bytes.
    fields = [(F.col("j")[n].cast("binary") if t == "bytes" else F.col("j")[n]).alias(n) for n, t in spec.fields.items()]
    return parsed.select("topic", "partition", F.col("offset").alias("record_offset"), "offset", "arrival",
                         F.col("j")[spec.time_field].alias("ts"), F.coalesce(ok, F.lit(False)).alias("ok"),
                         F.struct(*fields).alias("v"))


def _block_tuples(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    schema = tuple_schema(spec)
    return raw.select("topic", "partition", "offset", "timestamp_ms", "value").mapInArrow(
        _tuple_block_decoder(spec, schema), schema)


def _tuple_block_decoder(spec: StreamSpec,
                         schema: StructType) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: block records -> their tuples, a record at a time."""
    out = to_arrow_schema(schema)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for topic, part, off, arrival, value in zip(*(batch.column(c).to_pylist() for c in batch.schema.names)):
                yield _record_tuples(spec, out, topic, part, off, arrival, value)

    return decode


def _record_tuples(spec: StreamSpec, out: pa.Schema, topic: str, part: int, off: int, arrival: int,
                   value: bytes | None) -> pa.RecordBatch:
    fields_type = out.field("v").type
    try:  # exactly the worker's reading of a block (schemas.codecs.decode_blocks)
        table = pa.ipc.open_stream(value or b"").read_all().select(list(spec.fields)).cast(arrow_schema(spec))
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, ValueError):
        table = None
    if table is None:
        n, ts, ok, fields = 1, pa.nulls(1, pa.int64()), pa.array([False]), pa.nulls(1, fields_type)
    else:
        n, columns = table.num_rows, [table.column(f).combine_chunks() for f in spec.fields]
        ts = table.column(spec.time_field).combine_chunks()
        ok = pc.invert(reduce(pc.or_, [pc.is_null(c) for c in columns], pa.array(np.zeros(n, bool))))
        fields = pa.StructArray.from_arrays(columns, fields=list(fields_type))
    index = np.arange(n, dtype=np.int64)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n), pa.array(np.full(n, part, np.int32)),
        pa.array(np.full(n, off, np.int64)), pa.array((np.int64(off) << BLOCK_SHIFT) + index),
        pa.array(np.full(n, arrival, np.int64)), ts, ok, fields], schema=out)


def decode_ring_dead_letters(raw: DataFrame, job: JobSettings) -> DataFrame:
    """topic, partition, record_offset, reason of each dead letter and `dts`: null when it
    stands for its whole input record, else an event time of the tuples it holds (a block
    record's late tuples are dead-lettered as a block of just those; tuples of one record
    with one event time share their fate, so the event time names them exactly). With
    several dead letters for one block record, its tuples take the least of their reasons."""
    h = F.col("headers")
    named = raw.select(h[H_TOPIC].alias("topic"), h[H_PARTITION].cast("int").alias("partition"),
                       h[H_OFFSET].cast("long").alias("offset"), h[H_REASON].alias("reason"), "timestamp_ms", "value")
    # A udf-error dead letter reports a record whose probe met a failing UDF: the record
    # itself was joined (only the failing pairs were not), so it stays an input.
    named = named.filter(F.col("reason") != F.lit(UDF_ERROR))
    blocks = [s for s in job.streams if s.format == "blocks"]
    whole = named.filter(~F.col("topic").isin([job.topic_of(s) for s in blocks])).select(
        "topic", "partition", F.col("offset").alias("record_offset"), "reason", F.lit(None).cast("long").alias("dts"))
    reasons = named.select("topic", "partition", F.col("offset").alias("record_offset"), "reason")
    held = [_block_tuples(named.filter(F.col("topic") == job.topic_of(s)), s)
            .select("topic", "partition", "record_offset", F.when(F.col("ok"), F.col("ts")).alias("dts"))
            .join(reasons, ["topic", "partition", "record_offset"]) for s in blocks]
    return reduce(DataFrame.unionByName, [whole, *held])


def mark_dead(decoded: DataFrame, dead: DataFrame) -> DataFrame:
    """decoded + `reason`: that of the dead letter standing for the tuple (null: none)."""
    hits = (decoded.select("topic", "partition", "record_offset", "offset", "ts")
            .join(dead, ["topic", "partition", "record_offset"])
            .filter(F.col("dts").isNull() | (F.col("dts") == F.col("ts")))
            .groupBy("topic", "partition", "offset").agg(F.min("reason").alias("reason")))
    return decoded.join(hits, ["topic", "partition", "offset"], "left")

