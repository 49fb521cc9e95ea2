"""Watermarks carried across the repartition (services/hash/progress.py,
`join.repartition_watermarks`): a hash job started on a backlog whose records sit in the
wrong partitions, its groups reading at different speeds, runs through the whole worker
cycle (intake, decode, re-routing, window join) with the re-routed records handed back as
by-key records: with the setting every tuple joins exactly as the reference join says and
none is late; without it the group that read ahead dead-letters re-routed tuples as late.
And the notes' parts: what a receiver keeps and the bound it derives, an idle stream told
once, a by-key record that only looks like a note."""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.engine.window_join import NO_TIME
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.services.hash.progress import Heard, notes, targets, tell
from streamjoin.services.io.progress_notes import NOTE_HEADER, Told
from streamjoin.settings import JobSettings, SettingsError, load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_intake import Msg

NOW = 10_000_000
RANGE_MS = 1_000
SPEEDS = {0: 400, 1: 60}  # records a cycle each group takes of each of its source partitions


def _job(watermarks: bool, partitions: int = 2) -> JobSettings:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": RANGE_MS}} for n in "rs"]
    return load(None, job="pw", partitions=partitions, streams=streams,
                join={"allowed_lateness_ms": 100, "max_future_ms": None, "max_read_ahead_ms": None,
                      "repartition_watermarks": watermarks})


def _backlog(job: JobSettings, seed: int) -> tuple[dict[tuple[int, int], list[Msg]], list[list[RefTuple]]]:
    """30 s of both streams, in event-time order, each record to a random source partition:
    per (stream, partition) its records, and per stream the reference's tuples."""
    rng = random.Random(seed)
    parts: dict[tuple[int, int], list[Msg]] = {(i, p): [] for i in range(2) for p in range(job.partitions)}
    refs: list[list[RefTuple]] = [[], []]
    for ts in range(0, 30_000, 25):
        for i, spec in enumerate(job.streams):
            p, key = rng.randrange(job.partitions), rng.randrange(8)
            at = len(parts[(i, p)])
            parts[(i, p)].append(Msg(job.topic_of(spec), p, at, json.dumps({"k": key, "ts": ts}).encode()))
            refs[i].append(RefTuple((job.topic_of(spec), p, at), key, ts))
    return parts, refs


def _run(job: JobSettings, parts: dict[tuple[int, int], list[Msg]]) -> tuple[Counter, Counter, int]:
    """One worker owning every group drains the backlog: each cycle each group takes
    SPEEDS[g] more records of each of its source partitions and every by-key record written
    before the cycle. Returns the results (input refs), the dead letters by reason, and the
    progress notes written."""
    plan = join_plan(job)
    routings = [routing_for(job, job.partitions)] * 2
    read = {key: 0 for key in parts}
    by_key: dict[tuple[int, int], list[Msg]] = {(i, g): [] for i in range(2) for g in range(job.partitions)}
    taken = dict.fromkeys(by_key, 0)
    emitted: Counter = Counter()
    dead: Counter = Counter()
    told = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = WindowedStore(Store(Path(tmp) / "db"), plan, stream_templates(job), 1 << 30)
        while any(read[k] < len(v) for k, v in parts.items()) or any(taken[k] < len(v) for k, v in by_key.items()):
            buffers = {i: RecordBuffer() for i in range(2)}
            for (i, p), msgs in parts.items():
                for m in msgs[read[(i, p)]:read[(i, p)] + SPEEDS[p % 2]]:
                    buffers[i].add(m, p)  # type: ignore[arg-type]
                read[(i, p)] = min(len(msgs), read[(i, p)] + SPEEDS[p % 2])
            for (i, g), msgs in by_key.items():
                for m in msgs[taken[(i, g)]:]:
                    buffers[i].add_forwarded(m)  # type: ignore[arg-type]
                taken[(i, g)] = len(msgs)
            for batch in run_cycle(job, plan, store, buffers, routings, NOW):
                res = batch.results
                emitted.update(zip(*[zip([job.topic_of(s)] * len(res), res[f"{s.name}.partition"].tolist(),
                                         res[f"{s.name}.offset"].tolist()) for s in job.streams]))
                dead.update(d.reason for d in batch.dead)
                told += len(batch.notes)
                for f in [*batch.forwards, *batch.notes]:  # as the Emitter writes them: notes after forwards
                    to = by_key[(f.stream, f.partition)]
                    to.append(Msg(job.by_key_topic(job.streams[f.stream]), f.partition, len(to), f.value,
                                  f.headers(), f.key))
                tx = store.rocksdb.transaction()
                store.stage(tx, batch.group, batch.state, batch.appended)
                tx.commit()
        store.rocksdb.close()
    return emitted, dead, told


@pytest.mark.parametrize("seed", range(2))
def test_a_backlog_re_routed_to_a_group_that_read_ahead_joins_exactly(seed: int) -> None:
    parts, refs = _backlog(_job(True), seed)
    expected = Counter(reference_join(refs, [RefWindow(range_ms=RANGE_MS)] * 2))
    emitted, dead, told = _run(_job(True), parts)
    assert not dead, dead
    assert told > 0 and emitted == expected
    # The same backlog without progress notes: group 0 reads ahead, its re-routed tuples are late.
    emitted, dead, told = _run(_job(False), parts)
    assert dead["late"] > 0 and told == 0 and set(emitted) < set(expected)


def test_a_group_holds_at_the_least_progress_of_every_source_partition() -> None:
    job = _job(True, partitions=3)
    assert targets(3, 3, 1) == [0, 2]  # its own partition's tuples for it stay: it knows that one itself
    assert targets(3, 6, 1) == [0, 1, 2]  # a topic partitioned otherwise re-routes all, to itself too
    heard = Heard({}, {})
    assert heard.bound(job, [3, 3]) == NO_TIME  # nothing told yet: held
    heard = heard.after("r", [Told({0: 500}), Told({1: 800, 2: 900}), Told({0: 400})])
    assert heard.progress == {"r": {0: 500, 1: 800, 2: 900}}  # the newest told, not the last
    assert heard.bound(job, [3, 3]) == NO_TIME  # stream s has told nothing
    heard = heard.after("s", [Told({0: 700, 1: 600, 2: 300})])
    assert heard.bound(job, [3, 3]) == 300
    heard = heard.after("s", [Told({}, (2,))])  # partition 2 of s went idle: it holds nothing
    assert heard.bound(job, [3, 3]) == 500
    heard = heard.after("s", [Told({2: 350})])  # records again: it holds from where it is
    assert heard.idle == {"r": [], "s": []} and heard.bound(job, [3, 3]) == 350
    every = Heard({"r": {0: 1}}, {"r": [0, 1, 2], "s": [0, 1, 2]})
    assert every.bound(job, [3, 3]) is None  # every partition idle: no bound


def test_a_group_tells_an_idle_stream_once_and_progress_whenever_it_read() -> None:
    job = _job(True, partitions=3)
    said, told_idle = tell(job, [3, 6], 1, {0: {1: 40}}, frozenset({1}), [])
    # stream r: partition 1 (its only one) read; stream s idle: its partitions 1 and 4
    assert said == {0: Told({1: 40}), 1: Told({}, (1, 4))} and told_idle == ["s"]
    written = notes(job, [3, 6], 1, said, NOW)
    # r to the other groups; s to every group (a topic partitioned unlike the job re-routes all)
    assert sorted((n.stream, n.partition) for n in written) == [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2)]
    again, still = tell(job, [3, 6], 1, {}, frozenset({1}), told_idle)
    assert again == {} and still == ["s"]  # told already: a note each batch would wake every group
    back, after = tell(job, [3, 6], 1, {1: {4: 70}}, frozenset(), still)
    assert back == {1: Told({4: 70})} and after == []


def test_a_note_reads_back_as_written_and_a_false_one_is_dead_lettered(tmp_path: Path) -> None:
    job = _job(True)
    note = notes(job, [2, 2], 0, {0: Told({0: 123})}, NOW)[0]
    topic = job.by_key_topic(job.streams[0])
    buf = RecordBuffer()
    buf.extend_forwarded([Msg(topic, 1, 0, note.value, note.headers(), note.key),
                          Msg(topic, 1, 1, b"not a note", [(NOTE_HEADER, b"1")])], topic, np.array([1, 1]))
    assert buf.notes == [(1, Told({0: 123}))] and len(buf) == 1  # the note is read, not a tuple
    assert buf.positions == {1: {topic: {1: 2}}}  # both records are read
    plan = join_plan(job)
    store = WindowedStore(Store(tmp_path / "db"), plan, stream_templates(job), 1 << 30)
    batches = run_cycle(job, plan, store, {0: buf}, [routing_for(job, 2)] * 2, NOW)
    store.rocksdb.close()
    assert [d.reason for b in batches for d in b.dead] == ["malformed"]
    assert batches[0].state.checkpoint.progress == {"r": {0: 123}}  # group 1 heard of partition 0


def test_carrying_watermarks_needs_hash_mode_and_re_routing() -> None:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": RANGE_MS}} for n in "rs"]
    with pytest.raises(SettingsError, match="repartition_watermarks"):
        load(None, job="pw", streams=streams, join={"repartition": "never", "repartition_watermarks": True})


def test_a_job_file_written_with_queries_catchup_ms_still_loads() -> None:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": RANGE_MS}} for n in "rs"]
    job = load(None, job="old", streams=streams, queries={"catchup_ms": 30_000, "operator_partitions": 3})
    assert job.queries.operator_partitions == 3 and not hasattr(job.queries, "catchup_ms")
