"""As-of (temporal) join of a stream with a versioned table, for one partition group.

A table is a stream of versions: each record is the row of its key as of its event time, a
tombstone (`DELETED`) removes the key. A stream tuple with key k at time t joins the version
of k with the greatest (time, offset) whose time is <= t; none, or a tombstone: no result for
`inner`, the tuple alone, null-padded, for `left`.

Results are final when written, never retracted: a stream tuple waits until the table's
watermark has passed its time (watermark > t), because a version still to come is never
older than the watermark (a later one is dead-lettered as late, like any late record). The
watermarks are each side's newest event time minus its allowed lateness; a stream tuple older
than the stream's watermark is late too.

State is bounded by keys times recent versions, not by the table's history: of a key's
versions older than the horizon (the lower watermark, or the oldest waiting tuple if older)
only the newest can still be the valid one for a future tuple, so the others go.

Keys are compared by the KEY column: an int key's value, or the 64-bit hash of a string key's
text. Everything moves as blocks; the probe is one sort of the versions and the released tuples
together (`valid_versions`), no per-tuple Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from streamjoin.engine.block import KEY, OFF, PART, TS, Block, concat
from streamjoin.engine.lateness import NO_TIME
from streamjoin.engine.outer import padded
from streamjoin.engine.runs import merge_sorted
from streamjoin.engine.result_ids import ABSENT
from streamjoin.engine.window_join import BatchOutcome, JoinPlan, StreamPlan, assemble

DELETED = "_deleted"  # bool column of a table block: the version is a tombstone
NO_VERSION = -1  # `valid_versions`: the tuple has no version at or before its time
# Versions are pruned once they number twice what the last prune left plus this: pruning reads
# every version, so it is spread over as many new ones (a version kept longer is harmless:
# never newer than the one a later tuple takes).
PRUNE_SLACK = 1024
_WAITING_ORDER = (TS, PART, OFF)


@dataclass(frozen=True)
class AsOfPlan:
    stream: StreamPlan  # the probing stream: its name, topic and payload
    table: StreamPlan  # the versioned table
    stream_lateness_ms: int
    table_lateness_ms: int
    join_type: Literal["inner", "left"] = "inner"


@dataclass
class AsOfState:
    """One group's as-of state: the versions a future tuple can still need, sorted by
    (KEY, TS, OFF), and the stream tuples waiting for the table's watermark, sorted by
    (TS, PART, OFF); each side's newest event time so far."""

    versions: Block
    waiting: Block
    stream_max_ts: int = NO_TIME
    table_max_ts: int = NO_TIME
    pruned: int = 0  # versions held after the last prune (the next comes once they have doubled)

    def watermarks(self, plan: AsOfPlan) -> tuple[int, int]:
        """(the stream's, the table's) watermark."""
        return (_watermark(self.stream_max_ts, plan.stream_lateness_ms),
                _watermark(self.table_max_ts, plan.table_lateness_ms))

    def horizon(self, plan: AsOfPlan) -> int:
        """No tuple still to be joined is older than this, and no version still to come is: the
        least of the two watermarks and the oldest waiting tuple. Of the versions older than it,
        only each key's newest can still be anyone's valid version (`prune`)."""
        lowest = min(self.watermarks(plan))
        return min(lowest, int(self.waiting[TS][0])) if len(self.waiting) else lowest


@dataclass
class AsOfOutcome:
    results: Block
    late_stream: Block  # stream tuples older than the stream's watermark: dead letters
    late_table: Block  # versions older than the table's watermark: dead letters
    accepted: list[Block] = field(default_factory=list)  # [stream tuples, versions] taken in


def empty_state(stream_template: Block, table_template: Block) -> AsOfState:
    """A group's state before its first batch; the templates are empty blocks of each side's
    columns (the table's with `DELETED`)."""
    return AsOfState(table_template, stream_template)


def process_asof_batch(plan: AsOfPlan, state: AsOfState, stream: Block, table: Block, now_ms: int) -> AsOfOutcome:
    """Take one batch of stream tuples and table versions into `state` (mutated), and return
    the results of every waiting tuple the table's watermark has now passed.

    A batch costs what it brings: its rows are sorted and merged into the sorted state in
    one linear pass, the released tuples are a prefix of the waiting ones, each is probed by
    binary search, and versions are pruned only once they have doubled since the last time."""
    stream_wm, table_wm = state.watermarks(plan)
    late_stream, late_table = stream[TS] < stream_wm, table[TS] < table_wm
    taken, versions = stream.filter(~late_stream), table.filter(~late_table)
    if len(versions):
        state.versions = merge_sorted(state.versions, _sorted(versions, (OFF, TS, KEY)))
        state.table_max_ts = max(state.table_max_ts, int(versions[TS].max()))
    if len(taken):
        state.waiting = merge_sorted(state.waiting, _sorted(taken, (OFF, PART, TS)), by=_WAITING_ORDER)
        state.stream_max_ts = max(state.stream_max_ts, int(taken[TS].max()))
    stream_wm, table_wm = state.watermarks(plan)
    cut = int(np.searchsorted(state.waiting[TS], table_wm, side="left"))  # waiting is in time order
    released = _rows(state.waiting, 0, cut)
    state.waiting = _rows(state.waiting, cut, len(state.waiting))
    results = _results(plan, state.versions, released, now_ms)
    if len(state.versions) >= 2 * state.pruned + PRUNE_SLACK:
        state.versions = prune(state.versions, state.horizon(plan))
        state.pruned = len(state.versions)
    return AsOfOutcome(results, stream.filter(late_stream), table.filter(late_table), [taken, versions])


def valid_versions(versions: Block, probes: Block) -> np.ndarray:
    """For each probe tuple, the index in `versions` (sorted by KEY, TS, OFF) of the version of
    its key with the greatest (TS, OFF) at or before its TS, or NO_VERSION.

    Its key's versions are found by one searchsorted; within them, the first one newer than the
    probe is bisected for all probes at once, and the one before it is the valid one."""
    keys, times = versions[KEY], versions[TS]
    start = np.searchsorted(keys, probes[KEY], side="left")
    lo, hi = start.copy(), np.searchsorted(keys, probes[KEY], side="right")
    t = probes[TS]
    open_ = np.flatnonzero(lo < hi)
    while len(open_):
        mid = (lo[open_] + hi[open_]) // 2
        not_after = times[mid] <= t[open_]
        lo[open_] = np.where(not_after, mid + 1, lo[open_])
        hi[open_] = np.where(not_after, hi[open_], mid)
        open_ = open_[lo[open_] < hi[open_]]
    return np.where(lo > start, lo - 1, NO_VERSION).astype(np.int64)


def prune(versions: Block, horizon: int, drop_tombstones: bool = False) -> Block:
    """The versions a tuple at `horizon` or later can still need: every version not older than
    the horizon, and of each key the newest older one.

    That newest one may be a tombstone: it is kept (a key's row stays deleted) unless
    `drop_tombstones`, which the caller may ask for only when no older version of the key
    can come back (the state layer, when it rewrites a group's versions whole). A version
    still to come is never older than the horizon (it would be late), so it can never turn
    an older one valid again."""
    if not len(versions):
        return versions
    keys, ts = versions[KEY], versions[TS]
    old = ts < horizon
    last_of_key = np.r_[keys[1:] != keys[:-1], True]
    # The newest old version of a key: old, and the next row is another key or not old.
    newest_old = old & (last_of_key | ~np.r_[old[1:], False])
    keep = ~old | (newest_old & ~versions[DELETED]) if drop_tombstones else ~old | newest_old
    return versions if keep.all() else versions.filter(keep)


def _results(plan: AsOfPlan, versions: Block, released: Block, now_ms: int) -> Block:
    at = valid_versions(versions, released)
    hit = at != NO_VERSION
    hit[hit] = ~versions[DELETED][at[hit]]
    # A tuple and its version are a combination like any other: the equi-join's assembly writes it.
    pair = JoinPlan((plan.stream, plan.table), plan.stream_lateness_ms, exact_keys=True)
    found = released.filter(hit)
    joined = assemble(pair, [found, versions.take(at[hit])], {0: np.arange(len(found)), 1: np.arange(len(found))},
                      now_ms)
    if plan.join_type == "inner":
        return joined
    alone = padded((plan.stream.name, plan.table.name), (plan.stream.topic, plan.table.topic),
                   [released.take(np.empty(0, np.int64)), versions.take(np.empty(0, np.int64))],
                   [plan.stream.payload, plan.table.payload], 0, released.filter(~hit), now_ms)
    return concat([joined, alone])


def _sorted(block: Block, by: tuple[str, str, str]) -> Block:
    return block.take(np.lexsort(tuple(block[c] for c in by)))


def _rows(block: Block, start: int, stop: int) -> Block:
    """Rows start..stop of `block`, as views (no copy)."""
    return Block({k: v[start:stop] for k, v in block.columns.items()})


def _watermark(max_ts: int, lateness_ms: int) -> int:
    return max_ts - lateness_ms if max_ts > NO_TIME else NO_TIME



@dataclass
class AsOfWindow:
    """A group's as-of state as the hash worker holds any group's window: its clocks and sizes
    in the job's stream order (`table` is the table's index), and no rows waiting for a
    deadline (`matched` is empty: a left join decides a tuple when it is released)."""

    plan: AsOfPlan
    state: AsOfState
    table: int
    matched: dict = field(default_factory=dict)

    @property
    def max_ts(self) -> list[int]:
        pair = [self.state.stream_max_ts, self.state.table_max_ts]
        return pair if self.table == 1 else pair[::-1]

    @property
    def watermark(self) -> int:
        """The table's watermark: every stream tuple older than it has been joined (what a
        group's commit records, and what `verify` decides by)."""
        return self.state.watermarks(self.plan)[1]

    @property
    def nbytes(self) -> int:
        return self.state.versions.nbytes + self.state.waiting.nbytes

    @property
    def tuples(self) -> int:
        return len(self.state.versions) + len(self.state.waiting)

    @property
    def awaiting(self) -> int:
        """Stream tuples waiting for the table's watermark."""
        return len(self.state.waiting)

    def next_deadline(self, plan: object) -> int | None:
        return None


def process_asof_window(window: AsOfWindow, deltas: list[Block], now_ms: int) -> BatchOutcome:
    """`process_asof_batch` for the hash worker: `deltas` and the outcome's lists in the job's
    stream order; a table block without `DELETED` holds versions only."""
    t = window.table
    table = deltas[t]
    if DELETED not in table.columns:
        table = Block(dict(table.columns) | {DELETED: np.zeros(len(table), np.bool_)})
    before = window.watermark
    outcome = process_asof_batch(window.plan, window.state, deltas[1 - t], table, now_ms)
    late = [outcome.late_stream, outcome.late_table]
    accepted = outcome.accepted
    if t == 0:
        late, accepted = late[::-1], accepted[::-1]
    return BatchOutcome(outcome.results, late, before, window.watermark, accepted,
                        unmatched=int((outcome.results[f"{window.plan.table.name}.partition"] == ABSENT).sum())
                        if window.plan.join_type == "left" else 0)
