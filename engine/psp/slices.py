"""One ring node's slice of every stream's window.

Tuples are never edited in place: each carries the rounds it is visible to,
[_from, _until). A tuple that moves on to the next node, expires at the tail
or is handed off stays here, invisible to later rounds, until every round that
may still see it has ended (the PSP paper's StateStart/StateEnd marks, section 4.4,
expressed as round numbers so interleaved rounds each see a consistent,
disjoint slice). Each stream's slice is kept sorted by the global sequence
`_g`, so time and count windows are contiguous ranges of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import TS, Block, concat

# Columns a ring or SplitJoin core adds to each tuple. The global and per-stream sequence
# numbers travel in results (`<stream>._g`) and checkpoints, so their names stay as they are.
GLOBAL_SEQ = "_g"  # the tuple's place in the one input order of all streams
STREAM_SEQ = "_sseq"  # its place (1-based) in its own stream
FROM, UNTIL = "_from", "_until"  # the rounds [FROM, UNTIL) that see the tuple
NEVER = np.iinfo(np.int64).max
MIN_ROOM = 1024  # rows of storage a slice starts with
_MARKS = (FROM, UNTIL)


def strip_marks(block: Block) -> Block:
    return Block({k: v for k, v in block.columns.items() if k not in _MARKS})


@dataclass
class SortedIndex:
    """One column's stable sort over all of a slice's rows (not one round's view),
    with companion columns permuted the same way. Kept up to date as rows are
    appended and collected, so a round's band/equality index costs a filter and
    a merge, not a sort of the whole slice (the slice is far larger than a round)."""

    order: np.ndarray  # row positions ascending by the column, ties by position (a stable sort)
    columns: dict[str, np.ndarray]  # the key column and companions, each in that order

    @classmethod
    def build(cls, rows: Block, by: str) -> "SortedIndex":
        order = np.argsort(rows[by], kind="stable")
        return cls(order, {by: rows[by][order]})

    def companion(self, storage: dict[str, np.ndarray], column: str) -> np.ndarray:
        """`column` in this index's order (computed once, then kept up to date)."""
        if column not in self.columns:
            self.columns[column] = storage[column][self.order]
        return self.columns[column]

    def appended(self, by: str, start: int, new: Block) -> "SortedIndex":
        """After rows `new` were appended at positions start..: merge them in. side='right' puts
        each after the equal values already there, i.e. after them by position, as a stable sort does."""
        local = np.argsort(new[by], kind="stable")
        at = np.searchsorted(self.columns[by], new[by][local], side="right")
        return SortedIndex(np.insert(self.order, at, start + local),
                           {c: _insert(v, at, new[c][local]) for c, v in self.columns.items()})

    def kept(self, keep: np.ndarray, lo: int) -> "SortedIndex":
        """After storage was rebuilt from rows lo.. filtered by `keep`: drop the other
        entries (including those below lo, already gone) and renumber the rest from 0."""
        rel = self.order - lo
        k = rel >= 0
        k[k] = keep[rel[k]]
        renumber = np.cumsum(keep) - 1
        return SortedIndex(renumber[rel[k]], {c: v[k] for c, v in self.columns.items()})


def _insert(values: np.ndarray, at: np.ndarray, new: np.ndarray) -> np.ndarray:
    """np.insert that widens the dtype as concatenation would (a 'U1' template meeting 'U20' tuples)."""
    return np.insert(values.astype(np.promote_types(values.dtype, new.dtype), copy=False), at, new)


def _run(mask: np.ndarray) -> tuple[int, int] | None:
    """[a, b) when the mask's true positions are one contiguous run (or none), else None.
    Visibility is nearly always a run: rows are in global order, tuples leave oldest first
    and enter newest last, so a round's view is usually a zero-copy slice."""
    n = int(np.count_nonzero(mask))
    if n == 0:
        return 0, 0
    a = int(np.argmax(mask))
    return (a, a + n) if mask[a:a + n].all() else None


def _select(block: Block, mask: np.ndarray) -> Block:
    """block.filter(mask), zero-copy when the mask is one run (columns are never written in place)."""
    run = _run(mask)
    if run is None:
        return block.filter(mask)
    a, b = run
    return Block({k: v[a:b] for k, v in block.columns.items()})


@dataclass
class RoundAccess:
    """One round's view of a stream slice and its sorted indexes, for the probe."""

    slice: "StreamSlice"
    rnd: int

    @property
    def block(self) -> Block:
        return self.slice.view(self.rnd)

    def order(self, by: str) -> np.ndarray:
        """View positions ascending by `by`."""
        return self.slice.sorted_by(self.rnd, by)

    def in_order(self, by: str, column: str) -> np.ndarray:
        """The view's `column` in ascending order of `by`: view[column][order(by)]."""
        return self.slice.in_order(self.rnd, by, column)


@dataclass
class StreamSlice:
    """One stream's slice on one node.

    Rows live in storage with room to grow (doubling): a round appends its tuples
    in place and the oldest leave by moving the start forward, so neither copies
    the slice, which is far larger than a round. Nothing below the end is ever
    rewritten except the UNTIL marks (no reader of a handed-out view uses them),
    so views and moved tuples can share the storage. Sorted indexes (see
    SortedIndex) hold storage positions; entries below the start are stale and
    drop out when the storage is rebuilt."""

    rows: Block  # sorted by _g; holds FROM/UNTIL marks: a view of storage[_lo:_hi]
    # A round's view and its sorted orders are asked for by every message of the
    # round; they change only when the slice does, so they are kept until then.
    _views: dict[int, Block] = field(default_factory=dict, repr=False)
    _visible: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _masks: dict[tuple[int, str], np.ndarray | None] = field(default_factory=dict, repr=False)
    _orders: dict[tuple[int, str], np.ndarray] = field(default_factory=dict, repr=False)
    _in_order: dict[tuple[int, str, str], np.ndarray] = field(default_factory=dict, repr=False)
    _indexes: dict[str, SortedIndex] = field(default_factory=dict, repr=False)
    _storage: dict[str, np.ndarray] = field(init=False, repr=False)
    _lo: int = field(init=False, default=0)
    _hi: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._adopt(self.rows)

    def _adopt(self, rows: Block) -> None:
        """Storage holding exactly `rows` (the first append makes room). UNTIL is copied:
        it is the one column written in place, and `rows` may share arrays with others."""
        self._storage = dict(rows.columns) | {UNTIL: rows[UNTIL].copy()}
        self._lo, self._hi = 0, len(rows)
        self._indexes.clear()
        self._sync()

    def _sync(self) -> None:
        self.rows = Block({c: v[self._lo:self._hi] for c, v in self._storage.items()})

    def _forget_rounds_below(self, rnd: int) -> None:
        for cache in (self._views, self._visible, self._masks, self._orders, self._in_order):
            for key in [k for k in cache if (k if isinstance(k, int) else k[0]) < rnd]:
                del cache[key]

    def _changed(self) -> None:
        for cache in (self._views, self._visible, self._masks, self._orders, self._in_order):
            cache.clear()

    # ------------------------------------------------------------ round views
    def visible(self, rnd: int) -> np.ndarray:
        if not len(self.rows):
            return np.zeros(0, dtype=bool)
        if rnd not in self._visible:
            self._visible[rnd] = (self.rows[FROM] <= rnd) & (rnd < self.rows[UNTIL])
        return self._visible[rnd]

    def view(self, rnd: int) -> Block:
        if rnd not in self._views:
            self._views[rnd] = _select(self.rows, self.visible(rnd))
        return self._views[rnd]

    def access(self, rnd: int) -> RoundAccess:
        return RoundAccess(self, rnd)

    def _index(self, column: str) -> SortedIndex:
        if column not in self._indexes:
            index = SortedIndex.build(self.rows, column)
            self._indexes[column] = SortedIndex(index.order + self._lo, index.columns)
        return self._indexes[column]

    def _in_view(self, rnd: int, by: str) -> np.ndarray | None:
        """Which entries of the index on `by` are in round rnd's view (None: all)."""
        key = (rnd, by)
        if key not in self._masks:
            order, visible = self._index(by).order, self.visible(rnd)
            run = _run(visible)
            if run == (0, len(visible)) and len(order) == len(visible):
                mask = None
            elif run is not None:
                mask = (order >= self._lo + run[0]) & (order < self._lo + run[1])
            else:
                rel = order - self._lo
                mask = rel >= 0
                mask[mask] = visible[rel[mask]]
            self._masks[key] = mask
        return self._masks[key]

    def sorted_by(self, rnd: int, column: str) -> np.ndarray:
        """Positions of round `rnd`'s view in ascending order of `column` (a band or equality index):
        what a stable argsort of the view's column gives, read off the slice's index."""
        key = (rnd, column)
        if key not in self._orders:
            order, mask = self._index(column).order, self._in_view(rnd, column)
            rel = (order if mask is None else order[mask]) - self._lo
            run = _run(self.visible(rnd))
            self._orders[key] = rel - run[0] if run is not None else (np.cumsum(self.visible(rnd)) - 1)[rel]
        return self._orders[key]

    def in_order(self, rnd: int, by: str, column: str) -> np.ndarray:
        """Round rnd's view of `column`, in ascending order of `by`: view[column][sorted_by(rnd, by)]."""
        key = (rnd, by, column)
        if key not in self._in_order:
            values = self._index(by).companion(self._storage, column)
            mask = self._in_view(rnd, by)
            self._in_order[key] = values if mask is None else values[mask]
        return self._in_order[key]

    # ---------------------------------------------------------------- changes
    def insert(self, tuples: Block, from_round: int) -> None:
        if not len(tuples):
            return
        self._changed()
        marked = Block(dict(tuples.columns) | {FROM: np.full(len(tuples), from_round, np.int64),
                                              UNTIL: np.full(len(tuples), NEVER, np.int64)})
        if len(self.rows) and self.rows[GLOBAL_SEQ][-1] > tuples[GLOBAL_SEQ][0]:
            merged = concat([self.rows, marked])
            self._adopt(merged.take(np.argsort(merged[GLOBAL_SEQ], kind="stable")))
            return
        self._make_room(marked)
        start, end = self._hi, self._hi + len(marked)
        for c, v in self._storage.items():
            v[start:end] = marked[c]
        self._indexes = {c: ix.appended(c, start, marked) for c, ix in self._indexes.items()}
        self._hi = end
        self._sync()

    def _make_room(self, new: Block) -> None:
        """Fresh storage, twice the live rows, when `new` does not fit behind them (or needs a wider dtype)."""
        fits = all(len(v) >= self._hi + len(new) and np.promote_types(v.dtype, new[c].dtype) == v.dtype
                   for c, v in self._storage.items())
        if fits:
            return
        live = self._hi - self._lo
        room = max(2 * (live + len(new)), MIN_ROOM)
        storage = {}
        for c, v in self._storage.items():
            storage[c] = np.empty(room, np.promote_types(v.dtype, new[c].dtype))
            storage[c][:live] = v[self._lo:self._hi]
        everything = np.ones(live, dtype=bool)
        self._indexes = {c: ix.kept(everything, self._lo) for c, ix in self._indexes.items()}
        self._storage, self._lo, self._hi = storage, 0, live

    def retire(self, mask: np.ndarray, until_round: int) -> Block:
        """Make the masked tuples invisible from `until_round` on; returns them, unmarked."""
        if not mask.any():
            return strip_marks(self.rows.take(np.empty(0, np.int64)))
        self._changed()
        until = self.rows[UNTIL]  # a view of the storage: marked in place
        until[mask] = np.minimum(until[mask], until_round)
        return strip_marks(_select(self.rows, mask))

    def collect(self, done_below: int) -> None:
        """Forget tuples no open round can see (rounds below `done_below` have all ended),
        and what was kept for those rounds (a slice unchanged over many rounds would pile up
        a view per round)."""
        self._forget_rounds_below(done_below)
        if not len(self.rows):
            return
        keep = self.rows[UNTIL] > done_below
        if keep.all():
            return
        self._changed()
        run = _run(keep)
        if run is not None and (run[1] == len(keep) or run == (0, 0)):
            self._lo = self._hi if run == (0, 0) else self._lo + run[0]  # the oldest leave: move the start
            self._sync()
            return
        indexes = {c: ix.kept(keep, self._lo) for c, ix in self._indexes.items()}
        self._adopt(self.rows.filter(keep))
        self._indexes = indexes


def ages(rows: Block, rows_window: bool, low_ts: int, count_before: int) -> np.ndarray:
    """Age of each tuple at a round: ms behind the round's low time, or newer tuples released before it."""
    return (count_before - rows[STREAM_SEQ]) if rows_window else (low_ts - rows[TS])


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
