"""What a ring's epochs topic `<job>.ring-epochs` holds (one partition, JSON values).

  RingStart       a node incarnation starts (key `start-<worker>-<incarnation>`): a new ring
                  epoch, numbered by the record's offset. Every node that reads it rolls back
                  to the checkpoint it names; the head then re-drives the rounds logged after it.
  RingReplace     the coordinator hands ring node `node`'s place to the standby `standby`
                  (key `replace-<node>-<offset-free counter>`): the process playing `standby` takes
                  the id `node` and the one playing `node` (if it comes back) the id `standby`;
                  each then starts a new incarnation under its new id.
  RingCheckpoint  the ring was drained after round `next_round - 1` (key `checkpoint`): every
                  node's slice ranges, where the round log holds what rebuilding them needs, the
                  head's state, and where the results topic ended.

Readers apply records in order: a RingStart makes its checkpoint the current one; a
RingCheckpoint of the current epoch replaces it, one of an older epoch (written by a node that
had not yet read the newer RingStart) is ignored. A value that is none of these decodes to None.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

CHECKPOINT_KEY = b"checkpoint"


class LogMark(BaseModel):
    """Where round `next_round` starts in the round log (`log_end`: the offset its record gets or
    after), and the sequencer's counts there: tuples of stream j numbered below counts[j] came
    in earlier rounds."""

    next_round: int = Field(ge=0)
    counts: list[int]
    log_end: int = Field(ge=0)


class RingCheckpoint(BaseModel):
    type: Literal["ring-checkpoint"] = "ring-checkpoint"
    epoch: int
    at: LogMark  # the checkpoint's own place: rounds from at.next_round on are re-driven
    start: LogMark  # the oldest place whose rounds hold a tuple some node still keeps
    history: list[LogMark] = Field(default_factory=list)  # earlier checkpoints' places, oldest first
    ranges: dict[str, list[list[tuple[int, int]]]]  # node -> per stream, [lo, hi) runs of _sseq
    head: dict  # the head's state after round at.next_round - 1 (services/ring/head.HeadState)
    results_end: dict[int, int] = Field(default_factory=dict)  # results partition -> end offset
    wall_ms: int = 0


class RingStart(BaseModel):
    type: Literal["ring-start"] = "ring-start"
    worker: str
    incarnation: str
    checkpoint: RingCheckpoint | None = None  # what the ring rolls back to (None: the start)
    wall_ms: int = 0


class RingReplace(BaseModel):
    type: Literal["ring-replace"] = "ring-replace"
    node: str
    standby: str
    wall_ms: int = 0


EpochRecord = RingStart | RingCheckpoint | RingReplace
_KINDS: dict[str, type[BaseModel]] = {"ring-start": RingStart, "ring-checkpoint": RingCheckpoint,
                                      "ring-replace": RingReplace}


def encode(record: EpochRecord) -> bytes:
    return record.model_dump_json().encode()


def start_key(start: RingStart) -> bytes:
    """A key of its own per incarnation, so compaction keeps every start."""
    return f"start-{start.worker}-{start.incarnation}".encode()


def replace_key(replace: RingReplace) -> bytes:
    """A key of its own per hand-over, so compaction keeps every one (identities follow from all of them)."""
    return f"replace-{replace.node}-{replace.standby}-{replace.wall_ms}".encode()


def play(role: str, replace: RingReplace) -> str:
    """The id a process playing `role` has after `replace`."""
    return replace.node if role == replace.standby else replace.standby if role == replace.node else role


def decode(value: bytes | None) -> EpochRecord | None:
    """An epochs-topic record, or None for anything else (never raises)."""
    try:
        data = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    model = _KINDS.get(data.get("type")) if isinstance(data, dict) and isinstance(data.get("type"), str) else None
    if model is None:
        return None
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError:
        return None
