"""One SplitJoin core against Kafka, exactly once across crashes.

Core i reads every partition of every source topic (manual assignment, at the positions
its checkpoint names), merges them into the one input order every core derives alike
(engine/splitjoin/input_order.py), and every `splitjoin.batch_ms` releases what the
watermark lets go to its SplitCore, which stores its share (per-stream sequence mod k = i),
probes every tuple and expires. A record with a mark header (schemas/splitjoin.py) is
applied at its place between the tuples before and after it: a scale mark switches the
storage modulus, a tick moves an idle partition's event time.

Each release is one Kafka transaction (transactional.id `<job>-core-<i>`), in this order:
core 0's dead letters (malformed and late records: every core sees the same ones, core 0
always exists, so only it writes them; every core counts them), this core's UDF-failure
dead letters, the release's records on partition i of `<job>.splitjoin.out`; a flush and
step `core-output-written`; the state writes on partition i of `<job>.splitjoin.changelog`
(state/splitjoin.py: the block it stored, tombstones, the tuples the order took, core 0's
bootstrap snapshots), a flush, the checkpoint, a flush and step `core-checkpointed`; commit.
A release that changed nothing is not written.

Start: init_transactions first (it fences the previous incarnation and settles its
transaction), then restore: from this core's newest checkpoint (`own`); without one, from
the beginning of every source partition (`fresh`, a core of the job's first k), or, for a
core a scale added, from the newest usable snapshot core 0 wrote when it read the scale
mark everywhere (`bootstrap`; waits while there is none). Records after the checkpoint are
an attempt that died: the order it restores to is read again, and its results are the
same, so the merger drops the repeats by `through`. A transaction that fails is aborted and
the core restored again, the same way.

A core that stores nothing any more and holds nothing (scaled away, its window expired),
with no later epoch that has it and no scale mark under way, writes its last release
(retired) once it has read its sources to their end, and exits 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from streamjoin.engine.block import TS, Block, concat
from streamjoin.engine.splitjoin.core import CoreOutput
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.schemas import control
from streamjoin.schemas.results import dead_letter_headers
from streamjoin.schemas.splitjoin import (CoreMeta, ScaleMark, SplitJoinWireError, encode_core_release, mark_of,
                                          schedule_epochs)
from streamjoin.services import collector, faults, metrics
from streamjoin.services.io import kafka
from streamjoin.services.io.dead_letters import DeadRecord, late_records, udf_dead_letters
from streamjoin.services.io.deliveries import Deliveries, count_failed_control_delivery
from streamjoin.services.io.intake import RecordBuffer, decode_by_group, routing_for
from streamjoin.services.io.templates import ring_plan, ring_templates, stream_templates
from streamjoin.services.io.transactions import Transactions, exit_if_fenced
from streamjoin.services.shutdown import Stopped, StopFlag, started
from streamjoin.settings import JobSettings
from streamjoin.state import changelog
from streamjoin.state import splitjoin as state
from streamjoin.state import splitjoin_records as core_records
from streamjoin.state.transaction import Write
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.splitjoin.core")
TAIL_RECORDS = 64  # first look-back for a changelog partition's newest checkpoint; widened 8x while none is found
POLL_S = 0.01  # one consume's wait: librdkafka waits all of it when fewer records than asked for arrive
WAIT_LOG_S = 5.0  # how often a core waiting for its bootstrap snapshot says so
RETIRE_CHECK_S = 1.0  # least time between two reads of the sources' ends by a core about to retire
Delivered = Callable[[KafkaError | None, Message], None]  # a produce's delivery report


@dataclass(frozen=True)
class Found:
    """A changelog partition's newest checkpoint, its offset, and records of the partition's
    tail (from the checkpoint's `low` on when read for a rebuild)."""

    checkpoint: core_records.CoreCheckpoint
    offset: int
    records: list[core_records.Record]


class CoreService:
    def __init__(self, job: JobSettings, cluster: kafka.Cluster, position: int, worker_id: str,
                 metrics_port: int | None = None) -> None:
        """position: this core's index (< splitjoin.max_cores); worker_id: its name in heartbeats
        and crash steps; metrics_port: None = worker.metrics_port."""
        if job.join.mode != "splitjoin":
            raise ValueError(f"a SplitJoin core needs join.mode splitjoin, job {job.job} has {job.join.mode!r}")
        if not 0 <= position < job.splitjoin.max_cores:
            raise ValueError(f"core position {position} is outside 0..{job.splitjoin.max_cores - 1} "
                             "(splitjoin.max_cores: the core topics have that many partitions)")
        self.job, self.cluster, self.position, self.id = job, cluster, position, worker_id
        self.metrics_port = job.worker.metrics_port if metrics_port is None else metrics_port
        self.producer = cluster.producer(f"{job.job}-core-{position}")
        self.transactions = Transactions(self.producer, job.transactions, core=position)
        self.control_out = cluster.producer()
        self.group = f"{job.consumer_group}-core-{position}"
        self.sources = cluster.consumer(self.group)
        self.deliveries = Deliveries()
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.metrics_url = ""
        self.topic_stream = {t: i for i, t in enumerate(job.input_topics)}
        self.routing = routing_for(job, job.partitions)  # no co-partitioning: every core reads everything
        self.spec: state.CoreSpec  # from the source topics' metadata, once the broker answers
        self.tuples_per_record: float | None = None  # the latest decode's ratio (a block record holds many)
        self.last_retire_check = 0.0

    # ------------------------------------------------------------------ main
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (services/shutdown.py) or retirement, then stop cleanly."""
        self.stop_flag.install()
        self.metrics_url = metrics.serve_url(self.metrics_port, self.health)
        if not started(self.stop_flag, self._start_up, log, "core stopped before it started", core=self.position):
            return
        self.health.ready, self.health.detail = True, "running"
        log.info("core started", core=self.position, worker=self.id, metrics=self.metrics_url)
        try:
            self._loop()
        except Stopped:
            log.info("core stopped while restoring", core=self.position)
        finally:
            self.health.ready, self.health.detail = False, "stopped"
            self.sources.close()
            self.control_out.flush(5)
        log.info("core stopped", core=self.position)

    def _start_up(self) -> None:
        kafka.wait_for_broker(self.cluster, log)
        topics.ensure(self.cluster.admin(), self.job)
        self.spec = self._spec()
        self.transactions.init()
        self._restore()

    def _spec(self) -> state.CoreSpec:
        """The core's query and its source partitions per stream, from the topics' metadata."""
        metadata = self.cluster.admin().list_topics(timeout=30).topics
        partitions = tuple(len(metadata[t].partitions) for t in self.job.input_topics)
        return state.CoreSpec(ring_plan(self.job), self.position, partitions, self.job.join.allowed_lateness_ms,
                              tuple(stream_templates(self.job)), tuple(ring_templates(self.job)),
                              self.job.splitjoin.punctuate_every)

    def _loop(self) -> None:
        last_release, last_beat = time.monotonic(), 0.0  # the first release takes a batch's worth of reading
        while not self.stop_flag.set:
            caught_up = self._poll()
            now = time.monotonic()
            if (now - last_release) * 1000 >= self.job.splitjoin.batch_ms:
                last_release = now
                if self._release(caught_up):
                    return
            if (now - last_beat) * 1000 >= self.job.worker.heartbeat_ms:
                self._heartbeat()
                last_beat = now

    # --------------------------------------------------------------- restore
    def _restore(self) -> None:
        """Rebuild the core (own checkpoint, fresh or bootstrap) and read on from where it stands."""
        started = time.perf_counter()
        end, found = self._newest_checkpoint(self.position, rebuild=True)
        if found is not None:
            restored = state.rebuild(self.spec, found.checkpoint, found.offset, found.records, end)
            source = "own"
        elif self.position < self.job.splitjoin.cores:
            restored, source = state.fresh(self.spec, Schedule.fixed(self.job.splitjoin.cores), end), "fresh"
        else:
            restored, source = self._bootstrap(end), "bootstrap"
        self.order, self.core, self.clog = restored.order, restored.core, restored.log
        self.positions = {(t, p): o for t, parts in restored.positions.items() for p, o in parts.items()}
        self.taken: list[list[Block]] = restored.unlogged
        self.buffers: dict[int, RecordBuffer] = {}
        self.dead: list[DeadRecord] = []
        ck = restored.checkpoint
        self.written = None if ck is None else (ck.through, ck.punctuation, ck.retired)
        self.written_order = None if ck is None else ck.order
        self._assign()
        metrics.SPLITJOIN_CORE_RESTORES.labels(source).inc()
        log.info("core restored", core=self.position, source=source, through=self.core.through,
                 batch=self.core.batch, window_tuples=self.core.state_tuples, held=self.order.held,
                 seconds=round(time.perf_counter() - started, 3))

    def _newest_checkpoint(self, partition: int, rebuild: bool) -> tuple[int, Found | None]:
        """The end of `partition` of the core changelog, and its newest checkpoint (None: it has
        none), with the records a rebuild needs ([low, checkpoint]) when `rebuild`. A checkpoint
        is its transaction's last record, so it is searched for in the tail."""
        topic, group = self.job.core_changelog_topic, f"{self.group}-restore"
        end = kafka.end_offsets(self.cluster, [(topic, partition)], group)[(topic, partition)]
        tail: list[core_records.Record] = []
        stop, span = end, TAIL_RECORDS
        while stop > 0:
            start = max(0, end - span)
            part = _records(kafka.read_partitions(self.cluster, topic, {partition: start}, group,
                                                  ends={partition: stop}))
            tail = part + tail
            found = state.newest_checkpoint(part)
            if found is not None:
                ck, at = found
                if rebuild and ck.low < start:
                    tail = _records(kafka.read_partitions(self.cluster, topic, {partition: ck.low}, group,
                                                          ends={partition: start})) + tail
                return end, Found(ck, at, tail)
            stop, span = start, span * 8
        return end, None

    def _bootstrap(self, end: int) -> state.Restored:
        """A core added by a scale: start from the newest snapshot core 0 wrote that gives it a
        share, waiting (and saying so every few seconds) while there is none."""
        topic, said = self.job.core_changelog_topic, 0.0
        while True:
            _, found = self._newest_checkpoint(0, rebuild=False)
            refs = [r for r in (found.checkpoint.bootstraps if found else []) if r.cores > self.position]
            for ref in reversed(refs):
                records = _records(kafka.read_partitions(self.cluster, topic, {0: ref.start}, f"{self.group}-restore",
                                                         ends={0: ref.end}))
                snap, pending = state.read_bootstrap(ref, records, self.spec)
                if snap.usable_by(self.position):
                    log.info("core bootstraps from core 0's snapshot", core=self.position, mark=ref.mark_id,
                             through=snap.order.next_g)
                    return state.bootstrap(self.spec, snap, pending, end)
            if refs:
                raise core_records.SplitJoinStateError(
                    f"core {self.position} has no checkpoint, yet scale marks {[r.mark_id for r in refs]} gave it a "
                    "share before core 0's snapshots of them: the tuples it stored then are lost (was it started "
                    "after the scale and crashed before its first release, with its changelog gone?)")
            if time.monotonic() - said >= WAIT_LOG_S:
                log.warning("waiting for core 0's snapshot of a scale mark that adds this core", core=self.position,
                            cores=self.job.splitjoin.cores)
                said = time.monotonic()
            time.sleep(1.0)

    def _assign(self) -> None:
        """Every partition of every source topic, at the restored position (else its beginning)."""
        wanted = [TopicPartition(t, p, self.positions.get((t, p), OFFSET_BEGINNING))
                  for t, n in zip(self.job.input_topics, self.spec.partitions) for p in range(n)]
        self.sources.assign(kafka.resolved(self.sources, wanted, 30))
        self.sources.resume(wanted)  # a restore after a failed release: nothing stays paused from before
        self.paused: set[tuple[int, int]] = set()

    # ----------------------------------------------------------------- intake
    def _poll(self) -> bool:
        """Take what the backpressure allows; True when a consume returned nothing (caught up)."""
        self._throttle()
        room = self._room()
        if not room:
            return False
        msgs = self.sources.consume(room, POLL_S)
        for m in msgs:
            self._take(m)
        if self.tuples_per_record is None and self.buffers:
            self._decode()  # how many tuples a record holds sizes the next consume
        return not msgs

    def _take(self, m: Message) -> None:
        if m.error() is not None:
            metrics.BROKER_ERRORS.labels(m.error().name()).inc()
            return
        stream, partition = self.topic_stream[m.topic()], m.partition()
        self.positions[(m.topic(), partition)] = m.offset() + 1
        try:
            mark = mark_of(m.headers())
        except SplitJoinWireError as e:
            self._dead_letters([DeadRecord(stream, -1, partition, m.offset(), m.key(), m.value(), "malformed", str(e))])
            return
        if mark is None:
            self.buffers.setdefault(stream, RecordBuffer()).add(m, partition)
            return
        self._decode()  # the tuples before the mark reach the order before it
        if isinstance(mark, ScaleMark):
            self._scale_mark(stream, partition, mark)
        else:
            self.order.advance(stream, partition, mark.ts)

    def _scale_mark(self, stream: int, partition: int, mark: ScaleMark) -> None:
        done = mark.id in self.order.done_marks
        self.order.scale_mark(stream, partition, mark.id, mark.cores)
        if done or mark.id not in self.order.done_marks:
            return
        switch = self.order.switches[-1]
        log.info("scale mark read in every source partition", core=self.position, mark=mark.id, cores=switch.cores,
                 after_ts=switch.after_ts)
        if self.position == 0:  # the snapshot the cores this scale adds start from
            self.clog.snapshot(self.order, self._positions(), mark.id, switch.cores)

    def _decode(self) -> None:
        """Buffered records -> the input order; malformed and late ones to the dead letters.
        No `future` check: it reads the wall clock, which cores would read differently."""
        for i, buf in self.buffers.items():
            slices = decode_by_group(self.job, i, buf, self.routing, {}, now_ms=None)
            dead = [d for sl in slices.values() for d in sl.dead]
            block = concat([sl.block for sl in slices.values()])
            self.tuples_per_record = max(1.0, len(block) / len(buf), 0.5 * (self.tuples_per_record or 1.0))
            late = self.order.add(i, block) if len(block) else block
            if len(late):
                dead += late_records(self.job, i, -1, buf, late, self.order.watermark)
            kept = state.taken(block, late)
            if len(kept):
                self.taken[i].append(kept)
            self._dead_letters(dead)
        self.buffers = {}

    def _dead_letters(self, dead: list[DeadRecord]) -> None:
        """Counted on every core, written by core 0 only (every core sees the same ones)."""
        for d in dead:
            metrics.DEAD_LETTER.labels(d.reason).inc()
        if self.position == 0:
            self.dead += dead

    def _throttle(self) -> None:
        """Intake backpressure, as the ring head's: while the order holds
        worker.max_batch_records tuples, the source partitions ahead of the one holding the
        watermark back are paused (never that one, or nothing could be released)."""
        want: set[tuple[int, int]] = set()
        if self._held() >= self.job.worker.max_batch_records:
            low = min(int(n.min()) for n in self.order.newest)
            want = {(i, p) for i, n in enumerate(self.order.newest) for p in np.flatnonzero(n > low).tolist()}
        for i, p in want ^ self.paused:
            tp = [TopicPartition(self.job.input_topics[i], p)]
            (self.sources.pause if (i, p) in want else self.sources.resume)(tp)
        self.paused = want

    def _room(self) -> int:
        """Records to take now (0: none), keeping the held tuples near worker.max_batch_records.
        Past it, one record at a time while fewer than that many could be released. Until a
        decode has shown how many tuples a record holds, one record."""
        if self.tuples_per_record is None:
            return 1
        cap, held = self.job.worker.max_batch_records, self._held()
        if held < cap:
            return max(1, int((cap - held) / self.tuples_per_record))
        watermark = self.order.watermark
        releasable = sum(int(np.count_nonzero(b[TS] < watermark)) for b in self.order.pending if len(b))
        return 0 if releasable >= cap else 1

    def _held(self) -> int:
        """Tuples read and not released: the order's, plus the buffered records' (estimated)."""
        buffered = sum(len(b) for b in self.buffers.values())
        return self.order.held + int(buffered * (self.tuples_per_record or 1.0))

    def _positions(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (t, p), o in self.positions.items():
            out.setdefault(t, {})[p] = o
        return out

    # ---------------------------------------------------------------- release
    def _release(self, caught_up: bool) -> bool:
        """Release what the order lets go, process it and write it; True once the core retired."""
        self._decode()
        from_g = self.core.through
        tuples = self.order.release()
        self.core.switch(self.order.schedule)
        horizon = self.order.horizon()
        out = self.core.process(tuples, horizon, int(time.time() * 1000), caught_up)
        meta = CoreMeta(core=self.position, from_g=from_g, through=out.through, punctuation=out.punctuation,
                        watermark=horizon.watermark, retired=out.retired, schedule=schedule_epochs(out.schedule),
                        switches=out.schedule.switches)
        order_state = core_records.OrderState.of(self.order)
        writes = self.clog.writes(self.core, self.order, self.taken)
        self._observe(tuples, out)
        written = (meta.through, meta.punctuation, meta.retired)
        if (writes or len(out.results) or out.failures.entries or self.dead or written != self.written
                or order_state != self.written_order):
            try:
                self._write(out, meta, writes)
            except KafkaException as e:
                self._failed(e)
                return False
            self.written, self.written_order = written, order_state
            self.taken = [[] for _ in self.taken]
            self.dead = []
        return self._retiring(caught_up)

    def _write(self, out: CoreOutput, meta: CoreMeta, writes: list[Write]) -> None:
        """One transaction, in the order the module docstring gives."""
        self.deliveries.clear()
        self.transactions.begin()
        for d in self.dead:
            topic = self.job.topic_of(self.job.streams[d.stream])
            self._produce(self.job.dead_letter_topic, d.value, d.key, d.partition % self.job.partitions,
                          dead_letter_headers(d.reason, d.detail, topic, d.partition, d.offset, -1, -1))
        self._udf_dead_letters(out)
        key = f"core-{self.position}".encode()
        for value, headers in encode_core_release(meta, out.results):
            self._produce(self.job.core_output_topic, value, key, self.position, headers)
        self.transactions.flush(self.deliveries)
        faults.reach("core-output-written")
        for k, v in changelog.records(self.clog.transaction(writes)):
            self._produce(self.job.core_changelog_topic, v, k, self.position, None, self._landed)
        self.transactions.flush(self.deliveries)
        ck = self.clog.checkpoint(self.core, self.order, self._positions(), meta.punctuation, meta.retired)
        self._produce(self.job.core_changelog_topic, ck.encode(), core_records.CHECKPOINT_KEY, self.position, None)
        self.transactions.flush(self.deliveries)
        faults.reach("core-checkpointed")
        self.transactions.commit()
        metrics.SPLITJOIN_CORE_RELEASES.inc()
        metrics.SPLITJOIN_CORE_RESULTS.inc(len(out.results))

    def _udf_dead_letters(self, out: CoreOutput) -> None:
        """The trigger records whose probe the UDF failed on, once per record in this release;
        the value is the member tuples the UDF was given, as an Arrow block."""
        seen: set[tuple[int, int, int]] = set()
        for trigger, rows, detail in out.failures.entries:
            for value, partition, headers in udf_dead_letters(self.job, trigger, rows, detail, seen):
                self._produce(self.job.dead_letter_topic, value, None, partition, headers)

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                 headers: list[tuple[str, bytes]] | None, on_delivery: Delivered | None = None) -> None:
        """One record in the open transaction, waiting for room while the local queue is full."""
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                                      on_delivery=on_delivery or self.deliveries.report)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _landed(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.deliveries.report(err, msg)
        else:
            self.clog.landed(msg.key(), msg.offset())

    def _failed(self, error: KafkaException) -> None:
        """A release that did not commit: fenced (a newer incarnation runs) ends the process;
        anything else is aborted and the core restored from its changelog again."""
        exit_if_fenced(error)
        log.warning("release failed; restoring the core", core=self.position, error=str(error))
        metrics.BROKER_ERRORS.labels("release").inc()
        self.transactions.abort()  # nothing open, or the broker is away: init settled it or the restore waits
        with self.stop_flag.interruptible():
            kafka.wait_for_broker(self.cluster, log)
            self._restore()

    def _retiring(self, caught_up: bool) -> bool:
        """Whether the core retires now: it stores nothing and holds nothing, no epoch of the
        schedule has it again, no scale mark is under way, and (read from the broker, at most
        once a RETIRE_CHECK_S) it has read every source partition to its end: a core
        restarted after a scale that gives it a share again must read that mark first."""
        order, core = self.order, self.core
        if not (caught_up and core.retired and not order.marks and not order.switches
                and order.schedule.stores_after(self.position, core.through) is None):
            return False
        if time.monotonic() - self.last_retire_check < RETIRE_CHECK_S:
            return False
        self.last_retire_check = time.monotonic()
        tps = [TopicPartition(t, p) for t, n in zip(self.job.input_topics, self.spec.partitions) for p in range(n)]
        ends = kafka.end_offsets(self.cluster, [(tp.topic, tp.partition) for tp in tps], f"{self.group}-ends")
        read = {(tp.topic, tp.partition): max(tp.offset, self.positions.get((tp.topic, tp.partition), 0))
                for tp in self.sources.position(tps)}
        if any(read[tp] < end for tp, end in ends.items()):
            return False
        log.info("core retired", core=self.position, through=core.through, schedule=schedule_epochs(order.schedule))
        return True

    # ------------------------------------------------------------- reporting
    def _observe(self, tuples: list[Block], out: CoreOutput) -> None:
        for j, spec in enumerate(self.job.streams):
            if len(tuples[j]):
                metrics.SPLITJOIN_CORE_TUPLES_IN.labels(spec.name).inc(len(tuples[j]))
            if out.stored[j]:
                metrics.SPLITJOIN_CORE_STORED.labels(spec.name).inc(out.stored[j])
            metrics.SPLITJOIN_CORE_STATE_TUPLES.labels(spec.name).set(len(self.core.windows.streams[j].rows))
        metrics.SPLITJOIN_CORE_STATE_BYTES.set(self.core.windows.nbytes)
        metrics.SPLITJOIN_CORE_THROUGH.set(out.through)
        if out.punctuation is not None:
            metrics.SPLITJOIN_CORE_PUNCTUATION.set(out.punctuation)
        metrics.SPLITJOIN_CORE_HELD.set(self.order.held)

    def _heartbeat(self) -> None:
        beat = control.Heartbeat(worker=self.id, wall_ms=int(time.time() * 1000), state_bytes=self.core.windows.nbytes,
                                 state_tuples=self.core.state_tuples, lag=self.order.held, metrics_url=self.metrics_url)
        self.control_out.produce(self.job.control_topic, value=control.encode(beat), key=self.id.encode(), partition=0,
                                 on_delivery=count_failed_control_delivery)
        self.control_out.poll(0)


def _records(msgs: list[Message]) -> list[core_records.Record]:
    return [(m.key(), m.value(), m.offset()) for m in msgs]


def run_core(job: JobSettings, cluster: kafka.Cluster, position: int, worker_id: str, metrics_port: int | None) -> None:
    """Run SplitJoin core `position` (0..splitjoin.max_cores - 1) until SIGTERM or retirement."""
    service = CoreService(job, cluster, position, worker_id, metrics_port)
    faults.install(job, worker_id)
    collector.settle()
    service.run()
