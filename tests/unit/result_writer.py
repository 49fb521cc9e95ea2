"""Result records and commit records as workers write them, for tests of readers:
results given by their refs become a result block (the engine's columns and
dtypes) and go through the workers' own encoders (schemas.result_encode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import result_head, result_id_hex, result_ids
from streamjoin.schemas import result_encode, result_format
from streamjoin.schemas.results import BatchCommit, RoundRelease, ref_columns
from streamjoin.settings import JobSettings

TupleRef = tuple[str, int, int]  # topic, partition, tuple offset
_DEFAULTS = {"int": 0, "float": 0.0, "str": "", "bool": False, "bytes": b""}
_DTYPES = {"int": np.int64, "float": np.float64, "str": "U", "bool": bool, "bytes": "S"}


@dataclass(frozen=True)
class Result:
    """One result: a ref per stream (join order), T, when it was produced, and the fields
    it carries per stream (missing ones: zero values)."""

    refs: tuple[TupleRef, ...]
    event_time: int
    produced_ms: int
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)


def result_id(job: JobSettings, r: Result) -> str:
    """The 32-hex id of `r`."""
    hi, lo = result_ids(job.input_topics, [np.array([p]) for _, p, _ in r.refs], [np.array([o]) for *_, o in r.refs])
    return result_id_hex(hi, lo)[0].decode()


def result_block(job: JobSettings, results: list[Result]) -> Block:
    """`results` as the engine's result block (each stream's ts: the result's event time)."""
    parts = [np.array([r.refs[i][1] for r in results], np.int32) for i in range(len(job.streams))]
    offs = [np.array([r.refs[i][2] for r in results], np.int64) for i in range(len(job.streams))]
    columns = result_head(job.input_topics, parts, offs, np.array([r.event_time for r in results], np.int64), 0)
    columns["produced_ms"] = np.array([r.produced_ms for r in results], np.int64)
    for s, part, off in zip(job.streams, parts, offs):
        p, o, ts = ref_columns(s.name)
        columns |= {p: part, o: off, ts: columns["event_time"]}
        for name, ftype in job.result_fields(s).items():
            values = [r.fields.get(s.name, {}).get(name, _DEFAULTS[ftype]) for r in results]
            columns[f"{s.name}.{name}"] = np.array(values, _DTYPES[ftype]) if values else np.empty(0, _DTYPES[ftype])
    return Block(columns)


def encode(job: JobSettings, results: list[Result]) -> list[bytes]:
    """The result records of `results` in the job's output.format, as a worker writes them."""
    block = result_block(job, results)
    if job.output.format == "blocks":
        return result_encode.encode_blocks(block)
    layout = result_format.result_layout(job)
    return (result_encode.encode_json if job.output.format == "json" else result_encode.encode_avro)(layout, block)


def batch_commit(group: int, watermark: int, seq: int = 0) -> bytes:
    """A hash-mode batch commit record's value."""
    commit = BatchCommit(group=group, seq=seq, end={}, watermark=watermark, results=0, worker="test")
    return commit.model_dump_json().encode()


def round_release(watermark: int, round_: int = 0) -> bytes:
    """A ring-mode round release record's value."""
    return RoundRelease(node="head", round=round_, watermark=watermark).model_dump_json().encode()
