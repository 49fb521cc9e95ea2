"""Records on `<job>.split`: what a partition group with a split hot key sends one of its slots
after a batch (services/hash/split.py says what and when). Partition j of the topic is slot
P + j's input (P: the job's partitions).

  key      the sending group's number, as text
  headers  sj-split: JSON {"episode", "group", "seq", "watermark", "start", "end", "sizes"}:
           the split's episode, the sending group and its batch, the group's watermark after
           that batch, whether the record starts the episode on the slot (it carries the
           group's window copy first) or ends it, and the byte size of each stream's part
  value    per stream, its tuples (Arrow IPC, schemas/codecs.encode_block) back to back,
           `sizes[i]` bytes each (0: none)

The tuples keep their identity columns (source partition and offset), so a result made in a
slot has the id it would have had in the group. Decoding is for hostile bytes: whatever a
record holds, `decode_split` returns a `SplitRecord` or the reason it is not one (the worker
dead-letters it), never raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from streamjoin.engine.block import SYSTEM_COLUMNS, TS, Block
from streamjoin.schemas.codecs import TIME_BOUND, decode_block, encode_block

SPLIT_HEADER = "sj-split"
_INT64 = 1 << 62  # bounds a watermark may take (NO_TIME, the engine's "none yet", lies within)


class _Meta(BaseModel):
    episode: int = Field(ge=1, lt=_INT64)
    group: int = Field(ge=0, lt=1 << 20)
    seq: int = Field(ge=1, lt=_INT64)
    watermark: int = Field(gt=-_INT64, lt=_INT64)
    start: bool = False
    end: bool = False
    sizes: list[int] = Field(default_factory=list)


@dataclass(frozen=True)
class SplitRecord:
    """One batch of a group, as one slot gets it: per stream the tuples (`blocks`), the group's
    watermark after the batch, and whether it starts or ends the split's episode."""

    episode: int
    group: int
    seq: int
    watermark: int
    start: bool
    end: bool
    blocks: list[Block]


def encode_split(record: SplitRecord) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of `record`'s Kafka record."""
    parts = [encode_block(b) if len(b) else b"" for b in record.blocks]
    meta = _Meta(episode=record.episode, group=record.group, seq=record.seq, watermark=record.watermark,
                 start=record.start, end=record.end, sizes=[len(p) for p in parts])
    return str(record.group).encode(), b"".join(parts), [(SPLIT_HEADER, meta.model_dump_json().encode())]


def decode_split(value: bytes | None, headers: list | None, templates: list[Block]) -> SplitRecord | str:
    """The record a `<job>.split` record is, or why it is none. `templates`: per stream, an
    empty block with the columns the slot's window holds (their names and kinds must match)."""
    raw = next((v for k, v in headers or [] if k == SPLIT_HEADER), None)
    if not isinstance(raw, bytes):
        return f"no {SPLIT_HEADER} header: not written by streamjoin"
    try:
        meta = _Meta.model_validate(json.loads(raw))
    except (ValueError, ValidationError, TypeError) as e:
        return f"unreadable {SPLIT_HEADER} header: {str(e)[:200]}"
    value = value or b""
    if len(meta.sizes) != len(templates) or any(n < 0 for n in meta.sizes) or sum(meta.sizes) != len(value):
        return (f"the {SPLIT_HEADER} header's sizes {meta.sizes[:8]} do not cut the {len(value)}-byte value into "
                f"{len(templates)} streams")
    blocks, at = [], 0
    for i, (size, template) in enumerate(zip(meta.sizes, templates)):
        part, at = value[at:at + size], at + size
        block = _block(part, template) if size else template
        if isinstance(block, str):
            return f"stream {i}: {block}"
        blocks.append(block)
    return SplitRecord(meta.episode, meta.group, meta.seq, meta.watermark, meta.start, meta.end, blocks)


def _block(data: bytes, template: Block) -> Block | str:
    """One stream's tuples, checked against the slot's `template`, or why they do not fit."""
    try:
        block = decode_block(data)
    except Exception as e:  # Arrow raises many kinds on hostile bytes; all mean a malformed record
        return f"not an Arrow block ({type(e).__name__})"
    if block.names != template.names:
        return f"columns {block.names[:12]} are not the window's {template.names[:12]}"
    for name in template.names:
        want, got = template[name].dtype, block[name].dtype
        if got.kind != want.kind or (name in SYSTEM_COLUMNS and got != want):
            return f"column {name} is {got}, the window holds {want}"
    if len(block) and np.abs(block[TS]).max() >= TIME_BOUND:
        return f"an event time beyond +-{TIME_BOUND}"
    return block
