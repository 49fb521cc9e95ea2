"""A SplitJoin core's state in its changelog partition: the writes that keep the partition
holding what the core still needs (`CoreLog`), and the rebuild of a core from its records
(`restore`, `rebuild`, `fresh`, `bootstrap`). The records themselves are
state/splitjoin_records.py's. services/splitjoin/core.py does the Kafka reads and writes;
nothing here talks to Kafka.

Per-transaction work grows with the transaction: a release logs the block it stored, the
tuples it took, and tombstones, never the whole window. The checkpoint names `low`, the
lowest offset of a live block, so a restore reads [low, checkpoint) and nothing older.

Attempts that never checkpointed. A broker that shows aborted transactions (Tansu) lets a
restore see records after the newest checkpoint, written by an attempt that died; on the
next transaction they sit between two checkpoints. So the first transaction after a
restore starts with a `restart` record, and its checkpoint notes [restored checkpoint + 1,
that record) as `skip` (the dead attempt was fenced before the restore, so all it wrote
is below, however late the broker shows it); every later checkpoint carries the ranges
still at or above its `low`, and a rebuild ignores what they cover. A visible checkpoint
was written after its transaction's other records were flushed, so they are visible too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from streamjoin.engine.block import OFF, PART, TS, Block, concat
from streamjoin.engine.psp.plan import RingPlan, RingStream
from streamjoin.engine.psp.slices import FROM, STREAM_SEQ, strip_marks
from streamjoin.engine.splitjoin.core import SplitCore
from streamjoin.engine.splitjoin.input_order import Horizon, InputOrder
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.schemas.codecs import encode_block
from streamjoin.state import changelog
from streamjoin.state.splitjoin_records import (
    BLOCK_KIND, CHECKPOINT_KEY, PENDING_KIND, RESTART_KEY, BootstrapRef, BootstrapSnapshot, CoreCheckpoint, OrderState,
    Record, SplitJoinStateError, block_key, bootstrap_key, bootstrap_pending_key, parse_key, pending_key, read_block,
)
from streamjoin.state.transaction import Write


# --------------------------------------------------------------------------- live bookkeeping

@dataclass(frozen=True)
class CoreSpec:
    """What a core is, apart from its state: the query, its position, the source partitions
    per stream, the allowed lateness, the input order's and the core's empty blocks per
    stream, and the punctuation precision."""

    plan: RingPlan
    position: int
    partitions: tuple[int, ...]
    lateness_ms: int
    order_templates: tuple[Block, ...]
    core_templates: tuple[Block, ...]
    punctuate_every: int

    def order(self, schedule: Schedule) -> InputOrder:
        return InputOrder(self.partitions, self.lateness_ms, list(self.order_templates), schedule)

    def core(self, schedule: Schedule) -> SplitCore:
        return SplitCore(self.plan, self.position, schedule, list(self.core_templates), self.punctuate_every)


@dataclass
class _Logged:
    """A live block in the changelog: its key, its size, `tag` (a stored block's batch, a
    pending block's newest event time) and the offset of its first record once delivered."""

    key: bytes
    nbytes: int
    tag: int
    offset: int | None = None


@dataclass
class _Snapshot:
    state: BootstrapSnapshot
    pending: list[Block]
    offsets: list[int] = field(default_factory=list)


class CoreLog:
    """What a core's changelog partition holds that the core still needs, and the writes
    that keep it so. Per release: `writes`; when the release is written (its writes, or
    results, or the order, changed), `transaction` gives its changelog writes, `landed` takes
    each delivered record's offset, then `checkpoint` the record that ends it. A transaction
    that fails leaves this object behind: restore again."""

    def __init__(self, streams: int, next_offset: int, gap_from: int, pending_seq: int = 0,
                 skip: Sequence[tuple[int, int]] = (), bootstraps: Sequence[BootstrapRef] = ()) -> None:
        """streams: how many; next_offset: the partition's end (where the next record lands);
        gap_from: the first offset an attempt that died may have written at (the restored
        checkpoint's + 1, or 0); pending_seq, skip, bootstraps: as the checkpoint restored from says."""
        self.blocks: list[deque[_Logged]] = [deque() for _ in range(streams)]  # live stored blocks, oldest first
        self.pending: list[_Logged] = []
        self.pending_seq = pending_seq
        self.skip = list(skip)
        self.bootstraps = list(bootstraps)
        self.next_offset = next_offset
        self._awaiting: dict[bytes, _Logged] = {}  # written, offset not delivered yet
        self._snapshots: list[_Snapshot] = []
        self._snapshot_keys: dict[bytes, _Snapshot] = {}
        self._gap: list[int] = [gap_from]  # [from] until the restart record is written, then [from, its offset]

    def snapshot(self, order: InputOrder, positions: dict[str, dict[int, int]], mark_id: str, cores: int) -> None:
        """Core 0 has just read scale mark `mark_id` (to `cores`) in its last source partition:
        keep the input order as it is now (with the source `positions` it reflects) for the
        next transaction, which writes it for the cores the scale adds."""
        state = BootstrapSnapshot(mark_id=mark_id, cores=cores, order=OrderState.of(order),
                                  positions={t: dict(p) for t, p in positions.items()}, held=order.held)
        self._snapshots.append(_Snapshot(state, list(order.pending)))

    def writes(self, core: SplitCore, order: InputOrder, taken: Sequence[Sequence[Block]]) -> list[Write]:
        """The state writes of the release `core` just processed (its batch is core.batch - 1):
        tombstones of stored blocks now wholly expired, the block it stored, the tuples `taken`
        per stream since the last transaction that are still pending, tombstones of pending
        blocks wholly released, and bootstrap snapshots. Empty: the state did not change."""
        out: list[Write] = []
        for j, window in enumerate(core.windows.streams):
            out += self._stored(j, window.rows, core.batch - 1)
        watermark = order.watermark
        for j, blocks in enumerate(taken):
            fresh = concat(blocks)
            fresh = fresh.filter(fresh[TS] >= watermark) if len(fresh) else fresh
            if len(fresh):
                out.append(self._log(pending_key(j, self.pending_seq), encode_block(fresh), int(fresh[TS].max()),
                                     self.pending))
                self.pending_seq += 1
        released = [p for p in self.pending if p.tag < watermark]
        self.pending = [p for p in self.pending if p.tag >= watermark]
        out += [Write(p.key, None, p.nbytes) for p in released]
        for snap in self._snapshots:
            for j, block in enumerate(snap.pending):
                key = bootstrap_pending_key(snap.state.mark_id, j)
                out.append(self._snapshot_write(snap, key, encode_block(block)))
            out.append(self._snapshot_write(snap, bootstrap_key(snap.state.mark_id), snap.state.encode()))
        return out

    def transaction(self, writes: list[Write]) -> list[Write]:
        """The changelog writes of a transaction about to be written: `writes`, after the
        restart record when it is the first transaction since the restore."""
        return ([Write(RESTART_KEY, str(self._gap[0]).encode())] if len(self._gap) == 1 else []) + writes

    def _stored(self, j: int, rows: Block, batch: int) -> list[Write]:
        """Stream j's writes: the window is sorted by sequence and a release's tuples come after
        every earlier one's, so the batches (FROM) ascend along it, expiry takes a prefix,
        and this batch's tuples are its tail: found by bisection, never a scan of the window."""
        live, out = self.blocks[j], []
        first = int(rows[FROM][0]) if len(rows) else batch + 1
        while live and live[0].tag < first:
            gone = live.popleft()
            out.append(Write(gone.key, None, gone.nbytes))
        start = int(np.searchsorted(rows[FROM], batch, side="left")) if batch >= 0 else len(rows)
        if start < len(rows):
            new = strip_marks(rows.take(np.arange(start, len(rows))))
            out.append(self._log(block_key(j, batch), encode_block(new), batch, live))
        return out

    def _log(self, key: bytes, value: bytes, tag: int, into: deque[_Logged] | list[_Logged]) -> Write:
        entry = _Logged(key, len(value), tag)
        into.append(entry)
        self._awaiting[key] = entry
        return Write(key, value)

    def _snapshot_write(self, snap: _Snapshot, key: bytes, value: bytes) -> Write:
        self._snapshot_keys[key] = snap
        return Write(key, value)

    def landed(self, key: bytes, offset: int) -> None:
        """The changelog record `key` (a chunk's key too) was delivered at `offset`."""
        self.next_offset = max(self.next_offset, offset + 1)
        base = changelog.base_key(key)
        if base == RESTART_KEY and len(self._gap) == 1:
            self._gap.append(offset)
        entry = self._awaiting.get(base)
        if entry is not None:
            entry.offset = offset if entry.offset is None else min(entry.offset, offset)
        snap = self._snapshot_keys.get(base)
        if snap is not None:
            snap.offsets.append(offset)

    def checkpoint(self, core: SplitCore, order: InputOrder, positions: dict[str, dict[int, int]],
                   punctuation: int | None, retired: bool) -> CoreCheckpoint:
        """The checkpoint that ends this transaction (every write of it delivered)."""
        live = [e for blocks in self.blocks for e in blocks] + self.pending
        undelivered = [e.key for e in live if e.offset is None]
        if undelivered or any(not s.offsets for s in self._snapshots) or len(self._gap) == 1:
            raise RuntimeError(f"changelog records without a delivered offset: {undelivered[:3]}")
        self._awaiting.clear()
        if self._gap and self._gap[1] > self._gap[0]:
            self.skip.append((self._gap[0], self._gap[1]))
        self._gap = []
        self.bootstraps += [BootstrapRef(mark_id=s.state.mark_id, cores=s.state.cores, start=min(s.offsets),
                                         end=max(s.offsets) + 1) for s in self._snapshots]
        self._snapshots, self._snapshot_keys = [], {}
        low = min((e.offset for e in live if e.offset is not None), default=self.next_offset)
        self.skip = [(a, b) for a, b in self.skip if b > low]
        return CoreCheckpoint(core=core.position, batch=core.batch, through=core.through, punctuation=punctuation,
                              retired=retired, order=OrderState.of(order),
                              positions={t: dict(p) for t, p in positions.items()}, pending_seq=self.pending_seq,
                              stored=[len(s.rows) for s in core.windows.streams], held=order.held, low=low,
                              skip=self.skip, bootstraps=self.bootstraps)


def taken(block: Block, late: Block) -> Block:
    """The tuples of `block` that InputOrder.add kept: all but the `late` ones it returned
    (tuples are told apart by (partition, offset); a loop over partitions, not tuples)."""
    if not len(late):
        return block
    keep = np.ones(len(block), bool)
    for p in np.unique(late[PART]).tolist():
        at = np.flatnonzero(block[PART] == p)
        keep[at] = ~np.isin(block[OFF][at], late[OFF][late[PART] == p])
    return block.filter(keep)


# --------------------------------------------------------------------------- restore

@dataclass
class Restored:
    """A core rebuilt: its input order and core, the log to go on writing with, the source
    positions to read from (topic -> partition -> next offset; missing: the beginning), the
    tuples pending in the order that its own changelog lacks (per stream), and the checkpoint
    it came from (None: a fresh or bootstrapped core)."""

    order: InputOrder
    core: SplitCore
    log: CoreLog
    positions: dict[str, dict[int, int]]
    unlogged: list[list[Block]]
    checkpoint: CoreCheckpoint | None = None


def newest_checkpoint(records: Iterable[Record]) -> tuple[CoreCheckpoint, int] | None:
    """The last checkpoint among `records` (in offset order) and its offset."""
    last = None
    for key, value, offset in records:
        if key == CHECKPOINT_KEY and value is not None:
            last = (value, offset)
    return None if last is None else (CoreCheckpoint.decode(last[0]), last[1])


def restore(spec: CoreSpec, records: Sequence[Record], end: int) -> Restored | None:
    """The core as the newest checkpoint among `records` (a changelog partition's, in offset
    order, up to its `end`) left it; None without a checkpoint. Raises SplitJoinStateError."""
    found = newest_checkpoint(records)
    return None if found is None else rebuild(spec, found[0], found[1], records, end)


def rebuild(spec: CoreSpec, ck: CoreCheckpoint, at: int, records: Iterable[Record], end: int) -> Restored:
    """The core as checkpoint `ck` (at offset `at`) left it, from `records` (those in [ck.low,
    at) at least, in offset order; others are ignored) of a partition that ends at `end`."""
    if ck.core != spec.position:
        raise SplitJoinStateError(f"the checkpoint is core {ck.core}'s, this is core {spec.position}")
    image = changelog.Image()
    prefixes = (f"{BLOCK_KIND}/".encode(), f"{PENDING_KIND}/".encode())
    for key, value, offset in records:
        if ck.low <= offset < at and key is not None and key.startswith(prefixes) and not _skipped(offset, ck.skip):
            image.apply(key, value, offset)
    m = len(spec.order_templates)
    stored: list[list[tuple[int, Block, _Logged]]] = [[] for _ in range(m)]
    pending: list[list[Block]] = [[] for _ in range(m)]
    log = CoreLog(m, end, at + 1, ck.pending_seq, ck.skip, ck.bootstraps)
    for key, value in image.values().items():
        kind, j, n = parse_key(key, m)
        if kind == BLOCK_KIND:
            block = read_block(value, key, spec.core_templates[j])
            stored[j].append((n, block, _Logged(key, len(value), n, image.offsets[key])))
        else:
            block = read_block(value, key, spec.order_templates[j])
            if len(block):
                pending[j].append(block)
                log.pending.append(_Logged(key, len(value), int(block[TS].max()), image.offsets[key]))
    order = spec.order(ck.order.schedule())
    ck.order.install(order, [spec.order_templates[j].take(np.empty(0, np.int64)) for j in range(m)])
    horizon = order.horizon()
    order.pending = [_pending(spec.order_templates[j], pending[j], horizon.watermark) for j in range(m)]
    log.pending = [p for p in log.pending if p.tag >= horizon.watermark]
    core = spec.core(order.schedule)
    for j, blocks in enumerate(stored):
        for batch, block, entry in sorted(blocks, key=lambda b: b[0]):
            if batch >= ck.batch:
                raise SplitJoinStateError(f"block {entry.key!r} is from batch {batch}, after the checkpoint's "
                                          f"{ck.batch}")
            live = block.filter(~_expired(core.plan.streams[j], j, block, horizon))
            core.windows.streams[j].insert(live, batch)
            if len(live):
                log.blocks[j].append(entry)
    core.batch, core.through = ck.batch, ck.through
    _check(ck, core, order)
    return Restored(order, core, log, {t: dict(p) for t, p in ck.positions.items()}, [[] for _ in range(m)], ck)


def _skipped(offset: int, skip: Sequence[tuple[int, int]]) -> bool:
    return any(a <= offset < b for a, b in skip)


def _pending(template: Block, blocks: list[Block], watermark: int) -> Block:
    """A stream's pending tuples: those of its live pending blocks not released yet."""
    block = concat([template.take(np.empty(0, np.int64))] + blocks)
    return block.filter(block[TS] >= watermark)


def _expired(stream: RingStream, j: int, block: Block, horizon: Horizon) -> np.ndarray:
    """What SplitCore's expiry has dropped from stream j by `horizon` (the same rule: no later
    tuple can join them)."""
    if stream.rows_window:
        return block[STREAM_SEQ] <= horizon.counts[j] - stream.size
    return block[TS] <= horizon.watermark - stream.size


def _check(ck: CoreCheckpoint, core: SplitCore, order: InputOrder) -> None:
    """The rebuilt state has the tuples the checkpoint counted, or the changelog misses records."""
    stored = [len(s.rows) for s in core.windows.streams]
    if stored != ck.stored or order.held != ck.held:
        raise SplitJoinStateError(f"the changelog rebuilds {stored} window tuples and {order.held} pending, the "
                                  f"checkpoint counted {ck.stored} and {ck.held}: records are missing (retention or "
                                  "compaction removed live ones?)")


def fresh(spec: CoreSpec, schedule: Schedule, end: int) -> Restored:
    """A core that starts at the beginning of every source partition (its changelog partition
    ends at `end`: whatever is there is an attempt that never checkpointed)."""
    m = len(spec.order_templates)
    log = CoreLog(m, end, 0)
    return Restored(spec.order(schedule), spec.core(schedule), log, {}, [[] for _ in range(m)])


def bootstrap(spec: CoreSpec, snap: BootstrapSnapshot, pending: list[Block], end: int) -> Restored:
    """A core added by a scale, started from core 0's `snap` (pending tuples per stream) with
    an empty window: it reads on from the snapshot's positions, and its first transaction
    logs the pending tuples in its own partition."""
    if not snap.usable_by(spec.position):
        raise SplitJoinStateError(f"core {spec.position} cannot start from the snapshot of mark {snap.mark_id}")
    m = len(spec.order_templates)
    order = spec.order(snap.order.schedule())
    snap.order.install(order, [concat([spec.order_templates[j].take(np.empty(0, np.int64)), pending[j]])
                               for j in range(m)])
    if order.held != snap.held:
        raise SplitJoinStateError(f"the snapshot of mark {snap.mark_id} holds {order.held} pending tuples, "
                                  f"it counted {snap.held}")
    core = spec.core(order.schedule)
    core.through = order.sequencer.next_g
    log = CoreLog(m, end, 0)
    return Restored(order, core, log, {t: dict(p) for t, p in snap.positions.items()},
                    [[b] for b in order.pending], None)


def read_bootstrap(ref: BootstrapRef, records: Iterable[Record],
                   spec: CoreSpec) -> tuple[BootstrapSnapshot, list[Block]]:
    """The snapshot `ref` names and its pending tuples per stream, from core 0's records in [ref.start, ref.end)."""
    image = changelog.Image()
    for key, value, offset in records:
        if ref.start <= offset < ref.end and key is not None and key.startswith(bootstrap_key(ref.mark_id)):
            image.apply(key, value, offset)
    values = image.values()
    snap = BootstrapSnapshot.decode(values.get(bootstrap_key(ref.mark_id)))
    if snap.mark_id != ref.mark_id:
        raise SplitJoinStateError(f"the snapshot at {ref.start} is of mark {snap.mark_id}, expected {ref.mark_id}")
    pending = []
    for j, template in enumerate(spec.order_templates):
        key = bootstrap_pending_key(ref.mark_id, j)
        if key not in values:
            raise SplitJoinStateError(f"the snapshot of mark {ref.mark_id} lacks its pending block {key!r}")
        pending.append(read_block(values[key], key, template))
    return snap, pending
