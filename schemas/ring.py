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
  sj-epoch    every kind: `<sender node>:<its incarnation>`, the ring epoch a receiver
              checks against the incarnation the ring started with (schemas/control.RingStart)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import NamedTuple

from streamjoin.engine.psp.messages import Build, End, Message, Partial, Probe, RoundInfo
from streamjoin.schemas.codecs import decode_block, encode_block

Headers = list[tuple[str, bytes]]


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


def encode(msg: Message, epoch: str) -> tuple[bytes, Headers]:
    """`msg` as a hop record; `epoch`: the sender's `<node>:<incarnation>`."""
    value, headers = _encode(msg)
    return value, headers + [("sj-epoch", epoch.encode())]


def restamp(headers: Headers | None, epoch: str) -> Headers:
    """A received record's headers with the forwarding node's `epoch` in place of the sender's."""
    return [(k, v) for k, v in headers or [] if k != "sj-epoch"] + [("sj-epoch", epoch.encode())]


def epoch_of(headers: Headers | None) -> tuple[str, str]:
    """(sender node, its incarnation) of a hop record; ("", "") for one without an epoch."""
    raw = dict(headers or []).get("sj-epoch", b"").decode()
    node, _, incarnation = raw.rpartition(":")
    return node, incarnation


def _encode(msg: Message) -> tuple[bytes, Headers]:
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


def decode(value: bytes | None, headers: Headers | None) -> Message:
    h = {k: v.decode() for k, v in headers or []}
    kind, rnd = h["sj-kind"], int(h["sj-round"])
    if kind == "build":
        return Build(rnd, int(h["sj-stream"]), decode_block(value or b""))
    if kind == "probe":
        return Probe(_info(h["sj-info"]), tuple(decode_block(b) for b in _unpack(value or b"")))
    if kind == "partial":
        return Partial(rnd, h["sj-origin"], int(h["sj-trigger"]), tuple(int(x) for x in h["sj-members"].split(",")),
                       decode_block(value or b""))
    return End(_info(h["sj-info"]), int(h["sj-lap"]))
