"""What `verify` reads of a job's output: its result records, in any
`output.format`, and its commit records (the watermarks that say which inputs
have been joined for good).

Result records become one row per result (`result_schema`): result_id (32 hex
digits), the refs `<stream>.partition` / `<stream>.offset` (a `blocks` input's
tuple offset is (record offset << BLOCK_SHIFT) | index, as the engine numbers
tuples), event_time, produced_ms, and two verdicts:
  record_ok  the record decoded into a result (else its row has nulls: one row
             per record that does not decode);
  id_ok      its id is the one engine.result_ids computes from its refs (and
             its window_start), and the refs name the job's source topics.
A window join's record whose window_end is not its window_start plus the
instance size does not decode.
Per format:
  json          Spark's from_json, in the JVM, with a schema made from the job:
                the id, the times and the refs (field values are not read);
  avro, blocks  the workers' own reader (schemas.result_decode.decode_results) in
                mapInArrow, a batch of records at a time; it checks every field
                too, and takes a ref naming another topic for a malformed record.
Then one vectorised id check per Arrow batch, whatever the format.

Absent members (outer, semi and anti joins): a result may lack the member of
an optional stream (`engine.outer.optional_streams`); its record has null for
both its ref and its fields object (json, avro) or partition and offset -1
(blocks). Its row has `<s>.partition` and `<s>.offset` ABSENT (-1), and the id
check hashes (-1, -1) under the stream's own topic, as the engine does. A null
member of any other stream, or an optional member with one of ref and fields
null but not the other, is a record that does not decode.

Commit records (schemas/results.py) are JSON on `<job>.commits`: a group's
final watermark is the highest over its `batch` commits, the ring's release
watermark the highest over its `round` releases.
"""

from __future__ import annotations

from functools import reduce
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from streamjoin.engine.outer import optional_streams
from streamjoin.engine.result_ids import ABSENT, WINDOW_END, WINDOW_START
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.schemas.results import EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, ref_columns
from streamjoin.settings import JobSettings, StreamSpec

RESULT_ID = "result_id"  # the id field of json and avro result records (32 hex digits)
RECORD_OK, ID_OK = "record_ok", "id_ok"
INPUTS = "inputs"  # json/avro: the refs, one {topic, partition, offset[, index]} per stream
_ID_PATTERN = "^[0-9a-f]{32}$"
_NO_ID = "0" * 32  # stands in for a missing or malformed id, which never passes the check anyway

BatchFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _stated(stream: str) -> tuple[str, str, str]:
    """The columns of a stream's ref as a record states it, before the id check: partition,
    tuple offset, topic. No dots: mapInArrow cannot take columns with dots in their names."""
    return f"{stream}__partition", f"{stream}__offset", f"{stream}__topic"


def _head(job: JobSettings) -> list[StructField]:
    """The times a decoded result starts with: event_time, produced_ms, a window join's window_start."""
    window = [StructField(WINDOW_START, LongType())] if job.window_instance is not None else []
    return [StructField(EVENT_TIME, LongType()), StructField(PRODUCED_MS, LongType()), *window]


def result_schema(job: JobSettings) -> StructType:
    """A decoded result: record_ok, result_id, id_ok, event_time, produced_ms (a window join's
    window_start), then per stream `<s>.partition` (int) and `<s>.offset` (long, the tuple's offset)."""
    fields = [StructField(RECORD_OK, BooleanType()), StructField(RESULT_ID, StringType()),
              StructField(ID_OK, BooleanType()), *_head(job)]
    for s in job.streams:
        part, off, _ = ref_columns(s.name)
        fields += [StructField(part, IntegerType()), StructField(off, LongType())]
    return StructType(fields)


def _record_schema(job: JobSettings) -> StructType:
    """A result as its record states it, before the id check: record_ok, result_id, the times
    (`_head`), and per stream the _stated columns."""
    fields = [StructField(RECORD_OK, BooleanType()), StructField(RESULT_ID, StringType()), *_head(job)]
    for s in job.streams:
        part, off, topic = _stated(s.name)
        fields += [StructField(part, IntegerType()), StructField(off, LongType()), StructField(topic, StringType())]
    return StructType(fields)


def decode_results(raw: DataFrame, job: JobSettings) -> DataFrame:
    """Result records (Kafka reader rows) of `job.output.format` -> one row per result (result_schema)."""
    decoders = {"json": _json_results, "avro": _codec_results, "blocks": _codec_results}
    stated = decoders[job.output.format](raw.select("value"), job)
    return stated.mapInArrow(_id_checker(job), result_schema(job))


# ---------------------------------------------------------------- json


def _ref_struct(spec: StreamSpec) -> StructType:
    """An input ref as a result record states it; `index` only for blocks streams."""
    fields = [StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType())]
    return StructType(fields + ([StructField("index", IntegerType())] if spec.format == "blocks" else []))


def json_result_schema(job: JobSettings) -> StructType:
    """The part of a JSON result record verify reads: the id, the times, the refs, and an optional
    stream's fields object as raw text (null for an absent member; other field values are not read)."""
    inputs = StructType([StructField(s.name, _ref_struct(s)) for s in job.streams])
    fields = [StructField(s.name, StringType())
              for s, optional in zip(job.streams, optional_streams(job.join.type, len(job.streams))) if optional]
    window = [StructField(WINDOW_START, LongType()), StructField(WINDOW_END, LongType())] \
        if job.window_instance is not None else []
    return StructType([StructField(RESULT_ID, StringType()), StructField(EVENT_TIME, LongType()), *window,
                       StructField(PRODUCED_MS, LongType()), StructField(INPUTS, inputs), *fields])


def _tuple_offset(ref: Column, spec: StreamSpec) -> tuple[Column, Column]:
    """(tuple offset, is it in range: null or false if not) of a stream's ref struct."""
    if spec.format != "blocks":
        return ref["offset"], ref["offset"] >= 0
    index = ref["index"]
    in_range = index.between(0, (1 << BLOCK_SHIFT) - 1) & ref["offset"].between(0, (1 << (63 - BLOCK_SHIFT)) - 1)
    return F.shiftleft(ref["offset"], BLOCK_SHIFT).bitwiseOR(index), in_range


def _json_member(job: JobSettings, spec: StreamSpec, optional: bool) -> tuple[list[Column], Column, Column]:
    """(stated columns, is the member well-formed, is it absent) of one stream's member in the
    parsed record `j`. An absent member (optional streams: ref and fields object both null) states
    partition and offset ABSENT and the stream's own topic, which its id hashes them under.

    job: the job; spec: the stream; optional: whether a result may lack its member."""
    ref = F.col("j")[INPUTS][spec.name]
    offset, offset_ok = _tuple_offset(ref, spec)
    part, off, topic = _stated(spec.name)
    stated = [ref["partition"], offset, ref["topic"]]
    present_ok = ref["topic"].isNotNull() & (ref["partition"] >= 0) & offset_ok
    if not optional:
        return [c.alias(n) for c, n in zip(stated, (part, off, topic))], present_ok, F.lit(False)
    absent = ref.isNull() & F.col("j")[spec.name].isNull()
    stand_ins = [F.lit(ABSENT), F.lit(ABSENT).cast(LongType()), F.lit(job.topic_of(spec))]
    stated = [F.when(absent, a).otherwise(c) for a, c in zip(stand_ins, stated)]
    ok = absent | (present_ok & F.col("j")[spec.name].isNotNull())
    return [c.alias(n) for c, n in zip(stated, (part, off, topic))], ok, absent


def _json_results(values: DataFrame, job: JobSettings) -> DataFrame:
    j = F.from_json(F.col("value").cast("string"), json_result_schema(job))
    parsed = values.select(j.alias("j"))
    refs, complete = [], [F.col("j")[c].isNotNull() for c in (RESULT_ID, EVENT_TIME, PRODUCED_MS)]
    lacking = F.lit(0)
    for s, optional in zip(job.streams, optional_streams(job.join.type, len(job.streams))):
        stated, ok, absent = _json_member(job, s, optional)
        refs += stated
        complete.append(ok)
        lacking = lacking + absent.cast(IntegerType())
    complete.append(lacking <= 1)  # a result lacks one member at most
    instance = job.window_instance
    if instance is not None:  # the instance [start, start + size): its end must say so
        start, end = F.col("j")[WINDOW_START], F.col("j")[WINDOW_END]
        complete.append(end - start == F.lit(instance[0]))
    record_ok = F.coalesce(reduce(lambda a, b: a & b, complete), F.lit(False))
    times = [F.col("j")[f.name].alias(f.name) for f in _head(job)]
    return parsed.select(record_ok.alias(RECORD_OK), F.col("j")[RESULT_ID].alias(RESULT_ID), *times, *refs)


# ---------------------------------------------------------------- avro and blocks


def _codec_results(values: DataFrame, job: JobSettings) -> DataFrame:
    schema = _record_schema(job)
    return values.mapInArrow(_codec_decoder(job, to_arrow_schema(schema)), schema)


def _codec_decoder(job: JobSettings, out: pa.Schema) -> BatchFunction:
    """mapInArrow function: Avro or Arrow-block result records -> _record_schema rows, read
    by the workers' own reader (schemas.result_decode.decode_results), a batch of records at a time."""
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from streamjoin.schemas.result_decode import decode_results as read
        from streamjoin.schemas.result_format import result_layout

        layout = result_layout(job)
        for batch in batches:
            got = read(layout, job.output.format, batch.column("value").to_pylist())
            yield from _stated_rows(job, got.columns, out).to_batches()
            # The reader names each record that is no result: one not-ok row stands for it.
            yield from pa.Table.from_pylist([{RECORD_OK: False}] * len(got.rejects), schema=out).to_batches()

    return decode


def _stated_rows(job: JobSettings, columns: dict[str, np.ndarray], out: pa.Schema) -> pa.Table:
    """The reader's result columns as _record_schema rows. It rejects refs naming another
    topic, so the refs it returns name the job's source topics (an absent member's, partition
    and offset ABSENT, names none: its id hashes it under its stream's topic, stated here too)."""
    from streamjoin.engine.result_ids import result_id_hex

    n = len(columns[EVENT_TIME])
    rows = {RECORD_OK: pa.array(np.ones(n, bool)), EVENT_TIME: pa.array(columns[EVENT_TIME], pa.int64()),
            RESULT_ID: pa.array(result_id_hex(columns[RESULT_ID_HI], columns[RESULT_ID_LO])).cast(pa.string()),
            PRODUCED_MS: pa.array(columns[PRODUCED_MS], pa.int64())}
    if WINDOW_START in columns:
        rows[WINDOW_START] = pa.array(columns[WINDOW_START], pa.int64())
    for s in job.streams:
        (part, off, _), (stated_part, stated_off, stated_topic) = ref_columns(s.name), _stated(s.name)
        rows |= {stated_part: pa.array(columns[part], pa.int32()), stated_off: pa.array(columns[off], pa.int64()),
                 stated_topic: pa.repeat(pa.scalar(job.topic_of(s)), n)}
    return pa.Table.from_arrays([rows[f.name] for f in out], schema=out)


# ---------------------------------------------------------------- the id check


def _id_checker(job: JobSettings) -> BatchFunction:
    """mapInArrow function: _record_schema rows -> result_schema rows (id_ok added, topics dropped)."""
    out = to_arrow_schema(result_schema(job))

    def check(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = {c: batch.column(c) for c in (RECORD_OK, RESULT_ID, *(f.name for f in _head(job)))}
            columns[ID_OK] = pa.array(ids_agree(job, batch))
            for s in job.streams:
                columns |= dict(zip(ref_columns(s.name)[:2], (batch.column(c) for c in _stated(s.name)[:2])))
            yield pa.RecordBatch.from_arrays([columns[f.name] for f in out], schema=out)

    return check


def ids_agree(job: JobSettings, batch: pa.RecordBatch) -> np.ndarray:
    """Per row: a decoded record whose id is 32 hex digits, equal to the id computed from
    its refs, which name the job's source topics (and a window join's window_start)."""
    from streamjoin.engine.result_ids import parse_result_id_hex, result_ids

    text = batch.column(RESULT_ID)
    ok = pc.fill_null(pc.and_(batch.column(RECORD_OK), pc.match_substring_regex(text, _ID_PATTERN)), False)
    for s in job.streams:
        ok = pc.and_(ok, pc.fill_null(pc.equal(batch.column(_stated(s.name)[2]), job.topic_of(s)), False))
    ok = ok.to_numpy(zero_copy_only=False)
    # Rows that failed already get a placeholder id, so that only hex digits are parsed.
    checked = pc.if_else(pa.array(ok), text, _NO_ID).cast(pa.binary()).to_numpy(zero_copy_only=False).astype("S32")
    stated_hi, stated_lo = parse_result_id_hex(checked)
    refs = [[pc.fill_null(batch.column(c), 0).to_numpy() for c in _stated(s.name)[:2]] for s in job.streams]
    start = pc.fill_null(batch.column(WINDOW_START), 0).to_numpy() if job.window_instance is not None else None
    hi, lo = result_ids(job.input_topics, [p for p, _ in refs], [o for _, o in refs], start)
    return ok & (hi == stated_hi) & (lo == stated_lo)


# ---------------------------------------------------------------- commits

COMMIT_SCHEMA = StructType([StructField("kind", StringType()), StructField("group", IntegerType()),
                            StructField("watermark", LongType())])


def decode_commits(raw_commits: DataFrame) -> DataFrame:
    """kind ("batch" | "round"), group (batch commits) and watermark of each commit record."""
    c = F.from_json(F.col("value").cast("string"), COMMIT_SCHEMA).alias("c")
    return raw_commits.select(c).select("c.*")


def final_watermarks(raw_commits: DataFrame) -> DataFrame:
    """group, watermark: the highest any of the group's batch commits carries."""
    batches = decode_commits(raw_commits).filter(F.col("kind") == "batch")
    return batches.groupBy("group").agg(F.max("watermark").alias("watermark"))


def release_watermark(raw_commits: DataFrame) -> int | None:
    """The ring head's final release watermark: the highest of its round releases (every
    tuple with ts below it was released; None: no round released yet)."""
    rounds = decode_commits(raw_commits).filter(F.col("kind") == "round")
    row = rounds.agg(F.max("watermark").alias("wm")).first()
    return None if row["wm"] is None else int(row["wm"])
