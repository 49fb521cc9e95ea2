"""A hash job with split hot keys, run in one process without a broker: partition group 0 and its
slots go through the worker's own batch code (processor.run_cycle) and state store (RocksDB),
over simulated topics. What the broker and the other services do is played here as the cycle
and recovery do it:

- a batch's transaction writes its commit record, then its split records and results, then
  RocksDB takes its state (cycle.py's order);
- a crash `before` the transaction loses the batch (an aborted transaction: nothing of it is
  seen); `after` it, RocksDB has not taken it; `partial`, only the commit record and some of
  what follows it got out (a broker that shows an aborted transaction's records, as Tansu
  does). Recovery then replays every committed batch past the group's checkpoint as
  recovery.py does: the recorded boundary, watermark, clock and splits, writing the results
  missing by id and the split records again;
- the coordinator's part is `split` and `merge`, and freeing an episode's slots once the
  group's checkpoint lists it as ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import WINDOW_START
from streamjoin.schemas.control import HotSplit
from streamjoin.schemas.results import RESULT_ID_HI, RESULT_ID_LO, BatchCommit
from streamjoin.schemas.split_records import encode_split
from streamjoin.services.hash.processor import SLOT_INPUT, GroupBatch, group_store, join_plan, run_cycle
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.settings import JobSettings
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_intake import Msg

NOW = 10_000_000
GROUP = 0


@dataclass(frozen=True)
class Arrival:
    stream: int
    key: int
    ts: int


@dataclass
class Topics:
    """What the simulated broker holds: input records per stream, split records per slot
    partition, commit records and result ids per group, dead letters."""

    inputs: dict[int, list[Msg]]
    split: dict[int, list[Msg]] = field(default_factory=dict)
    commits: dict[int, list[BatchCommit]] = field(default_factory=dict)
    results: dict[int, dict[tuple[int, int], tuple]] = field(default_factory=dict)
    dead: list[tuple[int, str, int, int]] = field(default_factory=list)  # (group, reason, stream, offset)


class SplitJob:
    """Group 0 and its slots over `Topics`, one worker's store (see the module docstring)."""

    def __init__(self, job: JobSettings, arrivals: list[Arrival], rocksdb: Store) -> None:
        """`rocksdb`: an empty store (`emptied` makes one so again)."""
        self.job, self.plan = job, join_plan(job)
        self.store: WindowedStore = group_store(job, self.plan, rocksdb, stream_templates(job))
        self.routings = [routing_for(job, job.partitions)] * len(job.streams)
        topics = [job.topic_of(s) for s in job.streams]
        offsets = [0] * len(job.streams)
        self.order: list[tuple[int, Msg]] = []
        inputs: dict[int, list[Msg]] = {i: [] for i in range(len(job.streams))}
        for a in arrivals:
            m = Msg(topics[a.stream], 0, offsets[a.stream], json.dumps({"k": a.key, "ts": a.ts}, separators=(",", ":")).encode())
            inputs[a.stream].append(m)
            self.order.append((a.stream, m))
            offsets[a.stream] += 1
        self.topics = Topics(inputs, {j: [] for j in range(len(job.slots))})
        self.positions: dict[int, dict[str, dict[int, int]]] = {}  # group -> its consumer's positions
        self.wanted: dict[int, HotSplit] = {}  # the coordinator's splits, by episode
        self.episodes = 0

    # --------------------------------------------------------------- coordinator
    def split(self, key: int, slots: int) -> None:
        """Split `key` over up to `slots` free slots (none: nothing happens)."""
        self._free()
        busy = {s for r in self.wanted.values() for s in r.slots}
        free = [s for s in self.job.slots if s not in busy][:slots]
        if not free or any(r.code == key for r in self.wanted.values()):
            return
        self.episodes += 1
        self.wanted[self.episodes] = HotSplit(episode=self.episodes, group=GROUP, key=str(key), code=key, slots=free)

    def merge(self, key: int) -> None:
        for e, r in self.wanted.items():
            if r.code == key:
                self.wanted[e] = r.model_copy(update={"merging": True})

    def _free(self) -> None:
        ended = set(self.store.stored_checkpoint(GROUP).splits_ended)
        self.wanted = {e: r for e, r in self.wanted.items() if e not in ended}

    # --------------------------------------------------------------- batches
    def run(self, group: int, take: int, crash: str | None = None, keep: float = 0.5, floor: int | None = None) -> None:
        """One batch of `group` over the next `take` records of its input (the group: in arrival
        order; a slot: its split partition), ending as `crash` says (None: committed); `keep`:
        the share of what follows the commit record that a `partial` crash lets out; `floor`:
        a watermark the batch reaches (as an idle timeout's wall clock moves it)."""
        state = self.store.get(group)
        pos = self.positions.setdefault(group, {t: dict(p) for t, p in state.checkpoint.end.items()})
        buffers = self._input(group, pos, take)
        if not any(map(len, buffers.values())) and floor is None:
            return
        splits = {GROUP: list(self.wanted.values())}
        batch, = run_cycle(self.job, self.plan, self.store, buffers, self.routings, NOW, extra=[group],
                           floors={group: floor} if floor is not None else None, splits=splits)
        for topic, parts in batch.end.items():
            pos.setdefault(topic, {}).update(parts)
        if crash == "before":
            self._recover(group)
            return
        commit = BatchCommit(group=group, seq=batch.seq, end=batch.end, watermark=batch.watermark,
                             results=len(batch.results), worker="w", now_ms=batch.now_ms,
                             splits_applied=batch.splits_applied)
        self.topics.commits.setdefault(group, []).append(commit)
        self._write(batch, keep if crash == "partial" else 1.0, replay=False)
        if crash is None:
            self._stage(batch)
        else:
            self._recover(group)

    def _input(self, group: int, pos: dict[str, dict[int, int]], take: int) -> dict[int, RecordBuffer]:
        if group in self.job.slots:
            j, buf = group - self.job.partitions, RecordBuffer()
            at = pos.get(self.job.split_topic, {}).get(j, 0)
            msgs = self.topics.split[j][at:at + take]
            if msgs:
                buf.extend(msgs, self.job.split_topic, np.full(len(msgs), group), np.full(len(msgs), j))
            return {SLOT_INPUT: buf}
        buffers = {i: RecordBuffer() for i in range(len(self.job.streams))}
        unread = [(i, m) for i, m in self.order if m.offset() >= pos.get(m.topic(), {}).get(0, 0)]
        for i, m in unread[:take]:
            buffers[i].add(m, GROUP)  # type: ignore[arg-type]
        return buffers

    def _write(self, batch: GroupBatch, keep: float, replay: bool) -> None:
        """What follows a batch's commit record in its transaction, `keep` of it (1: all). A live
        batch's results are new (an id met before: a pair made twice); a replay's are written
        where missing."""
        for slot, record in batch.split_out[:round(keep * len(batch.split_out))]:
            key, value, headers = encode_split(record)
            j = slot - self.job.partitions
            self.topics.split[j].append(Msg(self.job.split_topic, j, len(self.topics.split[j]), value, headers, key))
        written = self.topics.results.setdefault(batch.group, {})
        made = _results(self.job, batch.results)
        seen = {ident for group in self.topics.results.values() for ident in group}
        twice = [refs for ident, refs in made if ident in seen and not replay]
        assert not twice, f"group {batch.group} batch {batch.seq} made results already written: {twice[:3]}"
        for ident, refs in made[:round(keep * len(made))]:
            written.setdefault(ident, refs)
        self.topics.dead += [(batch.group, d.reason, d.stream, d.offset) for d in batch.dead]

    def _stage(self, batch: GroupBatch) -> None:
        tx: StateTransaction = self.store.rocksdb.transaction()
        self.store.stage(tx, batch.group, batch.state, batch.appended, batch.marks)
        tx.commit()

    def _recover(self, group: int) -> None:
        """recovery.py's replay of `group`'s committed batches past its checkpoint."""
        self.store.forget(group)
        state = self.store.get(group)
        for commit in [c for c in self.topics.commits.get(group, []) if c.seq > state.checkpoint.seq]:
            start = state.checkpoint.end
            buffers = self._between(group, start, commit.end)
            batch, = run_cycle(self.job, self.plan, self.store, buffers, self.routings, commit.now_ms or NOW,
                               extra=[group], floors={group: commit.watermark},
                               splits={group: commit.splits_applied})
            assert batch.end == commit.end, f"group {group}: replay of batch {commit.seq} missed its boundary"
            self._write(batch, 1.0, replay=True)
            self._stage(batch)
            state = batch.state
        self.positions[group] = {t: dict(p) for t, p in state.checkpoint.end.items()}

    def _between(self, group: int, start: dict[str, dict[int, int]],
                 end: dict[str, dict[int, int]]) -> dict[int, RecordBuffer]:
        buffers: dict[int, RecordBuffer] = {}
        for topic, parts in end.items():
            for p, hi in parts.items():
                lo = start.get(topic, {}).get(p, 0)
                if topic == self.job.split_topic:
                    msgs = self.topics.split[p][lo:hi]
                    buf = buffers.setdefault(SLOT_INPUT, RecordBuffer())
                    if msgs:
                        buf.extend(msgs, topic, np.full(len(msgs), group), np.full(len(msgs), p))
                    continue
                i = [self.job.topic_of(s) for s in self.job.streams].index(topic)
                for m in self.topics.inputs[i][lo:hi]:
                    buffers.setdefault(i, RecordBuffer()).add(m, GROUP)  # type: ignore[arg-type]
        return buffers

    # ------------------------------------------------------------------ reads
    def pending(self, group: int) -> int:
        """Records of `group`'s input not read yet."""
        state = self.store.get(group)
        pos = self.positions.get(group, state.checkpoint.end)
        if group in self.job.slots:
            j = group - self.job.partitions
            return len(self.topics.split[j]) - pos.get(self.job.split_topic, {}).get(j, 0)
        return sum(1 for _, m in self.order if m.offset() >= pos.get(m.topic(), {}).get(0, 0))

    def unread_before(self, at: int) -> int:
        """Arrivals among the first `at` the group has not read."""
        pos = self.positions.get(GROUP, self.store.get(GROUP).checkpoint.end)
        return sum(1 for _, m in self.order[:at] if m.offset() >= pos.get(m.topic(), {}).get(0, 0))

    def active(self) -> bool:
        """Whether an episode has not ended yet."""
        self._free()
        return bool(self.wanted)

    def made(self) -> dict[int, int]:
        """Results written per group (the group and each slot)."""
        return {g: len(per_group) for g, per_group in self.topics.results.items()}

    def results(self) -> list[tuple]:
        """Every result written, as member refs (stream order), one entry per id."""
        return [refs for per_group in self.topics.results.values() for refs in per_group.values()]



def emptied(rocksdb: Store) -> Store:
    """`rocksdb` with every key deleted: opening a fresh database costs more than a small run."""
    tx = rocksdb.transaction()
    for key, _ in list(rocksdb.scan(b"")):
        tx.delete(key)
    tx.commit()
    return rocksdb


def _results(job: JobSettings, results: Block) -> list[tuple[tuple[int, int], tuple]]:
    """(id, member refs) of each result of a block; a window join's refs start with its instance."""
    if not len(results):
        return []
    ids = zip(results[RESULT_ID_HI].tolist(), results[RESULT_ID_LO].tolist())
    members = [list(zip([job.topic_of(s)] * len(results), results[f"{s.name}.partition"].tolist(),
                        results[f"{s.name}.offset"].tolist())) for s in job.streams]
    if WINDOW_START in results.columns:
        members.insert(0, results[WINDOW_START].tolist())
    return list(zip(ids, zip(*members)))
