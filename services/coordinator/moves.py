"""Moving partition groups between workers: the spill paper's migration protocol on
Kafka, as the coordinator runs it. Pure: the coordinator (main.py) feeds it
requests and heartbeats, stores the placement records it returns before it
acts on them, and sends each worker `wanted(worker)` whenever that worker's
heartbeat shows something else.

A move of group g from A to B, each step durable or level-triggered:
  1. the placement record {g: B, epoch e, moving_from: A} is stored;
  2. A is told its groups without g: it joins what it has fetched in one
     last transaction (results, changelog, offsets: the barrier is that
     batch's input boundary; the input log holds everything after it), then
     stops fetching g;
  3. A's first heartbeat at epoch e or later without g releases it (A dead
     for `worker_timeout_ms` releases it too: its last committed state is in
     the changelog), and {g: B, epoch e} is stored;
  4. B is told its groups with g: it rebuilds g from the changelog, replays
     any batch decided after the newest checkpoint, and resumes at the barrier;
  5. B's first heartbeat holding g ends the move (its pause is measured).
A coordinator restarted at any step reads the placement back and carries on
from it; a sender or receiver restarted at any step converges through the
same messages. Failover is a move whose sender is dead from the start: the
receiver is told to fence the dead worker's transactional id before it
recovers the group, so a worker that was only paused (a zombie) can commit
nothing more once its group has moved on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamjoin.schemas.control import Heartbeat, Placement


@dataclass(frozen=True)
class Finished:
    """A move that ended: the receiver holds the group."""

    group: int
    sender: str
    receiver: str
    pause_s: float  # from the move's start to the receiver's heartbeat holding the group
    state_bytes: int  # the group's window bytes as the sender last reported them


@dataclass
class Moves:
    """The placement and the moves in flight. `owners`: group -> the worker it is placed on
    (during a move, the receiver); `moving`: group -> its sender, while it has not released
    it; `arriving`: groups released and not yet held by their receiver; `started`: when each
    move in flight began (a group failed over again on its way keeps its first start)."""

    owners: dict[int, str]
    moving: dict[int, str]
    epoch: int
    drained: set[str] = field(default_factory=set)
    senders: dict[int, str] = field(default_factory=dict)  # group -> where its move began, until it ends
    move_epochs: dict[int, int] = field(default_factory=dict)  # group -> the epoch its move began at
    started: dict[int, float] = field(default_factory=dict)
    arriving: set[int] = field(default_factory=set)
    # arriving group -> the dead workers that may hold an open transaction on it
    fenced_from: dict[int, set[str]] = field(default_factory=dict)
    # group -> its window bytes as its holder last reported them (a move's bytes are the sender's
    # last report before it let go: its release heartbeat no longer lists the group)
    sizes: dict[int, int] = field(default_factory=dict)

    def wanted(self, worker: str) -> list[int]:
        """The groups `worker` should hold now: those placed on it that are not still on their way."""
        return sorted(g for g, w in self.owners.items() if w == worker and g not in self.moving)

    def to_fence(self, worker: str) -> list[str]:
        """Dead workers whose transactions `worker` must fence before recovering groups it is
        given: those that held them last and did not release them."""
        return sorted(set().union(*(self.fenced_from.get(g, set()) for g in self.wanted(worker))))

    def needs_assignment(self, beat: Heartbeat) -> bool:
        """Whether the worker that sent `beat` should be told its groups: it holds others, or it
        is the sender of a move newer than its epoch (holding the right groups already, it must
        still confirm the move's epoch, or the receiver would wait for good)."""
        if beat.groups != self.wanted(beat.worker):
            return True
        return any(sender == beat.worker and beat.epoch < self.epoch_of(g) for g, sender in self.moving.items())

    def move(self, group: int, to: str, alive: list[str], now: float) -> list[Placement] | str:
        """Start moving `group` to `to`; the records to store, or why not."""
        if group not in self.owners:
            return f"group {group} is not placed (the job has groups 0..{len(self.owners) - 1})"
        if to not in alive:
            return f"worker {to} is not alive"
        if to in self.drained:
            return f"worker {to} is drained"
        if group in self.moving or group in self.arriving:
            return f"group {group} is moving already"
        if self.owners[group] == to:
            return f"group {group} is on {to} already"
        return self._start({group: to}, now)

    def drain(self, worker: str, alive: list[str], now: float) -> list[Placement] | str:
        """Move every group off `worker`, each to the live worker holding fewest, and place none on it."""
        receivers = [w for w in alive if w != worker and w not in self.drained]
        if not receivers:
            return f"no live worker besides {worker} to take its groups"
        self.drained.add(worker)
        mine = [g for g, w in sorted(self.owners.items()) if w == worker and g not in self.moving]
        return self._start(self._spread(mine, receivers), now)

    def fail_over(self, dead: list[str], alive: list[str], now: float) -> list[Placement]:
        """Give the groups placed on `dead` workers to live ones (fewest groups first); a drained
        worker takes them only when no other is alive (a stopped job is worse than an undone drain)."""
        live = [w for w in alive if w not in dead]
        receivers = [w for w in live if w not in self.drained] or live
        orphans = [g for g, w in sorted(self.owners.items()) if w in dead and g not in self.moving]
        if not receivers or not orphans:
            return []
        records = self._start(self._spread(orphans, receivers), now)
        for g in orphans:  # nobody to release them: they are on their way at once
            self.fenced_from.setdefault(g, set()).add(self.moving.pop(g))
            self.arriving.add(g)
        return [r.model_copy(update={"moving_from": None, "dead_owners": sorted(self.fenced_from[r.group])})
                for r in records]

    def on_heartbeat(self, beat: Heartbeat, dead: list[str], now: float) -> tuple[list[Placement], list[Finished]]:
        """The records to store (releases this heartbeat or a sender's death completes, and the
        end of failovers, whose records no longer name the dead owner) and the moves its groups end."""
        for g, size in beat.group_bytes.items():
            if g in self.owners and g not in self.arriving:  # not a receiver's report of a group still restoring
                self.sizes[g] = size
        released = [g for g, sender in sorted(self.moving.items())
                    if sender in dead or (sender == beat.worker and beat.epoch >= self.epoch_of(g)
                                          and g not in beat.groups)]
        records = []
        for g in released:
            sender = self.moving.pop(g)
            if sender in dead:
                self.fenced_from.setdefault(g, set()).add(sender)
            self.arriving.add(g)
            records.append(Placement(group=g, worker=self.owners[g], epoch=self.epoch,
                                     dead_owners=sorted(self.fenced_from.get(g, ()))))
        finished = []
        for g in [g for g in sorted(self.arriving) if self.owners[g] == beat.worker and g in beat.groups]:
            self.arriving.discard(g)
            start = self.started.pop(g, now)
            if self.fenced_from.pop(g, None):
                records.append(Placement(group=g, worker=beat.worker, epoch=self.epoch))
            finished.append(Finished(g, self.senders.pop(g, ""), beat.worker, now - start, self.sizes.get(g, 0)))
        return records, finished

    def epoch_of(self, group: int) -> int:
        """The epoch `group`'s move began at: the sender's release must be at least that new."""
        return self.move_epochs.get(group, self.epoch)

    @classmethod
    def loaded(cls, records: dict[int, Placement], now: float) -> "Moves":
        """The state the stored placement records describe (a restarted coordinator's)."""
        moves = cls({g: r.worker for g, r in records.items()},
                    {g: r.moving_from for g, r in records.items() if r.moving_from},
                    max((r.epoch for r in records.values()), default=0))
        for g, sender in moves.moving.items():
            moves.senders[g], moves.move_epochs[g], moves.started[g] = sender, records[g].epoch, now
        for g, r in records.items():
            if r.dead_owners:  # not held since a failover: its next receiver still fences
                moves.fenced_from[g] = set(r.dead_owners)
            if r.dead_owners and not r.moving_from:
                moves.senders[g], moves.started[g] = r.dead_owners[0], now
                moves.arriving.add(g)
        return moves

    def _spread(self, groups: list[int], receivers: list[str]) -> dict[int, str]:
        """Each of `groups` to the receiver placed with the fewest groups, counting the earlier ones."""
        load = {w: sum(1 for o in self.owners.values() if o == w) for w in receivers}
        out = {}
        for g in groups:
            target = min(sorted(load), key=lambda w: load[w])
            out[g] = target
            load[target] += 1
        return out

    def _start(self, targets: dict[int, str], now: float) -> list[Placement]:
        """Begin moving each group to its target at a new epoch; the records to store first."""
        if not targets:
            return []
        self.epoch += 1
        records = []
        for g, to in sorted(targets.items()):
            sender = self.owners[g]
            self.owners[g], self.moving[g] = to, sender
            self.senders[g], self.move_epochs[g] = sender, self.epoch
            self.started.setdefault(g, now)
            records.append(Placement(group=g, worker=to, epoch=self.epoch, moving_from=sender,
                                     dead_owners=sorted(self.fenced_from.get(g, ()))))
        return records
