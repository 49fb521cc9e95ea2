"""A ring node: the join worker of PSP ring mode.

Every ring worker reads its own hop topic `<job>.ring.<worker-id>` (one
partition: FIFO from its predecessor, which Property 1 rests on) and reacts to
each message with engine/psp/node.py; what it sends to the next node goes to
that node's hop topic in order, results to the results topic. A message to
itself (a ring of one, or a partial's lap around a one-node ring) stays in
process.

The worker the coordinator puts first in the ring is the head
(ring/head.py): it reads every partition of the m source
topics, merges them by watermark and every `ring.round_ms` releases what the
watermark lets go as one round. A round's RoundRelease goes to the commits
topic once its End is back, every node having flushed its results before
passing the End on: the release means "all written".

Crash recovery (`ring.recovery`, on by default). The ring lives in epochs: every
node incarnation starts one with a RingStart on the epochs topic
`<job>.ring-epochs` (schemas/ring_epochs.py), numbered by that record's offset,
and stamps its hop records with the epoch it is in. Every node reading a
RingStart rolls back to the checkpoint the RingStart names: it rebuilds its
slices from the round log, learns which results were written since (their ids,
which re-driven rounds make again and the writer then skips), and the head
re-drives the rounds logged after the checkpoint and reads again what it had
read from its sources before it releases new ones (ring/head.py).
A hop record of an older epoch is dropped; one of a newer epoch makes the node
read the epochs topic up to it first. The coordinator may hand a silent node's
id to a standby (RingReplace, on the same topic): ids are worked out from that
log, so a replaced process that comes back takes the standby's id. Results and
dead letters go in Kafka transactions under the node's id
(ring/transactions.py), so the process a standby took the id from is fenced
and writes nothing the standby's rollback did not see.

With `ring.recovery: false` restarts are fenced instead: a node finding an
earlier start of its own id reports RingFailed and exits with
RING_FENCED_EXIT, and every node that sees a RingFailed stops producing
results (metric streamjoin_ring_failed, the heartbeat's ring_failed,
`streamjoin status`). A failed delivery of any ring record fails the ring the
same way in both modes.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from typing import Callable

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from streamjoin.engine.block import Block
from streamjoin.engine.psp.head import RoundPlanner
from streamjoin.engine.psp.messages import End, RoundInfo
from streamjoin.engine.psp.messages import Message as RingMessage
from streamjoin.engine.psp.node import Outbox, RingNode
from streamjoin.engine.psp.recovery import rebuild, slice_ranges
from streamjoin.schemas import control, ring as wire, ring_epochs
from streamjoin.schemas.control import RING_FENCED_EXIT
from streamjoin.schemas.results import RoundRelease
from streamjoin.schemas.ring_epochs import RingCheckpoint, RingReplace, RingStart
from streamjoin.services import collector, metrics
from streamjoin.services.io import kafka
from streamjoin.services.io.dead_letters import udf_dead_letters
from streamjoin.services.io.deliveries import Deliveries, count_failed_control_delivery, flush
from streamjoin.services.io.results import ResultSink, ResultWriter
from streamjoin.services.io.templates import ring_plan, ring_templates
from streamjoin.services.ring.head import RingHead, ensure_hop_topic, now_ms, ranges_json
from streamjoin.services.ring.recovery import checkpointed_rounds, ranges_of, unwritten, written_ids
from streamjoin.services.ring.transactions import RingTransactions
from streamjoin.services.shutdown import StopFlag, started
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.worker.ring")
CATCH_UP_S = 60.0  # how long a hop record of a newer epoch may wait for its RingStart to be readable


class RingWorker:
    def __init__(self, job: JobSettings, cluster: kafka.Cluster, worker_id: str, metrics_port: int | None = None) -> None:
        self.job, self.cluster, self.id = job, cluster, worker_id
        self.metrics_port = job.worker.metrics_port if metrics_port is None else metrics_port
        self.plan = ring_plan(job)
        self.templates = ring_templates(job)
        self.node = RingNode(worker_id, self.plan, self.templates)
        self.hop_in = cluster.consumer(f"{job.consumer_group}-ring-{worker_id}")
        self.out = cluster.producer()
        self.control_in = cluster.control_consumer(f"{job.consumer_group}-{worker_id}-control")
        self.epochs_in = cluster.consumer(f"{job.consumer_group}-{worker_id}-epochs")
        self.local: deque[RingMessage] = deque()
        self.passing: tuple[RingMessage, wire.Record] | None = None  # the message being handled, as received
        self.head: RingHead | None = None
        self.layout_msg: control.RingLayout | None = None  # the coordinator's latest
        self.deliveries = Deliveries()
        # Results and dead letters go in transactions under the node's id (ring/transactions.py),
        # opened by each incarnation.
        self.txn = RingTransactions(job, cluster, self.deliveries)
        self.results: ResultWriter | None = None
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.metrics_url = ""
        self.dead_seen: set[tuple[int, int, int]] = set()
        self.incarnation = uuid.uuid4().hex
        self.first_start: dict[str, str] = {}  # node -> its first incarnation (recovery off: fencing)
        self.epoch = -1  # the ring epoch this node is in: the offset of the latest RingStart read
        self.live = False  # this incarnation's own RingStart was read: RingStarts roll it back
        self.checkpoint: RingCheckpoint | None = None  # what the next rollback returns to
        self.written = np.empty(0, "S32")  # ids of results written since the checkpoint (re-driven ones skip them)
        self.reincarnate = False  # a RingReplace changed this process's id: start again under it
        self.recoveries = 0  # rollbacks of this process
        self.failed = ""  # why the ring stopped producing results; "" while it runs

    # ------------------------------------------------------------------ main
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (services/shutdown.py), then stop cleanly."""
        self.stop_flag.install()
        self.metrics_url = metrics.serve_url(self.metrics_port, self.health)
        if not started(self.stop_flag, self._start_up, log, "ring worker stopped before it started", worker=self.id):
            return
        self.control_in.assign([TopicPartition(self.job.control_topic, 0, OFFSET_BEGINNING)])
        self.health.ready, self.health.detail = True, "running"
        log.info("ring worker started", worker=self.id, incarnation=self.incarnation, epoch=self.epoch,
                 metrics=self.metrics_url)
        last_beat = 0.0
        while not self.stop_flag.set:
            self._poll_control()
            self._poll_epochs()
            if self.reincarnate:
                self._guarded(self._start_incarnation)
            for m in kafka.consume_ready(self.hop_in, 500, 0.005 if self.head else 0.05):
                self._on_hop_record(m)
            self._guarded(self._drain_local)
            if self.head is not None and not self.failed:
                self._guarded(self.head.tick)
            self._guarded(self.txn.tick)
            if self.deliveries.errors and not self.failed:
                self._fail("delivery", str(self.deliveries.errors[0]))
            if time.monotonic() - last_beat >= self.job.worker.heartbeat_ms / 1000:
                self._heartbeat()
                last_beat = time.monotonic()
        for consumer in (self.hop_in, self.control_in, self.epochs_in):
            consumer.close()
        self._guarded(self.txn.commit)
        self._guarded(flush, self.out, self.deliveries)
        log.info("ring worker stopped", worker=self.id)

    def _start_up(self) -> None:
        kafka.wait_for_broker(self.cluster, log)
        while self.job.ring_epochs_topic not in self.cluster.admin().list_topics(timeout=30).topics:
            time.sleep(0.5)  # the coordinator creates it
        end = kafka.end_offsets(self.cluster, [(self.job.ring_epochs_topic, 0)], f"{self.job.consumer_group}-{self.id}-ends")
        self.epochs_in.assign([TopicPartition(self.job.ring_epochs_topic, 0, OFFSET_BEGINNING)])
        self._read_epochs_until(lambda: self._epochs_position() >= end[(self.job.ring_epochs_topic, 0)])
        if not self.job.ring.recovery and self.id in self.first_start:
            self._fence()
        self._start_incarnation()

    def stop(self) -> None:
        self.stop_flag.request()

    # ---------------------------------------------------------------- epochs
    def _start_incarnation(self) -> None:
        """Start (again) under this process's id: read the hop topic from its end on (what is
        there belongs to an earlier epoch), announce a RingStart naming the checkpoint to roll
        back to, and wait until it is read back (the rollback happens there)."""
        self.reincarnate, self.live = False, False
        self._drop_head()
        self.results = ResultWriter(ResultSink.of_job(self.job), self.txn.start(self.id), self.deliveries,
                                    every_report=True)
        ensure_hop_topic(self.job, self.cluster, self.id)
        hop = self.job.hop_topic(self.id)
        end = kafka.end_offsets(self.cluster, [(hop, 0)], f"{self.job.consumer_group}-{self.id}-ends")[(hop, 0)]
        self.hop_in.assign([TopicPartition(hop, 0, end)])
        self.incarnation = uuid.uuid4().hex
        start = RingStart(worker=self.id, incarnation=self.incarnation,
                          checkpoint=self.checkpoint if self.job.ring.recovery else None, wall_ms=now_ms())
        self.write_durably(self.job.ring_epochs_topic, ring_epochs.encode(start), key=ring_epochs.start_key(start))
        self._read_epochs_until(lambda: self.live or self.reincarnate)
        if self.layout_msg is not None:
            self._on_layout(self.layout_msg)

    def _drop_head(self) -> None:
        if self.head is not None:
            self.head.sources.close()
            self.head = None

    def _epochs_position(self) -> int:
        at = self.epochs_in.position([TopicPartition(self.job.ring_epochs_topic, 0)])[0].offset
        return max(at, 0)

    def _read_epochs_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if self.stop_flag.set:
                raise SystemExit(0)
            self._poll_epochs(0.2)

    def _poll_epochs(self, timeout: float = 0) -> None:
        for m in self.epochs_in.consume(100, timeout):
            if m.error() is not None:
                metrics.BROKER_ERRORS.labels(m.error().name()).inc()
                continue
            record = ring_epochs.decode(m.value())
            if record is None:
                metrics.DEAD_LETTER.labels("ring-epochs-unreadable").inc()
            else:
                self._apply(m.offset(), record)

    def _apply(self, offset: int, record: ring_epochs.EpochRecord) -> None:
        """One record of the epochs topic, in order (see the module docstring)."""
        if isinstance(record, RingReplace):
            role = ring_epochs.play(self.id, record)
            if role != self.id:
                log.warning("ring id handed over", worker=self.id, becomes=role, node=record.node, standby=record.standby)
                self.id, self.reincarnate = role, self.live or self.reincarnate
                # Nothing more under the old id: no rollback, no head duty, until the main loop
                # starts the new id's incarnation (_start_incarnation).
                self.live = False
                self._drop_head()
        elif isinstance(record, RingStart):
            self.first_start.setdefault(record.worker, record.incarnation)
            self.live = self.live or (record.worker == self.id and record.incarnation == self.incarnation)
            if not self.job.ring.recovery:
                self.epoch = 0  # one epoch: a restart is fenced, not rolled back
                return
            self.epoch, self.checkpoint = offset, record.checkpoint
            metrics.RING_EPOCH.set(offset)
            if self.live:
                self._guarded(self._rollback, record)
        elif self.job.ring.recovery and record.epoch == self.epoch:
            self.checkpoint = record
            self.written = np.empty(0, "S32")  # a checkpoint comes after every re-driven round is back

    def _rollback(self, start: RingStart) -> None:
        """Back to the checkpoint `start` names: slices rebuilt from the round log, the ids of the
        results written since, and (the head) the rounds logged since queued to run again."""
        began = time.monotonic()
        self.txn.commit()  # this node's results so far are in what written_ids reads
        flush(self.out, self.deliveries)
        self.local.clear()
        self.passing = None
        group = f"{self.job.consumer_group}-{self.id}-log"
        rounds = checkpointed_rounds(self.job, self.cluster, group, self.checkpoint) if self.checkpoint else []
        self.node = RingNode(self.id, self.plan, self.templates)
        self.node.slices = rebuild(self.templates, ranges_of(self.checkpoint, self.id), [r.probe.tuples for r in rounds])
        self.written = written_ids(self.job, self.cluster, f"{self.job.consumer_group}-{self.id}-results",
                                   self.checkpoint.results_end if self.checkpoint else {})
        if self.head is not None:
            self.head.recover(self.checkpoint)
        metrics.RING_RECOVERIES.inc()
        self.recoveries += 1
        log.info("ring node rolled back", worker=self.id, epoch=self.epoch, started_by=start.worker,
                 checkpoint_round=self.checkpoint.at.next_round if self.checkpoint else 0,
                 tuples=self.node.slices.tuples, written_since=len(self.written),
                 seconds=round(time.monotonic() - began, 3))

    # ---------------------------------------------------------------- fencing
    def _fence(self) -> None:
        """Recovery off: this node id started before in this job and its slices are gone, so the
        ring stops (RingFailed) and this process exits with RING_FENCED_EXIT."""
        self._fail("node-restarted", f"ring node {self.id} restarted (it started before as incarnation "
                                     f"{self.first_start[self.id]}); its slices are lost and ring.recovery is "
                                     "off: the ring stops producing results")
        self.out.flush(30)
        raise SystemExit(RING_FENCED_EXIT)

    def _guarded(self, step: Callable[..., None], *args: object) -> None:
        """Run a ring step; a failed delivery (raised by a flush) fails the ring."""
        try:
            step(*args)
        except KafkaException as e:
            self._fail("delivery", str(e))

    def _fail(self, reason: str, detail: str) -> None:
        """The ring stops producing results: counted, reported on the control topic (every node
        stops), shown by the heartbeat and `streamjoin status`."""
        if self.failed:
            return
        self.failed = reason
        self.local.clear()
        metrics.RING_FAILED.labels(reason).set(1)
        self.health.detail = f"ring failed: {reason}"
        log.error("ring failed: no more results", worker=self.id, reason=reason, detail=detail)
        msg = control.RingFailed(worker=self.id, reason=reason, detail=detail, wall_ms=now_ms())
        self.out.produce(self.job.control_topic, value=control.encode(msg), key=self.id.encode(), partition=0,
                         on_delivery=count_failed_control_delivery)
        self.out.poll(0)

    def _poll_control(self) -> None:
        for m in self.control_in.consume(100, 0):
            msg = control.decode_control(m.value()) if m.error() is None else None
            if isinstance(msg, control.RingLayout):
                self.layout_msg = msg
                if self.live:
                    self._on_layout(msg)
            elif isinstance(msg, control.RingFailed) and not self.failed:
                self._fail(msg.reason, f"reported by {msg.worker}: {msg.detail}")

    def _on_layout(self, msg: control.RingLayout) -> None:
        layout = tuple(msg.layout)
        if not layout or layout[0] != self.id:
            return
        if self.head is None:
            orders = tuple(tuple(o) for o in msg.orders)
            self.head = RingHead(self, RoundPlanner(ring_plan(self.job, orders), layout, self.job.ring.max_rounds_in_flight,
                                                    self.job.ring.slice_cap_tuples, self.job.ring.relocation,
                                                    self.job.ring.passive_rounds, self.job.ring.head_weight))
            if self.job.ring.recovery:
                self.head.recover(self.checkpoint)  # this epoch's rollback, which ran before there was a head
            log.info("ring head started", layout=list(self.head.planner.layout))
        if layout != self.head.target:
            self.head.resize(layout)

    # -------------------------------------------------------------- messages
    def _on_hop_record(self, m: Message) -> None:
        """One hop record: dropped when sent in an older epoch (or the ring failed), handled
        once this node is in the record's epoch."""
        if m.error() is not None:
            metrics.BROKER_ERRORS.labels(m.error().name()).inc()
            return
        epoch = wire.epoch_of(m.headers())
        if epoch > self.epoch and self.job.ring.recovery:
            deadline = time.monotonic() + CATCH_UP_S
            self._read_epochs_until(lambda: self.epoch >= epoch or self.reincarnate or time.monotonic() > deadline)
        if self.failed or epoch != self.epoch or self.reincarnate:
            metrics.RING_STALE.inc()
            return
        try:
            msg = wire.decode(m.value(), m.headers())
        except wire.DECODE_ERRORS as e:  # no ring node wrote it
            metrics.DEAD_LETTER.labels("ring-hop-unreadable").inc()
            log.error("unreadable hop record dropped", worker=self.id, offset=m.offset(), error=repr(e))
            return
        if isinstance(msg, wire.Mark):
            self._guarded(self._on_mark, msg)
        else:
            self._guarded(self._handle, msg, wire.Record(m.value(), m.headers()))

    def _on_mark(self, mark: wire.Mark) -> None:
        """A checkpoint's Mark: back at the head it completes; elsewhere this node adds its
        slice ranges for the Mark's round (every earlier round is through here) and passes it on."""
        if self.head is not None and mark.layout and mark.layout[0] == self.id:
            self.head.on_mark_back(mark)
            return
        if self.id not in mark.layout:
            return
        self._drain_local()
        ranges = dict(mark.ranges) | {self.id: ranges_json(slice_ranges(self.node.slices, mark.round))}
        at = mark.layout.index(self.id)
        self.send_mark(mark.layout[(at + 1) % len(mark.layout)], wire.Mark(mark.round, mark.layout, ranges))

    def send_mark(self, node: str, mark: wire.Mark) -> None:
        value, headers = wire.encode(mark, self.epoch)
        self.out.produce(self.job.hop_topic(node), value=value, headers=headers, partition=0,
                         on_delivery=self.deliveries.report)
        self.out.poll(0)

    def _handle(self, msg: RingMessage, record: wire.Record | None = None) -> None:
        """React to `msg`; `record`: the hop record it was decoded from (None: it came from this
        node itself), sent on as it is if the node forwards `msg` unchanged."""
        self.passing = (msg, record) if record is not None else None
        started = time.perf_counter()
        # What the node forwards leaves before it probes: the next node works on the round meanwhile.
        out = self.node.handle(msg, int(time.time() * 1000), early=lambda ob: self.send(ob, msg))
        metrics.RING_HANDLE_SECONDS.observe(time.perf_counter() - started)
        metrics.RING_MESSAGES.labels(type(msg).__name__.lower()).inc()
        self.send(out, msg)
        self.passing = None

    def send(self, out: Outbox, cause: RingMessage) -> None:
        """Produce what handling `cause` made: results and dead letters first, then (an End
        among them: after a checked flush, so a round's End travels only behind its written
        results) the messages for the next node. Raises KafkaException on a failed delivery."""
        if self.failed:
            return
        info = cause.info if hasattr(cause, "info") else self.node.rounds.get(getattr(cause, "round", -1))
        for target, build in out.direct:  # handoffs must land before the next round: flush now
            self._produce(target, build)
            flush(self.out, self.deliveries)
        for block in out.results:
            self._results(block, info)
        for trigger, rows, detail in out.failures.entries:
            self._udf_dead_letters(trigger, rows, detail)
        if out.round_done is not None or any(isinstance(m, End) for m in out.to_next):
            self.txn.commit()
            flush(self.out, self.deliveries)
        if out.to_next:
            nxt = info.next_of(self.id) if info is not None else self.id
            for msg in out.to_next:
                if nxt == self.id:
                    self.local.append(msg)
                else:
                    self._produce(nxt, msg)
        if out.round_done is not None and self.head is not None:
            self.head.on_done(out.round_done)
        self.out.poll(0)

    def _drain_local(self) -> None:
        while self.local:
            self._handle(self.local.popleft())

    def _produce(self, node: str, msg: RingMessage) -> None:
        epoch = self.epoch
        if self.passing is not None and self.passing[0] is msg:
            # A Probe or Partial passing through: its record's bytes go on, not a re-encoding.
            record = self.passing[1]
            self.out.produce(self.job.hop_topic(node), value=record.value, headers=wire.restamp(record.headers, epoch),
                             partition=0, on_delivery=self.deliveries.report)
            return
        for piece in wire.hop_pieces(msg):
            value, headers = wire.encode(piece, epoch)
            self.out.produce(self.job.hop_topic(node), value=value, headers=headers, partition=0,
                             on_delivery=self.deliveries.report)

    def _results(self, block: Block, info: RoundInfo | None) -> None:
        block = unwritten(block, self.written)  # a re-driven round's results written before the rollback
        if len(block):
            assert self.results is not None  # an incarnation started
            self.results.write(block, blocks_key=self.id.encode())
            if info is not None:
                metrics.RING_RESPONSE_SECONDS.observe_many((block["produced_ms"] - info.released_ms) / 1000.0)

    def release_record(self, info: RoundInfo) -> None:
        """The round's release on the commits topic, once its End is back (every node flushed
        its results first): all its results are written, inputs below its watermark are joined for good."""
        release = RoundRelease(node=self.id, round=info.round, watermark=info.watermark)
        self.out.produce(self.job.commits_topic, value=release.model_dump_json().encode(), key=self.id.encode(),
                         partition=0, on_delivery=self.deliveries.report)

    def _udf_dead_letters(self, trigger: int, rows: Block, detail: str) -> None:
        """The trigger records whose probe the UDF failed on, once per record and node; the
        value is the member tuples the UDF was given, as an Arrow block."""
        for value, partition, headers in udf_dead_letters(self.job, trigger, rows, detail, self.dead_seen):
            self.write_dead_letter(value, None, partition, headers)

    # ------------------------------------------------ what the ring head asks of its node

    def write_dead_letter(self, value: bytes | None, key: bytes | None, partition: int, headers: list) -> None:
        """A dead letter, in this node's open output transaction."""
        self.txn.producer.produce(self.job.dead_letter_topic, value=value, key=key, partition=partition,
                                  headers=headers, on_delivery=self.deliveries.report)

    def commit_output(self) -> None:
        """Commit the results and dead letters written so far (the output transaction)."""
        self.txn.commit()

    def write_durably(self, topic: str, value: bytes, key: bytes | None = None, headers: list | None = None) -> None:
        """A record on partition 0 of a log topic (round log, checkpoints), flushed with
        every record this node sent before it."""
        self.out.produce(topic, value=value, key=key, headers=headers, partition=0, on_delivery=self.deliveries.report)
        flush(self.out, self.deliveries)

    def flush_sent(self) -> None:
        """Wait until every record this node sent outside its output transaction is written."""
        flush(self.out, self.deliveries)

    def delivered_ends(self) -> dict[tuple[str, int], int]:
        """The newest offset delivered per (topic, partition)."""
        return self.deliveries.newest

    def has_local_work(self) -> bool:
        """Messages this node sent to itself are still to be handled."""
        return bool(self.local)

    def _recovery_status(self) -> dict[str, float]:
        """What the heartbeat (and `streamjoin status`) says about crash recovery."""
        status = {"epoch": float(self.epoch), "recoveries": float(self.recoveries)}
        if self.head is not None:
            status |= {"redriven": float(self.head.redriven_total), "recovery_s": self.head.last_recovery_s}
        return status

    def _heartbeat(self) -> None:
        for j, s in enumerate(self.node.slices.streams):
            metrics.RING_SLICE_TUPLES.labels(self.job.streams[j].name).set(len(s.rows))
        beat = control.Heartbeat(
            worker=self.id, wall_ms=int(time.time() * 1000), state_bytes=self.node.slices.nbytes,
            state_tuples=self.node.slices.tuples, metrics_url=self.metrics_url,
            lag=self.head.lag() if self.head else 0,
            ring_layout=list(self.head.planner.layout) if self.head else [],
            ring_busy=self.head.busy if self.head else False,
            ring_round=self.head.planner.next_round if self.head else 0, ring_failed=self.failed,
            ring_recovery=self._recovery_status())
        # A lost heartbeat is retried by the next one: counted, but it does not fail the ring.
        self.out.produce(self.job.control_topic, value=control.encode(beat), key=self.id.encode(), partition=0,
                         on_delivery=count_failed_control_delivery)
        self.out.poll(0)


def run_ring_worker(job: JobSettings, cluster: kafka.Cluster, worker_id: str, metrics_port: int | None = None) -> None:
    collector.settle()
    RingWorker(job, cluster, worker_id, metrics_port).run()
