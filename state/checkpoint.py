"""What a partition group's stored state reflects: the last batch applied,
its input boundary, the watermark, the repartitioning marks and progress, and where in the
results, commits and dead-letter partitions the next batch's records begin
(recovery reads from there), where in the changelog the records this
state is built from begin, and the hot keys split over slots: the routing a
group's batches apply (`SplitRouting`) and, for a slot, the split it serves
(`SlotInput`), so a replayed batch routes and takes what the original did."""

from __future__ import annotations

from pydantic import BaseModel

from streamjoin.engine.window_join import NO_TIME


class SplitRouting(BaseModel):
    """A hot key of this group split over slots (services/hash/split.py): its `episode`, the
    key (`code`, its KEY column value), the `slots`, the stream spread over them
    (`fragment`), whether it is `merging` (the key cooled: nothing is spread any more), and
    the newest event time of a fragmented tuple sent to a slot (a merge ends a window after it)."""

    episode: int
    code: int
    slots: list[int]
    fragment: int
    merging: bool = False
    newest: int = NO_TIME


class SlotInput(BaseModel):
    """A slot's input (services/hash/split.py): the split `episode` it serves, from `group`,
    whose batch `seq` it took last, and whether that episode `ended` (its state dropped)."""

    episode: int = 0
    group: int = -1
    seq: int = 0
    ended: bool = True


class GroupCheckpoint(BaseModel):
    seq: int = 0  # batches applied; batch numbers start at 1
    end: dict[str, dict[int, int]] = {}  # input topic -> partition -> next offset (source and by-key topics)
    # stream -> source partition -> newest source offset taken through the by-key topic (drops retried forwards)
    routed: dict[str, dict[int, int]] = {}
    max_ts: list[int] = []
    watermark: int = NO_TIME
    results_next: int = 0
    commits_next: int = 0
    dead_letter_next: int = 0
    changelog_low: int = 0  # the group's changelog offset from which this state can be rebuilt
    in_changelog: bool = False  # every live block is in the changelog (false until a batch with one)
    # Deferred spill (worker.spill.mode deferred, engine/cleanup.py): the first batch of the
    # generation in memory, and each spilled generation not cleaned up yet as [first batch,
    # newest event time], oldest first.
    generation_start: int = 0
    generations: list[list[int]] = []
    # join.repartition_watermarks (services/hash/progress.py): per stream, the newest event
    # time read in each source partition (as notes told this group, or as it read its own) and
    # the partitions idle; and the streams this group told idle to the groups it re-routes to.
    progress: dict[str, dict[int, int]] = {}
    idle_sources: dict[str, list[int]] = {}
    told_idle: list[str] = []
    # join.idle_timeout_ms: per stream, the wall-clock ms of the last batch that read a record of
    # it (NO_TIME: none yet), so that a restarted worker or a group's new owner counts the
    # stream's silence from there rather than from its own start.
    heard_ms: list[int] = []
    # Split hot keys: the splits in force at this group, the episodes it ended (the latest
    # few: the coordinator frees their slots), and, when the group is a slot, what it serves.
    splits: list[SplitRouting] = []
    splits_ended: list[int] = []
    slot: SlotInput = SlotInput()

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> "GroupCheckpoint | None":
        return None if raw is None else cls.model_validate_json(raw)


def merge_positions(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    """`before` advanced by `after` (input topic -> partition -> next offset)."""
    out = {topic: dict(parts) for topic, parts in before.items()}
    for topic, parts in after.items():
        out.setdefault(topic, {}).update(parts)
    return out
