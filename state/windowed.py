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
from streamjoin.state.partition import checkpoint_key, seq_of, window_block_key, window_prefix
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction

BLOCK_SEQ = "_blk"  # column: the batch that appended the tuple, i.e. its stored block


@dataclass
class GroupState:
    window: GroupWindow
    checkpoint: GroupCheckpoint
    stored: list[dict[int, int]] = field(default_factory=list)  # per stream: block seq on disk -> its newest ts


class WindowedStore:
    def __init__(self, store: Store, plan: JoinPlan, templates: list[Block], hot_bytes: int) -> None:
        self.store = store
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

    def _restore(self, group: int) -> GroupState:
        ckpt = GroupCheckpoint.decode(self.store.get(checkpoint_key(group))) or GroupCheckpoint()
        window = empty_window(self.plan, self.templates)
        stored: list[dict[int, int]] = []
        for i in range(len(self.plan.streams)):
            blocks = {seq_of(k): decode_block(v) for k, v in self.store.scan(window_prefix(group, i))}
            stored.append({seq: int(b[TS].max()) for seq, b in blocks.items()})
            for seq in sorted(blocks):  # batch order, so runs merge in tiers as they did live
                window.runs[i].add(blocks[seq])
        if ckpt.max_ts:
            window.max_ts, window.watermark = list(ckpt.max_ts), ckpt.watermark
        expire(self.plan, window)
        return GroupState(window, ckpt, stored)

    # ----------------------------------------------------------------- writes
    def stage(self, tx: StateTransaction, group: int, state: GroupState, appended: list[Block]) -> None:
        """Write a batch's new blocks, drop blocks with no live tuple, and the checkpoint."""
        seq = state.checkpoint.seq
        for i, block in enumerate(appended):
            if len(block):
                tx.put(window_block_key(group, i, seq), encode_block(block))
                state.stored[i][seq] = int(block[TS].max())
            for dead in self._dead_blocks(state, i):
                tx.delete(window_block_key(group, i, dead))
                del state.stored[i][dead]
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
