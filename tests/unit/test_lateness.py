"""Far-late tuples are late whatever batch they share: judged in the batch's canonical order
(engine/lateness.py), checked against a plain-Python statement of that order, for every
join type and both window kinds."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import system_block
from streamjoin.engine.lateness import NO_TIME, late_in_batch
from streamjoin.engine.reference import RefWindow
from tests.profiles import examples
from tests.unit.engine_harness import Arrival, run

HOUR = 3_600_000


def _reference(seqs: dict[tuple[int, int], list[tuple[int, int]]], newest: list[int], idle: set[int],
               lateness: int) -> set[tuple[int, int, int]]:
    """(stream, partition, offset) of the late tuples: sequences (stream, partition) -> [(offset,
    ts)], each read in offset order, the lowest head event time first (ties: lower stream, then
    partition)."""
    top, late = list(newest), set()
    queues = {q: sorted(items) for q, items in seqs.items()}
    heap = [(items[0][1], q, 0) for q, items in queues.items() if items]
    heapq.heapify(heap)
    while heap:
        ts, q, at = heapq.heappop(heap)
        live = [top[i] for i in range(len(top)) if i not in idle]
        if live and min(live) > NO_TIME and ts < min(live) - lateness:
            late.add((q[0], q[1], queues[q][at][0]))
        else:
            top[q[0]] = max(top[q[0]], ts)
        if at + 1 < len(queues[q]):
            heapq.heappush(heap, (queues[q][at + 1][1], q, at + 1))
    return late


@st.composite
def batches(draw):
    m = draw(st.integers(1, 3))
    seqs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for stream in range(m):
        for part in range(draw(st.integers(1, 3))):
            times = draw(st.lists(st.integers(0, 200), max_size=25))
            seqs[(stream, part)] = list(enumerate(times))
    newest = [draw(st.one_of(st.just(NO_TIME), st.integers(0, 200))) for _ in range(m)]
    idle = set(draw(st.lists(st.integers(0, m - 1), max_size=m)))
    return seqs, newest, idle, draw(st.integers(0, 40)), draw(st.randoms())


@settings(max_examples=examples(300), deadline=None)
@given(batches())
def test_late_tuples_are_those_of_the_canonical_order_whatever_order_the_batch_holds(case) -> None:
    seqs, newest, idle, lateness, rnd = case
    deltas, refs = [], []
    for stream in range(len(newest)):
        rows = [(p, o, ts) for (s, p), items in seqs.items() if s == stream for o, ts in items]
        rnd.shuffle(rows)  # the order records were fetched in must not matter
        refs.append(rows)
        part, off, ts = (np.array([r[k] for r in rows], np.int64) for k in range(3))
        deltas.append(system_block(np.zeros(len(rows), np.int64), ts, part, off, ts, {}))
    masks = late_in_batch(deltas, newest, frozenset(idle), lateness)
    got = {(stream, p, o) for stream, rows in enumerate(refs) for (p, o, _), bad in zip(rows, masks[stream]) if bad}
    assert got == _reference(seqs, newest, idle, lateness)


@pytest.mark.parametrize("join_type", ["inner", "left", "right", "full", "semi", "anti"])
@pytest.mark.parametrize("kind", ["range", "rows"])
def test_a_tuple_an_hour_behind_is_late_in_the_batch_that_moved_time_on(join_type: str, kind: str) -> None:
    """One batch holds a whole backlog (a job started late): the hour-old tuple on stream 0,
    read after its partition's newer tuples while stream 1 is current, is late, and no result
    (not even an unmatched row) holds it."""
    window = RefWindow(range_ms=100) if kind == "range" else RefWindow(rows=2)
    arrivals = [Arrival(s, k % (4 - s), HOUR + 10 * k, k) for k in range(40) for s in (0, 1)]  # key 3: no match
    arrivals.insert(41, Arrival(0, 1, 5, 1_000))  # after stream 0's 20th tuple
    emitted, late, _ = run([window, window], 50, arrivals, [], join_type=join_type)
    assert late == {("t0", 0, 1_000)}
    assert all(("t0", 0, 1_000) not in combo for combo in emitted)
    assert emitted, "a join that emitted nothing would prove nothing"


def test_a_tuple_behind_only_its_own_partition_is_not_late_while_another_stream_lags() -> None:
    """The watermark is the minimum over streams: stream 1 has not moved, so stream 0's
    out-of-order tuple is on time (Flink and Kafka Streams agree)."""
    arrivals = [Arrival(0, 1, 1_000, 0), Arrival(0, 1, 100, 1), Arrival(1, 1, 90, 0)]
    _, late, _ = run([RefWindow(range_ms=50)] * 2, 10, arrivals, [])
    assert late == set()
