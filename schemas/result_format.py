"""The result record format: what a job writes on its results topic, one Kafka
record per result (JSON or Avro), or Arrow IPC blocks of many results for
high-rate internal consumers (`output.format`): each job's layout of them and
their Avro schema. schemas/result_encode.py writes them, schemas/result_decode.py
reads them back.

JSON value (compact, keys in this order):
  {"result_id":"<32 hex>","event_time":T[,"window_start":s,"window_end":e],"produced_ms":t,
   "inputs":{"<s>":{"topic":"<source topic>","partition":p,"offset":o[,"index":i]},...},
   "<s>":{"<field>":value,...},...}
  floats as Python's repr (shortest round trip), NaN/Inf as null; strings as
  json.dumps(ensure_ascii=False) writes them; bytes as padded base64. For a
  `format: blocks` stream, offset is the Kafka record's and index the tuple's
  place in it (the engine's tuple offset is (offset << BLOCK_SHIFT) | index).
  window_start and window_end only in a tumbling or hopping window join's
  records: the instance [s, e) the result belongs to (e = s + its size); the
  result id names it too (engine/result_ids.py).
Avro value: schemaless binary of `results_avro_schema(layout)` (window_start and
window_end, longs, after event_time in a window join's).
Blocks: Arrow IPC stream records of the result block's columns (`result_columns`;
a window join's hold window_start and window_end too).
Key: hash mode the join-key text of the first stream's key fields (so the
record lands on the results partition of its group; of the second stream's
where the first is absent), ring and splitjoin modes the 32-hex id.

Absent members (outer, semi and anti joins): a result may lack the member of
an optional stream (`StreamLayout.optional`). The engine's block marks it with
partition and offset ABSENT (-1) and filler in its ts and field columns. JSON
writes null for both its ref and its fields object ("inputs":{...,"s":null},
...,"s":null), Avro takes the null branch of both unions; blocks keep the
columns as they are, so a blocks reader recognises an absent member by its
partition -1 (offset -1 too) and never reads its filler. Readers return an
absent member as partition and offset ABSENT, ts and fields filler (0, 0.0,
"", b"", False); a null member of a stream that is not optional, or a member
with one of ref and fields null but not the other, is malformed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamjoin.engine.outer import optional_streams
from streamjoin.engine.result_ids import EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, WINDOW_END, WINDOW_START
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.settings import FieldType, JobSettings

__all__ = ["INDEX_MASK", "StreamLayout", "ResultLayout", "result_layout", "result_columns", "results_avro_schema"]

INDEX_MASK = (1 << BLOCK_SHIFT) - 1  # a blocks stream's tuple offset: the tuple's index within its record
_AVRO_TYPES = {"int": "long", "float": "double", "str": "string", "bool": "boolean", "bytes": "bytes"}


@dataclass(frozen=True)
class StreamLayout:
    """One stream's part of a result record."""

    name: str
    topic: str  # its source topic, named in the record's input refs
    blocks: bool  # format: blocks, so its tuple offsets hold (record offset << BLOCK_SHIFT) | index
    fields: tuple[tuple[str, FieldType], ...]  # job.result_fields(stream), in job order
    time_field: str
    key_fields: tuple[str, ...]
    optional: bool = False  # a result may lack this stream's member (outer, semi, anti joins)


@dataclass(frozen=True)
class ResultLayout:
    """What the result records of a job look like (built once from its settings)."""

    job: str
    mode: Literal["hash", "ring", "splitjoin", "query"]  # the join mode; query: a query service's sink
    streams: tuple[StreamLayout, ...]
    window_ms: int | None = None  # a tumbling or hopping window join's instance size: records name their window


def result_layout(job: JobSettings) -> ResultLayout:
    """The result record layout of `job`."""
    instance = job.window_instance
    return ResultLayout(job.job, job.join.mode, tuple(
        StreamLayout(s.name, job.topic_of(s), s.format == "blocks", tuple(job.result_fields(s).items()), s.time_field,
                     tuple(s.key_fields), optional)
        for s, optional in zip(job.streams, _optional(job))), instance[0] if instance else None)


def _optional(job: JobSettings) -> tuple[bool, ...]:
    """Per stream, whether a result may lack it: an as-of left join's table (no valid version),
    or what the join type says (engine/outer.py)."""
    t = job.table_index
    if t is not None:
        return tuple(job.join.type == "left" and i == t for i in range(len(job.streams)))
    return optional_streams(job.join.type, len(job.streams))


def result_columns(layout: ResultLayout) -> dict[str, FieldType]:
    """The result block's written columns, in order, with their field types (ids are uint64,
    partitions int32; the rest as named)."""
    cols: dict[str, FieldType] = {RESULT_ID_HI: "int", RESULT_ID_LO: "int", EVENT_TIME: "int"}
    if layout.window_ms is not None:
        cols |= {WINDOW_START: "int", WINDOW_END: "int"}
    cols[PRODUCED_MS] = "int"
    for s in layout.streams:
        cols |= {f"{s.name}.partition": "int", f"{s.name}.offset": "int", f"{s.name}.ts": "int"}
        cols |= {f"{s.name}.{f}": t for f, t in s.fields}
    return cols



def _avro_member_type(stream: StreamLayout, record: dict) -> dict | list:
    """A member's Avro type: `record`, or for an optional stream the union ["null", record]."""
    return ["null", record] if stream.optional else record


def results_avro_schema(layout: ResultLayout) -> dict:
    """The Avro schema (.avsc as a dict) of the job's result records. An optional stream's ref and
    fields records are unions with null (an absent member); a window join's records have
    window_start and window_end after event_time."""
    refs = [{"name": s.name, "type": _avro_member_type(s, {"type": "record", "name": f"{s.name}_ref", "fields": [
        {"name": "topic", "type": "string"}, {"name": "partition", "type": "int"}, {"name": "offset", "type": "long"},
        *([{"name": "index", "type": "int"}] if s.blocks else [])]})} for s in layout.streams]
    fields = [{"name": s.name, "type": _avro_member_type(s, {"type": "record", "name": f"{s.name}_fields", "fields": [
        {"name": f, "type": _AVRO_TYPES[t]} for f, t in s.fields]})} for s in layout.streams]
    window = [{"name": WINDOW_START, "type": "long"}, {"name": WINDOW_END, "type": "long"}] \
        if layout.window_ms is not None else []
    return {"type": "record", "name": "Result", "namespace": f"streamjoin.{layout.job.replace('-', '_')}",
            "fields": [{"name": "result_id", "type": "string"}, {"name": "event_time", "type": "long"}, *window,
                       {"name": "produced_ms", "type": "long"},
                       {"name": "inputs", "type": {"type": "record", "name": "Inputs", "fields": refs}},
                       *fields]}

