"""Windowed state of partition groups: RocksDB holds every group's window as
the blocks its batches appended; memory holds the windows in use, within the
worker's budget (`worker.memory_bytes`). Past it, the spill paper's
disk-based adaptation pushes groups out (state/spill.py chooses which): in probe
mode a pushed group's window is read back from RocksDB when its next batch arrives;
in deferred mode it stays on disk as a generation that only its clean-up
reads (engine/cleanup.py), and the group starts a new one in memory.

A block stays on disk while any of its tuples is still in the window; a
restored window is the stored blocks, added back as runs in batch order and
filtered by the same expiry rule, so it equals the window the worker had in
memory (each block was stored sorted, so no whole-window sort is needed).

Outer, semi and anti joins also store, per batch and decided stream, the refs
its results matched for the first time (engine/outer.py's marks); a restored
window's matched set is their union (a window join's marks name copies:
their instance start too). A marks record is dropped with the last
live tuple it names (its newest ts below the stream's floor), and is always
written after the blocks of the tuples it names, so the changelog range that
rebuilds those blocks holds it too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import OFF, PART, TS, WIN, Block, concat
from streamjoin.engine.outer import block_ref_keys
from streamjoin.engine.runs import SortedRuns
from streamjoin.engine.window_join import GroupWindow, JoinPlan, empty_window, expire
from streamjoin.schemas.codecs import decode_block, encode_block
from streamjoin.state.checkpoint import GroupCheckpoint
from streamjoin.state.partition import (checkpoint_key, group_prefix, marks_key, marks_prefix, seq_of,
                                        window_block_key, window_block_of, window_prefix)
from streamjoin.state.spill import GroupActivity, choose_victims
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction
from streamjoin.settings import SpillSpec

# Column: the batch that appended the tuple, i.e. its stored block. The name is part of the
# blocks encoded in RocksDB and the changelog: another name would not restore stored state.
BLOCK_SEQ = "_blk"


@dataclass
class GroupState:
    """A group's window and checkpoint, and what is known of its stored blocks: per stream,
    block seq -> its newest ts (`stored`), -> its encoded bytes (`stored_bytes`), and -> the
    changelog offset of its first record (`logged`; a block restored from the local disk has
    none: `changelog_floor`, the checkpoint's low mark, stands in for it). `changelog_next`:
    where the group's next changelog records will be, at least."""

    window: GroupWindow
    checkpoint: GroupCheckpoint
    stored: list[dict[int, int]] = field(default_factory=list)
    stored_bytes: list[dict[int, int]] = field(default_factory=list)
    logged: list[dict[int, int]] = field(default_factory=list)
    changelog_floor: int = 0
    changelog_next: int = 0
    # Deferred spill: the window in memory was pushed; the next batch starts a new generation.
    push_pending: bool = False
    # Outer/semi/anti joins: per decided stream, stored marks record seq -> (its newest ts, its
    # bytes: a delete must retract every changelog chunk of a big one).
    marks: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    # A slot's window was dropped in batch `dropped_at` (its split episode ended or a new one
    # began): every block and marks record of an earlier batch is deleted when it is staged.
    dropped_at: int = 0

    def spilled_bytes(self) -> int:
        """Stored bytes of the spilled generations (blocks before the generation in memory)."""
        start = self.checkpoint.generation_start
        return sum(size for stream in self.stored_bytes for seq, size in stream.items() if seq < start)

    def changelog_low(self, seq: int) -> int:
        """The first changelog offset the state after batch `seq` needs: that of its oldest
        live block written before `seq`, or where batch `seq`'s own records begin."""
        older = [logged.get(s, self.changelog_floor) for stream, logged in zip(self.stored, self.logged)
                 for s in stream if s != seq]
        return min(older + [self.changelog_next])

    def logged_at(self, offsets: dict[bytes, int], next_offset: int) -> None:
        """A cycle's changelog records were committed: `offsets` where each key's first record is."""
        for key, offset in offsets.items():
            block = window_block_of(key)
            if block is not None and block[1] in self.stored[block[0]]:
                self.logged[block[0]][block[1]] = offset
        self.changelog_next = max(self.changelog_next, next_offset)


class WindowedStore:
    def __init__(self, rocksdb: Store, plan: JoinPlan, templates: list[Block], memory_bytes: int,
                 changelog: bool = False, spill: SpillSpec | None = None) -> None:
        """`memory_bytes`: the budget for windows held in memory; `changelog`: the job mirrors
        state writes to its changelog (see `stage`); `spill`: how the budget is kept (state/spill.py)."""
        self.rocksdb = rocksdb
        self.changelog = changelog
        self.plan = plan
        self.templates = [Block(dict(t.columns) | {BLOCK_SEQ: np.empty(0, np.int64)}) for t in templates]
        self.memory_bytes = memory_bytes
        self.spill = spill or SpillSpec()
        self._hot: OrderedDict[int, GroupState] = OrderedDict()
        # Window bytes of every group read or written since it was last forgotten, hot or cold:
        # a window changes only in a batch, so the size its last batch left is still its size.
        self._sizes: dict[int, int] = {}
        self.activity: dict[int, GroupActivity] = {}  # the spill policy's per-group statistics (T_u, P_o)
        # Outer/semi/anti joins: a pushed group's next deadline (GroupWindow.next_deadline) as it
        # left memory, so an all-idle group on disk is still woken when a row of it is due.
        self._deadlines: dict[int, int] = {}
        self.pushes = 0

    @property
    def deferred(self) -> bool:
        return self.spill.mode == "deferred"

    # ------------------------------------------------------------------ reads
    def get(self, group: int) -> GroupState:
        state = self._hot.pop(group, None)
        if state is None:
            state = self._restore(group)
            self._deadlines.pop(group, None)
            self._sizes[group] = state.window.nbytes
        self._hot[group] = state  # most recently used last
        return state

    def stored_checkpoint(self, group: int) -> GroupCheckpoint:
        """`group`'s checkpoint as RocksDB holds it (its window is not read)."""
        return GroupCheckpoint.decode(self.rocksdb.get(checkpoint_key(group))) or GroupCheckpoint()

    def _restore(self, group: int) -> GroupState:
        ckpt = self.stored_checkpoint(group)
        window = empty_window(self.plan, self.templates)
        state = GroupState(window, ckpt, changelog_floor=ckpt.changelog_low, changelog_next=ckpt.changelog_low)
        spilled_newest = max((newest for _, newest in ckpt.generations), default=0)
        for i in range(len(self.plan.streams)):
            raw = {seq_of(k): v for k, v in self.rocksdb.scan(window_prefix(group, i))}
            # Spilled generations stay on disk undecoded: only their clean-up reads them.
            blocks = {seq: decode_block(v) for seq, v in raw.items() if seq >= ckpt.generation_start}
            state.stored.append({seq: int(blocks[seq][TS].max()) if seq in blocks else spilled_newest for seq in raw})
            state.stored_bytes.append({seq: len(v) for seq, v in raw.items()})
            state.logged.append({})
            for seq in sorted(blocks):  # batch order, so runs merge in tiers as they did live
                window.runs[i].add(blocks[seq])
        if ckpt.max_ts:
            window.max_ts, window.watermark = list(ckpt.max_ts), ckpt.watermark
        expire(self.plan, window)
        for i in window.matched:
            self._restore_marks(group, state, i)
        return state

    def _restore_marks(self, group: int, state: GroupState, stream: int) -> None:
        """Rebuild `stream`'s matched set from its stored marks, keeping only refs of live tuples."""
        raw = {seq_of(k): v for k, v in self.rocksdb.scan(marks_prefix(group, stream))}
        marks = {seq: decode_block(v) for seq, v in raw.items()}
        state.marks[stream] = {seq: (int(block[TS].max()), len(raw[seq])) for seq, block in marks.items() if len(block)}
        # A window join's marks name copies (WIN too): a row matched in one instance only.
        copies = {WIN: np.empty(0, np.int64)} if self.plan.instance_ms is not None else {}
        refs = concat([Block({PART: np.empty(0, np.int32), OFF: np.empty(0, np.int64), TS: np.empty(0, np.int64)}
                             | copies), *marks.values()])
        live = state.window.runs[stream].merged()
        keys = block_ref_keys(refs)
        alive = np.isin(keys, block_ref_keys(live))
        state.window.matched[stream].add(keys[alive], refs[TS][alive])

    def stored_blocks(self, group: int, state: GroupState, from_seq: int) -> list[Block]:
        """Per stream, the stored tuples of `group` from batch `from_seq` on, as one block
        (expired ones included: a clean-up needs partners the window has let go of)."""
        out = []
        for i, template in enumerate(self.templates):
            seqs = sorted(seq for seq in state.stored[i] if seq >= from_seq)
            raws = [self.rocksdb.get(window_block_key(group, i, seq)) for seq in seqs]
            out.append(concat([template] + [decode_block(raw) for raw in raws if raw is not None]))
        return out

    # ------------------------------------------------------------ generations
    def close_generation(self, state: GroupState, seq: int) -> None:
        """Deferred spill: batch `seq` starts a new generation; the one in memory joins the
        spilled ones (its window leaves memory, its blocks stay on disk for the clean-up).
        Nothing to close when the generation in memory stored no block."""
        ckpt = state.checkpoint
        newest = [t for stream in state.stored for s, t in stream.items() if s >= ckpt.generation_start]
        if newest:
            state.checkpoint = ckpt.model_copy(update={
                "generations": ckpt.generations + [[ckpt.generation_start, max(newest)]],
                "generation_start": seq})
        self._empty_window(state)
        state.push_pending = False

    def _empty_window(self, state: GroupState) -> None:
        """Drop the window's tuples from memory, keeping its clock (watermark, floors)."""
        for i, runs in enumerate(state.window.runs):
            fresh = SortedRuns(runs.template)
            fresh.floor = runs.floor
            state.window.runs[i] = fresh

    def drop_window(self, state: GroupState, seq: int) -> None:
        """Drop every tuple and mark of `state`'s window, and its clock, in batch `seq` (a slot
        between split episodes): the batch's staging deletes the stored blocks."""
        state.window = empty_window(self.plan, self.templates)
        state.dropped_at = seq

    def install(self, group: int, values: dict[bytes, bytes], offsets: dict[bytes, int], next_offset: int) -> GroupState:
        """Replace `group`'s stored state with `values` (key -> value, as its changelog rebuilt
        them; `offsets`: where each one's first record is) and read it back."""
        tx = self.rocksdb.transaction()
        for key, _ in self.rocksdb.scan(group_prefix(group)):
            tx.delete(key)
        for key, value in values.items():
            tx.put(key, value)
        tx.commit()
        self.forget(group)
        state = self.get(group)
        state.logged_at(offsets, next_offset)
        return state

    # ----------------------------------------------------------------- writes
    def stage(self, tx: StateTransaction, group: int, state: GroupState, appended: list[Block],
              marks: dict[int, Block] | None = None) -> None:
        """Write a batch's new blocks and marks (`marks`: per decided stream, the refs its results
        matched first), drop blocks and marks with no live tuple, and the checkpoint (last, so
        that in the changelog a checkpoint follows every write it stands for)."""
        seq = state.checkpoint.seq
        for i, block in enumerate(appended):
            if len(block):
                raw = encode_block(block)
                tx.put(window_block_key(group, i, seq), raw)
                state.stored[i][seq], state.stored_bytes[i][seq] = int(block[TS].max()), len(raw)
            for dead in self._dead_blocks(state, i):
                tx.delete(window_block_key(group, i, dead), state.stored_bytes[i].pop(dead, 0))
                del state.stored[i][dead]
                state.logged[i].pop(dead, None)
        self._stage_marks(tx, group, state, marks or {})
        if self.changelog and not state.checkpoint.in_changelog:
            # Blocks stored before the job kept a changelog: written once more, so that from
            # this batch on the changelog holds every live block.
            rewritten = [window_block_key(group, i, old) for i, blocks in enumerate(state.stored)
                         for old in sorted(set(blocks) - {seq})]
            rewritten += [marks_key(group, i, old) for i, stored in state.marks.items() for old in sorted(stored)
                          if not (marks and i in marks and old == seq)]
            for key in rewritten:
                value = self.rocksdb.get(key)
                if value is not None:
                    tx.put(key, value)
        state.checkpoint = state.checkpoint.model_copy(update={"changelog_low": state.changelog_low(seq),
                                                               "in_changelog": self.changelog})
        tx.put(checkpoint_key(group), state.checkpoint.encode())
        self._sizes[group] = state.window.nbytes

    def _stage_marks(self, tx: StateTransaction, group: int, state: GroupState, marks: dict[int, Block]) -> None:
        """Store a batch's new marks; drop the marks records whose tuples have all expired."""
        seq = state.checkpoint.seq
        for i in state.window.matched:
            stored = state.marks.setdefault(i, {})
            block = marks.get(i)
            if block is not None and len(block):
                raw = encode_block(block)
                tx.put(marks_key(group, i, seq), raw)
                stored[seq] = (int(block[TS].max()), len(raw))
            oldest = self._oldest_live(state, i)
            for dead in [s for s, (newest, _) in stored.items() if newest < oldest or s < state.dropped_at]:
                tx.delete(marks_key(group, i, dead), stored.pop(dead)[1])

    def _oldest_live(self, state: GroupState, stream: int) -> int:
        """A time below which `stream` holds no live tuple: a time window's floor; for a count
        window the oldest live tuple's time (count windows hold their state merged)."""
        runs = state.window.runs[stream]
        if self.plan.streams[stream].range_ms is not None:
            return runs.floor
        merged = runs.merged()
        return int(merged[TS].min()) if len(merged) else np.iinfo(np.int64).max

    def _dead_blocks(self, state: GroupState, stream: int) -> list[int]:
        """Stored blocks of `stream` no live tuple and no pending clean-up needs any more, and
        those from before the window was dropped (`drop_window`)."""
        dropped = [seq for seq in state.stored[stream] if seq < state.dropped_at]
        return dropped + [seq for seq in self._expired_blocks(state, stream) if seq >= state.dropped_at]

    def _expired_blocks(self, state: GroupState, stream: int) -> list[int]:
        """Stored blocks of `stream` no live tuple and no pending clean-up needs any more."""
        ckpt = state.checkpoint
        if ckpt.generations:
            # A spilled generation's clean-up reads every later block, expired ones too.
            return [seq for seq in state.stored[stream] if seq < ckpt.generations[0][0]]
        cleaned = [seq for seq in state.stored[stream] if seq < ckpt.generation_start]
        runs = state.window.runs[stream]
        current = {seq: newest for seq, newest in state.stored[stream].items() if seq >= ckpt.generation_start}
        if self.plan.streams[stream].range_ms is None:
            # Count windows expire per key, not by time: ask the tuples themselves.
            live = set(np.unique(runs.merged()[BLOCK_SEQ]).tolist())
            return cleaned + [seq for seq in current if seq not in live]
        # Time windows: a block is dead once its newest tuple is below the window's floor.
        return cleaned + [seq for seq, newest in current.items() if newest < runs.floor]

    # ------------------------------------------------------------------ spill
    def observe(self, group: int, now_ms: int, inserted: int, results: int) -> None:
        """The spill policy's statistics (the spill paper, section 4.3) after a
        committed batch of `group`: `inserted` new tuples (the insert time T_u moves when there
        are any) and `results` produced (P_o)."""
        activity = self.activity.setdefault(group, GroupActivity(last_insert_ms=now_ms))
        if inserted:
            activity.last_insert_ms = now_ms
        activity.results += results

    def over_budget(self) -> bool:
        return self.hot_size > self.spill.trigger * self.memory_bytes

    def keep_budget(self, now_ms: int) -> list[tuple[int, int]]:
        """Past the trigger, push `push_fraction` of the in-memory window bytes (the spill
        paper, section 4.4), or more when that would still leave memory past the
        trigger (a budget is a bound).
        Returns the groups pushed, with their bytes."""
        if not self.over_budget():
            return []
        excess = self.hot_size - self.spill.trigger * self.memory_bytes
        return self.push(max(self.spill.push_fraction * self.hot_size, excess), now_ms)

    def push(self, target: float, now_ms: int) -> list[tuple[int, int]]:
        """Push at least `target` bytes of in-memory windows to disk, victims chosen by
        `spill.victims` (state/spill.py). Returns the groups pushed, with their bytes."""
        sizes = {g: s.window.nbytes for g, s in self._hot.items() if s.window.nbytes and not s.push_pending}
        recency = {g: rank for rank, g in enumerate(self._hot) if g in sizes}  # 0 = least recently used
        known = {g: self.activity[g] for g in sizes if g in self.activity}
        victims = choose_victims(sizes, known, recency, target, self.spill, now_ms)
        pushed = [(g, sizes[g]) for g in victims]
        for group, _ in pushed:
            if self.deferred:
                self._empty_window(self._hot[group])
                self._hot[group].push_pending = True
                self._sizes[group] = 0  # its memory is free; its generation is on disk
            else:
                deadline = self._hot.pop(group).window.next_deadline(self.plan)
                if deadline is not None:
                    self._deadlines[group] = deadline
        self.pushes += len(pushed)
        return pushed

    def spilled_bytes(self, groups: set[int]) -> int:
        """Window bytes of `groups` held on disk only: their spilled generations (deferred), or
        the windows of the groups not in memory (probe)."""
        if self.deferred:
            return sum(s.spilled_bytes() for g, s in self._hot.items() if g in groups)
        return sum(size for g, size in self._sizes.items() if g in groups and g not in self._hot)

    def pending_generations(self) -> dict[int, int]:
        """Group -> spilled generations not cleaned up yet (deferred spill)."""
        return {g: len(s.checkpoint.generations) for g, s in self._hot.items() if s.checkpoint.generations}

    def group_results(self, groups: set[int]) -> dict[int, int]:
        """P_o of each of `groups` with statistics: results produced since this worker took it."""
        return {g: self.activity[g].results for g in sorted(groups) if g in self.activity}

    def next_deadline(self, group: int) -> int | None:
        """The lowest watermark at which one of `group`'s open rows would be decided (outer,
        semi and anti joins; None: none known): read from memory, or as the group left it."""
        state = self._hot.get(group)
        return state.window.next_deadline(self.plan) if state is not None else self._deadlines.get(group)

    def forget(self, group: int) -> None:
        self._hot.pop(group, None)
        self._deadlines.pop(group, None)
        self._sizes.pop(group, None)
        self.activity.pop(group, None)

    @property
    def hot_size(self) -> int:
        return sum(s.window.nbytes for s in self._hot.values())

    def hot_groups(self) -> dict[int, GroupState]:
        return dict(self._hot)

    def group_bytes(self, groups: set[int]) -> dict[int, int]:
        """Window bytes of each of `groups` as its last batch (or its restore) left it; 0 for a
        group not read since it was assigned. Costs one dict lookup per group, no window scan."""
        return {g: self._sizes.get(g, 0) for g in sorted(groups)}
