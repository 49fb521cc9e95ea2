"""One stream's window as a few sorted runs merged in size tiers (LSM-like).

Each run is a block sorted by (key, ts, off). A batch becomes a new run; runs
are kept in arrival order, oldest first, each at least RATIO times the live
size of the next, so a merge at least multiplies a tuple's run size by 1.5:
every tuple is re-merged O(log n) times and there are O(log n) runs. A small
batch into a large window therefore touches the batch, not the window.

Expiry is a time floor: tuples older than it are dead. A run whose newest
tuple is below the floor is dropped whole; a run that straddles it keeps its
dead tuples (runs are sorted by key, not time, so trimming means copying)
until it merges or until most of it is dead, and every read masks them, so a
dead tuple is never seen. Each run keeps its timestamps sorted beside it,
which answers "how many are dead" with one binary search.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from streamjoin.engine import row_kernels
from streamjoin.engine.block import KEY, OFF, TS, Block, concat
from streamjoin.engine.probe import distinct, expand_ranges, key_ranges, sort_by_key_time

RATIO = 2  # a run is at least this many times the live size of the next (newer) one
_NUMPY_WIDTH = 8  # bytes a row up to which NumPy's own assignment merges a column as fast as a row kernel
NO_FLOOR = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Run:
    """An immutable block sorted by (key, ts, off) and its timestamps in ascending order."""

    block: Block
    times: np.ndarray  # block[TS] sorted

    @classmethod
    def of(cls, block: Block) -> "Run":
        """`block` must already be sorted by (key, ts, off)."""
        return cls(block, np.sort(block[TS]))

    def __len__(self) -> int:
        return len(self.block)

    def dead(self, floor: int) -> int:
        """How many of its tuples are older than `floor`."""
        return int(np.searchsorted(self.times, floor, side="left"))

    @cached_property
    def by_time(self) -> np.ndarray:
        """Positions of the block's tuples in `times` order: built on first use (only joins that
        decide rows at expiry ask), once per run, since a run never changes."""
        return np.argsort(self.block[TS], kind="stable")

    def alive(self, floor: int) -> int:
        """How many of its tuples are not older than `floor`."""
        return len(self) - self.dead(floor)

    def live(self, floor: int) -> "Run":
        """This run without the tuples older than `floor` (itself when none are)."""
        dead = self.dead(floor)
        if not dead:
            return self
        return Run(self.block.filter(self.block[TS] >= floor), self.times[dead:])


def merge_runs(older: Run, newer: Run) -> Run:
    """The two runs as one, in (key, ts, off) order; on equal triples `older` comes first,
    as a stable sort of their concatenation would put them."""
    return Run(merge_sorted(older.block, newer.block),
               np.sort(np.concatenate([older.times, newer.times]), kind="stable"))


def merge_sorted(older: Block, newer: Block, by: tuple[str, str, str] = (KEY, TS, OFF)) -> Block:
    """Two blocks, each sorted by the columns `by` (int64 each), as one in that order; on
    equal triples `older` comes first. Linear: the newer block's places are binary-searched in
    the older one, then every column is scattered once."""
    n, m = len(older), len(newer)
    at = _places(older, newer, by) + np.arange(m)
    from_older = np.ones(n + m, dtype=bool)
    from_older[at] = False
    return Block({name: _interleave(old, from_older, newer[name], at) for name, old in older.columns.items()})


def _interleave(old: np.ndarray, from_older: np.ndarray, new: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One column of the merged run: `old` where `from_older` is set, `new` at `at` (ascending).
    Wide columns of one dtype (text) move as rows of bytes in one pass (engine/row_kernels.py)."""
    out = np.empty(len(from_older), dtype=np.promote_types(old.dtype, new.dtype))
    if old.dtype == new.dtype and old.dtype.itemsize > _NUMPY_WIDTH and old.dtype.kind != "O":
        width = old.dtype.itemsize
        row_kernels.interleave_rows(np.ascontiguousarray(old).view(np.uint8).reshape(len(old), width),
                                    np.ascontiguousarray(new).view(np.uint8).reshape(len(new), width), at,
                                    out.view(np.uint8).reshape(len(out), width))
        return out
    out[from_older], out[at] = old, new
    return out


def _places(older: Block, newer: Block, by: tuple[str, str, str] = (KEY, TS, OFF)) -> np.ndarray:
    """For each row of `newer`, how many rows of `older` are <= it in `by` order ((key, ts,
    off) for runs). The first column is one searchsorted; within its equal rows, the other two
    are bisected for all rows at once (a structured-array searchsorted would compare field by
    field, about eight times slower on a 250k-row run into a 500k-row one)."""
    first, second, third = by
    lo = np.searchsorted(older[first], newer[first], side="left")
    hi = np.searchsorted(older[first], newer[first], side="right")
    ts, off = newer[second], newer[third]
    open_ = np.flatnonzero(lo < hi)
    while len(open_):
        mid = (lo[open_] + hi[open_]) // 2
        t_mid = older[second][mid]
        not_after = (t_mid < ts[open_]) | ((t_mid == ts[open_]) & (older[third][mid] <= off[open_]))
        lo[open_] = np.where(not_after, mid + 1, lo[open_])
        hi[open_] = np.where(not_after, hi[open_], mid)
        open_ = open_[lo[open_] < hi[open_]]
    return lo


class SortedRuns:
    """A stream's window: sorted runs, oldest first, and a time floor below which tuples are dead.

    `template`: an empty block with the stream's columns (what an empty window reads as).
    `copied` counts tuples written by merges and trims: the maintenance work done so far."""

    def __init__(self, template: Block) -> None:
        self.template = template
        self.runs: list[Run] = []
        self.floor = NO_FLOOR
        self.copied = 0

    def __len__(self) -> int:
        """Live tuples."""
        return sum(r.alive(self.floor) for r in self.runs)

    @property
    def nbytes(self) -> int:
        """Bytes held, dead tuples not yet dropped included."""
        return sum(r.block.nbytes + r.times.nbytes for r in self.runs)

    def add(self, block: Block) -> None:
        """Append a batch sorted by (key, ts, off) as the newest run (its tuples below the floor
        left out), then merge tiers."""
        run = self._trimmed(Run.of(block))
        if len(run):
            self.runs.append(run)
            self._settle()

    def expire_before(self, floor: int) -> None:
        """Tuples with ts < `floor` are dead from now on (the floor never moves back)."""
        self.floor = max(self.floor, floor)
        kept = []
        for run in self.runs:
            if run.times[-1] < self.floor:  # wholly dead: dropped without a copy
                continue
            if run.dead(self.floor) * 2 > len(run):  # mostly dead: copying the rest costs at most what is dropped
                run = self._trimmed(run)
            kept.append(run)
        self.runs = kept
        self._settle()

    def oldest(self) -> int | None:
        """The event time of the oldest live tuple (None: none live): one look per run."""
        firsts = [int(run.times[run.dead(self.floor)]) for run in self.runs if run.alive(self.floor)]
        return min(firsts, default=None)

    def expiring(self, floor: int) -> Block:
        """The live tuples a move of the floor to `floor` would kill (ts below it), in no
        particular order: each run's time order gives them without touching the others."""
        parts = []
        for run in self.runs:
            first, end = run.dead(self.floor), run.dead(floor)
            if end > first:
                parts.append(run.block.take(run.by_time[first:end]))
        return concat([self.template, *parts])

    def matching(self, keys: np.ndarray) -> Block:
        """The live tuples whose key is in `keys`, sorted by (key, ts, off): one binary search
        per run for the distinct keys, so the cost follows the probe and its matches."""
        wanted = distinct(keys)
        parts = []
        for run in self.runs:
            lo, hi = key_ranges(run.block[KEY], wanted)
            _, positions = expand_ranges(lo, hi)
            if len(positions):
                parts.append(run.block.take(positions))
        found = self._alive(concat([self.template, *parts]))
        return sort_by_key_time(found) if len(parts) > 1 else found

    def merged(self) -> Block:
        """The live tuples as one block sorted by (key, ts, off); leaves a single run behind,
        so a second call is free."""
        while len(self.runs) > 1:
            self.runs[-2:] = [self._merged(self.runs[-2], self.runs[-1])]
        self.runs = [run for run in map(self._trimmed, self.runs) if len(run)]
        return self.runs[0].block if self.runs else self.template

    def replace(self, block: Block) -> None:
        """Hold `block` (sorted by (key, ts, off), every tuple live) as the only run."""
        self.runs = [Run.of(block)] if len(block) else []

    def _alive(self, block: Block) -> Block:
        return block if self.floor == NO_FLOOR else block.filter(block[TS] >= self.floor)

    def _trimmed(self, run: Run) -> Run:
        live = run.live(self.floor)
        if live is not run:
            self.copied += len(live)
        return live

    def _settle(self) -> None:
        """Restore the tier invariant from the newest run back: merge a run into the older one
        while the older is under RATIO times its live size. A merge only grows the older run,
        so the pairs newer than it stay in order and one pass suffices."""
        i = len(self.runs) - 2
        while i >= 0:
            older, newer = self.runs[i], self.runs[i + 1]
            if older.alive(self.floor) < RATIO * newer.alive(self.floor):
                self.runs[i:i + 2] = [self._merged(older, newer)]
            i -= 1

    def _merged(self, older: Run, newer: Run) -> Run:
        run = merge_runs(older.live(self.floor), newer.live(self.floor))
        self.copied += len(run)
        return run
