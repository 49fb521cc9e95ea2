"""The migration protocol as the coordinator runs it (services/coordinator/moves.py):
each step by hand, and a Hypothesis state machine of workers, operators, deaths,
restarts and coordinator restarts in which no two workers ever hold one group and,
once things settle, every group is held by exactly one live worker."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streamjoin.schemas.control import Heartbeat, Placement, decode_control
from streamjoin.services.coordinator.moves import Moves
from tests.profiles import examples


def _beat(worker: str, groups: list[int], epoch: int, sizes: dict[int, int] | None = None) -> Heartbeat:
    return Heartbeat(worker=worker, wall_ms=0, groups=groups, epoch=epoch, group_bytes=sizes or {})


def test_a_move_waits_for_the_senders_release_then_for_the_receiver() -> None:
    moves = Moves({0: "a", 1: "a", 2: "b"}, {}, epoch=1)
    started = moves.move(1, "b", ["a", "b"], now=10.0)
    assert started == [Placement(group=1, worker="b", epoch=2, moving_from="a")]
    assert moves.wanted("a") == [0] and moves.wanted("b") == [2]  # nobody holds 1 while it is on its way
    # A heartbeat from before the sender applied the new assignment releases nothing, even without the group.
    assert moves.on_heartbeat(_beat("a", [0], epoch=1), [], 11.0) == ([], [])
    released, _ = moves.on_heartbeat(_beat("a", [0, 1], epoch=1, sizes={1: 5000}), [], 11.5)
    assert released == [] and moves.wanted("b") == [2]
    released, finished = moves.on_heartbeat(_beat("a", [0], epoch=2), [], 12.0)
    assert released == [Placement(group=1, worker="b", epoch=2)] and finished == []
    assert moves.wanted("b") == [1, 2]
    _, finished = moves.on_heartbeat(_beat("b", [1, 2], epoch=2), [], 13.5)
    assert [(f.group, f.sender, f.receiver, f.pause_s, f.state_bytes) for f in finished] == [(1, "a", "b", 3.5, 5000)]
    assert not moves.moving and not moves.arriving


def test_a_moves_bytes_are_the_senders_last_report_from_before_it_started() -> None:
    """The sender's release heartbeat no longer lists the group, and the receiver's first one
    reports what it restored: the bytes moved are what the sender last reported holding."""
    moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    moves.on_heartbeat(_beat("a", [0], epoch=1, sizes={0: 7000}), [], 1.0)
    moves.move(0, "b", ["a", "b"], now=2.0)
    moves.on_heartbeat(_beat("a", [], epoch=2), [], 3.0)
    _, finished = moves.on_heartbeat(_beat("b", [0, 1], epoch=2, sizes={0: 99, 1: 10}), [], 4.0)
    assert [(f.group, f.state_bytes) for f in finished] == [(0, 7000)]


def test_requests_that_cannot_start_say_why() -> None:
    moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    assert "not placed" in moves.move(7, "b", ["a", "b"], 0.0)
    assert "not alive" in moves.move(0, "c", ["a", "b"], 0.0)
    assert "already" in moves.move(0, "a", ["a", "b"], 0.0)
    assert isinstance(moves.move(0, "b", ["a", "b"], 0.0), list)
    assert "moving already" in moves.move(0, "a", ["a", "b"], 0.0)
    assert "no live worker" in Moves({0: "a"}, {}, 1).drain("a", ["a"], 0.0)
    assert moves.epoch == 2  # refusals change nothing


def test_drain_spreads_the_groups_and_places_none_on_the_drained_worker_again() -> None:
    moves = Moves({g: "a" for g in range(6)} | {6: "b"}, {}, epoch=1)
    records = moves.drain("a", ["a", "b", "c"], 0.0)
    assert sorted(r.group for r in records) == list(range(6)) and {r.moving_from for r in records} == {"a"}
    held = [w for w in moves.owners.values()]
    assert held.count("b") + held.count("c") == 7 and abs(held.count("b") - held.count("c")) <= 1
    assert "drained" in moves.move(6, "a", ["a", "b", "c"], 0.0)


def test_a_dead_workers_groups_fail_over_and_a_dead_sender_releases() -> None:
    moves = Moves({0: "a", 1: "a", 2: "b", 3: "c"}, {}, epoch=1)
    moves.move(3, "b", ["a", "b", "c"], 0.0)
    released, _ = moves.on_heartbeat(_beat("b", [2], epoch=2), dead=["c"], now=5.0)
    assert released == [Placement(group=3, worker="b", epoch=2, dead_owners=["c"])]
    records = moves.fail_over(["a"], ["b", "c"], now=6.0)
    assert sorted(r.group for r in records) == [0, 1]
    assert all(r.moving_from is None and r.dead_owners == ["a"] for r in records)
    assert moves.epoch == 3 and set(moves.owners.values()) <= {"b", "c"}
    for w in ("b", "c"):
        assert set(moves.wanted(w)) == {g for g, o in moves.owners.items() if o == w}
    # Receivers fence whoever held their new groups last without releasing them, until they hold them.
    came_from = set().union(*(moves.fenced_from.get(g, set()) for g in moves.wanted("b")))
    assert moves.to_fence("b") == sorted({"c"} | ({"a"} & came_from))
    taker = moves.owners[0]
    assert "a" in moves.to_fence(taker)
    settled, _ = moves.on_heartbeat(_beat(taker, moves.wanted(taker), epoch=3), [], 7.0)
    assert moves.to_fence(taker) == [] and not set(moves.fenced_from) & set(moves.wanted(taker))
    # Held now: the stored records stop naming the dead owner (a restarted coordinator fences no more).
    assert settled and all(not r.dead_owners and r.worker == taker for r in settled)


def test_a_coordinator_restarted_mid_failover_still_has_the_receiver_fence() -> None:
    moves = Moves({0: "a", 1: "b"}, {}, epoch=1)
    stored = {0: Placement(group=0, worker="a", epoch=1), 1: Placement(group=1, worker="b", epoch=1)}
    stored.update({r.group: r for r in moves.fail_over(["a"], ["b"], now=1.0)})
    restarted = Moves.loaded(stored, now=2.0)
    assert restarted.wanted("b") == [0, 1] and restarted.to_fence("b") == ["a"]
    records, finished = restarted.on_heartbeat(_beat("b", [0, 1], epoch=2), [], 3.0)
    assert [f.group for f in finished] == [0] and records == [Placement(group=0, worker="b", epoch=2)]


def test_a_restarted_coordinator_carries_on_from_the_stored_records() -> None:
    records = {0: Placement(group=0, worker="b", epoch=4, moving_from="a"), 1: Placement(group=1, worker="a", epoch=3)}
    moves = Moves.loaded(records, now=0.0)
    assert moves.epoch == 4 and moves.moving == {0: "a"} and moves.wanted("b") == []
    assert moves.on_heartbeat(_beat("a", [1], epoch=3), [], 1.0)[0] == []  # not yet at the move's epoch
    assert moves.on_heartbeat(_beat("a", [1], epoch=4), [], 2.0)[0] == [Placement(group=0, worker="b", epoch=4)]


WORKERS = ("w0", "w1", "w2")
GROUPS = 6


class Cluster(RuleBasedStateMachine):
    """Workers apply the newest assignment sent to them (never an older one), beat with what
    they hold, die (holding nothing from then on) and come back empty; the coordinator stores
    every record it returns, and restarts from them."""

    @initialize()
    def start(self) -> None:
        self.moves = Moves({g: WORKERS[g % 3] for g in range(GROUPS)}, {}, epoch=1)
        self.stored: dict[int, Placement] = {g: Placement(group=g, worker=w, epoch=1)
                                              for g, w in self.moves.owners.items()}
        self.holding: dict[str, set[int]] = {w: set() for w in WORKERS}
        self.epochs = dict.fromkeys(WORKERS, 0)
        self.inbox: dict[str, tuple[list[int], int, list[str]] | None] = dict.fromkeys(WORKERS)
        self.unreleased: dict[int, str] = {}  # group -> the worker that died holding it
        self.alive = set(WORKERS)
        self.now = 0.0

    def _store(self, records: list[Placement]) -> None:
        self.stored.update({r.group: r for r in records})

    def _dead(self) -> list[str]:
        return sorted(set(WORKERS) - self.alive)

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        if worker not in self.alive:
            return
        self.now += 1
        beat = _beat(worker, sorted(self.holding[worker]), self.epochs[worker])
        released, _ = self.moves.on_heartbeat(beat, self._dead(), self.now)
        self._store(released)
        if self.moves.needs_assignment(beat):
            self.inbox[worker] = (self.moves.wanted(worker), self.moves.epoch, self.moves.to_fence(worker))

    @rule(worker=st.sampled_from(WORKERS))
    def apply_assignment(self, worker: str) -> None:
        message = self.inbox[worker]
        if worker in self.alive and message is not None and message[1] >= self.epochs[worker]:
            groups, epoch, fence = message
            for g in set(groups) - self.holding[worker]:
                # A group whose last holder died holding it: that worker's open transaction
                # is fenced first, however often the coordinator restarted since.
                dead_holder = self.unreleased.pop(g, worker)
                assert dead_holder == worker or dead_holder in fence, (g, dead_holder, fence)
            self.holding[worker], self.epochs[worker] = set(groups), epoch
            self.inbox[worker] = None

    @rule(group=st.integers(0, GROUPS - 1), to=st.sampled_from(WORKERS))
    def move(self, group: int, to: str) -> None:
        outcome = self.moves.move(group, to, sorted(self.alive), self.now)
        if isinstance(outcome, list):
            self._store(outcome)

    @precondition(lambda self: len(self.alive) > 1)
    @rule(worker=st.sampled_from(WORKERS))
    def drain(self, worker: str) -> None:
        outcome = self.moves.drain(worker, sorted(self.alive), self.now)
        if isinstance(outcome, list):
            self._store(outcome)

    @precondition(lambda self: len(self.alive) > 1)
    @rule(worker=st.sampled_from(WORKERS))
    def die(self, worker: str) -> None:
        self.alive.discard(worker)
        self.unreleased.update(dict.fromkeys(self.holding[worker], worker))
        self.holding[worker], self.inbox[worker] = set(), None

    @rule(worker=st.sampled_from(WORKERS))
    def fail_over(self, worker: str) -> None:
        self._store(self.moves.fail_over(self._dead(), sorted(self.alive), self.now))

    @rule(worker=st.sampled_from(WORKERS))
    def come_back(self, worker: str) -> None:
        if worker not in self.alive:
            self.alive.add(worker)
            self.epochs[worker] = 0
            # Its producer starts with the same transactional id, which aborts its old open transaction.
            self.unreleased = {g: w for g, w in self.unreleased.items() if w != worker}

    @rule()
    def restart_coordinator(self) -> None:
        drained = self.moves.drained  # kept in memory only: a restarted coordinator forgets it
        self.moves = Moves.loaded(dict(self.stored), self.now)
        assert set(self.moves.owners) == set(range(GROUPS)) and drained is not None

    @invariant()
    def no_group_is_held_twice(self) -> None:
        held = [g for w in WORKERS for g in self.holding[w]]
        assert len(held) == len(set(held)), self.holding

    def teardown(self) -> None:
        """Settle as the coordinator's loop does (fail over the dead, take heartbeats) while the
        workers apply what they are sent; then every group is held once."""
        if not hasattr(self, "moves"):
            return
        for _ in range(6):
            self._store(self.moves.fail_over(self._dead(), sorted(self.alive), self.now))
            for w in WORKERS:
                self.heartbeat(w)
                self.apply_assignment(w)
            self.no_group_is_held_twice()
        held = sorted(g for w in self.alive for g in self.holding[w])
        assert held == list(range(GROUPS)), (self.holding, self.moves)


TestCluster = Cluster.TestCase
TestCluster.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)
_kinds = st.sampled_from(["move-group", "drain-worker", "heartbeat", "assignment", "ring-change", "nope"])


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.binary(max_size=64),
                 st.builds(lambda kind, body: json.dumps({"type": kind} | body).encode(), _kinds,
                           st.dictionaries(st.sampled_from(["group", "to", "worker", "groups", "epoch", "wall_ms"]),
                                           _json, max_size=4))))
def test_control_messages_decode_or_are_skipped_never_raise(value: bytes) -> None:
    """Anyone can write to the control topic: whatever its bytes, a value decodes to one of the
    messages or to None (skipped), so a bad request cannot stop the coordinator or a worker."""
    decoded = decode_control(value)
    assert decoded is None or decoded.type == json.loads(value)["type"]
