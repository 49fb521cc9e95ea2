"""What the job writes besides its results: the commit records recovery and
verifiers read, and the dead-letter record. The result records themselves
(one per result, JSON or Avro, or Arrow blocks) are schemas/result_format.py.

Commits: topic `<job>.commits` (internal, compacted by key), JSON values.
  hash mode  key = group g, partition g: one `BatchCommit` per (group, batch),
             written and flushed before the batch's results, so a visible
             result implies a visible commit; it carries the batch's input
             boundary and the group's watermark after it.
  ring mode  key = the node, partition 0: one `RoundRelease` per round once
             its results are written; its watermark says which inputs have
             been released (joined) for good.

Dead letter: topic `<job>.dead-letter`, value and key are the original
record's bytes; headers: sj-reason (malformed | late | oversize | unsupported |
unknown-stream | misrouted | udf-error), sj-detail, sj-topic, sj-partition,
sj-offset (the input record), sj-group, sj-seq.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from streamjoin.engine.result_ids import EVENT_TIME, PRODUCED_MS, RESULT_ID_HI, RESULT_ID_LO
from streamjoin.schemas.control import HotSplit

__all__ = ["EVENT_TIME", "PRODUCED_MS", "RESULT_ID_HI", "RESULT_ID_LO", "BatchCommit", "RoundRelease", "Commit",
           "decode_commit", "dead_letter_headers", "dead_letter_ref", "decode_headers", "ref_columns"]

H_GROUP, H_SEQ = "sj-group", "sj-seq"
H_REASON, H_DETAIL, H_TOPIC, H_PARTITION, H_OFFSET = "sj-reason", "sj-detail", "sj-topic", "sj-partition", "sj-offset"


def ref_columns(stream: str) -> tuple[str, str, str]:
    """Result block columns naming a member tuple: its partition, offset and event time."""
    return f"{stream}.partition", f"{stream}.offset", f"{stream}.ts"


class BatchCommit(BaseModel):
    """Hash mode: group `group`'s batch `seq` is decided. Its results follow on the
    results topic's partition `group` (`results` of them)."""

    kind: Literal["batch"] = "batch"
    group: int
    seq: int
    end: dict[str, dict[int, int]]  # input topic -> partition -> next offset: the batch's boundary
    watermark: int  # the group's watermark after the batch
    results: int
    worker: str
    epoch: int = 0  # the placement epoch its worker held the group at (who decided it, for audits)
    now_ms: int | None = None  # the wall clock the batch was decided at: replay judges join.max_future_ms by it
    # Deferred spill: the first batch of the generation the batch was decided in (a push before
    # it starts a new one: replay pushes at the same batch).
    generation_start: int = 0
    # Split hot keys: the splits and merges the batch applied (services/hash/split.py): replay
    # applies them at the same batch.
    splits_applied: list[HotSplit] = Field(default_factory=list)


class RoundRelease(BaseModel):
    """Ring mode: round `round`'s results are all written; inputs below `watermark` are released."""

    kind: Literal["round"] = "round"
    node: str
    round: int
    watermark: int


Commit = Annotated[BatchCommit | RoundRelease, Field(discriminator="kind")]
_COMMIT = TypeAdapter(Commit)


def decode_commit(value: bytes) -> BatchCommit | RoundRelease:
    return _COMMIT.validate_json(value)


def dead_letter_headers(reason: str, detail: str, topic: str, partition: int, offset: int, group: int,
                        seq: int) -> list[tuple[str, bytes]]:
    return [
        (H_REASON, reason.encode()),
        (H_DETAIL, detail[:2000].encode()),
        (H_TOPIC, topic.encode()),
        (H_PARTITION, str(partition).encode()),
        (H_OFFSET, str(offset).encode()),
        (H_GROUP, str(group).encode()),
        (H_SEQ, str(seq).encode()),
    ]


def decode_headers(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    return {k: v.decode() for k, v in headers or []}


def dead_letter_ref(headers: list[tuple[str, bytes]] | None) -> tuple[str, int, int] | None:
    """The input record a dead letter stands for, (topic, partition, offset), from its headers;
    None when they do not name one."""
    h = decode_headers(headers)
    if H_TOPIC not in h or H_PARTITION not in h or H_OFFSET not in h:
        return None
    return h[H_TOPIC], int(h[H_PARTITION]), int(h[H_OFFSET])
