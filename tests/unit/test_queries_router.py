"""The compensation router (services/queries/router.py) against a fake broker: a router that
dies inside a cycle, its sink records written and its transaction not committed, and the one
that takes over. On Tansu the dead cycle's records stay visible (aborted transactions are
shown to read_committed readers, docs/operations/broker.md) while its offsets are dropped, so the new
router routes those results again: each must land on the sink once. On a broker that hides
aborted records they are gone, and must land once as well."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition

from streamjoin.schemas import cql_validate
from streamjoin.services.io import kafka
from streamjoin.services.queries.deploy import version_job
from streamjoin.services.queries.router import Router, Target, sink_layout
from streamjoin.services.io.results import ResultSink
from streamjoin.settings import JobSettings
from streamjoin.topology.reuse.compensation import Compensation
from tests.unit.result_writer import Result, encode, result_id
from tests.unit.test_queries_runtime import operator, service_job

SQL = ("SELECT f.num, c.status FROM flights AS f [RANGE 2 SECONDS], checkins AS c [RANGE 5 SECONDS] "
       "WHERE f.num = c.flight")


@dataclass
class Record:
    """A record as the router's readers see it (a confluent-kafka Message's accessors)."""

    topic_: str
    partition_: int
    offset_: int
    key_: bytes | None
    value_: bytes | None
    transaction: int | None  # the producer transaction that wrote it (None: none)

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def error(self) -> None:
        return None


class Broker:
    """Partitions, committed group offsets and transactions. `shows_aborted`: Tansu's way (an
    aborted transaction's records stay visible, its offsets are dropped) or Kafka's (hidden)."""

    def __init__(self, shows_aborted: bool) -> None:
        self.shows_aborted = shows_aborted
        self.logs: dict[tuple[str, int], list[Record]] = {}
        self.offsets: dict[str, dict[tuple[str, int], int]] = {}
        self.aborted: set[int] = set()
        self.open: dict[str, int] = {}  # transactional id -> its open transaction
        self.transactions = 0

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               transaction: int | None = None) -> Record:
        log = self.logs.setdefault((topic, partition), [])
        log.append(Record(topic, partition, len(log), key, value, transaction))
        return log[-1]

    def visible(self, topic: str, partition: int, start: int = 0) -> list[Record]:
        """What a read_committed reader gets from `start` on (open transactions: none here)."""
        return [r for r in self.logs.get((topic, partition), [])[start:]
                if self.shows_aborted or r.transaction not in self.aborted]

    def end(self, topic: str, partition: int) -> int:
        return len(self.logs.get((topic, partition), []))


class Producer:
    def __init__(self, broker: Broker, transactional_id: str) -> None:
        self.broker, self.id = broker, transactional_id
        self.transaction: int | None = None
        self.pending: list[TopicPartition] = []
        self.reports: list[Callable[[], None]] = []
        self.dies_at_commit = False

    def init_transactions(self, _timeout: float) -> None:
        dead = self.broker.open.pop(self.id, None)  # fences the previous incarnation: its transaction aborts
        if dead is not None:
            self.broker.aborted.add(dead)

    def begin_transaction(self) -> None:
        self.broker.transactions += 1
        self.transaction = self.broker.open[self.id] = self.broker.transactions
        self.pending = []

    def produce_batch(self, topic: str, messages: list[dict[str, Any]], partition: int) -> int:
        for m in messages:
            record = self.broker.append(topic, partition, m["key"], m["value"], self.transaction)
            if "callback" in m:
                self.reports.append(lambda cb=m["callback"], r=record: cb(None, r))
        return len(messages)

    def poll(self, _timeout: float = 0) -> int:
        served, self.reports = self.reports, []
        for report in served:
            report()
        return len(served)

    def flush(self, _timeout: float = 0) -> int:
        self.poll()
        return 0

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], _group: Any, _timeout: float) -> None:
        self.pending += offsets

    def commit_transaction(self, _timeout: float) -> None:
        self.flush()
        if self.dies_at_commit:  # the process dies here: nothing below happens
            raise SystemExit("killed before the commit")
        group = self.broker.offsets.setdefault(ROUTER_GROUP, {})
        group.update({(tp.topic, tp.partition): tp.offset for tp in self.pending})
        self.broker.open.pop(self.id, None)
        self.transaction = None


class Consumer:
    def __init__(self, broker: Broker, group: str) -> None:
        self.broker, self.group = broker, group
        self.at: dict[tuple[str, int], int] = {}
        self.moved: set[tuple[str, int]] = set()  # partitions consumed from (librdkafka has no position before)

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        mine = self.broker.offsets.get(self.group, {})
        return [TopicPartition(tp.topic, tp.partition, mine.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in tps]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.at[(tp.topic, tp.partition)] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.at.pop((tp.topic, tp.partition), None)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.at]

    def consume(self, _n: int, _timeout: float) -> list[Record]:
        out = []
        for (topic, p), at in self.at.items():
            out += self.broker.visible(topic, p, at)
            if self.broker.end(topic, p) > at:
                self.at[(topic, p)] = self.broker.end(topic, p)
                self.moved.add((topic, p))
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at[(tp.topic, tp.partition)]
                               if (tp.topic, tp.partition) in self.moved else OFFSET_INVALID) for tp in tps]

    def consumer_group_metadata(self) -> None:
        return None


ROUTER_GROUP = "qs-queries-router"


class Cluster:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def consumer(self, group: str, **_extra: Any) -> Consumer:
        return Consumer(self.broker, group)

    def producer(self, transactional_id: str, **_extra: Any) -> Producer:
        return Producer(self.broker, transactional_id)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka's bounded reads, on the fake broker the cluster names."""
    def end_offsets(cluster: Cluster, partitions: list[tuple[str, int]], _group: str, **_kw: Any) -> dict:
        return {(t, p): cluster.broker.end(t, p) for t, p in partitions}

    def read_partitions(cluster: Cluster, topic: str, starts: dict[int, int], _group: str,
                        ends: dict[int, int] | None = None, **_kw: Any) -> list[Record]:
        return [r for p, start in starts.items() for r in cluster.broker.visible(topic, p, start)
                if ends is None or r.offset() < ends[p]]
    monkeypatch.setattr(kafka, "end_offsets", end_offsets)
    monkeypatch.setattr(kafka, "read_partitions", read_partitions)


def _router(cluster: Cluster, service: JobSettings, version: JobSettings) -> Router:
    """A router as a (re)started query service sets it up: fenced, its table and targets restored."""
    router = Router(service, cluster, on_retired=lambda _job: None)  # type: ignore[arg-type]
    router.start()
    router.add_version(version)
    router.serve(version.job, "q-1", 0, None)
    query = cql_validate.compile_query(SQL, service.streams)
    compensation = Compensation(selections=query.selections, columns=query.columns,
                                range_ms=tuple((w.stream, w.range_ms) for w in query.windows), slide_ms=query.slide_ms)
    sink = ResultSink("sink-1", service.queries.operator_partitions, sink_layout(service, query, "q-1"), "json")
    router.set_target("q-1", Target(sink, compensation))
    return router


def _results(version: JobSettings, first: int, n: int) -> list[Result]:
    checkins, flights = (version.topic_of(s) for s in version.streams)
    return [Result(((checkins, i % 2, i), (flights, (i + 1) % 2, i)), 1_000 + i, 0,
                   {"flights": {"num": f"F{i % 3}", "carrier": "DL"}, "checkins": {"flight": f"F{i % 3}", "status": "open"}})
            for i in range(first, first + n)]


@pytest.mark.parametrize("shows_aborted", [True, False], ids=["tansu", "kafka"])
def test_a_router_that_died_mid_cycle_is_followed_by_one_that_writes_each_result_once(
        reads: None, shows_aborted: bool) -> None:
    broker = Broker(shows_aborted)
    cluster = Cluster(broker)
    service = service_job()
    version = version_job(service, "op-1", 1, operator(), {})
    for value in encode(version, _results(version, 0, 10)):
        broker.append(version.results_topic, 0, b"", value)
    first = _router(cluster, service, version)
    assert first.recover() == 0  # a fresh sink: nothing left behind
    assert first.cycle() == 10
    for value in encode(version, _results(version, 10, 12)):
        broker.append(version.results_topic, 1, b"", value)
    first.producer.dies_at_commit = True  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        first.cycle()
    second = _router(cluster, service, version)  # fences the first: its open transaction aborts
    found = second.recover()
    written = second.cycle()
    on_sink = Counter(r.key() for p in range(service.queries.operator_partitions)
                      for r in broker.visible("sink-1", p))
    assert on_sink == Counter({result_id(version, r).encode(): 1 for r in _results(version, 0, 22)})
    # Tansu shows the dead cycle's 12 results (and only those: the committed cycle's 10 lie before
    # the sink marks), which are not written again; Kafka hides them, and they are
    assert (found, written) == ((12, 0) if shows_aborted else (0, 12))
    assert not second.left  # every result found was met again
