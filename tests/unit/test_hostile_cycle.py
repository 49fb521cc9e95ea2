"""Random mixes of good and hostile records through the whole worker cycle (intake,
decode, window join): the good records join exactly as the reference join says,
and every hostile record is dead-lettered exactly once, with its reason."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.services.io.intake import STREAM_HEADER, RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan, run_cycle
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_intake import Msg
from tests.unit.test_poison import FIELDS, HOSTILE_JSON
from tests.profiles import examples

NOW = 10_000_000
MAX_FUTURE = 60_000
RANGE_MS = 100
# name -> (value, headers, reason); the JSON cases of test_poison, one from the future, one for another stream.
HOSTILE = {name: (value, None, "malformed") for name, (value, _) in HOSTILE_JSON.items()} | {
    "future": (json.dumps({"k": 1, "ts": NOW + MAX_FUTURE + 1, "v": "x", "w": 0.5}).encode(), None, "future"),
    "far future": (json.dumps({"k": 2, "ts": 1 << 59, "v": "x", "w": 0.5}).encode(), None, "future"),
    "other stream": (json.dumps({"k": 1, "ts": 5, "v": "x", "w": 0.5}).encode(), [(STREAM_HEADER, b"z")],
                     "unknown-stream"),
    "non-UTF-8 stream header": (json.dumps({"k": 1, "ts": 5, "v": "x", "w": 0.5}).encode(),
                                [(STREAM_HEADER, b"\xff")], "unknown-stream"),
}

good = st.tuples(st.integers(0, 3), st.integers(0, 400)).map(lambda kt: ("good", *kt))
hostile = st.sampled_from(sorted(HOSTILE)).map(lambda name: (name, 0, 0))
arrivals = st.lists(st.tuples(st.integers(0, 1), st.one_of(good, good, hostile)), max_size=60)


def _job() -> JobSettings:
    streams = [{"name": n, "fields": FIELDS, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": RANGE_MS}} for n in "rs"]
    return load(None, job="hc", partitions=1, streams=streams, join={"max_future_ms": MAX_FUTURE})


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=arrivals, cuts=st.lists(st.integers(0, 60), max_size=4))
def test_good_records_join_exactly_and_each_hostile_one_is_dead_lettered_once(
        arrivals: list[tuple[int, tuple[str, int, int]]], cuts: list[int]) -> None:
    job = _job()
    topics = [job.topic_of(s) for s in job.streams]
    offsets, refs = [0, 0], [[], []]
    expected_dead: Counter = Counter()
    messages = []
    for stream, (kind, key, ts) in arrivals:
        ref = (topics[stream], 0, offsets[stream])
        if kind == "good":
            value, headers = json.dumps({"k": key, "ts": ts, "v": "x", "w": 0.5}).encode(), None
            refs[stream].append(RefTuple(ref, key, ts))
        else:
            value, headers, reason = HOSTILE[kind]
            expected_dead[(stream, ref[2], reason)] += 1
        messages.append((stream, Msg(topics[stream], 0, offsets[stream], value, headers)))
        offsets[stream] += 1
    emitted, dead = _run(job, messages, cuts)
    assert Counter(emitted) == Counter(reference_join(refs, [RefWindow(range_ms=RANGE_MS)] * 2))
    assert max(Counter(emitted).values(), default=1) == 1
    assert dead == expected_dead


def _run(job: JobSettings, messages: list[tuple[int, Msg]], cuts: list[int]) -> tuple[list[tuple], Counter]:
    """The messages through run_cycle, cut into cycles at `cuts`: the results as input refs, and
    the dead letters as (stream, offset, reason) counts."""
    plan = join_plan(job)
    routings = [routing_for(job, job.partitions)] * 2
    emitted: list[tuple] = []
    dead: Counter = Counter()
    bounds = sorted({0, len(messages), *[c for c in cuts if 0 < c < len(messages)]})
    with tempfile.TemporaryDirectory() as tmp:
        store = WindowedStore(Store(Path(tmp) / "db"), plan, stream_templates(job), 1 << 30)
        for a, b in zip(bounds, bounds[1:]):
            buffers = {i: RecordBuffer() for i in (0, 1)}
            for stream, m in messages[a:b]:
                buffers[stream].add(m, 0)  # type: ignore[arg-type]
            for batch in run_cycle(job, plan, store, buffers, routings, NOW):
                res = batch.results
                cols = [(s.name, job.topic_of(s)) for s in job.streams]
                emitted += [tuple((t, int(p), int(o)) for (t, p, o) in refs) for refs in zip(
                    *[zip([t] * len(res), res[f"{n}.partition"], res[f"{n}.offset"]) for n, t in cols])]
                dead.update((d.stream, d.offset, d.reason) for d in batch.dead)
                tx = store.rocksdb.transaction()
                store.stage(tx, batch.group, batch.state, batch.appended)
                tx.commit()
        store.rocksdb.close()
    return emitted, dead
