"""The coordinator: tracks workers by heartbeat on the control topic, makes
the initial placement (round-robin once `coordinator.expected_workers` are
alive), keeps it durable, and tells each worker its groups whenever the
worker's heartbeat shows it holds something else (level-triggered, so a
restarted worker or coordinator converges without extra protocol)."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import OFFSET_END, TopicPartition

from streamjoin.schemas import control
from streamjoin.services import kafka, metrics
from streamjoin.services.coordinator import placement as placing
from streamjoin.services.coordinator.ring import RingCoordination
from streamjoin.services.shutdown import Stopped, StopFlag
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.coordinator")


class Coordinator:
    def __init__(self, job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None = None) -> None:
        self.job = job
        self.metrics_port = job.coordinator.metrics_port if metrics_port is None else metrics_port
        self.cluster = cluster
        self.control_in = self.cluster.consumer(f"{job.consumer_group}-coordinator")
        self.out = self.cluster.producer()
        self.placement: dict[int, str] = {}
        self.epoch = 0
        self.last_seen: dict[str, float] = {}
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.ring = RingCoordination(job, self.cluster, self.out) if job.join.mode == "ring" else None

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (services/shutdown.py), then close the clients."""
        self.stop_flag.install()
        metrics.serve(self.metrics_port, self.health)
        try:
            self._start()
            self._loop()
        except Stopped:
            log.info("stopped while waiting on the broker")
        self.health.ready, self.health.detail = False, "stopping"
        self.control_in.close()
        self.out.flush(5)
        log.info("coordinator stopped")

    def _start(self) -> None:
        with self.stop_flag.interruptible():
            kafka.wait_for_broker(self.cluster, log)
            topics.ensure(self.cluster.admin(), self.job)
            self.placement, self.epoch = placing.load(self.job, self.cluster)
        log.info("coordinator started", groups_placed=len(self.placement), epoch=self.epoch)
        if self.job.coordinator.placement == "adaptive":
            log.warning("coordinator.placement adaptive: groups stay where they are until the migration protocol "
                        "exists; `streamjoin rebalance --dry-run` shows what the policy would move")
        self.control_in.assign([TopicPartition(self.job.control_topic, 0, OFFSET_END)])

    def _loop(self) -> None:
        self.health.ready, self.health.detail = True, "running"
        while not self.stop_flag.set:
            for m in self.control_in.consume(500, 0.2):
                if m.error() is None:
                    msg = control.decode_control(m.value())
                    if isinstance(msg, control.Heartbeat):
                        self.on_heartbeat(msg)
                    elif isinstance(msg, control.RingChange) and self.ring is not None:
                        self.ring.on_change(msg)
            self._update_metrics()

    def stop(self) -> None:
        self.stop_flag.request()

    def alive(self) -> list[str]:
        horizon = time.monotonic() - self.job.coordinator.heartbeat_timeout_ms / 1000
        return sorted(w for w, t in self.last_seen.items() if t >= horizon)

    def on_heartbeat(self, beat: control.Heartbeat) -> None:
        self.last_seen[beat.worker] = time.monotonic()
        if self.ring is not None:  # ring mode places no partition groups: the head reads them all
            self.ring.on_heartbeat(beat, self.alive())
            return
        if not self.placement and len(self.alive()) >= self.job.coordinator.expected_workers:
            self.epoch += 1
            self.placement = placing.round_robin(self.alive(), self.job.partitions)
            placing.store(self.job, self.out, self.placement, self.epoch)
            log.info("placement made", workers=self.alive(), epoch=self.epoch)
        if not self.placement:
            return
        wanted = placing.groups_of(self.placement, beat.worker)
        if beat.groups != wanted:
            assignment = control.Assignment(worker=beat.worker, groups=wanted, epoch=self.epoch)
            self.out.produce(self.job.control_topic, value=control.encode(assignment), key=b"assignment",
                             partition=0)
            self.out.poll(0)
            log.info("assignment sent", worker=beat.worker, groups=len(wanted), epoch=self.epoch)

    def _update_metrics(self) -> None:
        metrics.WORKERS_ALIVE.set(len(self.alive()))
        metrics.GROUPS_PLACED.set(len(self.placement))


def run_coordinator(job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None = None) -> None:
    Coordinator(job, cluster, metrics_port).run()
