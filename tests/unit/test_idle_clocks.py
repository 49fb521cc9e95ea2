"""join.idle_timeout_ms across a restart: each group's checkpoint records, per stream, the wall
clock of the last batch that read a record of it, and a worker that takes the group (restarted,
or its new owner after a move) counts the stream's silence from there. A stream silent for the
whole timeout before the restart is idle at the worker's first look, not a whole timeout later;
a stream with records left to read is not idle, however old its clock."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.window_join import NO_TIME
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.hash.main import Worker
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.settings import load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore

GROUP, IDLE_MS = 2, 1000


def _job(tmp_path: Path, idle_timeout_ms: int | None = IDLE_MS):
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 60}} for n in "rs"]
    return load(None, job="idle", streams=streams, partitions=4,
                join={"type": "left", "allowed_lateness_ms": 5, "idle_timeout_ms": idle_timeout_ms},
                worker={"state_dir": str(tmp_path), "memory_bytes": 1 << 30})


def _batch(job, store: WindowedStore, now_ms: int, streams: list[int], offset: int) -> None:
    """One committed batch of `group` at wall clock `now_ms` with a record of each of `streams`."""
    buffers = {i: RecordBuffer() for i in (0, 1)}
    for i in streams:
        buffers[i].add(LocalRecord(job.topic_of(job.streams[i]), GROUP, offset, b"1",  # type: ignore[arg-type]
                                   json.dumps({"k": 1, "ts": 1000 + offset}).encode(), 1000 + offset), GROUP)
    (done,) = run_cycle(job, store.plan, store, buffers, [routing_for(job, job.partitions)] * 2, now_ms=now_ms,
                        extra=[GROUP])
    tx = store.rocksdb.transaction()
    store.stage(tx, GROUP, done.state, done.appended, done.marks)
    tx.commit()


def _store(job, path: Path) -> WindowedStore:
    return WindowedStore(Store(path), join_plan(job), stream_templates(job), 1 << 30)


def _worker(job, store: WindowedStore, unread: set[tuple[str, int]]) -> SimpleNamespace:
    """What Worker._restore_idle_clocks and Worker._idle read of a worker owning GROUP whose
    consumer has `unread` partitions (records past its position)."""
    w = SimpleNamespace(job=job, store=store, worker_id="w0", heard={}, listened_ms=0, pending={}, idle_seen={},
                        _unread=lambda tps: set(tps) & unread)
    w._source_partitions = lambda g, i: [(job.topic_of(job.streams[i]), g)]
    return w


def test_a_batch_records_the_wall_clock_of_each_stream_it_read(tmp_path: Path) -> None:
    job = _job(tmp_path)
    store = _store(job, tmp_path / "db")
    _batch(job, store, 5_000, [0], 0)
    assert store.get(GROUP).checkpoint.heard_ms == [5_000, NO_TIME]
    _batch(job, store, 7_000, [1], 1)
    _batch(job, store, 9_000, [], 2)  # a batch of no records (an idle stream moved the watermark)
    assert store.get(GROUP).checkpoint.heard_ms == [5_000, 7_000]
    store.rocksdb.close()
    assert _store(job, tmp_path / "db").get(GROUP).checkpoint.heard_ms == [5_000, 7_000]  # on disk
    without = _job(tmp_path, idle_timeout_ms=None)
    other = _store(without, tmp_path / "db2")
    _batch(without, other, 5_000, [0], 0)
    assert other.get(GROUP).checkpoint.heard_ms == []  # no timeout: nothing to keep


def test_a_restarted_worker_counts_silence_from_the_checkpoint_not_from_its_start(tmp_path: Path) -> None:
    job = _job(tmp_path)
    store = _store(job, tmp_path / "db")
    _batch(job, store, 5_000, [0, 1], 0)
    _batch(job, store, 7_000, [0], 1)  # s silent since 5 000, r since 7 000
    store.rocksdb.close()
    restarted = _store(job, tmp_path / "db")  # the worker restarts at 7 500 and takes the group back

    worker = _worker(job, restarted, unread=set())
    Worker._restore_idle_clocks(worker, {GROUP}, 7_500)
    worker.listened_ms = 7_500
    assert worker.heard[GROUP].tolist() == [7_000, 5_000]
    idle, woken = Worker._idle(worker, 7_600)
    assert idle == {GROUP: frozenset({1})} and woken == [GROUP]  # s: 2.6 s silent, r: 0.6 s
    idle, _ = Worker._idle(worker, 8_000)
    assert idle == {GROUP: frozenset({0, 1})}

    # Unread input is not silence: with s's partition holding records past the consumer's
    # position, the old clock does not make it idle.
    busy = _worker(job, restarted, unread={(job.topic_of(job.streams[1]), GROUP)})
    Worker._restore_idle_clocks(busy, {GROUP}, 7_500)
    busy.listened_ms = 7_500
    assert Worker._idle(busy, 7_600)[0] == {}

    # A group whose checkpoint never heard a stream counts that stream from the restart.
    fresh = _store(job, tmp_path / "db3")
    _batch(job, fresh, 5_000, [0], 0)
    worker = _worker(job, fresh, unread=set())
    Worker._restore_idle_clocks(worker, {GROUP}, 7_500)
    assert worker.heard[GROUP].tolist() == [5_000, 7_500]
    assert np.all(worker.heard[GROUP] <= 7_500)
    restarted.rocksdb.close()
    fresh.rocksdb.close()
