"""What a SplitJoin core's changelog partition holds (partition i of
`<job>.splitjoin.changelog` holds core i's): the record keys, and the JSON records that
checkpoint a core and snapshot the input order for cores a scale adds. state/splitjoin.py
writes them and rebuilds a core from them.

Keys (values are Arrow IPC blocks unless said otherwise; big ones are chunked by
state/changelog.records, and a tombstone retracts every chunk):
  block/<stream>/<batch>   the tuples the core stored in release `batch`; a tombstone once
                           every one of them has expired
  pending/<stream>/<n>     tuples the input order took and had not released when the n-th
                           such block was logged (only the ones taken since the previous
                           transaction); a tombstone once all of them are released
  bootstrap/<mark id>      core 0 only (the id URL-quoted): a `BootstrapSnapshot` (JSON), the
                           input order at the moment it read a scale mark in every source
                           partition, for cores the scale adds; its pending tuples are in
  bootstrap/<mark id>/pending/<stream>
  restart                  the first record a core writes after a restore (value: the first
                           offset it skips, as text)
  checkpoint               a `CoreCheckpoint` (JSON): the last record of every transaction
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streamjoin.engine.block import Block
from streamjoin.engine.splitjoin.input_order import InputOrder, PendingSwitch, ScaleMark
from streamjoin.engine.splitjoin.schedule import Epoch, Schedule
from streamjoin.schemas.codecs import decode_block
from streamjoin.state import changelog

CHECKPOINT_KEY = b"checkpoint"
RESTART_KEY = b"restart"
# The first part of a key: what the record is.
BLOCK_KIND, PENDING_KIND, BOOTSTRAP_KIND = "block", "pending", "bootstrap"
MAX_CHECKPOINT_BYTES = changelog.CHUNK_BYTES  # a checkpoint is one record: the tail search reads it whole

I64 = Annotated[int, Field(ge=-(1 << 63), lt=1 << 63)]
Count = Annotated[int, Field(ge=0, lt=1 << 62)]  # offsets, sequence numbers, counts
Record = tuple[bytes | None, bytes | None, int]  # (key, value or None for a tombstone, offset)


class SplitJoinStateError(ValueError):
    """A core's changelog that cannot be read back: a hostile or damaged checkpoint, snapshot
    or block, or one that does not fit this job (another core's, other partition counts)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MarkState(_Strict):
    """A scale mark read in some source partitions: (stream, partition, newest event time before it)."""

    id: str = Field(min_length=1, max_length=200)
    cores: int = Field(ge=1, le=64)
    newest_before: list[tuple[Count, Count, I64]]


class SwitchState(_Strict):
    """A scale mark read everywhere, waiting for the first tuple later than `after_ts`."""

    mark_id: str = Field(min_length=1, max_length=200)
    after_ts: I64
    cores: int = Field(ge=1, le=64)


class OrderState(_Strict):
    """Everything of an InputOrder but its pending tuples (those are blocks of their own)."""

    newest: list[list[I64]] = Field(min_length=1)  # per stream, per partition
    next_g: Count
    counts: list[Count]
    epochs: list[tuple[Count, int]] = Field(min_length=1)  # the schedule: (first_g, cores)
    switches_made: Count = 0  # Schedule.switches
    marks: list[MarkState] = Field(default_factory=list)
    switches: list[SwitchState] = Field(default_factory=list)
    done_marks: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "OrderState":
        if len(self.counts) != len(self.newest) or any(not n for n in self.newest):
            raise ValueError("one count and at least one partition per stream")
        self.schedule()  # raises ValueError on a schedule Schedule refuses
        return self

    def schedule(self) -> Schedule:
        return Schedule(tuple(Epoch(g, k) for g, k in self.epochs), self.switches_made)

    @classmethod
    def of(cls, order: InputOrder) -> "OrderState":
        return cls(newest=[[int(t) for t in n.tolist()] for n in order.newest], next_g=int(order.sequencer.next_g),
                   counts=[int(c) for c in order.sequencer.counts],
                   epochs=[(e.first_g, e.cores) for e in order.schedule.epochs], switches_made=order.schedule.switches,
                   marks=[MarkState(id=k, cores=m.cores, newest_before=[(s, p, int(t)) for (s, p), t in
                                                                        sorted(m.newest_before.items())])
                          for k, m in order.marks.items()],
                   switches=[SwitchState(mark_id=s.mark_id, after_ts=int(s.after_ts), cores=s.cores)
                             for s in order.switches],
                   done_marks=sorted(order.done_marks))

    def install(self, order: InputOrder, pending: list[Block]) -> None:
        """Make `order` (a new one, for the same source partitions) this state, with `pending`
        (per stream) as its tuples taken and not released."""
        have = [len(n) for n in order.newest]
        if have != [len(n) for n in self.newest]:
            raise SplitJoinStateError(f"the state has source partitions {[len(n) for n in self.newest]} per stream, "
                                      f"the source topics have {have}: a source topic's partition count changed")
        order.newest = [np.array(n, np.int64) for n in self.newest]
        order.pending = pending
        order.sequencer.next_g, order.sequencer.counts = self.next_g, list(self.counts)
        order.schedule = self.schedule()
        order.marks = {m.id: ScaleMark(m.cores, {(s, p): t for s, p, t in m.newest_before}) for m in self.marks}
        order.switches = [PendingSwitch(s.mark_id, s.after_ts, s.cores) for s in self.switches]
        order.done_marks = set(self.done_marks)


class BootstrapRef(_Strict):
    """Where core 0's changelog partition holds the snapshot of scale mark `mark_id` (to `cores`
    cores): offsets [start, end)."""

    mark_id: str = Field(min_length=1, max_length=200)
    cores: int = Field(ge=1, le=64)
    start: Count
    end: Count


class CoreCheckpoint(_Strict):
    """A core's state after a release, with where its records are in the changelog partition."""

    version: Literal[1] = 1
    core: int = Field(ge=0, lt=64)
    batch: Count  # releases processed: the next one's batch number (a stored block's key)
    through: Count  # every result probing below this is written (= order.next_g)
    punctuation: Count | None = None  # of the last release written
    retired: bool = False  # the last release written said the core retired
    order: OrderState
    positions: dict[str, dict[Count, Count]]  # source topic -> partition -> next offset to read
    pending_seq: Count  # the next pending block's number
    stored: list[Count]  # window tuples per stream (checked by a rebuild)
    held: Count  # tuples the input order held (checked by a rebuild)
    low: Count  # the lowest offset a rebuild reads from
    skip: list[tuple[Count, Count]] = Field(default_factory=list)  # [a, b): records of attempts that died
    bootstraps: list[BootstrapRef] = Field(default_factory=list)  # core 0: snapshots written, oldest first

    @model_validator(mode="after")
    def _consistent(self) -> "CoreCheckpoint":
        if len(self.stored) != len(self.order.newest):
            raise ValueError("one stored count per stream")
        if self.through != self.order.next_g:
            raise ValueError(f"through {self.through} is not the input order's next sequence {self.order.next_g}")
        if any(a >= b for a, b in self.skip):
            raise ValueError(f"empty or reversed skip range in {self.skip[:3]}")
        return self

    def encode(self) -> bytes:
        raw = self.model_dump_json().encode()
        if len(raw) > MAX_CHECKPOINT_BYTES:
            raise ValueError(f"a core checkpoint of {len(raw)} bytes is over {MAX_CHECKPOINT_BYTES}")
        return raw

    @classmethod
    def decode(cls, raw: object) -> "CoreCheckpoint":
        """Raises SplitJoinStateError, never anything else, on bytes that are not a checkpoint."""
        return _decode(cls, raw, "core checkpoint")


class BootstrapSnapshot(_Strict):
    """Core 0's input order as it read scale mark `mark_id` in its last source partition: no
    switch of that mark applied yet, so a core it adds stores nothing below `order.next_g`."""

    version: Literal[1] = 1
    mark_id: str = Field(min_length=1, max_length=200)
    cores: int = Field(ge=1, le=64)
    order: OrderState
    positions: dict[str, dict[Count, Count]]
    held: Count

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, raw: object) -> "BootstrapSnapshot":
        return _decode(cls, raw, "bootstrap snapshot")

    def usable_by(self, position: int) -> bool:
        """Whether core `position` can start here with an empty window: the mark gives it a
        share, and no epoch before the snapshot's place already did (it would have stored then)."""
        epochs = self.order.schedule().before(self.order.next_g)
        return position < self.cores and all(position >= e.cores for e in epochs)


def _decode(model: type, raw: object, what: str):  # type: ignore[no-untyped-def]
    if not isinstance(raw, bytes):
        raise SplitJoinStateError(f"unreadable SplitJoin {what}: no bytes ({type(raw).__name__})")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(top level)"
        raise SplitJoinStateError(f"unreadable SplitJoin {what}: {where}: {first.get('msg')}") from None


# --------------------------------------------------------------------------- keys

def block_key(stream: int, batch: int) -> bytes:
    return f"{BLOCK_KIND}/{stream}/{batch}".encode()


def pending_key(stream: int, seq: int) -> bytes:
    return f"{PENDING_KIND}/{stream}/{seq}".encode()


def bootstrap_key(mark_id: str) -> bytes:
    """A mark id is any text: quoted, so neither '/' nor a chunk suffix ('#i/n') can appear in it."""
    return f"{BOOTSTRAP_KIND}/{quote(mark_id, safe='')}".encode()


def bootstrap_pending_key(mark_id: str, stream: int) -> bytes:
    return bootstrap_key(mark_id) + f"/{PENDING_KIND}/{stream}".encode()


def parse_key(key: bytes, streams: int) -> tuple[str, int, int]:
    """(kind, stream, number) of a block or pending key."""
    try:
        kind, stream, number = key.decode("ascii").split("/")
        j, n = int(stream), int(number)
    except ValueError:
        raise SplitJoinStateError(f"unreadable core changelog key {key[:80]!r}") from None
    if kind not in (BLOCK_KIND, PENDING_KIND) or not 0 <= j < streams or n < 0:
        raise SplitJoinStateError(f"core changelog key {key[:80]!r} names no block of {streams} streams")
    return kind, j, n


def read_block(value: bytes, key: bytes, template: Block) -> Block:
    try:
        block = decode_block(value)
    except Exception as e:  # Arrow raises many kinds on garbage; all mean "unreadable"
        raise SplitJoinStateError(f"unreadable block {key[:80]!r}: {type(e).__name__}: {e}") from None
    if sorted(block.names) != sorted(template.names):
        raise SplitJoinStateError(f"block {key[:80]!r} has columns {sorted(block.names)}, "
                                  f"expected {sorted(template.names)}")
    return block
