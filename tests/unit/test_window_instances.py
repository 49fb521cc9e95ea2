"""Tumbling and hopping window joins run on the sliding-window engine over replicated tuples
(engine/window_instances.py): `instances` against a brute-force enumeration, `assign` and
`instance_plan` on their own, then the whole rewrite through `process_batch` against
`reference_window_join`: random arrival orders, batch cuts, lateness and final watermarks,
every result once, none missing or extra, for every join type, tumbling and hopping; outer,
semi and anti rows decided per instance (a copy's match is its own); ids that name the
instance."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine import window_instances
from streamjoin.engine.block import KEY, PART, TS, Block, system_block
from streamjoin.engine.reference import JOIN_TYPES, reference_window_join
from streamjoin.engine.result_ids import ABSENT, RESULT_ID_HI, RESULT_ID_LO, WINDOW_END, WINDOW_START, result_ids
from streamjoin.engine.window_instances import WIN, assign, instance_plan, instances, mix_key
from streamjoin.engine.window_join import NO_TIME, JoinPlan, StreamPlan, empty_window, process_batch
from tests.profiles import examples
from tests.unit.engine_harness import Arrival, reference_streams

pytestmark = pytest.mark.unit

TOPICS = ["t0", "t1"]


def brute_force(ts: list[int], size: int, slide: int) -> tuple[list[int], list[int]]:
    """Every multiple of `slide` near each time, kept when it starts an instance holding it."""
    rows, starts = [], []
    for row, t in enumerate(ts):
        for k in range((t - size) // slide - 1, t // slide + 2):
            if k * slide <= t < k * slide + size:
                rows.append(row)
                starts.append(k * slide)
    return rows, starts


@st.composite
def windows(draw) -> tuple[int, int]:
    """(size, slide): tumbling half the time, else any slide up to the size."""
    size = draw(st.integers(1, 40))
    return size, size if draw(st.booleans()) else draw(st.integers(1, size))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(-10**6, 10**6) | st.integers(-100, 100), max_size=30), windows())
def test_instances_are_the_brute_force_enumeration(ts: list[int], window: tuple[int, int]) -> None:
    rows, starts = instances(np.array(ts, np.int64), *window)
    assert (rows.tolist(), starts.tolist()) == brute_force(ts, *window)
    assert rows.dtype == starts.dtype == np.int64


def test_instances_by_hand() -> None:
    """Negative times floor; a slide not dividing the size gives 3 or 4 copies (W=10, S=3)."""
    rows, starts = instances(np.array([-7, 3, 10]), 10, 3)
    assert rows.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert starts.tolist() == [-15, -12, -9, -6, -3, 0, 3, 3, 6, 9]
    assert instances(np.array([-1, 0, 9, 10]), 10, 10)[1].tolist() == [-10, 0, 0, 10]


@pytest.mark.parametrize("size, slide", [(10, 0), (10, 11), (10, -1)])
def test_a_window_needs_a_slide_within_its_size(size: int, slide: int) -> None:
    with pytest.raises(ValueError):
        instances(np.array([1]), size, slide)


def test_mix_key_wraps_without_warnings_and_separates_pairs() -> None:
    keys = np.repeat(np.arange(-50, 50, dtype=np.int64), 100)
    starts = np.tile(np.arange(-50, 50, dtype=np.int64) * 7, 100)
    extreme = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mixed = mix_key(keys, starts)
        mix_key(extreme, extreme)
    assert mixed.dtype == np.int64
    assert len(np.unique(mixed)) == len(mixed)  # 10,000 distinct pairs, 10,000 distinct keys
    assert (mix_key(keys, starts) == mixed).all()


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-60, 60)), max_size=20), windows())
def test_assign_replicates_rows_and_mixes_keys(rows: list[tuple[int, int]], window: tuple[int, int]) -> None:
    block = _block([Arrival(0, k, t, n) for n, (k, t) in enumerate(rows)])
    out = assign(block, *window)
    taken, starts = instances(block[TS], *window)
    assert set(out.names) == set(block.names) | {WIN}
    for name in block.names:
        if name != KEY:
            assert (out[name] == block[name][taken]).all()
    assert (out[WIN] == starts).all()
    original = block[KEY][taken]
    assert (out[KEY] == mix_key(original, starts)).all()
    # Equal (key, start): equal keys; these few distinct pairs: distinct keys.
    pairs = {}
    for k, s, mixed in zip(original.tolist(), starts.tolist(), out[KEY].tolist()):
        assert pairs.setdefault((k, s), mixed) == mixed
    assert len(set(pairs.values())) == len(pairs)


def test_instance_plan_rewrites_every_stream() -> None:
    plan = JoinPlan((StreamPlan("a", "ta", None, 3, ("x",), ("k",)), StreamPlan("b", "tb", 5, None, (), ("j", "i"))),
                    7, exact_keys=True, join_type="full")
    out = instance_plan(plan, 20)
    assert [(s.range_ms, s.rows, s.key_fields) for s in out.streams] == [(20, None, ("k", WIN)),
                                                                         (20, None, ("j", "i", WIN))]
    assert (out.exact_keys, out.join_type, out.lateness_ms) == (False, "full", 7)
    assert [(s.name, s.topic, s.payload) for s in out.streams] == [(s.name, s.topic, s.payload) for s in plan.streams]


# ------------------------------------------------------------- the whole rewrite through the engine

def _block(arrivals: list[Arrival]) -> Block:
    """One stream's arrivals as a block: key also as field `k` (the key field the engine re-checks)."""
    key = np.array([a.key for a in arrivals], np.int64)
    ts = np.array([a.ts for a in arrivals], np.int64)
    off = np.array([a.offset for a in arrivals], np.int64)
    return system_block(key, ts, np.zeros(len(arrivals)), off, ts, {"v": off * 10, "k": key})


def run_window_join(size: int, slide: int, lateness: int, arrivals: list[Arrival], cuts: list[int], join_type: str,
                    flush_to: int | None = None) -> tuple[list[tuple], set, int]:
    """Feed `arrivals`, replicated by `assign`, cut at `cuts` (then, with `flush_to`, one batch
    without tuples whose watermark floor is that); returns the results as (instance start,
    ref 0, ref 1), the late refs and the final watermark."""
    streams = tuple(StreamPlan(f"s{i}", TOPICS[i], None, None, ("v", WIN), ("k",)) for i in range(2))
    plan = instance_plan(JoinPlan(streams, lateness, exact_keys=True, join_type=join_type), size)
    window = empty_window(plan, [assign(_block([]), size, slide)] * 2)
    bounds = sorted({0, len(arrivals), *[c for c in cuts if 0 < c < len(arrivals)]})
    steps = [(arrivals[a:b], NO_TIME) for a, b in zip(bounds, bounds[1:])]
    if flush_to is not None:
        steps.append(([], flush_to))
    emitted, late = [], set()
    for batch, floor in steps:
        deltas = [assign(_block([x for x in batch if x.stream == i]), size, slide) for i in range(2)]
        out = process_batch(plan, window, deltas, now_ms=0, floor=floor)
        assert (out.results[WINDOW_END] - out.results[WINDOW_START] == size).all()
        emitted += _results(out.results)
        late |= {(TOPICS[i], int(p), int(o)) for i, lb in enumerate(out.late) for p, o in zip(lb[PART], lb["_off"])}
    return emitted, late, window.watermark


def _results(res: Block) -> list[tuple]:
    """(instance start, ref 0, ref 1) per result: the start read from its present members' WIN,
    which the result's window_start names, and its window_end that start + the size."""
    out = []
    for r in range(len(res)):
        refs = tuple((TOPICS[i], int(res[f"s{i}.partition"][r]), int(res[f"s{i}.offset"][r])) for i in range(2))
        starts = {int(res[f"s{i}.{WIN}"][r]) for i in range(2) if refs[i][1] != ABSENT}
        assert starts == {int(res[WINDOW_START][r])}, f"members of one result in different instances: {refs} {starts}"
        out.append((starts.pop(), *refs))
    return out


def _compare(size: int, slide: int, lateness: int, arrivals: list[Arrival], cuts: list[int], join_type: str,
             flush_to: int | None) -> tuple[set, set]:
    """(engine's results, the reference's), after checking the engine emitted none twice."""
    emitted, late, wm = run_window_join(size, slide, lateness, arrivals, cuts, join_type, flush_to)
    duplicates = [r for r, c in Counter(emitted).items() if c > 1]
    assert not duplicates, f"duplicates: {duplicates[:3]}"
    streams = reference_streams(arrivals, 2, late)
    return set(emitted), reference_window_join(streams, size, slide, join_type, TOPICS, {0: wm})


@st.composite
def scenarios(draw, join_types: tuple[str, ...], hopping: bool):
    """(size, slide, lateness, arrivals, cuts, join type, flush_to) of a 2-way window join."""
    size = draw(st.integers(1, 30))
    slide = draw(st.integers(1, size - 1)) if hopping and size > 1 else size
    domain = draw(st.integers(1, 6))
    offsets, arrivals, clock = [0, 0], [], draw(st.integers(-60, 10))
    for _ in range(draw(st.integers(0, 40))):
        s = draw(st.integers(0, 1))
        clock += draw(st.integers(0, 6))
        arrivals.append(Arrival(s, draw(st.integers(0, domain - 1)), clock - draw(st.integers(0, 10)), offsets[s]))
        offsets[s] += 1
    cuts = draw(st.lists(st.integers(0, max(len(arrivals), 1)), max_size=8))
    flush_to = clock + 200 if draw(st.booleans()) else None
    return (size, slide, draw(st.integers(0, 12)), arrivals, cuts, draw(st.sampled_from(join_types)), flush_to)


def _check(case) -> None:
    got, expected = _compare(*case)
    assert got == expected, f"{case[5]}: missing={sorted(expected - got)[:3]} extra={sorted(got - expected)[:3]}"


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(JOIN_TYPES, hopping=False))
def test_tumbling_window_joins_match_the_reference(case) -> None:
    _check(case)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(JOIN_TYPES, hopping=True))
def test_hopping_window_joins_match_the_reference(case) -> None:
    _check(case)


@pytest.mark.parametrize("join_type, partner_ts, results", [("left", -1, 2), ("anti", -1, 1), ("semi", 0, 2)])
def test_hopping_rows_are_decided_per_instance(join_type: str, partner_ts: int, results: int) -> None:
    """W=2, S=1: 0 is in instances -1 and 0; a partner at -1 shares only -1 (left and anti: 0 is
    alone in instance 0), a partner at 0 shares both (semi: 0 comes out twice)."""
    case = (2, 1, 0, [Arrival(0, 0, 0, 0), Arrival(1, 0, partner_ts, 0)], [], join_type, 100)
    got, expected = _compare(*case)
    assert got == expected
    assert len(got) == results


def test_results_name_their_instance_and_their_ids_differ() -> None:
    """The same pair in two hopping instances: two results, window_start their instances, two ids;
    the ids are result_ids of the refs with the window start mixed in."""
    streams = tuple(StreamPlan(f"s{i}", TOPICS[i], None, None, ("v",), ("k",)) for i in range(2))
    plan = instance_plan(JoinPlan(streams, 0, exact_keys=True), 10)
    window = empty_window(plan, [assign(_block([]), 10, 5)] * 2)
    deltas = [assign(_block([Arrival(0, 1, 6, 0)]), 10, 5), assign(_block([Arrival(1, 1, 8, 0)]), 10, 5)]
    res = process_batch(plan, window, deltas, now_ms=0).results
    assert sorted(res[WINDOW_START].tolist()) == [0, 5]
    assert len({(int(h), int(lo)) for h, lo in zip(res[RESULT_ID_HI], res[RESULT_ID_LO])}) == 2
    refs = ([res["s0.partition"], res["s1.partition"]], [res["s0.offset"], res["s1.offset"]])
    assert [x.tolist() for x in result_ids(TOPICS, *refs, res[WINDOW_START])] == \
        [res[RESULT_ID_HI].tolist(), res[RESULT_ID_LO].tolist()]
    plain = result_ids(TOPICS, *refs)
    assert plain[0][0] == plain[0][1] and plain[0][0] != res[RESULT_ID_HI][0]


def test_the_same_pair_in_two_hopping_instances_is_two_results() -> None:
    """W=10, S=5: 6 and 8 share instances 0 and 5; 12 is in 5 and 10 only, so it meets 8 in 5."""
    arrivals = [Arrival(0, 1, 6, 0), Arrival(1, 1, 8, 0), Arrival(1, 1, 12, 1)]
    emitted, _, _ = run_window_join(10, 5, 0, arrivals, [1, 2], "inner")
    assert sorted(emitted) == [(0, ("t0", 0, 0), ("t1", 0, 0)), (5, ("t0", 0, 0), ("t1", 0, 0)),
                               (5, ("t0", 0, 0), ("t1", 0, 1))]


def test_a_window_boundary_off_by_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tumbling W=10: 10 opens instance 10, so it never meets 5 (instance 0), although they are
    less than W apart. An `instances` that also puts t in [t - W, t) (s <= t <= s + W) joins them."""
    case = (10, 10, 0, [Arrival(1, 1, 5, 0), Arrival(0, 1, 10, 0)], [1], "left", 100)
    got, expected = _compare(*case)
    assert got == expected == {(10, ("t0", 0, 0), ("t1", -1, -1))}
    honest = window_instances.instances
    monkeypatch.setattr(window_instances, "instances", lambda ts, size, slide: honest(ts, size + 1, slide))
    got, expected = _compare(*case)
    assert got != expected
    assert (0, ("t0", 0, 0), ("t1", 0, 0)) in got
