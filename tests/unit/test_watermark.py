"""engine/watermark.py against a plain-Python reference: the watermark is the min over
non-idle inputs of their newest event time, minus the lateness, monotone; it does not
depend on the order inputs are read in. And the hash engine's per-group watermark with an
idle stream left out, against the reference join."""

from __future__ import annotations

import random

import numpy as np
import pytest

from streamjoin.engine.reference import RefWindow, reference_join
from streamjoin.engine.watermark import InputClock
from streamjoin.engine.window_join import NO_TIME, empty_window, process_batch
from tests.unit.engine_harness import Arrival, _block, plan_for, reference_streams


def reference(events: list[tuple[int, int, int, int]], inputs: list[int], lateness: int, idle: int | None,
              start_ms: int, now_ms: int, before: int) -> int:
    """events: (stream, input, ts, wall ms) seen so far; the watermark at now_ms, never below `before`."""
    newest: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    for s, p, t, w in events:
        newest[(s, p)] = max(newest.get((s, p), NO_TIME), t)
        last[(s, p)] = w
    live = [newest.get((s, p), NO_TIME) for s, n in enumerate(inputs) for p in range(n)
            if not idle or now_ms - last.get((s, p), start_ms) < idle]
    if not live or min(live) == NO_TIME:
        return before
    return max(before, min(live) - lateness)


@pytest.mark.parametrize("idle", [None, 0, 50])
@pytest.mark.parametrize("seed", range(6))
def test_clock_matches_the_reference(seed: int, idle: int | None) -> None:
    rng = random.Random(seed)
    inputs = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
    lateness, now = rng.choice([0, 5, 20]), 1_000
    clock = InputClock(inputs, lateness, idle, now)
    events: list[tuple[int, int, int, int]] = []
    wm = NO_TIME
    for _ in range(40):
        now += rng.randint(0, 30)
        s = rng.randrange(len(inputs))
        quiet = rng.randrange(inputs[s]) if rng.random() < 0.3 else None  # one input may fall silent
        batch = [(s, p, rng.randint(0, 500), now) for p in (rng.randrange(inputs[s]) for _ in range(rng.randint(0, 4)))
                 if p != quiet]
        events += batch
        if batch:
            parts = np.array([p for _, p, _, _ in batch])
            clock.touch(s, np.unique(parts), now)
            clock.observe(s, parts, np.array([t for _, _, t, _ in batch]))
        wm = reference(events, inputs, lateness, idle, 1_000, now, wm)
        assert clock.advance(now) == wm


def test_a_partition_read_ahead_does_not_move_the_watermark() -> None:
    """Partition 1 of stream 0 is read far ahead: the watermark follows partition 0, the
    laggard, so its on-time tuples (ts >= watermark) are not late."""
    clock = InputClock([2, 1], 10, None, 0)
    clock.observe(0, np.array([1, 1]), np.array([5_000, 9_000]))
    clock.observe(1, np.array([0]), np.array([8_000]))
    assert clock.advance(0) == NO_TIME  # partition 0 of stream 0 has produced nothing
    clock.observe(0, np.array([0]), np.array([100]))
    assert clock.advance(0) == 90
    clock.observe(0, np.array([0]), np.array([3_000]))
    assert clock.advance(0) == 2_990


def test_an_idle_partition_stops_holding_the_watermark_back_then_its_records_are_late() -> None:
    clock = InputClock([2], 0, 1_000, 0)
    clock.touch(0, np.array([0]), 100)
    clock.observe(0, np.array([0]), np.array([500]))
    assert clock.advance(900) == NO_TIME  # partition 1 silent, but not for 1 s yet
    assert clock.idle_streams(900) == frozenset()
    assert clock.advance(1_000) == 500  # partition 1 idle since start: left out
    clock.touch(0, np.array([1]), 1_050)  # it wakes up with a straggler behind the watermark
    clock.observe(0, np.array([1]), np.array([200]))
    assert clock.advance(1_050) == 500  # monotone; the straggler is late by the usual rule (ts < 500)


def test_all_inputs_idle_holds_the_watermark() -> None:
    clock = InputClock([1, 1], 0, 100, 0)
    clock.touch(0, np.array([0]), 0)
    clock.observe(0, np.array([0]), np.array([40]))
    clock.touch(1, np.array([0]), 0)
    clock.observe(1, np.array([0]), np.array([70]))
    assert clock.advance(50) == 40
    assert clock.advance(10_000) == 40
    assert clock.idle_streams(10_000) == frozenset({0, 1})


def test_hold_resets_silence() -> None:
    clock = InputClock([2], 0, 100, 0)
    clock.touch(0, np.array([0]), 0)
    clock.observe(0, np.array([0]), np.array([7]))
    clock.hold(90)  # reading was throttled: partition 1's silence does not count
    assert clock.advance(150) == NO_TIME
    clock.touch(0, np.array([0]), 180)  # partition 0 keeps delivering
    assert clock.advance(190) == 7


# ------------------------------------------------- hash mode: a group's idle stream

def _group_run(idle_after: int | None) -> tuple[set, int, int]:
    """Stream 1 (range 500 ms) gets three tuples then falls silent; stream 0 (count window of
    2 rows) keeps coming. With `idle_after` set, from that batch on stream 1 is idle. Returns
    (emitted refs, final watermark, tuples of stream 0 held)."""
    windows = [RefWindow(rows=2), RefWindow(range_ms=500)]
    plan = plan_for(windows, lateness=10)
    window = empty_window(plan, [_block([]), _block([])])
    arrivals = [Arrival(1, k, 100 + k, k) for k in range(3)]
    arrivals += [Arrival(0, k % 3, 50 + 40 * k, k) for k in range(60)]
    emitted = set()
    for n, cut in enumerate(range(0, len(arrivals), 7)):
        batch = arrivals[cut:cut + 7]
        deltas = [_block([a for a in batch if a.stream == i]) for i in range(2)]
        idle = frozenset({1}) if idle_after is not None and n >= idle_after else frozenset()
        out = process_batch(plan, window, deltas, 0, idle)
        assert not any(len(b) for b in out.late)  # stream 0 arrives in time order: nothing is late
        res = out.results
        for r in range(len(res)):
            emitted.add(tuple((f"t{i}", 0, int(res[f"s{i}.offset"][r])) for i in range(2)))
    return emitted, window.watermark, len(window.state[0])


def test_an_idle_stream_of_a_group_lets_count_windows_emit_and_state_expire() -> None:
    windows = [RefWindow(rows=2), RefWindow(range_ms=500)]
    arrivals = [Arrival(1, k, 100 + k, k) for k in range(3)] + [Arrival(0, k % 3, 50 + 40 * k, k) for k in range(60)]
    held_back, wm_off, state_off = _group_run(None)
    progressed, wm_on, state_on = _group_run(1)
    assert wm_off == 102 - 10  # stream 1's newest minus the lateness: held there for good
    assert wm_on == 50 + 40 * 59 - 10  # stream 0's newest minus the lateness
    streams = reference_streams(arrivals, 2, set())
    assert held_back == reference_join(streams, windows, {0: wm_off})
    assert progressed == reference_join(streams, windows, {0: wm_on})
    assert len(progressed) > len(held_back)
    assert state_on < state_off  # stream 0's tuples expire once the watermark moves


def test_a_floor_reproduces_an_idle_decision() -> None:
    """Recovery replays an idle-driven batch with its recorded watermark as a floor."""
    plan = plan_for([RefWindow(rows=2), RefWindow(range_ms=500)], lateness=0)
    window = empty_window(plan, [_block([]), _block([])])
    out = process_batch(plan, window, [_block([Arrival(0, 1, 400, 0)]), _block([])], 0, floor=300)
    assert out.watermark_after == 300
