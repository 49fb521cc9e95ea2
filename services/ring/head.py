"""The ring head's duties: merge the sources by watermark, release rounds, run
resizes, and (with `ring.recovery`) log every round before it enters the ring, checkpoint the
ring when nothing is in flight, and after a rollback re-drive the logged rounds and resume
reading where the last logged round left the sources.

Released tuples are numbered by the sequencer and a round's Probe goes to the round log
`<job>.ring-rounds` (flushed) before any node sees it, with the head's state after it
(`HeadState`): the sequencer's and the planner's, the watermark and newest event times, and per
source partition where reading goes on (`read`) and where it resumes after a crash (`resume`:
the oldest record with a tuple still pending, else `read`). Source offsets are committed (the
`read` ones, for lag and `wait_ring_quiet`) only after the round is logged; recovery resumes
from the logged `resume` offsets, never from the committed ones.

After a rollback the records between `resume` and `read` are read again (the replay): their
tuples that were pending are pending again, the others were released before. Until every
partition has been read again up to its `read` offset the head releases no round and takes no
checkpoint, and reads only the partitions still being replayed: a round released earlier would
move the watermark past pending tuples not read yet (taken for released ones when they come)
and log a state that resumes past them, which the next rollback would lose.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from streamjoin.engine.block import OFF, PART, TS, Block
from streamjoin.engine.psp.head import RoundPlanner, Sequencer, concat_pending, release_before
from streamjoin.engine.psp.messages import Message as RingMessage, Probe, RoundInfo
from streamjoin.engine.psp.node import Outbox, RingNode
from streamjoin.engine.psp.recovery import Redrive, slice_ranges
from streamjoin.engine.watermark import NO_TIME, InputClock
from streamjoin.schemas import ring as wire, ring_epochs
from streamjoin.schemas.codecs import BLOCK_SHIFT
from streamjoin.schemas.results import dead_letter_headers, dead_letter_ref
from streamjoin.schemas.ring_epochs import LogMark, RingCheckpoint
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.services.io.dead_letters import DeadRecord, late_records
from streamjoin.services.io.intake import RecordBuffer, decode_by_group, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.ring.recovery import logged_rounds, start_mark
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.worker.ring")


class NodeProcess(Protocol):
    """What the head asks of the ring node it runs in (services/ring/node.py's RingWorker):
    its identity and engine, sending round the ring, and its writes."""

    job: JobSettings
    id: str
    epoch: int
    cluster: kafka.Cluster
    node: RingNode  # the node's engine (its slices, a round's release)

    def send(self, out: Outbox, cause: RingMessage) -> None: ...
    def send_mark(self, node: str, mark: wire.Mark) -> None: ...
    def release_record(self, info: RoundInfo) -> None: ...
    def write_dead_letter(self, value: bytes | None, key: bytes | None, partition: int, headers: list) -> None: ...
    def commit_output(self) -> None: ...
    def write_durably(self, topic: str, value: bytes, key: bytes | None = None, headers: list | None = None) -> None: ...
    def flush_sent(self) -> None: ...
    def delivered_ends(self) -> dict[tuple[str, int], int]: ...
    def has_local_work(self) -> bool: ...


class RingHead:
    """The head's duties: merge the sources by watermark, release rounds, run resizes, log
    rounds, checkpoint and re-drive, through the small interface of the node it runs in."""

    def __init__(self, ring_node: NodeProcess, planner: RoundPlanner) -> None:
        self.ring_node, self.job, self.planner = ring_node, ring_node.job, planner
        self.target = planner.layout
        m = len(self.job.streams)
        self.sources = ring_node.cluster.consumer(self.job.consumer_group)
        metadata = ring_node.cluster.admin().list_topics(timeout=30).topics
        # Ring mode does not partition by key: every partition of every source topic, whatever their counts.
        self.source_partitions = [[TopicPartition(t, p) for p in sorted(metadata[t].partitions)]
                                  for t in self.job.input_topics]
        self.sources.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING)
                             for parts in self.source_partitions for tp in parts])
        self.topic_stream = {t: i for i, t in enumerate(self.job.input_topics)}
        self.block_streams = {i for i, s in enumerate(self.job.streams) if s.format == "blocks"}
        self.buffers: dict[int, RecordBuffer] = {}
        self.sequencer = Sequencer(m)
        self.pending = [_empty(b) for b in stream_templates(self.job)]
        self.clock = InputClock([len(parts) for parts in self.source_partitions], self.job.join.allowed_lateness_ms,
                                self.job.join.idle_timeout_ms, now_ms())
        self.offsets: dict[tuple[str, int], int] = {}  # next offset to read per source partition
        # Per stream and source partition: records below this offset were read before a rollback
        # (their tuples were released, dead-lettered, or are pending again): none is dead-lettered twice.
        self.replay_below = [np.zeros(len(parts), np.int64) for parts in self.source_partitions]
        self.replaying: set[tuple[int, int]] = set()  # (stream, partition) not read again up to replay_below yet
        # Per dead-letter partition, an offset below every dead letter written after the last
        # state logged (from delivery reports), and the records a replay finds dead-lettered
        # there already (source topic, partition, offset): after a rollback, records read since
        # the last logged round are decided again, and none may be dead-lettered twice.
        self.dead_low: dict[int, int] = {}
        self.dead_written: set[tuple[str, int, int]] = set()
        self.loaded: set[int] = set()  # rounds in flight that carry tuples
        self.last_release = 0.0
        self.paused: set[tuple[int, int]] = set()  # (stream, partition) whose intake waits for the rounds
        self.tuples_per_record: float | None = None  # latest decode's ratio (block records hold many)
        self.routing = routing_for(self.job, self.job.partitions)  # ring mode: no co-partitioning to check
        self.redrive = Redrive([])
        self.redriven: set[int] = set()  # re-driven rounds not back yet
        self.recovering_since: float | None = None
        self.redriven_total, self.last_recovery_s = 0, 0.0
        self.marking: dict | None = None  # the checkpoint whose Mark is travelling the ring
        self.history: list[LogMark] = []
        self.last_checkpoint = time.monotonic()

    @property
    def busy(self) -> bool:
        return bool(self.loaded) or bool(self.planner.steps) or bool(self.redrive) or bool(self.replaying)

    def lag(self) -> int:
        return sum(len(b) for b in self.pending) + sum(len(b) for b in self.buffers.values())

    def resize(self, layout: tuple[str, ...]) -> None:
        for node in layout:
            ensure_hop_topic(self.job, self.ring_node.cluster, node)
        self.planner.resize(layout)
        self.target = layout
        log.info("ring resize planned", layout=list(layout), relocation=self.job.ring.relocation)

    def on_done(self, info: RoundInfo) -> None:
        """Round `info` is back: its results are all written (send flushed before), so release it."""
        self.ring_node.release_record(info)
        self.planner.on_done(info.round)
        self.loaded.discard(info.round)
        self.redriven.discard(info.round)
        metrics.RING_ROUNDS.inc()
        if self.recovering_since is not None and not self.redrive and not self.redriven:
            seconds = time.monotonic() - self.recovering_since
            metrics.RING_RECOVERY_SECONDS.set(seconds)
            self.last_recovery_s = round(seconds, 3)
            log.info("ring recovered: re-driven rounds are back", worker=self.ring_node.id, seconds=round(seconds, 3),
                     rounds=self.redrive.total)
            self.recovering_since = None

    @property
    def watermark(self) -> int:
        return self.clock.watermark

    # ------------------------------------------------------------- the loop
    def tick(self) -> None:
        if self._redrive():
            return
        self._throttle()
        room = self._room()
        if not room:
            self.clock.hold(now_ms())  # not reading: no partition's silence counts toward idleness
        for m in self.sources.consume(room, 0) if room else ():
            self._take(m)
        self._decode()
        if self.replaying:
            return  # no round, checkpoint or resize stage before the replay is done (module docstring)
        if self._checkpoint_due():
            return  # no release until the rounds in flight are back and the Mark is sent
        step = self.planner.step_ready() if self.marking is None else None
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
        it back is never paused, or nothing could be released. A paused partition is not idle.
        During a replay every partition already read again is paused: nothing is released
        meanwhile, so what they hold would only pile up."""
        cap, now = self.job.worker.max_batch_records, now_ms()
        low = self.clock.low_newest(now)
        if self.replaying:
            want = {(i, p) for i, parts in enumerate(self.source_partitions) for p in range(len(parts))
                    if (i, p) not in self.replaying}
        else:
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
        decode has shown how many tuples a record holds, one record. During a replay, the
        records still to read again, at most worker.max_batch_records a tick (only the
        partitions being replayed deliver)."""
        if self.replaying:
            left = sum(int(self.replay_below[i][p]) - self.offsets.get((self.job.input_topics[i], p), 0)
                       for i, p in self.replaying)
            return max(1, min(left, self.job.worker.max_batch_records))
        if self.tuples_per_record is None:
            return 1
        cap = self.job.worker.max_batch_records
        held = sum(len(b) for b in self.pending)
        if held < cap:
            return max(1, int((cap - held) / self.tuples_per_record))
        low = self.clock.low_newest(now_ms())
        return 0 if low is not None and self._releasable(low) >= cap else 1

    def _releasable(self, low_max_ts: int) -> int:
        """Held tuples the next round would release if no more input came."""
        wm = max(low_max_ts - self.job.join.allowed_lateness_ms, self.watermark)
        return sum(int(np.count_nonzero(b[TS] < wm)) for b in self.pending if len(b))

    def _take(self, m: Message) -> None:
        if m.error() is not None:
            metrics.BROKER_ERRORS.labels(m.error().name()).inc()
            return
        stream = self.topic_stream[m.topic()]
        self.buffers.setdefault(stream, RecordBuffer()).add(m, m.partition())
        self.offsets[(m.topic(), m.partition())] = m.offset() + 1
        if self.replaying and m.offset() + 1 >= self.replay_below[stream][m.partition()]:
            self.replaying.discard((stream, m.partition()))

    def _record_offsets(self, stream: int, block: Block) -> np.ndarray:
        """The Kafka offset of the record each tuple of `block` came in (a block record's tuples
        carry (offset << BLOCK_SHIFT) | index)."""
        return block[OFF] >> BLOCK_SHIFT if stream in self.block_streams else block[OFF]

    def _decode(self) -> None:
        """Buffered records -> pending tuples; malformed and late ones to the dead-letter topic.
        Records read again after a rollback (below `replay_below`) were decided before: their
        tuples are taken again only if they were pending (ts >= the watermark), and nothing of
        them is dead-lettered again."""
        for i, buf in self.buffers.items():
            if not len(buf):
                continue
            slices = decode_by_group(self.job, i, buf, self.routing, {}, now_ms=int(time.time() * 1000))
            replay = self.replay_below[i]
            dead: list[DeadRecord] = [d for sl in slices.values() for d in sl.dead if d.offset >= replay[d.partition]]
            blocks = [sl.block for sl in slices.values()]
            block = Block({k: np.concatenate([b[k] for b in blocks]) for k in blocks[0].names})
            self.tuples_per_record = max(1.0, len(block) / len(buf), 0.5 * (self.tuples_per_record or 1.0))
            again = self._record_offsets(i, block) < replay[block[PART]]
            old = block[TS] < self.watermark
            late = old & ~again
            if late.any():  # hash mode's convention: a block record's late tuples go as a block of just those
                dead += late_records(self.job, i, -1, buf, block.filter(late), self.watermark)
            self._dead_letters(dead)
            fresh = block.filter(~old)
            self.clock.touch(i, np.unique(np.asarray(buf.partitions, np.int64)), now_ms())
            if len(fresh):
                self.clock.observe(i, fresh[PART].astype(np.int64), fresh[TS])
                self.pending = concat_pending(self.pending, [fresh if k == i else _empty(p)
                                                             for k, p in enumerate(self.pending)])
        self.buffers = {}

    def _dead_letters(self, dead: list[DeadRecord]) -> None:
        for d in dead:
            topic = self.job.topic_of(self.job.streams[d.stream])
            if (topic, d.partition, d.offset) in self.dead_written:
                continue  # dead-lettered before the rollback
            self.ring_node.write_dead_letter(d.value, d.key, d.partition % self.job.partitions,
                                     dead_letter_headers(d.reason, d.detail, topic, d.partition, d.offset, -1, -1))
            metrics.DEAD_LETTER.labels(d.reason).inc()

    def _release(self, handoff: dict[str, str] | None = None) -> None:
        self._decode()
        before = self.watermark
        wm = self.clock.advance(now_ms())
        released, self.pending = release_before(self.pending, wm)
        counts = tuple(self.sequencer.counts)
        tuples = self.sequencer.sequence(released)
        info = self.planner.next_info(before, counts, wm, handoff, now_ms=now_ms())
        self.last_release = time.monotonic()
        for i, b in enumerate(tuples):
            metrics.TUPLES_IN.labels(self.job.streams[i].name).inc(len(b))
        probe = Probe(info, tuple(tuples))
        state = self.state()
        if self.job.ring.recovery:
            self._log(probe, state)
        self._send(probe)
        self._commit()

    def _send(self, probe: Probe) -> None:
        """Into the ring: the Probe (and the Builds ahead of it) leave before the head probes the round itself."""
        if sum(len(b) for b in probe.tuples):
            self.loaded.add(probe.info.round)
        out = self.ring_node.node.release(probe, now_ms(), early=lambda ob: self.ring_node.send(ob, probe))
        self.ring_node.send(out, probe)

    def _log(self, probe: Probe, state: dict) -> None:
        """The round and the head's state after it, durable before any node sees the round."""
        value, headers = wire.encode_logged(probe, self.ring_node.epoch, state)
        self.ring_node.commit_output()  # the dead letters of what the logged state says was read
        self.ring_node.write_durably(self.job.ring_log_topic, value, headers=headers)
        metrics.RING_LOGGED_BYTES.inc(len(value))

    def _commit(self) -> None:
        if self.offsets:
            self.sources.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in self.offsets.items()],
                                asynchronous=True)

    # ----------------------------------------------------------- recovery
    def state(self) -> dict:
        """The head's state after the round just released (JSON-able; see the module docstring).
        Never taken during a replay: `offsets` then lag behind what was read before the rollback."""
        read = {f"{t}:{p}": o for (t, p), o in self.offsets.items()}
        resume = dict(read)
        for i, block in enumerate(self.pending):
            if len(block):
                offsets = self._record_offsets(i, block)
                for p in np.unique(block[PART]).tolist():
                    key = f"{self.job.input_topics[i]}:{p}"
                    resume[key] = int(offsets[block[PART] == p].min())
        for (t, p), o in self.ring_node.delivered_ends().items():
            if t == self.job.dead_letter_topic:
                self.dead_low[p] = max(self.dead_low.get(p, 0), o + 1)
        return {"sequencer": self.sequencer.state(), "planner": self.planner.state(),
                "watermark": int(self.clock.watermark), "newest": [n.tolist() for n in self.clock.newest],
                "read": read, "resume": resume, "dead_low": {str(p): o for p, o in self.dead_low.items()}}

    def recover(self, checkpoint: RingCheckpoint | None) -> None:
        """Roll back to `checkpoint` (None: the ring's start): the head's state after the last
        round logged since, those rounds queued to run again, and the sources re-read from
        where the state says. The caller rebuilt the node's slices and flushed its producer."""
        at = checkpoint.at if checkpoint else LogMark(next_round=0, counts=[0] * len(self.job.streams), log_end=0)
        rounds = logged_rounds(self.job, self.ring_node.cluster, f"{self.job.consumer_group}-{self.ring_node.id}-log", at)
        state = rounds[-1].head if rounds else checkpoint.head if checkpoint else None
        self.history = list(checkpoint.history) if checkpoint else []
        self.pending = [_empty(b) for b in self.pending]
        self.buffers, self.loaded, self.marking, self.redriven = {}, set(), None, set()
        self.planner.in_flight = set()
        self._restore(state if state is not None else self._initial_state())
        self.redrive = Redrive(rounds)
        self.recovering_since = time.monotonic() if rounds else None
        # The next checkpoint is due checkpoint_ms after the one rolled back to, not after the
        # rollback: restarts closer together than that would otherwise keep postponing it, and
        # each rollback would re-drive every round since the ring started.
        since_ms = checkpoint.wall_ms if checkpoint else rounds[0].probe.info.released_ms if rounds else now_ms()
        self.last_checkpoint = time.monotonic() - max(0, now_ms() - since_ms) / 1000
        log.info("ring head rolled back", worker=self.ring_node.id, epoch=self.ring_node.epoch, redrive=len(rounds),
                 next_round=self.planner.next_round, replaying=len(self.replaying))

    def _initial_state(self) -> dict:
        """The state before any round: what a rollback with nothing logged returns to (tuples
        read but not released yet are read again from the sources' start)."""
        return {"sequencer": Sequencer(len(self.job.streams)).state(), "planner": self.planner.state(),
                "watermark": NO_TIME, "newest": [[NO_TIME] * len(n) for n in self.clock.newest], "read": {},
                "resume": {}}

    def _restore(self, state: dict) -> None:
        self.sequencer.restore(state["sequencer"])
        self.planner.restore(state["planner"])
        # The resize the restored planner is on its way to (if any); the coordinator resends its
        # wanted layout while the head's differs, and a differing target starts that resize again.
        self.target = self.planner.steps[-1].layout if self.planner.steps else self.planner.layout
        self.clock.watermark = int(state["watermark"])
        for i, newest in enumerate(state["newest"]):
            self.clock.newest[i][:] = np.asarray(newest, np.int64)
        self.clock.hold(now_ms())
        for replay in self.replay_below:
            replay[:] = 0
        for key, o in state["read"].items():
            topic, p = _partition_of(key)
            self.replay_below[self.topic_stream[topic]][p] = int(o)
        # Reading starts again at `resume`: offsets are where it is, replay_below where it was.
        resume = {_partition_of(key): int(o) for key, o in state["resume"].items()}
        self.offsets = dict(resume)
        assigned = [tp for parts in self.source_partitions for tp in parts]
        self.sources.assign([TopicPartition(tp.topic, tp.partition,
                                            resume.get((tp.topic, tp.partition), OFFSET_BEGINNING)) for tp in assigned])
        self.sources.resume(assigned)  # a pause outlives assign(): partitions paused before would stay silent
        self.paused = set()
        self.replaying = {(i, p) for i, parts in enumerate(self.source_partitions) for p, tp in enumerate(parts)
                          if self.offsets.get((tp.topic, tp.partition), 0) < self.replay_below[i][p]}
        self.dead_low = {int(p): int(o) for p, o in state.get("dead_low", {}).items()}
        self.dead_written = self._dead_letters_since(self.dead_low)

    def _dead_letters_since(self, low: dict[int, int]) -> set[tuple[str, int, int]]:
        """The input records dead-lettered at or past `low` (per dead-letter partition; absent:
        from its start), as (source topic, partition, offset). The caller flushed this node's
        producer, so its own dead letters are all there."""
        found = kafka.read_settled(self.ring_node.cluster, self.job.dead_letter_topic,
                                      {p: low.get(p, 0) for p in range(self.job.partitions)},
                                      f"{self.job.consumer_group}-{self.ring_node.id}-dead-letters", log)
        return {ref for m in found if (ref := dead_letter_ref(m.headers())) is not None}

    def _redrive(self) -> bool:
        """Release the logged rounds again, each once the rounds below its done_below are back.
        True while some are still queued: no new round goes before them."""
        while (logged := self.redrive.ready(self.planner.in_flight)) is not None:
            self.planner.in_flight.add(logged.round)
            self.redriven.add(logged.round)
            metrics.RING_REDRIVEN.inc()
            self.redriven_total += 1
            self._send(logged.probe)
        return bool(self.redrive)

    # --------------------------------------------------------- checkpoints
    def _checkpoint_due(self) -> bool:
        """With recovery on, every ring.checkpoint_ms (and no resize under way): hold releases
        until no round is in flight, then send a Mark. True while releases are held."""
        if not self.job.ring.recovery or self.marking is not None:
            return False
        if time.monotonic() - self.last_checkpoint < self.job.ring.checkpoint_ms / 1000:
            return False
        if self.planner.steps:
            return False  # a resize under way needs its rounds: checkpoint once it is done
        if self.planner.in_flight or self.ring_node.has_local_work():
            return True
        self._mark()
        return False

    def _mark(self) -> None:
        """Start a checkpoint at the round about to be released: note where the round log and
        the results end, then send the Mark round the ring (a ring of one completes at once)."""
        self.ring_node.flush_sent()
        results = [(self.job.results_topic, p) for p in range(self.job.partitions)]
        ends = kafka.end_offsets(self.ring_node.cluster, [(self.job.ring_log_topic, 0), *results],
                                 f"{self.job.consumer_group}-{self.ring_node.id}-ends")
        at = LogMark(next_round=self.planner.next_round, counts=list(self.sequencer.counts),
                     log_end=ends[(self.job.ring_log_topic, 0)])
        layout = self.planner.layout
        ranges = {self.ring_node.id: ranges_json(slice_ranges(self.ring_node.node.slices, at.next_round))}
        self.marking = {"at": at, "head": self.state(), "results": {p: ends[(t, p)] for t, p in results}}
        self.last_checkpoint = time.monotonic()
        if len(layout) == 1:
            self.on_mark_back(wire.Mark(at.next_round, layout, ranges))
        else:
            self.ring_node.send_mark(layout[1], wire.Mark(at.next_round, layout, ranges))

    def on_mark_back(self, mark: wire.Mark) -> None:
        """The Mark went round: write the checkpoint (the node reads it back and takes it)."""
        if self.marking is None or mark.round != self.marking["at"].next_round:
            return  # a Mark of before a rollback
        at: LogMark = self.marking["at"]
        start, kept = start_mark(self.history, at, mark.ranges)
        self.history = [*kept, at]
        checkpoint = RingCheckpoint(epoch=self.ring_node.epoch, at=at, start=start, history=self.history, ranges=mark.ranges,
                                    head=self.marking["head"], results_end=self.marking["results"], wall_ms=now_ms())
        self.ring_node.write_durably(self.job.ring_epochs_topic, ring_epochs.encode(checkpoint), key=ring_epochs.CHECKPOINT_KEY)
        self.marking = None
        metrics.RING_CHECKPOINTS.inc()


def ranges_json(ranges: tuple) -> list:
    """A node's per-stream `_sseq` runs as a Mark and a checkpoint carry them."""
    return [[list(run) for run in runs] for runs in ranges]


def ensure_hop_topic(job: JobSettings, cluster: kafka.Cluster, node: str) -> None:
    """A ring node's inbox: one partition, so its predecessor's messages stay in order; created
    with the job's `topics.ring_hop` settings (concurrent creation by the head or the coordinator is fine)."""
    topics.create_missing(cluster.admin(), [topics.hop_plan(job, node)], timeout=30)


def now_ms() -> int:
    """The wall clock in ms (rounds' release times, the clock's idleness)."""
    return int(time.time() * 1000)


def _partition_of(key: str) -> tuple[str, int]:
    """A HeadState offsets key `<topic>:<partition>` as (topic, partition)."""
    topic, _, p = key.rpartition(":")
    return topic, int(p)


def _empty(block: Block) -> Block:
    return block.take(np.empty(0, np.int64))
