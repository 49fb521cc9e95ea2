"""SplitJoin with its merger under the nemesis (tests/integration/nemesis.py): a band join on
two cores (up to three) and the merger, fed live, under a schedule of SplitJoin's faults:

* `kill`: SIGKILL a core or the merger; it comes back after `hold_s` (a core's identity is
  its position and its state lives on its changelog partition: a restart "under a new id"
  is the same restart, so there is no separate `replace`);
* `pause`: SIGSTOP a core or the merger past the heartbeat timeout, then SIGCONT;
* `merger`: SIGKILL the merger; it comes back after `hold_s`;
* `broker`: SIGSTOP the broker;
* `scale`: `streamjoin splitjoin scale` to another k (1..3), live: new cores are started,
  departing ones retire on their own; it may meet any of the above.

At the end a tick moves every partition past the last record, the merger's release is
awaited, and the check is: exact against the plain-Python theta reference, every result in
input order on the results topic, every malformed and far-late record dead-lettered once
(by core 0)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from streamjoin.launcher import Fleet
from streamjoin.services import broker as embedded
from streamjoin.settings import JobSettings
from tests.integration.nemesis import (Fault, Feeder, Nemesis, Outcome, broker_for, checked, drive, failed,
                                       recovery_lines, schedule, serving)
from tests.integration.fleet_harness import wait_until
from tests.integration.ring_harness import check_ring
from tests.integration.splitjoin_harness import band_job, result_order, splitjoin_fleet, wait_released

KINDS = ("kill", "pause", "merger", "broker", "scale")
WINDOW_MS, CORES, MAX_CORES = 2_000, 2, 3


def band_row(job: JobSettings):  # type: ignore[no-untyped-def]
    """The band workload's rows (ring_harness.band_rows' values), to a random partition,
    event time up to 100 ms behind the clock (well inside the allowed lateness)."""
    def row(rnd: random.Random, i: int, ts: int) -> tuple[bytes | None, int | None, dict]:
        spec = job.streams[i]
        value: dict = {}
        for f, kind in spec.fields.items():
            value[f] = (ts - rnd.randint(0, 100) if f == spec.time_field else rnd.randint(1, 10_000) if kind == "int"
                        else rnd.uniform(1, 10_000) if kind == "float" else rnd.random() < 0.5 if kind == "bool"
                        else "z" * 20)
        return None, rnd.randrange(job.partitions), value
    return row


class SplitJoinNemesis(Nemesis):
    def __init__(self, fleet: Fleet, broker: embedded.EmbeddedBroker, seed: int) -> None:
        super().__init__(fleet, broker, seed)
        self.sj, self.cores, self.down = fleet, CORES, set()  # type: Fleet, int, set[str]

    def supervise(self) -> None:
        """As Fleet.supervise, and cores 0..k-1 kept running, as a StatefulSet of k replicas
        would (a core that retired before it read a scale mark taking it back is started again)."""
        self.sj.supervise()
        for position in range(self.cores):
            if f"core-{position}" not in self.sj.procs and f"core-{position}" not in self.down:
                self.sj.start_core(position)

    def _down(self, name: str, hold_s: float, back) -> None:  # type: ignore[no-untyped-def]
        self.down.add(name)
        try:
            super()._down(name, hold_s, back)
        finally:
            self.down.discard(name)

    def victims(self) -> list[str]:
        return sorted(n for n, p in self.sj.procs.items() if p.poll() is None) or ["merger"]

    def _back(self, name: str) -> None:
        if name == "merger":
            self.sj.start_merger()
        else:
            self.sj.start_core(int(name.removeprefix("core-")))

    def kill(self, fault: Fault) -> None:
        victim = self.rnd.choice(self.victims())
        self._down(victim, fault.hold_s, lambda: self._back(victim))

    def pause(self, fault: Fault) -> None:
        self._stopped(self.sj.procs[self.rnd.choice(self.victims())], fault.hold_s)

    def merger(self, fault: Fault) -> None:
        self._down("merger", fault.hold_s, self.sj.start_merger)

    def scale(self, _fault: Fault) -> None:
        k = self.rnd.choice([n for n in range(1, MAX_CORES + 1) if n != self.cores])
        if not self.cli("splitjoin", "scale", "--cores", str(k)):
            return
        self.cores = k  # supervise starts the new cores, and departing ones that retired since and are back in k
        self.supervise()


def run_one(mode: str, seed: int, seconds: float, faults: int, work: Path,
            broker: embedded.EmbeddedBroker | None = None, rate: int = 50) -> Outcome:
    """One SplitJoin job under schedule(seed, seconds, faults, KINDS), checked."""
    plan = schedule(seed, seconds, faults, KINDS)
    work.mkdir(parents=True, exist_ok=True)
    with broker_for(work, broker) as b:
        job = band_job(b.bootstrap, work, WINDOW_MS, (500, 2000), cores=CORES, max_cores=MAX_CORES,
                       job=f"sjnem{seed}")
        inputs = [job.topic_of(s) for s in job.streams]
        fleet = splitjoin_fleet(job, b.bootstrap, work, cores=CORES)
        feeder, began_ms = Feeder(inputs, b.bootstrap, rate, seed, band_row(job)), int(time.time() * 1000)
        try:
            # The schedule starts once every core and the merger serve (a loaded machine takes
            # seconds to start a process; a fault before that would strike nothing yet).
            wait_until("the cores and the merger serving", lambda: all(
                serving(port) for port in fleet.metrics_ports.values()), 120, fleet)
            feeder.start()
            nemesis = SplitJoinNemesis(fleet, b, seed)
            drive(nemesis, plan, seconds)
            feeder.finish()
            end = feeder.input.newest_ts + 1  # every record is below it
            if not nemesis.cli("splitjoin", "tick", "--ts", str(end + job.join.allowed_lateness_ms)):
                raise RuntimeError("the closing tick was not written")
            wait_released(job, fleet, end, timeout=300)
            recovered = recovery_lines(work / "logs", ('"core restored"', '"source": "own"'), ('"merger restored"',))
            order = result_order(job, b.bootstrap)
            return checked(mode, seed, plan, feeder, job, b.bootstrap, began_ms, check_ring(job, b.bootstrap),
                           recovered, ordered=order == sorted(order) and len(set(order)) == len(order))
        except Exception as e:  # noqa: BLE001 (the long form reports every schedule, failed or not)
            return failed(mode, seed, plan, e)
        finally:
            feeder.stop.set()
            fleet.stop_all()
