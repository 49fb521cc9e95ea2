"""Rebuilding partition groups' state from the changelog (state/changelog.py) on a
worker that lacks it or holds an older copy: the group moved here, or the disk
that held it is gone.

Per group: find the newest checkpoint in its changelog partition (a batch's
checkpoint is its last record, so it is in the partition's tail), and when it is
ahead of the local one, read from its `changelog_low` up to it and install what
that rebuilds. Reading stops at the checkpoint: records after it belong to a batch
whose transaction did not complete (a broker that shows aborted transactions,
as Tansu does, lets them be seen); if that batch was decided, the commits topic
has it and recovery replays it. The work grows with the window (from
`changelog_low` on), never with the job's age.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import structlog
from confluent_kafka import Message

from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.state.changelog import Image
from streamjoin.state.checkpoint import GroupCheckpoint
from streamjoin.state.partition import checkpoint_key
from streamjoin.state.windowed import WindowedStore

log = structlog.get_logger("streamjoin.worker.restore")
TAIL_RECORDS = 64  # first look-back for a partition's newest checkpoint; widened 8x while none is found


def restore_groups(job: JobSettings, cluster: kafka.Cluster, store: WindowedStore, groups: Sequence[int],
                   known_ends: dict[tuple[str, int], int] | None = None) -> list[int]:
    """Install the changelog's state of every group in `groups` whose changelog is ahead of
    `store`'s copy; returns those groups. `known_ends`: the changelog partitions' ends when the
    caller has them, (topic, partition) -> end. Nothing to do for a job without a changelog."""
    if not job.worker.changelog or not groups:
        return []
    started = time.perf_counter()
    topic = job.changelog_topic
    probe = f"{job.consumer_group}-recovery"
    if known_ends is None:
        known_ends = kafka.end_offsets(cluster, [(topic, g) for g in groups], probe)
    ends = {g: known_ends[(topic, g)] for g in groups}
    newest = _newest_checkpoints(cluster, topic, probe, ends)
    behind = {g: found for g, found in newest.items() if found.checkpoint.seq > store.stored_checkpoint(g).seq}
    if not behind:
        return []
    images = {g: Image() for g in behind}
    # A group whose low mark is inside the tail already read needs no second read (a short window).
    further = {g: found for g, found in behind.items() if found.checkpoint.changelog_low < found.tail_start}
    records = [m for g, found in behind.items() if g not in further for m in found.tail
               if found.checkpoint.changelog_low <= m.offset() <= found.offset]
    if further:
        records += kafka.read_partitions(cluster, topic, {g: f.checkpoint.changelog_low for g, f in further.items()},
                                         probe, ends={g: f.offset + 1 for g, f in further.items()})
    for m in records:  # each partition's records in offset order, up to its checkpoint and no further
        images[m.partition()].apply(m.key(), m.value(), m.offset())
    read = len(records)
    for g, image in images.items():
        store.install(g, image.values(), image.offsets, ends[g])
    seconds = time.perf_counter() - started
    metrics.CHANGELOG_RESTORES.inc(len(behind))
    metrics.CHANGELOG_RECORDS.labels("read").inc(read)
    metrics.RESTORE_SECONDS.observe(seconds)
    log.info("groups restored from the changelog", groups=len(behind), records=read, seconds=round(seconds, 3))
    return sorted(behind)


@dataclass(frozen=True)
class Newest:
    """A changelog partition's newest checkpoint, its `offset`, and the tail read to find it
    (`tail`: its records from `tail_start` on)."""

    checkpoint: GroupCheckpoint
    offset: int
    tail_start: int
    tail: list[Message]


def _newest_checkpoints(cluster: kafka.Cluster, topic: str, probe: str, ends: dict[int, int]) -> dict[int, Newest]:
    """Per group with a checkpoint in its changelog partition before `ends[g]`: the newest one."""
    found: dict[int, Newest] = {}
    todo = {g: end for g, end in ends.items() if end > 0}
    span = TAIL_RECORDS
    while todo:
        starts = {g: max(0, end - span) for g, end in todo.items()}
        tails: dict[int, list[Message]] = {g: [] for g in todo}
        for m in kafka.read_partitions(cluster, topic, starts, probe, ends=todo):
            tails[m.partition()].append(m)
        for g, tail in tails.items():
            checkpoints = [(m, GroupCheckpoint.decode(m.value())) for m in tail
                           if m.key() == checkpoint_key(g) and m.value() is not None]
            if checkpoints:
                m, checkpoint = checkpoints[-1]  # in offset order: the newest is the last
                found[g] = Newest(checkpoint, m.offset(), starts[g], tail)  # type: ignore[arg-type]
        todo = {g: end for g, end in todo.items() if g not in found and starts[g] > 0}
        span *= 8
    return found
