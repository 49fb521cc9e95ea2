"""When the hash worker reads what: event-time aligned intake (pause a group's streams read
too far ahead of its slowest one, `join.max_read_ahead_ms`) and idle streams
(`join.idle_timeout_ms`: which of a group's streams are silent with nothing left to read,
and the wall-clock floor that moves an all-silent group's watermark). A part of `Worker`
(hash/main.py), kept apart by concern; it reads the worker's consumer, store and clocks."""

from __future__ import annotations

import numpy as np
import structlog
from confluent_kafka import Consumer, TopicPartition

from streamjoin.engine.window_join import NO_TIME
from streamjoin.services import metrics
from streamjoin.services.hash.alignment import paused_streams
from streamjoin.services.hash.processor import SLOT_INPUT
from streamjoin.services.io.intake import RecordBuffer, Routing
from streamjoin.settings import JobSettings
from streamjoin.state.windowed import WindowedStore

log = structlog.get_logger("streamjoin.worker")


class Pacing:
    """Worker's alignment and idle-stream methods (the worker's state they use is annotated)."""

    job: JobSettings
    worker_id: str
    consumer: Consumer
    store: WindowedStore
    routings: list[Routing]
    groups: set[int]
    pending: dict[int, RecordBuffer]
    paused: set[tuple[str, int]]
    committed: dict[tuple[str, int], int]
    heard: dict[int, np.ndarray]
    listened_ms: int
    idle_seen: dict[int, frozenset[int]]

    def _align(self) -> None:
        """Event-time aligned intake (alignment.py): pause each group's streams
        read more than join.max_read_ahead_ms ahead of its slowest stream that still has records
        to read, resume the rest. Groups not in memory are left running."""
        bound = self.job.join.max_read_ahead_ms
        if bound is None:
            return
        hot = self.store.hot_groups()
        groups = sorted(g for g in self.groups if g in hot and g not in self.job.slots)  # slots read no stream
        inputs = [[self._source_partitions(g, i) for i in range(len(self.job.streams))] for g in groups]
        behind = self._unread({tp for row in inputs for tps in row for tp in tps})
        heads = np.array([hot[g].window.max_ts for g in groups], np.int64).reshape(len(groups), -1)
        readable = np.array([[any(tp in behind for tp in tps) for tps in row] for row in inputs],
                            bool).reshape(len(groups), -1)
        ahead = paused_streams(heads, readable, bound)
        wanted = {tp for row, flags in zip(inputs, ahead) for tps, flag in zip(row, flags) if flag for tp in tps}
        pause, resume = wanted - self.paused, self.paused - wanted
        if pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in sorted(pause)])
            metrics.INTAKE_PAUSES.inc(len(pause))
        if resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in sorted(resume)])
        self.paused = wanted
        metrics.PAUSED_PARTITIONS.set(len(wanted))

    def _source_partitions(self, group: int, stream: int) -> list[tuple[str, int]]:
        """Stream `stream`'s source partitions whose records group `group` takes."""
        routing = self.routings[stream]
        return [(self.job.topic_of(self.job.streams[stream]), j)
                for j in range(group, routing.source_partitions, routing.partitions)]

    def _unread(self, partitions: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """The partitions among `partitions` with records past the consumer's position; a
        partition whose position or end is unknown yet counts as unread unless it is empty.

        The consumer knows a position only once it has handed out a record of the partition:
        until then (a partition assigned at its end by a restart or a move, with nothing
        written since) the position is where it was assigned, the offset committed for it."""
        unread = set()
        for tp, high in self._positions_and_ends([TopicPartition(t, p) for t, p in sorted(partitions)]):
            at = tp.offset if tp.offset >= 0 else self.committed.get((tp.topic, tp.partition), -1)
            if high < 0 or (at < 0 and high > 0) or 0 <= at < high:
                unread.add((tp.topic, tp.partition))
        return unread

    def _positions_and_ends(self, partitions: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        """Each partition at the consumer's position, with its end as the consumer's fetches last
        saw it (the cached high watermark; negative: not known yet)."""
        return [(tp, self.consumer.get_watermark_offsets(tp, cached=True)[1])
                for tp in self.consumer.position(partitions)]

    def _restore_idle_clocks(self, groups: set[int], now_ms: int) -> None:
        """join.idle_timeout_ms: each new group's streams silent since the last batch that read
        a record of them (its checkpoint's clocks, recorded by whichever worker owned it), so a
        restart or a move does not make a silent stream wait a whole timeout again; a stream no
        batch has heard from yet counts from `now_ms`. Silence is still nothing left to read
        (`_idle`): a stream with records past the consumer's position is not idle, however old
        its clock."""
        streams = len(self.job.streams)
        restored = {}
        for g in groups:
            clock = np.full(streams, now_ms, np.int64)
            recorded = np.asarray((self.store.get(g).checkpoint.heard_ms + [NO_TIME] * streams)[:streams], np.int64)
            known = recorded > NO_TIME
            clock[known] = np.minimum(recorded[known], now_ms)
            self.heard[g] = clock
            if known.any():
                restored[g] = int(now_ms - clock.min())
        if restored and self.job.join.idle_timeout_ms:
            log.info("idle clocks restored", worker=self.worker_id, groups=len(restored),
                     longest_silence_ms=max(restored.values()))

    def _idle(self, now_ms: int) -> tuple[dict[int, frozenset[int]], list[int]]:
        """join.idle_timeout_ms: per owned group, its streams with no record for that long and
        nothing left to read, and the groups without pending records whose idle streams changed
        since their last batch (a newly idle stream may let their watermark move: they get a
        batch of no records)."""
        idle_ms = self.job.join.idle_timeout_ms
        if not idle_ms or not self.heard:
            return {}, []
        if now_ms - self.listened_ms > idle_ms:
            # The loop was away for longer than the timeout (a long cycle, a stall, a slow start):
            # it heard nothing, which says nothing of the inputs, and the consumer's ends of its
            # partitions are as old. Silence counts from now, as after a restart.
            for heard in self.heard.values():
                heard[:] = now_ms
        self.listened_ms = now_ms
        for i, buf in self.pending.items():
            if i == SLOT_INPUT:  # a slot's input is its group's, which judges its streams' silence
                continue
            # Records of the stream, not progress notes about it; with join.repartition_watermarks
            # only those of its source partitions (re-routed ones come with their senders' progress).
            read = buf.groups[~buf.rerouted] if self.job.join.repartition_watermarks else buf.groups
            for g in np.unique(read).tolist():
                self.heard[g][i] = now_ms
        groups = sorted(self.heard)
        silent = now_ms - np.stack([self.heard[g] for g in groups]) >= idle_ms
        # Silence is nothing left to read, not nothing read: a stream whose partitions hold records
        # past the consumer's position (the worker was busy, or just started) is not idle, or what
        # it has not read yet would be late once read.
        quiet = {(g, int(i)): self._source_partitions(g, int(i)) for g, row in zip(groups, silent)
                 for i in np.flatnonzero(row)}
        if quiet:
            unread = self._unread({tp for tps in quiet.values() for tp in tps})
            for (g, i), tps in quiet.items():
                if any(tp in unread for tp in tps):
                    self.heard[g][i] = now_ms
            silent = now_ms - np.stack([self.heard[g] for g in groups]) >= idle_ms
        idle = {g: frozenset(np.flatnonzero(row).tolist()) for g, row in zip(groups, silent) if row.any()}
        busy = {g for buf in self.pending.values() for g in buf.positions}
        woken = [g for g in groups if g not in busy and idle.get(g, frozenset()) != self.idle_seen.get(g, frozenset())]
        return idle, woken

    def _wall_clock_floors(self, idle: dict[int, frozenset[int]], now_ms: int) -> dict[int, int]:
        """Outer, semi and anti joins with join.idle_timeout_ms: a group whose every stream is
        silent has no stream time left to move its watermark, so the wall clock does (now -
        idle_timeout_ms - allowed_lateness: a record that old arriving later is late, the trade
        idle_timeout_ms makes), else its unmatched rows would wait for the next record. Only
        groups with a row whose deadline that passes get a batch (group -> floor); a group pushed
        to disk is judged by the deadline it left memory with."""
        if self.job.join.type == "inner" or not idle:
            return {}
        floor = now_ms - (self.job.join.idle_timeout_ms or 0) - self.job.join.allowed_lateness_ms
        everything = len(self.job.streams)
        due = [g for g, streams in idle.items() if len(streams) == everything and g in self.groups
               and (deadline := self.store.next_deadline(g)) is not None and deadline <= floor]
        return {g: floor for g in due}
