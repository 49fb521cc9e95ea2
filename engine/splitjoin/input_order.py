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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from streamjoin.engine.block import PART, TS, Block
from streamjoin.engine.psp.head import Sequencer, concat_pending, release_before

NOTHING_YET = np.iinfo(np.int64).min // 4  # newest time of a partition that has shown nothing


@dataclass(frozen=True)
class Horizon:
    """Where the sequence stands after a release: no later tuple has a global sequence
    below `next_g`, an event time below `watermark`, or lowers any stream's count."""

    next_g: int
    watermark: int
    counts: tuple[int, ...]


class InputOrder:
    def __init__(self, partitions: Sequence[int], lateness_ms: int, templates: Sequence[Block]) -> None:
        """partitions: source partitions per stream; lateness_ms: the allowed lateness;
        templates: an empty block per stream with the columns its tuples carry."""
        if len(partitions) != len(templates) or min(partitions, default=0) < 1:
            raise ValueError(f"one partition count >= 1 per stream, got {list(partitions)}")
        self.lateness = int(lateness_ms)
        self.newest = [np.full(n, NOTHING_YET, np.int64) for n in partitions]
        self.pending = [t.take(np.empty(0, np.int64)) for t in templates]
        self.sequencer = Sequencer(len(partitions))

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

    @property
    def watermark(self) -> int:
        return int(min(n.min() for n in self.newest)) - self.lateness

    def release(self) -> list[Block]:
        """Per stream, the tuples below the watermark, numbered in the global order."""
        released, self.pending = release_before(self.pending, self.watermark)
        return self.sequencer.sequence(released)

    def horizon(self) -> Horizon:
        return Horizon(self.sequencer.next_g, self.watermark, tuple(self.sequencer.counts))

    @property
    def held(self) -> int:
        """Tuples read and not released yet."""
        return sum(len(b) for b in self.pending)
