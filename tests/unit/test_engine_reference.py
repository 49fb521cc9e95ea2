"""The vectorised engine against the plain-Python reference join: random
streams, windows, skew, batch cuts and cross-topic arrival order."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import KEY, TS
from streamjoin.engine.probe import sort_by_key_time
from streamjoin.engine.reference import RefWindow, reference_join
from streamjoin.engine.window_join import _partner_ranges
from tests.unit.engine_harness import Arrival, _block, plan_for, reference_streams, run
from tests.profiles import examples


@st.composite
def scenarios(draw, rows: bool):
    m = draw(st.integers(2, 4))
    windows = []
    for _ in range(m):
        if rows and draw(st.booleans()):
            windows.append(RefWindow(rows=draw(st.integers(1, 4))))
        else:
            windows.append(RefWindow(range_ms=draw(st.integers(1, 40))))
    if rows and all(w.rows is None for w in windows):
        windows[0] = RefWindow(rows=draw(st.integers(1, 4)))
    domain = draw(st.integers(1, 6))  # small domains = heavy skew, many matches per key
    n = draw(st.integers(0, 60))
    per_stream_offset = [0] * m
    arrivals = []
    clock = 0
    for _ in range(n):
        s = draw(st.integers(0, m - 1))
        clock += draw(st.integers(0, 5))
        jitter = draw(st.integers(0, 12))  # out-of-order within and across topics
        arrivals.append(Arrival(s, draw(st.integers(0, domain - 1)), max(0, clock - jitter), per_stream_offset[s]))
        per_stream_offset[s] += 1
    cuts = draw(st.lists(st.integers(0, max(n, 1)), max_size=8))
    lateness = draw(st.integers(0, 15))
    return windows, lateness, arrivals, cuts


def _check(windows, lateness, arrivals, cuts, *, final: bool) -> None:
    emitted, late, wm = run(windows, lateness, arrivals, cuts)
    dup = [r for r, c in Counter(emitted).items() if c > 1]
    assert not dup, f"duplicates: {dup[:3]}"
    streams = reference_streams(arrivals, len(windows), late)
    expected = reference_join(streams, windows, {0: wm} if final else None)
    assert set(emitted) == expected, (
        f"missing={sorted(expected - set(emitted))[:3]} extra={sorted(set(emitted) - expected)[:3]}"
    )
    # Nothing judged late unless it really was older than some watermark the group had reached.
    assert all(any(a.ts < wm for a in arrivals if (f"t{a.stream}", 0, a.offset) == ref) for ref in late)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(rows=False))
def test_time_windows_match_reference(case) -> None:
    _check(*case, final=False)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(rows=True))
def test_count_windows_match_reference(case) -> None:
    _check(*case, final=True)


def test_three_way_example_by_hand() -> None:
    windows = [RefWindow(range_ms=10)] * 3
    arrivals = [Arrival(0, 1, 100, 0), Arrival(1, 1, 105, 0), Arrival(2, 1, 109, 0), Arrival(2, 1, 111, 1)]
    emitted, late, _ = run(windows, 100, arrivals, [1, 2, 3])
    # (100,105,109) is inside every window; with 111, 111-100 = 11 >= 10 puts stream 0's tuple out.
    assert emitted == [(("t0", 0, 0), ("t1", 0, 0), ("t2", 0, 0))]
    assert late == set()


def test_late_tuple_goes_to_dead_letter_not_join() -> None:
    windows = [RefWindow(range_ms=50)] * 2
    arrivals = [Arrival(0, 1, 1000, 0), Arrival(1, 1, 1000, 0), Arrival(0, 1, 900, 1)]
    emitted, late, wm = run(windows, 10, arrivals, [2])
    assert wm == 990
    assert late == {("t0", 0, 1)}
    assert emitted == [(("t0", 0, 0), ("t1", 0, 0))]


def test_a_hot_key_read_in_one_batch_probes_only_the_times_its_windows_allow() -> None:
    """A backlog of one key spanning a hundred windows, read in one batch: the results are the
    reference's, and the probe's candidates are the pairs within the time band a combination
    allows, not the key runs' product (which grows with the square of the key's tuples)."""
    windows = [RefWindow(range_ms=1_000), RefWindow(range_ms=500)]
    arrivals = [Arrival(i % 2, 7, (i // 2) * 170, i // 2) for i in range(1_200)]
    emitted, late, wm = run(windows, 0, arrivals, [])
    assert not late and len(emitted) == len(set(emitted))
    assert set(emitted) == reference_join(reference_streams(arrivals, 2, late), windows, None)

    plan = plan_for(windows, 0)
    probes = sort_by_key_time(_block([a for a in arrivals if a.stream == 0]))
    others = sort_by_key_time(_block([a for a in arrivals if a.stream == 1]))
    lo, hi = _partner_ranges(plan, others, 0, 1, probes[KEY], probes[TS])
    # 600 x 600 tuples share the key; each probe's band (-500, +1000) ms holds at most 9 of them.
    assert int((hi - lo).sum()) <= 9 * len(probes) < 600 * 600 // 10
