"""One SplitJoin core (the SplitJoin paper's Algorithms 2-4), a released batch at a time.

For every release of the input order, top-down:
  1. store: the tuples this core owns under the schedule join its sub-windows;
  2. probe: every tuple of the release probes the other stream's sub-window as it
     stood at the tuple's arrival (partners before it in the global order, inside
     the window); a pair is found once, by the core that stores its older member;
  3. expire: what no later tuple can join leaves (time windows below the
     watermark minus the window, count windows past the stream's count: the
     paper's active and passive expiry, per block);
  4. punctuate: every result whose probing tuple is below `through` is out.

Results carry both members' global sequence numbers (`<stream>._g`), which the
merger orders by and strips. Two streams: a pair is owned by the core of its
older member; with more, a combination's members have different owners.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from streamjoin.engine.block import TS, Block, concat
from streamjoin.engine.psp.node import assemble, trigger_rows
from streamjoin.engine.psp.plan import RingPlan
from streamjoin.engine.psp.probe import ProbeFailures, extend
from streamjoin.engine.psp.slices import GLOBAL_SEQ, STREAM_SEQ, NodeSlices
from streamjoin.engine.splitjoin.input_order import Horizon
from streamjoin.engine.splitjoin.schedule import Schedule


def splitjoin_plan(plan: RingPlan) -> RingPlan:
    """The query as a core runs it: two streams, each result carrying its members' `_g`."""
    if plan.m != 2:
        raise ValueError(f"SplitJoin joins two streams, got {plan.m}")
    streams = tuple(s if GLOBAL_SEQ in s.payload else dataclasses.replace(s, payload=s.payload + (GLOBAL_SEQ,))
                    for s in plan.streams)
    return dataclasses.replace(plan, streams=streams)


def sequence_columns(plan: RingPlan) -> tuple[str, str]:
    """The result columns holding each member's global sequence number."""
    return tuple(f"{s.name}.{GLOBAL_SEQ}" for s in plan.streams)  # type: ignore[return-value]


@dataclass
class CoreOutput:
    results: Block  # the result block every mode writes, plus `<stream>._g` per member
    through: int  # every result whose probing tuple's sequence is below this is in this output or an earlier one
    punctuation: int | None  # `through` at the job's precision (None: unordered, no punctuation)
    retired: bool  # this core stores nothing now and holds nothing: it makes no results until it stores again
    schedule: Schedule  # the storage schedule as this core knows it (the merger learns switches from it)
    failures: ProbeFailures = field(default_factory=ProbeFailures)
    stored: list[int] = field(default_factory=list)  # per stream, tuples this release gave the core's share


class SplitCore:
    def __init__(self, plan: RingPlan, position: int, schedule: Schedule, templates: list[Block],
                 punctuate_every: int) -> None:
        """plan: the query (see splitjoin_plan); position: this core's index; templates: an
        empty block per stream with the input order's columns; punctuate_every: the
        precision (1 = after every tuple, n = every n tuples, 0 = no punctuation)."""
        if position < 0 or punctuate_every < 0:
            raise ValueError(f"position and punctuate_every must be >= 0, got {position}, {punctuate_every}")
        self.plan = splitjoin_plan(plan)
        self.position, self.schedule, self.punctuate_every = position, schedule, punctuate_every
        self.windows = NodeSlices.empty(templates)
        self.batch = 0  # the slices' round: one per processed release
        self.through = 0

    def switch(self, schedule: Schedule) -> None:
        """A schedule that changes nothing this core has already stored by: its epochs
        below the core's position are the ones it ran."""
        if schedule.before(self.through) != self.schedule.before(self.through):
            raise ValueError(f"a switch behind this core (at {self.through}): "
                             f"{schedule.epochs} against {self.schedule.epochs}")
        self.schedule = schedule

    def process(self, tuples: list[Block], horizon: Horizon, now_ms: int, caught_up: bool = False) -> CoreOutput:
        """tuples: one release of the input order, per stream (sorted by `_g`); horizon: the
        input order's position after it; caught_up: nothing more is waiting to be read, so
        punctuate exactly here (the last results of a quiet input do not wait for the next
        multiple of the precision)."""
        out = CoreOutput(Block(), self.through, None, False, self.schedule)
        out.stored = self._store(tuples)  # counted before the expiry: a release may expire its own tuples
        out.results = self._probe(tuples, now_ms, out.failures)
        self._expire(horizon)
        self.through = horizon.next_g
        out.through = self.through
        if self.punctuate_every:
            out.punctuation = self.through if caught_up else self.through // self.punctuate_every * self.punctuate_every
        out.retired = self.retired
        self.batch += 1
        return out

    def _store(self, tuples: list[Block]) -> list[int]:
        """Insert this core's share of each stream's tuples; returns how many, per stream."""
        stored = [0] * len(tuples)
        for j, block in enumerate(tuples):
            if len(block):
                mine = self.schedule.owners(block[GLOBAL_SEQ], block[STREAM_SEQ]) == self.position
                share = block.filter(mine)
                self.windows.streams[j].insert(share, self.batch)
                stored[j] = len(share)
        return stored

    def _probe(self, tuples: list[Block], now_ms: int, failures: ProbeFailures) -> Block:
        parts = []
        for trigger, block in enumerate(tuples):
            partner = 1 - trigger
            if not len(block) or not len(self.windows.streams[partner].rows):
                continue
            rows = trigger_rows(self.plan, trigger, block)
            grown = extend(self.plan, rows, trigger, frozenset({trigger}), partner,
                           self.windows.streams[partner].access(self.batch), failures)
            if len(grown):
                parts.append(assemble(self.plan, grown, now_ms))
        return concat(parts)

    def _expire(self, horizon: Horizon) -> None:
        """Tuples no later release can join become invisible from the next batch on and are dropped."""
        for j, window in enumerate(self.windows.streams):
            if not len(window.rows):
                continue
            stream = self.plan.streams[j]
            if stream.rows_window:
                gone = window.rows[STREAM_SEQ] <= horizon.counts[j] - stream.size
            else:
                gone = window.rows[TS] <= horizon.watermark - stream.size
            window.retire(gone, self.batch + 1)
        self.windows.collect(self.batch + 1)

    @property
    def retired(self) -> bool:
        return self.position >= self.schedule.cores_at(self.through) and self.windows.tuples == 0

    @property
    def state_tuples(self) -> int:
        return self.windows.tuples

