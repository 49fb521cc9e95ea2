"""Windowed state of partition groups: RocksDB holds every group's window as
the blocks its batches appended; a hot in-memory part holds the groups in use,
least recently used groups are evicted when it outgrows `hot_bytes` and are
read back from RocksDB when their next batch arrives.

A block stays on disk while any of its tuples is still in the window; a
restored window is the stored blocks, added back as runs in batch order and
filtered by the same expiry rule, so it equals the window the worker had in
memory (each block was stored sorted, so no whole-window sort is needed).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import TS, Block
from streamjoin.engine.window_join import GroupWindow, JoinPlan, empty_window, expire
from streamjoin.schemas.codecs import decode_block, encode_block
from streamjoin.state.checkpoint import GroupCheckpoint
from streamjoin.state.partition import (checkpoint_key, group_prefix, seq_of, window_block_key, window_block_of,
                                        window_prefix)
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction

BLOCK_SEQ = "_blk"  # column: the batch that appended the tuple, i.e. its stored block


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
    def __init__(self, store: Store, plan: JoinPlan, templates: list[Block], hot_bytes: int,
                 changelog: bool = False) -> None:
        """`changelog`: the job mirrors state writes to its changelog (see `stage`)."""
        self.store = store
        self.changelog = changelog
        self.plan = plan
        self.templates = [Block(dict(t.columns) | {BLOCK_SEQ: np.empty(0, np.int64)}) for t in templates]
        self.hot_bytes = hot_bytes
        self._hot: OrderedDict[int, GroupState] = OrderedDict()
        # Window bytes of every group read or written since it was last forgotten, hot or cold:
        # a window changes only in a batch, so the size its last batch left is still its size.
        self._sizes: dict[int, int] = {}

    # ------------------------------------------------------------------ reads
    def get(self, group: int) -> GroupState:
        state = self._hot.pop(group, None)
        if state is None:
            state = self._restore(group)
            self._sizes[group] = state.window.nbytes
        self._hot[group] = state  # most recently used last
        return state

    def stored_checkpoint(self, group: int) -> GroupCheckpoint:
        """`group`'s checkpoint as RocksDB holds it (its window is not read)."""
        return GroupCheckpoint.decode(self.store.get(checkpoint_key(group))) or GroupCheckpoint()

    def _restore(self, group: int) -> GroupState:
        ckpt = self.stored_checkpoint(group)
        window = empty_window(self.plan, self.templates)
        state = GroupState(window, ckpt, changelog_floor=ckpt.changelog_low, changelog_next=ckpt.changelog_low)
        for i in range(len(self.plan.streams)):
            raw = {seq_of(k): v for k, v in self.store.scan(window_prefix(group, i))}
            blocks = {seq: decode_block(v) for seq, v in raw.items()}
            state.stored.append({seq: int(b[TS].max()) for seq, b in blocks.items()})
            state.stored_bytes.append({seq: len(v) for seq, v in raw.items()})
            state.logged.append({})
            for seq in sorted(blocks):  # batch order, so runs merge in tiers as they did live
                window.runs[i].add(blocks[seq])
        if ckpt.max_ts:
            window.max_ts, window.watermark = list(ckpt.max_ts), ckpt.watermark
        expire(self.plan, window)
        return state

    def install(self, group: int, values: dict[bytes, bytes], offsets: dict[bytes, int], next_offset: int) -> GroupState:
        """Replace `group`'s stored state with `values` (key -> value, as its changelog rebuilt
        them; `offsets`: where each one's first record is) and read it back."""
        tx = self.store.transaction()
        for key, _ in self.store.scan(group_prefix(group)):
            tx.delete(key)
        for key, value in values.items():
            tx.put(key, value)
        tx.commit()
        self.forget(group)
        state = self.get(group)
        state.logged_at(offsets, next_offset)
        return state

    # ----------------------------------------------------------------- writes
    def stage(self, tx: StateTransaction, group: int, state: GroupState, appended: list[Block]) -> None:
        """Write a batch's new blocks, drop blocks with no live tuple, and the checkpoint (last,
        so that in the changelog a checkpoint follows every write it stands for)."""
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
        if self.changelog and not state.checkpoint.in_changelog:
            # Blocks stored before the job kept a changelog: written once more, so that from
            # this batch on the changelog holds every live block.
            for i, blocks in enumerate(state.stored):
                for old in sorted(set(blocks) - {seq}):
                    key = window_block_key(group, i, old)
                    value = self.store.get(key)
                    if value is not None:
                        tx.put(key, value)
        state.checkpoint = state.checkpoint.model_copy(update={"changelog_low": state.changelog_low(seq),
                                                               "in_changelog": self.changelog})
        tx.put(checkpoint_key(group), state.checkpoint.encode())
        self._sizes[group] = state.window.nbytes

    def _dead_blocks(self, state: GroupState, stream: int) -> list[int]:
        """Stored blocks of `stream` none of whose tuples is live any more."""
        runs = state.window.runs[stream]
        if self.plan.streams[stream].range_ms is None:
            # Count windows expire per key, not by time: ask the tuples themselves.
            live = set(np.unique(runs.merged()[BLOCK_SEQ]).tolist())
            return [seq for seq in state.stored[stream] if seq not in live]
        # Time windows: a block is dead once its newest tuple is below the window's floor.
        return [seq for seq, newest in state.stored[stream].items() if newest < runs.floor]

    def evict_cold(self, keep: set[int]) -> None:
        """Keep the in-memory part under `hot_bytes`; the store already holds everything."""
        total = self.hot_size
        for group in list(self._hot):
            if total <= self.hot_bytes:
                break
            if group not in keep:
                total -= self._hot.pop(group).window.nbytes

    def forget(self, group: int) -> None:
        self._hot.pop(group, None)
        self._sizes.pop(group, None)

    @property
    def hot_size(self) -> int:
        return sum(s.window.nbytes for s in self._hot.values())

    def hot_groups(self) -> dict[int, GroupState]:
        return dict(self._hot)

    def group_bytes(self, groups: set[int]) -> dict[int, int]:
        """Window bytes of each of `groups` as its last batch (or its restore) left it; 0 for a
        group not read since it was assigned. Costs one dict lookup per group, no window scan."""
        return {g: self._sizes.get(g, 0) for g in sorted(groups)}
