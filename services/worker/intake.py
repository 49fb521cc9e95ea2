"""From polled Kafka records to per-group, per-stream blocks.

Records are collected per (group, stream) as the consumer hands them over,
then decoded a whole batch at a time. Anything that cannot become a tuple
(oversize, wrong stream, malformed) becomes a `Reject` bound for the
dead-letter topic, with the record it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import Message

from engine.block import Block
from schemas.codecs import DECODERS, Reject
from streamjoin.settings import JobSettings, StreamSpec

STREAM_HEADER = "stream"  # optional: producers sharing a topic name the stream a record is for


@dataclass
class RecordBuffer:
    """Raw records of one stream's partition waiting for the next batch."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list | None] = field(default_factory=list)

    def add(self, m: Message) -> None:
        self.values.append(m.value())
        self.keys.append(m.key())
        self.offsets.append(m.offset())
        self.timestamps.append(m.timestamp()[1])
        self.headers.append(m.headers())

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class DeadRecord:
    stream: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str


@dataclass(frozen=True)
class StreamBatch:
    block: Block
    dead: list[DeadRecord]
    end: int  # next offset after the last record taken


def decode(job: JobSettings, stream_index: int, group: int, buf: RecordBuffer) -> StreamBatch:
    spec = job.streams[stream_index]
    screened = _screen(job, spec, buf)
    keep = np.flatnonzero([r is None for r in screened])
    values = [buf.values[i] for i in keep]
    offsets = np.asarray(buf.offsets, dtype=np.int64)
    decoded = DECODERS[spec.format](
        spec, values, np.full(len(keep), group, np.int32), offsets[keep],
        np.asarray(buf.timestamps, dtype=np.int64)[keep],
    )
    dead = [_dead(stream_index, buf, i, r) for i, r in enumerate(screened) if r is not None]
    dead += [_dead(stream_index, buf, int(keep[r.index]), r) for r in decoded.rejects]
    return StreamBatch(decoded.block, dead, int(offsets[-1]) + 1)


def _screen(job: JobSettings, spec: StreamSpec, buf: RecordBuffer) -> list[Reject | None]:
    """Cheap per-record checks before decoding: size and declared stream."""
    out: list[Reject | None] = []
    limit = job.worker.max_record_bytes
    for i, (v, h) in enumerate(zip(buf.values, buf.headers)):
        if v is not None and len(v) > limit:
            out.append(Reject(i, "oversize", f"{len(v)} bytes > worker.max_record_bytes={limit}"))
            continue
        named = _stream_header(h)
        if named is not None and named != spec.name:
            out.append(Reject(i, "unknown-stream", f"record names stream {named!r}, topic carries {spec.name!r}"))
            continue
        out.append(None)
    return out


def _stream_header(headers: list | None) -> str | None:
    for k, v in headers or []:
        if k == STREAM_HEADER:
            return v.decode(errors="replace") if v is not None else ""
    return None


def _dead(stream: int, buf: RecordBuffer, i: int, r: Reject) -> DeadRecord:
    return DeadRecord(stream, buf.offsets[i], buf.keys[i], buf.values[i], r.reason, r.detail)
