"""The as-of join engine (engine/asof.py) against the plain-Python reference
(engine/reference.reference_asof_join): random versions arriving out of order within the
table's lateness, tombstones, keys without versions, random batch cuts and restarts, inner and
left; the bounded version state; late versions and tuples; and the mutation the tests exist to
catch (the latest version used instead of the one valid at the tuple's time)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.engine import asof
from streamjoin.engine.asof import DELETED, AsOfPlan, AsOfState, empty_state, process_asof_batch
from streamjoin.engine.block import ARR, KEY, OFF, PART, TS, Block, concat
from streamjoin.engine.reference import ABSENT_REF, RefTuple, RefVersion, reference_asof_join
from streamjoin.engine.window_join import StreamPlan
from tests.profiles import examples

pytestmark = pytest.mark.unit

ORDERS, CUSTOMERS = "orders", "customers"
LATENESS = 50


def plan(join_type: str) -> AsOfPlan:
    return AsOfPlan(StreamPlan("o", ORDERS, 1000, None, ("amount",), ("k",)),
                    StreamPlan("c", CUSTOMERS, 1000, None, ("tier",), ("k",)), LATENESS, LATENESS, join_type)


def block(keys, times, offsets, extra: dict) -> Block:
    n = len(keys)
    return Block({KEY: np.asarray(keys, np.int64), TS: np.asarray(times, np.int64),
                  PART: np.zeros(n, np.int32), OFF: np.asarray(offsets, np.int64), ARR: np.zeros(n, np.int64)}
                 | {k: np.asarray(v) for k, v in extra.items()})


def orders(rows: list[tuple[int, int, int]]) -> Block:  # (key, ts, offset)
    return block([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                 {"amount": np.asarray([float(r[2]) for r in rows], np.float64)})


def customers(rows: list[tuple[int, int, int, bool]]) -> Block:  # (key, ts, offset, deleted)
    return block([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                 {"tier": np.asarray([r[2] % 3 for r in rows], np.int64),
                  DELETED: np.asarray([r[3] for r in rows], bool)})


def restarted(state: AsOfState) -> AsOfState:
    """The state as a restarted worker rebuilds it from what its store kept: its blocks and
    its two clocks, copied, nothing else."""
    copy = lambda b: Block({k: v.copy() for k, v in b.columns.items()})  # noqa: E731
    return AsOfState(copy(state.versions), copy(state.waiting), state.stream_max_ts, state.table_max_ts)


def pairs(results: Block) -> set[tuple[tuple, tuple]]:
    return {((ORDERS, int(p), int(o)), (CUSTOMERS, int(cp), int(co)) if cp != -1 else (CUSTOMERS, ABSENT_REF, ABSENT_REF))
            for p, o, cp, co in zip(results["o.partition"], results["o.offset"], results["c.partition"],
                                    results["c.offset"])}


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    keys = draw(st.integers(1, 5))
    span = draw(st.integers(1, 400))
    versions = [(draw(st.integers(0, keys)), draw(st.integers(0, span)), n, draw(st.booleans()) and draw(st.booleans()))
                for n in range(draw(st.integers(0, 40)))]
    tuples = [(draw(st.integers(0, keys)), draw(st.integers(0, span)), n) for n in range(draw(st.integers(0, 40)))]
    # Arrival: by event time plus a delay under the lateness, so nothing is late; streams interleave,
    # the table's read up to `behind` ms of event time after the stream's (topics are read apart).
    behind = draw(st.sampled_from([0, 0, 60, 300]))
    arrivals = [("c", v, v[1] + behind + draw(st.integers(0, LATENESS - 1))) for v in versions] + \
               [("o", t, t[1] + draw(st.integers(0, LATENESS - 1))) for t in tuples]
    arrivals.sort(key=lambda a: (a[2], a[0], a[1][2]))
    # Within one side a partition is read in offset order: number each side's records as they arrive.
    seen = {"c": 0, "o": 0}
    ordered = []
    for side, row, _ in arrivals:
        ordered.append((side, (row[0], row[1], seen[side], *row[3:])))
        seen[side] += 1
    cuts = sorted(set(draw(st.lists(st.integers(0, len(ordered)), max_size=6))))
    restarts = set(draw(st.lists(st.integers(0, len(cuts)), max_size=2)))
    return {"arrivals": ordered, "cuts": cuts, "restarts": restarts, "join_type": draw(st.sampled_from(["inner", "left"]))}


def run(scenario: dict, engine: Callable = process_asof_batch) -> tuple[Block, AsOfState, AsOfPlan]:
    p = plan(scenario["join_type"])
    state = empty_state(orders([]), customers([]))
    out = []
    arrivals, bounds = scenario["arrivals"], [0, *scenario["cuts"], len(scenario["arrivals"])]
    for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        batch = arrivals[lo:hi]
        outcome = engine(p, state, orders([r for s, r in batch if s == "o"]),
                         customers([r for s, r in batch if s == "c"]), now_ms=0)
        assert not len(outcome.late_stream) and not len(outcome.late_table)
        out.append(outcome.results)
        if n in scenario["restarts"]:
            state = restarted(state)
    return concat(out), state, p


def expected(scenario: dict, state: AsOfState, p: AsOfPlan) -> set:
    stream = [RefTuple((ORDERS, 0, r[2]), r[0], r[1]) for s, r in scenario["arrivals"] if s == "o"]
    versions = [RefVersion((CUSTOMERS, 0, r[2]), r[0], r[1], r[3]) for s, r in scenario["arrivals"] if s == "c"]
    return reference_asof_join(stream, versions, p.join_type, CUSTOMERS, state.watermarks(p)[1])


@hsettings(max_examples=examples(150), deadline=None)
@given(scenario=scenarios())
def test_the_engine_joins_what_the_reference_joins(scenario: dict) -> None:
    results, state, p = run(scenario)
    got = pairs(results)
    assert len(got) == len(results), "every result once"
    assert got == expected(scenario, state, p)
    ids = set(zip(results["result_id_hi"].tolist(), results["result_id_lo"].tolist()))
    assert len(ids) == len(results)
    # Every tuple not yet joined waits for the table's watermark, and no key keeps two versions
    # a future tuple cannot tell apart.
    assert (state.waiting[TS] >= state.watermarks(p)[1]).all()
    held = asof.prune(state.versions, state.horizon(p))
    old = held[KEY][held[TS] < state.horizon(p)]
    assert len(old) == len(np.unique(old))
    assert len(state.versions) < 2 * state.pruned + asof.PRUNE_SLACK


def latest_version(versions: Block, probes: Block) -> np.ndarray:
    """The mutation: each probe gets its key's newest version, whatever its time."""
    at = np.full(len(probes), asof.NO_VERSION, np.int64)
    for i, key in enumerate(probes[KEY].tolist()):
        mine = np.flatnonzero(versions[KEY] == key)
        if len(mine):
            at[i] = mine[-1]
    return at


def test_the_tests_catch_the_latest_version_used_instead_of_the_valid_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # customer 1 changed tier at 10 and at 30; the order at 20 is joined with the row of 10, the
    # order at 200 with the row of 30 (customer 2's update at 500 moves the table's watermark past both).
    scenario = {"arrivals": [("c", (1, 10, 0, False)), ("o", (1, 20, 0)), ("c", (1, 30, 1, False)),
                             ("o", (1, 200, 1)), ("c", (2, 500, 2, False))],
                "cuts": [], "restarts": set(), "join_type": "inner"}
    results, state, p = run(scenario)
    assert pairs(results) == expected(scenario, state, p) == {((ORDERS, 0, 0), (CUSTOMERS, 0, 0)),
                                                              ((ORDERS, 0, 1), (CUSTOMERS, 0, 1))}
    monkeypatch.setattr(asof, "valid_versions", latest_version)
    results, state, p = run(scenario)
    assert pairs(results) != expected(scenario, state, p)


def test_a_tombstone_deletes_and_a_later_version_brings_the_key_back() -> None:
    p = plan("left")
    state = empty_state(orders([]), customers([]))
    process_asof_batch(p, state, orders([]), customers([(1, 10, 0, False), (1, 20, 1, True), (1, 40, 2, False)]), 0)
    outcome = process_asof_batch(p, state, orders([(1, 15, 0), (1, 25, 1), (1, 45, 2), (2, 45, 3)]),
                                 customers([(9, 500, 3, False)]), 0)
    got = {o: c for (_, _, o), (_, _, c) in pairs(outcome.results)}
    assert got == {0: 0, 1: ABSENT_REF, 2: 2, 3: ABSENT_REF}


def test_equal_times_take_the_later_offset_and_a_version_at_the_tuples_time_counts() -> None:
    p = plan("inner")
    state = empty_state(orders([]), customers([]))
    outcome = process_asof_batch(p, state, orders([(1, 10, 0)]), customers([(1, 10, 0, False), (1, 10, 1, False),
                                                                              (1, 100, 2, False)]), 0)
    assert pairs(outcome.results) == {((ORDERS, 0, 0), (CUSTOMERS, 0, 1))}


def test_late_versions_and_tuples_are_returned_as_dead_letters_and_change_nothing() -> None:
    p = plan("left")
    state = empty_state(orders([]), customers([]))
    first = process_asof_batch(p, state, orders([(1, 200, 0)]), customers([(1, 300, 0, False)]), 0)
    # Watermarks 150 and 250: the order at 200 is decided, and customer 1 had no row then.
    assert pairs(first.results) == {((ORDERS, 0, 0), (CUSTOMERS, ABSENT_REF, ABSENT_REF))}
    outcome = process_asof_batch(p, state, orders([(1, 100, 1)]), customers([(1, 190, 1, False)]), 0)
    assert outcome.late_stream[OFF].tolist() == [1] and outcome.late_table[OFF].tolist() == [1]
    assert not len(outcome.results) and state.versions[OFF].tolist() == [0]


def test_versions_held_stay_bounded_by_keys_and_recent_versions_not_by_history() -> None:
    p = plan("inner")
    state = empty_state(orders([]), customers([]))
    offset = 0
    for second in range(200):  # each of 10 keys updated every 10 ms, orders for each key alongside
        t0 = second * 100
        ups = [(k, t0 + step, (offset := offset + 1), False) for step in range(0, 100, 10) for k in range(10)]
        outcome = process_asof_batch(p, state, orders([(k, t0 + 5, second * 10 + k) for k in range(10)]),
                                     customers(ups), 0)
        assert not len(outcome.late_table)
        # Each key's newest old version and those of the last lateness and batch, pruned once doubled.
        assert len(state.versions) <= 2 * 10 * (1 + (LATENESS + 100) // 10 + 1) + asof.PRUNE_SLACK
    assert len(state.waiting) <= 10 * 2


def test_a_tombstone_is_not_forgotten_while_an_older_version_can_still_arrive() -> None:
    # The stream is read ahead of the table: its watermark (250) is far past the table's (50).
    # Customer 1 was deleted at 100; its version of 60 arrives afterwards, on time for the
    # table. The order at 300 must find the deletion, not the older row.
    p = plan("inner")
    state = empty_state(orders([]), customers([]))
    process_asof_batch(p, state, orders([(1, 300, 0)]), customers([(1, 100, 0, True)]), 0)
    outcome = process_asof_batch(p, state, orders([]), customers([(1, 60, 1, False), (2, 500, 2, False)]), 0)
    assert not len(outcome.late_table) and not len(outcome.results)
    scenario = {"arrivals": [("o", (1, 300, 0)), ("c", (1, 100, 0, True)), ("c", (1, 60, 1, False)),
                             ("c", (2, 500, 2, False))], "cuts": [2], "restarts": set(), "join_type": "inner"}
    results, state, p = run(scenario)
    assert pairs(results) == expected(scenario, state, p) == set()
