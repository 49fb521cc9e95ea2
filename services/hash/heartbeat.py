"""What the hash worker tells the coordinator on each heartbeat (its groups, lag, state and
spill figures, also set as gauges), and the committed offsets it re-checks then: those of
idle partitions that fell behind what it knows. A part of `Worker` (hash/main.py), kept
apart by concern."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from streamjoin.schemas import control
from streamjoin.services import metrics
from streamjoin.services.hash.backlog import RecordSize, backlog_bytes
from streamjoin.services.hash.hot_keys import KeyCounter
from streamjoin.services.hash.split import phase
from streamjoin.services.io.intake import RecordBuffer
from streamjoin.settings import JobSettings
from streamjoin.state.windowed import WindowedStore

log = structlog.get_logger("streamjoin.worker")


class Heartbeats:
    """Worker's heartbeat and offset re-check methods (the worker's state they use is annotated)."""

    job: JobSettings
    worker_id: str
    consumer: Consumer
    control_out: Producer
    store: WindowedStore
    groups: set[int]
    pending: dict[int, RecordBuffer]
    committed: dict[tuple[str, int], int]
    unsettled: dict[tuple[str, int], int]
    record_size: RecordSize
    results_total: int
    metrics_url: str
    epoch: int
    key_counter: KeyCounter
    splits: list[control.HotSplit]

    def _heartbeat(self) -> None:
        hot = self.store.hot_groups()
        behind = self._records_behind()
        lag = behind + sum(len(b) for b in self.pending.values())
        metrics.LAG.set(lag)
        now_ms = int(time.time() * 1000)
        counted, hot_keys = self.key_counter.report(self.groups, now_ms)
        beat = control.Heartbeat(
            worker=self.worker_id, wall_ms=now_ms, groups=sorted(self.groups), lag=lag,
            keys_counted=counted, hot_keys=hot_keys,
            state_bytes=sum(s.window.nbytes for s in hot.values()),
            state_tuples=sum(s.window.tuples for s in hot.values()), metrics_url=self.metrics_url,
            backlog_bytes=backlog_bytes(self.pending, behind, self.record_size),
            group_bytes=self.store.group_bytes(self.groups), epoch=self.epoch, splits=self._split_phases(),
            **self._spill_report(),
        )
        self.control_out.produce(self.job.control_topic, value=control.encode(beat), key=self.worker_id.encode(),
                                 partition=0)
        self.control_out.poll(0)

    def _split_phases(self) -> dict[int, control.SplitPhase]:
        """How far each split hot key of a group held here is applied, as the group's committed
        checkpoint says (services/hash/split.py): the coordinator re-sends what lags, and frees
        the slots of what ended."""
        out: dict[int, control.SplitPhase] = {}
        hot = self.store.hot_groups()
        for split in self.splits:
            if split.group in self.groups:
                state = hot.get(split.group)
                checkpoint = state.checkpoint if state is not None else self.store.stored_checkpoint(split.group)
                found = phase(checkpoint, split.episode)
                if found is not None:
                    out[split.episode] = found
        return out

    def _spill_report(self) -> dict[str, object]:
        """The heartbeat's spill fields (memory, spilled bytes, generations, clean-up backlog), also
        set as gauges."""
        pending = {g: n for g, n in self.store.pending_generations().items() if g in self.groups}
        hot = self.store.hot_groups()
        backlog = sum(hot[g].spilled_bytes() for g in pending)
        spilled = self.store.spilled_bytes(self.groups)
        metrics.SPILLED_BYTES.set(spilled)
        metrics.GENERATIONS.set(sum(pending.values()))
        metrics.CLEANUP_BACKLOG.set(backlog)
        return {"memory_bytes": self.store.hot_size, "memory_budget": self.job.worker.memory_bytes,
                "spilled_bytes": spilled, "generations": sum(pending.values()), "cleanup_backlog_bytes": backlog,
                "spilled_groups": sorted(pending), "results_total": self.results_total,
                "pushes": self.store.pushes, "group_results": self.store.group_results(self.groups)}

    def _records_behind(self) -> int:
        """Records in the owned groups' input partitions past the consumer's position (not fetched yet)."""
        if not self.groups:
            return 0
        return sum(max(0, high - tp.offset) for tp, high in self._positions_and_ends(self._partitions(self.groups))
                   if high >= 0 and tp.offset >= 0)

    def _reconcile_offsets(self) -> None:
        """Bring the group's committed offsets of idle partitions up to what this worker knows.

        Two ways they fall behind while nothing is wrong with the data: the by-key topics
        are written in transactions, and a marker follows each one's records and takes an
        offset; when a partition's last record was taken before the consumer reached the
        marker behind it, no batch commits past it. And an offset sent in a committed
        transaction is sometimes not there when read back (seen on Tansu 0.6, under load).
        Either way a drained partition would show lag for good. Only partitions with
        nothing pending are touched: every record before the consumer's position there is
        in a committed batch, so committing the position (or re-committing what a batch
        committed) loses nothing and replays nothing. A partition is committed only when two
        heartbeats in a row found it behind at the same offset: right after a transaction
        commits, the broker may still be writing its markers and answer with the offset before."""
        if not self.groups:
            return
        pending = {tp for buf in self.pending.values() for tp in buf.read_partitions()}
        idle = [tp for tp in self._partitions(self.groups) if (tp.topic, tp.partition) not in pending]
        if not idle:
            return
        known = {(tp.topic, tp.partition): max(tp.offset, self.committed.get((tp.topic, tp.partition), -1))
                 for tp in self.consumer.position(idle)}
        try:
            on_broker = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.committed(idle, timeout=10)}
        except KafkaException:
            metrics.BROKER_ERRORS.labels("offset-fetch").inc()
            return  # the broker is away: the next heartbeat looks again
        candidates = {(t, p): o for (t, p), o in known.items()
                      if o >= 0 and (t, p) in self.committed and o > on_broker.get((t, p), -1)}
        behind = [TopicPartition(t, p, o) for (t, p), o in candidates.items() if self.unsettled.get((t, p)) == o]
        self.unsettled = candidates
        if not behind:
            return
        lost = [tp for tp in behind if on_broker.get((tp.topic, tp.partition), -1) < self.committed[(tp.topic, tp.partition)]]
        if lost:
            log.warning("committed offsets read back behind this worker's commits; committing them again",
                        worker=self.worker_id, partitions=[f"{tp.topic}[{tp.partition}]" for tp in lost[:8]])
            metrics.OFFSETS_RECOMMITTED.labels("lost").inc(len(lost))
        if len(behind) > len(lost):
            metrics.OFFSETS_RECOMMITTED.labels("marker").inc(len(behind) - len(lost))
        try:
            self.consumer.commit(offsets=behind, asynchronous=False)
        except KafkaException:
            metrics.BROKER_ERRORS.labels("offset-commit").inc()
            return
        self.committed.update({(tp.topic, tp.partition): tp.offset for tp in behind})
