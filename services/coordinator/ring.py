"""The coordinator's ring duties (PSP): size the ring at start with the
cost model, tell the head its layout and join orders, and carry out operators'
`ring add` / `ring remove` requests. Level-triggered like placement: whenever
the head's heartbeat shows another layout than the wanted one, the layout is
sent again, so a restarted head converges without extra protocol. A ring node
silent for `ring.standby_after_ms` is handed to a standby (`RingReplace`): the
ids swap and the layout stays."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import Producer

from streamjoin.schemas import control, ring_epochs
from streamjoin.services import metrics
from streamjoin.services.io.kafka import Cluster
from streamjoin.services.coordinator.ring_plan import calibrate, choose_ring_size
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.coordinator.ring")


class RingCoordination:
    def __init__(self, job: JobSettings, cluster: Cluster, out: Producer) -> None:
        self.job, self.cluster, self.out = job, cluster, out
        self.layout: list[str] = []
        self.orders: list[list[int]] = []
        self.epoch = 0
        # When the current layout was made (monotonic s): a node never heard counts from then.
        self.made_at = 0.0
        # Replaces not answered yet, id -> when (monotonic s). A replaced node's silence is old news
        # until the standby adopting it heartbeats as it; a standby id just used is neither alive nor
        # free until the process that gave the node up heartbeats under it.
        self.replaced: dict[str, float] = {}
        self.spent: dict[str, float] = {}
        self.started_at = time.monotonic()
        # The layout was taken from the running ring's head (this coordinator restarted): it
        # follows the head's (a resize it was carrying out ends) until an operator changes it.
        self.following = False

    def on_heartbeat(self, beat: control.Heartbeat, alive: list[str]) -> None:
        from_head = bool(beat.ring_layout) and beat.worker == beat.ring_layout[0]
        if from_head and (not self.layout or self.following and beat.ring_layout != self.layout):
            self._adopt(list(beat.ring_layout))
        elif not self.layout and len(alive) >= self.job.coordinator.expected_workers and self._heard_long_enough():
            self._start(alive)
        if self.layout and beat.worker == self.layout[0] and beat.ring_layout != self.layout:
            self._send()

    def _heard_long_enough(self) -> bool:
        """Whether this coordinator has listened for two heartbeat intervals: a ring already
        running (this coordinator restarted) has a head whose heartbeat names its layout by then."""
        return time.monotonic() - self.started_at >= 2 * self.job.worker.heartbeat_ms / 1000

    def _adopt(self, layout: list[str]) -> None:
        """A restarted coordinator takes the running ring's layout from its head's heartbeat
        rather than sizing a new ring from the workers alive now: a node of that layout that
        died meanwhile is then handed to a standby like any silent node (a new layout would
        leave the head planning a resize through a dead node, and the ring would stop)."""
        if not self.layout:
            self.orders = [list(o) for o in calibrate(self.job, self.cluster).orders]
            self.epoch = 1
        self.layout, self.following = layout, True
        self.made_at = time.monotonic()
        log.info("ring layout taken from its head", layout=self.layout)

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
        self.made_at, self.following = time.monotonic(), False
        log.info("ring layout changed", layout=self.layout, epoch=self.epoch)
        self._send()

    def _start(self, alive: list[str]) -> None:
        measured = calibrate(self.job, self.cluster)
        wanted = self.job.ring.nodes if isinstance(self.job.ring.nodes, int) else choose_ring_size(self.job, measured)
        self.layout = sorted(alive)[:max(1, min(wanted, len(alive)))]
        self.orders = [list(o) for o in measured.orders]
        self.epoch = 1
        self.made_at = time.monotonic()
        log.info("ring sized", nodes=len(self.layout), wanted=wanted, layout=self.layout, orders=self.orders)
        self._send()

    def check_standbys(self, last_seen: dict[str, float], now: float) -> None:
        """Hand each ring node silent longer than `ring.standby_after_ms` to a standby (an alive
        worker outside the layout, smallest id first), if there is one; without one the ring
        waits for the node to restart. Called from the coordinator's loop while it hears
        heartbeats at all (a silence of its own says nothing about the nodes).

        last_seen: each worker's newest heartbeat, monotonic seconds (the coordinator's; not changed).
        now: the current monotonic time, in the same clock.
        """
        if not self.layout:
            return
        self._forget_answered(last_seen)
        for node in self._silent(last_seen, now):
            spares = self._spares(last_seen, now)
            if not spares:
                return  # nobody to hand the rest to either: the ring waits for them to come back
            self._replace(node, spares[0], now)

    def _standby_after_s(self) -> float:
        after_ms = self.job.ring.standby_after_ms
        return (after_ms if after_ms is not None else self.job.coordinator.heartbeat_timeout_ms) / 1000

    def _forget_answered(self, last_seen: dict[str, float]) -> None:
        """Drop the notes of replaces that were answered.

        last_seen: each worker's newest heartbeat. A heartbeat newer than the replace under the
        node's id comes from its adopter (its silence counts again from there); one under the
        standby's id comes from the process that gave the node up, now a standby.
        """
        for notes in (self.replaced, self.spent):
            for worker, at in list(notes.items()):
                if last_seen.get(worker, at) > at:
                    del notes[worker]

    def _silent(self, last_seen: dict[str, float], now: float) -> list[str]:
        """Layout nodes (the head too) silent longer than the standby delay and not handed over yet.

        last_seen: each worker's newest heartbeat; a node never heard counts from `made_at`.
        now: the current monotonic time.
        """
        horizon = now - self._standby_after_s()
        return [n for n in self.layout if n not in self.replaced and last_seen.get(n, self.made_at) < horizon]

    def _spares(self, last_seen: dict[str, float], now: float) -> list[str]:
        """Workers heard within `coordinator.heartbeat_timeout_ms` outside the layout, smallest id first.

        last_seen: each worker's newest heartbeat; a standby id just used counts as stale from its
        replace on (its heartbeats before it came from the process that now plays the node).
        now: the current monotonic time.
        """
        horizon = now - self.job.coordinator.heartbeat_timeout_ms / 1000
        return sorted(w for w, t in last_seen.items()
                      if t >= horizon and w not in self.layout and w not in self.spent)

    def _replace(self, node: str, standby: str, now: float) -> None:
        """Tell the ring that `standby` takes `node`'s place, and note both ids as just replaced.

        node: the silent layout node. standby: the spare taking its id. now: the replace's monotonic time.
        """
        # On the epochs topic, in order with the node starts: every process works out its id from
        # that log (compacted, kept whole), also one that comes back long after.
        msg = ring_epochs.RingReplace(node=node, standby=standby, wall_ms=int(time.time() * 1000))
        self.out.produce(self.job.ring_epochs_topic, value=ring_epochs.encode(msg), key=ring_epochs.replace_key(msg),
                         partition=0)
        self.out.poll(0)
        self.replaced[node] = now
        self.spent[standby] = now
        metrics.RING_REPLACED.inc()
        log.warning("ring node handed to a standby", node=node, standby=standby, layout=self.layout,
                    silent_after_s=self._standby_after_s())

    def _send(self) -> None:
        msg = control.RingLayout(layout=self.layout, orders=self.orders, epoch=self.epoch)
        self.out.produce(self.job.control_topic, value=control.encode(msg), key=b"ring-layout", partition=0)
        self.out.poll(0)
