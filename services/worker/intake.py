"""From polled Kafka records to per-group, per-stream blocks.

Records are collected per stream as the consumer hands them over; at the end
of a distribution epoch each stream's records of every group are decoded in
one call (Arrow's JSON reader has a fixed cost per call, so one call per
stream and cycle, not per group), then split into the groups' slices.
Anything that cannot become a tuple (oversize, wrong stream, malformed) is a
`DeadRecord` bound for the dead-letter topic, with the record it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import Message

from streamjoin.engine.block import PART, Block
from streamjoin.schemas.codecs import DECODERS, Reject
from streamjoin.settings import JobSettings, StreamSpec

STREAM_HEADER = "stream"  # optional: producers sharing a topic name the stream a record is for


@dataclass
class RecordBuffer:
    """Raw records of one stream (any partitions) waiting for the next batch."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list | None] = field(default_factory=list)

    def add(self, m: Message) -> None:
        self.values.append(m.value())
        self.keys.append(m.key())
        self.partitions.append(m.partition())
        self.offsets.append(m.offset())
        self.timestamps.append(m.timestamp()[1])
        self.headers.append(m.headers())

    def __len__(self) -> int:
        return len(self.offsets)

    def record_index(self, partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Positions of the given (partition, offset) records in this buffer."""
        packed = (np.asarray(self.partitions, np.int64) << 44) | np.asarray(self.offsets, np.int64)
        order = np.argsort(packed, kind="stable")
        wanted = (np.asarray(partitions, np.int64) << 44) | np.asarray(offsets, np.int64)
        return order[np.searchsorted(packed[order], wanted)]


@dataclass(frozen=True)
class DeadRecord:
    stream: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str


@dataclass(frozen=True)
class GroupSlice:
    """One stream's part of one group's batch."""

    block: Block
    dead: list[DeadRecord]
    end: int  # next offset after the last record taken from this partition


def decode_by_group(job: JobSettings, stream_index: int, buf: RecordBuffer) -> dict[int, GroupSlice]:
    spec = job.streams[stream_index]
    screened = _screen(job, spec, buf)
    keep = np.flatnonzero([r is None for r in screened])
    parts = np.asarray(buf.partitions, dtype=np.int32)
    offsets = np.asarray(buf.offsets, dtype=np.int64)
    decoded = DECODERS[spec.format](
        spec, [buf.values[i] for i in keep], parts[keep], offsets[keep],
        np.asarray(buf.timestamps, dtype=np.int64)[keep],
    )
    dead = [_dead(stream_index, buf, i, r) for i, r in enumerate(screened) if r is not None]
    dead += [_dead(stream_index, buf, int(keep[r.index]), r) for r in decoded.rejects]
    return _split(decoded.block, dead, parts, offsets)


def _split(block: Block, dead: list[DeadRecord], parts: np.ndarray, offsets: np.ndarray) -> dict[int, GroupSlice]:
    groups = np.unique(parts)
    # Batch boundary per group: the last offset polled, whether or not it became a tuple.
    ends = {int(g): int(offsets[parts == g].max()) + 1 for g in groups}
    order = np.argsort(block[PART], kind="stable") if len(block) else np.empty(0, np.int64)
    sorted_parts = block[PART][order] if len(block) else np.empty(0, np.int32)
    out = {}
    for g in groups:
        lo, hi = np.searchsorted(sorted_parts, [g, g + 1])
        out[int(g)] = GroupSlice(block.take(order[lo:hi]), [d for d in dead if d.partition == g], ends[int(g)])
    return out


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
    return DeadRecord(stream, buf.partitions[i], buf.offsets[i], buf.keys[i], buf.values[i], r.reason, r.detail)
