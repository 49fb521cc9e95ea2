"""The coordinator: tracks workers by heartbeat on the control topic, makes
the initial placement (round-robin once `coordinator.expected_workers` are
alive), keeps it durable, moves groups (operators' `move` and `drain`
requests, and failover of dead workers: moves.py), and tells each worker its
groups whenever the worker's heartbeat shows it holds something else
(level-triggered, so a restarted worker or coordinator converges without
extra protocol)."""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import replace

import structlog
from confluent_kafka import OFFSET_END, Message, TopicPartition

from streamjoin.schemas import control
from streamjoin.services import faults, metrics
from streamjoin.services.io import kafka
from streamjoin.services.coordinator import placement as placing
from streamjoin.services.coordinator.adapt import plan_epoch
from streamjoin.services.coordinator.epoch import History, Plan
from streamjoin.services.coordinator.hot_keys import HotKeys
from streamjoin.services.coordinator.moves import Finished, Moves
from streamjoin.services.coordinator.rebalance import observe
from streamjoin.services.coordinator.ring import RingCoordination
from streamjoin.services.coordinator.splits import Splits
from streamjoin.services.shutdown import Stopped, StopFlag
from streamjoin.settings import JobSettings
from streamjoin.topology import topics

log = structlog.get_logger("streamjoin.coordinator")


class Coordinator:
    def __init__(self, job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None = None) -> None:
        self.job = job
        self.metrics_port = job.coordinator.metrics_port if metrics_port is None else metrics_port
        self.cluster = cluster
        self.control_in = self.cluster.control_consumer(f"{job.consumer_group}-coordinator")
        self.out = self.cluster.producer()
        self.moves: Moves | None = None  # the placement and the moves in flight, once a placement exists
        self.started_at = time.monotonic()
        self.last_seen: dict[str, float] = {}
        # coordinator.placement: adaptive: the heartbeats of the current reorganisation epoch, what
        # earlier adaptations did, and when the next epoch ends.
        self.beats: deque[control.Heartbeat] = deque()
        self.history = History()
        self.rng = random.Random()
        self.next_epoch_at = time.monotonic() + job.coordinator.reorg_epoch_ms / 1000
        self.health = metrics.HealthState()
        self.stop_flag = StopFlag()
        self.ring = RingCoordination(job, self.cluster, self.out) if job.join.mode == "ring" else None
        self.hot_keys = HotKeys(job.coordinator)  # hash mode: the keys that carry much of the input
        self.splits = Splits(job)  # hash mode: the hot keys split over slots (coordinator.hot_key_slots)

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
            records, split_records = placing.load_all(self.job, self.cluster)
        if records:
            self.moves = Moves.loaded(records, time.monotonic())
        self.splits = Splits.loaded(self.job, split_records)
        for split in self.splits.records.values():
            metrics.SPLIT_KEYS.labels(str(split.group), split.key).set(len(split.slots) + 1)
        log.info("coordinator started", groups_placed=len(records), splits=sorted(self.splits.records),
                 epoch=self.moves.epoch if self.moves else 0, moving=sorted(self.moves.moving) if self.moves else [])
        self.control_in.assign([TopicPartition(self.job.control_topic, 0, OFFSET_END)])

    def _loop(self) -> None:
        self.health.ready, self.health.detail = True, "running"
        while not self.stop_flag.set:
            for m in self._next_messages():
                if m.error() is None:
                    msg = control.decode_control(m.value())
                    if isinstance(msg, control.Heartbeat):
                        self.on_heartbeat(msg)
                    elif isinstance(msg, control.RingChange) and self.ring is not None:
                        self.ring.on_change(msg)
                    elif isinstance(msg, (control.MoveGroup, control.DrainWorker)):
                        self.on_request(msg)
            self._fail_over()
            self._replace_ring_nodes()
            self._adapt()
            self._update_metrics()

    def _next_messages(self) -> list[Message]:
        """What the control topic holds now, waiting up to 0.2 s for the first message (every
        step of a move waits on this loop)."""
        return kafka.consume_ready(self.control_in, 500, 0.2)

    def stop(self) -> None:
        self.stop_flag.request()

    def alive(self) -> list[str]:
        horizon = time.monotonic() - self.job.coordinator.heartbeat_timeout_ms / 1000
        return sorted(w for w, t in self.last_seen.items() if t >= horizon)

    def dead(self) -> list[str]:
        """Workers with groups (placed or on their way from them) silent for `worker_timeout_ms`;
        a worker not heard since this coordinator started counts from its start."""
        if self.moves is None or not self._hearing():
            return []
        horizon = time.monotonic() - self.job.coordinator.worker_timeout_ms / 1000
        involved = set(self.moves.owners.values()) | set(self.moves.moving.values())
        return sorted(w for w in involved if self.last_seen.get(w, self.started_at) < horizon)

    def _hearing(self) -> bool:
        """Whether any heartbeat arrived within `heartbeat_timeout_ms`: when none did, this
        coordinator is the one cut off (the broker is away), and nobody is declared dead."""
        newest = max(self.last_seen.values(), default=self.started_at)
        return time.monotonic() - newest < self.job.coordinator.heartbeat_timeout_ms / 1000

    def on_heartbeat(self, beat: control.Heartbeat) -> None:
        now = time.monotonic()
        if not self._hearing():
            # The first heartbeat after this coordinator heard none for a while: the silence was
            # its own (the broker was away), so every worker's timeout starts again from now.
            self.last_seen = dict.fromkeys(self.last_seen, now)
            self.started_at = now
        self.last_seen[beat.worker] = now
        if self.job.coordinator.placement == "adaptive":
            self.beats.append(beat)
        if self.ring is not None:  # ring mode places no partition groups: the head reads them all
            self.ring.on_heartbeat(beat, self.alive())
            return
        self.hot_keys.on_heartbeat(beat, self.alive())
        if self.moves is None and len(self.alive()) >= self.job.coordinator.expected_workers:
            placement = placing.round_robin(self.alive(), self.job.group_count)  # the slots too
            placing.store(self.job, self.out, placement, control.FIRST_EPOCH)
            self.moves = Moves(placement, {}, control.FIRST_EPOCH)
            log.info("placement made", workers=self.alive(), epoch=control.FIRST_EPOCH)
        if self.moves is None:
            return
        records, finished = self.moves.on_heartbeat(beat, self.dead(), now)
        if records:
            placing.store_records(self.job, self.out, records)
            log.info("moves advanced", groups=[r.group for r in records], by=beat.worker)
            faults.reach("release-stored")
        for f in finished:
            self._finished(f)
        self._split_hot_keys(beat)
        if self.moves.needs_assignment(beat) or self.splits.behind(beat):
            self._assign(beat.worker)
        ended = {f.group for f in finished}
        for worker in sorted({r.worker for r in records if r.group not in ended}):
            self._assign(worker)  # a receiver need not wait for its next heartbeat

    def _split_hot_keys(self, beat: control.Heartbeat) -> None:
        """Split the hot keys and merge the cooled ones (splits.py), forget the episodes `beat`'s
        worker ended; store the records, then tell the groups' owners."""
        if self.moves is None:
            return
        changed = self.splits.reconcile(self.hot_keys.hot, self.moves.owners, self.alive())
        ended = self.splits.ended(beat)
        if changed or ended:
            placing.store_splits(self.job, self.out, changed, ended, self.splits.next_episode)
        for worker in sorted({self.moves.owners[r.group] for r in changed}):
            self._assign(worker)

    def _assign(self, worker: str) -> None:
        """Tell `worker` the groups it should hold now, at the current epoch, and their split keys."""
        if self.moves is None:
            return
        wanted = self.moves.wanted(worker)
        assignment = control.Assignment(worker=worker, groups=wanted, epoch=self.moves.epoch,
                                        fence=self.moves.to_fence(worker), splits=self.splits.of_groups(wanted))
        self.out.produce(self.job.control_topic, value=control.encode(assignment), key=b"assignment", partition=0)
        self.out.poll(0)
        log.info("assignment sent", worker=worker, groups=len(wanted), epoch=self.moves.epoch)

    def on_request(self, request: control.MoveGroup | control.DrainWorker) -> None:
        """An operator's `streamjoin move` or `drain`: start the moves (stored first), or say why not."""
        if self.moves is None or self.ring is not None:
            outcome: object = "no placement of partition groups to change (ring mode, or none made yet)"
        elif isinstance(request, control.MoveGroup):
            outcome = self.moves.move(request.group, request.to, self.alive(), time.monotonic())
        else:
            outcome = self.moves.drain(request.worker, self.alive(), time.monotonic())
        if isinstance(outcome, str):
            metrics.MIGRATIONS.labels("refused").inc()
            log.warning("request refused", request=request.type, reason=outcome)
            return
        placing.store_records(self.job, self.out, outcome)  # type: ignore[arg-type]
        log.info("moves started", request=request.type, epoch=self.moves.epoch,  # type: ignore[union-attr]
                 moves=[f"{r.group}:{r.moving_from}->{r.worker}" for r in outcome])  # type: ignore[union-attr]
        faults.reach("move-stored")
        for sender in sorted({r.moving_from for r in outcome if r.moving_from}):  # type: ignore[union-attr]
            self._assign(sender)  # the sender lets go now, not at its next heartbeat

    def _fail_over(self) -> None:
        """`coordinator.failover: reassign`: the groups of workers dead for `worker_timeout_ms` go to live ones."""
        if self.moves is None or self.job.coordinator.failover != "reassign":
            return
        dead = self.dead()
        records = self.moves.fail_over(dead, self.alive(), time.monotonic()) if dead else []
        if records:
            placing.store_records(self.job, self.out, records)
            metrics.MIGRATIONS.labels("failover").inc(len(records))
            log.warning("failover: dead workers' groups given to live ones", dead=dead, epoch=self.moves.epoch,
                        moves=[f"{r.group}->{r.worker}" for r in records])
            faults.reach("failover-stored")
            for worker in sorted({r.worker for r in records}):
                self._assign(worker)

    def _replace_ring_nodes(self) -> None:
        """Ring mode: hand silent ring nodes to standbys (ring.py `check_standbys`). Not while this
        coordinator hears no heartbeat at all: then the silence is its own, not the nodes'."""
        if self.ring is None or not self._hearing():
            return
        self.ring.check_standbys(self.last_seen, time.monotonic())

    def _adapt(self) -> None:
        """`coordinator.placement: adaptive`: at the end of each reorganisation epoch, plan the
        epoch's adaptation from its heartbeats (adapt.py) and start its moves."""
        if self.job.coordinator.placement != "adaptive" or self.moves is None or self.ring is not None:
            return
        if time.monotonic() < self.next_epoch_at:
            return
        self.next_epoch_at = time.monotonic() + self.job.coordinator.reorg_epoch_ms / 1000
        now_ms = int(time.time() * 1000)
        horizon = now_ms - max(self.job.coordinator.reorg_epoch_ms, self.job.coordinator.heartbeat_timeout_ms)
        while self.beats and self.beats[0].wall_ms < horizon:
            self.beats.popleft()
        observations = observe(self.moves.owners, list(self.beats), now_ms, self.job.coordinator)
        in_flight = bool(self.moves.moving or self.moves.arriving)
        plan = plan_epoch(observations, self.job.coordinator, now_ms, replace(self.history, in_flight=in_flight),
                          self.rng, self.job.worker.spill.push_fraction)
        self._start_plan(plan)

    def _start_plan(self, plan: Plan) -> None:
        """Start `plan`'s moves through the migration protocol (a scale-in victim is drained; a
        worker scaled out is no longer), or send its push order (a plan never has both)."""
        if self.moves is None:
            return
        if plan.push is not None:
            self._order_push(plan)
            return
        if plan.scale is not None and plan.scale.action == "scale-in":
            self.moves.drained.add(plan.scale.worker)
        elif plan.scale is not None:
            self.moves.drained.discard(plan.scale.worker)
        started = []
        for move in plan.moves:
            outcome = self.moves.move(move.group, move.target, self.alive(), time.monotonic())
            if isinstance(outcome, str):
                metrics.MIGRATIONS.labels("refused").inc()
                log.warning("adaptive move not started", group=move.group, target=move.target, reason=outcome)
                continue
            placing.store_records(self.job, self.out, outcome)
            started.append(move)
        if started or plan.scale is not None:
            self.history = self.history.after(plan)
            log.info("adaptation started", adaptation=plan.adaptation, scale=plan.scale and plan.scale.why,
                     moves=[f"{m.group}:{m.source}->{m.target} ({m.reason})" for m in started])
        for sender in sorted({m.source for m in started}):
            self._assign(sender)

    def _order_push(self, plan: Plan) -> None:
        """Active-disk (the spill paper, section 6): tell the plan's slowest worker
        to push state to disk. The push is the worker's own work, not a migration, so nothing
        is in flight after; the history keeps its time for the next order's cool-down."""
        order = plan.push
        if order is None:
            return
        message = control.PushGroups(worker=order.worker, bytes=order.bytes, why=order.why)
        self.out.produce(self.job.control_topic, value=control.encode(message), key=b"push-groups", partition=0)
        self.out.poll(0)
        metrics.PUSH_ORDERS.inc()
        self.history = self.history.after(plan)
        log.info("push ordered", worker=order.worker, bytes=order.bytes, why=order.why)

    def _finished(self, move: Finished) -> None:
        metrics.MIGRATIONS.labels("done").inc()
        metrics.MIGRATION_PAUSE_SECONDS.observe(move.pause_s)
        metrics.MIGRATED_BYTES.inc(move.state_bytes)
        log.info("move done", group=move.group, sender=move.sender, receiver=move.receiver,
                 pause_s=round(move.pause_s, 3), state_bytes=move.state_bytes)

    def _update_metrics(self) -> None:
        metrics.WORKERS_ALIVE.set(len(self.alive()))
        metrics.GROUPS_PLACED.set(len(self.moves.owners) if self.moves else 0)
        metrics.MIGRATIONS_IN_FLIGHT.set(len(self.moves.moving) + len(self.moves.arriving) if self.moves else 0)


def run_coordinator(job: JobSettings, cluster: kafka.Cluster, metrics_port: int | None = None) -> None:
    faults.install(job, "coordinator")
    Coordinator(job, cluster, metrics_port).run()
