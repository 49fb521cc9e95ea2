"""Continuous queries through the query service under the nemesis (tests/integration/nemesis.py):
`streamjoin queries` as a process, a few overlapping queries registered over the flights and
checkins catalog (tests/integration/test_queries.py's), fed live, under a schedule of the
service's faults:

* `kill`: SIGKILL a worker of a running operator version; the service's deployer restarts
  it under its own id;
* `pause`: SIGSTOP an operator version's worker past the worker timeout, then SIGCONT;
* `coordinator`: SIGKILL an operator version's coordinator; the deployer restarts it;
* `service`: SIGKILL the service's pod, the service and every operator version it runs
  (they live in its pod); a new one starts after `hold_s` and carries on from its registry;
* `broker`: SIGSTOP the broker;
* `register`: a query registered or an older one dropped, live: the planner deploys a new
  operator version and the queries it serves switch to it at a barrier (this mode's live
  move), which may meet any of the above.

The check, per query: its sink exact against the reference of that query alone (its own
selections, windows and barriers, test_queries.expected), far-late records in no result
(a version skips them as older than its start) and in no dead-letter topic; every malformed
record once in the dead-letter topic of each live version that started reading before it
(and at most once in a retired one's)."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from streamjoin.launcher import write_job
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.queries.registry import Registry
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.integration.kafka_harness import Check, read_all
from tests.integration.nemesis import (HEARTBEAT_TIMEOUT_MS, HOUR_MS, WORKER_TIMEOUT_MS, Fault, Feeder, Nemesis,
                                       Outcome, bad_records, broker_for, dead_letter_refs, dead_letters_exact, drive,
                                       failed, recovery_lines, schedule)
from tests.integration.test_queries import (CARRIERS, FLIGHTS, STATUSES, TERMINALS, Produced, Service, catalog_job,
                                            expected, random_query, sink_results, wait_routed)

KINDS = ("kill", "pause", "coordinator", "service", "broker", "register")
# A restarted service carried on from its registry; a restarted worker restored or replayed its groups.
RECOVERY_EVENTS = (("registry restored",), ("groups restored from the changelog",), ("replayed batch",))
QUERIES = 2  # registered before the schedule starts; `register` faults add more


def catalog_row(rnd: random.Random, i: int, ts: int) -> tuple[bytes | None, int | None, dict]:
    """A flight (stream 0) or a check-in (stream 1), as test_queries writes them, to a random partition."""
    ts -= rnd.randint(0, 100)
    if i == 0:
        row = {"num": rnd.choice(FLIGHTS), "carrier": rnd.choice(CARRIERS), "terminal": rnd.choice(TERMINALS), "ts": ts}
    else:
        row = {"flight": rnd.choice(FLIGHTS), "status": rnd.choice(STATUSES), "seats": rnd.randint(0, 9), "ts": ts}
    return None, rnd.randrange(2), row


def nemesis_catalog(bootstrap: str, work: Path, seed: int) -> JobSettings:
    """test_queries' catalog as a job of its own (its own topics), with the nemesis's heartbeat timeouts."""
    job = catalog_job(bootstrap, work, embedded.free_port())
    name = f"qnem{seed}"
    return job.model_copy(update={
        "job": name, "streams": [s.model_copy(update={"topic": f"{name}.{s.name}"}) for s in job.streams],
        "coordinator": job.coordinator.model_copy(update={"heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
                                                          "worker_timeout_ms": WORKER_TIMEOUT_MS})})


def pod_pids(work_dir: Path, role: str | None = None) -> list[int]:
    """Processes whose arguments name `work_dir` (the service and the operator versions it
    runs), or only the versions' `role` ("worker", "coordinator") processes."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended while we looked
            continue
        if not any(str(work_dir) in a for a in argv):
            continue
        if role is None or role in argv and not any(a == "queries" for a in argv):
            found.append(int(cmdline.parent.name))
    return found


class QueriesNemesis(Nemesis):
    def __init__(self, service: Service, work_dir: Path, broker: embedded.EmbeddedBroker, seed: int) -> None:
        super().__init__(None, broker, seed)
        self.svc, self.work_dir, self.ids = service, work_dir, []  # type: list[str]
        self.query_rnd = random.Random(seed + 2)

    def supervise(self) -> None:
        """The service is a Deployment: when it exits, a new one starts."""
        assert self.svc.proc is not None
        if self.svc.proc.poll() is not None:
            self.svc.start()

    def _signal(self, role: str, sig: int) -> int | None:
        pids = pod_pids(self.work_dir, role)
        if not pids:
            return None
        pid = self.rnd.choice(sorted(pids))
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        return pid

    def kill(self, fault: Fault) -> None:
        self._signal("worker", signal.SIGKILL)
        self.idle(fault.hold_s)

    def coordinator(self, fault: Fault) -> None:
        self._signal("coordinator", signal.SIGKILL)
        self.idle(fault.hold_s)

    def pause(self, fault: Fault) -> None:
        pid = self._signal("worker", signal.SIGSTOP)
        self.idle(fault.hold_s)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def service(self, fault: Fault) -> None:
        assert self.svc.proc is not None
        self.svc.proc.kill()
        self.svc.proc.wait(30)
        self.kill_pod_leftovers()
        time.sleep(fault.hold_s)  # no supervising: the pod is down
        self.svc.start()

    def kill_pod_leftovers(self) -> None:
        """SIGKILL every process of the service's pod still running (the operator versions of a
        service that was killed: they live in its pod)."""
        for pid in pod_pids(self.work_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def register(self, _fault: Fault) -> None:
        """Register a query, or drop an older one (one time in three, while more than two are live)."""
        try:
            if len(self.ids) > 2 and self.query_rnd.random() < 1 / 3:
                self.svc.call("DELETE", f"/queries/{self.ids.pop(self.query_rnd.randrange(len(self.ids)))}")
            else:
                self.add()
        except (AssertionError, OSError, ValueError, httpx.HTTPError):  # refused or cut off: the check reads the rest
            pass

    def add(self) -> None:
        n = len(self.ids)
        view = self.svc.call("POST", "/queries", json={
            "sql": random_query(self.query_rnd), "sink": f"sink-{n}-{self.query_rnd.randrange(1 << 30)}",
            "region": self.query_rnd.choice(["east", "west"]), "lifetime_s": None})
        self.ids.append(view["id"])


def read_inputs(job: JobSettings, bootstrap: str, bad: dict) -> Produced:
    """Every good record on the catalog's topics, per stream, as the reference reads them."""
    rows: dict[str, list] = {}
    for s in job.streams:
        topic = job.topic_of(s)
        rows[s.name] = [((topic, m.partition(), m.offset()), json.loads(m.value()))
                        for m in read_all(bootstrap, topic, 2, f"nemesis-{s.name}")
                        if (topic, m.partition(), m.offset()) not in bad]
    return Produced(rows, threading.Lock(), [])


def check_queries(job: JobSettings, bootstrap: str, views: list[dict], produced: Produced) -> Check:
    """Every query's sink against that query alone, summed."""
    total = Counter()
    for view in views:
        want, got = expected(job, view, produced), sink_results(job, bootstrap, view)
        total.update(expected=len(want), results=len(got), missing=len(want - set(got)), extra=len(set(got) - want),
                     duplicates=len(got) - len(set(got)))
    return Check(expected=total["expected"], results=total["results"], missing=total["missing"],
                 extra=total["extra"], duplicates=total["duplicates"], dead_letter=Counter())


def versions_dead_letters_exact(job: JobSettings, bootstrap: str, work_dir: Path, bad: dict) -> bool:
    """Each live version's dead letters: exactly the malformed records from its start offsets
    on; a retired version's: some of those, none twice (dead_letters_exact says which differ)."""
    malformed = {ref: reason for ref, reason in bad.items() if reason == "malformed"}
    ok = True
    for record in Registry(job, kafka.Cluster(bootstrap)).load()[1].values():
        version = load(work_dir / record.job / "job.yaml")
        mine = lambda ref: ref[2] >= version.start_offset(ref[0], ref[1])  # noqa: E731
        if record.retired:  # stopped wherever it was: some of the malformed records from its start on, none twice
            seen = dead_letter_refs(version, bootstrap)
            wanted = {(ref, reason) for ref, reason in malformed.items() if mine(ref)}
            ok &= set(seen) <= wanted and all(n == 1 for n in seen.values())
        else:
            ok &= dead_letters_exact(version, bootstrap, malformed, only=mine)
    return ok


def run_one(mode: str, seed: int, seconds: float, faults: int, work: Path,
            broker: embedded.EmbeddedBroker | None = None, rate: int = 20) -> Outcome:
    """The query service under schedule(seed, seconds, faults, KINDS), every query checked."""
    plan = schedule(seed, seconds, faults, KINDS)
    work.mkdir(parents=True, exist_ok=True)
    with broker_for(work, broker) as b:
        job = nemesis_catalog(b.bootstrap, work, seed)
        topics.create_missing(kafka.Cluster(b.bootstrap).admin(), [p for p in topics.plan(job) if p.role == "input"])
        work_dir = work / "queries"
        service = Service(write_job(job, work / "job.yaml"), b.bootstrap, job.queries.port, work_dir)
        inputs = [job.topic_of(s) for s in job.streams]
        feeder, began_ms = Feeder(inputs, b.bootstrap, rate, seed, catalog_row), int(time.time() * 1000)
        nemesis = QueriesNemesis(service, work_dir, b, seed)
        try:
            feeder.start()
            service.start()
            for _ in range(QUERIES):
                nemesis.add()
            drive(nemesis, plan, seconds)
            feeder.finish()
            wait_routed(job, b.bootstrap, work_dir, timeout=300)
            views = service.call("GET", "/queries")
            bad = bad_records(b.bootstrap, inputs, began_ms - HOUR_MS // 2)
            result = check_queries(job, b.bootstrap, views, read_inputs(job, b.bootstrap, bad))
            dead_ok = versions_dead_letters_exact(job, b.bootstrap, work_dir, bad)
            return Outcome(mode, seed, plan, result, dead_ok, feeder.problems(bad),
                           recovery_lines(work_dir, *RECOVERY_EVENTS),
                           bad=len(bad), job=job, bootstrap=b.bootstrap)
        except Exception as e:  # noqa: BLE001 (the long form reports every schedule, failed or not)
            return failed(mode, seed, plan, e)
        finally:
            feeder.stop.set()
            if service.proc is not None and service.proc.poll() is None:
                try:
                    service.stop()
                except (AssertionError, OSError):
                    pass
            nemesis.kill_pod_leftovers()
