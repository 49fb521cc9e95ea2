"""The coordinator's ring duties (seed 004): size the ring at start with the
cost model, tell the head its layout and join orders, and carry out operators'
`ring add` / `ring remove` requests. Level-triggered like placement: whenever
the head's heartbeat shows another layout than the wanted one, the layout is
sent again, so a restarted head converges without extra protocol."""

from __future__ import annotations

import structlog
from confluent_kafka import Producer

from streamjoin.schemas import control
from streamjoin.services.kafka import Cluster
from streamjoin.services.coordinator.ring_plan import calibrate, choose_ring_size
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.coordinator.ring")


class RingCoordination:
    def __init__(self, job: JobSettings, cluster: Cluster, out: Producer) -> None:
        self.job, self.cluster, self.out = job, cluster, out
        self.layout: list[str] = []
        self.orders: list[list[int]] = []
        self.epoch = 0

    def on_heartbeat(self, beat: control.Heartbeat, alive: list[str]) -> None:
        if not self.layout and len(alive) >= self.job.coordinator.expected_workers:
            self._start(alive)
        if self.layout and beat.worker == self.layout[0] and beat.ring_layout != self.layout:
            self._send()

    def on_change(self, change: control.RingChange) -> None:
        if not self.layout:
            log.warning("ring change before the ring started; ignored", change=change.model_dump())
            return
        if change.action == "add" and change.worker not in self.layout:
            if len(self.layout) >= self.job.ring.max_nodes:
                log.warning("ring is at ring.max_nodes; not adding", worker=change.worker)
                return
            self.layout.append(change.worker)
        elif change.action == "remove" and change.worker in self.layout[1:]:
            self.layout.remove(change.worker)
        else:
            log.warning("ring change not applicable (unknown worker, or the head)", change=change.model_dump())
            return
        self.epoch += 1
        log.info("ring layout changed", layout=self.layout, epoch=self.epoch)
        self._send()

    def _start(self, alive: list[str]) -> None:
        measured = calibrate(self.job, self.cluster)
        wanted = self.job.ring.nodes if isinstance(self.job.ring.nodes, int) else choose_ring_size(self.job, measured)
        self.layout = sorted(alive)[:max(1, min(wanted, len(alive)))]
        self.orders = [list(o) for o in measured.orders]
        self.epoch = 1
        log.info("ring sized", nodes=len(self.layout), wanted=wanted, layout=self.layout, orders=self.orders)
        self._send()

    def _send(self) -> None:
        msg = control.RingLayout(layout=self.layout, orders=self.orders, epoch=self.epoch)
        self.out.produce(self.job.control_topic, value=control.encode(msg), key=b"ring-layout", partition=0)
        self.out.poll(0)
