"""Every core's identical merge of the source partitions into one numbered sequence.

SplitJoin's input is one ordered sequence that every core reads (Kafka is the
broadcast tree). With several source partitions, each core merges them itself,
so the merge must give every core the same sequence whatever order and batch
sizes its fetches come in:

* order: (ts, stream, partition, offset), numbered by `Sequencer` (global `_g`,
  per-stream `_sseq`, per-stream counts on every tuple);
* release: a tuple leaves once it is below the data-driven watermark, the
  minimum over every source partition of (newest event time read - lateness);
  a partition that has shown nothing holds the watermark at its start;
* lateness: a tuple is late when its event time is below (the newest event time
  earlier in its own partition - lateness). That depends on its partition's
  prefix only, never on how far other partitions were read, and a tuple that is
  not late is never below the watermark at its arrival, so every core releases
  prefixes of one total order and dead-letters the same tuples.

Idle partitions cannot be decided by a wall clock here (cores would decide
differently); a mark record written into the partition (`advance`) moves its
newest time the same way for every core.

Changing the number of cores works the same way: a scale mark with one id is
written into every source partition. Once a core has read it in all of them,
the threshold T is the newest event time any partition showed before its mark,
and the new modulus applies from the first released tuple later than T. No
core can release such a tuple earlier: while one partition's mark is unread,
that partition's newest time (at most T) bounds the watermark. So every core
switches at the same sequence number, with no one telling it where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from streamjoin.engine.block import PART, TS, Block
from streamjoin.engine.psp.head import Sequencer, concat_pending, release_before
from streamjoin.engine.psp.slices import GLOBAL_SEQ
from streamjoin.engine.splitjoin.schedule import Schedule

NOTHING_YET = np.iinfo(np.int64).min // 4  # newest time of a partition that has shown nothing


@dataclass(frozen=True)
class Horizon:
    """Where the sequence stands after a release: no later tuple has a global sequence
    below `next_g`, an event time below `watermark`, or lowers any stream's count."""

    next_g: int
    watermark: int
    counts: tuple[int, ...]


@dataclass
class ScaleMark:
    """A scale mark read in some partitions: the newest time each showed before it."""

    cores: int
    newest_before: dict[tuple[int, int], int]


@dataclass(frozen=True)
class PendingSwitch:
    """A scale mark read everywhere: `cores` from the first released tuple later than `after_ts`."""

    mark_id: str
    after_ts: int
    cores: int


class InputOrder:
    def __init__(self, partitions: Sequence[int], lateness_ms: int, templates: Sequence[Block],
                 schedule: Schedule) -> None:
        """partitions: source partitions per stream; lateness_ms: the allowed lateness;
        templates: an empty block per stream with the columns its tuples carry; schedule:
        the storage schedule the run starts with (scale marks extend it)."""
        if len(partitions) != len(templates) or min(partitions, default=0) < 1:
            raise ValueError(f"one partition count >= 1 per stream, got {list(partitions)}")
        self.lateness = int(lateness_ms)
        self.newest = [np.full(n, NOTHING_YET, np.int64) for n in partitions]
        self.pending = [t.take(np.empty(0, np.int64)) for t in templates]
        self.sequencer = Sequencer(len(partitions))
        self.schedule = schedule
        self.marks: dict[str, ScaleMark] = {}  # scale marks not yet read in every partition
        self.switches: list[PendingSwitch] = []  # read everywhere, waiting for a tuple past their time
        self.done_marks: set[str] = set()  # ids of marks read everywhere (a repeated one changes nothing)

    def add(self, stream: int, block: Block) -> Block:
        """Take `block` (tuples of `stream`, each partition's in its offset order) and
        return its late tuples, which the caller dead-letters; the rest wait for release."""
        if not len(block):
            return block
        late = self._late(stream, block)
        self.pending = concat_pending(self.pending, [block.filter(~late) if k == stream else p.take(np.empty(0, np.int64))
                                                     for k, p in enumerate(self.pending)])
        return block.filter(late)

    def _late(self, stream: int, block: Block) -> np.ndarray:
        parts, ts = block[PART].astype(np.int64), block[TS]
        late = np.zeros(len(block), bool)
        newest = self.newest[stream]
        for p in np.unique(parts).tolist():  # a loop over partitions, not tuples
            at = np.flatnonzero(parts == p)
            seen = np.maximum.accumulate(np.concatenate([newest[p:p + 1], ts[at]]))
            late[at] = ts[at] < seen[:-1] - self.lateness
            newest[p] = seen[-1]
        return late

    def advance(self, stream: int, partition: int, ts: int) -> None:
        """A mark record read in `partition` of `stream` at event time `ts` (it carries no tuple)."""
        self.newest[stream][partition] = max(int(self.newest[stream][partition]), int(ts))

    def scale_mark(self, stream: int, partition: int, mark_id: str, cores: int) -> None:
        """A scale mark read in `partition` of `stream`, between the tuples `add` was given
        before and after it. A mark's `cores` is the smallest any of its copies asks for
        (the same for every core, whatever order it reads the copies in)."""
        if mark_id in self.done_marks or cores < 1:
            return
        mark = self.marks.setdefault(mark_id, ScaleMark(cores, {}))
        mark.cores = min(mark.cores, cores)
        mark.newest_before.setdefault((stream, partition), int(self.newest[stream][partition]))
        if len(mark.newest_before) == sum(len(n) for n in self.newest):
            del self.marks[mark_id]
            self.done_marks.add(mark_id)
            self.switches.append(PendingSwitch(mark_id, max(mark.newest_before.values()), mark.cores))

    @property
    def watermark(self) -> int:
        return int(min(n.min() for n in self.newest)) - self.lateness

    def release(self) -> list[Block]:
        """Per stream, the tuples below the watermark, numbered in the global order; the
        schedule takes the switches whose first tuple is among them."""
        released, self.pending = release_before(self.pending, self.watermark)
        tuples = self.sequencer.sequence(released)
        while self.switches:
            switch = self.switches[0]
            later = [b[GLOBAL_SEQ][b[TS] > switch.after_ts] for b in tuples if len(b)]
            first = min((int(g.min()) for g in later if len(g)), default=None)
            if first is None:
                break
            self.schedule = self.schedule.switched(first, switch.cores)
            self.switches.pop(0)
        return tuples

    def horizon(self) -> Horizon:
        return Horizon(self.sequencer.next_g, self.watermark, tuple(self.sequencer.counts))

    @property
    def held(self) -> int:
        """Tuples read and not released yet."""
        return sum(len(b) for b in self.pending)
