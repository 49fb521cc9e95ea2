"""SplitJoin records: what a core hands the merger, and the marks
written into source partitions.

Core output, partition i of `<job>.splitjoin.out` (core i's own, so in its order):
one release's results as Arrow IPC blocks (the result columns every mode writes
plus each member's `<stream>._g`), cut into pieces under MAX_PIECE_BYTES; header
`sj-core` holds the release's CoreMeta as JSON. A release with no results is
one record with an empty value: its punctuation still moves the merger.

Marks, header `sj-mark` on a record of a source topic (its value is ignored):
  {"kind": "scale", "id": ..., "cores": k}   `streamjoin splitjoin scale`, one
      copy in every source partition: the storage modulus becomes k (engine/
      splitjoin/input_order.py says at which tuple)
  {"kind": "tick", "ts": t}   an idle partition's event time moves to t, the
      same for every core (`streamjoin splitjoin tick`)
Every decoder here raises SplitJoinWireError on anything it cannot read, never
something else.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streamjoin.engine.block import Block
from streamjoin.engine.splitjoin.schedule import Epoch, Schedule
from streamjoin.schemas.codecs import decode_block, encode_block

CORE_HEADER = "sj-core"
MARK_HEADER = "sj-mark"
MAX_PIECE_BYTES = 4 << 20  # NumPy bytes of results per record, well under the broker's record size

Headers = list[tuple[str, bytes]]


class SplitJoinWireError(ValueError):
    """A SplitJoin record that cannot be read (the caller dead-letters or skips it, with the reason)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CoreMeta(_Strict):
    """One release of one core: results with probing sequence in [from_g, through) are in its pieces."""

    core: int = Field(ge=0)
    from_g: int = Field(ge=0)
    through: int = Field(ge=0)
    punctuation: int | None = Field(default=None, ge=0)
    watermark: int = Field(default=-(1 << 62))  # the input order's watermark after the release: every tuple below it has a sequence below `through`
    retired: bool = False
    schedule: list[tuple[int, int]]  # epochs (first_g, cores)
    switches: int = Field(default=0, ge=0)  # the schedule's switch count (Schedule.switches)
    piece: int = Field(default=0, ge=0)
    pieces: int = Field(default=1, ge=1)

    def to_schedule(self) -> Schedule:
        try:
            return Schedule(tuple(Epoch(g, k) for g, k in self.schedule), self.switches)
        except ValueError as e:
            raise SplitJoinWireError(f"bad schedule {self.schedule}: {e}") from e


class ScaleMark(_Strict):
    kind: Literal["scale"] = "scale"
    id: str = Field(min_length=1, max_length=200)
    cores: int = Field(ge=1, le=64)


class TickMark(_Strict):
    kind: Literal["tick"] = "tick"
    ts: int = Field(ge=0, lt=1 << 60)


def schedule_epochs(schedule: Schedule) -> list[tuple[int, int]]:
    return [(e.first_g, e.cores) for e in schedule.epochs]


def encode_core_release(meta: CoreMeta, results: Block) -> list[tuple[bytes, Headers]]:
    """The records of one release: its results in pieces (none: one empty record)."""
    if not len(results):
        return [(b"", [(CORE_HEADER, meta.model_dump_json().encode())])]
    n = max(1, -(-results.nbytes // MAX_PIECE_BYTES))
    cuts = np.linspace(0, len(results), n + 1).astype(np.int64)
    out = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        piece = meta.model_copy(update={"piece": i, "pieces": n})
        out.append((encode_block(results.take(np.arange(a, b))), [(CORE_HEADER, piece.model_dump_json().encode())]))
    return out


def decode_core_release(value: bytes | None, headers: Headers | None) -> tuple[CoreMeta, Block]:
    raw = _header(headers, CORE_HEADER)
    if raw is None:
        raise SplitJoinWireError(f"no {CORE_HEADER} header")
    try:
        meta = CoreMeta.model_validate_json(raw)
    except ValidationError as e:
        raise SplitJoinWireError(f"bad {CORE_HEADER} header: {e.errors()[0]['msg']}") from e
    if meta.piece >= meta.pieces or meta.through < meta.from_g:
        raise SplitJoinWireError(f"inconsistent release {meta.model_dump()}")
    meta.to_schedule()
    if not value:
        return meta, Block()
    try:
        return meta, decode_block(value)
    except Exception as e:  # Arrow raises many kinds on garbage; all mean "unreadable"
        raise SplitJoinWireError(f"unreadable results block: {type(e).__name__}: {e}") from e


def mark_of(headers: Headers | None) -> ScaleMark | TickMark | None:
    """The mark a source record carries (None: an ordinary record)."""
    raw = _header(headers, MARK_HEADER)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise SplitJoinWireError(f"{MARK_HEADER} is not JSON") from e
    kind = data.get("kind") if isinstance(data, dict) else None
    model = {"scale": ScaleMark, "tick": TickMark}.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise SplitJoinWireError(f"{MARK_HEADER} of unknown kind {kind!r}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SplitJoinWireError(f"bad {kind} mark: {e.errors()[0]['msg']}") from e


def mark_headers(mark: ScaleMark | TickMark) -> Headers:
    return [(MARK_HEADER, mark.model_dump_json().encode())]


def _header(headers: Headers | None, name: str) -> bytes | None:
    for key, value in headers or []:
        if key == name:
            return value if isinstance(value, bytes) else None
    return None
