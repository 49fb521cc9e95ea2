"""The tiered sorted runs of a stream's window (engine/runs.py): the same tuples, in the same
order, as one sorted list would hold under random batches and expiries; O(log n) runs; and a
small batch into a large window copies the batch, not the window."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import Block, system_block
from streamjoin.engine.reference import RefWindow
from streamjoin.engine.runs import SortedRuns
from streamjoin.engine.probe import distinct, sort_by_key_time
from streamjoin.engine.window_join import empty_window, process_batch
from tests.unit.engine_harness import plan_for
from tests.profiles import examples

Row = tuple[int, int, int, int]  # key, ts, off, arrival number (the order ties keep)


def _text(numbers: np.ndarray) -> np.ndarray:
    """A wide text column ('U', moved as rows of bytes by merges) that spells each arrival number."""
    return np.array([f"#{n}" * (1 + n % 3) for n in numbers.tolist()], dtype="U24")


def _block(rows: list[Row]) -> Block:
    """Rows as a stream block sorted by (key, ts, off); `v` carries each row's arrival number,
    and `t` the same as text."""
    cols = np.array(rows, dtype=np.int64).reshape(-1, 4)
    block = system_block(cols[:, 0], cols[:, 1], np.zeros(len(rows)), cols[:, 2], cols[:, 1],
                         {"v": cols[:, 3], "t": _text(cols[:, 3])})
    return sort_by_key_time(block)


def _rows(block: Block) -> list[Row]:
    assert block["t"].tolist() == _text(block["v"]).tolist()  # text columns move with their rows
    return list(zip(*(block[c].tolist() for c in ("_key", "_ts", "_off", "v"))))


def _live(model: list[Row], floor: int) -> list[Row]:
    """The model's answer: live rows in (key, ts, off) order, earlier arrivals first on ties."""
    return sorted(r for r in model if r[1] >= floor)


def _assert_tiered(runs: SortedRuns) -> None:
    sizes = [r.alive(runs.floor) for r in runs.runs]
    assert all(s > 0 for s in sizes)
    assert all(older >= 2 * newer for older, newer in zip(sizes, sizes[1:]))
    assert len(sizes) <= 1 + math.log2(max(len(runs), 1))


# Small domains so keys, times and even whole (key, ts, off) triples repeat.
_row = st.tuples(st.integers(-3, 3), st.integers(-20, 40), st.integers(0, 5))
_step = st.one_of(st.tuples(st.just("add"), st.lists(_row, max_size=12)),
                  st.tuples(st.just("expire"), st.integers(-25, 45)),
                  st.tuples(st.just("probe"), st.lists(st.integers(-4, 4), max_size=5)),
                  st.tuples(st.just("merged"), st.none()))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_step, max_size=40))
def test_runs_hold_what_one_sorted_list_holds(steps: list) -> None:
    runs = SortedRuns(_block([]))
    model: list[Row] = []
    arrivals = 0
    for op, arg in steps:
        if op == "add":
            batch = [(k, t, o, arrivals + n) for n, (k, t, o) in enumerate(arg)]
            arrivals += len(batch)
            model += batch
            runs.add(_block(batch))
        elif op == "expire":
            runs.expire_before(arg)
        elif op == "probe":
            assert _rows(runs.matching(np.array(arg, dtype=np.int64))) == \
                [r for r in _live(model, runs.floor) if r[0] in arg]
        else:
            assert _rows(runs.merged()) == _live(model, runs.floor)
        assert len(runs) == len(_live(model, runs.floor))
        _assert_tiered(runs)


def _sliding(window_batches: int, batches: int, batch: int = 1000) -> tuple[list[int], int]:
    """A window of `window_batches` batches sliding over `batches` batches of time-ordered tuples.
    Returns the tuples copied per batch (merges and trims) and the most runs held at once."""
    rng = np.random.default_rng(7)
    runs = SortedRuns(_block([]))
    copied, most_runs = [], 0
    for n in range(batches):
        ts = np.arange(n * batch, (n + 1) * batch, dtype=np.int64)
        rows = np.stack([rng.integers(0, 500, batch), ts, ts, ts], axis=1)
        before = runs.copied
        runs.add(_block([tuple(r) for r in rows.tolist()]))
        runs.expire_before((n + 1 - window_batches) * batch)
        copied.append(runs.copied - before)
        most_runs = max(most_runs, len(runs.runs))
    return copied, most_runs


def test_maintenance_per_batch_follows_the_batch_not_the_window() -> None:
    """Amortised copying per batch grows with log(window), not with the window: a window 8 times
    larger copies well under 8 times more per batch, and runs stay O(log n)."""
    small, small_runs = _sliding(window_batches=16, batches=160)
    large, large_runs = _sliding(window_batches=128, batches=640)
    small_mean = np.mean(small[32:])
    large_mean = np.mean(large[256:])
    assert large_mean < 2 * small_mean
    assert large_mean < 1000 * 2 * math.log2(128)  # each tuple merged O(log n) times
    assert small_runs <= 2 + math.log2(16) and large_runs <= 2 + math.log2(128)


def test_a_small_batch_into_a_large_window_leaves_the_large_run_alone() -> None:
    plan = plan_for([RefWindow(range_ms=10**9), RefWindow(range_ms=10**9)], lateness=0)
    window = empty_window(plan, [_block([]), _block([])])
    big = [(k % 700, k, k, k) for k in range(50_000)]
    process_batch(plan, window, [_block(big), _block(big)], now_ms=0)
    large_runs = [runs.runs[0] for runs in window.runs]
    copied = [runs.copied for runs in window.runs]
    small = [(k % 700, 50_000 + k, 50_000 + k, 50_000 + k) for k in range(100)]
    out = process_batch(plan, window, [_block(small), _block(small)], now_ms=0)
    assert len(out.results) > 0
    assert [runs.runs[0] for runs in window.runs] == large_runs
    assert all(a is b for a, b in zip((runs.runs[0] for runs in window.runs), large_runs))
    assert [runs.copied for runs in window.runs] == copied  # the batch became its own run: nothing rewritten
    assert window.tuples == 2 * 50_100


@settings(max_examples=examples(200), deadline=None)
@given(values=st.lists(st.integers(-3, 3), max_size=20), presort=st.booleans())
def test_distinct_is_numpys_unique_sorted_or_not(values: list[int], presort: bool) -> None:
    """The probe's distinct keys: neighbours compared when the keys come sorted, np.unique otherwise."""
    keys = np.array(sorted(values) if presort else values, dtype=np.int64)
    assert distinct(keys).tolist() == sorted(set(values))
