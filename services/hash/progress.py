"""Progress notes: how far each source partition has been read, told across the repartition.

A hash group re-routes the tuples it reads that belong to another group (intake.py) through
`<job>.<stream>.by-key`; they reach their group a cycle or more later. Meanwhile that group
may have read far ahead (a job started on a backlog, or a query version started late, reads
a partition's whole backlog in one batch), and its watermark would judge the re-routed
tuples against that: late, however on time they were where they were written. With
`join.repartition_watermarks` (hash mode, `join.repartition: auto`) the watermark travels
with the re-routed tuples, as a dataflow's watermarks travel through a shuffle: a group's
watermark follows its inputs' source partitions, one by one, as the ring head's does.

- Telling: after a batch's forwards, the group that read a source partition writes one note
  per (stream, group it may re-route to) on the stream's by-key topic: per source partition
  of the stream it read in the batch, the newest event time read there; once the stream goes
  idle for it (`join.idle_timeout_ms`), that its partitions are idle. The note follows the
  batch's forwards in the same partition, so a group that has read a note has read every
  tuple the sender re-routed to it from the records the note speaks for.
- Hearing: a group keeps, per (stream, source partition), the newest event time told (its
  own partition's, when the topic is partitioned like the job, it knows from its own reads:
  none of its tuples for it travel) and the partitions told idle, in its checkpoint
  (`progress`, `idle_sources`), so a replayed batch decides the same. Its watermark's low mark
  may not pass the least progress of the partitions not idle (engine/window_join.py
  process_batch's `bound`): a tuple is late only when it is behind its own source partition's
  earlier records by the allowed lateness, however far ahead the rest was read. A batch's
  tuples are judged with the bound from before the batch (a note in the batch follows some
  of them); the watermark after it takes what the batch read.

The price: a note per stream and pair of groups per batch, and a watermark that waits for
the slowest source partition; one that never gets a record holds it until the idle timeout
says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from streamjoin.engine.window_join import NO_TIME
from streamjoin.services.io.progress_notes import ProgressNote, Told
from streamjoin.settings import JobSettings
from streamjoin.state.checkpoint import GroupCheckpoint


def targets(partitions: int, source_partitions: int, group: int) -> list[int]:
    """The groups `group` tells of its source partitions: every group its tuples may be
    re-routed to. A topic partitioned like the job re-routes none of a partition's tuples to
    the group that reads it, which knows that partition's progress itself; one partitioned
    otherwise re-routes every tuple, some to that group too, which hears of it in order then."""
    return [h for h in range(partitions) if source_partitions != partitions or h != group]


def tell(job: JobSettings, source_partitions: Sequence[int], group: int, read: Mapping[int, Mapping[int, int]],
         idle: frozenset[int], told_idle: Sequence[str]) -> tuple[dict[int, Told], list[str]]:
    """What one batch of `group` tells, per stream, and the streams it has told idle after it.

    `source_partitions[i]`: stream i's source topic's partition count; `read[i]`: the newest
    event time per source partition the batch read of stream i; `idle`: the group's idle
    streams; `told_idle`: the streams it told idle before (an idle stream is told once, not
    every batch: a note gives its receivers a batch)."""
    out: dict[int, Told] = {}
    told = set(told_idle)
    for i, spec in enumerate(job.streams):
        newest = dict(read.get(i, {}))
        if newest:
            out[i] = Told(newest)
            told.discard(spec.name)
        elif i in idle and spec.name not in told:
            out[i] = Told({}, tuple(range(group, source_partitions[i], job.partitions)))
            told.add(spec.name)
    return out, sorted(told)


def notes(job: JobSettings, source_partitions: Sequence[int], group: int, said: Mapping[int, Told],
          now_ms: int) -> list[ProgressNote]:
    """`said` (tell's) as notes to every group that hears it."""
    return [ProgressNote(i, group, h, message, now_ms) for i, message in said.items()
            for h in targets(job.partitions, source_partitions[i], group)]


@dataclass(frozen=True)
class Heard:
    """A group's record of its source partitions' progress (as notes told it, or as it read
    its own): stream -> source partition -> newest event time, and stream -> the source
    partitions idle."""

    progress: dict[str, dict[int, int]]
    idle: dict[str, list[int]]

    def after(self, stream: str, told: Sequence[Told]) -> "Heard":
        """This record with `told` (of `stream`, in the order read) taken in."""
        if not told:
            return self
        progress = dict(self.progress.get(stream, {}))
        idle = set(self.idle.get(stream, []))
        for t in told:
            for p, ts in t.newest.items():
                progress[p] = max(progress.get(p, NO_TIME), ts)
            idle = (idle - set(t.newest)) | set(t.idle)
        return Heard(self.progress | {stream: progress}, self.idle | {stream: sorted(idle)})

    def bound(self, job: JobSettings, source_partitions: Sequence[int]) -> int | None:
        """The least progress over every source partition not idle (NO_TIME: one has told
        nothing yet); None when none holds the watermark (all idle)."""
        lows = []
        for i, spec in enumerate(job.streams):
            heard, idle = self.progress.get(spec.name, {}), set(self.idle.get(spec.name, []))
            lows += [heard.get(j, NO_TIME) for j in range(source_partitions[i]) if j not in idle]
        return min(lows) if lows else None


@dataclass(frozen=True)
class BatchProgress:
    """What one batch of a group does with progress: `bound` on its watermark's low mark before
    and after the notes it read (process_batch's), `checkpoint` the fields it updates, `notes`
    the notes it writes after its forwards."""

    bound: tuple[int | None, int | None]
    checkpoint: dict[str, object]
    notes: list[ProgressNote]


def batch_progress(job: JobSettings, source_partitions: Sequence[int], checkpoint: GroupCheckpoint, group: int,
                   read: Mapping[int, Mapping[int, int]], told: Mapping[int, Sequence[Told]], idle: frozenset[int],
                   now_ms: int) -> BatchProgress:
    """One batch of `group`, its checkpoint before it `checkpoint`: `read[i]` the newest event
    time per source partition it read of stream i, `told[i]` the notes of stream i it read (in
    order), `idle` its idle streams."""
    heard = Heard(checkpoint.progress, checkpoint.idle_sources)
    before = heard.bound(job, source_partitions)
    for i, stream_notes in told.items():
        heard = heard.after(job.streams[i].name, stream_notes)
    said, told_idle = tell(job, source_partitions, group, read, idle, checkpoint.told_idle)
    for i, message in said.items():
        if source_partitions[i] == job.partitions:  # its own partition, whose tuples for it stay: no note
            heard = heard.after(job.streams[i].name, [message])
    return BatchProgress((before, heard.bound(job, source_partitions)),
                         {"progress": heard.progress, "idle_sources": heard.idle, "told_idle": told_idle},
                         notes(job, source_partitions, group, said, now_ms))
