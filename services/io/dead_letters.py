"""Dead letters every mode builds: `DeadRecord`, a record bound for the job's dead-letter
topic (intake's refusals: malformed, oversize, unknown-stream, misrouted, future; late
tuples), the late tuples of a batch as dead letters (`late_records`: hash groups, the ring
head, SplitJoin cores), and those of a probe the UDF failed on (`udf_dead_letters`: ring
nodes, SplitJoin cores)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.engine.predicates import UDF_ERROR
from streamjoin.engine.psp.plan import prefixed
from streamjoin.schemas.codecs import BLOCK_SHIFT, encode_block
from streamjoin.schemas.results import dead_letter_headers
from streamjoin.services import metrics
from streamjoin.settings import JobSettings

if TYPE_CHECKING:  # only annotations: intake.py builds DeadRecords
    from streamjoin.services.io.intake import RecordBuffer


@dataclass(frozen=True)
class DeadRecord:
    """A record for the dead-letter topic: its identity in the source topic, the group
    it was read for, and why."""

    stream: int
    group: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str
    topic: str | None = None  # where it sits, when not in the stream's source topic


def late_records(job: JobSettings, stream: int, group: int, buf: RecordBuffer, late: Block,
                 watermark: int) -> list[DeadRecord]:
    """Late tuples as dead letters of `group`: a JSON/Avro record whole, a block record's late
    tuples as a block of just those."""
    spec = job.streams[stream]
    detail = (f"event time older than the group's watermark when read (at least {watermark}; allowed lateness "
              f"{job.join.allowed_lateness_ms} ms)")
    if spec.format != "blocks":
        at = buf.record_index(late[PART], late[OFF])
        return [DeadRecord(stream, group, int(buf.partitions[i]), int(buf.offsets[i]), buf.keys[i], buf.values[i],
                           "late", detail) for i in at.tolist()]
    record_offsets = late[OFF] >> BLOCK_SHIFT
    out = []
    for part, rec in np.unique(np.stack([late[PART].astype(np.int64), record_offsets], axis=1), axis=0).tolist():
        rows = late.filter((late[PART] == part) & (record_offsets == rec))
        i = int(buf.record_index(np.array([part]), np.array([rec]))[0])
        value = encode_block(Block({f: rows[f] for f in spec.fields}))
        out.append(DeadRecord(stream, group, part, rec, buf.keys[i], value, "late", detail))
    return out


def udf_dead_letters(job: JobSettings, trigger: int, rows: Block, detail: str, seen: set[tuple[int, int, int]]
                     ) -> list[tuple[bytes, int, list[tuple[str, bytes]]]]:
    """The dead letters for a probe the UDF failed on (ring nodes and SplitJoin cores), as (value,
    partition, headers), metered: one per trigger record not in `seen` (which it joins), its
    value the member tuples the UDF was given, as an Arrow block.

    job: the job; trigger: the probing stream's index; rows: the combined rows, one per failed
    candidate, with the trigger's partition and offset columns; detail: the UDF's error."""
    topic = job.topic_of(job.streams[trigger])
    parts, offs = rows[prefixed(trigger, PART)], rows[prefixed(trigger, OFF)]
    letters = []
    for k, (part, off) in enumerate(zip(parts.tolist(), offs.tolist())):
        if (trigger, part, off) in seen:
            continue
        seen.add((trigger, part, off))
        letters.append((encode_block(rows.take(np.array([k]))), part % job.partitions,
                        dead_letter_headers(UDF_ERROR, detail, topic, part, off, -1, -1)))
        metrics.DEAD_LETTER.labels(UDF_ERROR).inc()
    return letters
