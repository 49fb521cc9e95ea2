"""Ring epochs without a broker: hop records carry the epoch their sender is in, the records
of the epochs topic round-trip (and anything else decodes to None), a node applies them in
order (epoch, checkpoint, id hand-over, its own start rolls it back) and drops hop records of
an older epoch; a failed delivery fails the ring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from confluent_kafka import KafkaError
from hypothesis import given, settings, strategies as st

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.psp.messages import End, RoundInfo
from streamjoin.schemas import control, ring as wire, ring_epochs
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.services.io.deliveries import flush
from streamjoin.services.ring.node import RingWorker
from streamjoin.settings import load
from tests.profiles import examples


def _info() -> RoundInfo:
    return RoundInfo(3, ("w0", "w1"), {"w0": (1.0,), "w1": (2.0,)}, 0, (0,), 10, 3, ((),), 0)


def test_hop_records_carry_the_sender_epoch() -> None:
    value, headers = wire.encode(End(_info(), 1), 7)
    assert wire.epoch_of(headers) == 7
    assert wire.decode(value, headers) == End(_info(), 1)
    assert wire.epoch_of([("sj-kind", b"end")]) == -1  # a record without an epoch
    assert wire.epoch_of([("sj-epoch", b"w0:abc")]) == -1  # nor one from before epochs were numbers


def test_a_mark_round_trips() -> None:
    mark = wire.Mark(12, ("w0", "w1"), {"w0": [[[1, 5]], []]})
    assert wire.decode(*wire.encode(mark, 3)) == mark


def _checkpoint(epoch: int, next_round: int) -> ring_epochs.RingCheckpoint:
    at = ring_epochs.LogMark(next_round=next_round, counts=[4, 2, 0], log_end=next_round)
    return ring_epochs.RingCheckpoint(epoch=epoch, at=at, start=at, ranges={"w0": [[[1, 5]], [[1, 3]], []]},
                                      head={"x": 1}, results_end={0: 3})


def test_epoch_records_round_trip_and_anything_else_is_none() -> None:
    start = ring_epochs.RingStart(worker="w1", incarnation="abc", checkpoint=_checkpoint(4, 9))
    replace = ring_epochs.RingReplace(node="w1", standby="w3", wall_ms=5)
    for record in (start, _checkpoint(4, 9), replace):
        assert ring_epochs.decode(ring_epochs.encode(record)) == record
    for junk in (b"", b"\xff", b"[]", b'{"type": "ring-start"}', b'{"type": "ring-checkpoint", "epoch": "x"}', None):
        assert ring_epochs.decode(junk) is None
    failed = control.RingFailed(worker="w1", reason="node-restarted", detail="x", wall_ms=5)
    assert control.decode_control(control.encode(failed)) == failed


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=80) | st.builds(lambda kind, body: json.dumps({"type": kind} | body).encode(),
                                          st.sampled_from(["ring-start", "ring-checkpoint", "ring-replace", "x"]),
                                          st.dictionaries(st.sampled_from(["worker", "incarnation", "checkpoint",
                                                                           "epoch", "node", "standby", "at"]),
                                                          st.none() | st.integers() | st.text(max_size=4), max_size=4)))
def test_the_epochs_decoder_never_raises(value: bytes) -> None:
    record = ring_epochs.decode(value)
    assert record is None or isinstance(record, (ring_epochs.RingStart, ring_epochs.RingCheckpoint,
                                                 ring_epochs.RingReplace))


def _worker(tmp_path: Path, worker_id: str = "w0") -> RingWorker:
    job = load(Path("streamjoin/jobs/band3.yaml"), bootstrap="127.0.0.1:1",
               worker={"state_dir": str(tmp_path / "state")})
    return RingWorker(job, kafka.Cluster("127.0.0.1:1"), worker_id, metrics_port=0)


def test_a_node_applies_the_epochs_topic_in_order(tmp_path: Path, monkeypatch) -> None:
    w = _worker(tmp_path)
    rollbacks: list[int] = []
    monkeypatch.setattr(w, "_rollback", lambda start: rollbacks.append(w.epoch))
    w._apply(0, ring_epochs.RingStart(worker="w1", incarnation="a"))
    assert (w.epoch, w.live, rollbacks) == (0, False, [])  # before its own start: only noted
    w._apply(1, ring_epochs.RingStart(worker="w0", incarnation=w.incarnation))
    assert (w.epoch, w.live, rollbacks) == (1, True, [1])  # its own start: it is in, and rolls back
    w.written = np.array([b"0" * 32], "S32")
    w._apply(2, _checkpoint(0, 5))  # written in an older epoch: ignored
    assert w.checkpoint is None and len(w.written) == 1
    w._apply(3, _checkpoint(1, 6))
    assert w.checkpoint.at.next_round == 6 and len(w.written) == 0
    w._apply(4, ring_epochs.RingStart(worker="w2", incarnation="b", checkpoint=_checkpoint(1, 6)))
    assert (w.epoch, rollbacks) == (4, [1, 4]) and w.checkpoint.at.next_round == 6
    w._apply(5, ring_epochs.RingReplace(node="w0", standby="w9"))
    assert (w.id, w.reincarnate) == ("w9", True)  # handed over: it starts again as the standby


def test_a_standby_takes_the_id_it_is_handed() -> None:
    replace = ring_epochs.RingReplace(node="w1", standby="w3")
    assert [ring_epochs.play(r, replace) for r in ("w1", "w3", "w0")] == ["w3", "w1", "w0"]


def _hop_record(value: bytes, headers: list) -> LocalRecord:
    return LocalRecord("band3.ring.w0", 0, 0, None, value, 0, headers)


def test_a_hop_record_of_an_older_epoch_is_dropped(tmp_path: Path, monkeypatch) -> None:
    w = _worker(tmp_path)
    w.epoch = 5
    handled: list = []
    monkeypatch.setattr(w, "_handle", lambda msg, record=None: handled.append(msg))
    before = metrics.REGISTRY.get_sample_value("streamjoin_ring_stale_messages_total") or 0.0
    w._on_hop_record(_hop_record(*wire.encode(End(_info(), 1), 4)))
    assert handled == []
    assert metrics.REGISTRY.get_sample_value("streamjoin_ring_stale_messages_total") == before + 1
    w._on_hop_record(_hop_record(*wire.encode(End(_info(), 1), 5)))
    assert handled == [End(_info(), 1)]


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
    w.epoch = 8
    value, headers = wire.encode(passing, 7)
    marked = value + b"as-received"  # not what encoding gives: shows which path produced it
    w.passing = (passing, wire.Record(marked, headers))
    w._produce("w2", passing)
    w._produce("w2", End(_info(), 2))
    assert sent[0][0] == marked and wire.epoch_of(sent[0][1]) == 8
    assert [k for k, _ in sent[0][1]].count("sj-epoch") == 1
    assert wire.decode(*sent[1]) == End(_info(), 2) and wire.epoch_of(sent[1][1]) == 8


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=60), st.lists(st.tuples(st.sampled_from(["sj-kind", "sj-round", "sj-info", "sj-mark",
                                                                   "sj-stream", "sj-lap", "sj-members"]),
                                                  st.sampled_from([b"probe", b"end", b"mark", b"build", b"partial",
                                                                   b"1", b"{}", b"[]", b"x", b'{"layout":1}'])),
                                        max_size=6))
def test_a_hostile_hop_record_decodes_or_raises_a_decode_error(value: bytes, headers: list) -> None:
    try:
        wire.decode(value, headers)
    except wire.DECODE_ERRORS:
        pass  # the worker counts it and drops it
