"""Progress notes as records: how far each source partition has been read, as a hash group
tells it through a stream's by-key topic (hash/progress.py says when and why). Here is what
intake needs of them: the record a note is (`ProgressNote`, marked by NOTE_HEADER), reading
one back (`note_of`, `take_notes`) and the newest event time a group read per source
partition (`newest_read`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from confluent_kafka import Message

from streamjoin.engine.block import PART, TS, Block
from streamjoin.engine.window_join import NO_TIME

NOTE_HEADER = "sj-progress"  # marks a progress note on a by-key topic (its value: the note)
Newest = dict[int, dict[int, int]]  # group -> source partition -> the newest event time it read there


@dataclass(frozen=True)
class Told:
    """What one note says: per source partition the newest event time read there, and the
    source partitions gone idle."""

    newest: dict[int, int]
    idle: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProgressNote:
    """A note on its way to `partition` (the target group) of stream `stream`'s by-key topic,
    written by the Emitter after the batch's forwards (it has a Forward's produce fields)."""

    stream: int
    group: int  # the sender
    partition: int
    told: Told
    timestamp: int

    @property
    def key(self) -> bytes:
        return str(self.group).encode()

    @property
    def value(self) -> bytes:
        return json.dumps({"newest": self.told.newest, "idle": list(self.told.idle)}).encode()

    def headers(self) -> list[tuple[str, bytes]]:
        return [(NOTE_HEADER, b"1")]


def note_of(m: Message) -> Told | None:
    """The note a by-key record carries, or None: not a note, or one streamjoin did not write
    (a record with the header whose value does not parse is left to intake, which dead-letters
    a by-key record without origin headers)."""
    if not any(k == NOTE_HEADER for k, _ in m.headers() or []):
        return None
    try:
        data = json.loads(m.value() or b"")
        newest = {int(p): int(t) for p, t in data["newest"].items()}
        idle = tuple(int(p) for p in data["idle"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return Told(newest, idle)


def take_notes(msgs: Sequence[Message], origins: Sequence[tuple[int, int] | None], partitions: np.ndarray,
               notes: list[tuple[int, Told]]) -> tuple[Sequence[Message], Sequence[tuple[int, int] | None], np.ndarray]:
    """One consume() call's by-key records without the progress notes among them: those are
    appended to `notes` as (group, note), in order; the rest come back with their origins and
    partitions. Only records without origin headers can be notes (few: only they are parsed)."""
    told = [None if o else note_of(m) for m, o in zip(msgs, origins)]
    if not any(told):
        return msgs, origins, partitions
    notes += [(int(p), n) for p, n in zip(partitions.tolist(), told) if n is not None]
    rest = [i for i, n in enumerate(told) if n is None]
    return [msgs[i] for i in rest], [origins[i] for i in rest], partitions[rest]


def newest_read(block: Block, groups: np.ndarray, rerouted: np.ndarray) -> Newest:
    """Per group, per source partition, the newest event time among the decoded tuples the
    group read there itself (re-routed ones were read by their sender, who tells of them)."""
    own = ~rerouted
    if not own.any():
        return {}
    pairs = np.stack([groups[own], block[PART][own].astype(np.int64)], axis=1)
    keys, at = np.unique(pairs, axis=0, return_inverse=True)
    top = np.full(len(keys), NO_TIME, np.int64)
    np.maximum.at(top, at.ravel(), block[TS][own])
    out: Newest = {}
    for (g, p), t in zip(keys.tolist(), top.tolist()):
        out.setdefault(g, {})[p] = t
    return out
