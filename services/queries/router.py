"""The compensation router: every operator version's results to its queries' sinks.

It reads each running version's results (Arrow blocks) and batch commits, and
for every query a version serves applies that query's compensation (the StreamReuse
paper, section 3.1: its own selections, RANGE filter, projection) restricted to the
segment of event time the version serves it for, `lo <= T < hi`, then writes
the query's results to its sink as ordinary result records (the job result
format with the query's projection, schemas/result_format.py).

Exactly once: each cycle's sink records and the router's consumer offsets go
in one Kafka transaction, so a restarted router resumes where the last
committed cycle ended. The same transaction marks, per sink partition it
wrote, where the cycle's records end (an offset of the router's group on the
sink partition itself). A router that died inside a cycle (a crash, a commit
that failed, the service stopping on its loop's error) left that cycle's sink
records behind, and a broker may show them (Tansu shows aborted transactions
to read_committed readers, docs/operations/broker.md): so a restarted router first reads
each sink past its mark (`recover`) and does not write again, once each, the
results it finds there. On a broker that hides aborted records it finds none
and writes them again. A switch between versions is exact because the two
segments of a query meet at one barrier: the old version serves T < B, the new
one T >= B, and result ids (engine/result_ids.py) depend only on the inputs, so
both versions would give a shared result the same id.

A version retires when every segment it serves has ended and its batch
commits show every group's watermark past the last segment end (a result
found later would need an input behind the watermark, which the job
dead-letters as late); the router then reads its results to their end and
calls `on_retired`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import structlog
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import EVENT_TIME, RESULT_ID_HI, RESULT_ID_LO
from streamjoin.engine.window_join import NO_TIME
from streamjoin.schemas.query import Query
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import ResultLayout, StreamLayout, result_layout
from streamjoin.schemas.results import BatchCommit, decode_commit
from streamjoin.services.io import kafka
from streamjoin.services.io.deliveries import Deliveries
from streamjoin.services.io.results import ResultSink, ResultWriter
from streamjoin.services.io.transactions import Transactions
from streamjoin.settings import JobSettings
from streamjoin.topology.reuse.compensation import Compensation, compensation_mask

log = structlog.get_logger("queries.router")
POLL_RECORDS = 5_000
POLL_S = 0.2


@dataclass(frozen=True)
class Target:
    """Where one query's results go (its sink: topic, partitions, and its result layout: its
    sources, its projection) and what compensates an operator's results for it."""

    sink: ResultSink
    compensation: Compensation


def sink_layout(service: JobSettings, query: Query, name: str) -> ResultLayout:
    """The result records of query `name` on its sink: the job result format over the query's
    sources in FROM order, each with its SELECT columns and its time field (a result record
    names every member's event time), keyed by result id."""
    catalog = {s.name: s for s in service.streams}
    streams = []
    for window in query.windows:
        spec = catalog[window.stream]
        chosen = [c.field for c in query.columns if c.stream == window.stream]
        fields = chosen + ([spec.time_field] if spec.time_field not in chosen else [])
        streams.append(StreamLayout(spec.name, service.topic_of(spec), spec.format == "blocks",
                                    tuple((f, spec.fields[f]) for f in fields), spec.time_field, ()))
    return ResultLayout(name, "query", tuple(streams))


@dataclass
class Route:
    """One operator version as the router sees it. `segments`: query id -> [lo, hi) event time
    served from this version (hi None: open); `watermarks`: group -> the newest committed
    watermark; `newest`: the largest result time read; `retire_at`: the results' end offsets
    to read up to before retiring (None until every segment has closed behind the watermark)."""

    job: JobSettings
    layout: ResultLayout
    segments: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    watermarks: dict[int, int] = field(default_factory=dict)
    newest: int = NO_TIME
    retire_at: dict[int, int] | None = None

    def watermark(self) -> int:
        """The version's watermark: the least over its groups (NO_TIME until each has committed)."""
        groups = self.job.partitions
        if len(self.watermarks) < groups:
            return NO_TIME
        return min(self.watermarks.values())

    def finished(self) -> bool:
        """Every segment closed and the watermark past the last end: no result it serves is left."""
        ends = [hi for _, hi in self.segments.values()]
        return all(hi is not None for hi in ends) and self.watermark() >= max(ends, default=NO_TIME)


class Router:
    """Routes results from operator versions to query sinks, one transaction per cycle.

    `service`: the query service's settings; `cluster`: its Kafka clients; `on_retired(job)`:
    called (under `lock`, from the router's thread) once a version has nothing left to serve.
    Callers change the routing table only while holding `lock`, so a change falls between two
    committed cycles."""

    def __init__(self, service: JobSettings, cluster: kafka.Cluster, on_retired: Callable[[str], None]) -> None:
        self.service, self.cluster, self.on_retired = service, cluster, on_retired
        self.lock = threading.RLock()
        self.routes: dict[str, Route] = {}
        self.targets: dict[str, Target] = {}
        self.writers: dict[str, ResultWriter] = {}  # query -> the writer of its sink
        self.group = f"{service.job}-queries-router"
        self.consumer = cluster.consumer(self.group)
        self.producer = cluster.producer(f"{service.job}-queries-router")
        self.transactions = Transactions(self.producer, service.transactions, router=self.group)
        self.deliveries = Deliveries()  # failures fail the cycle's commit; cleared each cycle
        self.assigned: set[str] = set()
        self.version_of: dict[str, str] = {}  # results or commits topic -> the version writing it
        self.routed = 0  # results written to sinks since start
        # sink topic -> ids of the results a dead incarnation's unfinished cycle left there (recover),
        # each not written again as many times as it was found
        self.left: dict[str, Counter[tuple[int, int]]] = {}

    # ------------------------------------------------------------ the table
    def add_version(self, job: JobSettings) -> None:
        """Start reading operator version `job` (its results and batch commits)."""
        self.routes.setdefault(job.job, Route(job, result_layout(job)))
        self.version_of.update({job.results_topic: job.job, job.commits_topic: job.job})

    def serve(self, version: str, query: str, lo: int, hi: int | None) -> None:
        """Serve `query` from `version` for results with lo <= T < hi."""
        self.routes[version].segments[query] = (lo, hi)

    def set_target(self, query: str, target: Target) -> None:
        self.targets[query] = target
        self.writers[query] = ResultWriter(target.sink, self.producer, self.deliveries, every_report=False)

    def newest(self, version: str) -> int:
        """The largest result time read from `version` so far (NO_TIME if none)."""
        return self.routes[version].newest

    # ------------------------------------------------------------ the loop
    def start(self) -> None:
        """Fence an older router (its open transaction ends: aborted, or on Tansu shown)."""
        self.transactions.init()

    def recover(self) -> int:
        """Read what a dead incarnation left on the sinks of the queries targeted so far (call it
        once, after `start` and after the restored queries' `set_target`): every result past the
        last committed cycle's mark on each sink partition (from the start where none is marked).
        Those results came of inputs past the router's committed offsets, which this router
        reads and routes again: each is skipped once then. Returns how many were found."""
        sinks = {t.sink.topic: t.sink.partitions for t in self.targets.values()}
        if not sinks:
            return 0
        wanted = [TopicPartition(topic, p) for topic, n in sorted(sinks.items()) for p in range(n)]
        marks = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in self.consumer.committed(wanted, timeout=30)}
        ends = kafka.end_offsets(self.cluster, list(marks), f"{self.group}-recovery")
        found = 0
        for topic in sinks:
            starts = {p: mark for (t, p), mark in marks.items() if t == topic and ends[(t, p)] > mark}
            if not starts:
                continue
            records = kafka.read_partitions(self.cluster, topic, starts, f"{self.group}-recovery",
                                            ends={p: ends[(topic, p)] for p in starts})
            # Keys are the results' 32-hex ids (sink_layout); a short tail, read once at start.
            ids = Counter((int(k[:16], 16), int(k[16:32], 16)) for k in (m.key() for m in records)
                          if k is not None and len(k) == 32)
            if ids:
                self.left[topic] = ids
                found += sum(ids.values())
        if found:
            log.warning("sink results of an unfinished cycle found", results=found, sinks=len(self.left))
        return found

    def run(self, stop: threading.Event) -> None:
        """Cycle until `stop` is set."""
        while not stop.is_set():
            with self.lock:
                self.cycle()

    def cycle(self) -> int:
        """Read what the versions wrote, route it in one transaction; returns results written."""
        self._assign()
        messages = self.consumer.consume(POLL_RECORDS, POLL_S) if self.assigned else []
        if not self.assigned:
            time.sleep(POLL_S)
        by_version: dict[str, list[Message]] = {}
        for m in messages:
            if m.error() is None:
                by_version.setdefault(self.version_of[m.topic()], []).append(m)
        written = 0
        if messages:
            self.deliveries.clear()
            self.transactions.begin()
            for version, batch in by_version.items():
                written += self._route(self.routes[version], batch)
            self._commit()
        self.routed += written
        self._retire()
        return written

    def _assign(self) -> None:
        """Assign the partitions of versions not read yet, from this router's committed offsets."""
        fresh = [name for name in self.routes if name not in self.assigned]
        if not fresh:
            return
        wanted = [TopicPartition(topic, g) for name in fresh for topic in
                  (self.routes[name].job.results_topic, self.routes[name].job.commits_topic)
                  for g in range(self.routes[name].job.partitions)]
        committed = self.consumer.committed(wanted, timeout=30)
        self.consumer.incremental_assign([TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0
                                                         else OFFSET_BEGINNING) for tp in committed])
        self.assigned.update(fresh)

    def _route(self, route: Route, batch: list[Message]) -> int:
        """Compensate one version's results for each query it serves and produce them."""
        commits = [m for m in batch if m.topic() == route.job.commits_topic]
        for m in commits:
            commit = decode_commit(m.value())
            if isinstance(commit, BatchCommit):
                route.watermarks[commit.group] = max(route.watermarks.get(commit.group, NO_TIME), commit.watermark)
        values = [m.value() for m in batch if m.topic() == route.job.results_topic]
        if not values:
            return 0
        decoded = decode_results(route.layout, "blocks", values)
        if decoded.rejects:  # the router's own input: written by a version it deployed
            log.error("unreadable operator results", version=route.job.job, rejects=len(decoded.rejects))
        columns = decoded.columns
        if not len(columns[EVENT_TIME]):
            return 0
        route.newest = max(route.newest, int(columns[EVENT_TIME].max()))
        written = 0
        for query, (lo, hi) in route.segments.items():
            mask = compensation_mask(columns, self.targets[query].compensation, lo, hi)
            if mask.any():
                sink = self.targets[query].sink
                results = self._not_left(sink.topic, Block({k: v[mask] for k, v in columns.items()}))
                partitions = results[RESULT_ID_HI] % np.uint64(sink.partitions)
                written += self.writers[query].write(results, partitions.astype(np.int32)) if len(results) else 0
        return written

    def _not_left(self, topic: str, results: Block) -> Block:
        """`results` less those an unfinished cycle left on sink `topic` (recover), each skipped as
        many times as it was found there."""
        left = self.left.get(topic)
        if not left:
            return results
        hi, lo = results[RESULT_ID_HI], results[RESULT_ID_LO]
        his = np.fromiter((h for h, _ in left), np.uint64, len(left))
        keep = np.ones(len(results), bool)
        for i in np.flatnonzero(np.isin(hi, his)).tolist():  # only the few found, and only after a restart
            key = (int(hi[i]), int(lo[i]))
            if left[key] > 0:
                keep[i] = False
                left[key] -= 1
                if not left[key]:
                    del left[key]
        if not left:
            del self.left[topic]
        return results if keep.all() else results.filter(keep)

    def _commit(self) -> None:
        # Every sink record delivered (a failed one fails here), so the reports give where this
        # cycle's records end on each sink partition: those marks commit with the input offsets.
        self.transactions.flush(self.deliveries)
        marks = [TopicPartition(topic, p, last + 1) for (topic, p), last in self.deliveries.newest.items()]
        positions = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
        self.transactions.send_offsets(positions + marks, self.consumer.consumer_group_metadata())
        self.transactions.commit()

    def _retire(self) -> None:
        """Retire versions that have nothing left to serve once their results are read to the end."""
        for name, route in list(self.routes.items()):
            if not route.segments or not route.finished():
                continue
            results = [(route.job.results_topic, g) for g in range(route.job.partitions)]
            if route.retire_at is None:
                try:
                    ends = kafka.end_offsets(self.cluster, results, f"{self.group}-ends", timeout_s=10)
                except (KafkaException, TimeoutError):
                    continue  # the broker is slow: the next cycle asks again
                route.retire_at = {p: end for (_, p), end in ends.items()}
            read = {tp.partition: tp.offset for tp in self.consumer.position(
                [TopicPartition(t, p) for t, p in results])}
            if all(read.get(p, -1) >= end for p, end in route.retire_at.items() if end > 0):
                self._unassign(route)
                del self.routes[name]
                self.assigned.discard(name)
                log.info("version retired", version=name)
                self.on_retired(name)

    def _unassign(self, route: Route) -> None:
        self.consumer.incremental_unassign([TopicPartition(topic, g) for topic in
                                            (route.job.results_topic, route.job.commits_topic)
                                            for g in range(route.job.partitions)])
