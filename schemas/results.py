"""The result record and the dead-letter record, as written to Kafka.

Results: topic `<job>.results`, partition = partition group g, one record per
(group, batch) holding an Arrow IPC block (schemas/files/result_block.json):
    result_id    uint64   see engine/result_ids.py
    event_time   int64    T = max event time of the inputs
    produced_ms  int64    wall clock when the worker produced it
    <s>.partition int32, <s>.offset int64, <s>.ts int64, <s>.<field> ...  per stream s
Headers (ASCII): sj-group, sj-seq (batch number in the group), sj-chunk
("i/n"), sj-end (JSON {stream: next offset} for the group's input
partitions: the batch boundary), sj-wm (group watermark after the batch),
sj-worker. A batch with input but no results still writes one empty record:
it is the batch's commit marker.

Dead letter: topic `<job>.dead-letter`, partition = g, value and key are the
original record's bytes; headers: sj-reason (malformed | late | oversize |
unknown-stream), sj-detail, sj-topic, sj-partition, sj-offset, sj-group, sj-seq.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

RESULT_ID, EVENT_TIME, PRODUCED_MS = "result_id", "event_time", "produced_ms"
H_GROUP, H_SEQ, H_CHUNK, H_END, H_WM, H_WORKER = "sj-group", "sj-seq", "sj-chunk", "sj-end", "sj-wm", "sj-worker"
H_REASON, H_DETAIL, H_TOPIC, H_PARTITION, H_OFFSET = "sj-reason", "sj-detail", "sj-topic", "sj-partition", "sj-offset"


def ref_columns(stream: str) -> tuple[str, str, str]:
    return f"{stream}.partition", f"{stream}.offset", f"{stream}.ts"


@dataclass(frozen=True)
class BatchHeader:
    group: int
    seq: int
    chunk: int
    chunks: int
    end: dict[str, int]
    watermark: int
    worker: str

    def encode(self) -> list[tuple[str, bytes]]:
        return [
            (H_GROUP, str(self.group).encode()),
            (H_SEQ, str(self.seq).encode()),
            (H_CHUNK, f"{self.chunk}/{self.chunks}".encode()),
            (H_END, json.dumps(self.end, separators=(",", ":")).encode()),
            (H_WM, str(self.watermark).encode()),
            (H_WORKER, self.worker.encode()),
        ]

    @classmethod
    def decode(cls, headers: list[tuple[str, bytes]] | None) -> "BatchHeader":
        h = {k: v.decode() for k, v in headers or []}
        chunk, chunks = h[H_CHUNK].split("/")
        return cls(int(h[H_GROUP]), int(h[H_SEQ]), int(chunk), int(chunks), json.loads(h[H_END]),
                   int(h[H_WM]), h.get(H_WORKER, ""))


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
