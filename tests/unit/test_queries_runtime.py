"""The query service's runtime parts without a broker: an operator version as a hash job,
its barriers, registry records, the source filter every version's intake applies, the
source index."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from streamjoin.engine.block import system_block
from streamjoin.engine.window_join import NO_TIME
from streamjoin.schemas.query import Column, Selection
from streamjoin.services.io import kafka
from streamjoin.services.queries.deploy import version_job
from streamjoin.services.queries.registry import VersionRecord, version_from_json, version_to_json
from streamjoin.services.queries.service import ReuseService
from streamjoin.services.queries.source_index import SourceIndex
from streamjoin.services.io.intake import source_filter
from streamjoin.settings import SettingsError, StreamSpec, load
from streamjoin.topology.reuse.operator import OperatorDef

FLIGHTS = {"name": "flights", "topic": "qs.flights", "fields": {"num": "str", "carrier": "str", "terminal": "str",
                                                                 "ts": "int"},
           "time_field": "ts", "key_fields": ["num"], "window": {"range_ms": 10_000}}
CHECKINS = {"name": "checkins", "topic": "qs.checkins", "fields": {"flight": "str", "status": "str", "seats": "int",
                                                                   "ts": "int"},
            "time_field": "ts", "key_fields": ["flight"], "window": {"range_ms": 10_000}}


def service_job():  # type: ignore[no-untyped-def]
    return load(None, job="qs", bootstrap="127.0.0.1:1", partitions=2, streams=[FLIGHTS, CHECKINS],
                queries={"regions": ["east", "west"], "operator_partitions": 3})


def operator() -> OperatorDef:
    return OperatorDef(
        sources=("checkins", "flights"),
        join_classes=frozenset({frozenset({Column("flights", "num"), Column("checkins", "flight")})}),
        selections=(Selection(Column("flights", "carrier"), frozenset({"DL", "CO"})),),
        columns=(Column("checkins", "status"), Column("flights", "carrier")),
        range_ms=(("checkins", 5_000), ("flights", 2_000)), slide_ms=1_000, expires_ms=None, region="west")


def test_an_operator_version_is_a_hash_job_reading_only_what_it_needs() -> None:
    job = version_job(service_job(), "op-1", 2, operator(), {"qs.flights": {0: 5, 1: 7}}, start_event_ms=1234)
    streams = {s.name: s for s in job.streams}
    assert job.job == "qs-op-1-v2" and job.join.mode == "hash" and job.partitions == 3
    assert job.output.format == "blocks" and job.worker.region == "west"
    # projected (plus key and time), filtered by the cover, keyed by the join class, windowed by the operator
    assert streams["flights"].fields == {"num": "str", "carrier": "str", "ts": "int"}
    assert streams["checkins"].fields == {"flight": "str", "status": "str", "ts": "int"}
    assert streams["flights"].where == {"carrier": ["CO", "DL"]} and streams["checkins"].where == {}
    assert streams["flights"].key_fields == ["num"] and streams["checkins"].key_fields == ["flight"]
    assert (streams["flights"].window.range_ms, streams["checkins"].window.range_ms) == (2_000, 5_000)
    assert job.topic_of(streams["flights"]) == "qs.flights"
    assert job.start_offset("qs.flights", 1) == 7 and job.start_offset("qs.checkins", 0) == 0
    # its watermarks travel with the tuples it re-routes, so the job's lateness covers any start delay
    assert job.join.repartition_watermarks and job.join.repartition == "auto"
    assert job.join.allowed_lateness_ms == 2_000 and job.join.start_event_ms == 1234


def test_a_barrier_is_never_before_what_its_versions_routed_or_begin_at() -> None:
    """Event time may run ahead of the wall clock: a query served from a version that has
    routed nothing yet starts at that version's own barrier, not at now plus the delay (the
    version has no results before its barrier), and past whatever its versions routed."""
    service = ReuseService.__new__(ReuseService)
    service.spec = service_job().queries
    first = int(time.time() * 1000) + 60_000  # a minute of event time past the wall clock
    record = VersionRecord("qs-op-1-v2", "op-1", 2, operator(), {}, start_event_ms=first - 5_000)  # longest RANGE
    service.versions = {record.job: record}
    routed = {record.job: NO_TIME}
    service.router = SimpleNamespace(newest=routed.__getitem__)
    assert service._barrier([record.job]) == first
    routed[record.job] = first + 7_000
    assert service._barrier([record.job]) == first + 7_001
    assert first - 60_000 < service._barrier([]) <= first - 58_000  # no version: now plus the delay


def test_a_version_record_reads_back_as_written() -> None:
    record = VersionRecord("qs-op-1-v2", "op-1", 2, operator(), {"qs.flights": {0: 5}},
                           {"q-1": (100, 200), "q-2": (200, None)}, retired=False, start_event_ms=95)
    assert version_from_json(version_to_json(record)) == record
    older = version_to_json(record)
    del older["start_event_ms"]  # a record written before the field existed keeps every tuple
    assert version_from_json(older).start_event_ms is None


def test_the_source_filter_keeps_only_listed_values() -> None:
    spec = StreamSpec.model_validate(FLIGHTS | {"where": {"carrier": ["DL", "CO"], "terminal": ["A"]}})
    carriers = np.array(["DL", "UA", "CO", "DL", "AA"])
    terminals = np.array(["A", "A", "A", "B", "A"])
    n = len(carriers)
    block = system_block(np.zeros(n, np.int64), np.arange(n, dtype=np.int64), np.zeros(n, np.int32),
                         np.arange(n, dtype=np.int64), np.zeros(n, np.int64),
                         {"num": np.array(["F1"] * n), "carrier": carriers, "terminal": terminals,
                          "ts": np.arange(n, dtype=np.int64)})
    assert source_filter(spec, block).tolist() == [True, False, True, False, False]


@pytest.mark.parametrize("where, fragment", [
    ({"gate": ["1"]}, "not among fields"),
    ({"carrier": []}, "lists no values"),
    ({"carrier": [1]}, "do not fit their field types"),
    ({"ts": ["x"]}, "do not fit their field types"),
])
def test_a_bad_source_filter_is_refused_at_start(where: dict, fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        load(None, job="qs", bootstrap="127.0.0.1:1", streams=[FLIGHTS | {"where": where}, CHECKINS])


def test_the_source_index_answers_the_newest_sample_not_after_a_time() -> None:
    index = SourceIndex.__new__(SourceIndex)
    index.capacity, index.times, index.samples = 4, [], []
    for wall_ms in (100, 200, 300, 400):
        index.times.append(wall_ms)
        index.samples.append({"t": {0: wall_ms // 10}})
    assert index.offsets_before(250) == {"t": {0: 20}}
    assert index.offsets_before(10_000) == {"t": {0: 40}}
    # before every sample it searches the record timestamps (tests/integration/test_source_index.py)


def test_a_failed_service_loop_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's loop raising (once a full queue did, silently) ends the service: the flag
    its exit code reads is set and uvicorn is sent the SIGTERM it stops on."""
    from streamjoin.services.queries import main

    class Failing:
        def run(self, stop: threading.Event) -> None:
            raise RuntimeError("Local: Queue full")

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(main.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    stop, failed = threading.Event(), threading.Event()
    main.run_loop(Failing(), stop, failed)  # type: ignore[arg-type]
    assert failed.is_set() and sent == [(os.getpid(), signal.SIGTERM)]



class Deployed:
    """A deployer that runs nothing and remembers what it was asked to run."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, job) -> None:  # type: ignore[no-untyped-def]
        self.started.append(job.job)


def test_a_switch_a_dead_service_wrote_in_part_is_finished_on_restore() -> None:
    """A switch writes the new version, then the old one closed at its barrier, then the query:
    a service that died after the first write left the old version serving past the barrier
    beside the new one (every result twice) and a segment of a query that has no record (its
    router would have no sink for it). Restoring ends the old segments at the new version's
    start, drops the unknown query's segments, retires a version left serving nothing, and
    writes what it changed back to the registry."""
    sql = ("SELECT f.num, c.status FROM flights AS f [RANGE 2 SECONDS], checkins AS c [RANGE 5 SECONDS] "
           "WHERE f.num = c.flight AND f.carrier IN ('DL')")
    queries = {q: {"id": q, "sql": sql, "sink": f"sink-{q}", "region": "east", "lifetime_ms": None,
                   "registered_ms": 0, "start_ms": start, "end_ms": None, "operator": op, "decision": {}}
               for q, start, op in (("q-1", 100, "op-1"), ("q-2", 300, "op-1"), ("q-4", 800, "op-2"))}
    old = VersionRecord("qs-op-1-v1", "op-1", 1, operator(), {}, {"q-1": (100, None), "q-2": (300, 900)})
    new = VersionRecord("qs-op-1-v2", "op-1", 2, operator(), {}, {"q-1": (500, None), "q-2": (500, 900),
                                                                  "q-3": (500, None)})
    other = VersionRecord("qs-op-2-v2", "op-2", 2, operator(), {}, {"q-4": (800, None)})  # another operator's
    alone = VersionRecord("qs-op-3-v1", "op-3", 1, operator(), {}, {"q-3": (500, None)})
    versions = {v.job: v for v in (old, new, other, alone)}
    written: list[VersionRecord] = []
    deployer = Deployed()
    service = ReuseService(service_job(), kafka.Cluster("127.0.0.1:1"), deployer)  # type: ignore[arg-type]
    service.registry = SimpleNamespace(load=lambda: (queries, versions), put_version=written.append)
    service._restore()
    routes = service.router.routes
    assert routes["qs-op-1-v1"].segments == {"q-1": (100, 500), "q-2": (300, 500)}
    assert routes["qs-op-1-v2"].segments == {"q-1": (500, None), "q-2": (500, 900)}
    assert routes["qs-op-2-v2"].segments == {"q-4": (800, None)}
    assert alone.retired and sorted(deployer.started) == ["qs-op-1-v1", "qs-op-1-v2", "qs-op-2-v2"]
    assert [v.job for v in written] == ["qs-op-1-v1", "qs-op-1-v2", "qs-op-3-v1"]
    written.clear()
    service._settle(versions)  # a settled registry stays as it is
    assert not written
