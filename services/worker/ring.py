"""The join worker, PSP ring mode (seed 004).

Every ring worker reads its own hop topic `<job>.ring.<worker-id>` (one
partition: FIFO from its predecessor, which Property 1 rests on) and reacts to
each message with engine/psp/node.py; what it sends to the next node goes to
that node's hop topic in order, results to the results topic. A message to
itself (a ring of one, or a partial's lap around a one-node ring) stays in
process.

The worker the coordinator puts first in the ring is the head: it also reads
every partition of the m source topics, merges them in event-time order by
watermark (min over every source partition of the newest event time, minus the
allowed lateness; idle partitions left out, engine/watermark.py), sends
records older than that to the dead-letter topic, and every `ring.round_ms`
releases what the watermark lets go as one round. A round's RoundRelease goes
to the commits topic once its End is back, every node having flushed its
results before passing the End on: the release means "all written".

Restarts are fenced (there is no ring crash recovery yet): hop and source
consumers start from the beginning, so a restarted node would replay old
messages into empty slices. Every node incarnation announces itself with a
RingStart on the control topic and stamps its hop messages with it (the ring
epoch); a node finding an earlier RingStart of its own id at start reports
RingFailed and exits with RING_FENCED_EXIT instead of joining, hop messages of
another incarnation than the recorded one are rejected, and every node that
sees a RingFailed stops producing results (metric streamjoin_ring_failed, the
heartbeat's ring_failed, `streamjoin status`). A failed delivery of any ring
record fails the ring the same way.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import deque
from typing import Callable

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from streamjoin.engine.block import PART, TS, Block
from streamjoin.engine.predicates import compile_terms
from streamjoin.engine.psp.head import RoundPlanner, Sequencer, concat_pending, release_before
from streamjoin.engine.psp.messages import Build, End, Partial, Probe, RoundInfo
from streamjoin.engine.psp.messages import Message as RingMessage
from streamjoin.engine.psp.node import Outbox, RingNode
from streamjoin.engine.psp.plan import RingPlan, RingStream, count_column
from streamjoin.engine.psp.slices import G, SSEQ
from streamjoin.engine.watermark import InputClock
from streamjoin.schemas import control, ring as wire
from streamjoin.schemas.control import RING_FENCED_EXIT
from streamjoin.schemas.results import RoundRelease, dead_letter_headers
from streamjoin.services import kafka, metrics
from streamjoin.services.shutdown import StopFlag, started
from streamjoin.services.worker.intake import DeadRecord, RecordBuffer, decode_by_group, routing_for
from streamjoin.services.worker.processor import late_records
from streamjoin.services.worker.output import Deliveries, ResultWriter, flush, udf_dead_letters
from streamjoin.services.worker.main import stream_templates
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.worker.ring")
MAX_HOP_BYTES = 4 << 20  # a Build or Partial above this (NumPy bytes) is split; see _pieces


def ring_plan(job: JobSettings, orders: tuple[tuple[int, ...], ...] | None = None) -> RingPlan:
    """The query as the ring engine sees it (orders: the head's, from the coordinator)."""
    streams = tuple(RingStream(s.name, job.topic_of(s), s.window.range_ms, s.window.rows,
                               tuple(job.result_fields(s))) for s in job.streams)
    terms = compile_terms([s.name for s in job.streams], job.join.predicate, job.join.udfs)
    m = len(streams)
    return RingPlan(streams, terms, orders or tuple(tuple(j for j in range(m) if j != i) for i in range(m)))


def ring_templates(job: JobSettings) -> list[Block]:
    m = len(job.streams)
    extra = {G: np.empty(0, np.int64), SSEQ: np.empty(0, np.int64)}
    extra |= {count_column(k): np.empty(0, np.int64) for k in range(m)}
    return [Block(dict(t.columns) | extra) for t in stream_templates(job)]


class RingWorker:
    def __init__(self, job: JobSettings, cluster: kafka.Cluster, worker_id: str, metrics_port: int | None = None) -> None:
        self.job, self.cluster, self.id = job, cluster, worker_id
        self.metrics_port = job.worker.metrics_port if metrics_port is None else metrics_port
        self.plan = ring_plan(job)
        self.node = RingNode(worker_id, self.plan, ring_templates(job))
        self.hop_in = cluster.consumer(f"{job.consumer_group}-ring-{worker_id}")
        self.out = cluster.producer()
        self.control_in = cluster.consumer(f"{job.consumer_group}-{worker_id}-control")
        self.local: deque[RingMessage] = deque()
        self.passing: tuple[RingMessage, wire.Record] | None = None  # the message being handled, as received
        self.head: RingHead | None = None
        self.deliveries = Deliveries()
        self.results = ResultWriter(job, self.out, self.deliveries, every_report=True)
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.metrics_url = ""
        self.dead_seen: set[tuple[int, int, int]] = set()
        self.incarnation = uuid.uuid4().hex
        self.incarnations: dict[str, str] = {}  # node -> the incarnation the ring started with
        self.failed = ""  # why the ring stopped producing results; "" while it runs

    # ------------------------------------------------------------------ main
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (services/shutdown.py), then stop cleanly."""
        self.stop_flag.install()
        self.metrics_url = metrics.serve_url(self.metrics_port, self.health)
        if not started(self.stop_flag, self._start_up, log, "ring worker stopped before it started", worker=self.id):
            return
        self.hop_in.assign([TopicPartition(self.job.hop_topic(self.id), 0, OFFSET_BEGINNING)])
        self.control_in.assign([TopicPartition(self.job.control_topic, 0, OFFSET_BEGINNING)])
        self.health.ready, self.health.detail = True, "running"
        log.info("ring worker started", worker=self.id, incarnation=self.incarnation, metrics=self.metrics_url)
        last_beat = 0.0
        while not self.stop_flag.set:
            self._poll_control()
            for m in self.hop_in.consume(500, 0.005 if self.head else 0.05):
                if m.error() is not None:
                    metrics.BROKER_ERRORS.labels(m.error().name()).inc()
                elif self._current(*wire.epoch_of(m.headers())):
                    self._guarded(self._handle, wire.decode(m.value(), m.headers()), wire.Record(m.value(), m.headers()))
            self._guarded(self._drain_local)
            if self.head is not None and not self.failed:
                self._guarded(self.head.tick)
            if self.deliveries.errors and not self.failed:
                self._fail("delivery", str(self.deliveries.errors[0]))
            if time.monotonic() - last_beat >= self.job.worker.heartbeat_ms / 1000:
                self._heartbeat()
                last_beat = time.monotonic()
        self.hop_in.close()
        self.control_in.close()
        self._guarded(flush, self.out, self.deliveries)
        log.info("ring worker stopped", worker=self.id)

    def _start_up(self) -> None:
        kafka.wait_for_broker(self.cluster, log)
        ensure_hop_topic(self.job, self.cluster, self.id)
        self._announce()

    def stop(self) -> None:
        self.stop_flag.request()

    # ---------------------------------------------------------------- fencing
    def _announce(self) -> None:
        """Read the control topic to its end; if this node id started before in this job, report
        the ring failed and exit with RING_FENCED_EXIT, else record this incarnation (RingStart)."""
        while self.job.control_topic not in self.cluster.admin().list_topics(timeout=30).topics:
            time.sleep(0.5)  # the coordinator creates it
        for m in kafka.read_partition(self.cluster, self.job.control_topic, 0, 0, f"{self.job.consumer_group}-{self.id}-fence"):
            msg = control.decode_control(m.value())
            if isinstance(msg, control.RingStart):
                self.incarnations.setdefault(msg.worker, msg.incarnation)
        if self.id in self.incarnations:
            self._fail("node-restarted", f"ring node {self.id} restarted (it started before as incarnation "
                                         f"{self.incarnations[self.id]}); its slices are lost and ring crash recovery "
                                         "does not exist yet: the ring stops producing results")
            self.out.flush(30)
            raise SystemExit(RING_FENCED_EXIT)
        start = control.RingStart(worker=self.id, incarnation=self.incarnation)
        self.out.produce(self.job.control_topic, value=control.encode(start), key=self.id.encode(), partition=0,
                         on_delivery=self.deliveries.report)
        flush(self.out, self.deliveries)
        self.incarnations[self.id] = self.incarnation

    def _current(self, node: str, incarnation: str) -> bool:
        """Whether a hop record from `node`'s `incarnation` belongs to this ring: not when the
        ring failed, nor when the ring started with another incarnation of that node."""
        if self.failed:
            return False
        known = self.incarnations.get(node)
        if known is None or known == incarnation:
            return True
        metrics.RING_STALE.inc()
        self._fail("stale-epoch", f"a hop message from {node} incarnation {incarnation or '?'}; the ring runs with {known}")
        return False

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
        msg = control.RingFailed(worker=self.id, reason=reason, detail=detail, wall_ms=_now_ms())
        self.out.produce(self.job.control_topic, value=control.encode(msg), key=self.id.encode(), partition=0,
                         on_delivery=_count_failed_delivery)
        self.out.poll(0)

    def _poll_control(self) -> None:
        for m in self.control_in.consume(100, 0):
            msg = control.decode_control(m.value()) if m.error() is None else None
            if isinstance(msg, control.RingLayout):
                self._on_layout(msg)
            elif isinstance(msg, control.RingStart):
                self.incarnations.setdefault(msg.worker, msg.incarnation)
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
                                                    self.job.ring.passive_rounds))
            log.info("ring head started", layout=list(layout))
        elif layout != self.head.target:
            self.head.resize(layout)

    # -------------------------------------------------------------- messages
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
        epoch = f"{self.id}:{self.incarnation}"
        if self.passing is not None and self.passing[0] is msg:
            # A Probe or Partial passing through: its record's bytes go on, not a re-encoding.
            record = self.passing[1]
            self.out.produce(self.job.hop_topic(node), value=record.value, headers=wire.restamp(record.headers, epoch),
                             partition=0, on_delivery=self.deliveries.report)
            return
        for piece in _pieces(msg):
            value, headers = wire.encode(piece, epoch)
            self.out.produce(self.job.hop_topic(node), value=value, headers=headers, partition=0,
                             on_delivery=self.deliveries.report)

    def _results(self, block: Block, info: RoundInfo | None) -> None:
        if len(block):
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
            self.out.produce(self.job.dead_letter_topic, value=value, partition=partition, headers=headers,
                             on_delivery=self.deliveries.report)

    def _heartbeat(self) -> None:
        for j, s in enumerate(self.node.slices.streams):
            metrics.RING_SLICE_TUPLES.labels(self.job.streams[j].name).set(len(s.rows))
        beat = control.Heartbeat(
            worker=self.id, wall_ms=int(time.time() * 1000), state_bytes=self.node.slices.nbytes,
            state_tuples=self.node.slices.tuples, metrics_url=self.metrics_url,
            lag=self.head.lag() if self.head else 0,
            ring_layout=list(self.head.planner.layout) if self.head else [],
            ring_busy=self.head.busy if self.head else False,
            ring_round=self.head.planner.next_round if self.head else 0, ring_failed=self.failed)
        # A lost heartbeat is retried by the next one: counted, but it does not fail the ring.
        self.out.produce(self.job.control_topic, value=control.encode(beat), key=self.id.encode(), partition=0,
                         on_delivery=_count_failed_delivery)
        self.out.poll(0)


class RingHead:
    """The head's duties: merge the sources by watermark, release rounds, run resizes."""

    def __init__(self, worker: RingWorker, planner: RoundPlanner) -> None:
        self.w, self.job, self.planner = worker, worker.job, planner
        self.target = planner.layout
        m = len(self.job.streams)
        self.sources = worker.cluster.consumer(self.job.consumer_group)
        metadata = worker.cluster.admin().list_topics(timeout=30).topics
        # Ring mode does not partition by key: every partition of every source topic, whatever their counts.
        self.source_partitions = [[TopicPartition(t, p) for p in sorted(metadata[t].partitions)]
                                  for t in self.job.input_topics]
        self.sources.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING)
                             for parts in self.source_partitions for tp in parts])
        self.topic_stream = {t: i for i, t in enumerate(self.job.input_topics)}
        self.buffers: dict[int, RecordBuffer] = {}
        self.sequencer = Sequencer(m)
        self.pending = [_empty(b) for b in stream_templates(self.job)]
        self.clock = InputClock([len(parts) for parts in self.source_partitions], self.job.join.allowed_lateness_ms,
                                self.job.join.idle_timeout_ms, _now_ms())
        self.offsets: dict[tuple[str, int], int] = {}
        self.loaded: set[int] = set()  # rounds in flight that carry tuples
        self.last_release = 0.0
        self.paused: set[tuple[int, int]] = set()  # (stream, partition) whose intake waits for the rounds
        self.tuples_per_record: float | None = None  # latest decode's ratio (block records hold many)
        self.routing = routing_for(self.job, self.job.partitions)  # ring mode: no co-partitioning to check

    @property
    def busy(self) -> bool:
        return bool(self.loaded) or bool(self.planner.steps)

    def lag(self) -> int:
        return sum(len(b) for b in self.pending) + sum(len(b) for b in self.buffers.values())

    def resize(self, layout: tuple[str, ...]) -> None:
        for node in layout:
            ensure_hop_topic(self.job, self.w.cluster, node)
        self.planner.resize(layout)
        self.target = layout
        log.info("ring resize planned", layout=list(layout), relocation=self.job.ring.relocation)

    def on_done(self, info: RoundInfo) -> None:
        """Round `info` is back: its results are all written (send flushed before), so release it."""
        self.w.release_record(info)
        self.planner.on_done(info.round)
        self.loaded.discard(info.round)
        metrics.RING_ROUNDS.inc()

    @property
    def watermark(self) -> int:
        return self.clock.watermark

    def tick(self) -> None:
        self._throttle()
        room = self._room()
        if not room:
            self.clock.hold(_now_ms())  # not reading: no partition's silence counts toward idleness
        for m in self.sources.consume(room, 0) if room else ():
            self._take(m)
        self._decode()
        step = self.planner.step_ready()
        if step is not None:
            self.planner.apply(step)
            log.info("ring stage applied", layout=list(step.layout), handoff=step.handoff, rounds=step.rounds)
            if step.handoff:
                self._release(step.handoff)
            return
        due = time.monotonic() - self.last_release >= self.job.ring.round_ms / 1000
        if due and self.planner.can_release():
            self._release()

    def _throttle(self) -> None:
        """Intake backpressure, so a backlog is taken as the rounds go, not all at once: rounds
        stay near worker.max_batch_records tuples and the head's memory stays bounded. While a
        stream holds that many tuples, its source partitions ahead of the one holding the
        watermark back are paused (the consumer drops what it prefetched for them and resumes at
        the next offset). Pausing is per partition, as the watermark is: the partition holding
        it back is never paused, or nothing could be released. A paused partition is not idle."""
        cap, now = self.job.worker.max_batch_records, _now_ms()
        low = self.clock.low_newest(now)
        want = {(i, p) for i, b in enumerate(self.pending) if len(b) >= cap and low is not None
                for p in np.flatnonzero(self.clock.newest[i] > low).tolist()}
        for i, p in want ^ self.paused:
            (self.sources.pause if (i, p) in want else self.sources.resume)([self.source_partitions[i][p]])
        for i, p in want:
            self.clock.touch(i, np.array([p]), now)
        self.paused = want

    def _room(self) -> int:
        """Records to take this tick (0: none): what keeps the held tuples near
        worker.max_batch_records. Past it, one record at a time and only while fewer than that
        many could be released (the stream holding the watermark back must move). Until a
        decode has shown how many tuples a record holds, one record."""
        if self.tuples_per_record is None:
            return 1
        cap = self.job.worker.max_batch_records
        held = sum(len(b) for b in self.pending)
        if held < cap:
            return max(1, int((cap - held) / self.tuples_per_record))
        low = self.clock.low_newest(_now_ms())
        return 0 if low is not None and self._releasable(low) >= cap else 1

    def _releasable(self, low_max_ts: int) -> int:
        """Held tuples the next round would release if no more input came."""
        wm = max(low_max_ts - self.job.join.allowed_lateness_ms, self.watermark)
        return sum(int(np.count_nonzero(b[TS] < wm)) for b in self.pending if len(b))

    def _take(self, m: Message) -> None:
        if m.error() is not None:
            metrics.BROKER_ERRORS.labels(m.error().name()).inc()
            return
        self.buffers.setdefault(self.topic_stream[m.topic()], RecordBuffer()).add(m, m.partition())
        self.offsets[(m.topic(), m.partition())] = m.offset() + 1

    def _decode(self) -> None:
        """Buffered records -> pending tuples; malformed and late ones to the dead-letter topic."""
        for i, buf in self.buffers.items():
            if not len(buf):
                continue
            slices = decode_by_group(self.job, i, buf, self.routing, {}, now_ms=int(time.time() * 1000))
            dead: list[DeadRecord] = [d for sl in slices.values() for d in sl.dead]
            blocks = [sl.block for sl in slices.values()]
            block = Block({k: np.concatenate([b[k] for b in blocks]) for k in blocks[0].names})
            self.tuples_per_record = max(1.0, len(block) / len(buf), 0.5 * (self.tuples_per_record or 1.0))
            late = block[TS] < self.watermark
            if late.any():  # hash mode's convention: a block record's late tuples go as a block of just those
                dead += late_records(self.job, i, -1, buf, block.filter(late), self.watermark)
            self._dead_letters(dead)
            fresh = block.filter(~late)
            self.clock.touch(i, np.unique(np.asarray(buf.partitions, np.int64)), _now_ms())
            if len(fresh):
                self.clock.observe(i, fresh[PART].astype(np.int64), fresh[TS])
                self.pending = concat_pending(self.pending, [fresh if k == i else _empty(p)
                                                             for k, p in enumerate(self.pending)])
        self.buffers = {}

    def _dead_letters(self, dead: list[DeadRecord]) -> None:
        for d in dead:
            topic = self.job.topic_of(self.job.streams[d.stream])
            self.w.out.produce(self.job.dead_letter_topic, value=d.value, key=d.key,
                               partition=d.partition % self.job.partitions, headers=dead_letter_headers(d.reason, d.detail, topic, d.partition, d.offset, -1, -1),
                               on_delivery=self.w.deliveries.report)
            metrics.DEAD_LETTER.labels(d.reason).inc()

    def _release(self, handoff: dict[str, str] | None = None) -> None:
        self._decode()
        before = self.watermark
        wm = self.clock.advance(_now_ms())
        released, self.pending = release_before(self.pending, wm)
        counts = tuple(self.sequencer.counts)
        tuples = self.sequencer.sequence(released)
        info = self.planner.next_info(before, counts, wm, handoff, now_ms=_now_ms())
        self.last_release = time.monotonic()
        if sum(len(b) for b in tuples):
            self.loaded.add(info.round)
            for i, b in enumerate(tuples):
                metrics.TUPLES_IN.labels(self.job.streams[i].name).inc(len(b))
        probe = Probe(info, tuple(tuples))
        # The Probe (and the Builds ahead of it) leave before the head probes the round itself.
        out = self.w.node.release(probe, int(time.time() * 1000), early=lambda ob: self.w.send(ob, probe))
        self.w.send(out, probe)
        self._commit()

    def _commit(self) -> None:
        if self.offsets:
            self.sources.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in self.offsets.items()],
                                asynchronous=True)


def _pieces(msg: RingMessage) -> list[RingMessage]:
    """A Build or Partial is a set of rows; a large one (a watermark jump moves a whole slice
    at once) travels as several of the same kind and round, in order, which the next node
    handles exactly as the one: it inserts them in turn, or probes them in turn. Each stays
    well under the broker's record size. Probes are bounded by the round size instead."""
    rows = msg.tuples if isinstance(msg, Build) else msg.rows if isinstance(msg, Partial) else None
    if rows is None or rows.nbytes <= MAX_HOP_BYTES:
        return [msg]
    cuts = np.linspace(0, len(rows), -(-rows.nbytes // MAX_HOP_BYTES) + 1).astype(np.int64)
    parts = [rows.take(np.arange(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]
    key = "tuples" if isinstance(msg, Build) else "rows"
    return [dataclasses.replace(msg, **{key: part}) for part in parts]


def _count_failed_delivery(err: KafkaError | None, _msg: Message) -> None:
    """Delivery report of a control record (heartbeat, RingFailed): a failure is counted."""
    if err is not None:
        metrics.BROKER_ERRORS.labels("control-delivery").inc()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _empty(block: Block) -> Block:
    return block.take(np.empty(0, np.int64))


def ensure_hop_topic(job: JobSettings, cluster: kafka.Cluster, node: str) -> None:
    """A ring node's inbox: one partition, so its predecessor's messages stay in order; created
    with the job's `topics.ring_hop` settings (concurrent creation by the head or the coordinator is fine)."""
    topics.create_missing(cluster.admin(), [topics.hop_plan(job, node)], timeout=30)


def run_ring_worker(job: JobSettings, cluster: kafka.Cluster, worker_id: str, metrics_port: int | None = None) -> None:
    RingWorker(job, cluster, worker_id, metrics_port).run()
