"""Split hot keys in the hash worker's batches: a group applying the splits and merges the
coordinator decided (`GroupSplits`), and a slot taking what its group sends it (`slot_segments`).
engine/hot_split.py says the scheme and why it is exact; docs/modes/hash.md says it for users.

In the group that holds the key:
- a split or merge is applied at the start of one of the group's batches, and that batch's
  commit records it (`BatchCommit.splits_applied`), so a replay applies it at the same batch:
  the barrier is the batch's input boundary, as a move's is. The routing in force is in the
  group's checkpoint (`SplitRouting`);
- the stream spread is the decided one of an outer, semi or anti join (each of its rows then
  meets all its partners in one sub-group and is decided there), and of an inner join the
  stream of which the group's window holds more tuples of the key at the split (a slot holds
  a copy of the other: replicate the lighter one);
- after the batch, each slot gets one record (schemas/split_records.py): its share of the
  batch's tuples of the key and the group's watermark after it; the first of an episode
  carries the window's tuples of the key of the replicated stream first. A batch that moved
  the watermark and sent no tuple still sends it, so a slot's open rows are decided on time;
- a merge spreads nothing more and replicates until `drained`, then sends each slot an end
  record and lists the episode as ended (its heartbeat tells the coordinator, which frees
  the slots).

In a slot, records are taken in order, each once: a record of an older episode, or of this
one at a batch it took already (a retried write), is skipped; a newer episode (its start
record) drops the window and its clock, and so does an end once its tuples are joined. A
slot judges no lateness: every stream is idle to it and its watermark is the group's
(`process_batch`'s floor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from streamjoin.engine.block import Block, concat
from streamjoin.engine.hot_split import Route, divert, drained, newest, state_copy
from streamjoin.engine.window_join import GroupWindow, JoinPlan
from streamjoin.schemas.control import HotSplit, SplitPhase
from streamjoin.schemas.split_records import SplitRecord
from streamjoin.state.checkpoint import GroupCheckpoint, SlotInput, SplitRouting
from streamjoin.state.windowed import BLOCK_SEQ

ENDED_KEPT = 32  # the latest episodes a group lists as ended: far more than the coordinator waits on


@dataclass
class GroupSplits:
    """One batch of a group with split keys: the `routing` in force (after the changes it
    `applied`), the episodes it `ends`, the window `copies` each starting episode sends first
    (per stream), and, once the batch's tuples are diverted, what was `sent` (per route, per
    slot, per stream)."""

    routing: list[SplitRouting]
    applied: list[HotSplit]
    ends: list[SplitRouting]
    ended: list[int]
    streams: int
    copies: dict[int, list[Block]] = field(default_factory=dict)
    sent: list[list[list[Block]]] = field(default_factory=list)

    @property
    def routes(self) -> list[Route]:
        return [Route(r.code, len(r.slots), r.fragment, spread=not r.merging) for r in self.routing]

    def divert(self, on_time: list[Block]) -> list[Block]:
        """`process_batch`'s divert: the tuples the group's window takes; the rest are `sent`."""
        kept, self.sent = divert(on_time, self.routes)
        return kept

    def records(self, group: int, seq: int, watermark_before: int, watermark_after: int) -> list[tuple[int, SplitRecord]]:
        """(slot, record) for every slot the batch sends to, and the routing's newest sent times
        updated; call once the batch is joined."""
        out = []
        for routing, per_slot in zip(self.routing, self.sent):
            copy = self.copies.get(routing.episode)
            for slot, blocks in zip(routing.slots, per_slot):
                if copy is not None:
                    blocks = [concat([c, b]) for c, b in zip(copy, blocks)]
                routing.newest = newest(blocks[routing.fragment], routing.newest)
                if copy is None and watermark_after <= watermark_before and not any(map(len, blocks)):
                    continue
                out.append((slot, SplitRecord(routing.episode, group, seq, watermark_after, copy is not None, False,
                                              [unstored(b) for b in blocks])))
        for routing in self.ends:
            out += [(slot, SplitRecord(routing.episode, group, seq, watermark_after, False, True,
                                       [Block()] * self.streams)) for slot in routing.slots]
        return out

    def checkpoint(self) -> dict[str, object]:
        """The fields of the batch's checkpoint these splits update."""
        return {"splits": self.routing, "splits_ended": self.ended[-ENDED_KEPT:]}


def group_splits(plan: JoinPlan, window: GroupWindow, checkpoint: GroupCheckpoint,
                 changes: Sequence[HotSplit]) -> GroupSplits | None:
    """A batch's splits: those in force in `checkpoint` with `changes` (the coordinator's
    splits and merges of the group, live; the batch's recorded ones, in a replay) applied,
    before `window` takes the batch. None when the group has no split."""
    if not changes and not checkpoint.splits:
        return None
    routing = {r.episode: r.model_copy() for r in checkpoint.splits}
    ended = list(checkpoint.splits_ended)
    applied, copies = [], {}
    for change in sorted(changes, key=lambda c: (c.episode, c.merging)):
        current = routing.get(change.episode)
        if change.episode in ended or (current is not None and (current.merging or not change.merging)):
            continue
        applied.append(change)
        if current is not None:
            routing[change.episode] = current.model_copy(update={"merging": True})
        elif change.merging:
            ended.append(change.episode)  # merged before it began: no slot got anything
        else:
            fragment, held = _fragment(plan, window, change.code)
            routing[change.episode] = SplitRouting(episode=change.episode, code=change.code, slots=change.slots,
                                                   fragment=fragment)
            copies[change.episode] = [held[i] if i != fragment else held[i].take(np.empty(0, np.int64))
                                      for i in range(len(held))]
    ends = [r for r in routing.values()
            if r.merging and drained(r.newest, plan.streams[r.fragment].range_ms or 0, window.watermark)]
    active = [r for e, r in sorted(routing.items()) if r not in ends]
    return GroupSplits(active, applied, ends, ended + [r.episode for r in ends], len(plan.streams), copies)


def pending(checkpoint: GroupCheckpoint, wanted: Sequence[HotSplit]) -> bool:
    """Whether any of `wanted` is not applied by the state `checkpoint` describes."""
    return any(phase(checkpoint, s.episode) != ("merging" if s.merging else "split")
               and phase(checkpoint, s.episode) != "ended" for s in wanted)


def phase(checkpoint: GroupCheckpoint, episode: int) -> SplitPhase | None:
    """How far the group has applied split `episode` (None: not at all)."""
    if episode in checkpoint.splits_ended:
        return "ended"
    routing = next((r for r in checkpoint.splits if r.episode == episode), None)
    return None if routing is None else "merging" if routing.merging else "split"


def _fragment(plan: JoinPlan, window: GroupWindow, code: int) -> tuple[int, list[Block]]:
    """The stream to spread and, per stream, the window's live tuples of the key: the decided
    stream of an outer, semi or anti join; else the one with more of the key's tuples held."""
    held = [state_copy(runs, code) for runs in window.runs]
    if plan.decided:
        return plan.decided[0], held
    return (1 if len(held[1]) > len(held[0]) else 0), held


def unstored(block: Block) -> Block:
    """`block` without the column naming the stored block it came from: a slot stores its own."""
    return Block({k: v for k, v in block.columns.items() if k != BLOCK_SEQ})


# ------------------------------------------------------------------ slots

@dataclass
class Segment:
    """Records of one episode a slot takes in one batch: whether the first `starts` the
    episode (the window is dropped first) and the last `ends` it (dropped after), per stream
    the tuples, and the watermark the last one carries."""

    starts: bool
    ends: bool = False
    blocks: list[list[Block]] = field(default_factory=list)
    watermark: int = 0


def slot_segments(slot: SlotInput, records: Sequence[SplitRecord]) -> tuple[list[Segment], SlotInput, int, list[str]]:
    """The records a slot takes of `records` (in order), as segments of one episode each, the
    slot's input after them, the records skipped as taken before, and the reasons of those
    refused (one per record, in order; "" for a record taken or skipped)."""
    segments: list[Segment] = []
    skipped, refused = 0, []
    for rec in records:
        why = ""
        if rec.episode < slot.episode or (rec.episode == slot.episode and (rec.seq <= slot.seq or slot.ended)):
            skipped += 1
        elif rec.episode > slot.episode and not rec.start:
            why = f"episode {rec.episode} begins without its start record (the slot serves episode {slot.episode})"
        elif rec.episode == slot.episode and rec.group != slot.group:
            why = f"group {rec.group} writes to episode {rec.episode}, which group {slot.group} holds"
        else:
            if rec.episode > slot.episode or not segments:
                segments.append(Segment(starts=rec.episode > slot.episode))
            segment = segments[-1]
            segment.blocks.append(rec.blocks)
            segment.watermark, segment.ends = rec.watermark, rec.end
            slot = SlotInput(episode=rec.episode, group=rec.group, seq=rec.seq, ended=rec.end)
        refused.append(why)
    return segments, slot, skipped, refused


def segment_deltas(segment: Segment, templates: list[Block], seq: int) -> list[Block]:
    """Per stream, a segment's tuples as the slot's batch `seq` takes them (tagged with it)."""
    out = []
    for i, template in enumerate(templates):
        block = concat([unstored(template)] + [blocks[i] for blocks in segment.blocks])
        out.append(Block(dict(block.columns) | {BLOCK_SEQ: np.full(len(block), seq, np.int64)}))
    return out
