"""Integration-test plumbing: write scripted inputs with a plain producer and
check the results topic against the plain-Python reference join."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from confluent_kafka import Producer

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.schemas.codecs import decode_block
from streamjoin.schemas.results import H_OFFSET, H_REASON, H_TOPIC, BatchHeader, decode_headers
from streamjoin.services import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology.partitioner import key_bytes


@dataclass(frozen=True)
class Row:
    stream: str
    key: int
    ts: int


def produce(job: JobSettings, bootstrap: str, rows: list[Row], raw: list[tuple[str, bytes | None, bytes]] = (),
            producer: Producer | None = None) -> None:
    """Rows as JSON records keyed by their join key (murmur2-partitioned), in the given order;
    `raw` records (topic, key, value) are written as they are, for bad-input tests."""
    p = producer or kafka.Cluster(bootstrap).producer()
    topic_of = {s.name: job.topic_of(s) for s in job.streams}
    for r in rows:
        value = json.dumps({"k": r.key, "ts": r.ts, "pad": "x" * 8}).encode()
        p.produce(topic_of[r.stream], key=key_bytes(r.key), value=value)
    for topic, key, value in raw:
        p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0


def read_all(bootstrap: str, topic: str, partitions: int, group: str) -> list:
    return kafka.read_partitions(kafka.Cluster(bootstrap), topic, dict.fromkeys(range(partitions), 0), group)


@dataclass
class Check:
    expected: int
    results: int
    missing: int
    extra: int
    duplicates: int
    dead_letter: Counter

    @property
    def exact(self) -> bool:
        return self.missing == self.extra == self.duplicates == 0


def check(job: JobSettings, bootstrap: str) -> Check:
    names = [s.name for s in job.streams]
    dead = read_all(bootstrap, job.dead_letter_topic, job.partitions, "check-dlq")
    dead_refs = set()
    reasons: Counter = Counter()
    for m in dead:
        h = decode_headers(m.headers())
        dead_refs.add((h[H_TOPIC], m.partition(), int(h[H_OFFSET])))
        reasons[h[H_REASON]] += 1
    streams = []
    for s in job.streams:
        topic = job.topic_of(s)
        rows = []
        for m in read_all(bootstrap, topic, job.partitions, "check-in"):
            ref = (topic, m.partition(), m.offset())
            if ref in dead_refs:
                continue
            v = json.loads(m.value())
            rows.append(RefTuple(ref, v["k"], v["ts"]))
        streams.append(rows)
    windows = [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams]
    produced: list[tuple] = []
    final_wm: dict[int, int] = {}
    for m in read_all(bootstrap, job.results_topic, job.partitions, "check-out"):
        h = BatchHeader.decode(m.headers())
        final_wm[h.group] = max(final_wm.get(h.group, h.watermark), h.watermark)
        b = decode_block(m.value())
        for i in range(len(b)):
            produced.append(tuple((job.topic_of(s), int(b[f"{n}.partition"][i]), int(b[f"{n}.offset"][i]))
                                  for s, n in zip(job.streams, names)))
    expected = reference_join(streams, windows, final_wm if job.emits_on_watermark else None)
    counts = Counter(produced)
    return Check(
        expected=len(expected), results=len(produced), missing=len(expected - set(counts)),
        extra=len(set(counts) - expected), duplicates=sum(c - 1 for c in counts.values()), dead_letter=reasons,
    )
