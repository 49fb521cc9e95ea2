"""Ring crash recovery, the engine's part (the PSP paper has none).

The ring's state is the window of released tuples, spread over the nodes by
their bounds; the head releases every round's tuples into a round log first
(a Kafka topic in the services), so the log holds every tuple the ring ever
saw, numbered by the sequencer (`_sseq` per stream). That makes a node's state
cheap to checkpoint: when no round is in flight, a node's slice of stream j is
the set of tuples of j it holds, and since tuples move head -> tail oldest
first and leave by age (a prefix in `_sseq` order), that set is one run of
`_sseq`, or a few after a hand-off. A checkpoint is those runs (`Ranges`) per
node, plus the head's own state; restoring a node reads the round log and
keeps the tuples whose `_sseq` falls in its runs.

Rolling back: every node restores the last checkpoint (taken after round
`next_round - 1` ended and before `next_round` was released), then the head
releases the logged rounds after it again, in their order and each only once
the rounds below its `done_below` have ended again (`Redrive`): they carry
the same tuples and RoundInfo, so every node computes what it computed before
the crash, and results (deterministic ids) already written are skipped by the
writer. `valid_rounds` picks, from a log that several epochs have written, the
rounds the ring really ran.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from streamjoin.engine.block import Block, concat
from streamjoin.engine.psp.messages import Probe
from streamjoin.engine.psp.slices import STREAM_SEQ, NodeSlices

Runs = tuple[tuple[int, int], ...]  # [lo, hi) runs of _sseq, ascending
Ranges = tuple[Runs, ...]  # per stream


def runs_of(values: np.ndarray) -> Runs:
    """Sorted distinct integers as [lo, hi) runs of consecutive values."""
    if not len(values):
        return ()
    values = np.unique(values)
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(values)]])
    return tuple((int(values[a]), int(values[b - 1]) + 1) for a, b in zip(starts, ends))


def in_runs(values: np.ndarray, runs: Runs) -> np.ndarray:
    """Which of `values` fall in one of `runs` (vectorised: runs are disjoint and ascending)."""
    if not runs or not len(values):
        return np.zeros(len(values), bool)
    lo = np.array([r[0] for r in runs], np.int64)
    hi = np.array([r[1] for r in runs], np.int64)
    at = np.searchsorted(lo, values, side="right") - 1
    inside = at >= 0
    inside[inside] = values[inside] < hi[at[inside]]
    return inside


def slice_ranges(slices: NodeSlices, rnd: int) -> Ranges:
    """What a node holds for round `rnd` on: per stream, the runs of `_sseq` visible to it."""
    return tuple(runs_of(s.rows[STREAM_SEQ][s.visible(rnd)]) for s in slices.streams)


def rebuild(templates: list[Block], ranges: Ranges | None, logged: Iterable[Sequence[Block]]) -> NodeSlices:
    """A node's slices from a checkpoint: the tuples of the `logged` rounds (per round, one block
    per stream, in round order) whose `_sseq` is in the node's `ranges` (None: it held nothing).

    The rows are visible from round 0: rounds before the checkpoint never run again."""
    slices = NodeSlices.empty(templates)
    if ranges is None or not any(ranges):
        return slices
    kept: list[list[Block]] = [[] for _ in templates]
    for blocks in logged:
        for j, block in enumerate(blocks):
            if ranges[j] and len(block):
                mask = in_runs(block[STREAM_SEQ], ranges[j])
                if mask.any():
                    kept[j].append(block.filter(mask))
    for j, parts in enumerate(kept):
        if parts:
            slices.streams[j].insert(concat(parts), 0)
    return slices


@dataclass(frozen=True)
class LoggedRound:
    """One record of the round log: the epoch that wrote it, the round, and what the head's
    state was after releasing it (opaque here: the services' HeadState)."""

    epoch: int
    probe: Probe
    head: dict

    @property
    def round(self) -> int:
        return self.probe.info.round


def valid_rounds(records: Iterable[LoggedRound], after_round: int) -> list[LoggedRound]:
    """The rounds the ring ran after round `after_round - 1`, from log records in log order.

    Several epochs write the log: after a rollback the head of the new epoch releases the
    logged rounds again without logging them, then logs its own. A record of a later epoch
    for round r supersedes whatever earlier epochs logged for r and after (a head that had
    not yet seen the rollback may have logged them); a record of an older epoch than one
    already accepted is such a late write and is skipped."""
    out: list[LoggedRound] = []
    top = -1
    for rec in records:
        if rec.round < after_round or rec.epoch < top:
            continue
        top = rec.epoch
        while out and out[-1].round >= rec.round:
            out.pop()
        if rec.round == (out[-1].round + 1 if out else after_round):
            out.append(rec)
    return out


class Redrive:
    """Logged rounds released again after a rollback, in order: round r goes only once every
    round below its `done_below` has ended again, as when it was first released (nodes
    forget state no round below done_below can see)."""

    def __init__(self, rounds: Sequence[LoggedRound]) -> None:
        self.queue: deque[LoggedRound] = deque(rounds)
        self.total = len(self.queue)

    def __len__(self) -> int:
        return len(self.queue)

    def ready(self, in_flight: Iterable[int]) -> LoggedRound | None:
        """The next round to release, once every round below its `done_below` has ended again
        (`in_flight`: the rounds released again and not ended yet)."""
        if not self.queue:
            return None
        lowest_open = min(in_flight, default=self.queue[0].round)
        if self.queue[0].probe.info.done_below <= lowest_open:
            return self.queue.popleft()
        return None
