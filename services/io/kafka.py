"""Kafka clients in one place: every consumer, producer and admin client the
services, Spark jobs and CLI create comes from a `Cluster`, the bootstrap
address plus the job's `kafka:` settings (security, SASL, TLS, timeouts),
which override the defaults tuned here as measured on Tansu: small fetch
waits, large fetch sizes, manual assignment, short poll interval.
librdkafka's own log lines go to the structured log instead of stderr. Transactions
(and a transactional producer's settings) are transactions.py's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
import structlog

from streamjoin.settings import ConsumerSpec, TransactionSpec

if TYPE_CHECKING:
    from streamjoin.settings import JobSettings

_log = structlog.get_logger("streamjoin.kafka")


class _LibrdkafkaLog:
    """librdkafka's log lines as structured events: confluent-kafka calls `log(level,
    "%s [%s] %s", facility, client, message)` with a stdlib level, on librdkafka's threads."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        _log.log(level, fmt % args)


_LIBRDKAFKA_LOG = _LibrdkafkaLog()


@dataclass(frozen=True)
class Cluster:
    """A Kafka cluster as the job reaches it: `bootstrap` and the librdkafka
    properties every client gets on top of (and over) the defaults here.
    `repr` names the properties but never shows their values (secrets)."""

    bootstrap: str
    client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    transactions: TransactionSpec = field(default_factory=TransactionSpec, repr=False)
    consumers: ConsumerSpec = field(default_factory=ConsumerSpec, repr=False)

    @classmethod
    def of(cls, job: JobSettings, bootstrap: str | None = None) -> "Cluster":
        """The job's cluster: `bootstrap` (else the job's), with the job's `kafka:` settings."""
        address = bootstrap or job.bootstrap
        if not address:
            raise ValueError("no Kafka bootstrap given: set `bootstrap` in the job, STREAMJOIN_BOOTSTRAP or --bootstrap")
        return cls(address, job.kafka_client(), job.transactions, job.consumers)

    def __repr__(self) -> str:
        return f"Cluster(bootstrap={self.bootstrap!r}, client settings={sorted(self.client)})"

    def _base(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "logger": _LIBRDKAFKA_LOG,
            # A broker that is down or restarting is retried with backoff, not fatal.
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 5000,
            "retry.backoff.ms": 100,
            "retry.backoff.max.ms": 2000,
        }

    def _conf(self, tuned: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        # The job's settings win over our tuning; what a call needs for correctness (extra) wins over both.
        return self._base() | tuned | dict(self.client) | extra

    def admin(self) -> AdminClient:
        return AdminClient(self._conf({}, {}))

    def consumer(self, group: str, **extra: Any) -> Consumer:
        """A data consumer: the job's `consumers.fetch_wait_ms`."""
        tuned = _CONSUMER | {"fetch.wait.max.ms": self.consumers.fetch_wait_ms}
        return Consumer(self._conf(tuned, {"group.id": group} | extra))

    def control_consumer(self, group: str) -> Consumer:
        """A control-plane consumer (placement, moves, heartbeats): the job's
        `consumers.control_fetch_wait_ms`, whatever its `kafka:` section says."""
        return self.consumer(group, **{"fetch.wait.max.ms": self.consumers.control_fetch_wait_ms})

    def producer(self, transactional_id: str | None = None, **extra: Any) -> Producer:
        if transactional_id:
            extra = {"transactional.id": transactional_id, "transaction.timeout.ms": self.transactions.transaction_timeout_ms} | extra
        return Producer(self._conf(_PRODUCER, extra))


_CONSUMER: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "fetch.min.bytes": 1,
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 8 << 20,
    "queued.max.messages.kbytes": 256 << 10,
    # librdkafka waits this long (default 1 s) before fetching a partition again once its local
    # queue holds queued.min.messages: on a backlog drain that idles the fetcher between bursts
    # (one consumer reads 1.2M records/s with 10 ms).
    "fetch.queue.backoff.ms": 10,
    "max.poll.interval.ms": 30_000,
    "session.timeout.ms": 10_000,
}
_PRODUCER: dict[str, Any] = {
    "partitioner": "murmur2_random",  # Kafka's default (Java) partitioner, as topology/partitioner.py computes it
    "linger.ms": 5,
    "batch.size": 1 << 20,
    "message.max.bytes": 16 << 20,
    "compression.type": "none",
    "enable.idempotence": True,
}


# How long one consume() of a bounded read waits: it returns only when this runs out (or 10,000
# records came), so on small reads (a recovering or arriving group's) it is the read's latency.
READ_POLL_S = 0.02


def consume_ready(consumer: Consumer, max_messages: int, wait_s: float) -> list[Message]:
    """Up to `max_messages` records, returned as soon as there is one: waits up to `wait_s` for
    the first (poll returns when one arrives), then takes what else is queued without waiting.
    consume(n, timeout) instead waits its whole timeout out unless n records come, which on a
    latency path (a ring hop, a control step) idles the caller for the timeout every call."""
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)] if max_messages > 1 else [first]


def resolved(consumer: Consumer, partitions: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
    """`partitions` with their logical offsets (OFFSET_BEGINNING, OFFSET_END) made absolute by
    one ListOffsets request through `consumer`. Assigned as they are, logical offsets are
    looked up by librdkafka itself, which on a fresh consumer waits a fixed 500 ms for the
    leader first: that wait was most of a small read's latency (a moving group's restore).
    Not an end on its own (Tansu answers ListOffsets loosely, see end_offsets): a place to
    start fetching from, as the logical offset would have been."""
    logical = [tp for tp in partitions if tp.offset in (OFFSET_BEGINNING, OFFSET_END)]
    if not logical:
        return partitions
    # offsets_for_times reads a TopicPartition's offset as a timestamp: -2 earliest, -1 latest,
    # the same numbers as OFFSET_BEGINNING and OFFSET_END.
    found = {(tp.topic, tp.partition): tp.offset for tp in consumer.offsets_for_times(logical, timeout_s)}
    return [TopicPartition(tp.topic, tp.partition, found[(tp.topic, tp.partition)])
            if found.get((tp.topic, tp.partition), -1) >= 0 else tp for tp in partitions]


def end_offsets(cluster: Cluster, partitions: list[tuple[str, int]], group: str,
                isolation: str = "read_committed", timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
    """The end of each partition as of now: where a reader with `isolation` stops.

    Not ListOffsets alone: Tansu answers that with the last record batch's base
    offset + 1. A consumer assigned at the end fetches from that answer, and the
    fetch response's end-of-partition event carries the true end (the high
    watermark, or under read_committed the last stable offset) on any broker, at
    the cost of one small fetch per partition. Raises TimeoutError when a partition
    gives no end within `timeout_s`, KafkaException on any other error."""
    if not partitions:
        return {}
    c = cluster.consumer(group, **{"isolation.level": isolation, "enable.partition.eof": True})
    try:
        c.assign(resolved(c, [TopicPartition(t, p, OFFSET_END) for t, p in partitions], timeout_s))
        ends: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(partitions):
            for m in c.consume(10_000, READ_POLL_S):
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    ends.setdefault((m.topic(), m.partition()), m.offset())
                elif err is not None:
                    raise KafkaException(err)
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(ends))
                raise TimeoutError(f"no end of partition from {cluster.bootstrap} within {timeout_s}s for {missing[:5]}")
        return ends
    finally:
        c.close()


def read_settled(cluster: Cluster, topic: str, starts: dict[int, int], group: str, log: Any,
                 settle_s: float = 3.0) -> list[Message]:
    """As read_partitions, but first up to `settle_s` waiting for the transactions open now to
    end, reading to each partition's high watermark: read_partitions stops at the first open
    transaction and misses what was committed after it. Writers that commit every fraction of
    a second end theirs in time; one that died with a transaction open holds it until its id
    is taken over, and is not waited for longer (the read then stops where read_partitions
    does, and says so in the log)."""
    ends = end_offsets(cluster, [(topic, p) for p in starts], group, isolation="read_uncommitted")
    try:
        return read_partitions(cluster, topic, starts, group, settle_s, ends={p: e for (_, p), e in ends.items()})
    except TimeoutError as e:
        log.warning("a transaction stayed open; reading what is committed before it", topic=topic, error=str(e))
        return read_partitions(cluster, topic, starts, group)


def read_partitions(cluster: Cluster, topic: str, starts: dict[int, int], group: str,
                    timeout_s: float = 120.0, ends: dict[int, int] | None = None) -> list[Message]:
    """Every record of the given partitions of `topic` under read_committed, from each start
    offset to the end as of now (`end_offsets`), or to `ends[p]` when the caller knows them.

    A partition is done when the consumer's position reaches its end: the position also
    moves over transaction markers and aborted records, which no reader is handed. Fails
    loudly (TimeoutError after `timeout_s`, KafkaException on a broker error) rather than
    return a partial read."""
    if ends is None:
        ends = {p: e for (_, p), e in end_offsets(cluster, [(topic, p) for p in starts], group).items()}
    remaining = {p for p, s in starts.items() if ends[p] > max(s, 0)}
    if not remaining:
        return []
    c = cluster.consumer(group)
    try:
        c.assign(resolved(c, [TopicPartition(topic, p, starts[p] if starts[p] > 0 else OFFSET_BEGINNING)
                              for p in remaining], timeout_s))
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while remaining:
            for m in c.consume(10_000, READ_POLL_S):
                if m.error() is not None:
                    raise KafkaException(m.error())
                if m.offset() < ends[m.partition()]:
                    out.append(m)
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
            if remaining and time.monotonic() > deadline:
                raise TimeoutError(f"{topic} partitions {sorted(remaining)[:5]} did not reach their end within "
                                   f"{timeout_s}s")
        return out
    finally:
        c.close()


def read_partition(cluster: Cluster, topic: str, partition: int, start: int, group: str) -> list[Message]:
    return read_partitions(cluster, topic, {partition: start}, group)


def wait_for_broker(cluster: Cluster, log: Any, give_up_after: float | None = None) -> None:
    """Block until the cluster answers, retrying with capped exponential backoff and
    logging each miss; services start before their broker in most deployments."""
    delay, started = 0.5, time.monotonic()
    while True:
        try:
            cluster.admin().list_topics(timeout=5)
            return
        except Exception as e:  # KafkaException(_TRANSPORT / _TIMED_OUT) while it is away
            waited = time.monotonic() - started
            if give_up_after is not None and waited > give_up_after:
                raise
            log.warning("broker not reachable; retrying", bootstrap=cluster.bootstrap, error=str(e), retry_in_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
