"""The RocksDB state layer: a window restored from disk equals the one in
memory, blocks with no live tuple are deleted, and cold groups leave memory
but come back intact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from streamjoin.bench.local_records import LocalRecord
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.state.partition import seq_of, window_prefix
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction
from streamjoin.state.windowed import BLOCK_SEQ, WindowedStore
from streamjoin.settings import load
from streamjoin.topology.partitioner import partition_for


GROUP = 3
# Join keys that Kafka's murmur2 partitioner puts in partition GROUP of 60, so no tuple is re-routed.
KEYS = tuple(k for k in range(2000) if partition_for(key_bytes(k), 60) == GROUP)[:3]


def _job(tmp_path: Path, rows: bool = False):
    window = {"rows": 2} if rows else {"range_ms": 100}
    streams = [{"name": n, "fields": {"k": "int", "ts": "int", "pad": "str"}, "time_field": "ts",
                "key_fields": ["k"], "window": window} for n in "rs"]
    return load(None, job="st", streams=streams, join={"allowed_lateness_ms": 0},
                worker={"state_dir": str(tmp_path), "memory_bytes": 1})


def _feed(job, store: WindowedStore, group: int, batches: int,
          after_each: Callable[[WindowedStore, StateTransaction], None] = lambda store, tx: None) -> None:
    """Run `batches` batches of 20 tuples through `group` and stage each; `after_each(store, tx)`
    is called once a batch's state transaction is committed."""
    plan = join_plan(job)
    offset = {0: 0, 1: 0}
    for n in range(batches):
        buffers = {i: RecordBuffer() for i in (0, 1)}
        for j in range(20):
            i = j % 2
            key, ts = KEYS[j % 3], 1000 + n * 40 + j
            value = json.dumps({"k": key, "ts": ts, "pad": "x"}).encode()
            record = LocalRecord("st.r", GROUP, offset[i], str(key).encode(), value, ts)
            buffers[i].add(record, GROUP)  # type: ignore[arg-type]
            offset[i] += 1
        (gb,) = run_cycle(job, plan, store, buffers, [routing_for(job, job.partitions)] * 2, now_ms=0)
        assert gb.group == group
        tx = store.rocksdb.transaction()
        store.stage(tx, group, gb.state, gb.appended)
        tx.commit()
        after_each(store, tx)


def _snapshot(window) -> list[list[tuple]]:
    return [sorted(zip(b["_key"].tolist(), b["_ts"].tolist(), b["_off"].tolist())) for b in window.state]


def test_restored_window_equals_memory_and_dead_blocks_are_deleted(tmp_path: Path) -> None:
    for rows in (False, True):
        job = _job(tmp_path / str(rows), rows)
        store = WindowedStore(Store(tmp_path / str(rows) / "db"), join_plan(job), stream_templates(job), 1 << 30)
        _feed(job, store, group=GROUP, batches=12)
        live = store.get(3)
        assert live.window.tuples > 0
        stored_blocks = [len(list(store.rocksdb.scan(window_prefix(3, i)))) for i in (0, 1)]
        assert 0 < max(stored_blocks) < 12  # expired batches' blocks are gone, live ones kept
        expected, ckpt = _snapshot(live.window), live.checkpoint
        store.rocksdb.close()

        reopened = WindowedStore(Store(tmp_path / str(rows) / "db"), join_plan(job), stream_templates(job), 1 << 30)
        restored = reopened.get(3)
        assert _snapshot(restored.window) == expected
        assert restored.checkpoint == ckpt and restored.checkpoint.seq == 12
        assert restored.window.watermark == live.window.watermark
        reopened.rocksdb.close()


def test_cold_groups_are_evicted_and_reloaded(tmp_path: Path) -> None:
    job = _job(tmp_path)
    store = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), memory_bytes=1)
    _feed(job, store, group=GROUP, batches=3)
    before = _snapshot(store.get(3).window)
    store.push(store.hot_size, now_ms=0)
    assert store.hot_groups() == {} and store.hot_size == 0
    assert _snapshot(store.get(3).window) == before
    assert np.all(store.get(3).window.state[0][BLOCK_SEQ] >= 1)


def test_group_bytes_are_each_groups_window_hot_or_cold(tmp_path: Path) -> None:
    job = _job(tmp_path)
    store = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), memory_bytes=1)
    assert store.group_bytes({GROUP, 7}) == {GROUP: 0, 7: 0}  # nothing read yet
    _feed(job, store, group=GROUP, batches=3)
    size = store.get(GROUP).window.nbytes
    assert size > 0 and store.group_bytes({GROUP}) == {GROUP: size}
    store.push(store.hot_size, now_ms=0)
    assert store.group_bytes({GROUP}) == {GROUP: size}  # evicted to RocksDB, still counted
    store.forget(GROUP)
    assert store.group_bytes({GROUP}) == {GROUP: 0}  # no longer owned
    store.rocksdb.close()
    reopened = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), memory_bytes=1)
    reopened.get(GROUP)
    assert reopened.group_bytes({GROUP}) == {GROUP: size}  # a restored window reports its size
    reopened.rocksdb.close()


def test_a_stored_block_lives_exactly_while_one_of_its_tuples_does(tmp_path: Path) -> None:
    """Time windows find dead blocks by their newest time, count windows by their live tuples:
    either way the blocks on disk are those some live tuple came from, after every batch."""
    def blocks_match_live_tuples(store: WindowedStore, _: StateTransaction) -> None:
        state = store.get(GROUP)
        for i in (0, 1):
            on_disk = {seq_of(k) for k, _ in store.rocksdb.scan(window_prefix(GROUP, i))}
            assert on_disk == set(state.stored[i]) == set(state.window.state[i][BLOCK_SEQ].tolist())

    for rows in (False, True):
        job = _job(tmp_path / str(rows), rows)
        store = WindowedStore(Store(tmp_path / str(rows) / "db"), join_plan(job), stream_templates(job), 1 << 30)
        _feed(job, store, GROUP, batches=12, after_each=blocks_match_live_tuples)
        store.rocksdb.close()
