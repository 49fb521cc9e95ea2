"""State any worker can load (services/hash/restore.py) on the embedded broker: a
worker with an empty disk rebuilds groups another worker wrote from the changelog, equal
to the writer's windows, reading records in proportion to the window and not to the
job's age. Restore times are printed for the log; the assertions are on records read."""

from __future__ import annotations

import random
import time
from pathlib import Path

from streamjoin.launcher import input_end_offsets
from streamjoin.services import metrics
from streamjoin.services.io import kafka
from streamjoin.services.hash.main import Worker
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash import restore
from streamjoin.services.hash.restore import restore_groups
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from streamjoin.topology import topics
from tests.integration.conftest import stream
from tests.integration.fleet_harness import take_through
from tests.integration.kafka_harness import Row, produce

import pytest

pytestmark = pytest.mark.integration

GROUPS = 2
CHUNK_MS = 500  # event time per produced chunk; one worker cycle per chunk
AGES = (3, 9)  # chunks produced when the state is restored elsewhere
WINDOWS_MS = (500, 2000)  # one chunk of event time, four


def _job(bootstrap: str, tmp_path: Path, window_ms: int) -> JobSettings:
    return load(None, job=f"restore{window_ms}", bootstrap=bootstrap, partitions=GROUPS,
                streams=[stream(n, {"range_ms": window_ms}) for n in "rs"], join={"allowed_lateness_ms": 0},
                worker={"state_dir": str(tmp_path / f"state{window_ms}")})


def _chunk(n: int, rnd: random.Random) -> list[Row]:
    return [Row("rs"[i % 2], rnd.randrange(10), 10_000 + n * CHUNK_MS + i * CHUNK_MS // 100) for i in range(100)]


def _windows(store: WindowedStore) -> list[list[list[tuple]]]:
    return [[sorted(zip(b["_key"].tolist(), b["_ts"].tolist(), b["_off"].tolist()))
             for b in store.get(g).window.state] for g in range(GROUPS)]


def _restore_elsewhere(job: JobSettings, cluster: kafka.Cluster, writer: Worker, path: Path) -> int:
    """Rebuild every group on an empty store at `path`; check it equals `writer`'s; the records read."""
    fresh = WindowedStore(Store(path), writer.plan, stream_templates(job), 1 << 30)
    before = metrics.REGISTRY.get_sample_value("streamjoin_changelog_records_total", {"op": "read"}) or 0.0
    started = time.perf_counter()
    try:
        assert restore_groups(job, cluster, fresh, list(range(GROUPS))) == list(range(GROUPS))
        seconds = time.perf_counter() - started
        assert _windows(fresh) == _windows(writer.store)
        assert [fresh.get(g).checkpoint for g in range(GROUPS)] == [writer.store.get(g).checkpoint
                                                                     for g in range(GROUPS)]
    finally:
        fresh.rocksdb.close()
    read = int(metrics.REGISTRY.get_sample_value("streamjoin_changelog_records_total", {"op": "read"}) - before)
    print(f"restore: window {job.streams[0].window.range_ms} ms, {writer.store.get(0).checkpoint.seq} batches: "
          f"{read} changelog records in {seconds * 1000:.0f} ms")
    return read


def test_restore_reads_grow_with_the_window_not_with_the_jobs_age(broker, tmp_path: Path, monkeypatch) -> None:
    """The short window is rebuilt from the tail read to find the checkpoint; for the long one
    the first look-back is cut to 4 records, so the search widens and the low mark lies
    before the tail (a second read): both ways give the writer's windows."""
    reads: dict[tuple[int, int], int] = {}
    for window_ms in WINDOWS_MS:
        monkeypatch.setattr(restore, "TAIL_RECORDS", 64 if window_ms == WINDOWS_MS[0] else 4)
        job = _job(broker.bootstrap, tmp_path, window_ms)
        cluster = kafka.Cluster.of(job)
        topics.ensure(cluster.admin(), job)
        writer = Worker(job, cluster, "writer")
        writer.routings = writer._routings()
        writer.emitter.start()
        writer.groups = set(range(GROUPS))
        writer.consumer.assign(writer._partitions(writer.groups))
        rnd = random.Random(window_ms)
        try:
            for n in range(1, max(AGES) + 1):
                produce(job, broker.bootstrap, _chunk(n, rnd))
                take_through(writer, input_end_offsets(job, broker.bootstrap))
                writer._cycle()
                if n in AGES:
                    reads[(window_ms, n)] = _restore_elsewhere(job, cluster, writer, tmp_path / f"fresh{window_ms}-{n}")
        finally:
            writer.consumer.close()
            writer.store.rocksdb.close()
    young, old = reads[(WINDOWS_MS[0], AGES[0])], reads[(WINDOWS_MS[0], AGES[1])]
    assert 0 < old <= 1.5 * young, reads  # three times the age, about the same reading
    assert reads[(WINDOWS_MS[1], AGES[1])] >= 2 * old, reads  # four times the window, more than twice the reading
