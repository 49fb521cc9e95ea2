"""The spill paper's disk-based adaptation through the worker's own batch path (processor, RocksDB
state, spill policy): random streams, windows, budgets and push fractions. Probe mode's
output equals the plain-Python reference after every batch; deferred mode's run-time output
plus its clean-up output equals it once the watermark has passed every generation, with no
duplicate, across a restart from disk in the middle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.settings import SpillSpec, load
from streamjoin.state.spill import GroupActivity, choose_victims
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from streamjoin.topology.partitioner import partition_for
from tests.profiles import examples

PARTITIONS = 8
GROUPS = (1, 5)
# Per group, join keys Kafka's partitioner puts in that group, so no tuple is re-routed.
KEYS = {g: [k for k in range(3000) if partition_for(key_bytes(k), PARTITIONS) == g][:6] for g in GROUPS}
STREAMS = "abc"
FAR = 100_000  # flush tuples' time: past every window and the allowed lateness, so every generation is due


def _job(tmp_path: Path, ranges: list[int], budget: int, spill: dict):
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": r}} for n, r in zip(STREAMS, ranges)]
    return load(None, job="sp", partitions=PARTITIONS, streams=streams, join={"allowed_lateness_ms": 10_000},
                worker={"state_dir": str(tmp_path), "memory_bytes": budget, "changelog": False, "spill": spill})


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    """Batches of (stream, group, key index, ts) with bounded disorder (never late)."""
    m = draw(st.integers(2, 3))
    batches = []
    for b in range(draw(st.integers(4, 12))):
        n = draw(st.integers(0, 14))
        batches.append([(draw(st.integers(0, m - 1)), draw(st.sampled_from(GROUPS)), draw(st.integers(0, 3)),
                         100 + 25 * b + draw(st.integers(-40, 40))) for _ in range(n)])
    return {"m": m, "batches": batches, "ranges": [draw(st.sampled_from([30, 80, 200])) for _ in range(m)],
            "budget": draw(st.integers(1, 4000)), "push_fraction": draw(st.sampled_from([0.1, 0.3, 1.0])),
            "victims": draw(st.sampled_from(["productivity", "lru", "most-productive"])),
            "restart_at": draw(st.integers(0, 14))}


def _flush(m: int) -> list[tuple[int, int, int, int]]:
    """Per group and stream one tuple far in the future with a key no other stream uses, so
    every watermark passes every generation and nothing new joins."""
    return [(i, g, 4 + i % 2, FAR) for g in GROUPS for i in range(m)]


class _Run:
    """A worker's batch loop over one RocksDB directory, with what it emitted."""

    def __init__(self, job, path: Path) -> None:
        self.job, self.path = job, path
        self.plan = join_plan(job)
        self.offsets = [0] * len(job.streams)
        self.emitted: list[tuple] = []
        self.refs: list[list[RefTuple]] = [[] for _ in job.streams]
        self.pushed = 0
        self.open()

    def open(self) -> None:
        self.store = WindowedStore(Store(self.path), self.plan, stream_templates(self.job), self.job.worker.memory_bytes,
                                   spill=self.job.worker.spill)

    def restart(self) -> None:
        """A crash after the last commit: memory (and any pending push) is lost, disk is not."""
        self.store.rocksdb.close()
        self.open()

    def batch(self, tuples: list[tuple[int, int, int, int]], now_ms: int) -> None:
        m = len(self.job.streams)
        buffers = {i: RecordBuffer() for i in range(m)}
        for stream, group, key_index, ts in tuples:
            key = KEYS[group][key_index]
            value = json.dumps({"k": key, "ts": ts}).encode()
            record = LocalRecord(f"sp.{STREAMS[stream]}", group, self.offsets[stream], str(key).encode(), value, ts)
            buffers[stream].add(record, group)  # type: ignore[arg-type]
            self.refs[stream].append(RefTuple((f"sp.{STREAMS[stream]}", group, self.offsets[stream]), key, ts))
            self.offsets[stream] += 1
        routings = [routing_for(self.job, PARTITIONS)] * m
        for b in run_cycle(self.job, self.plan, self.store, buffers, routings, now_ms):
            assert not b.dead, [d.reason for d in b.dead]
            res = b.results
            cols = [(res[f"{s}.partition"], res[f"{s}.offset"]) for s in STREAMS[:m]]
            for r in range(len(res)):
                self.emitted.append(tuple((f"sp.{STREAMS[i]}", int(cols[i][0][r]), int(cols[i][1][r]))
                                          for i in range(m)))
            tx = self.store.rocksdb.transaction()
            self.store.stage(tx, b.group, b.state, b.appended)
            tx.commit()
            self.store.observe(b.group, now_ms, sum(len(x) for x in b.appended), len(b.results))
        self.pushed += len(self.store.keep_budget(now_ms))

    def reference(self, windows: list[RefWindow]) -> set[tuple]:
        return reference_join(self.refs, windows)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(w=workloads(), mode=st.sampled_from(["probe", "deferred"]))
def test_spilled_output_equals_the_reference(tmp_path_factory, w: dict, mode: str) -> None:
    path = tmp_path_factory.mktemp("spill")
    job = _job(path, w["ranges"], w["budget"], {"mode": mode, "push_fraction": w["push_fraction"],
                                                "victims": w["victims"], "inactive_ms": 50})
    windows = [RefWindow(range_ms=r) for r in w["ranges"]]
    run = _Run(job, path / "db")
    for n, tuples in enumerate(w["batches"]):
        if n == w["restart_at"]:
            run.restart()
        run.batch(tuples, now_ms=1000 * n)
        assert len(set(run.emitted)) == len(run.emitted), "a result was emitted twice"
        expected = run.reference(windows)
        if mode == "probe":
            assert set(run.emitted) == expected  # on time: every result by the batch of its last member
        else:
            assert set(run.emitted) <= expected
    run.batch(_flush(w["m"]), now_ms=1000 * len(w["batches"]))
    assert len(set(run.emitted)) == len(run.emitted)
    assert set(run.emitted) == run.reference(windows)
    if mode == "deferred":
        assert all(not s.checkpoint.generations for s in run.store.hot_groups().values())
    run.store.rocksdb.close()


def test_deferred_spill_really_defers_and_cleans_up(tmp_path: Path) -> None:
    """A push in deferred mode leaves results to the clean-up (so the property test above tests
    the clean-up, not an unspilled run), and the cleaned generation's blocks leave the disk."""
    job = _job(tmp_path, [1000, 1000], 1, {"mode": "deferred", "push_fraction": 1.0})
    run = _Run(job, tmp_path / "db")
    group = GROUPS[0]
    run.batch([(0, group, 0, 100), (0, group, 0, 110)], now_ms=0)  # pushed after the batch (budget 1 byte)
    assert run.pushed == 1 and run.store.hot_size == 0
    run.batch([(1, group, 0, 120)], now_ms=1000)
    assert run.emitted == []  # its partners are in the spilled generation: not probed at run time
    state = run.store.get(group)
    assert state.checkpoint.generations == [[0, 110]] and state.checkpoint.generation_start == 2
    run.batch(_flush(2), now_ms=2000)
    assert len(run.emitted) == 2 and set(run.emitted) == run.reference([RefWindow(1000)] * 2)
    assert state.checkpoint.generations == []
    assert all(seq >= 2 for stream in state.stored for seq in stream)  # generation 1's blocks are gone
    run.store.rocksdb.close()


def test_productivity_pushes_idle_then_unproductive_groups_first() -> None:
    spill = SpillSpec(inactive_ms=1000)
    sizes = {1: 100, 2: 100, 3: 100, 4: 100}
    activity = {1: GroupActivity(last_insert_ms=9_500, results=50),  # productive
                2: GroupActivity(last_insert_ms=9_500, results=0),  # never produced: infinitely unproductive
                3: GroupActivity(last_insert_ms=1_000, results=500),  # idle 9 s > theta_t
                4: GroupActivity(last_insert_ms=9_500, results=5)}
    recency = {1: 3, 2: 2, 3: 1, 4: 0}
    assert choose_victims(sizes, activity, recency, 400, spill, now_ms=10_000) == [3, 2, 4, 1]
    assert choose_victims(sizes, activity, recency, 150, spill, now_ms=10_000) == [3, 2]
    most = SpillSpec(victims="most-productive")
    assert choose_victims(sizes, activity, recency, 400, most, now_ms=10_000) == [3, 1, 4, 2]
    lru = SpillSpec(victims="lru")
    assert choose_victims(sizes, activity, recency, 400, lru, now_ms=10_000) == [4, 3, 2, 1]
    assert choose_victims(sizes, activity, recency, 0, spill, now_ms=10_000) == []
    arrived = {g: a for g, a in activity.items() if g != 2}  # group 2 just arrived: no statistics yet
    assert choose_victims(sizes | {2: 300}, arrived, recency, 10_000, spill, now_ms=10_000) == [3, 4, 1, 2]
