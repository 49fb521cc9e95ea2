"""The query service end to end: 12 overlapping queries registered one by one
through the HTTP API while data flows, 3 dropped, the service restarted in between; every
query's sink topic is checked exact against that query alone (the plain-Python reference:
its own selections, windows and event-time barriers).

Event time runs a minute ahead of the wall clock, a minute of it written at once before the
first query: a new operator's version, whose barrier is the wall clock's now, starts a minute
of event time after its barrier (as one whose processes came up a minute late would), and
the restart may stop versions before their first batch. Each must still be exact."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from confluent_kafka import Producer, TopicPartition

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.launcher import wait_drained, write_job
from streamjoin.schemas import cql_validate
from streamjoin.schemas.result_decode import decode_results
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.queries.api import RegisterRequest, create_app
from streamjoin.services.queries.registry import Registry
from streamjoin.services.queries.router import Router, sink_layout
from streamjoin.services.queries.service import ReuseService
from streamjoin.services.io.intake import H_ORIGIN_PARTITION
from streamjoin.services.io.deliveries import flush
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.integration.kafka_harness import dead_letters, read_all
from tests.unit.queries_api_fuzz import fuzz_app
from tests.unit.result_writer import Result, encode
from tests.profiles import examples

pytestmark = pytest.mark.integration

CARRIERS = ["DL", "CO", "UA", "AA"]
TERMINALS = ["A", "B", "C"]
STATUSES = ["open", "closed", "boarding"]
FLIGHTS = [f"F{n}" for n in range(12)]
AHEAD_MS = 60_000  # event time ahead of the wall clock (a minute of it written at once first)
QUERIES = 12  # registered one by one; the service restarts after half of them
DROPPED_AFTER = (4, 7, 10)  # after registering query n, query n - 3 is dropped: its operator narrows or retires


def catalog_job(bootstrap: str, tmp_path: Path, port: int) -> JobSettings:
    return load(None, job="qs", bootstrap=bootstrap, partitions=2, streams=[
        {"name": "flights", "topic": "qs.flights", "fields": {"num": "str", "carrier": "str", "terminal": "str",
                                                              "ts": "int"},
         "time_field": "ts", "key_fields": ["num"], "window": {"range_ms": 10_000}},
        {"name": "checkins", "topic": "qs.checkins", "fields": {"flight": "str", "status": "str", "seats": "int",
                                                                "ts": "int"},
         "time_field": "ts", "key_fields": ["flight"], "window": {"range_ms": 10_000}},
    ], worker={"state_dir": str(tmp_path / "state"), "batch_ms": 100, "heartbeat_ms": 500},
        coordinator={"heartbeat_timeout_ms": 5000},
        queries={"regions": ["east", "west"], "latency_ms": [[1, 40], [40, 1]], "port": port,
                 "operator_partitions": 2, "barrier_delay_ms": 500,
                 # event time runs up to AHEAD_MS ahead of record timestamps; seeking a backfill by them covers it
                 "backfill_margin_ms": AHEAD_MS + 15_000,
                 "source_regions": {"flights": "east", "checkins": "east"}})


@dataclass
class Produced:
    """Every tuple written, as the reference reads them: per stream, (ref, fields); `ahead`
    is set once the feeder has written its event time ahead of the wall clock."""

    rows: dict[str, list[tuple[tuple[str, int, int], dict]]]
    lock: threading.Lock
    errors: list[str]
    ahead: threading.Event = field(default_factory=threading.Event)


def produce_until(bootstrap: str, stop: threading.Event, produced: Produced, rate: float = 40.0,
                  ahead_ms: int = 0) -> None:
    """Write flights and checkins at `rate` each per second, event time = now + `ahead_ms`, to
    random partitions; first the event times from now to now + `ahead_ms` at the same density,
    as fast as the broker takes them (then `produced.ahead` is set)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    rng = random.Random(13)

    def delivered(stream: str, fields: dict):  # type: ignore[no-untyped-def]
        def callback(err, msg) -> None:  # type: ignore[no-untyped-def]
            with produced.lock:  # raising here would end the thread with records still in flight
                if err is not None:
                    produced.errors.append(str(err))
                else:
                    produced.rows[stream].append(((msg.topic(), msg.partition(), msg.offset()), fields))
        return callback

    def write(ts: int) -> None:
        flight = {"num": rng.choice(FLIGHTS), "carrier": rng.choice(CARRIERS), "terminal": rng.choice(TERMINALS),
                  "ts": ts}
        checkin = {"flight": rng.choice(FLIGHTS), "status": rng.choice(STATUSES), "seats": rng.randint(0, 9),
                   "ts": ts}
        # To a random partition, not keyed the way operators join: each version re-routes about
        # half of what it reads, its backfill included.
        for topic, stream, row in (("qs.flights", "flights", flight), ("qs.checkins", "checkins", checkin)):
            producer.produce(topic, json.dumps(row).encode(), partition=rng.randrange(2),
                             on_delivery=delivered(stream, row))
        producer.poll(0)

    start = int(time.time() * 1000)
    for k in range(int(ahead_ms * rate / 1000)):
        write(start + int(k * 1000 / rate))
    producer.flush(30)
    produced.ahead.set()
    while not stop.is_set():
        write(int(time.time() * 1000) + ahead_ms)
        time.sleep(1 / rate)
    producer.flush(30)


def read_back(bootstrap: str, produced: Produced) -> None:
    """Replace what delivery reports said with what the topics hold: a broker's produce answer
    may place a batch's records loosely (Tansu), a read gives each record its real offset."""
    for stream in produced.rows:
        topic = f"qs.{stream}"
        produced.rows[stream] = [((topic, m.partition(), m.offset()), json.loads(m.value()))
                                 for m in read_all(bootstrap, topic, 2, f"check-{stream}")]


def random_query(rng: random.Random) -> str:
    """Overlapping FLIGHTS x CHECKINS queries: carrier IN-lists, terminals, statuses, windows, projections."""
    conditions = ["f.num = c.flight"]
    if rng.random() < 0.8:
        conditions.append("f.carrier IN (" + ", ".join(f"'{c}'" for c in rng.sample(CARRIERS, rng.randint(1, 3)))
                          + ")")
    if rng.random() < 0.4:
        conditions.append(f"f.terminal = '{rng.choice(TERMINALS)}'")
    if rng.random() < 0.3:
        conditions.append(f"c.status = '{rng.choice(STATUSES)}'")
    columns = rng.sample(["f.carrier", "f.terminal", "c.status", "c.seats"], rng.randint(1, 3))
    flights_range, checkins_range = rng.choice([2, 5, 10]), rng.choice([2, 5, 10])
    slide = rng.choice(["", " SLIDE 1 SECOND", " SLIDE 2 SECONDS"])
    return (f"SELECT f.num, {', '.join(columns)} FROM flights AS f [RANGE {flights_range} SECONDS{slide}], "
            f"checkins AS c [RANGE {checkins_range} SECONDS] WHERE {' AND '.join(conditions)}")


def expected(job: JobSettings, view: dict, produced: Produced) -> set[tuple]:
    """The query alone: the reference join of its own filtered sources, windows and barriers."""
    query = cql_validate.compile_query(view["sql"], job.streams)
    wanted = {s.column: s.values for s in query.selections}
    streams, windows = [], []
    keys = {c.stream: c.field for members in query.join_classes for c in members}
    end = view["end_ms"] if view["end_ms"] is not None else 1 << 62
    # A member of a result with start <= T < end lies within its RANGE before T: tuples outside
    # (start - the longest RANGE, end) are in none, and the reference need not pair them.
    oldest = view["start_ms"] - max(w.range_ms for w in query.windows)
    for window in query.windows:
        rows = [RefTuple(ref, fields[keys[window.stream]], fields["ts"]) for ref, fields in produced.rows[window.stream]
                if oldest < fields["ts"] < end
                and all(fields[c.field] in values for c, values in wanted.items() if c.stream == window.stream)]
        streams.append(rows)
        windows.append(RefWindow(range_ms=window.range_ms))
    by_ref = {t.ref: t.ts for rows in streams for t in rows}
    return {combo for combo in reference_join(streams, windows, group_of=lambda t: 0)
            if view["start_ms"] <= max(by_ref[r] for r in combo) < end}


def sink_results(job: JobSettings, bootstrap: str, view: dict) -> list[tuple]:
    """Every result record on the query's sink, as member refs in FROM order."""
    query = cql_validate.compile_query(view["sql"], job.streams)
    catalog = {s.name: s for s in job.streams}
    layout = sink_layout(job, query, view["id"])
    cluster = kafka.Cluster(bootstrap)
    values = [m.value() for p in range(job.queries.operator_partitions)
              for m in kafka.read_partition(cluster, view["sink"], p, 0, f"check-{view['id']}")]
    decoded = decode_results(layout, "json", values)
    assert not decoded.rejects, decoded.rejects[:3]
    cols = decoded.columns
    return [tuple((job.topic_of(catalog[w.stream]), int(cols[f"{w.stream}.partition"][i]),
                   int(cols[f"{w.stream}.offset"][i])) for w in query.windows) for i in range(len(values))]


class Service:
    """`streamjoin queries` as a subprocess, and its HTTP API."""

    def __init__(self, job_file: Path, bootstrap: str, port: int, work_dir: Path) -> None:
        self.args = [sys.executable, "-m", "streamjoin.cli", "queries", "--job", str(job_file), "--bootstrap",
                     bootstrap, "--work-dir", str(work_dir)]
        self.log = work_dir / "service.log"
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"query service not up: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops it; the operator versions it ran on this machine stop with it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        left = _processes_mentioning(str(self.log.parent))
        assert not left, f"operator versions outlived the service: {left}"

    def call(self, method: str, path: str, timeout: float = 60, **kwargs) -> dict:  # type: ignore[no-untyped-def]
        response = httpx.request(method, f"{self.url}{path}", timeout=timeout, **kwargs)
        assert response.status_code < 300, (response.status_code, response.text, self.log.read_text()[-3000:])
        return response.json()


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of the live processes whose arguments contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if text in args:
            found.append(args[:200])
    return found


def wait_routed(job: JobSettings, bootstrap: str, work_dir: Path, timeout: float = 240) -> None:
    """Until every running operator version has joined every input record and the router has
    written everything they produced. A version that retires meanwhile is done: the router
    retires it only after reading every result it serves, and stops it with input left unread
    (input past its queries' end cannot matter), so its lag never drains."""
    deadline = time.monotonic() + timeout
    cluster = kafka.Cluster(bootstrap)
    waiting = True
    while waiting:
        assert time.monotonic() < deadline, "operator versions did not drain in time"
        _, versions = Registry(job, cluster).load()
        waiting = False
        for record in versions.values():
            if record.retired:
                continue
            try:
                wait_drained(load(work_dir / record.job / "job.yaml"), bootstrap, timeout=5)
            except TimeoutError:
                waiting = True  # still draining, or retiring: read the registry again
    for record in versions.values():
        if record.retired:
            continue
        version = load(work_dir / record.job / "job.yaml")
        results = [(version.results_topic, g) for g in range(version.partitions)]
        ends = kafka.end_offsets(cluster, results, "check-ends")
        while time.monotonic() < deadline:
            done = _router_offsets(job, bootstrap, results)
            if all(done.get(k, -1) >= end for k, end in ends.items() if end > 0):
                break
            if _retired(job, cluster, record.job):  # retired meanwhile: done, as above
                break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"router did not route {version.job}'s results")


def _retired(job: JobSettings, cluster: kafka.Cluster, version: str) -> bool:
    """Whether the registry now holds operator version `version` as retired."""
    _, versions = Registry(job, cluster).load()
    return any(record.job == version and record.retired for record in versions.values())


def _by_key_records(bootstrap: str, names: list[str]) -> tuple[int, int]:
    """Of the records the by-key topics `names` (2 partitions each) hold: how many are re-routed
    tuples (they name their origin), and how many are the progress notes beside them."""
    records = [m for t in names for m in read_all(bootstrap, t, 2, f"count-{t}")]
    forwards = sum(any(k == H_ORIGIN_PARTITION for k, _ in m.headers() or []) for m in records)
    return forwards, len(records) - forwards


def _router_offsets(job: JobSettings, bootstrap: str, partitions: list[tuple[str, int]]) -> dict:
    """The router's committed offsets on `partitions`."""
    consumer = kafka.Cluster(bootstrap).consumer(f"{job.job}-queries-router")
    try:
        found = consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=30)
        return {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()


def test_twelve_overlapping_queries_are_each_exact(tmp_path: Path) -> None:
    port = embedded.free_port()
    with embedded.start(log_path=tmp_path / "broker.log") as broker:
        job = catalog_job(broker.bootstrap, tmp_path, port)
        admin = kafka.Cluster(broker.bootstrap).admin()
        topics.create_missing(admin, [p for p in topics.plan(job) if p.role == "input"])
        work_dir = tmp_path / "queries"
        service = Service(write_job(job, tmp_path / "job.yaml"), broker.bootstrap, port, work_dir)
        produced = Produced({"flights": [], "checkins": []}, threading.Lock(), [])
        stop = threading.Event()
        feeder = threading.Thread(target=produce_until, args=(broker.bootstrap, stop, produced, 40.0, AHEAD_MS),
                                  daemon=True)
        feeder.start()
        rng = random.Random(2026)
        service.start()
        try:
            assert produced.ahead.wait(60), "the feeder wrote its minute ahead"
            ids = []
            for n in range(QUERIES):
                if n == 0:  # the event time every version deployed now finds in its sources already
                    with produced.lock:
                        written = max(fields["ts"] for rows in produced.rows.values() for _, fields in rows)
                if n == QUERIES // 2:  # the registry survives a restart, its versions running or not yet: it carries on
                    before = service.call("GET", "/queries")
                    service.stop()
                    service.start()
                    # Its first cycles restart every version at once (the API waits on the router's lock)
                    assert service.call("GET", "/queries", timeout=180) == before
                view = service.call("POST", "/queries", json={
                    "sql": random_query(rng), "sink": f"sink-{n}", "region": rng.choice(["east", "west"]),
                    "lifetime_s": None})
                ids.append(view["id"])
                time.sleep(0.5)
                if n in DROPPED_AFTER:  # drop an older query: its operator narrows or retires
                    service.call("DELETE", f"/queries/{ids[n - 3]}")
            time.sleep(3)
            stop.set()
            feeder.join(30)
            wait_routed(job, broker.bootstrap, work_dir)
            views = service.call("GET", "/queries")
            operators = service.call("GET", "/operators")
            got = {view["id"]: sink_results(job, broker.bootstrap, view) for view in views}
            read_back(broker.bootstrap, produced)
            _, versions = Registry(job, kafka.Cluster(broker.bootstrap)).load()
            segments = {v.job: v.segments for v in versions.values()}
            dead = {v.job: dict(dead_letters(load(work_dir / v.job / "job.yaml"), broker.bootstrap)[1])
                    for v in versions.values()}  # reason -> count
            by_key = [_by_key_records(broker.bootstrap, [f"{v.job}.{s}.by-key" for s in v.definition.sources])
                      for v in versions.values()]
        finally:
            stop.set()
            service.stop()
    assert len(views) == QUERIES and sum(v["state"] == "dropped" for v in views) == len(DROPPED_AFTER)
    assert len(operators) < QUERIES, "overlapping queries share operators"
    shared = {v["decision"] for v in views}
    assert shared & {"exact", "relax"}, f"no query reused an operator: {shared}"
    assert not produced.errors, produced.errors[:3]
    # The first query's operator is new: its version's barrier is the wall clock's now, and its
    # sources held a minute of event time past it when it was deployed.
    assert views[0]["decision"] == "new" and written >= views[0]["start_ms"] + AHEAD_MS - 5_000, (written, views[0])
    assert not any(dead.values()), f"operator versions dead-lettered tuples: {dead}"
    assert sum(f for f, _ in by_key) > 100, "versions re-routed records (their backfills among them)"
    assert sum(n for _, n in by_key) > 0, "versions told each other their progress"
    times = {ref: fields["ts"] for rows in produced.rows.values() for ref, fields in rows}
    wrong = {}
    for view in views:
        want = expected(job, view, produced)
        results = got[view["id"]]
        missing, extra = want - set(results), set(results) - want
        duplicates = len(results) - len(set(results))
        if missing or extra or duplicates:
            wrong[view["id"]] = {
                "view": view, "expected": len(want), "missing": len(missing), "extra": len(extra),
                "duplicates": duplicates, "missing_t": sorted(max(times[r] for r in c) for c in missing)[:50],
                "extra_t": sorted(max(times[r] for r in c) for c in extra)[:50], "extra_sample": sorted(extra)[:5],
                "segments": {job: seg[view["id"]] for job, seg in segments.items() if view["id"] in seg}}
    (tmp_path / "wrong.json").write_text(json.dumps({"wrong": wrong, "dead_letters": dead}, indent=1, default=str))
    assert not wrong, f"queries not exact: {sorted(wrong)}; see {tmp_path / 'wrong.json'}"
    assert sum(len(r) for r in got.values()) > 100, "the queries found results"


class TopicsOnly:
    """A deployer that creates a version's topics and runs nothing: fuzzing the API needs the
    service's planner, registry and router, not running joins."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap, self.started, self.stopped = bootstrap, [], []

    def start(self, job: JobSettings) -> None:
        topics.ensure(kafka.Cluster.of(job, self.bootstrap).admin(), job)
        self.started.append(job.job)

    def stop(self, job_name: str) -> None:
        self.stopped.append(job_name)

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_the_real_service_answers_its_openapi_fuzz_without_a_server_error(tmp_path: Path) -> None:
    """schemathesis against the ReuseService itself (the unit tests fuzz a fake): valid
    queries (the `cql` format, drawn like the integration test's) and hostile text alike, on
    a real broker; every answer is documented and none is a 500. Then, on the same service
    and broker, a router dies inside a cycle and the next service writes each result once."""
    schemathesis.openapi.format("cql", st.builds(random_query, st.randoms(use_true_random=False)) | st.text())
    with embedded.start(log_path=tmp_path / "broker.log") as broker:
        job = catalog_job(broker.bootstrap, tmp_path, embedded.free_port())
        cluster = kafka.Cluster(broker.bootstrap)
        topics.create_missing(cluster.admin(), [p for p in topics.plan(job) if p.role == "input"])
        deployer = TopicsOnly(broker.bootstrap)
        service = ReuseService(job, cluster, deployer)
        service.open()
        statuses = fuzz_app(create_app(service), max_examples=examples(25))
        registered = service.queries()
        left, sink = _router_dies_mid_cycle(job, cluster, service)
    posted = {status for (label, status) in statuses if label == "POST /queries"}
    assert {201, 422} <= posted, statuses  # real plans were made, and bad queries refused
    assert deployer.started and len(registered) == statuses[("POST /queries", 201)]
    assert left >= 12, "the dead cycle's sink records were visible (Tansu) and taken in"
    assert sink == Counter({key: 1 for key in sink}) and len(sink) == 22, sink


def _router_dies_mid_cycle(job: JobSettings, cluster: kafka.Cluster, service: ReuseService) -> tuple[int, Counter]:
    """A query served from an operator version whose results are written here by hand; the
    service's router routes 10 and commits, then dies inside the cycle that routes 12 more (its
    sink records written, its transaction open); a new service over the same registry takes
    over. Returns the sink results the new one found left behind and the sink's records per
    key (result id)."""
    view = service.register(RegisterRequest(sql=(
        "SELECT f.num, c.status FROM flights AS f [RANGE 2 SECONDS], checkins AS c [RANGE 5 SECONDS] "
        "WHERE f.num = c.flight"), sink="sink-router-death", region="east"))
    record = next(v for v in service.versions.values() if view["id"] in v.segments)
    version = service._version_job(record)
    start = record.segments[view["id"]][0]
    producer = Producer({"bootstrap.servers": cluster.bootstrap})

    def write(first: int, n: int) -> None:
        refs = [(version.topic_of(s), s.name) for s in version.streams]
        results = [Result(tuple((topic, i % 2, 1_000_000 + i) for topic, _ in refs), start + i, 0,
                          {name: {"num": "F1", "flight": "F1", "status": "open", "ts": start + i} for _, name in refs})
                   for i in range(first, first + n)]
        for value in encode(version, results):
            producer.produce(version.results_topic, value, partition=0)
        assert producer.flush(30) == 0

    def cycle_until(router: Router, routed: int) -> None:
        deadline = time.monotonic() + 60
        while router.routed < routed:
            assert time.monotonic() < deadline, f"routed {router.routed} of {routed}"
            router.cycle()

    write(0, 10)
    cycle_until(service.router, 10)
    write(10, 12)

    def dies(router: Router = service.router) -> None:
        flush(router.producer, router.deliveries)  # its sink records are on the broker...
        raise SystemExit("...and the process dies before the commit")
    service.router._commit = dies  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        cycle_until(service.router, 22)
    taking_over = ReuseService(job, cluster, TopicsOnly(cluster.bootstrap))
    taking_over.open()  # fences the dead router: Tansu shows its open transaction's records
    left = sum(n for ids in taking_over.router.left.values() for n in ids.values())
    results = TopicPartition(version.results_topic, 0)
    end = kafka.end_offsets(cluster, [(results.topic, 0)], "check-router-death")[(results.topic, 0)]
    deadline = time.monotonic() + 60
    while taking_over.router.consumer.position([results])[0].offset < end:  # until it has read them all
        assert time.monotonic() < deadline, "the new router did not read the version's results"
        taking_over.router.cycle()
    sink = Counter(m.key() for p in range(job.queries.operator_partitions)
                   for m in kafka.read_partition(cluster, view["sink"], p, 0, "check-router-death"))
    return left, sink
