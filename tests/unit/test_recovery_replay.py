"""Recovery's replay of a batch (services/hash/recovery.py) against a fake consumer: a batch
that read a by-key partition written in transactions recorded, as its boundary there, the
consumer's position past the commit marker after its last record; the replay reads the same
records and must end at that same boundary, or recovery stops on "did not reach its recorded
boundary" and the restarted worker never gets past the batch."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import TopicPartition

from streamjoin.services.hash import recovery
from streamjoin.services.io.intake import H_ORIGIN_OFFSET, H_ORIGIN_PARTITION, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.services.io.progress_notes import NOTE_HEADER
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_intake import Msg

NOW = 10_000_000


class Record(Msg):
    def error(self) -> None:
        return None


@dataclass
class Log:
    """One partition: its records by offset; offsets without one are commit markers."""

    records: dict[int, Record]
    end: int


class FakeConsumer:
    """librdkafka's read_committed positions as a replay meets them: a consume() hands out the
    records and leaves the position after the last one; only a later fetch moves it over the
    commit markers behind them."""

    def __init__(self, logs: dict[tuple[str, int], Log]) -> None:
        self.logs, self.at = logs, {}  # type: dict[tuple[str, int], Log], dict[tuple[str, int], int]

    def assign(self, tps: list[TopicPartition]) -> None:
        self.at = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in tps}

    def consume(self, _n: int, _timeout: float) -> list[Record]:
        out = []
        for key, at in self.at.items():
            log = self.logs[key]
            mine = [log.records[o] for o in range(at, log.end) if o in log.records]
            self.at[key] = mine[-1].offset() + 1 if mine else log.end
            out += mine
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at[(tp.topic, tp.partition)]) for tp in tps]

    def close(self) -> None:
        pass


class FakeCluster:
    def __init__(self, logs: dict[tuple[str, int], Log]) -> None:
        self.logs = logs

    def consumer(self, _group: str, **_extra: object) -> FakeConsumer:
        return FakeConsumer(self.logs)


def _job() -> JobSettings:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 1_000}} for n in "rs"]
    return load(None, job="rp", partitions=2, streams=streams,
                join={"allowed_lateness_ms": 100, "max_future_ms": None, "max_read_ahead_ms": None,
                      "repartition_watermarks": True})


def test_a_replayed_batch_ends_past_the_commit_marker_its_live_batch_ended_past() -> None:
    job = _job()
    r, s = job.streams
    source, by_key = job.topic_of(r), job.by_key_topic(r)
    row = lambda k, ts: json.dumps({"k": k, "ts": ts}).encode()  # noqa: E731
    forward = Record(by_key, 0, 0, row(4, NOW - 50), [(H_ORIGIN_PARTITION, b"1"), (H_ORIGIN_OFFSET, b"7")])
    note = Record(by_key, 0, 1, json.dumps({"newest": {"1": NOW - 40}, "idle": []}).encode(), [(NOTE_HEADER, b"1")])
    logs = {
        (source, 0): Log({o: Record(source, 0, o, row(o, NOW - 100 + o)) for o in range(3)}, 3),
        # the forward and the note were written in one transaction: its commit marker sits at offset 2
        (by_key, 0): Log({0: forward, 1: note}, 3),
        (job.topic_of(s), 0): Log({0: Record(job.topic_of(s), 0, 0, row(4, NOW - 60))}, 1),
    }
    recorded = {source: {0: 3}, by_key: {0: 3}, job.topic_of(s): {0: 1}}  # the live batch's boundary
    buffers = recovery._read_inputs(job, FakeCluster(logs), 0, {}, recorded)  # type: ignore[arg-type]
    plan = join_plan(job)
    with tempfile.TemporaryDirectory() as tmp:
        store = WindowedStore(Store(Path(tmp) / "db"), plan, stream_templates(job), 1 << 30)
        try:
            replayed = run_cycle(job, plan, store, buffers, [routing_for(job, job.partitions)] * 2, NOW, extra=[0])
        finally:
            store.rocksdb.close()
    assert [b.group for b in replayed] == [0]
    assert replayed[0].end == recorded
