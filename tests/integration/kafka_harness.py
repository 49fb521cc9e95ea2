"""Integration-test plumbing: write scripted inputs with a plain producer and
check the results topic against the plain-Python reference join."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import structlog
from confluent_kafka import Producer

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join, reference_outer_join
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, decode_commit, decode_headers
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology.partitioner import partition_for


@dataclass(frozen=True)
class Row:
    stream: str
    key: int
    ts: int


def produce(job: JobSettings, bootstrap: str, rows: list[Row], raw: list[tuple[str, bytes | None, bytes]] = (),
            producer: Producer | None = None, spelling: Callable[[int, dict], str] | None = None) -> None:
    """Rows as JSON records keyed by their join key (murmur2-partitioned), in the given order;
    `raw` records (topic, key, value) are written as they are, for bad-input tests;
    `spelling(n, doc)`: the JSON text of the n-th row (default: json.dumps, compact)."""
    p = producer or kafka.Cluster(bootstrap).producer()
    topic_of = {s.name: job.topic_of(s) for s in job.streams}
    for n, r in enumerate(rows):
        doc = {"k": r.key, "ts": r.ts, "pad": "x" * 8}
        value = (spelling(n, doc) if spelling else json.dumps(doc)).encode()
        p.produce(topic_of[r.stream], key=key_bytes(r.key), value=value)
    for topic, key, value in raw:
        p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0


SETTLE_S = 10.0


def read_all(bootstrap: str, topic: str, partitions: int, group: str) -> list:
    """Every committed record of the topic's partitions, read to each partition's high watermark
    once the transactions open now have ended (up to SETTLE_S). A read to the last stable offset
    alone can miss a cycle that has committed: the broker makes a transaction's consumer offsets
    visible before its markers are on every output partition, so right after the inputs show as
    drained, the last cycle's results may still sit behind an open-looking transaction."""
    return kafka.read_settled(kafka.Cluster(bootstrap), topic, dict.fromkeys(range(partitions), 0), group,
                              structlog.get_logger("tests.kafka_harness"), settle_s=SETTLE_S)


@dataclass
class Check:
    expected: int
    results: int
    missing: int
    extra: int
    duplicates: int
    dead_letter: Counter
    # A few of the missing and extra results, each input as (topic, partition, offset, event time),
    # so that a failure names what was lost, not only how much.
    sample: dict[str, list] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.missing == self.extra == self.duplicates == 0


def produced_refs(job: JobSettings, bootstrap: str) -> list[tuple[tuple[str, int, int], ...]]:
    """Every result on the results topic as its inputs' refs, in stream order (repeats kept)."""
    partitions = 1 if job.join.mode == "splitjoin" else job.group_count  # splitjoin: one partition, in input order
    records = read_all(bootstrap, job.results_topic, partitions, "check-out")
    decoded = decode_results(result_layout(job), job.output.format, [m.value() for m in records])
    assert not decoded.rejects, decoded.rejects[:3]
    cols = [(job.topic_of(s), decoded.columns[f"{s.name}.partition"].tolist(),
             decoded.columns[f"{s.name}.offset"].tolist())
            for s in job.streams]
    return [tuple((t, ps[r], os[r]) for t, ps, os in cols) for r in range(len(cols[0][1]))]


def commits(job: JobSettings, bootstrap: str) -> list:
    """The commit records (BatchCommit, RoundRelease) on the job's commits topic."""
    return [decode_commit(m.value()) for m in read_all(bootstrap, job.commits_topic, job.group_count, "check-commits")]


def dead_letters(job: JobSettings, bootstrap: str) -> tuple[set[tuple[str, int, int]], Counter]:
    """The inputs the dead-letter topic stands for, and the count per reason."""
    refs, reasons = set(), Counter()
    for m in read_all(bootstrap, job.dead_letter_topic, job.group_count, "check-dlq"):
        h = decode_headers(m.headers())
        refs.add((h[H_TOPIC], int(h[H_PARTITION]), int(h[H_OFFSET])))
        reasons[h[H_REASON]] += 1
    return refs, reasons


def check(job: JobSettings, bootstrap: str) -> Check:
    dead_refs, reasons = dead_letters(job, bootstrap)
    streams = []
    for s in job.streams:
        topic = job.topic_of(s)
        rows = []
        partitions = len(kafka.Cluster(bootstrap).admin().list_topics(topic, timeout=10).topics[topic].partitions)
        for m in read_all(bootstrap, topic, partitions, "check-in"):
            ref = (topic, m.partition(), m.offset())
            if ref in dead_refs:
                continue
            v = json.loads(m.value())
            rows.append(RefTuple(ref, v["k"], v["ts"]))
        streams.append(rows)
    windows = [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams]
    produced = produced_refs(job, bootstrap)
    final_wm: dict[int, int] = {}
    for c in commits(job, bootstrap):
        final_wm[c.group] = max(final_wm.get(c.group, c.watermark), c.watermark)
    group_of = lambda t: partition_for(key_bytes(t.key), job.partitions)  # noqa: E731
    if job.join.type == "inner":
        expected = reference_join(streams, windows, final_wm if job.emits_on_watermark else None, group_of=group_of)
    else:  # null-padded rows too: each row its group's final watermark decided and no result held
        expected = reference_outer_join(streams, windows, job.join.type, [job.topic_of(s) for s in job.streams],
                                        final_wm, group_of=group_of)
    counts = Counter(produced)
    missing, extra = expected - set(counts), set(counts) - expected
    ts = {t.ref: t.ts for rows in streams for t in rows}
    sample = {name: [tuple((*ref, ts.get(ref)) if ref else None for ref in pair) for pair in sorted(pairs, key=str)[:5]]
              for name, pairs in (("missing", missing), ("extra", extra)) if pairs}
    if missing or extra:
        print(diagnosis(missing, extra, counts, ts, final_wm, group_of))
    return Check(
        expected=len(expected), results=len(produced), missing=len(missing), extra=len(extra),
        duplicates=sum(c - 1 for c in counts.values()), dead_letter=reasons, sample=sample,
    )


def diagnosis(missing: set, extra: set, counts: Counter, ts: dict, final_wm: dict[int, int],
              group_of: Callable) -> str:  # type: ignore[type-arg]
    """What a failed check prints in full (an assertion's message is cut short): every missing
    and extra pair with its inputs' event times, and for each input of a missing pair how many
    results hold it at all (0: the tuple never joined; more: some of its pairs were lost), with
    its group's final watermark."""
    in_results = Counter(ref for pair in counts for ref in pair if ref)
    lines = [f"missing {len(missing)}, extra {len(extra)}"]
    for name, pairs in (("missing", missing), ("extra", extra)):
        for pair in sorted(pairs, key=str)[:200]:
            lines.append(f"{name}: " + ", ".join(f"{ref}@{ts.get(ref)}" if ref else "-" for ref in pair))
    refs = sorted({ref for pair in missing for ref in pair if ref}, key=str)
    lines += [f"input {ref}@{ts.get(ref)}: in {in_results[ref]} results" for ref in refs[:200]]
    lines.append(f"final watermarks per group: {dict(sorted(final_wm.items()))}")
    return "\n".join(lines)


def assert_spark_verified(job: JobSettings, bootstrap: str, expected: int) -> None:
    """Spark `verify`, the independent oracle, agrees: no result missing, extra, duplicated,
    with a bad id or lost, and `expected` results in all (what the reference check counted)."""
    from streamjoin.services.spark.verify import run_verify  # Spark starts only for the tests that ask

    verdict = run_verify(job, kafka.Cluster(bootstrap))
    assert verdict["verified"], {k: verdict[k] for k in ("missing", "extra", "duplicates", "bad_ids", "lost")}
    assert verdict["results"] == verdict["expected"] == expected
