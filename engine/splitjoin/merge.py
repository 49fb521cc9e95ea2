"""The merger's ordering (the SplitJoin paper, section 5: relaxed adjustable punctuation).

Each core reports, with its results, a punctuation: every result whose probing
tuple's global sequence is below it has been written. A result can leave once
every core that may still make a result below it has punctuated past it; the
merger then releases everything below that frontier in input order: by the
probing (younger) member's sequence, ties by the partner's. So output order is
strict at any precision; the precision sets how far apart the frontier's steps
are (latency and punctuation traffic), not how ordered the output is.

Which cores may still make results comes from the schedule: a core that has
not reported yet holds the frontier at its first epoch's start (it stores
nothing before, so it finds nothing below it); a core that retired (no window,
not storing) holds nothing until the start of a later epoch that has it again.
With no punctuation (precision 0) results leave as they come, unordered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import Block, concat
from streamjoin.engine.splitjoin.schedule import Schedule

NO_LIMIT = np.iinfo(np.int64).max


@dataclass
class CoreMark:
    punctuation: int = 0
    retired: bool = False
    reported: bool = False


@dataclass
class OrderedMerge:
    schedule: Schedule
    sequence_columns: tuple[str, str]  # each member's global sequence column in a result block
    ordered: bool = True  # False: precision 0, results leave as they come
    marks: dict[int, CoreMark] = field(default_factory=dict)
    buffered: list[Block] = field(default_factory=list)
    released_below: int = 0  # every result below this has left

    def learn(self, schedule: Schedule) -> None:
        """A core's schedule: the one with the most switches is the job's (every core derives the same ones)."""
        if schedule.switches > self.schedule.switches:
            self.schedule = schedule

    def add(self, core: int, results: Block, punctuation: int | None, retired: bool) -> None:
        """One core output, in the order the core wrote them."""
        if len(results):
            self.buffered.append(results)
        mark = self.marks.setdefault(core, CoreMark())
        if punctuation is not None:
            mark.punctuation = max(mark.punctuation, punctuation)
        mark.retired, mark.reported = retired, True

    def frontier(self) -> int:
        """Every result whose probing tuple's sequence is below this has arrived."""
        if not self.ordered:
            return NO_LIMIT
        return min((self._holds(c) for c in range(self.schedule.max_cores)), default=NO_LIMIT)

    def _holds(self, core: int) -> int:
        mark = self.marks.get(core)
        if mark is None or not mark.reported:
            first = self.schedule.first_epoch_of(core)
            return NO_LIMIT if first is None else first
        if not mark.retired:
            return mark.punctuation
        # Retired under the schedule it knew: it holds nothing until it stores again (under the newest).
        again = self.schedule.stores_after(core, mark.punctuation)
        return NO_LIMIT if again is None else again

    def release(self) -> Block:
        """The results below the frontier, in input order. The frontier moves with punctuations
        alone: a core's last punctuation often comes with no result."""
        limit = self.frontier()
        if limit != NO_LIMIT:
            self.released_below = max(self.released_below, limit)
        if not self.buffered:
            return Block()
        block = concat(self.buffered)
        probing, partner = self.order_keys(block)
        ready = probing < limit
        self.buffered = [block.filter(~ready)] if not ready.all() else []
        if not self.ordered:
            return block
        at = np.flatnonzero(ready)
        return block.take(at[np.lexsort((partner[at], probing[at]))])

    def order_keys(self, block: Block) -> tuple[np.ndarray, np.ndarray]:
        """(probing member's sequence, partner's sequence) of each result."""
        first, second = (block[c] for c in self.sequence_columns)
        return np.maximum(first, second), np.minimum(first, second)

    @property
    def held(self) -> int:
        return sum(len(b) for b in self.buffered)
