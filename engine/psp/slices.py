"""One ring node's slice of every stream's window.

Tuples are never edited in place: each carries the rounds it is visible to,
[_from, _until). A tuple that moves on to the next node, expires at the tail
or is handed off stays here, invisible to later rounds, until every round that
may still see it has ended (seed 004's StateStart/StateEnd marks, section 4.4,
expressed as round numbers so interleaved rounds each see a consistent,
disjoint slice). Each stream's slice is kept sorted by the global sequence
`_g`, so time and count windows are contiguous ranges of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.block import TS, Block, concat

G, SSEQ, FROM, UNTIL = "_g", "_sseq", "_from", "_until"
NEVER = np.iinfo(np.int64).max
_MARKS = (FROM, UNTIL)


def strip_marks(block: Block) -> Block:
    return Block({k: v for k, v in block.columns.items() if k not in _MARKS})


@dataclass
class StreamSlice:
    rows: Block  # sorted by _g; holds FROM/UNTIL marks
    # A round's view and its sorted orders are asked for by every message of the
    # round; they change only when the slice does, so they are kept until then.
    _views: dict[int, Block] = field(default_factory=dict, repr=False)
    _orders: dict[tuple[int, str], np.ndarray] = field(default_factory=dict, repr=False)

    def _changed(self) -> None:
        self._views.clear()
        self._orders.clear()

    def visible(self, rnd: int) -> np.ndarray:
        if not len(self.rows):
            return np.zeros(0, dtype=bool)
        return (self.rows[FROM] <= rnd) & (rnd < self.rows[UNTIL])

    def view(self, rnd: int) -> Block:
        if rnd not in self._views:
            self._views[rnd] = self.rows.filter(self.visible(rnd))
        return self._views[rnd]

    def sorted_by(self, rnd: int, column: str) -> np.ndarray:
        """Positions of round `rnd`'s view in ascending order of `column` (a band or equality index)."""
        key = (rnd, column)
        if key not in self._orders:
            self._orders[key] = np.argsort(self.view(rnd)[column], kind="stable")
        return self._orders[key]

    def insert(self, tuples: Block, from_round: int) -> None:
        if not len(tuples):
            return
        self._changed()
        marked = Block(dict(tuples.columns) | {FROM: np.full(len(tuples), from_round, np.int64),
                                              UNTIL: np.full(len(tuples), NEVER, np.int64)})
        merged = concat([self.rows, marked]) if len(self.rows) else marked
        if len(self.rows) and self.rows[G][-1] > tuples[G][0]:
            merged = merged.take(np.argsort(merged[G], kind="stable"))
        self.rows = merged

    def retire(self, mask: np.ndarray, until_round: int) -> Block:
        """Make the masked tuples invisible from `until_round` on; returns them, unmarked."""
        if not mask.any():
            return strip_marks(self.rows.take(np.empty(0, np.int64)))
        self._changed()
        until = self.rows[UNTIL].copy()
        until[mask] = np.minimum(until[mask], until_round)
        out = strip_marks(self.rows.filter(mask))
        self.rows = Block(dict(self.rows.columns) | {UNTIL: until})
        return out

    def collect(self, done_below: int) -> None:
        """Forget tuples no open round can see (rounds below `done_below` have all ended)."""
        if len(self.rows):
            keep = self.rows[UNTIL] > done_below
            if not keep.all():
                self._changed()
                self.rows = self.rows.filter(keep)


def ages(rows: Block, rows_window: bool, low_ts: int, count_before: int) -> np.ndarray:
    """Age of each tuple at a round: ms behind the round's low time, or newer tuples released before it."""
    return (count_before - rows[SSEQ]) if rows_window else (low_ts - rows[TS])


@dataclass
class NodeSlices:
    streams: list[StreamSlice]

    @classmethod
    def empty(cls, templates: list[Block]) -> "NodeSlices":
        return cls([StreamSlice(Block(dict(t.columns) | {FROM: np.empty(0, np.int64), UNTIL: np.empty(0, np.int64)}))
                    for t in templates])

    def collect(self, done_below: int) -> None:
        for s in self.streams:
            s.collect(done_below)

    @property
    def tuples(self) -> int:
        return sum(len(s.rows) for s in self.streams)

    @property
    def nbytes(self) -> int:
        return sum(s.rows.nbytes for s in self.streams)

    def visible_tuples(self, rnd: int) -> list[int]:
        return [int(s.visible(rnd).sum()) for s in self.streams]
