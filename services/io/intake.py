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
from operator import itemgetter
from typing import Mapping, Sequence

import numpy as np
from confluent_kafka import Message

from streamjoin.engine.asof import DELETED
from streamjoin.engine.block import OFF, TS, Block
from streamjoin.schemas.codecs import BLOCK_INDEX, BLOCK_SHIFT, DECODERS, Reject, encode_block
from streamjoin.schemas.join_keys import key_text
from streamjoin.services import metrics
from streamjoin.services.io import tombstones
from streamjoin.services.io.dead_letters import DeadRecord
from streamjoin.services.io.progress_notes import Newest, Told, newest_read, take_notes
from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.topology.partitioner import partitions_for_keys

STREAM_HEADER = "stream"  # optional: producers sharing a topic name the stream a record is for
# Headers of a forwarded record: where it was read, so the tuple keeps its identity.
H_ORIGIN_PARTITION, H_ORIGIN_OFFSET = "sj-origin-partition", "sj-origin-offset"
MISROUTED = "misrouted"
FUTURE = "future"
# Origin coordinates a forwarded record may name: a partition fits the buffer's packing
# (record_index), an offset leaves BLOCK_SHIFT bits for a block's tuple index.
_MAX_ORIGIN_PARTITION, _MAX_ORIGIN_OFFSET = 1 << 19, 1 << (63 - BLOCK_SHIFT)
Positions = dict[str, dict[int, int]]  # topic -> partition -> next offset


_NUMBER_COLUMNS = ("partitions", "offsets", "timestamps", "groups", "rerouted")


def _number_column(name: str) -> property:
    """A RecordBuffer number column, its chunks read as one array (RecordBuffer._column)."""
    return property(lambda buffer: buffer._column(name), doc=f"each record's {name}, one array")


class RecordBuffer:
    """Raw records of one stream waiting for the next batch, from any of its input
    partitions: the stream's source topic and (hash mode) its by-key topic.

    `partitions`/`offsets` are each record's identity in the source topic (for a
    forwarded record, where it was first written), `groups` the partition group it
    was read for, `rerouted` whether it came through the by-key topic, and
    `positions` the next offset of every input partition read.

    Records arrive in bulk (`extend`: one consume() call's records of a topic) and are
    taken apart a column at a time, each column in one pass in C (map over the message
    class's own accessor), not record by record in Python: between consume() and the
    decoder this is most of a tuple's intake cost."""

    partitions = _number_column("partitions")
    offsets = _number_column("offsets")
    timestamps = _number_column("timestamps")
    groups = _number_column("groups")
    rerouted = _number_column("rerouted")

    def __init__(self) -> None:
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.headers: list[list | None] = []
        self.positions: dict[int, Positions] = {}  # group -> its input positions
        self.foreign: dict[int, str] = {}  # record -> the by-key topic it sits in, unforwarded
        self.notes: list[tuple[int, Told]] = []  # (group, note) read on the by-key topic (progress_notes.py), in order
        self._numbers: dict[str, list[np.ndarray]] = {name: [] for name in _NUMBER_COLUMNS}

    def extend(self, msgs: Sequence[Message], topic: str, groups: np.ndarray, partitions: np.ndarray) -> None:
        """Records read from the stream's source topic `topic`, `msgs[i]` from its partition
        `partitions[i]` for group `groups[i]` (the caller has read the partitions already)."""
        if not msgs:
            return
        offsets = self._take_columns(msgs)
        self._push(partitions, offsets, groups, np.zeros(len(msgs), bool))
        self._read_up_to(topic, groups, partitions, offsets)

    def extend_forwarded(self, msgs: Sequence[Message], topic: str, partitions: np.ndarray) -> None:
        """Records read from the by-key topic `topic`, `msgs[i]` from its partition `partitions[i]`:
        a record's group is its partition there, its identity the (partition, offset) in the
        source topic its headers name. A progress note (progress_notes.py) is read, not a tuple. Any
        other record without an origin: kept with its own coordinates, to be dead-lettered."""
        if not msgs:
            return
        self._read_up_to(topic, partitions, partitions, np.fromiter(map(type(msgs[0]).offset, msgs), np.int64))
        origins = [origin_of(m) for m in msgs]  # headers, parsed per record: forwards are the misrouted few
        msgs, origins, partitions = take_notes(msgs, origins, partitions, self.notes)
        if msgs:
            first = len(self)
            offsets = self._take_columns(msgs)
            known = np.array([o is not None for o in origins], bool)
            source = np.array([o if o is not None else (-1, -1) for o in origins], np.int64).reshape(-1, 2)
            self.foreign.update({first + int(i): topic for i in np.flatnonzero(~known)})
            self._push(np.where(known, source[:, 0], partitions), np.where(known, source[:, 1], offsets), partitions,
                       known)

    def add(self, m: Message, group: int) -> None:
        """One record read from the stream's source topic for `group`."""
        self.extend([m], m.topic(), np.array([group], np.int64), np.array([m.partition()], np.int64))

    def add_forwarded(self, m: Message) -> None:
        """One record read from the stream's by-key topic (see `extend_forwarded`)."""
        self.extend_forwarded([m], m.topic(), np.array([m.partition()], np.int64))

    def _take_columns(self, msgs: Sequence[Message]) -> np.ndarray:
        """Append the messages' values, keys, headers and timestamps; return their offsets.
        The accessors are the messages' class's own (confluent-kafka's
        C methods; a test's stand-in works the same way)."""
        kind, count = type(msgs[0]), len(msgs)
        self.values += map(kind.value, msgs)
        self.keys += map(kind.key, msgs)
        self.headers += map(kind.headers, msgs)
        self._numbers["timestamps"].append(
            np.fromiter(map(itemgetter(1), map(kind.timestamp, msgs)), np.int64, count))
        return np.fromiter(map(kind.offset, msgs), np.int64, count)

    def _push(self, partitions: np.ndarray, offsets: np.ndarray, groups: np.ndarray, rerouted: np.ndarray) -> None:
        for name, column in (("partitions", partitions), ("offsets", offsets),
                             ("groups", np.asarray(groups, np.int64)), ("rerouted", rerouted)):
            self._numbers[name].append(column)

    def _read_up_to(self, topic: str, groups: np.ndarray, partitions: np.ndarray, offsets: np.ndarray) -> None:
        """Each partition read in `topic` is positioned after its last record here."""
        last = len(partitions) - 1 - np.unique(partitions[::-1], return_index=True)[1]
        for g, p, o in zip(np.asarray(groups)[last].tolist(), partitions[last].tolist(), offsets[last].tolist()):
            self.positions.setdefault(g, {}).setdefault(topic, {})[p] = o + 1

    def _column(self, name: str) -> np.ndarray:
        """A number column, its chunks joined once (and kept joined)."""
        chunks = self._numbers[name]
        if len(chunks) != 1:
            chunks[:] = [np.concatenate(chunks) if chunks else np.empty(0, bool if name == "rerouted" else np.int64)]
        return chunks[0]

    def __len__(self) -> int:
        return len(self.values)

    def identity(self, i: int) -> tuple[int, int, int]:
        """Record i's group, and its partition and offset in the source topic."""
        return int(self.groups[i]), int(self.partitions[i]), int(self.offsets[i])

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
        packed = (self.partitions << 44) | self.offsets
        order = np.argsort(packed, kind="stable")
        wanted = (np.asarray(partitions, np.int64) << 44) | np.asarray(offsets, np.int64)
        return order[np.searchsorted(packed[order], wanted)]


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
    read: dict[int, int] = field(default_factory=dict)  # repartition_watermarks: source partition -> newest read
    notes: list[Told] = field(default_factory=list)  # progress notes read, in order
    # A record was read in the group's own input (with join.repartition_watermarks, not one
    # re-routed to it): the stream is not silent for the group (join.idle_timeout_ms).
    heard: bool = False


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
    refused = _screen(job, spec, buf)
    passed = fresh.copy()
    passed[list(refused)] = False
    keep = np.flatnonzero(passed)
    values = buf.values if len(keep) == len(buf) else list(map(buf.values.__getitem__, keep.tolist()))
    deleted = None
    if spec.name == job.join.table and spec.format == "json":  # an as-of join's table: tombstones delete
        values, deleted = tombstones.as_rows(spec, values, [buf.keys[i] for i in keep.tolist()], buf.timestamps[keep])
    decoded = DECODERS[spec.format](spec, values, buf.partitions[keep].astype(np.int32), buf.offsets[keep],
                                    buf.timestamps[keep])
    dead = [_dead(stream_index, buf, i, r) for i, r in sorted(refused.items()) if fresh[i]]
    dead += [_dead(stream_index, buf, int(keep[r.index]), r) for r in decoded.rejects]
    block, record = decoded.block, keep[decoded.records]
    if deleted is not None:
        block = Block(dict(block.columns) | {DELETED: deleted[decoded.records]})
    if now_ms is not None and job.join.max_future_ms:
        ahead = block[TS] > now_ms + job.join.max_future_ms
        if ahead.any():
            detail = f"event time more than join.max_future_ms={job.join.max_future_ms} ahead of the clock {now_ms}"
            dead += _tuples_dead(spec, stream_index, buf, block.filter(ahead), record[ahead], FUTURE, detail)
            block, record = block.filter(~ahead), record[~ahead]
    read = newest_read(block, buf.groups[record], buf.rerouted[record]) if job.join.repartition_watermarks else {}
    if spec.where and len(block):
        outside = ~source_filter(spec, block)
        metrics.FILTERED.labels(spec.name, "where").inc(int(outside.sum()))
        block, record = block.filter(~outside), record[~outside]
    if job.join.start_event_ms is not None and len(block):
        before = block[TS] < job.join.start_event_ms
        metrics.FILTERED.labels(spec.name, "before_start").inc(int(before.sum()))
        block, record = block.filter(~before), record[~before]
    groups, rerouted = buf.groups[record], buf.rerouted[record]
    forwards: list[Forward] = []
    if routing.check and len(block):
        wrong = _misrouted(spec, block, groups, rerouted, routing)
        if wrong.any():
            if routing.repartition == "auto":
                forwards = _forwards(spec, stream_index, buf, block.filter(wrong), record[wrong], routing)
            else:
                dead += _misrouted_dead(spec, stream_index, buf, block.filter(wrong), record[wrong], routing)
            block, groups, rerouted = block.filter(~wrong), groups[~wrong], rerouted[~wrong]
    own = buf.groups[~buf.rerouted] if job.join.repartition_watermarks else buf.groups
    return _split(buf, block, groups, dead, forwards, marks, ~fresh, read, set(np.unique(own).tolist()))


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
    groups, parts, offsets = buf.groups[via], buf.partitions[via], buf.offsets[via]
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
        return [_forward(stream, buf, i, target, keys[row], buf.values[i])
                for row, (i, target) in enumerate(zip(records.tolist(), targets.tolist()))]
    return [_forward(stream, buf, i, target, keys[rows[0]], _block_of(spec, wrong, rows))
            for i, target, rows in _per_record_and_target(records, targets)]


def _forward(stream: int, buf: RecordBuffer, i: int, target: int, key: bytes, value: bytes | None) -> Forward:
    """Record i of `buf` (or some of its tuples, as `value`) on its way to group `target`."""
    group, partition, offset = buf.identity(i)
    return Forward(stream, group, target, key, value, int(buf.timestamps[i]), partition, offset)


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
        return [dead_record(stream, buf, i, buf.values[i], reason, detail) for i in records.tolist()]
    return [dead_record(stream, buf, i, _block_of(spec, tuples, rows), reason, detail)
            for i, _, rows in _per_record_and_target(records, np.zeros(len(records), np.int64))]


def _dead_misrouted(stream: int, buf: RecordBuffer, i: int, value: bytes | None, target: int,
                    routing: Routing) -> DeadRecord:
    if routing.source_partitions != routing.partitions:
        detail = (f"the source topic has {routing.source_partitions} partitions, the job {routing.partitions}; "
                  f"the join key belongs to group {target} (join.repartition: never)")
    else:
        detail = (f"in partition {buf.partitions[i]}, but Kafka's murmur2 partitioner puts its join key in "
                  f"partition {target} (join.repartition: never)")
    return dead_record(stream, buf, i, value, MISROUTED, detail)


def _split(buf: RecordBuffer, block: Block, groups: np.ndarray, dead: list[DeadRecord], forwards: list[Forward],
           marks: dict[int, dict[int, int]], copies: np.ndarray, read: Newest,
           heard: set[int]) -> dict[int, GroupSlice]:
    """Per group read in this buffer: its tuples, dead letters, forwards and input positions.
    A group's positions cover every record read for it, whether or not it became a tuple;
    `heard`: the groups with a record read in their own input."""
    dead_of: dict[int, list[DeadRecord]] = {}
    for d in dead:
        dead_of.setdefault(d.group, []).append(d)
    forwards_of: dict[int, list[Forward]] = {}
    for f in forwards:
        forwards_of.setdefault(f.group, []).append(f)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    copied = buf.groups[copies]  # the group of each forwarded record skipped as a copy
    out = {}
    for g, end in buf.positions.items():
        lo, hi = np.searchsorted(sorted_groups, [g, g + 1])
        mine = order[lo:hi]
        duplicates = int(np.count_nonzero(copied == g)) if len(copied) else 0
        out[g] = GroupSlice(block.take(mine), dead_of.get(g, []), forwards_of.get(g, []), end, marks.get(g, {}),
                            duplicates, read.get(g, {}), [n for h, n in buf.notes if h == g], g in heard)
    return out


def _screen(job: JobSettings, spec: StreamSpec, buf: RecordBuffer) -> dict[int, Reject]:
    """Cheap checks before decoding, per refused record its reject: a by-key record not
    forwarded by streamjoin, a value over worker.max_record_bytes, a header naming another
    stream. Sizes are compared as one array; headers are read only when some record has any."""
    refused = {i: Reject(i, "malformed", f"a record in {topic} without the origin headers "
                                         f"{H_ORIGIN_PARTITION}/{H_ORIGIN_OFFSET}: not forwarded by streamjoin")
               for i, topic in buf.foreign.items()}
    limit = job.worker.max_record_bytes
    values = buf.values
    sizes = (np.fromiter(map(len, values), np.int64, len(values)) if None not in values  # tombstones: size 0
             else np.array([len(v or b"") for v in values], np.int64))
    for i in np.flatnonzero(sizes > limit).tolist():
        refused.setdefault(i, Reject(i, "oversize", f"{sizes[i]} bytes > worker.max_record_bytes={limit}"))
    if any(buf.headers):
        for i, headers in enumerate(buf.headers):
            named = _stream_header(headers)
            if named is not None and named != spec.name:
                refused.setdefault(i, Reject(i, "unknown-stream",
                                             f"record names stream {named!r}, topic carries {spec.name!r}"))
    return refused


def _stream_header(headers: list | None) -> str | None:
    """The stream a record's headers name, if any; a value that is not UTF-8 (or not bytes, or
    None) names no stream of the job, so the record is dead-lettered as unknown-stream."""
    for k, v in headers or []:
        if k == STREAM_HEADER:
            return v.decode(errors="replace") if isinstance(v, bytes) else repr(v)
    return None


def _dead(stream: int, buf: RecordBuffer, i: int, r: Reject) -> DeadRecord:
    return dead_record(stream, buf, i, buf.values[i], r.reason, r.detail)


def dead_record(stream: int, buf: RecordBuffer, i: int, value: bytes | None, reason: str, detail: str) -> DeadRecord:
    """Record i of `buf` as a dead letter of `stream`, with `value` (the record's own, or a
    block of some of its tuples)."""
    group, partition, offset = buf.identity(i)
    return DeadRecord(stream, group, partition, offset, buf.keys[i], value, reason, detail, buf.foreign.get(i))
