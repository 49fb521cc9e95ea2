"""The query service (the StreamReuse paper): registrations in, shared operators out.

A registration is parsed and checked against the catalog (schemas/cql_validate.py),
planned (topology/reuse/planner.py: reuse an operator as it is, relax one, or
deploy a new one, by network usage), recorded in the registry, and carried out:

- reuse as it is: the query is served from the operator's running version from
  its start barrier on;
- relax (or narrow, after a drop): a new version of the operator is deployed,
  reading its sources from about a window before a barrier B, and every query
  the operator serves switches to it at B: the old version serves results with
  T < B, the new one T >= B (services/queries/router.py);
- new: a new operator, version 1, deployed the same way.
B is at least `queries.barrier_delay_ms` after now and after every result the
router has routed from the old version, so no routed result is on the wrong
side of it. A query's own results are those with start <= T < end (its start
is B; its end is set the same way when it is dropped or its lifetime ends,
past what every version serving it has routed). Event time may run ahead of
the wall clock: a query served from a running version starts no earlier than
that version's own barrier, before which it has no results.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import structlog

from streamjoin.schemas import cql_errors, cql_print, cql_validate
from streamjoin.schemas.query import Registration
from streamjoin.services.io import kafka
from streamjoin.services.io.results import ResultSink
from streamjoin.services.queries.api import QueryRejected, RegisterRequest
from streamjoin.services.queries.deploy import Deployer, version_job, version_job_name
from streamjoin.services.queries.registry import Registry, VersionRecord
from streamjoin.services.queries.router import Router, Target, sink_layout
from streamjoin.services.queries.source_index import SourceIndex
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from streamjoin.topology.reuse.compensation import Compensation
from streamjoin.topology.reuse.cost import Statistics
from streamjoin.topology.reuse.operator import OperatorDef
from streamjoin.topology.reuse.planner import Decision, OperatorState, Planner

log = structlog.get_logger("queries.service")


@dataclass
class QueryRecord:
    """A registration and what the service did with it: `operator` answering it and the
    planner's `decision` (as `explain` shows it)."""

    registration: Registration
    operator: str
    decision: dict[str, Any]

    @property
    def dropped(self) -> bool:
        return self.registration.end_ms is not None


class ReuseService:
    """The QueryService of services/queries/api.py over hash-mode operator jobs.

    `settings`: the service's job (catalog streams, `queries:`); `cluster`: Kafka;
    `deployer`: runs operator versions; `stats`: the cost model's source statistics."""

    def __init__(self, settings: JobSettings, cluster: kafka.Cluster, deployer: Deployer,
                 stats: Statistics | None = None) -> None:
        self.settings, self.cluster, self.deployer = settings, cluster, deployer
        self.spec = settings.queries
        self.planner = Planner(self.spec, settings.streams, stats or Statistics.defaults(settings.streams))
        self.registry = Registry(settings, cluster)
        self.router = Router(settings, cluster, self._retired)
        self.index = SourceIndex(settings, cluster)
        self.records: dict[str, QueryRecord] = {}
        self.versions: dict[str, VersionRecord] = {}  # job name -> version, running ones
        self.current: dict[str, str] = {}  # operator -> its newest version's job name

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        """Create the registry topic, fence an older router, carry on from the registry, and take
        in the sink results a router that died mid-cycle left behind (Router.recover)."""
        sinks = []
        topics.create_missing(self.cluster.admin(), topics.queries_plan(self.settings, sinks))
        self.router.start()
        self._restore()
        self.router.recover()

    def run(self, stop: threading.Event) -> None:
        """The background loop: route, sample the sources, end expired queries."""
        while not stop.is_set():
            with self.router.lock:
                self.index.sample()
                self.router.cycle()
                self._expire()
                self.deployer.check()

    # ------------------------------------------------------------------ API
    def register(self, request: RegisterRequest) -> dict:
        with self.router.lock:
            registration = self._registration(request)
            decision = self.planner.plan(registration)
            registration = self._carry_out(registration, decision)
            return self._view(self.records[registration.id])

    def explain(self, request: RegisterRequest) -> dict:
        with self.router.lock:
            return {"decision": self.planner.plan(self._registration(request)).explain()}

    def queries(self) -> list[dict]:
        with self.router.lock:
            return [self._view(r) for r in self.records.values()]

    def query(self, query_id: str) -> dict:
        with self.router.lock:
            return self._view(self.records[query_id])

    def explain_query(self, query_id: str) -> dict:
        with self.router.lock:
            return {"decision": self.records[query_id].decision}

    def drop(self, query_id: str) -> dict:
        with self.router.lock:
            record = self.records[query_id]
            if record.dropped:
                raise QueryRejected(409, f"query {query_id} was dropped already")
            self._end(record)
            return self._view(record)

    def operators(self) -> list[dict]:
        with self.router.lock:
            return [{"id": op_id, "version": state.version, "sources": list(state.definition.sources),
                     "queries": list(state.queries), "region": state.definition.region,
                     "definition": state.definition.to_json()}
                    for op_id, state in self.planner.operators().items()]

    # ------------------------------------------------------------ registering
    def _registration(self, request: RegisterRequest) -> Registration:
        """Check a request against the catalog and the service's topics; raises QueryRejected."""
        try:
            query = cql_validate.compile_query(request.sql, self.settings.streams)
        except cql_errors.QueryError as err:
            raise QueryRejected(422, str(err), {"line": err.line, "column": err.column, "token": err.token}) from None
        region = request.region or self.spec.regions[0]
        if region not in self.spec.regions:
            raise QueryRejected(422, f"unknown region {region!r}; the regions are {self.spec.regions}")
        self._check_sink(request.sink)
        now_ms = int(time.time() * 1000)
        lifetime_ms = None if request.lifetime_s is None else int(request.lifetime_s * 1000)
        return Registration(id=f"q-{len(self.records) + 1}", text=cql_print.to_cql(query), query=query,
                            sink=request.sink, region=region, lifetime_ms=lifetime_ms, registered_ms=now_ms,
                            start_ms=now_ms)

    def _check_sink(self, sink: str) -> None:
        internal = set(self.settings.input_topics) | {self.settings.queries_topic}
        if sink in internal or sink.startswith(f"{self.settings.job}-op-"):
            raise QueryRejected(422, f"sink {sink!r} is a topic the service reads or owns; name another")
        taken = [r.registration.id for r in self.records.values() if r.registration.sink == sink and not r.dropped]
        if taken:
            raise QueryRejected(409, f"sink {sink!r} already receives the results of {taken[0]}")

    def _carry_out(self, registration: Registration, decision: Decision) -> Registration:
        """Record and apply `decision` for `registration`; returns it with its start barrier."""
        topics.create_missing(self.cluster.admin(), topics.queries_plan(self.settings, [registration.sink]))
        if decision.kind == "exact":
            version = self.current[decision.operator]
            barrier = self._barrier([version])
            registration = replace(registration, start_ms=barrier)
            self._serve(self.versions[version], registration.id, barrier, None)
        else:
            old = self.current.get(decision.operator)
            barrier = self._barrier([old] if old else [])
            registration = replace(registration, start_ms=barrier)
            self._switch(decision.operator, decision.definition, barrier, extra=registration.id)
        self.planner.apply(registration, decision)
        record = QueryRecord(registration, decision.operator, decision.explain())
        self.records[registration.id] = record
        self.router.set_target(registration.id, self._target(registration))
        self._put_query(record)
        log.info("query registered", query=registration.id, decision=decision.kind, operator=decision.operator,
                 start_ms=barrier)
        return registration

    def _barrier(self, versions: list[str]) -> int:
        """An event time past now (by barrier_delay_ms), past every result routed from `versions`
        and not before the first barrier of any of them (a version has no results before it: it
        skips the tuples that could only make them). Event time may run ahead of the wall clock,
        so now alone can lie behind what a version has routed or begins at."""
        now_ms = int(time.time() * 1000) + self.spec.barrier_delay_ms
        starts = [self._first_barrier(self.versions[v]) for v in versions if v in self.versions]
        return max([now_ms] + [self.router.newest(v) + 1 for v in versions] + starts)

    @staticmethod
    def _first_barrier(record: VersionRecord) -> int:
        """The barrier `record` was deployed at (its start event time plus its longest RANGE)."""
        if record.start_event_ms is None:  # a record from before versions kept it: no bound known
            return 0
        return record.start_event_ms + max(ms for _, ms in record.definition.range_ms)

    def _switch(self, operator: str, definition: OperatorDef, barrier: int, extra: str | None = None) -> None:
        """Deploy `definition` as `operator`'s next version and move every query it serves (and
        `extra`, a query joining it) to that version from `barrier` on."""
        old = self.versions.get(self.current.get(operator, ""))
        number = old.version + 1 if old else 1
        longest = max(ms for _, ms in definition.range_ms)
        reach = barrier - longest - self.settings.join.allowed_lateness_ms - self.spec.backfill_margin_ms
        name = version_job_name(self.settings.job, operator, number)
        fresh = VersionRecord(name, operator, number, definition, self.index.offsets_before(reach),
                              start_event_ms=barrier - longest)
        if old:
            for query, (lo, hi) in list(old.segments.items()):
                if hi is None or hi > barrier:
                    fresh.segments[query] = (max(lo, barrier), hi)
                    old.segments[query] = (lo, barrier)
        if extra:
            fresh.segments[extra] = (barrier, None)
        self._version_job(fresh)  # a definition no job can run fails here, before anything is recorded
        self.registry.put_version(fresh)
        if old:
            self.registry.put_version(old)
        self._run_version(fresh)
        if old:
            for query, segment in old.segments.items():
                self.router.serve(old.job, query, *segment)
        self.current[operator] = name

    def _version_job(self, record: VersionRecord) -> JobSettings:
        return version_job(self.settings, record.operator, record.version, record.definition, record.start_offsets,
                           record.start_event_ms)

    def _run_version(self, record: VersionRecord) -> None:
        job = self._version_job(record)
        self.versions[record.job] = record
        self.deployer.start(job)
        self.router.add_version(job)
        for query, segment in record.segments.items():
            self.router.serve(record.job, query, *segment)

    def _serve(self, version: VersionRecord, query: str, lo: int, hi: int | None) -> None:
        version.segments[query] = (lo, hi)
        self.registry.put_version(version)
        self.router.serve(version.job, query, lo, hi)

    def _target(self, registration: Registration) -> Target:
        """Where `registration`'s results go and how its results look (its projection)."""
        layout = sink_layout(self.settings, registration.query, registration.id)
        query = registration.query
        # The whole compensation, whichever version serves it: a query moves between versions whose
        # covers differ, and re-applying a selection the cover enforced costs one mask.
        full = Compensation(selections=query.selections, columns=query.columns,
                            range_ms=tuple((w.stream, w.range_ms) for w in query.windows), slide_ms=query.slide_ms)
        return Target(ResultSink(registration.sink, self.spec.operator_partitions, layout, "json"), full)

    # ------------------------------------------------------------ ending
    def _end(self, record: QueryRecord) -> None:
        """End a query (dropped, or its lifetime over) at a barrier; narrow or retire its operator."""
        operator = record.operator
        # Every version serving it: one it is switching away from may have routed past the newest's start.
        serving = [v for v, running in self.versions.items() if record.registration.id in running.segments]
        barrier = max(self._barrier(sorted({self.current[operator], *serving})), record.registration.start_ms)
        record.registration = replace(record.registration, end_ms=barrier)
        for running in self.versions.values():
            if record.registration.id in running.segments:
                lo, hi = running.segments[record.registration.id]
                self._serve(running, record.registration.id, lo, barrier if hi is None else min(hi, barrier))
        self._put_query(record)
        decision = self.planner.drop(record.registration.id)
        if decision is not None and decision.kind == "narrow":
            self._switch(operator, decision.definition, barrier)
        if decision is not None and decision.kind == "remove":
            self.current.pop(operator, None)
        log.info("query ended", query=record.registration.id, end_ms=barrier,
                 operator_change=decision.kind if decision else "none")

    def _expire(self) -> None:
        now_ms = int(time.time() * 1000)
        for record in list(self.records.values()):
            lifetime = record.registration.lifetime_ms
            if not record.dropped and lifetime is not None and now_ms >= record.registration.registered_ms + lifetime:
                self._end(record)

    def _retired(self, job: str) -> None:
        """The router read the last result `job` serves: stop it and record that."""
        record = self.versions.pop(job)
        record.retired = True
        self.registry.put_version(record)
        self.deployer.stop(job)

    # ------------------------------------------------------------ records
    def _put_query(self, record: QueryRecord) -> None:
        r = record.registration
        self.registry.put_query(r.id, {
            "id": r.id, "sql": r.text, "sink": r.sink, "region": r.region, "lifetime_ms": r.lifetime_ms,
            "registered_ms": r.registered_ms, "start_ms": r.start_ms, "end_ms": r.end_ms,
            "operator": record.operator, "decision": record.decision})

    def _view(self, record: QueryRecord) -> dict:
        r = record.registration
        return {"id": r.id, "sql": r.text, "sink": r.sink, "region": r.region,
                "lifetime_s": None if r.lifetime_ms is None else r.lifetime_ms / 1000,
                "registered_ms": r.registered_ms, "start_ms": r.start_ms, "end_ms": r.end_ms,
                "state": "dropped" if record.dropped else "running", "operator": record.operator,
                "decision": record.decision.get("kind", "")}

    def _restore(self) -> None:
        """Carry on from the registry: queries, their operators, the versions still running."""
        queries, versions = self.registry.load()
        if not queries:
            return
        for data in queries.values():
            query = cql_validate.compile_query(data["sql"], self.settings.streams)
            registration = Registration(id=data["id"], text=data["sql"], query=query, sink=data["sink"],
                                        region=data["region"], lifetime_ms=data["lifetime_ms"],
                                        registered_ms=data["registered_ms"], start_ms=data["start_ms"],
                                        end_ms=data["end_ms"])
            self.records[registration.id] = QueryRecord(registration, data["operator"], data["decision"])
        self._settle(versions)
        newest: dict[str, VersionRecord] = {}
        for record in versions.values():
            if record.version > getattr(newest.get(record.operator), "version", 0):
                newest[record.operator] = record
        running = {r.registration.id: r.registration for r in self.records.values() if not r.dropped}
        states = {op: OperatorState(v.definition, v.version, tuple(q for q in v.segments if q in running))
                  for op, v in newest.items()}
        numbers = [int(op.removeprefix("op-")) for op in newest if op.startswith("op-")]
        self.planner.restore({op: state for op, state in states.items() if state.queries}, list(running.values()),
                             max(numbers, default=0) + 1)
        for record in versions.values():
            if not record.retired:
                self._run_version(record)
        self.current = {op: v.job for op, v in newest.items() if not v.retired or any(
            q in running for q in v.segments)}
        for query_id in self.records:
            self.router.set_target(query_id, self._target(self.records[query_id].registration))
        if self.records:
            log.info("registry restored", queries=len(self.records), versions=len(self.versions))

    def _settle(self, versions: dict[str, VersionRecord]) -> None:
        """Finish in the registry a change a dead service wrote part of. A switch writes the new
        version, then the old one closed at the barrier B, then the registered query: a service
        that died in between left the old version serving its queries past B beside the new one
        (each result twice), or a version serving a query without a record (no sink to route it
        to). Here an older version of an operator ends each query where a newer one starts it
        (at B, as the switch meant), a segment of a query without a record goes (its
        registration never finished), and a version left serving nothing retires."""
        live = [v for v in versions.values() if not v.retired]
        for record in live:
            segments = {q: seg for q, seg in record.segments.items() if q in self.records}
            for query, (lo, hi) in segments.items():
                taken = [v.segments[query][0] for v in live if v.operator == record.operator
                         and v.version > record.version and query in v.segments]
                if taken and (hi is None or hi > min(taken)):
                    segments[query] = (lo, min(taken))
            if segments != record.segments:
                log.warning("registry settled", version=record.job, was=record.segments, now=segments)
                record.segments, record.retired = segments, not segments
                self.registry.put_version(record)
