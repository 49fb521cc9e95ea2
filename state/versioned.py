"""State of an as-of join's partition groups: the table's versions a future tuple can still
need and the stream tuples waiting for the table's watermark (engine/asof.py), kept the way
`WindowedStore` keeps windows (blocks per batch in RocksDB, mirrored to the changelog,
groups pushed out of memory and read back), with their own rules for what stays.

A stored block stays while any of its rows is still in the group's state: membership is
asked of the rows themselves (their `BLOCK_SEQ`), as for count windows, because versions
leave by key (`prune`), not by time. A restored group is its stored blocks, with the tuples
the table's watermark has passed taken out (they were joined) and the versions pruned
again, which gives the state the worker had: pruning is idempotent for a given horizon.

A tombstone that is its key's newest old version stays in memory, so that no older version
of the key, still on disk in a block that another key keeps alive, comes back on a restore.
When the stored versions are more than twice what the state holds, the batch writes the
whole state as its one table block and every older block goes (a compaction); only then
do such tombstones go too, as nothing older is left to come back.
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.asof import DELETED, AsOfPlan, AsOfState, AsOfWindow, prune
from streamjoin.engine.block import KEY, OFF, PART, TS, Block, concat
from streamjoin.schemas.codecs import decode_block
from streamjoin.state.partition import seq_of, window_prefix
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction
from streamjoin.state.windowed import BLOCK_SEQ, GroupState, WindowedStore
from streamjoin.settings import SpillSpec

# Compact once the stored versions are this many times what the state holds, plus a floor,
# so that a small table is not rewritten every batch.
_COMPACT_FACTOR = 2
_COMPACT_FLOOR_BYTES = 256 << 10


class VersionedStore(WindowedStore):
    def __init__(self, rocksdb: Store, plan: AsOfPlan, table: int, templates: list[Block], memory_bytes: int,
                 changelog: bool = False, spill: SpillSpec | None = None) -> None:
        """`plan`: the as-of join; `table`: the table's index among the job's streams; the rest
        as `WindowedStore`'s (deferred spill is refused by the settings)."""
        tagged = list(templates)
        tagged[table] = Block(dict(templates[table].columns) | {DELETED: np.empty(0, np.bool_)})
        super().__init__(rocksdb, plan, tagged, memory_bytes, changelog, spill)  # type: ignore[arg-type]
        self.asof, self.table = plan, table

    def empty(self) -> AsOfWindow:
        t = self.table
        return AsOfWindow(self.asof, AsOfState(self.templates[t], self.templates[1 - t]), t)

    def _restore(self, group: int) -> GroupState:
        ckpt = self.stored_checkpoint(group)
        window = self.empty()
        state = GroupState(window, ckpt, changelog_floor=ckpt.changelog_low,  # type: ignore[arg-type]
                           changelog_next=ckpt.changelog_low)
        blocks = []
        for i in range(2):
            raw = {seq_of(k): v for k, v in self.rocksdb.scan(window_prefix(group, i))}
            decoded = {seq: decode_block(v) for seq, v in raw.items()}
            state.stored.append({seq: int(b[TS].max()) for seq, b in decoded.items()})
            state.stored_bytes.append({seq: len(v) for seq, v in raw.items()})
            state.logged.append({})
            blocks.append(concat([self.templates[i], *(decoded[s] for s in sorted(decoded))]))
        t, asof = self.table, window.state
        if ckpt.max_ts:
            asof.stream_max_ts, asof.table_max_ts = ckpt.max_ts[1 - t], ckpt.max_ts[t]
        table_wm = asof.watermarks(self.asof)[1]
        waiting = blocks[1 - t]
        waiting = waiting.filter(waiting[TS] >= table_wm)  # the others were joined
        asof.waiting = waiting.take(np.lexsort((waiting[OFF], waiting[PART], waiting[TS])))
        versions = blocks[t]
        asof.versions = versions.take(np.lexsort((versions[OFF], versions[TS], versions[KEY])))
        asof.versions = prune(asof.versions, asof.horizon(self.asof))
        asof.pruned = len(asof.versions)
        return state

    def stage(self, tx: StateTransaction, group: int, state: GroupState, appended: list[Block],
              marks: dict[int, Block] | None = None) -> None:
        """`WindowedStore.stage`, the batch's table block replaced by the whole state when the
        stored versions have grown past it (see the module docstring)."""
        t, window = self.table, state.window
        stored = sum(state.stored_bytes[t].values())
        asof = window.state  # type: ignore[attr-defined]
        if stored > _COMPACT_FACTOR * asof.versions.nbytes + _COMPACT_FLOOR_BYTES:
            kept = prune(asof.versions, asof.horizon(self.asof), drop_tombstones=True)
            asof.versions = Block(dict(kept.columns) | {BLOCK_SEQ: np.full(len(kept), state.checkpoint.seq,
                                                                           np.int64)})
            appended = list(appended)
            appended[t] = asof.versions
        super().stage(tx, group, state, appended, marks)

    def _dead_blocks(self, state: GroupState, stream: int) -> list[int]:
        """Stored blocks of `stream` none of whose rows is in the group's state any more."""
        asof = state.window.state  # type: ignore[attr-defined]
        rows = asof.versions if stream == self.table else asof.waiting
        live = set(np.unique(rows[BLOCK_SEQ]).tolist())
        return [seq for seq in state.stored[stream] if seq not in live]
