"""The query service's source index on a real broker: with no sample old enough (a service
just restarted), a version's start offsets come from a search of the record timestamps."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.queries.source_index import SourceIndex
from streamjoin.settings import load
from streamjoin.topology import topics

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000


def test_with_no_sample_the_index_searches_record_timestamps(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    job = load(None, job="ix", bootstrap=broker.bootstrap, partitions=2, streams=[
        {"name": name, "topic": f"ix.{name}", "fields": {"k": "int", "ts": "int"}, "time_field": "ts",
         "key_fields": ["k"], "window": {"range_ms": 1000}} for name in ("r", "s")])
    cluster = kafka.Cluster(broker.bootstrap)
    topics.create_missing(cluster.admin(), [p for p in topics.plan(job) if p.role == "input"])
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    # ix.s stays empty; ix.r partition 0: 500 records a second apart; partition 1: 37, with a stretch of equal stamps
    stamps = {0: [BASE_MS + 1000 * n for n in range(500)],
              1: sorted([BASE_MS + 1000 * (n // 3) for n in range(37)])}
    for partition, times in stamps.items():
        for n, stamp in enumerate(times):
            producer.produce("ix.r", b"{}", partition=partition, timestamp=stamp)
            if n % 50 == 0:
                producer.flush(10)  # several batches, so the search crosses batch boundaries
    producer.flush(10)
    index = SourceIndex(job, cluster)
    for wall_ms in (BASE_MS - 1, BASE_MS, BASE_MS + 1, BASE_MS + 7_000, BASE_MS + 7_500, BASE_MS + 499_000,
                    BASE_MS + 10**9):
        want = {p: sum(stamp < wall_ms for stamp in times) for p, times in stamps.items()}
        assert index.offsets_before(wall_ms) == {"ix.r": want, "ix.s": {0: 0, 1: 0}}, wall_ms
    index.sample()  # once a sample is as old as asked for, it answers (no search)
    index.consumer.close()  # so that a search would fail loudly
    sample = index.samples[0]
    assert index.offsets_before(index.times[0]) is sample
    # ListOffsets may answer short of the end (Tansu), which only starts a version earlier
    assert 0 < sample["ix.r"][0] <= 500 and 0 < sample["ix.r"][1] <= 37
