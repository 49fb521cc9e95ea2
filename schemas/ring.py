"""Ring messages as Kafka records on the hop topics `<job>.ring.<node>`.

One record per message; the value holds Arrow IPC blocks (a Probe holds one
per stream, each prefixed by its length), the headers say what it is:
  sj-kind     build | probe | partial | end
  sj-round    round number
  sj-stream   build: the stream of its tuples
  sj-info     probe, end: the round's RoundInfo as JSON (layout, bounds, ...)
  sj-lap      end: which lap around the ring
  sj-origin, sj-trigger, sj-members   partial: who made it, the trigger stream,
              the streams joined so far (comma list, in probe order)
  sj-epoch    every kind: the ring epoch the sender is in (schemas/ring_epochs.RingStart):
              a receiver drops a record of an older epoch and catches up on a newer one
  sj-mark     mark: JSON {"layout": [...], "ranges": {node: per stream [[lo, hi], ...]}}, a
              checkpoint collecting every node's slice ranges on its way round the ring

The round log `<job>.ring-rounds` holds the head's Probes in the same form, with
`sj-epoch` and `sj-head` (the head's state after the round, JSON) added.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import numpy as np

from streamjoin.engine.psp.messages import Build, End, Message, Partial, Probe, RoundInfo
from streamjoin.engine.psp.recovery import LoggedRound
from streamjoin.schemas.codecs import decode_block, encode_block

Headers = list[tuple[str, bytes]]
# What decoding a record no ring node wrote may raise (pyarrow's ArrowInvalid is a ValueError):
# callers catch these, count the record and drop it.
DECODE_ERRORS = (KeyError, ValueError, TypeError, AttributeError, IndexError, UnicodeDecodeError)


class Record(NamedTuple):
    """A hop record as received: what a node forwards unchanged is sent on as these bytes."""

    value: bytes | None
    headers: Headers | None


def _info_json(info: RoundInfo) -> bytes:
    return json.dumps(asdict(info), separators=(",", ":")).encode()


def _info(raw: str) -> RoundInfo:
    d = json.loads(raw)
    return RoundInfo(d["round"], tuple(d["layout"]), {k: tuple(v) for k, v in d["bounds"].items()}, d["low_ts"],
                     tuple(d["count_before"]), d["watermark"], d["done_below"],
                     tuple(tuple(o) for o in d["orders"]), d["released_ms"], d["cap"], d["handoff"])


def _pack(blocks: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(8, "big") + b for b in blocks)


def _unpack(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = int.from_bytes(data[i:i + 8], "big")
        out.append(data[i + 8:i + 8 + n])
        i += 8 + n
    return out


@dataclass(frozen=True)
class Mark:
    """A checkpoint on its way round the ring: sent by the head when no round is in flight,
    ahead of round `round`; every node adds its slice ranges for that round and passes it on."""

    round: int
    layout: tuple[str, ...]
    ranges: dict[str, list] = field(default_factory=dict)


HopMessage = Message | Mark


def encode(msg: HopMessage, epoch: int) -> tuple[bytes, Headers]:
    """`msg` as a hop record; `epoch`: the ring epoch the sender is in."""
    value, headers = _encode(msg)
    return value, headers + [("sj-epoch", str(epoch).encode())]


def restamp(headers: Headers | None, epoch: int) -> Headers:
    """A received record's headers with the forwarding node's `epoch` in place of the sender's."""
    return [(k, v) for k, v in headers or [] if k != "sj-epoch"] + [("sj-epoch", str(epoch).encode())]


def epoch_of(headers: Headers | None) -> int:
    """The ring epoch a hop record was sent in; -1 for one without a readable epoch."""
    raw = dict(headers or []).get("sj-epoch", b"")
    try:
        return int(raw)
    except ValueError:
        return -1


def encode_logged(probe: Probe, epoch: int, head: dict) -> tuple[bytes, Headers]:
    """A round log record: the round's Probe, the epoch that released it, the head's state after it."""
    value, headers = encode(probe, epoch)
    return value, headers + [("sj-head", json.dumps(head, separators=(",", ":")).encode())]


def decode_logged(value: bytes | None, headers: Headers | None) -> LoggedRound:
    """A round log record back (raises on a record that is none: the head wrote every one)."""
    probe = decode(value, headers)
    if not isinstance(probe, Probe):
        raise ValueError("a round log record holds a probe")
    return LoggedRound(epoch_of(headers), probe, json.loads(dict(headers or [])["sj-head"]))


def _encode(msg: HopMessage) -> tuple[bytes, Headers]:
    if isinstance(msg, Mark):
        mark = {"layout": list(msg.layout), "ranges": msg.ranges}
        return b"", [("sj-kind", b"mark"), ("sj-round", str(msg.round).encode()),
                     ("sj-mark", json.dumps(mark, separators=(",", ":")).encode())]
    if isinstance(msg, Build):
        return encode_block(msg.tuples), [("sj-kind", b"build"), ("sj-round", str(msg.round).encode()),
                                          ("sj-stream", str(msg.stream).encode())]
    if isinstance(msg, Probe):
        return _pack([encode_block(b) for b in msg.tuples]), [
            ("sj-kind", b"probe"), ("sj-round", str(msg.info.round).encode()), ("sj-info", _info_json(msg.info))]
    if isinstance(msg, Partial):
        return encode_block(msg.rows), [
            ("sj-kind", b"partial"), ("sj-round", str(msg.round).encode()), ("sj-origin", msg.origin.encode()),
            ("sj-trigger", str(msg.trigger).encode()), ("sj-members", ",".join(map(str, msg.members)).encode())]
    return b"", [("sj-kind", b"end"), ("sj-round", str(msg.info.round).encode()),
                 ("sj-info", _info_json(msg.info)), ("sj-lap", str(msg.lap).encode())]


def decode(value: bytes | None, headers: Headers | None) -> HopMessage:
    h = {k: v.decode() for k, v in headers or []}
    kind, rnd = h["sj-kind"], int(h["sj-round"])
    if kind == "mark":
        mark = json.loads(h["sj-mark"])
        return Mark(rnd, tuple(mark["layout"]), mark["ranges"])
    if kind == "build":
        return Build(rnd, int(h["sj-stream"]), decode_block(value or b""))
    if kind == "probe":
        return Probe(_info(h["sj-info"]), tuple(decode_block(b) for b in _unpack(value or b"")))
    if kind == "partial":
        return Partial(rnd, h["sj-origin"], int(h["sj-trigger"]), tuple(int(x) for x in h["sj-members"].split(",")),
                       decode_block(value or b""))
    return End(_info(h["sj-info"]), int(h["sj-lap"]))


MAX_HOP_BYTES = 4 << 20  # a Build or Partial above this (NumPy bytes) is split; see hop_pieces


def hop_pieces(msg: Message) -> list[Message]:
    """A Build or Partial is a set of rows; a large one (a watermark jump moves a whole slice
    at once) travels as several of the same kind and round, in order, which the next node
    handles exactly as the one: it inserts them in turn, or probes them in turn. Each stays
    well under the broker's record size. Probes are bounded by the round size instead."""
    rows = msg.tuples if isinstance(msg, Build) else msg.rows if isinstance(msg, Partial) else None
    if rows is None or rows.nbytes <= MAX_HOP_BYTES:
        return [msg]
    cuts = np.linspace(0, len(rows), -(-rows.nbytes // MAX_HOP_BYTES) + 1).astype(np.int64)
    parts = [rows.take(np.arange(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]
    key = "tuples" if isinstance(msg, Build) else "rows"
    return [replace(msg, **{key: part}) for part in parts]
