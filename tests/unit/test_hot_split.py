"""Split hot keys against the plain-Python reference: a group and its slots through the worker's
batch code and state store (tests/unit/split_harness.py), with random inputs (one or two hot
keys, disorder within and beyond the lateness), random splits and merges at random batches,
random batch cuts, every join type that splits, and crashes of the group or a slot at random
points, recovered as recovery.py does. The union of every sub-group's results is the
reference's exactly: no pair missing, none extra, none written twice (ids unique across the
group and its slots), the null-padded rows of outer and anti joins too."""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.reference import RefTuple, RefWindow, reference_outer_join, reference_window_join
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from tests.profiles import examples
from tests.unit.split_harness import GROUP, Arrival, SplitJob, emptied

SLOTS = 2
CRASHES = [None] * 6 + ["before", "after", "partial"]
SPLIT_TYPES = ("inner", "left", "right", "semi", "anti")


@pytest.fixture(scope="module")
def rocksdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store(tmp_path_factory.mktemp("split") / "db")
    yield store
    store.close()


@lru_cache(maxsize=None)
def _job(join_type: str, windows: tuple[int, int], lateness: int, instance: tuple[int, int] | None) -> JobSettings:
    def window(range_ms: int) -> dict:
        if instance is None:
            return {"range_ms": range_ms}
        size, slide = instance
        return {"tumbling_ms": size} if size == slide else {"hopping_ms": size, "slide_ms": slide}
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": window(w)} for n, w in zip("rs", windows)]
    return load(None, job="hs", partitions=1, streams=streams, coordinator={"hot_key_slots": SLOTS},
                join={"type": join_type, "allowed_lateness_ms": lateness})


@st.composite
def scenarios(draw, windowed: bool):
    """(job, hot keys, arrivals, events): each event at an arrival's position, so splits and
    merges fall between the tuples of the key that test them: a batch of the group ends there
    (`cut`), a slot reads (`read`), or the coordinator splits or merges a hot key."""
    join_type = draw(st.sampled_from(SPLIT_TYPES))
    instance = None
    if windowed:
        size = draw(st.integers(2, 20))
        instance = (size, draw(st.sampled_from([size, max(1, size // 2), max(1, size // 3)])))
    windows, lateness = (draw(st.integers(1, 40)), draw(st.integers(1, 40))), draw(st.integers(0, 8))
    hot = draw(st.lists(st.integers(0, 7), min_size=1, max_size=2, unique=True))
    # One draw per arrival, read as (clock step, hot (two in three) or not, key, stream, how far
    # behind the clock): many small draws cost more than the run they drive.
    behind = lateness + 5
    drawn = draw(st.lists(st.integers(0, 6 * 3 * 8 * 2 * behind - 1), min_size=10, max_size=60))
    arrivals, clock = [], 0
    for n in drawn:
        n, tick = divmod(n, 6)
        n, is_hot = divmod(n, 3)
        n, key = divmod(n, 8)
        late, stream = divmod(n, 2)
        clock += tick
        arrivals.append(Arrival(stream, hot[key % len(hot)] if is_hot else key, max(0, clock - late)))
    at = st.integers(0, len(arrivals))
    crash = st.sampled_from(CRASHES)
    # A split, and the merge of its key some arrivals later (past the end: when every key is merged).
    splits = draw(st.lists(st.tuples(at, st.integers(0, 1), st.integers(1, SLOTS), st.integers(0, 25)),
                           min_size=1, max_size=3))
    events = [e for start, key, slots, after in splits
              for e in [(start, "split", key, slots), (start + after, "merge", key)]]
    events += draw(st.lists(st.one_of(
        st.tuples(at, st.just("cut"), crash, st.floats(0, 1)),
        st.tuples(at, st.just("read"), st.integers(0, SLOTS - 1), st.integers(1, 6), crash, st.floats(0, 1))),
        min_size=4, max_size=30))
    return _job(join_type, windows, lateness, instance), hot, arrivals, sorted(events, key=lambda e: e[0])


def _check(rocksdb: Store, job: JobSettings, hot: list[int], arrivals: list[Arrival],
           events: list[tuple]) -> dict[int, int]:
    """Run `events` over `arrivals`, then `_finish`; assert the results are the reference's.
    Returns the results each group and slot wrote."""
    sim = SplitJob(job, arrivals, emptied(rocksdb))
    _drive(sim, hot, events)
    far = max((a.ts for a in arrivals), default=0) + 10_000
    _finish(sim, hot, far)
    got = sim.results()
    dead = sim.topics.dead
    assert not [d for d in dead if d[0] != GROUP or d[1] != "late"], f"a slot dead-lettered: {dead}"
    late = {(job.topic_of(job.streams[s]), 0, off) for _, _, s, off in dead}
    streams: list[list[RefTuple]] = [[], []]
    offsets = [0, 0]
    for a in arrivals:
        ref = (job.topic_of(job.streams[a.stream]), 0, offsets[a.stream])
        offsets[a.stream] += 1
        if ref not in late:
            streams[a.stream].append(RefTuple(ref, a.key, a.ts))
    topics = [job.topic_of(s) for s in job.streams]
    if job.window_instance is None:
        windows = [RefWindow(range_ms=s.window.range_ms) for s in job.streams]  # type: ignore[union-attr]
        expected = reference_outer_join(streams, windows, job.join.type, topics, {GROUP: far})
    else:
        size, slide = job.window_instance
        expected = reference_window_join(streams, size, slide, job.join.type, topics, {GROUP: far})
    shown = set(got)
    assert shown == expected, (f"{job.join.type}: missing={sorted(expected - shown)[:3]} "
                               f"extra={sorted(shown - expected)[:3]}")
    assert len(got) == len(shown), "a result was written twice"
    return sim.made()


def _drive(sim: SplitJob, hot: list[int], events: list[tuple]) -> None:
    for at, kind, *args in events:
        if kind == "cut":
            sim.run(GROUP, sim.unread_before(at), *args)
        elif kind == "read":
            sim.run(sim.job.partitions + args[0], *args[1:])
        elif kind == "split":
            sim.split(hot[args[0] % len(hot)], args[1])
        else:
            sim.merge(hot[args[0] % len(hot)])


def _finish(sim: SplitJob, hot: list[int], far: int) -> None:
    """Read the rest in small batches, merge every key, move the group's watermark past every
    deadline until every episode has ended, and let the slots read all they were sent."""
    while sim.pending(GROUP):
        sim.run(GROUP, 3)
    for key in hot:
        sim.merge(key)
    for _ in range(3):
        sim.run(GROUP, 0, floor=far)
        if not sim.active():
            break
    assert not sim.active(), "a merge did not end once the watermark passed every deadline"
    for slot in sim.job.slots:
        while sim.pending(slot):
            sim.run(slot, 50)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(windowed=False))
def test_split_keys_join_exactly_through_splits_merges_and_crashes(rocksdb: Store, case) -> None:
    _check(rocksdb, *case)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(windowed=True))
def test_split_keys_of_tumbling_and_hopping_window_joins_join_exactly(rocksdb: Store, case) -> None:
    _check(rocksdb, *case)


# By hand, one case per thing the scheme must get right; each fails when that thing is left out
# (fragment both streams; no copy of the window at the split; end a merge's drain a window early).
SLOT = 1  # the first slot of a one-partition job
CUT = (None, 1.0)  # a batch that commits


def test_every_pair_meets_once_when_both_streams_arrive_after_the_split(rocksdb: Store) -> None:
    job = _job("inner", (100, 100), 0, None)
    arrivals = [Arrival(i % 2, 1, i) for i in range(16)]
    made = _check(rocksdb, job, [1], arrivals, [(0, "split", 0, 1), (8, "cut", *CUT), (16, "cut", *CUT)])
    assert made.get(SLOT), "no pair met in the slot: the case tests nothing"


def test_a_slot_meets_the_tuples_its_group_held_at_the_split(rocksdb: Store) -> None:
    """The right stream's tuples of the key in the group's window at the split reach the slot
    first, so the left tuples spread there after it meet them."""
    job = _job("left", (100, 100), 0, None)
    arrivals = [Arrival(1, 1, ts) for ts in (10, 11, 12)] + [Arrival(0, 1, 20 + i) for i in range(12)]
    made = _check(rocksdb, job, [1], arrivals, [(3, "cut", *CUT), (3, "split", 0, 1), (15, "cut", *CUT)])
    assert made.get(SLOT), "no pair met in the slot: the case tests nothing"


def test_a_merge_replicates_until_no_later_tuple_can_join_a_slot(rocksdb: Store) -> None:
    """Left tuples of the key at 0..9 are spread; the key merges; the watermark reaches 20 (past
    them, not past them plus their 50 ms window); a right tuple at 25 must still reach the slot."""
    job = _job("left", (50, 50), 0, None)
    arrivals = ([Arrival(0, 1, ts) for ts in range(10)] + [Arrival(0, 3, 20), Arrival(1, 3, 20), Arrival(1, 3, 21)]
                + [Arrival(1, 1, 25)])
    events = [(0, "split", 0, 1), (10, "cut", *CUT), (10, "merge", 0), (12, "cut", *CUT), (13, "cut", *CUT),
              (14, "cut", *CUT)]
    made = _check(rocksdb, job, [1], arrivals, events)
    assert made.get(SLOT), "no pair met in the slot: the case tests nothing"
