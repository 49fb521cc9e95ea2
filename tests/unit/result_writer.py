"""Result records as issue 8's spec has workers write them (json, avro, blocks), for
tests of readers. A plain-Python stand-in for streamjoin.schemas.result_codec,
written from the spec on its own so a reader is not checked against itself."""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from streamjoin.engine.result_ids import result_id_hex, result_ids
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.schemas.results import (EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO, BatchCommit, RoundRelease,
                                       ref_columns)
from streamjoin.settings import JobSettings, StreamSpec

TupleRef = tuple[str, int, int]  # topic, partition, tuple offset
_DEFAULTS = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": b""}
_AVRO_TYPES = {"int": "long", "float": "double", "str": "string", "bool": "boolean", "bytes": "bytes"}
_ROWS_PER_CHUNK = 50_000


@dataclass(frozen=True)
class Result:
    """One result: a ref per stream (join order), T, when it was produced, and the fields
    it carries per stream (missing ones default to zero values)."""

    refs: tuple[TupleRef, ...]
    event_time: int
    produced_ms: int
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)


def result_id(job: JobSettings, r: Result) -> str:
    hi, lo = result_ids(job.input_topics, [np.array([p]) for _, p, _ in r.refs], [np.array([o]) for *_, o in r.refs])
    return result_id_hex(hi, lo)[0].decode()


def _ref(job: JobSettings, stream: int, ref: TupleRef) -> dict[str, Any]:
    topic, partition, offset = ref
    if job.streams[stream].format != "blocks":
        return {"topic": topic, "partition": partition, "offset": offset}
    return {"topic": topic, "partition": partition, "offset": offset >> BLOCK_SHIFT,
            "index": offset & ((1 << BLOCK_SHIFT) - 1)}


def _values(job: JobSettings, r: Result) -> dict[str, dict[str, Any]]:
    return {s.name: {n: r.fields.get(s.name, {}).get(n, _DEFAULTS[t]) for n, t in job.result_fields(s).items()}
            for s in job.streams}


def _record(job: JobSettings, r: Result, rid: str | None) -> dict[str, Any]:
    return {"result_id": result_id(job, r) if rid is None else rid, "event_time": r.event_time,
            "produced_ms": r.produced_ms,
            "inputs": {s.name: _ref(job, i, ref) for i, (s, ref) in enumerate(zip(job.streams, r.refs))},
            **_values(job, r)}


def _json_value(v: Any) -> Any:
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def encode_json(job: JobSettings, r: Result, rid: str | None = None) -> bytes:
    """The JSON value of result `r` (`rid` overrides its id)."""
    record = _record(job, r, rid)
    for s in job.streams:
        record[s.name] = {n: _json_value(v) for n, v in record[s.name].items()}
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


def avro_schema(job: JobSettings) -> dict:
    """The results' Avro schema: record Result {result_id, event_time, produced_ms,
    inputs: Inputs {<s>: <s>_ref}, <s>: <s>_fields} in namespace streamjoin.<job>."""
    def ref(s: StreamSpec) -> dict:
        fields = [("topic", "string"), ("partition", "int"), ("offset", "long")]
        fields += [("index", "int")] if s.format == "blocks" else []
        return {"type": "record", "name": f"{s.name}_ref", "fields": [{"name": n, "type": t} for n, t in fields]}

    def values(s: StreamSpec) -> dict:
        return {"type": "record", "name": f"{s.name}_fields",
                "fields": [{"name": n, "type": _AVRO_TYPES[t]} for n, t in job.result_fields(s).items()]}

    inputs = {"type": "record", "name": "Inputs", "fields": [{"name": s.name, "type": ref(s)} for s in job.streams]}
    head = [("result_id", "string"), ("event_time", "long"), ("produced_ms", "long"), ("inputs", inputs)]
    return {"type": "record", "name": "Result", "namespace": "streamjoin." + job.job.replace("-", "_"),
            "fields": [{"name": n, "type": t} for n, t in head] + [{"name": s.name, "type": values(s)}
                                                                   for s in job.streams]}


def encode_avro(job: JobSettings, r: Result, rid: str | None = None) -> bytes:
    """The schemaless Avro value of result `r` (`rid` overrides its id)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(avro_schema(job)), _record(job, r, rid))
    return out.getvalue()


def encode_blocks(job: JobSettings, results: list[Result]) -> list[bytes]:
    """Arrow IPC result blocks of at most _ROWS_PER_CHUNK rows (ids as uint64 halves)."""
    refs = [[r.refs[i] for r in results] for i in range(len(job.streams))]
    parts = [np.array([p for _, p, _ in mine], np.int32) for mine in refs]
    offs = [np.array([o for *_, o in mine], np.int64) for mine in refs]
    hi, lo = result_ids(job.input_topics, parts, offs)
    columns = {RESULT_ID_HI: pa.array(hi), RESULT_ID_LO: pa.array(lo),
               EVENT_TIME: pa.array([r.event_time for r in results], pa.int64()),
               PRODUCED_MS: pa.array([r.produced_ms for r in results], pa.int64())}
    for s, part, off in zip(job.streams, parts, offs):
        p, o, _ = ref_columns(s.name)
        columns |= {p: pa.array(part), o: pa.array(off)}
    table = pa.table(columns)
    return [_ipc(table.slice(lo, _ROWS_PER_CHUNK)) for lo in range(0, max(len(results), 1), _ROWS_PER_CHUNK)]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode(job: JobSettings, results: list[Result]) -> list[bytes]:
    """The result records of `results` in the job's output.format."""
    if job.output.format == "blocks":
        return encode_blocks(job, results)
    one = encode_avro if job.output.format == "avro" else encode_json
    return [one(job, r) for r in results]


def batch_commit(group: int, watermark: int, seq: int = 0) -> bytes:
    """A hash-mode batch commit record's value."""
    return BatchCommit(group=group, seq=seq, end={}, watermark=watermark, results=0, worker="test").model_dump_json().encode()


def round_release(watermark: int, round_: int = 0) -> bytes:
    """A ring-mode round release record's value."""
    return RoundRelease(node="head", round=round_, watermark=watermark).model_dump_json().encode()
