"""Ring crash recovery on the coordinator's side (services/coordinator/ring.py `check_standbys`):
a ring node silent for `ring.standby_after_ms` is handed to the smallest alive worker outside
the layout with a `RingReplace` on the epochs topic, once per silence; the standby id used is
no spare again until it heartbeats again. The Kafka clients are fakes and reach no broker."""

from __future__ import annotations

from typing import Any

import pytest

from streamjoin.schemas import ring_epochs
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.ring import RingCoordination
from streamjoin.settings import JobSettings, SettingsError, load

T0 = 1000.0  # a monotonic time at which the layout is made


class FakeProducer:
    """Records what is produced; never reaches a broker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes, int]] = []

    def produce(self, topic: str, value: bytes, key: bytes, partition: int) -> None:
        self.sent.append((topic, value, key, partition))

    def poll(self, timeout: float) -> int:
        return 0

    def replaces(self) -> list[tuple[str, str]]:
        """The (node, standby) of each RingReplace produced, in order."""
        decoded = [ring_epochs.decode(value) for _, value, _, _ in self.sent]
        return [(m.node, m.standby) for m in decoded if isinstance(m, ring_epochs.RingReplace)]


def ring_job(**ring: Any) -> JobSettings:
    streams = [{"name": n, "fields": {"x": "int", "ts": "int"}, "time_field": "ts", "window": {"range_ms": 1000}}
               for n in ("r", "s")]
    return load(None, job="rs", bootstrap="127.0.0.1:1", partitions=2, streams=streams,
                join={"mode": "ring", "predicate": [{"left": "r.x", "right": "s.x", "within": 1}]},
                ring={"nodes": 3} | ring, coordinator={"heartbeat_timeout_ms": 5000, "worker_timeout_ms": 30000})


def ring_of(layout: list[str], **ring: Any) -> tuple[RingCoordination, FakeProducer]:
    """A coordinator's ring duties with `layout` made at T0 (standby_after_ms 2000 unless given)."""
    job = ring_job(**({"standby_after_ms": 2000} | ring))
    out = FakeProducer()
    coordination = RingCoordination(job, kafka.Cluster.of(job), out)  # type: ignore[arg-type]
    coordination.layout, coordination.orders, coordination.epoch = list(layout), [[0, 1], [1, 0]], 1
    coordination.made_at = T0
    return coordination, out


def test_no_replace_while_the_nodes_are_fresh() -> None:
    ring, out = ring_of(["a", "b", "c"])
    seen = {"a": T0 + 1, "b": T0 + 1, "c": T0 + 1, "d": T0 + 1}
    ring.check_standbys(seen, T0 + 2.5)
    assert out.sent == []


def test_a_node_silent_past_standby_after_goes_to_the_smallest_spare() -> None:
    ring, out = ring_of(["a", "b", "c"])
    before = metrics.REGISTRY.get_sample_value("streamjoin_ring_replaced_total") or 0.0
    seen = {"a": T0 + 5, "b": T0 + 1, "c": T0 + 5, "f": T0 + 5, "e": T0 + 5, "d": T0 - 2}  # d: silent past 5 s
    ring.check_standbys(seen, T0 + 3.5)  # b silent 2.5 s > 2 s
    assert out.replaces() == [("b", "e")]
    topic, _, key, partition = out.sent[0]
    assert (topic, key[:len(b"replace-b-e-")], partition) == (ring.job.ring_epochs_topic, b"replace-b-e-", 0)
    assert metrics.REGISTRY.get_sample_value("streamjoin_ring_replaced_total") == before + 1
    assert ring.layout == ["a", "b", "c"]  # the ids swap; the layout stays
    assert seen == {"a": T0 + 5, "b": T0 + 1, "c": T0 + 5, "f": T0 + 5, "e": T0 + 5, "d": T0 - 2}  # not mutated


def test_no_replace_without_a_spare() -> None:
    ring, out = ring_of(["a", "b", "c"])
    ring.check_standbys({"a": T0 + 9, "b": T0, "c": T0 + 9}, T0 + 10)
    assert out.sent == []
    ring.check_standbys({"a": T0 + 11, "b": T0, "c": T0 + 11, "d": T0 + 11}, T0 + 12)  # a spare turns up
    assert out.replaces() == [("b", "d")]


def test_a_node_is_not_replaced_again_until_it_heartbeats_after_the_replace() -> None:
    ring, out = ring_of(["a", "b", "c"])
    seen = {"a": T0 + 9, "b": T0, "c": T0 + 9, "d": T0 + 9, "e": T0 + 9}
    ring.check_standbys(seen, T0 + 10)
    assert out.replaces() == [("b", "d")]
    seen |= dict.fromkeys(["a", "c", "e"], T0 + 19)
    ring.check_standbys(seen, T0 + 20)  # b's adopter is still recovering: no second replace
    assert out.replaces() == [("b", "d")]
    seen |= dict.fromkeys(["a", "b", "c", "e"], T0 + 21)  # the adopter heartbeats as b
    ring.check_standbys(seen, T0 + 22)
    assert out.replaces() == [("b", "d")]
    seen |= dict.fromkeys(["a", "c", "e"], T0 + 24)
    ring.check_standbys(seen, T0 + 24)  # b silent again past 2 s, counted from its adopter's beat
    assert out.replaces() == [("b", "d"), ("b", "e")]


def test_a_used_standby_id_is_no_spare_until_it_heartbeats_again() -> None:
    ring, out = ring_of(["a", "b", "c"])
    seen = {"a": T0 + 9, "b": T0, "c": T0 + 9, "d": T0 + 9}
    ring.check_standbys(seen, T0 + 10)
    assert out.replaces() == [("b", "d")]
    seen |= {"b": T0 + 11, "c": T0 + 11, "a": T0 + 8}  # d's last beat is fresh, but from b's adopter now
    ring.check_standbys(seen, T0 + 11)
    assert out.replaces() == [("b", "d")]  # a is silent and d, stale from the replace on, is no spare
    seen["d"] = T0 + 11.5  # the process that played b is back, as d
    ring.check_standbys(seen, T0 + 12)
    assert out.replaces() == [("b", "d"), ("a", "d")]


def test_two_silent_nodes_take_two_spares_in_order() -> None:
    ring, out = ring_of(["a", "b", "c"])
    ring.check_standbys({"a": T0, "b": T0 + 9, "c": T0, "e": T0 + 9, "d": T0 + 9}, T0 + 10)
    assert out.replaces() == [("a", "d"), ("c", "e")]


def test_a_node_that_heartbeats_in_time_is_never_replaced() -> None:
    ring, out = ring_of(["a", "b", "c"])
    seen = dict.fromkeys(["a", "b", "c", "d"], T0)
    for step in range(1, 60):
        now = T0 + step * 0.5
        if step % 3 == 0:  # every 1.5 s, under standby_after_ms
            seen |= dict.fromkeys(["a", "b", "c", "d"], now)
        ring.check_standbys(seen, now)
    assert out.sent == []


def test_the_head_can_be_replaced_too() -> None:
    ring, out = ring_of(["a", "b", "c"])
    ring.check_standbys({"a": T0, "b": T0 + 9, "c": T0 + 9, "z": T0 + 9}, T0 + 10)
    assert out.replaces() == [("a", "z")]


def test_a_node_never_heard_counts_from_when_the_layout_was_made() -> None:
    ring, out = ring_of(["a", "b", "c"])
    seen = {"a": T0 + 1, "c": T0 + 1, "d": T0 + 1}
    ring.check_standbys(seen, T0 + 1.5)
    assert out.sent == []
    ring.check_standbys(seen, T0 + 2.5)
    assert out.replaces() == [("b", "d")]


def test_standby_after_defaults_to_the_heartbeat_timeout() -> None:
    ring, out = ring_of(["a", "b"], standby_after_ms=None)
    assert ring.job.ring.standby_after_ms is None
    seen = {"a": T0 + 9, "b": T0 + 5, "c": T0 + 9}
    ring.check_standbys(seen, T0 + 9.5)  # 4.5 s < heartbeat_timeout_ms (5 s)
    assert out.sent == []
    ring.check_standbys(seen | {"a": T0 + 10, "c": T0 + 10}, T0 + 10.5)
    assert out.replaces() == [("b", "c")]


def test_nothing_happens_before_the_ring_is_sized() -> None:
    ring, out = ring_of([])
    ring.check_standbys({"a": T0, "b": T0 + 9}, T0 + 10)
    assert out.sent == []


@pytest.mark.parametrize("after", [0, -1])
def test_standby_after_must_be_positive(after: int) -> None:
    with pytest.raises(SettingsError):
        ring_job(standby_after_ms=after)


def test_ring_replace_round_trips_through_the_epochs_codec() -> None:
    replace = ring_epochs.RingReplace(node="w1", standby="w4", wall_ms=1234)
    assert ring_epochs.decode(ring_epochs.encode(replace)) == replace
    assert ring_epochs.decode(b'{"type": "ring-replace", "node": "w1"}') is None  # no standby: skipped
    assert ring_epochs.decode(b'{"type": "ring-replace", "node": 1, "standby": []}') is None


@pytest.fixture
def calibrated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost model's join orders without measuring anything (calibrate reads the inputs)."""
    from types import SimpleNamespace

    monkeypatch.setattr("streamjoin.services.coordinator.ring.calibrate",
                        lambda job, cluster: SimpleNamespace(orders=((1,), (0,))))


def test_a_restarted_coordinator_takes_the_running_rings_layout_and_replaces_its_dead_node(calibrated: None) -> None:
    """A coordinator restarted while a ring runs (a resize had grown it to four nodes, one of
    which then died) takes the layout from the head's heartbeat instead of sizing a new ring of
    `ring.nodes` from the workers alive now, hands the dead node to a spare like any silent
    node, and follows the head's layout until an operator changes it."""
    from streamjoin.schemas.control import Heartbeat, RingChange, RingLayout, decode_control

    job = ring_job(standby_after_ms=2000)
    out = FakeProducer()
    ring = RingCoordination(job, kafka.Cluster.of(job), out)  # type: ignore[arg-type]
    alive = ["a", "b", "d", "e", "f"]  # c, a node of the running ring, is dead; e and f are spares
    ring.on_heartbeat(Heartbeat(worker="b", wall_ms=0), alive)  # a node that is not the head: nothing yet
    assert ring.layout == [] and out.sent == []
    ring.on_heartbeat(Heartbeat(worker="a", wall_ms=0, ring_layout=["a", "b", "c", "d"]), alive)
    assert ring.layout == ["a", "b", "c", "d"]
    assert not [v for _, v, _, _ in out.sent if isinstance(decode_control(v), RingLayout)]  # no new layout sent
    ring.made_at = T0
    ring.check_standbys({"a": T0 + 3, "b": T0 + 3, "d": T0 + 3, "e": T0 + 3, "f": T0 + 3}, T0 + 3)
    assert out.replaces() == [("c", "e")]
    ring.on_heartbeat(Heartbeat(worker="a", wall_ms=0, ring_layout=["a", "b", "c"]), alive)  # its resize ended
    assert ring.layout == ["a", "b", "c"]
    ring.on_change(RingChange(action="add", worker="f"))
    ring.on_heartbeat(Heartbeat(worker="a", wall_ms=0, ring_layout=["a", "b", "c"]), alive)
    assert ring.layout == ["a", "b", "c", "f"]  # the operator's layout stands: sent again, not followed


def test_a_first_start_waits_two_heartbeats_for_a_running_head(calibrated: None) -> None:
    job = ring_job()
    ring = RingCoordination(job, kafka.Cluster.of(job), FakeProducer())  # type: ignore[arg-type]
    from streamjoin.schemas.control import Heartbeat

    ring.on_heartbeat(Heartbeat(worker="a", wall_ms=0), ["a", "b", "c"])
    assert ring.layout == []  # it has just started: a running ring's head may not have been heard yet
    ring.started_at -= 2 * job.worker.heartbeat_ms / 1000
    ring.on_heartbeat(Heartbeat(worker="a", wall_ms=0), ["a", "b", "c"])
    assert ring.layout == ["a", "b", "c"]
