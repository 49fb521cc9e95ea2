"""Hash mode under the nemesis (tests/integration/nemesis.py): a 2-way equi-join on 3
workers and 8 partition groups, inner or left (`hash-inner`, `hash-left`), fed live with
keyed rows, under a schedule of hash mode's faults:

* `kill`: SIGKILL a worker; it comes back under its own id after `hold_s` (a StatefulSet pod);
* `replace`: SIGKILL a worker for good; a worker with a new id starts after `hold_s`;
* `pause`: SIGSTOP a worker for `hold_s`, longer than the worker timeout, then SIGCONT
  (its groups fail over; the zombie is fenced and restarts);
* `coordinator`: SIGKILL the coordinator; it comes back after `hold_s`;
* `broker`: SIGSTOP the broker for `hold_s`, then SIGCONT (every client sees it vanish);
* `move`: a live move of a random group to a random worker (`streamjoin move`), which may
  meet any of the above.

The check: exact against the reference (inner join, or outer join with each group's final
watermark), every malformed and far-late record dead-lettered once."""

from __future__ import annotations

import random
import time
from pathlib import Path

from streamjoin.launcher import Fleet, wait_drained, write_job
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import check
from tests.integration.nemesis import (HEARTBEAT_TIMEOUT_MS, WORKER_TIMEOUT_MS, Fault, Feeder, Nemesis, Outcome,
                                       broker_for, checked, drive, failed, recovery_lines, schedule)

KINDS = ("kill", "replace", "pause", "coordinator", "broker", "move")
JOIN_TYPES = {"hash-inner": {"type": "inner"}, "hash-left": {"type": "left"}}


def keyed_row(rnd: random.Random, _stream: int, ts: int) -> tuple[bytes | None, int | None, dict]:
    """Hash mode's rows: one of 200 keys, event time up to 200 ms behind `ts`."""
    k = rnd.randrange(200)
    return key_bytes(k), None, {"k": k, "ts": ts - rnd.randint(0, 200), "pad": "x" * 8}


class HashNemesis(Nemesis):
    """Hash mode's faults (the module docstring's list)."""

    def __init__(self, fleet: Fleet, broker: embedded.EmbeddedBroker, job: JobSettings, seed: int) -> None:
        super().__init__(fleet, broker, seed)
        self.job, self.victim = job, ""

    def workers(self) -> list[str]:
        return sorted(n for n, p in self.fleet.procs.items() if n.startswith("w") and p.poll() is None)

    def apply(self, fault: Fault) -> None:
        workers = self.workers()
        if fault.kind in ("kill", "replace", "pause") and len(workers) < 2:
            return  # one worker left: nothing to fail over to
        self.victim = self.rnd.choice(workers) if workers else ""  # drawn for every kind: a seed's victims stay put
        super().apply(fault)

    def kill(self, fault: Fault) -> None:
        victim = self.victim
        self._down(victim, fault.hold_s, lambda: self.fleet.start_worker(victim))

    def replace(self, fault: Fault) -> None:
        self.next_id += 1
        self._down(self.victim, fault.hold_s, lambda: self.fleet.start_worker(f"w{self.next_id}"))

    def pause(self, fault: Fault) -> None:
        self._stopped(self.fleet.procs[self.victim], fault.hold_s)

    def coordinator(self, fault: Fault) -> None:
        self._down("coordinator", fault.hold_s, self.fleet.start_coordinator)

    def move(self, fault: Fault) -> None:
        # Asked, not awaited (--wait 0): under faults the coordinator may refuse it or carry it out late.
        if self.victim:
            self.cli("move", str(self.rnd.randrange(self.job.partitions)), "--to", self.victim, "--wait", "0")


def run_one(mode: str, seed: int, seconds: float, faults: int, work: Path,
            broker: embedded.EmbeddedBroker | None = None, rate: int = 100) -> Outcome:
    """One hash-mode job (`mode`: hash-inner or hash-left) under schedule(seed, seconds, faults), checked."""
    plan = schedule(seed, seconds, faults, KINDS)
    work.mkdir(parents=True, exist_ok=True)
    with broker_for(work, broker) as b:
        job = make_job(b.bootstrap, work, [{"range_ms": 1000}, {"range_ms": 1000}], workers=3, partitions=8,
                       join={"allowed_lateness_ms": 2000, **JOIN_TYPES[mode]},
                       coordinator={"heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
                                    "worker_timeout_ms": WORKER_TIMEOUT_MS})
        job = job.model_copy(update={"job": f"nem{seed}-{mode}"})
        topics.ensure(kafka.Cluster(b.bootstrap).admin(), job)
        fleet = Fleet(job, write_job(job, work / "job.yaml"), b.bootstrap, work / "logs")
        inputs = [job.topic_of(s) for s in job.streams]
        feeder, began_ms = Feeder(inputs, b.bootstrap, rate, seed, keyed_row), int(time.time() * 1000)
        try:
            fleet.start_coordinator()
            for w in ("w0", "w1", "w2"):
                fleet.start_worker(w)
            fleet.wait_assigned(["w0", "w1", "w2"], timeout=90)
            feeder.start()
            nemesis = HashNemesis(fleet, b, job, seed)
            drive(nemesis, plan, seconds)
            feeder.finish()
            wait_drained(job, b.bootstrap, fleet, timeout=300)
            # The crash path ran: a group restored or a batch replayed, or a dead worker's transactions
            # fenced by the one taking its groups (which has nothing to restore if they were still empty).
            recovered = recovery_lines(work / "logs", ("groups restored from the changelog",), ("replayed batch",),
                                       ("fenced a dead worker's transactions",))
            return checked(mode, seed, plan, feeder, job, b.bootstrap, began_ms, check(job, b.bootstrap), recovered)
        except Exception as e:  # noqa: BLE001 (the long form reports every schedule, failed or not)
            return failed(mode, seed, plan, e)
        finally:
            feeder.stop.set()
            fleet.stop_all()
