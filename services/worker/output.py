"""Writing what the worker decides: the one result writer (hash groups and ring
rounds alike), and a hash cycle's output in one Kafka transaction.

A cycle writes, in this order:
  1. dead letters and forwards (misrouted records on their way to their
     group's by-key partition, then the progress notes: progress.py), then flushes;
  2. one commit record per (group, batch) on `<job>.commits`, then flushes;
  3. the batches' results, one record per result (or Arrow blocks), then
     flushes (the checkpoint records where they end);
  4. the groups' state writes on `<job>.changelog` (`worker.changelog`), each
     group's checkpoint last;
  5. the input offsets, and commits the transaction (with `exactly_once:
     false`: flushes, then commits the offsets).
The flushes make "visible" imply "durable before" even on a broker that
shows aborted transactions to read_committed readers (Tansu does): a visible
checkpoint in the changelog implies its batch's results, a visible result its
batch's commit record, which implies the batch's dead letters and forwards.
Recovery (recovery.py) relies on exactly that.

While the broker acknowledges (the flushes, the offsets and the commit: on
Tansu tens to hundreds of milliseconds a cycle), the caller's `meanwhile`
work runs instead of a blocked wait: the worker reads the next cycle's
records then (Worker._read_ahead). The transaction's own calls block in
librdkafka, so they run on a helper thread while the main thread does that
work; nothing else touches the producer meanwhile.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import numpy as np
import pyarrow as pa
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from streamjoin.engine.block import OFF, PART, Block, concat
from streamjoin.engine.outer import NEWEST_ARRIVAL
from streamjoin.engine.predicates import UDF_ERROR
from streamjoin.engine.psp.plan import prefixed
from streamjoin.schemas import result_codec
from streamjoin.schemas.codecs import encode_block
from streamjoin.schemas.columns import to_bytes_list
from streamjoin.schemas.results import BatchCommit, dead_letter_headers
from streamjoin.services import faults, metrics
from streamjoin.services.worker.processor import GroupBatch
from streamjoin.settings import JobSettings
from streamjoin.state import changelog
from streamjoin.state.partition import group_of
from streamjoin.state.transaction import StateTransaction, Write
from streamjoin.topology.partitioner import partitions_for_keys

log = structlog.get_logger("streamjoin.worker.output")
# Messages per produce_batch call: bounded, so a full local queue costs one short wait.
_BATCH_MESSAGES = 10_000
# Results under which a group's block is encoded together with the cycle's other small ones: an
# encode costs about half a millisecond a call whatever its size, but joining large blocks first
# costs a copy of every result (measured: 10% more CPU per tuple on a backlog drain).
SMALL_RESULTS = 4096
# How long one wait on the broker lasts when the `meanwhile` work found nothing to do: short, so
# that records arriving meanwhile are taken, long enough that polling costs nothing measurable.
_IDLE_WAIT_S = 0.01
_FLUSH_TIMEOUT_S = 30  # one flush's wait before it is metered as a timeout and waited again
Meanwhile = Callable[[], bool]  # work done while the broker acknowledges; returns whether it found any
Result = TypeVar("Result")


class Deliveries:
    """Delivery reports of one producer: the newest offset delivered per (topic, partition),
    and every failure. `check` raises the first failure."""

    def __init__(self) -> None:
        self.newest: dict[tuple[str, int], int] = {}
        self.errors: list[KafkaError] = []

    def report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err)
            metrics.BROKER_ERRORS.labels("delivery").inc()
            return
        key = (msg.topic(), msg.partition())
        self.newest[key] = max(self.newest.get(key, -1), msg.offset())

    def clear(self) -> None:
        self.newest.clear()
        self.errors.clear()

    def check(self) -> None:
        if self.errors:
            raise KafkaException(self.errors[0])


def flush(producer: Producer, deliveries: Deliveries, meanwhile: Meanwhile | None = None) -> None:
    """Wait for every queued record, then fail on any that was not delivered; `meanwhile`: work
    to do between short waits instead of one long one (None: just wait)."""
    while _waited(producer, meanwhile) > 0:
        metrics.BROKER_ERRORS.labels("flush-timeout").inc()
    deliveries.check()


def _waited(producer: Producer, meanwhile: Meanwhile | None) -> int:
    """Up to _FLUSH_TIMEOUT_S of waiting for the producer's queue to empty, `meanwhile` run
    between short waits; returns the records still queued."""
    if meanwhile is None:
        return _flushed(producer, _FLUSH_TIMEOUT_S)
    deadline = time.monotonic() + _FLUSH_TIMEOUT_S
    while True:
        # flush() with a tiny timeout still serves the delivery reports (flush(0) would not poll)
        remaining = _flushed(producer, 0.001 if meanwhile() else _IDLE_WAIT_S)
        if remaining == 0 or time.monotonic() >= deadline:
            return remaining


def _flushed(producer: Producer, timeout_s: float) -> int:
    """producer.flush(timeout_s). A transactional producer fenced by a newer one with its id (this
    worker was declared dead) makes confluent-kafka's flush raise a bare SystemError or the
    KafkaError itself instead of a KafkaException (both seen on Tansu): reported as the
    KafkaException it is, so the caller's fatal-error handling applies."""
    try:
        return producer.flush(timeout_s)
    except KafkaException:
        raise
    except Exception as e:  # noqa: BLE001 - the SystemError
        raise _fenced_in_flush(e) from e
    except BaseException:
        raise  # a stop request (services/shutdown.Stopped), KeyboardInterrupt, SystemExit
    except:  # noqa: E722 - the KafkaError raised bare is no BaseException: only a bare except matches it
        raise _fenced_in_flush(sys.exc_info()[1]) from None


def _fenced_in_flush(error: object) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, f"producer failed fatally in flush: {error!r}", fatal=True))


@dataclass(frozen=True)
class ResultSink:
    """Where a ResultWriter writes and what its records look like: `topic` with `partitions`
    partitions, records of `layout` in `format` (json, avro or blocks)."""

    topic: str
    partitions: int
    layout: result_codec.ResultLayout
    format: str

    @classmethod
    def of_job(cls, job: JobSettings) -> ResultSink:
        """A job's results topic, in the job's `output.format`."""
        return cls(job.results_topic, job.partitions, result_codec.result_layout(job), job.output.format)


class ResultWriter:
    """The one writer of results: a result block as `sink`'s records, produced in bulk (a
    job's results topic; the query service's sinks).

    `every_report`: ask for a delivery report of every record (needed without
    transactions, where a report is the only sign of a failed delivery); otherwise only
    each partition's last record of a call reports (its offset), and a failed delivery
    fails the transaction's commit."""

    def __init__(self, sink: ResultSink, producer: Producer, deliveries: Deliveries, every_report: bool) -> None:
        self.sink, self.producer, self.deliveries, self.every_report = sink, producer, deliveries, every_report
        self.layout, self.format = sink.layout, sink.format

    def write(self, block: Block, group: int | np.ndarray | None = None, blocks_key: bytes = b"") -> int:
        """Produce `block`'s results; hash mode passes its `group` (= the results partition of
        every key in it), the query router one partition per result, ring mode lets each key
        pick its partition. `blocks_key` keys the records of `output.format: blocks`. Returns
        the number of records produced."""
        if self.format == "blocks":
            values = result_codec.encode_blocks(block)
            return self._write(block, values, [blocks_key] * len(values), group)
        return self._write(block, *self._records(block), group)

    def write_groups(self, blocks: list[tuple[int, Block]]) -> int:
        """Produce each group's results to the group's partition (hash mode). The JSON or Avro
        records of the groups with few results (under SMALL_RESULTS) are encoded together, so a
        cycle of many lightly loaded groups pays an encode's fixed cost once, not per group.
        Returns the number of records produced.

        blocks: (group, its result block) per group of the cycle."""
        filled = [(group, block) for group, block in blocks if len(block)]
        small = [(group, block) for group, block in filled if len(block) < SMALL_RESULTS]
        if self.format == "blocks" or len(small) < 2:  # a blocks record holds one group's results
            small = []
        together = {group for group, _ in small}  # a cycle holds each group once
        written = sum(self.write(block, group=group) for group, block in filled if group not in together)
        if not small:
            return written
        block = concat([b for _, b in small])
        partitions = np.repeat(np.array([g for g, _ in small], np.int32), [len(b) for _, b in small])
        return written + self._write(block, *self._records(block), partitions)

    def _records(self, block: Block) -> tuple[list[bytes], pa.Array]:
        """The JSON or Avro values of `block`'s results and their keys."""
        encode = result_codec.encode_json if self.format == "json" else result_codec.encode_avro
        return encode(self.layout, block), result_codec.result_keys(self.layout, block)

    def _write(self, block: Block, values: list[bytes], keys: pa.Array | list[bytes],
               partitions: np.ndarray | int | None) -> int:
        """Produce `values` keyed by `keys` to `partitions` (one per record, one for all, or None:
        each key's own), and meter `block`, the results they hold."""
        if partitions is None:
            partitions = partitions_for_keys(keys, self.sink.partitions)
        elif isinstance(partitions, int):
            partitions = np.full(len(values), partitions, np.int32)
        if isinstance(keys, pa.Array):
            keys = to_bytes_list(keys)
        self._produce(keys, values, partitions)
        if len(block):
            metrics.RESULTS_OUT.inc(len(block))
        if len(block) and NEWEST_ARRIVAL in block.columns:  # the router's come from records, without it
            metrics.DELAY_SECONDS.observe_many((block["produced_ms"] - block[NEWEST_ARRIVAL]) / 1000.0)
        return len(values)

    def _produce(self, keys: list[bytes], values: list[bytes], partitions: np.ndarray) -> None:
        topic = self.sink.topic
        order = np.argsort(partitions, kind="stable")
        cuts = np.flatnonzero(np.diff(partitions[order])) + 1
        for rows in np.split(order, cuts):
            if not len(rows):
                continue
            messages = [{"key": keys[i], "value": values[i]} for i in rows.tolist()]
            if self.every_report:
                for m in messages:
                    m["callback"] = self.deliveries.report
            else:
                messages[-1]["callback"] = self.deliveries.report
            for lo in range(0, len(messages), _BATCH_MESSAGES):
                self._enqueue(topic, int(partitions[rows[0]]), messages[lo:lo + _BATCH_MESSAGES])

    def _enqueue(self, topic: str, partition: int, messages: list[dict]) -> None:
        """produce_batch, waiting for room while librdkafka's queue is full. A full queue fails a
        suffix of the batch (measured), so retrying that suffix keeps the records in order."""
        while messages:
            queued = self.producer.produce_batch(topic, messages, partition=partition)
            failed = messages[queued:]
            if any("_error" in m and m["_error"].code() != KafkaError._QUEUE_FULL for m in failed):
                raise KafkaException(next(m["_error"] for m in failed if "_error" in m))
            for m in failed:
                m.pop("_error", None)
            messages = failed
            if messages:
                self.producer.poll(0.05)


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
    """A hash-mode cycle's output, as the module docstring says."""

    def __init__(self, job: JobSettings, producer: Producer, worker_id: str) -> None:
        self.job = job
        self.producer = producer
        self.worker_id = worker_id
        self.epoch = 0  # the placement epoch the worker holds its groups at: stamped on every batch commit
        self.transactional = job.worker.exactly_once
        self.deliveries = Deliveries()
        self.results = ResultWriter(ResultSink.of_job(job), producer, self.deliveries,
                                    every_report=not self.transactional)
        self.changelog = ChangelogWriter(job, producer, self.deliveries) if job.worker.changelog else None
        # Runs the transaction's blocking calls while the main thread does its `meanwhile` work.
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transaction")

    def start(self) -> None:
        if self.transactional:
            # Also fences and aborts whatever a previous incarnation left open.
            retry_transactional(lambda: self.producer.init_transactions(30))

    def emit(self, batches: list[GroupBatch], consumer: Consumer, offsets: list[TopicPartition],
             skip_dead: dict[int, set[tuple[str, int, int]]], stage: Callable[[], StateTransaction],
             meanwhile: Meanwhile | None = None) -> None:
        """Write a cycle's batches and commit its input `offsets` (see the module docstring);
        dead letters named in `skip_dead[group]` were written by an attempt that died.

        `stage()` stages the batches' state (their checkpoints now record where their records
        ended) and returns the cycle's state transaction: its writes go to the changelog in
        this Kafka transaction, and the caller commits it to RocksDB once this returns.
        `meanwhile()` is done while the broker acknowledges (None: the waits block)."""
        self.deliveries.clear()
        with _stall_watchdog(self.job.worker.stall_timeout_ms / 1000):
            if self.transactional:
                self.producer.begin_transaction()
            if self._produce_dead_letters(batches, skip_dead) + self._produce_forwards(batches):
                flush(self.producer, self.deliveries, meanwhile)
            for b in batches:
                self.produce_commit(b)
            flush(self.producer, self.deliveries, meanwhile)
            self.results.write_groups([(b.group, b.results) for b in batches])
            flush(self.producer, self.deliveries, meanwhile)
            if any(b.cleanup is not None or b.read_back for b in batches):
                faults.reach("spill-written")  # results from spilled state written, not committed
            self._record_positions(batches)
            self.log_state(stage())
            self.commit(consumer, offsets, meanwhile)
        self._logged(batches)

    def log_state(self, tx: StateTransaction) -> None:
        """Hand `tx`'s writes to the changelog (when the job keeps one) in the open transaction."""
        writes = tx.prepare()
        if self.changelog is not None:
            self.changelog.write(writes)

    def _logged(self, batches: list[GroupBatch]) -> None:
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
                self.producer.send_offsets_to_transaction(offsets, group, 30)
                retry_transactional(lambda: self.producer.commit_transaction(60))
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
                wait_for([pending], timeout=_IDLE_WAIT_S)
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
        if len(results) or (self.changelog is not None and writes):
            if self.transactional:
                self.producer.begin_transaction()
            self.results.write(results, group=batch.group)
            flush(self.producer, self.deliveries)
            if self.changelog is not None:
                self.changelog.write(writes)
            if self.transactional:
                retry_transactional(lambda: self.producer.commit_transaction(60))
            else:
                flush(self.producer, self.deliveries)
            self.deliveries.check()
            self._logged([batch])
        if offsets:
            consumer.commit(offsets=offsets, asynchronous=False)

    def abort(self) -> None:
        if self.transactional:
            try:
                self.producer.abort_transaction(30)
            except KafkaException:
                pass  # nothing open, or the broker is gone: recovery handles both

    def produce_commit(self, b: GroupBatch) -> None:
        commit = BatchCommit(group=b.group, seq=b.seq, end=b.end, watermark=b.watermark, results=len(b.results),
                             worker=self.worker_id, epoch=self.epoch, now_ms=b.now_ms,
                             generation_start=b.state.checkpoint.generation_start)
        self.producer.produce(self.job.commits_topic, value=commit.model_dump_json().encode(),
                              key=str(b.group).encode(), partition=b.group, on_delivery=self.deliveries.report)

    def _produce_dead_letters(self, batches: list[GroupBatch], skip: dict[int, set[tuple[str, int, int]]]) -> int:
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

    def _produce_forwards(self, batches: list[GroupBatch]) -> int:
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

    def _record_positions(self, batches: list[GroupBatch]) -> None:
        """Where in the group's results, commits and dead-letter partitions the next batch begins."""
        newest = self.deliveries.newest
        for b in batches:
            ck = b.state.checkpoint
            nxt = {name: newest[(topic, b.group)] + 1 for name, topic in (
                ("results_next", self.job.results_topic), ("commits_next", self.job.commits_topic),
                ("dead_letter_next", self.job.dead_letter_topic)) if (topic, b.group) in newest}
            b.state.checkpoint = ck.model_copy(update=nxt)


def udf_dead_letters(job: JobSettings, trigger: int, rows: Block, detail: str, seen: set[tuple[int, int, int]]
                     ) -> list[tuple[bytes, int, list[tuple[str, bytes]]]]:
    """The dead letters for a probe the UDF failed on (ring nodes and SplitJoin cores), as (value,
    partition, headers), metered: one per trigger record not in `seen` (which it joins), its
    value the member tuples the UDF was given, as an Arrow block.

    job: the job; trigger: the probing stream's index; rows: the combined rows, one per failed
    candidate, with the trigger's partition and offset columns; detail: the UDF's error."""
    topic = job.topic_of(job.streams[trigger])
    parts, offs = rows[prefixed(trigger, PART)], rows[prefixed(trigger, OFF)]
    letters = []
    for k, (part, off) in enumerate(zip(parts.tolist(), offs.tolist())):
        if (trigger, part, off) in seen:
            continue
        seen.add((trigger, part, off))
        letters.append((encode_block(rows.take(np.array([k]))), part % job.partitions,
                        dead_letter_headers(UDF_ERROR, detail, topic, part, off, -1, -1)))
        metrics.DEAD_LETTER.labels(UDF_ERROR).inc()
    return letters


@contextmanager
def _stall_watchdog(seconds: float) -> Iterator[None]:
    """librdkafka's blocking calls cannot be interrupted, and a broker that drops
    connections mid-transaction can leave one waiting for good (seen on Tansu).
    Crash-only: end the process, and let the supervisor (Kubernetes, the local
    launcher) restart it; recovery then fences the old transaction and replays."""
    def fire() -> None:
        log.error("Kafka commit stalled; exiting for a clean restart", stalled_s=seconds)
        os._exit(75)  # EX_TEMPFAIL

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def retry_transactional(call, attempts: int = 20) -> None:  # type: ignore[no-untyped-def]
    """Retry a transactional call while the client says the error is retriable (broker away)."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as e:
            err = e.args[0]
            if not err.retriable() or attempt == attempts - 1:
                raise
            metrics.BROKER_ERRORS.labels("retriable").inc()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
