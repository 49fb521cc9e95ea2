"""From polled Kafka records to per-group, per-stream blocks.

Records are collected per stream as the consumer hands them over; at the end
of a distribution epoch each stream's records of every group are decoded in
one call (Arrow's JSON reader has a fixed cost per call, so one call per
stream and cycle, not per group), then split into the groups' slices.
Anything that cannot become a tuple (oversize, wrong stream, malformed) is a
`DeadRecord` bound for the dead-letter topic, with the record it came from.

Co-partitioning (hash mode). A tuple belongs to group
(murmur2(join-key text) & 0x7fffffff) % partitions, the partition Kafka's
default partitioner gives its key (topology/partitioner.py). The records of a
group's source partitions are checked as a block; a tuple that sits in
another partition (a producer keyed by something else, or by nothing, or
with librdkafka's CRC32 partitioner, or a source topic with another
partition count) is `misrouted`: with `join.repartition: auto` it is
forwarded to its group through `<job>.<stream>.by-key` (a `Forward`, written
in the cycle's transaction), with `never` it is dead-lettered. A tuple keeps
its source identity (topic, partition, offset) on the way, so result ids do
not depend on the route.

Hostile input. No record stops a worker: whatever a record's bytes or headers,
it becomes tuples or dead letters (reasons: malformed, oversize,
unknown-stream, misrouted, and `future` for event times more than
join.max_future_ms ahead of the worker's clock, which would otherwise carry a
group's watermark past every later record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
from confluent_kafka import Message

from streamjoin.engine.block import OFF, TS, Block
from streamjoin.schemas.codecs import BLOCK_INDEX, BLOCK_SHIFT, DECODERS, Reject, encode_block
from streamjoin.services import metrics
from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.topology.partitioner import key_text, partitions_for_keys

STREAM_HEADER = "stream"  # optional: producers sharing a topic name the stream a record is for
# Headers of a forwarded record: where it was read, so the tuple keeps its identity.
H_ORIGIN_PARTITION, H_ORIGIN_OFFSET = "sj-origin-partition", "sj-origin-offset"
MISROUTED = "misrouted"
FUTURE = "future"
# Origin coordinates a forwarded record may name: a partition fits the buffer's packing
# (record_index), an offset leaves BLOCK_SHIFT bits for a block's tuple index.
_MAX_ORIGIN_PARTITION, _MAX_ORIGIN_OFFSET = 1 << 19, 1 << (63 - BLOCK_SHIFT)
Positions = dict[str, dict[int, int]]  # topic -> partition -> next offset


@dataclass
class RecordBuffer:
    """Raw records of one stream waiting for the next batch, from any of its input
    partitions: the stream's source topic and (hash mode) its by-key topic.

    `partitions`/`offsets` are each record's identity in the source topic (for a
    forwarded record, where it was first written), `groups` the partition group it
    was read for, `rerouted` whether it came through the by-key topic, and
    `positions` the next offset of every input partition read."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list | None] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    rerouted: list[bool] = field(default_factory=list)
    positions: dict[int, Positions] = field(default_factory=dict)  # group -> its input positions
    foreign: dict[int, str] = field(default_factory=dict)  # record -> the by-key topic it sits in, unforwarded

    def add(self, m: Message, group: int) -> None:
        """A record read from the stream's source topic for `group`."""
        self._append(m, group, m.partition(), m.offset(), False)

    def add_forwarded(self, m: Message, origin: tuple[int, int] | None) -> None:
        """A record read from the by-key topic: its group is its partition there, its
        identity `origin` = (partition, offset) in the source topic. Without an origin
        someone else wrote it there: it is kept with its own coordinates, to be dead-lettered."""
        if origin is None:
            self.foreign[len(self)] = m.topic()
            self._append(m, m.partition(), m.partition(), m.offset(), False)
        else:
            self._append(m, m.partition(), origin[0], origin[1], True)

    def _append(self, m: Message, group: int, partition: int, offset: int, rerouted: bool) -> None:
        self.values.append(m.value())
        self.keys.append(m.key())
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.timestamps.append(m.timestamp()[1])
        self.headers.append(m.headers())
        self.groups.append(group)
        self.rerouted.append(rerouted)
        self.positions.setdefault(group, {}).setdefault(m.topic(), {})[m.partition()] = m.offset() + 1

    def __len__(self) -> int:
        return len(self.offsets)

    def value_bytes(self) -> int:
        """Bytes of the records' values (tombstones count 0), summed in C: no Python per record."""
        return sum(map(len, filter(None, self.values)))

    def read_partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) a record of this buffer was read from."""
        return [(topic, p) for by_topic in self.positions.values() for topic, parts in by_topic.items() for p in parts]

    def advance(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Take the consumer's positions where they are further: past a transaction's commit
        marker, which occupies an offset no record has (the by-key topics are written in
        transactions), so that a committed position reaches the partition's end."""
        for by_topic in self.positions.values():
            for topic, parts in by_topic.items():
                for p, next_offset in parts.items():
                    parts[p] = max(next_offset, positions.get((topic, p), next_offset))

    def record_index(self, partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Positions of the given (partition, offset) records in this buffer."""
        packed = (np.asarray(self.partitions, np.int64) << 44) | np.asarray(self.offsets, np.int64)
        order = np.argsort(packed, kind="stable")
        wanted = (np.asarray(partitions, np.int64) << 44) | np.asarray(offsets, np.int64)
        return order[np.searchsorted(packed[order], wanted)]


@dataclass(frozen=True)
class DeadRecord:
    """A record for the dead-letter topic: its identity in the source topic, the group
    it was read for, and why."""

    stream: int
    group: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str
    topic: str | None = None  # where it sits, when not in the stream's source topic


@dataclass(frozen=True)
class Forward:
    """A misrouted record (or, for a block record, its tuples of one target group) on
    its way to `partition` of the stream's by-key topic."""

    stream: int
    group: int  # the group whose source partition it was read from (its batch writes it)
    partition: int
    key: bytes
    value: bytes | None
    timestamp: int
    origin_partition: int
    origin_offset: int

    def headers(self) -> list[tuple[str, bytes]]:
        return [(H_ORIGIN_PARTITION, str(self.origin_partition).encode()),
                (H_ORIGIN_OFFSET, str(self.origin_offset).encode())]


def origin_of(m: Message) -> tuple[int, int] | None:
    """(partition, offset) a forwarded record names, or None if its headers do not."""
    found = {k: v for k, v in m.headers() or [] if k in (H_ORIGIN_PARTITION, H_ORIGIN_OFFSET)}
    try:
        partition, offset = int(found[H_ORIGIN_PARTITION]), int(found[H_ORIGIN_OFFSET])
    except (KeyError, TypeError, ValueError):
        return None
    if not (0 <= partition < _MAX_ORIGIN_PARTITION and 0 <= offset < _MAX_ORIGIN_OFFSET):
        return None  # not one streamjoin wrote: dead-lettered as foreign
    return partition, offset


@dataclass(frozen=True)
class GroupSlice:
    """One stream's part of one group's batch: tuples to join, records to dead-letter,
    records to forward, the next offset of every input partition read, and `routed`,
    the newest source offset taken per source partition through the by-key topic."""

    block: Block
    dead: list[DeadRecord]
    forwards: list[Forward]
    end: Positions
    routed: dict[int, int]
    duplicates: int  # forwarded records seen again (a retried forward) and skipped


@dataclass(frozen=True)
class Routing:
    """How a stream's tuples reach their groups: `partitions` groups; the source topic has
    `source_partitions`; `repartition` auto forwards misrouted tuples, never dead-letters them."""

    partitions: int
    source_partitions: int
    repartition: str
    check: bool  # hash mode checks co-partitioning; ring mode reads every partition anyway


def routing_for(job: JobSettings, source_partitions: int) -> Routing:
    return Routing(job.partitions, source_partitions, job.join.repartition, job.join.mode == "hash")


def decode_by_group(job: JobSettings, stream_index: int, buf: RecordBuffer, routing: Routing,
                    routed: Mapping[int, Mapping[int, int]], now_ms: int | None = None) -> dict[int, GroupSlice]:
    """Decode a stream's buffered records and split them by group.

    `routing` says how tuples reach their groups; `routed[g]` holds group g's newest source
    offset per source partition taken through the by-key topic so far (its checkpoint), so
    that a forwarded record seen again is taken once. `now_ms` is the wall clock that
    join.max_future_ms is measured from (None: no future check)."""
    spec = job.streams[stream_index]
    fresh, marks = _first_copies(buf, routed)
    screened = _screen(job, spec, buf)
    keep = np.flatnonzero(np.array([r is None for r in screened], dtype=bool) & fresh)
    parts = np.asarray(buf.partitions, dtype=np.int32)
    offsets = np.asarray(buf.offsets, dtype=np.int64)
    decoded = DECODERS[spec.format](
        spec, [buf.values[i] for i in keep], parts[keep], offsets[keep],
        np.asarray(buf.timestamps, dtype=np.int64)[keep],
    )
    dead = [_dead(stream_index, buf, i, r) for i, r in enumerate(screened) if r is not None and fresh[i]]
    dead += [_dead(stream_index, buf, int(keep[r.index]), r) for r in decoded.rejects]
    block, record = decoded.block, keep[decoded.records]
    if now_ms is not None and job.join.max_future_ms:
        ahead = block[TS] > now_ms + job.join.max_future_ms
        if ahead.any():
            detail = f"event time more than join.max_future_ms={job.join.max_future_ms} ahead of the clock {now_ms}"
            dead += _tuples_dead(spec, stream_index, buf, block.filter(ahead), record[ahead], FUTURE, detail)
            block, record = block.filter(~ahead), record[~ahead]
    if spec.where and len(block):
        outside = ~source_filter(spec, block)
        metrics.FILTERED.labels(spec.name, "where").inc(int(outside.sum()))
        block, record = block.filter(~outside), record[~outside]
    if job.join.start_event_ms is not None and len(block):
        before = block[TS] < job.join.start_event_ms
        metrics.FILTERED.labels(spec.name, "before_start").inc(int(before.sum()))
        block, record = block.filter(~before), record[~before]
    groups = np.asarray(buf.groups, np.int64)[record]
    rerouted = np.asarray(buf.rerouted, bool)[record]
    forwards: list[Forward] = []
    if routing.check and len(block):
        wrong = _misrouted(spec, block, groups, rerouted, routing)
        if wrong.any():
            if routing.repartition == "auto":
                forwards = _forwards(spec, stream_index, buf, block.filter(wrong), record[wrong], routing)
            else:
                dead += _misrouted_dead(spec, stream_index, buf, block.filter(wrong), record[wrong], routing)
            block, groups, rerouted = block.filter(~wrong), groups[~wrong], rerouted[~wrong]
    return _split(buf, block, groups, dead, forwards, marks, ~fresh)


def source_filter(spec: StreamSpec, block: Block) -> np.ndarray:
    """Which tuples of `block` pass the stream's `where` (every listed field holds one of its
    values). Run before routing, so a filtered tuple is never forwarded, joined or stored; a
    replay filters the same records the same way."""
    keep = np.ones(len(block), dtype=bool)
    for name, allowed in spec.where.items():
        keep &= np.isin(block[name], np.asarray(allowed))  # settings checked the values' types against the field's
    return keep


def _first_copies(buf: RecordBuffer, routed: Mapping[int, Mapping[int, int]]) -> tuple[np.ndarray, dict[int, dict[int, int]]]:
    """Which records to take, and each group's routed marks after them.

    A router writes a source partition's misrouted records to a group in source-offset
    order, and after a failed cycle it forwards the same records again; so per (group,
    source partition), a forwarded record is new exactly when its source offset is above
    every one taken before (the checkpoint's mark, then the records before it)."""
    fresh = np.ones(len(buf), dtype=bool)
    marks = {g: dict(m) for g, m in routed.items()}
    via = np.flatnonzero(buf.rerouted)
    if not len(via):
        return fresh, marks
    groups = np.asarray(buf.groups, np.int64)[via]
    parts = np.asarray(buf.partitions, np.int64)[via]
    offsets = np.asarray(buf.offsets, np.int64)[via]
    order = np.lexsort((np.arange(len(via)), parts, groups))  # per (group, partition), in arrival order
    g, p, o = groups[order], parts[order], offsets[order]
    first = np.r_[True, (g[1:] != g[:-1]) | (p[1:] != p[:-1])]
    segment = np.cumsum(first) - 1
    mark = np.array([routed.get(int(a), {}).get(int(b), -1) for a, b in zip(g[first], p[first])], np.int64)
    # Running maximum within each segment: shift segments apart so one never sees another's offsets.
    span = int(max(o.max(), mark.max()) + 2)
    lifted = np.maximum(o, mark[segment]) + segment * span
    before = np.r_[np.int64(-1), np.maximum.accumulate(lifted)[:-1]]
    before = np.where(first, mark[segment] + segment * span, before) - segment * span
    fresh[via[order]] = o > before
    ends = np.r_[np.flatnonzero(first)[1:], len(o)] - 1
    for a, b, top in zip(g[first].tolist(), p[first].tolist(), np.maximum(o, before)[ends].tolist()):
        marks.setdefault(a, {})[b] = top
    return fresh, marks


def target_groups(spec: StreamSpec, block: Block, partitions: int) -> np.ndarray:
    """The partition group of each tuple: Kafka's default partitioner of its join-key text."""
    return partitions_for_keys(key_text([(block[k], spec.fields[k]) for k in spec.key_fields]), partitions)


def _misrouted(spec: StreamSpec, block: Block, groups: np.ndarray, rerouted: np.ndarray, routing: Routing) -> np.ndarray:
    """Tuples read from a source partition that is not their group's. (Forwarded tuples were
    routed by their key already; a source topic with another partition count routes nothing.)"""
    if routing.source_partitions != routing.partitions:
        return ~rerouted
    return ~rerouted & (target_groups(spec, block, routing.partitions) != groups)


def _forwards(spec: StreamSpec, stream: int, buf: RecordBuffer, wrong: Block, records: np.ndarray,
              routing: Routing) -> list[Forward]:
    """Misrouted tuples on their way to their groups' by-key partitions: a JSON/Avro record
    as its own bytes; a block record's tuples as one block per target group, carrying each
    tuple's index in the record so that its identity survives the trip."""
    targets = target_groups(spec, wrong, routing.partitions)
    keys = key_text([(wrong[k], spec.fields[k]) for k in spec.key_fields]).to_pylist()
    if spec.format != "blocks":
        return [Forward(stream, buf.groups[i], target, keys[row], buf.values[i], buf.timestamps[i],
                        buf.partitions[i], buf.offsets[i])
                for row, (i, target) in enumerate(zip(records.tolist(), targets.tolist()))]
    out = []
    for i, target, rows in _per_record_and_target(records, targets):
        value = _block_of(spec, wrong, rows)
        out.append(Forward(stream, buf.groups[i], target, keys[rows[0]], value, buf.timestamps[i], buf.partitions[i],
                           buf.offsets[i]))
    return out


def _misrouted_dead(spec: StreamSpec, stream: int, buf: RecordBuffer, wrong: Block, records: np.ndarray,
                    routing: Routing) -> list[DeadRecord]:
    """Misrouted tuples as dead letters (`join.repartition: never`): a JSON/Avro record whole,
    a block record's misrouted tuples as a block of just those (as late tuples are)."""
    targets = target_groups(spec, wrong, routing.partitions)
    if spec.format != "blocks":
        return [_dead_misrouted(stream, buf, i, buf.values[i], target, routing)
                for i, target in zip(records.tolist(), targets.tolist())]
    return [_dead_misrouted(stream, buf, i, _block_of(spec, wrong, rows), target, routing)
            for i, target, rows in _per_record_and_target(records, targets)]


def _per_record_and_target(records: np.ndarray, targets: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(record, target group, rows) for each record and target group its tuples go to."""
    order = np.lexsort((targets, records))
    pairs = np.stack([records[order], targets[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, (pairs[1:] != pairs[:-1]).any(axis=1)])
    bounds = np.r_[starts, len(order)]
    return [(int(pairs[a, 0]), int(pairs[a, 1]), order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _block_of(spec: StreamSpec, tuples: Block, rows: np.ndarray) -> bytes:
    """Some of a block record's tuples as a block record of their own, with their indexes."""
    index = (tuples[OFF][rows] & ((1 << BLOCK_SHIFT) - 1)).astype(np.int32)
    return encode_block(Block({f: tuples[f][rows] for f in spec.fields} | {BLOCK_INDEX: index}))


def _tuples_dead(spec: StreamSpec, stream: int, buf: RecordBuffer, tuples: Block, records: np.ndarray, reason: str,
                 detail: str) -> list[DeadRecord]:
    """Tuples as dead letters: a JSON/Avro record whole, a block record's `tuples` as a block of
    just those. `records[r]` is tuple r's record in `buf`."""
    if spec.format != "blocks":
        return [DeadRecord(stream, buf.groups[i], buf.partitions[i], buf.offsets[i], buf.keys[i], buf.values[i], reason,
                           detail) for i in records.tolist()]
    return [DeadRecord(stream, buf.groups[i], buf.partitions[i], buf.offsets[i], buf.keys[i],
                       _block_of(spec, tuples, rows), reason, detail)
            for i, _, rows in _per_record_and_target(records, np.zeros(len(records), np.int64))]


def _dead_misrouted(stream: int, buf: RecordBuffer, i: int, value: bytes | None, target: int,
                    routing: Routing) -> DeadRecord:
    if routing.source_partitions != routing.partitions:
        detail = (f"the source topic has {routing.source_partitions} partitions, the job {routing.partitions}; "
                  f"the join key belongs to group {target} (join.repartition: never)")
    else:
        detail = (f"in partition {buf.partitions[i]}, but Kafka's murmur2 partitioner puts its join key in "
                  f"partition {target} (join.repartition: never)")
    return DeadRecord(stream, buf.groups[i], buf.partitions[i], buf.offsets[i], buf.keys[i], value, MISROUTED, detail)


def _split(buf: RecordBuffer, block: Block, groups: np.ndarray, dead: list[DeadRecord], forwards: list[Forward],
           marks: dict[int, dict[int, int]], copies: np.ndarray) -> dict[int, GroupSlice]:
    """Per group read in this buffer: its tuples, dead letters, forwards and input positions.
    A group's positions cover every record read for it, whether or not it became a tuple."""
    dead_of: dict[int, list[DeadRecord]] = {}
    for d in dead:
        dead_of.setdefault(d.group, []).append(d)
    forwards_of: dict[int, list[Forward]] = {}
    for f in forwards:
        forwards_of.setdefault(f.group, []).append(f)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    out = {}
    for g, end in buf.positions.items():
        lo, hi = np.searchsorted(sorted_groups, [g, g + 1])
        mine = order[lo:hi]
        duplicates = int(np.count_nonzero(copies & (np.asarray(buf.groups) == g)))
        out[g] = GroupSlice(block.take(mine), dead_of.get(g, []), forwards_of.get(g, []), end, marks.get(g, {}),
                            duplicates)
    return out


def _screen(job: JobSettings, spec: StreamSpec, buf: RecordBuffer) -> list[Reject | None]:
    """Cheap per-record checks before decoding: size and declared stream."""
    out: list[Reject | None] = []
    limit = job.worker.max_record_bytes
    for i, (v, h) in enumerate(zip(buf.values, buf.headers)):
        if i in buf.foreign:
            out.append(Reject(i, "malformed", f"a record in {buf.foreign[i]} without the origin headers "
                                              f"{H_ORIGIN_PARTITION}/{H_ORIGIN_OFFSET}: not forwarded by streamjoin"))
            continue
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
    """The stream a record's headers name, if any; a value that is not UTF-8 (or not bytes, or
    None) names no stream of the job, so the record is dead-lettered as unknown-stream."""
    for k, v in headers or []:
        if k == STREAM_HEADER:
            return v.decode(errors="replace") if isinstance(v, bytes) else repr(v)
    return None


def _dead(stream: int, buf: RecordBuffer, i: int, r: Reject) -> DeadRecord:
    return DeadRecord(stream, buf.groups[i], buf.partitions[i], buf.offsets[i], buf.keys[i], buf.values[i], r.reason,
                      r.detail, buf.foreign.get(i))
