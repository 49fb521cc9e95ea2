"""Tumbling and hopping window joins through the hash worker's batch function and the RocksDB
state layer: copies made before the join are what the window stores, so a run read back from
disk or rebuilt from its changelog emits what an uninterrupted run does, and that is the
plain-Python reference's answer (per instance, results naming it); late records are dead
letters once each, and tuple counts and hot keys see source tuples, not copies."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamjoin.engine.block import KEY
from streamjoin.engine.reference import RefTuple, reference_window_join
from streamjoin.engine.result_ids import ABSENT, RESULT_ID_HI, RESULT_ID_LO, WINDOW_START, result_ids
from streamjoin.services.hash.processor import group_store, join_plan, run_cycle
from streamjoin.services.io.intake import routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.settings import load
from streamjoin.state.partition import checkpoint_key
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_changelog import _Log
from tests.unit.test_outer_state import GROUP, KEYS, _batches, _buffers

pytestmark = pytest.mark.unit

FLOOR = 10**6  # the last batch's watermark floor: every open row decided


def _job(tmp_path: Path, join_type: str, window: dict, **worker: object):
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": window} for n in "rs"]
    return load(None, job="wj", streams=streams, join={"allowed_lateness_ms": 5, "type": join_type},
                worker={"state_dir": str(tmp_path), "memory_bytes": 1 << 30, **worker})


def _run(job, db: Path, batches: list, restart_at: set[int], log: _Log | None = None):
    """Every batch through run_cycle and the store (restarts and changelog moves as in
    test_outer_state). Returns the results as (window start, r ref, s ref), the dead letters
    as (stream, partition, offset), the tuples counted in, and the last store."""
    plan = join_plan(job)
    store = group_store(job, plan, Store(db), stream_templates(job))
    offsets, emitted, dead, taken = [0, 0], [], [], 0
    for n, batch in enumerate(batches + [[]]):
        if n in restart_at and log is None:
            store.rocksdb.close()
            store = group_store(job, plan, Store(db), stream_templates(job))
        elif n in restart_at:
            store = _moved(job, store, log, db / str(n))
        floors = {GROUP: FLOOR} if n == len(batches) else None
        (done,) = run_cycle(job, plan, store, _buffers(job, batch, offsets), [routing_for(job, job.partitions)] * 2,
                            now_ms=0, extra=[GROUP], floors=floors)
        tx = store.rocksdb.transaction()
        store.stage(tx, GROUP, done.state, done.appended, done.marks)
        tx.commit()
        store.keep_budget(0)  # a budget of a byte (deferred spill): every batch's window is pushed
        if log is not None:
            done.state.logged_at(log.commit(tx.writes), len(log.records))
        res = done.results
        parts, offs = [res["r.partition"], res["s.partition"]], [res["r.offset"], res["s.offset"]]
        hi, lo = result_ids(job.input_topics, parts, offs, res[WINDOW_START])
        assert (hi == res[RESULT_ID_HI]).all() and (lo == res[RESULT_ID_LO]).all()
        emitted += list(zip(res[WINDOW_START].tolist(), parts[0].tolist(), offs[0].tolist(), parts[1].tolist(),
                            offs[1].tolist()))
        dead += [(d.stream, d.partition, d.offset) for d in done.dead]
        taken += sum(len(b) for b in done.tuples_taken)
    return emitted, dead, taken, store


def _moved(job, store: WindowedStore, log: _Log, path: Path) -> WindowedStore:
    """The group rebuilt from `log` in a fresh store under `path`, as a migration does."""
    state = store.get(GROUP)
    last = max(i for i, r in enumerate(log.records) if r is not None and r[0] == checkpoint_key(GROUP))
    image = log.rebuild(state.checkpoint.changelog_low, last)
    store.rocksdb.close()
    fresh = group_store(job, store.plan, Store(path), stream_templates(job))
    fresh.changelog = True
    fresh.install(GROUP, image.values(), image.offsets, len(log.records))
    return fresh


def _expected(job, batches: list, dead: list[tuple[int, int, int]]) -> set[tuple]:
    """The reference's results of the batches' on-time tuples, as _run's tuples."""
    size, slide = job.window_instance
    late = {(s, o) for s, _, o in dead}
    streams: list[list[RefTuple]] = [[], []]
    offsets = [0, 0]
    for batch in batches:
        for stream, key, ts in batch:
            if (stream, offsets[stream]) not in late:
                streams[stream].append(RefTuple((job.input_topics[stream], GROUP, offsets[stream]), key, ts))
            offsets[stream] += 1
    out = reference_window_join(streams, size, slide, job.join.type, job.input_topics, {GROUP: FLOOR})
    return {(start, *(x for ref in refs for x in ref[1:])) for start, *refs in out}


WINDOWS = [{"tumbling_ms": 30}, {"hopping_ms": 40, "slide_ms": 15}]


# Every join type once, hopping for those whose rows are decided per instance (the engine's
# property tests cover every type with both windows; this is about state surviving restarts).
@pytest.mark.parametrize("window, join_type", [(WINDOWS[0], "inner"), (WINDOWS[0], "semi"), (WINDOWS[1], "left"),
                                               (WINDOWS[1], "full"), (WINDOWS[1], "anti")],
                         ids=["tumbling-inner", "tumbling-semi", "hopping-left", "hopping-full", "hopping-anti"])
def test_restarts_and_moves_emit_the_reference(tmp_path: Path, join_type: str, window: dict) -> None:
    for seed in range(2):
        job = _job(tmp_path, join_type, window)
        batches = _batches(seed, 30)
        straight, dead, _, store = _run(job, tmp_path / f"a{seed}", batches, set())
        store.rocksdb.close()
        assert len(set(straight)) == len(straight)
        assert set(straight) == _expected(job, batches, dead)
        assert join_type in ("inner", "semi") or any(ABSENT in r for r in straight)
        restarts = set(random.Random(seed).sample(range(1, 31), 6))
        restarted, _, _, store = _run(job, tmp_path / f"b{seed}", batches, restarts)
        store.rocksdb.close()
        moved, _, _, store = _run(job, tmp_path / f"c{seed}", batches, restarts, _Log())
        store.rocksdb.close()
        assert sorted(restarted) == sorted(straight) == sorted(moved)


@pytest.mark.parametrize("window", WINDOWS, ids=["tumbling", "hopping"])
def test_deferred_spill_cleans_up_to_the_reference(tmp_path: Path, window: dict) -> None:
    """Every batch's window pushed as a generation of copies: the clean-ups' results and the
    run's together are the reference's, with a restart from disk in the middle."""
    job = _job(tmp_path, "inner", window, memory_bytes=1, spill={"mode": "deferred", "push_fraction": 1.0})
    batches = _batches(5, 30)
    emitted, dead, _, store = _run(job, tmp_path / "db", batches, {12})
    assert store.pushes > 10 and not store.get(GROUP).checkpoint.generations
    store.rocksdb.close()
    assert len(set(emitted)) == len(emitted) and set(emitted) == _expected(job, batches, dead)


def test_late_records_are_dead_letters_once_and_counts_see_source_tuples(tmp_path: Path) -> None:
    """W=40, S=10: every tuple has 4 copies. A record far behind is one dead letter, not four;
    the tuples counted in are the records taken, and hot keys count each record once."""
    job = _job(tmp_path, "inner", {"hopping_ms": 40, "slide_ms": 10})
    batches = [[(0, KEYS[0], 1000), (1, KEYS[0], 1001)], [(0, KEYS[0], 1200), (1, KEYS[0], 1200)],
               [(0, KEYS[0], 1100), (1, KEYS[1], 1201)]]
    emitted, dead, taken, store = _run(job, tmp_path / "db", batches, set())
    assert dead == [(0, GROUP, 2)]
    assert taken == 5
    assert Counter(r[0] for r in emitted) == Counter({970: 1, 980: 1, 990: 1, 1000: 1, 1170: 1, 1180: 1, 1190: 1,
                                                      1200: 1})
    state = store.get(GROUP)
    assert not {"_win"} - set(state.window.runs[0].template.names)
    store.rocksdb.close()


def test_hot_keys_count_source_keys(tmp_path: Path) -> None:
    from streamjoin.services.hash.hot_keys import KeyCounter

    job = _job(tmp_path, "inner", {"hopping_ms": 40, "slide_ms": 10})
    plan = join_plan(job)
    store = group_store(job, plan, Store(tmp_path / "db"), stream_templates(job))
    (done,) = run_cycle(job, plan, store, _buffers(job, [(0, KEYS[0], 1000), (1, KEYS[0], 1001)], [0, 0]),
                        [routing_for(job, job.partitions)] * 2, now_ms=0)
    counter = KeyCounter(job)
    counter.observe(GROUP, done.tuples_taken, 0)
    counted, hot = counter.report({GROUP}, 0)
    assert counted == 2 and [(h.key, h.count) for h in hot] == [(str(KEYS[0]), 2)]
    assert len(done.appended[0]) == 4 and (done.tuples_taken[0][KEY] == KEYS[0]).all()
    assert np.isin(done.appended[0][KEY], [KEYS[0]]).sum() == 0  # the stored copies' keys are mixed
    store.rocksdb.close()
