"""Outer, semi and anti joins through the RocksDB state layer: the matched marks a
batch stores survive a restart (the window read back from disk), so a run with
restarts emits exactly what an uninterrupted run does, and marks records go
away with the tuples they name."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.outer import DECIDED
from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.hash.main import Worker
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.settings import load
from streamjoin.state.partition import checkpoint_key, marks_prefix
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from streamjoin.topology.partitioner import partition_for
from tests.unit.test_changelog import _Log

GROUP = 3
KEYS = tuple(k for k in range(4000) if partition_for(key_bytes(k), 60) == GROUP)[:6]


def _job(tmp_path: Path, join_type: str, rows: bool, idle_timeout_ms: int | None = None):
    windows = [{"rows": 2}, {"range_ms": 60}] if rows else [{"range_ms": 60}, {"range_ms": 40}]
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": w} for n, w in zip("rs", windows)]
    return load(None, job="oj", streams=streams, join={"allowed_lateness_ms": 5, "type": join_type,
                                                         "idle_timeout_ms": idle_timeout_ms},
                worker={"state_dir": str(tmp_path), "memory_bytes": 1 << 30})


def _batches(seed: int, count: int) -> list[list[tuple[int, int, int]]]:
    """`count` batches of (stream, key, ts), time moving forward with some disorder."""
    rng = random.Random(seed)
    out, clock = [], 1000
    for _ in range(count):
        batch = []
        for _ in range(rng.randint(0, 8)):
            clock += rng.randint(0, 6)
            stream = rng.randint(0, 1)
            # r's keys and s's overlap in part, so each side has rows no partner ever joins.
            batch.append((stream, rng.choice(KEYS[stream:stream + 5]), clock - rng.randint(0, 4)))
        out.append(batch)
    return out


def _buffers(job, batch: list[tuple[int, int, int]], offsets: list[int]) -> dict[int, RecordBuffer]:  # type: ignore[no-untyped-def]
    """A batch's (stream, key, ts) rows as JSON records of group GROUP, per stream, at the next
    `offsets` (advanced)."""
    buffers = {i: RecordBuffer() for i in (0, 1)}
    for stream, key, ts in batch:
        value = json.dumps({"k": key, "ts": ts}).encode()
        buffers[stream].add(LocalRecord(job.topic_of(job.streams[stream]), GROUP, offsets[stream],
                                        str(key).encode(), value, ts), GROUP)  # type: ignore[arg-type]
        offsets[stream] += 1
    return buffers


def _run(job, db: Path, batches: list, restart_at: set[int],
         log: _Log | None = None) -> tuple[list[tuple], WindowedStore]:
    """Every batch through run_cycle and the store; before each batch in `restart_at` the
    group is read back: from the store's disk, or with `log` (its changelog) rebuilt in a
    fresh store from the checkpoint's low mark, as a migration does. Returns the emitted
    (r ref, s ref) pairs and the last store."""
    plan = join_plan(job)
    store = WindowedStore(Store(db), plan, stream_templates(job), 1 << 30, changelog=log is not None)
    offsets, emitted = [0, 0], []
    for n, batch in enumerate(batches + [[]]):
        if n in restart_at and log is None:
            store.rocksdb.close()
            store = WindowedStore(Store(db), plan, stream_templates(job), 1 << 30)
        elif n in restart_at:
            store = _moved(job, store, log, db / str(n))
        buffers = _buffers(job, batch, offsets)
        # The last batch has no records: a floor far ahead decides every open row (an idle timeout would).
        floors = {GROUP: 10**6} if n == len(batches) else None
        (done,) = run_cycle(job, plan, store, buffers, [routing_for(job, job.partitions)] * 2, now_ms=0,
                            extra=[GROUP], floors=floors)
        tx = store.rocksdb.transaction()
        store.stage(tx, GROUP, done.state, done.appended, done.marks)
        tx.commit()
        if log is not None:
            done.state.logged_at(log.commit(tx.writes), len(log.records))
        res = done.results
        emitted += list(zip(res["r.partition"].tolist(), res["r.offset"].tolist(),
                            res["s.partition"].tolist(), res["s.offset"].tolist()))
    return emitted, store


def _moved(job, store: WindowedStore, log: _Log, path: Path) -> WindowedStore:
    """The group rebuilt from `log` in a fresh store under `path` (the old one is dropped)."""
    state = store.get(GROUP)
    last = max(i for i, r in enumerate(log.records) if r is not None and r[0] == checkpoint_key(GROUP))
    image = log.rebuild(state.checkpoint.changelog_low, last)
    store.rocksdb.close()
    fresh = WindowedStore(Store(path), store.plan, stream_templates(job), 1 << 30, changelog=True)
    fresh.install(GROUP, image.values(), image.offsets, len(log.records))
    return fresh


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("join_type", ["left", "right", "full", "semi", "anti"])
def test_restarts_emit_what_an_uninterrupted_run_does(tmp_path: Path, join_type: str, rows: bool) -> None:
    for seed in range(2):
        job = _job(tmp_path, join_type, rows)
        batches = _batches(seed, 30)
        straight, _ = _run(job, tmp_path / f"a{seed}", batches, set())
        restarts = set(random.Random(seed).sample(range(1, 31), 6))
        restarted, store = _run(job, tmp_path / f"b{seed}", batches, restarts)
        assert sorted(restarted) == sorted(straight) and len(set(straight)) == len(straight)
        padded = [r for r in straight if ABSENT in r]
        assert padded or join_type == "semi" and not straight  # the workload does decide rows
        # Time windows: every row is decided at the end, so no marks record is left over (a
        # count window's newest rows per key stay open: a partner may still come for them).
        left_over = sum(len(list(store.rocksdb.scan(marks_prefix(GROUP, i)))) for i in DECIDED[join_type])
        assert left_over == 0 or any(job.streams[i].window.is_rows for i in DECIDED[join_type])
        store.rocksdb.close()


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("join_type", ["full", "semi", "anti"])
def test_a_group_rebuilt_from_its_changelog_keeps_its_matches(tmp_path: Path, join_type: str, rows: bool) -> None:
    """Migration's path: the group rebuilt in a fresh store from its changelog, read from the
    checkpoint's low mark only, emits what an uninterrupted run does."""
    for seed in range(2):
        job = _job(tmp_path, join_type, rows)
        batches = _batches(seed, 30)
        straight, _ = _run(job, tmp_path / f"a{seed}", batches, set())
        restarts = set(random.Random(seed).sample(range(1, 31), 5))
        moved, store = _run(job, tmp_path / f"b{seed}", batches, restarts, _Log())
        assert sorted(moved) == sorted(straight)
        store.rocksdb.close()


def test_an_all_idle_group_is_woken_by_the_wall_clock_once_a_row_is_due(tmp_path: Path) -> None:
    """join.idle_timeout_ms, every stream of a group silent: the worker gives the group a batch
    with the floor now - idle_timeout_ms - lateness once its oldest open row's deadline is
    behind it (not before: a batch per idle group per cycle would cost for nothing), also when
    the group was pushed to disk, and that batch emits the row null-padded."""
    job = _job(tmp_path, "left", rows=False, idle_timeout_ms=1000)
    plan = join_plan(job)
    store = WindowedStore(Store(tmp_path / "db2"), plan, stream_templates(job), 1 << 30)
    worker = SimpleNamespace(job=job, store=store, plan=plan, groups={GROUP})
    buffers = {0: RecordBuffer(), 1: RecordBuffer()}
    buffers[0].add(LocalRecord(job.topic_of(job.streams[0]), GROUP, 0, str(KEYS[0]).encode(),
                               json.dumps({"k": KEYS[0], "ts": 1000}).encode(), 1000), GROUP)  # type: ignore[arg-type]
    (first,) = run_cycle(job, plan, store, buffers, [routing_for(job, job.partitions)] * 2, now_ms=0)
    tx = store.rocksdb.transaction()
    store.stage(tx, GROUP, first.state, first.appended, first.marks)
    tx.commit()
    # Probe spill pushes the idle group to disk (an idle group is the least recently used): it
    # must still be woken, by the deadline it left memory with, and read back for its batch.
    assert store.push(1, now_ms=0) and GROUP not in store.hot_groups()
    both_idle = {GROUP: frozenset({0, 1})}
    deadline_wall = 1000 + 60 + 1000 + 5  # ts + W, seen through now - idle_timeout_ms - lateness
    assert Worker._wall_clock_floors(worker, both_idle, deadline_wall - 1) == {}
    assert Worker._wall_clock_floors(worker, {GROUP: frozenset({1})}, deadline_wall) == {}  # r is not idle
    floors = Worker._wall_clock_floors(worker, both_idle, deadline_wall)
    assert floors == {GROUP: 1060}
    (done,) = run_cycle(job, plan, store, {}, [routing_for(job, job.partitions)] * 2, now_ms=deadline_wall,
                        idle=both_idle, extra=[GROUP], floors=floors)
    assert done.unmatched == 1 and done.results["s.partition"].tolist() == [ABSENT]
    assert Worker._wall_clock_floors(worker, both_idle, deadline_wall + 10_000) == {}  # nothing open any more
