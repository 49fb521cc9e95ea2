"""Intake without Kafka: the co-partitioning check, what is forwarded (and as what),
and taking a forwarded record once however often a retried cycle wrote it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.schemas.codecs import BLOCK_SHIFT, decode_blocks, encode_block
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services import metrics
from streamjoin.services.io.intake import (H_ORIGIN_OFFSET, H_ORIGIN_PARTITION, MISROUTED, RecordBuffer,
    decode_by_group, routing_for)
from streamjoin.settings import JobSettings, load
from streamjoin.topology.partitioner import partition_for
from tests.profiles import examples

PARTITIONS = 8


@dataclass
class Msg:
    """What RecordBuffer reads of a confluent-kafka Message."""

    topic_: str
    partition_: int
    offset_: int
    value_: bytes | None
    headers_: list | None = None
    key_: bytes | None = None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes | None:
        return self.value_

    def key(self) -> bytes | None:
        return self.key_

    def timestamp(self) -> tuple[int, int]:
        return (0, 1_000)

    def headers(self) -> list | None:
        return self.headers_


def job(fmt: str = "json", repartition: str = "auto", start_event_ms: int | None = None) -> JobSettings:
    streams = [{"name": n, "format": fmt, "fields": {"k": "int", "ts": "int"}, "time_field": "ts",
                "key_fields": ["k"], "window": {"range_ms": 100}} for n in "rs"]
    return load(None, job="in", partitions=PARTITIONS, streams=streams,
                join={"repartition": repartition, "start_event_ms": start_event_ms})


def home(key: int) -> int:
    return partition_for(key_bytes(key), PARTITIONS)


def test_misrouted_json_records_are_forwarded_whole_and_the_rest_joins() -> None:
    j = job()
    buf = RecordBuffer()
    keys = list(range(40))
    for offset, k in enumerate(keys):  # all written to partition 3, as an unkeyed producer might
        buf.add(Msg("in.r", 3, offset, json.dumps({"k": k, "ts": 5}).encode()), 3)  # type: ignore[arg-type]
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), {}).values()
    stayed = sorted(slice_.block["k"].tolist())
    assert stayed == [k for k in keys if home(k) == 3] and stayed
    forwarded = {f.origin_offset: f for f in slice_.forwards}
    assert sorted(forwarded) == [o for o, k in enumerate(keys) if home(k) != 3]
    for offset, f in forwarded.items():
        assert f.partition == home(keys[offset]) and f.key == key_bytes(keys[offset])
        assert f.value == buf.values[offset] and f.origin_partition == 3 and f.group == 3
        assert dict(f.headers()) == {H_ORIGIN_PARTITION: b"3", H_ORIGIN_OFFSET: str(offset).encode()}
    assert slice_.end == {"in.r": {3: len(keys)}} and not slice_.dead


def test_tuples_before_the_start_event_time_are_skipped_not_forwarded_nor_dead_lettered() -> None:
    """An operator version's backfill reads from before its start: those tuples are counted and skipped."""
    j = job(start_event_ms=50)
    buf = RecordBuffer()
    rows = [(k, ts) for k in range(12) for ts in (10, 49, 50, 80)]
    for offset, (k, ts) in enumerate(rows):  # all in partition 3: most would be forwarded
        buf.add(Msg("in.r", 3, offset, json.dumps({"k": k, "ts": ts}).encode()), 3)  # type: ignore[arg-type]
    before = metrics.FILTERED.labels("r", "before_start")._value.get()
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), {}).values()
    kept = sorted(zip(slice_.block["k"].tolist(), slice_.block["ts"].tolist()))
    assert kept == [(k, ts) for k, ts in rows if ts >= 50 and home(k) == 3]
    assert sorted(rows[f.origin_offset][1] for f in slice_.forwards) == sorted(
        ts for k, ts in rows if ts >= 50 and home(k) != 3)
    assert not slice_.dead and slice_.end == {"in.r": {3: len(rows)}}
    assert metrics.FILTERED.labels("r", "before_start")._value.get() - before == 24


def test_never_dead_letters_the_misrouted_with_their_reason() -> None:
    j = job(repartition="never")
    buf = RecordBuffer()
    for offset, k in enumerate(range(30)):
        buf.add(Msg("in.r", 5, offset, json.dumps({"k": k, "ts": 5}).encode()), 5)  # type: ignore[arg-type]
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), {}).values()
    wrong = [o for o, k in enumerate(range(30)) if home(k) != 5]
    assert sorted(d.offset for d in slice_.dead) == wrong and not slice_.forwards
    assert {d.reason for d in slice_.dead} == {MISROUTED}
    assert len(slice_.block) == 30 - len(wrong)


def test_another_partition_count_reroutes_everything() -> None:
    j = job()
    buf = RecordBuffer()
    for offset, k in enumerate(range(20)):
        buf.add(Msg("in.r", 2, offset, json.dumps({"k": k, "ts": 5}).encode()), 2)  # type: ignore[arg-type]
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, 3), {}).values()  # the source topic has 3
    assert len(slice_.block) == 0 and len(slice_.forwards) == 20


def test_a_forwarded_block_keeps_its_tuples_identities() -> None:
    j = job(fmt="blocks")
    keys = np.arange(50, dtype=np.int64)
    record = encode_block(Block({"k": keys, "ts": np.full(50, 7, np.int64)}))
    buf = RecordBuffer()
    buf.add(Msg("in.r", 1, 9, record), 1)  # type: ignore[arg-type]
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), {}).values()
    identities = {int(o) for o in slice_.block[OFF]}
    for f in slice_.forwards:
        decoded = decode_blocks(j.streams[0], [f.value], np.array([f.origin_partition]), np.array([f.origin_offset]),
                                np.array([0]))
        assert not decoded.rejects and set(home(int(k)) for k in decoded.block["k"]) == {f.partition}
        identities |= {int(o) for o in decoded.block[OFF]}
        assert set(decoded.block[PART].tolist()) == {1}
    assert identities == {(9 << BLOCK_SHIFT) | i for i in range(50)}  # every tuple once, as in its record


def test_a_record_on_a_by_key_topic_without_origin_is_dead_lettered() -> None:
    j = job()
    buf = RecordBuffer()
    buf.add_forwarded(Msg("in.r.by-key", 4, 0, json.dumps({"k": 1, "ts": 5}).encode()))  # type: ignore[arg-type]
    (slice_,) = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), {}).values()
    (dead,) = slice_.dead
    assert dead.reason == "malformed" and dead.topic == "in.r.by-key" and len(slice_.block) == 0


# A router forwards a source partition's records to a group in source-offset order; a retried
# cycle forwards a stretch of them again. So a group sees, per source partition, a sequence of
# rising runs that may restart lower; exactly the first copy of every record must be taken.
copies = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 30), st.integers(1, 12)),
                  min_size=1, max_size=12)


@settings(max_examples=examples(150), deadline=None)
@given(runs=copies, marks=st.dictionaries(st.tuples(st.integers(0, 2), st.integers(0, 2)), st.integers(-1, 20)))
def test_each_forwarded_record_is_taken_once(runs: list[tuple[int, int, int, int]],
                                             marks: dict[tuple[int, int], int]) -> None:
    j = job()
    buf = RecordBuffer()
    by_key = 0
    for group, partition, start, length in runs:  # (group, source partition, first offset, records)
        for offset in range(start, start + length):
            key = next(k for k in range(10_000) if home(k) == group)
            origin = [(H_ORIGIN_PARTITION, str(partition).encode()), (H_ORIGIN_OFFSET, str(offset).encode())]
            msg = Msg("in.r.by-key", group, by_key, json.dumps({"k": key, "ts": offset}).encode(), origin)
            buf.add_forwarded(msg)  # type: ignore[arg-type]
            by_key += 1
    routed = {}
    for (group, partition), mark in marks.items():
        routed.setdefault(group, {})[partition] = mark
    slices = decode_by_group(j, 0, buf, routing_for(j, PARTITIONS), routed)
    expected: dict[int, set[tuple[int, int]]] = {}
    seen = {k: v for k, v in marks.items()}
    for group, partition, start, length in runs:
        for offset in range(start, start + length):
            if offset > seen.get((group, partition), -1):
                expected.setdefault(group, set()).add((partition, offset))
                seen[(group, partition)] = offset
    for group, slice_ in slices.items():
        taken = list(zip(slice_.block[PART].tolist(), slice_.block[OFF].tolist()))
        assert len(taken) == len(set(taken))
        assert set(taken) == expected.get(group, set())
        newest = {p: o for (g, p), o in seen.items() if g == group}
        assert slice_.routed == {p: o for p, o in newest.items() if p in slice_.routed}
        assert slice_.duplicates == sum(length for g, *_, length in runs if g == group) - len(taken)


def test_backlog_is_fetched_bytes_plus_the_lag_priced_at_the_mean_record() -> None:
    from streamjoin.services.hash.backlog import RecordSize, backlog_bytes

    size = RecordSize()
    assert backlog_bytes({}, 1000, size) == 0  # no record seen yet: the lag has no price
    seen = RecordBuffer()
    for offset, value in enumerate([b"x" * 10, b"y" * 30, None]):  # a tombstone weighs nothing
        seen.add(Msg("in.r", 0, offset, value), 0)  # type: ignore[arg-type]
    size.observe({0: seen})
    assert size.mean == 40 / 3
    waiting = RecordBuffer()
    waiting.add(Msg("in.s", 1, 0, b"z" * 7), 1)  # type: ignore[arg-type]
    assert backlog_bytes({1: waiting}, 3, size) == 7 + 40
