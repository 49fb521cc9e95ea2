"""Writing a cycle's batches: dead letters first, then one result record per
(group, batch) — its commit marker, carrying the batch's input boundary —
then the input offsets, all in one Kafka transaction (or, with
`exactly_once: false`, flushed in that order and committed after).

Dead letters are flushed before results so that a visible result record
implies its batch's dead letters are durable, even on a broker that shows
aborted transactions to read_committed readers (Tansu does).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from streamjoin.engine.block import Block
from streamjoin.schemas.codecs import encode_block
from streamjoin.schemas.results import BatchHeader, dead_letter_headers
from streamjoin.services import metrics
from streamjoin.services.worker.processor import GroupBatch
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.worker.output")
ROWS_PER_CHUNK = 50_000  # fixed, so a replayed batch chunks identically
OUTPUT_COLUMNS_DROPPED = ("newest_arrival_ms",)


class Emitter:
    def __init__(self, job: JobSettings, producer: Producer, worker_id: str) -> None:
        self.job = job
        self.producer = producer
        self.worker_id = worker_id
        self.transactional = job.worker.exactly_once
        self._delivered: dict[tuple[str, int], int] = {}
        self._errors: list[KafkaError] = []

    def start(self) -> None:
        if self.transactional:
            # Also fences and aborts whatever a previous incarnation left open.
            _retry(lambda: self.producer.init_transactions(30))

    def emit(self, batches: list[GroupBatch], consumer: Consumer, offsets: list[TopicPartition],
             skip_dead: dict[int, set[tuple[str, int]]]) -> None:
        self._delivered.clear()
        self._errors.clear()
        with _stall_watchdog(self.job.worker.stall_timeout_ms / 1000):
            if self.transactional:
                self.producer.begin_transaction()
            if self._produce_dead_letters(batches, skip_dead):
                self._flush()
            for b in batches:
                self.produce_results(b)
            if self.transactional:
                self.producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
                _retry(lambda: self.producer.commit_transaction(60))
            else:
                self._flush()
                consumer.commit(offsets=offsets, asynchronous=False)
        if self._errors:
            raise KafkaException(self._errors[0])
        self._record_positions(batches)

    def abort(self) -> None:
        if self.transactional:
            try:
                self.producer.abort_transaction(30)
            except KafkaException:
                pass  # nothing open, or the broker is gone: recovery handles both

    def _produce_dead_letters(self, batches: list[GroupBatch], skip: dict[int, set[tuple[str, int]]]) -> int:
        n = 0
        for b in batches:
            already = skip.get(b.group, set())
            for d in b.dead:
                topic = self.job.topic_of(self.job.streams[d.stream])
                if (topic, d.offset) in already:
                    continue
                headers = dead_letter_headers(d.reason, d.detail, topic, b.group, d.offset, b.group, b.seq)
                self.producer.produce(self.job.dead_letter_topic, value=d.value, key=d.key, partition=b.group,
                                      headers=headers, on_delivery=self._on_delivery)
                metrics.DEAD_LETTER.labels(d.reason).inc()
                n += 1
        return n

    def produce_results(self, b: GroupBatch, only_chunks: set[int] | None = None) -> None:
        results = Block({k: v for k, v in b.results.columns.items() if k not in OUTPUT_COLUMNS_DROPPED})
        n = len(results)
        chunks = max(1, -(-n // ROWS_PER_CHUNK))
        for c in range(chunks):
            if only_chunks is not None and c not in only_chunks:
                continue
            part = results.take(slice(c * ROWS_PER_CHUNK, (c + 1) * ROWS_PER_CHUNK))  # type: ignore[arg-type]
            header = BatchHeader(b.group, b.seq, c, chunks, b.end, b.watermark, self.worker_id)
            self.producer.produce(self.job.results_topic, value=encode_block(part), key=str(b.group).encode(),
                                  partition=b.group, headers=header.encode(), on_delivery=self._on_delivery)
            self.producer.poll(0)

    def _flush(self) -> None:
        while self.producer.flush(30) > 0:
            metrics.BROKER_ERRORS.labels("flush-timeout").inc()

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(err)
            return
        key = (msg.topic(), msg.partition())
        self._delivered[key] = max(self._delivered.get(key, -1), msg.offset())

    def _record_positions(self, batches: list[GroupBatch]) -> None:
        for b in batches:
            ck = b.state.checkpoint
            res = self._delivered.get((self.job.results_topic, b.group))
            dlq = self._delivered.get((self.job.dead_letter_topic, b.group))
            b.state.checkpoint = ck.model_copy(update={
                "results_next": res + 1 if res is not None else ck.results_next,
                "dead_letter_next": dlq + 1 if dlq is not None else ck.dead_letter_next,
            })


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


def _retry(call, attempts: int = 20) -> None:  # type: ignore[no-untyped-def]
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
