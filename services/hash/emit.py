"""A hash cycle's writers (`Emitter`): the producer of one worker, its transactions
(io/transactions.py), its delivery reports, the one result writer (io/results.py), and the
groups' state writes to the changelog (`ChangelogWriter`). cycle.py says in what order a
cycle writes with them; `rewrite` is recovery's write of a replayed batch.

The transaction's own calls block in librdkafka, so with a caller's `meanwhile` work
they run on a helper thread while the main thread does that work; nothing else touches
the producer meanwhile.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import structlog
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from streamjoin.engine.block import Block
from streamjoin.schemas.results import BatchCommit, dead_letter_headers
from streamjoin.schemas.split_records import encode_split
from streamjoin.services import metrics
from streamjoin.services.hash.processor import GroupBatch
from streamjoin.services.io.deliveries import IDLE_WAIT_S, Deliveries, Meanwhile, flush
from streamjoin.services.io.results import ResultSink, ResultWriter
from streamjoin.services.io.transactions import RESTART_EXIT, Transactions, hard_exit
from streamjoin.settings import JobSettings
from streamjoin.state import changelog
from streamjoin.state.partition import group_of
from streamjoin.state.transaction import StateTransaction, Write

log = structlog.get_logger("streamjoin.worker.output")
Result = TypeVar("Result")


class ChangelogWriter:
    """Groups' state writes to partition g of the changelog (state/changelog.py): after a
    write, `offsets[g]` says where each state key's first record landed and `newest[g]` the
    last offset written, once the records are delivered."""

    def __init__(self, job: JobSettings, producer: Producer, deliveries: Deliveries) -> None:
        self.topic, self.producer, self.deliveries = job.changelog_topic, producer, deliveries
        self.offsets: dict[int, dict[bytes, int]] = {}
        self.newest: dict[int, int] = {}

    def write(self, writes: list[Write]) -> None:
        self.offsets, self.newest = {}, {}
        records = changelog.records(writes)
        for key, value in records:
            self.producer.produce(self.topic, key=key, value=value, partition=group_of(key), on_delivery=self._delivered)
        if records:
            metrics.CHANGELOG_RECORDS.labels("written").inc(len(records))
            metrics.CHANGELOG_BYTES.inc(sum(len(v) for _, v in records if v is not None))

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.deliveries.report(err, msg)
            return
        group, offset, key = msg.partition(), msg.offset(), changelog.base_key(msg.key())
        mine = self.offsets.setdefault(group, {})
        mine[key] = min(mine.get(key, offset), offset)
        self.newest[group] = max(self.newest.get(group, -1), offset)


class Emitter:
    """A hash-mode cycle's writers, as the module docstring says."""

    def __init__(self, job: JobSettings, producer: Producer, worker_id: str) -> None:
        self.job = job
        self.producer = producer
        self.worker_id = worker_id
        self.epoch = 0  # the placement epoch the worker holds its groups at: stamped on every batch commit
        self.transactional = job.worker.exactly_once
        self.transactions = Transactions(producer, job.transactions, worker=worker_id)
        self.deliveries = Deliveries()
        self.results = ResultWriter(ResultSink.of_job(job), producer, self.deliveries,
                                    every_report=not self.transactional)
        self.changelog = ChangelogWriter(job, producer, self.deliveries) if job.worker.changelog else None
        # Runs the transaction's blocking calls while the main thread does its `meanwhile` work.
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transaction")

    def start(self) -> None:
        if self.transactional:
            # Also fences and aborts whatever a previous incarnation left open.
            self.transactions.init()

    def begin(self) -> None:
        """Open the cycle's transaction (none without `exactly_once`)."""
        if self.transactional:
            self.transactions.begin()

    def flush(self, meanwhile: Meanwhile | None = None) -> None:
        """Wait for every record written so far; fail on any not delivered. `meanwhile()` is
        done while the broker acknowledges (None: the wait blocks)."""
        flush(self.producer, self.deliveries, meanwhile)

    def log_state(self, writes: list[Write]) -> None:
        """Hand a prepared state transaction's `writes` to the changelog (when the job keeps
        one) in the open transaction."""
        if self.changelog is not None:
            self.changelog.write(writes)

    def logged(self, batches: list[GroupBatch]) -> None:
        """Tell each batch's state where its changelog records landed (their transaction committed)."""
        if self.changelog is None:
            return
        for b in batches:
            b.state.logged_at(self.changelog.offsets.get(b.group, {}), self.changelog.newest.get(b.group, -1) + 1)

    def commit(self, consumer: Consumer, offsets: list[TopicPartition], meanwhile: Meanwhile | None = None) -> None:
        """End what was produced: with the input `offsets`, in the transaction or after it;
        `meanwhile()` is done while the broker acknowledges (None: the calls block)."""
        if self.transactional:
            group = consumer.consumer_group_metadata()

            def end_transaction() -> None:
                self.transactions.send_offsets(offsets, group)
                self.transactions.commit()
            self._while_waiting(end_transaction, meanwhile)
        else:
            flush(self.producer, self.deliveries, meanwhile)
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=False)
        self.deliveries.check()

    def _while_waiting(self, call: Callable[[], Result], meanwhile: Meanwhile | None) -> Result:
        """`call()`'s result (or its exception): made on the helper thread while `meanwhile()`
        runs here, each time it finds work and otherwise after a short wait, until the call ends."""
        if meanwhile is None:
            return call()
        pending = self._helper.submit(call)
        while not pending.done():
            if not meanwhile():
                wait_for([pending], timeout=IDLE_WAIT_S)
        return pending.result()

    def rewrite(self, results: Block, batch: GroupBatch, consumer: Consumer, offsets: list[TopicPartition],
                tx: StateTransaction) -> None:
        """Write a replayed `batch`'s missing `results`, and its staged state `tx` to the
        changelog, then commit its input `offsets`.

        The batch is decided already (its commit record is in the commits topic), so its
        offsets need no transaction: they are committed directly once the rest is in,
        and a batch with nothing to write opens no transaction at all. Offsets sent in a
        transaction without records are what Tansu 0.6 drops (measured: the group's offset
        stayed behind, and a drained partition showed lag for good)."""
        self.deliveries.clear()
        writes = tx.prepare()
        if len(results) or batch.split_out or (self.changelog is not None and writes):
            self.begin()
            # A decided batch's split records may be missing (a broker that shows the aborted
            # transaction's commit record): written again, their slots take each batch once.
            self.produce_splits([batch])
            self.results.write(results, group=batch.group)
            self.flush()
            self.log_state(writes)
            if self.transactional:
                self.transactions.commit()
            else:
                flush(self.producer, self.deliveries)
            self.deliveries.check()
            self.logged([batch])
        if offsets:
            consumer.commit(offsets=offsets, asynchronous=False)

    def abort(self) -> None:
        if self.transactional:
            self.transactions.abort()  # nothing open, or the broker is gone: recovery handles both

    def produce_commit(self, b: GroupBatch) -> None:
        commit = BatchCommit(group=b.group, seq=b.seq, end=b.end, watermark=b.watermark, results=len(b.results),
                             worker=self.worker_id, epoch=self.epoch, now_ms=b.now_ms,
                             generation_start=b.state.checkpoint.generation_start, splits_applied=b.splits_applied)
        self.producer.produce(self.job.commits_topic, value=commit.model_dump_json().encode(),
                              key=str(b.group).encode(), partition=b.group, on_delivery=self.deliveries.report)

    def produce_dead_letters(self, batches: list[GroupBatch], skip: dict[int, set[tuple[str, int, int]]]) -> int:
        n = 0
        for b in batches:
            already = skip.get(b.group, set())
            for d in b.dead:
                topic = d.topic or self.job.topic_of(self.job.streams[d.stream])
                if (topic, d.partition, d.offset) in already:
                    continue
                headers = dead_letter_headers(d.reason, d.detail, topic, d.partition, d.offset, b.group, b.seq)
                self.producer.produce(self.job.dead_letter_topic, value=d.value, key=d.key, partition=b.group,
                                      headers=headers, on_delivery=self.deliveries.report)
                metrics.DEAD_LETTER.labels(d.reason).inc()
                n += 1
        return n

    def produce_splits(self, batches: list[GroupBatch]) -> int:
        """Each batch's records to its slots (split hot keys: services/hash/split.py), on the slot's
        partition of `<job>.split`. Written after the batches' commit records: a visible one implies
        its batch was decided, with the boundary a replay reaches again."""
        n = 0
        for b in batches:
            for slot, record in b.split_out:
                key, value, headers = encode_split(record)
                self.producer.produce(self.job.split_topic, value=value, key=key, headers=headers,
                                      partition=slot - self.job.partitions, on_delivery=self.deliveries.report)
                n += 1
        return n

    def produce_forwards(self, batches: list[GroupBatch]) -> int:
        n = 0
        for b in batches:
            for f in [*b.forwards, *b.notes]:  # a progress note after the forwards it speaks for
                self.producer.produce(self.job.by_key_topic(self.job.streams[f.stream]), value=f.value, key=f.key,
                                      partition=f.partition, timestamp=f.timestamp, headers=f.headers(),
                                      on_delivery=self.deliveries.report)
                n += 1
            if b.forwards:
                metrics.REPARTITIONED.labels(self.job.streams[b.forwards[0].stream].name).inc(len(b.forwards))
            self.producer.poll(0)
        return n

    def positions(self, group: int) -> dict[str, int]:
        """Where in `group`'s results, commits and dead-letter partitions the next batch begins,
        as far as this cycle's delivered records say (cycle.record_positions keeps them)."""
        newest = self.deliveries.newest
        return {name: newest[(topic, group)] + 1 for name, topic in (
            ("results_next", self.job.results_topic), ("commits_next", self.job.commits_topic),
            ("dead_letter_next", self.job.dead_letter_topic)) if (topic, group) in newest}


@contextmanager
def stall_watchdog(seconds: float) -> Iterator[None]:
    """librdkafka's blocking calls cannot be interrupted, and a broker that drops
    connections mid-transaction can leave one waiting for good (seen on Tansu).
    Crash-only: end the process, and let the supervisor (Kubernetes, the local
    launcher) restart it; recovery then fences the old transaction and replays."""
    def fire() -> None:
        log.error("Kafka commit stalled; exiting for a clean restart", stalled_s=seconds)
        hard_exit(RESTART_EXIT)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
