"""Event-time aligned intake's decision (services/hash/alignment.py) and the adaptive
batch interval (services/hash/main.next_interval_ms), without a broker."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamjoin.engine.window_join import NO_TIME
from streamjoin.services.hash.alignment import paused_streams
from streamjoin.services.hash.main import next_interval_ms
from streamjoin.settings import load
from tests.profiles import examples

heads = st.one_of(st.just(NO_TIME), st.integers(-(1 << 40), 1 << 40))


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), groups=st.integers(1, 6), streams=st.integers(2, 3), bound=st.integers(0, 100_000))
def test_a_stream_is_paused_exactly_when_it_is_past_the_bound_of_the_slowest_readable_one(
        data: st.DataObject, groups: int, streams: int, bound: int) -> None:
    head = data.draw(hnp.arrays(np.int64, (groups, streams), elements=heads))
    readable = data.draw(hnp.arrays(bool, (groups, streams)))
    paused = paused_streams(head, readable, bound)
    for g in range(groups):
        moving = [int(h) for h, r in zip(head[g], readable[g]) if r]
        for s in range(streams):
            # Plain Python, the rule as words: ahead of the slowest stream that can still move by more than the bound.
            assert paused[g, s] == (bool(moving) and int(head[g, s]) > min(moving) + bound)
        if moving:  # intake never stops: the slowest readable stream always runs
            slowest = min(range(streams), key=lambda s: head[g, s] if readable[g, s] else 1 << 62)
            assert not paused[g, slowest]


def test_a_stream_not_seen_yet_holds_back_the_others_only_while_it_has_records() -> None:
    head = np.array([[50_000, NO_TIME]], np.int64)
    assert paused_streams(head, np.array([[True, True]]), 10_000).tolist() == [[True, False]]
    assert paused_streams(head, np.array([[True, False]]), 10_000).tolist() == [[False, False]]


def test_the_batch_interval_follows_the_batch_time_within_its_bounds() -> None:
    job = load("streamjoin/jobs/equijoin.yaml", worker={"batch_ms": 200, "min_batch_ms": 10})
    assert next_interval_ms(job, 0.001) == 10  # light input: small batches, soon
    assert next_interval_ms(job, 0.030) == 30  # the batch's own time: the next starts once it is committed
    assert next_interval_ms(job, 5.0) == 200  # a backlog: the longest interval, fewest transactions
