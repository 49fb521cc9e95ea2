"""Splitting a hot join key over sub-groups, exactly: the symmetric fragment-replicate scheme
on a sliding-window join, on blocks.

One key of partition group g carries too much input for one worker. Its tuples of one
stream, the *fragmented* stream R, are spread over k sub-groups (g itself and k - 1 *slots*,
groups of their own placed on other workers); its tuples of the other stream, S, go to g and
to every slot. A pair (r, s) of the key then meets in exactly one sub-group: r's. What the
worker around this keeps (services/hash/split.py) makes that hold over time:

* lateness and the watermark are judged once, in g, on every tuple, diverted or not
  (`process_batch`'s `divert`), so they are the unsplit group's; a slot judges nothing and
  takes g's watermark after each of g's batches;
* at the split, each slot gets the S tuples of the key g's window holds (`state_copy`) before
  any later tuple: a new R tuple in a slot meets the older S tuples it would have met in g;
* a merge first stops spreading (new R tuples stay in g) and keeps replicating S until g's
  watermark, before a batch, has passed the newest R tuple sent to a slot plus R's window
  (`drained`): no later S tuple can join an R tuple a slot holds.

This module owns the pieces that are functions of blocks: which rows are of the split key
(`hot_rows`), the sub-group of each R tuple (`fragment_of`: from its identity, so a replay
spreads it the same way), a batch's on-time tuples cut into what g joins and what each slot
gets (`Route`, `divert`), the copy at the split, and the drain's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from streamjoin.engine.block import KEY, OFF, PART, TS, WIN, Block
from streamjoin.engine.lateness import NO_TIME
from streamjoin.engine.result_ids import mix
from streamjoin.engine.runs import SortedRuns
from streamjoin.engine.window_instances import mix_key


@dataclass(frozen=True)
class Route:
    """How one split key's on-time tuples of a batch go: `key` (the KEY column's value of a
    source tuple), `slots` (k - 1 sub-groups besides the group itself), `fragment` (the stream
    spread over the k sub-groups; the other goes to all), `spread` (False while a merge
    drains: new tuples of the fragmented stream stay in the group)."""

    key: int
    slots: int
    fragment: int
    spread: bool = True


def hot_rows(block: Block, key: int) -> np.ndarray:
    """Which tuples of `block` are of the split key: KEY equal to it, or for a tumbling or
    hopping window join's copies (WIN present) equal to it mixed with the copy's instance
    start (engine/window_instances.py). Partners have equal KEY and WIN, so the choice is
    the same on both sides of every pair."""
    if not len(block):
        return np.zeros(0, bool)
    if WIN in block.columns:
        return block[KEY] == mix_key(np.full(len(block), key, np.int64), block[WIN])
    return block[KEY] == key


def fragment_of(block: Block, parts: int) -> np.ndarray:
    """The sub-group (0: the group itself, j: its j-th slot) of each tuple of `block`, among
    `parts`: a hash of its source partition and offset, so the same tuple goes the same way
    in every replay, and a window join's copies of one tuple go together."""
    part = block[PART].astype(np.int64).view(np.uint64)
    off = block[OFF].astype(np.int64).view(np.uint64)
    return (mix(mix(part) ^ off) % np.uint64(parts)).astype(np.int64)


def divert(on_time: list[Block], routes: Sequence[Route]) -> tuple[list[Block], list[list[list[Block]]]]:
    """A batch's on-time tuples (per stream, each sorted by key and time) cut by `routes`:
    per stream what the group's own window joins and takes, and per route, per slot, per
    stream what that slot gets (sorted the same way)."""
    kept = list(on_time)
    sent: list[list[list[Block]]] = []
    for route in routes:
        per_slot = [[b.take(np.empty(0, np.int64)) for b in on_time] for _ in range(route.slots)]
        for i, block in enumerate(kept):
            hot = hot_rows(block, route.key)
            if not hot.any():
                continue
            if i != route.fragment:
                replicated = block.filter(hot)
                for j in range(route.slots):
                    per_slot[j][i] = replicated
                continue
            if not route.spread:
                continue
            home = np.where(hot, fragment_of(block, route.slots + 1), 0)
            for j in range(route.slots):
                per_slot[j][i] = block.filter(home == j + 1)
            kept[i] = block.filter(home == 0)
        sent.append(per_slot)
    return kept, sent


def state_copy(runs: SortedRuns, key: int) -> Block:
    """The live tuples of the split key in one stream's window: what every slot takes first."""
    if WIN in runs.template.columns:  # copies carry mixed keys: one look at the whole window, once a split
        merged = runs.merged()
        return merged.filter(hot_rows(merged, key))
    return runs.matching(np.array([key], np.int64))


def newest(block: Block, prior: int) -> int:
    """The newest event time of `block` and `prior`."""
    return max(prior, int(block[TS].max())) if len(block) else prior


def drained(newest_sent: int, range_ms: int, watermark_before: int) -> bool:
    """Whether a merge may end before a batch of its group whose watermark is
    `watermark_before`: every later tuple is on time, so at least that old, and an S tuple
    joins an R tuple at `newest_sent` only while it is less than `range_ms` (R's window) newer.
    Nothing sent (`newest_sent` NO_TIME): no slot holds an R tuple."""
    return newest_sent <= NO_TIME or watermark_before >= newest_sent + range_ms
