"""Ring mode under the nemesis (tests/integration/nemesis.py): the 3-way band ring
(streamjoin/jobs/band3.yaml) on 3 nodes and a standby, fed live, under a schedule of the
ring's faults:

* `kill`: SIGKILL a ring node; it comes back under its own id after `hold_s` (the ring
  rolls back to its last checkpoint and re-drives the logged rounds);
* `replace`: SIGKILL a ring node for good; the coordinator hands its id to the standby,
  and a new spare (a worker with a new id) starts after `hold_s`;
* `pause`: SIGSTOP a ring node past the heartbeat timeout, then SIGCONT (it may have been
  replaced meanwhile: a fenced node exits, and a new spare takes its place);
* `coordinator`: SIGKILL the coordinator; it comes back after `hold_s`;
* `broker`: SIGSTOP the broker;
* `resize`: `streamjoin ring add` a spare, or `ring remove` a node other than the head,
  live, which may meet any of the above.

The check: exact against the plain-Python theta reference over every input the ring
released, and every malformed and far-late record in the dead-letter topic once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from streamjoin.launcher import Fleet, wait_layout, wait_ring_quiet, write_job
from streamjoin.schemas.control import RING_FENCED_EXIT
from streamjoin.schemas.results import RoundRelease
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import latest_heartbeats
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.nemesis import (HEARTBEAT_TIMEOUT_MS, WORKER_TIMEOUT_MS, Fault, Feeder, Nemesis, Outcome,
                                       broker_for, checked, drive, failed, schedule)
from tests.integration.nemesis_splitjoin import band_row
from tests.integration.fleet_harness import wait_until
from tests.integration.kafka_harness import commits
from tests.integration.ring_harness import check_ring
from tests.integration.test_ring import band3

KINDS = ("kill", "replace", "pause", "coordinator", "broker", "resize")
NODES = ["w0", "w1", "w2"]


def ring_job(bootstrap: str, work: Path, seed: int) -> JobSettings:
    """band3 on 3 nodes and a standby, checkpointing every 1.5 s, a silent node replaced after 6 s."""
    return band3(bootstrap, work, job=f"rnem{seed}", ring={"nodes": 3, "checkpoint_ms": 1500, "standby_after_ms": 6000},
                 coordinator={"expected_workers": 4, "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
                              "worker_timeout_ms": WORKER_TIMEOUT_MS})


def rollbacks_mid_run(log_dir: Path) -> int:
    """The head's rollbacks after rounds had been released (its log line names a next round
    past 0; the start's own rollback names 0): the crash path ran. Logs outlive the processes."""
    return sum('"ring head rolled back"' in line and '"next_round": 0,' not in line
               for log in log_dir.rglob("*.log") for line in log.read_text(errors="replace").splitlines())


@dataclass
class RingFleet(Fleet):
    """A fleet whose ring nodes fenced for good (their id went to a standby, RING_FENCED_EXIT)
    are replaced by a new spare, as a StatefulSet scaled to keep one would."""

    next_id: int = 100

    def supervise(self) -> None:
        for name, proc in list(self.procs.items()):
            if name.startswith("w") and proc.poll() == RING_FENCED_EXIT:
                self.procs.pop(name)
                self.spare()
        super().supervise()

    def spare(self) -> None:
        self.next_id += 1
        self.start_worker(f"w{self.next_id}")


class RingNemesis(Nemesis):
    def __init__(self, fleet: RingFleet, broker: embedded.EmbeddedBroker, job: JobSettings, seed: int) -> None:
        super().__init__(fleet, broker, seed)
        self.ring, self.job = fleet, job

    def layout(self) -> list[str]:
        """The head's ring layout, as its newest heartbeat says ([] when none says)."""
        beats = latest_heartbeats(self.job, kafka.Cluster(self.ring.bootstrap), window_s=3)
        return next((b.ring_layout for b in beats.values() if b.ring_layout), [])

    def running(self) -> list[str]:
        return sorted(n for n, p in self.ring.procs.items() if n.startswith("w") and p.poll() is None)

    def _node(self) -> str | None:
        """A running ring node, else any running worker."""
        running = self.running()
        nodes = [n for n in self.layout() if n in running] or running
        return self.rnd.choice(nodes) if nodes else None

    def kill(self, fault: Fault) -> None:
        victim = self._node()
        if victim is not None:
            self._down(victim, fault.hold_s, lambda: self.ring.start_worker(victim))

    def replace(self, fault: Fault) -> None:
        victim = self._node()
        if victim is not None:
            self._down(victim, fault.hold_s, self.ring.spare)

    def pause(self, fault: Fault) -> None:
        victim = self._node()
        if victim is not None:
            self._stopped(self.ring.procs[victim], fault.hold_s)

    def coordinator(self, fault: Fault) -> None:
        self._down("coordinator", fault.hold_s, self.ring.start_coordinator)

    def resize(self, _fault: Fault) -> None:
        """Grow the ring by a spare up to 4 nodes, else shrink it by a node other than the head
        (down to 2): a ring of 3 with a spare grows, then shrinks."""
        layout, running = self.layout(), self.running()
        spares = [w for w in running if layout and w not in layout]
        if spares and len(layout) < 4:
            spare = self.rnd.choice(spares)
            asked = self.cli("ring", "add", spare) and layout + [spare]
        elif len(layout) > 2:
            node = self.rnd.choice(layout[1:])
            asked = self.cli("ring", "remove", node) and [n for n in layout if n != node]
        else:
            return
        # Up to 20 s for the layout asked for (supervising meanwhile), so that the next resize
        # starts from it; under faults it may take longer, and the check is what the output holds.
        deadline = time.monotonic() + 20
        while asked and sorted(self.layout()) != sorted(asked) and time.monotonic() < deadline:
            self.idle(0.5)


def run_one(mode: str, seed: int, seconds: float, faults: int, work: Path,
            broker: embedded.EmbeddedBroker | None = None, rate: int = 30) -> Outcome:
    """One ring job under schedule(seed, seconds, faults, KINDS), checked."""
    plan = schedule(seed, seconds, faults, KINDS)
    work.mkdir(parents=True, exist_ok=True)
    with broker_for(work, broker) as b:
        job = ring_job(b.bootstrap, work, seed)
        topics.ensure(kafka.Cluster(b.bootstrap).admin(), job)
        fleet = RingFleet(job, write_job(job, work / "job.yaml"), b.bootstrap, work / "logs")
        inputs = [job.topic_of(s) for s in job.streams]
        feeder = Feeder(inputs, b.bootstrap, rate, seed, band_row(job), arm_after_s=None)
        began_ms = int(time.time() * 1000)
        try:
            fleet.start_coordinator()
            for w in NODES + ["w3"]:  # w3: the standby
                fleet.start_worker(w)
            wait_layout(job, b.bootstrap, fleet, NODES, timeout=120)
            feeder.start()
            # Far-late records once the head has released a round below a watermark of this run's
            # event times: every partition has shown it event time.
            wait_until("a first round released", lambda: any(
                isinstance(c, RoundRelease) and c.watermark >= began_ms - 10_000 for c in commits(job, b.bootstrap)),
                120, fleet, interval=0.5)
            feeder.armed.set()
            nemesis = RingNemesis(fleet, b, job, seed)
            drive(nemesis, plan, seconds)
            feeder.finish()
            wait_ring_quiet(job, b.bootstrap, fleet, timeout=300)
            return checked(mode, seed, plan, feeder, job, b.bootstrap, began_ms, check_ring(job, b.bootstrap),
                           rollbacks_mid_run(work / "logs"))
        except Exception as e:  # noqa: BLE001 (the long form reports every schedule, failed or not)
            return failed(mode, seed, plan, e)
        finally:
            feeder.stop.set()
            fleet.stop_all()
