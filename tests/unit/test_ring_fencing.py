"""Ring epochs without a broker: hop records carry their sender's incarnation, the control
messages that announce and fail a ring round-trip, and a node rejects hop records of
another incarnation than the ring started with (and then stops producing results)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import KafkaError

from streamjoin.engine.psp.messages import End, RoundInfo
from streamjoin.schemas import control, ring as wire
from streamjoin.services import kafka
from streamjoin.services.worker.output import flush
from streamjoin.services.worker.ring import RingWorker
from streamjoin.settings import load


def _info() -> RoundInfo:
    return RoundInfo(3, ("w0", "w1"), {"w0": (1.0,), "w1": (2.0,)}, 0, (0,), 10, 3, ((),), 0)


def test_hop_records_carry_the_sender_epoch() -> None:
    value, headers = wire.encode(End(_info(), 1), "w0:abc")
    assert wire.epoch_of(headers) == ("w0", "abc")
    assert wire.decode(value, headers) == End(_info(), 1)
    assert wire.epoch_of([("sj-kind", b"end")]) == ("", "")  # a record from before epochs


def test_ring_start_and_failed_round_trip() -> None:
    start = control.RingStart(worker="w1", incarnation="abc")
    failed = control.RingFailed(worker="w1", reason="node-restarted", detail="x", wall_ms=5)
    assert control.decode_control(control.encode(start)) == start
    assert control.decode_control(control.encode(failed)) == failed
    assert control.Heartbeat(worker="w0", wall_ms=0).ring_failed == ""


def test_a_hop_record_of_another_incarnation_fails_the_ring(tmp_path: Path) -> None:
    job = load(Path("streamjoin/jobs/band3.yaml"), bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    w = RingWorker(job, kafka.Cluster("127.0.0.1:1"), "w0", metrics_port=0)
    w.incarnations = {"w0": w.incarnation, "w1": "first"}
    assert w._current("w1", "first")
    assert w._current("w2", "unknown-yet")  # its RingStart not read yet: not judged
    assert not w.failed
    assert not w._current("w1", "second")
    assert w.failed == "stale-epoch"
    assert not w._current("w1", "first")  # a failed ring takes nothing more


def test_a_failed_delivery_fails_the_ring(tmp_path: Path) -> None:
    """A delivery report with an error makes the next checked flush raise: the ring fails
    (reason delivery) instead of going on with a hole in its output."""
    job = load(Path("streamjoin/jobs/band3.yaml"), bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    w = RingWorker(job, kafka.Cluster("127.0.0.1:1"), "w0", metrics_port=0)
    w.deliveries.errors.append(KafkaError(KafkaError._MSG_TIMED_OUT))
    w._guarded(flush, w.out, w.deliveries)
    assert w.failed == "delivery"


def test_a_forwarded_message_goes_on_as_the_bytes_received(tmp_path: Path) -> None:
    """A Probe or Partial a node passes on unchanged is produced from the record it arrived
    in (no re-encoding), restamped with the forwarding node's epoch; anything else is encoded."""
    job = load(Path("streamjoin/jobs/band3.yaml"), bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    w = RingWorker(job, kafka.Cluster("127.0.0.1:1"), "w1", metrics_port=0)
    sent: list[tuple[bytes, list]] = []
    w.out = type("Capture", (), {"produce": lambda self, topic, value, headers, **kw: sent.append((value, headers))})()
    passing = End(_info(), 1)
    value, headers = wire.encode(passing, "w0:first")
    marked = value + b"as-received"  # not what encoding gives: shows which path produced it
    w.passing = (passing, wire.Record(marked, headers))
    w._produce("w2", passing)
    w._produce("w2", End(_info(), 2))
    assert sent[0][0] == marked and wire.epoch_of(sent[0][1]) == ("w1", w.incarnation)
    assert [k for k, _ in sent[0][1]].count("sj-epoch") == 1
    assert wire.decode(*sent[1]) == End(_info(), 2) and wire.epoch_of(sent[1][1]) == ("w1", w.incarnation)
