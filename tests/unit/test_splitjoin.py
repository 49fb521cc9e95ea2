"""SplitJoin's engine as a property: for random core counts and
switches of it, windows, predicates, punctuation precision, lateness and the
order and batch sizes in which each core reads the source partitions, every
core numbers the input identically and the merger's output equals the
reference join, each result once, in input order when punctuated."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.engine.psp.slices import GLOBAL_SEQ
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join, theta_order
from streamjoin.engine.splitjoin.core import SplitCore, sequence_columns, splitjoin_plan
from streamjoin.engine.splitjoin.input_order import InputOrder
from streamjoin.engine.splitjoin.merge import OrderedMerge
from streamjoin.engine.splitjoin.schedule import Schedule
from tests.unit.psp_harness import Arrival, block_of, make_plan, pair_predicate, template, term_strategy, terms_of
from tests.profiles import examples

FLUSH_TS = 1 << 40  # a mark this late in every partition releases everything
MAX_CORES = 4


@dataclass(frozen=True)
class Mark:
    mark_id: str
    cores: int


@st.composite
def scenarios(draw):
    windows = [RefWindow(range_ms=draw(st.integers(5, 60))) if draw(st.booleans())
               else RefWindow(rows=draw(st.integers(1, 6))) for _ in range(2)]
    partitions = [draw(st.integers(1, 3)) for _ in range(2)]
    arrivals, clock, offsets = [], 0, {}
    for _ in range(draw(st.integers(0, 40))):
        s = draw(st.integers(0, 1))
        p = draw(st.integers(0, partitions[s] - 1))
        clock += draw(st.integers(-6, 8))
        offsets[(s, p)] = offsets.get((s, p), -1) + 1
        arrivals.append(Arrival(s, max(clock, 0), p, offsets[(s, p)], draw(st.integers(10, 16)),
                                float(draw(st.integers(0, 6)))))
    # Scale marks: (arrivals before it, new core count), written into every partition.
    marks = sorted(draw(st.lists(st.tuples(st.integers(0, len(arrivals)), st.integers(1, 4)), max_size=2)))
    return dict(windows=windows, terms=terms_of(draw(st.lists(term_strategy(2), max_size=3))),
                partitions=partitions, arrivals=arrivals, schedule=Schedule.fixed(draw(st.integers(1, 4))), marks=marks,
                lateness=draw(st.integers(0, 10)), precision=draw(st.sampled_from([0, 1, 2, 5])),
                seed=draw(st.integers(0, 10_000)))


def late_refs(arrivals: list[Arrival], lateness: int) -> set[tuple]:
    """The plain rule: late when below the newest event time earlier in its own partition, minus the lateness."""
    newest: dict[tuple[int, int], int] = {}
    late = set()
    for a in sorted(arrivals, key=lambda a: (a.stream, a.part, a.off)):
        seen = newest.get((a.stream, a.part))
        if seen is not None and a.ts < seen - lateness:
            late.add((f"t{a.stream}", a.part, a.off))
        newest[(a.stream, a.part)] = max(a.ts, seen if seen is not None else a.ts)
    return late


def run_core(sc: dict, plan, position: int, rng: random.Random) -> tuple[list, dict, set]:
    """One core reading the partitions in its own random interleaving and batch sizes; returns
    (its outputs in order, (stream, partition, offset) -> global sequence, refs it found late)."""
    order = InputOrder(sc["partitions"], sc["lateness"], [block_of([])] * 2, sc["schedule"])
    core = SplitCore(plan, position, sc["schedule"], [template(2)] * 2, sc["precision"])
    queues = {(s, p): deque() for s, n in enumerate(sc["partitions"]) for p in range(n)}
    marks = deque(sc["marks"])
    for i, a in enumerate(sc["arrivals"] + [None]):
        while marks and marks[0][0] == i:
            cores = marks.popleft()[1]
            for q in queues.values():
                q.append(Mark(f"scale-{i}-{cores}", cores))
        if a is not None:
            queues[(a.stream, a.part)].append(a)
    outputs, numbering, late = [], {}, set()

    def step(caught_up: bool = False) -> None:
        tuples = order.release()
        core.switch(order.schedule)
        for j, b in enumerate(tuples):
            numbering.update({(j, int(p), int(o)): int(g) for p, o, g in zip(b[PART], b[OFF], b[GLOBAL_SEQ])})
        outputs.append(core.process(tuples, order.horizon(), now_ms=0, caught_up=caught_up))

    while any(queues.values()):
        live = [k for k, q in queues.items() if q]
        for _ in range(rng.randint(1, 4)):
            s, p = rng.choice(live)
            q = queues[(s, p)]
            if isinstance(q[0], Mark):
                mark = q.popleft()
                order.scale_mark(s, p, mark.mark_id, mark.cores)
            else:
                chunk = []
                while q and not isinstance(q[0], Mark) and len(chunk) < rng.randint(1, 3):
                    chunk.append(q.popleft())
                dead = order.add(s, block_of(chunk))
                late |= {(f"t{s}", int(p), int(o)) for p, o in zip(dead[PART], dead[OFF])}
            if not q:
                break
        step()
    for s, n in enumerate(sc["partitions"]):
        for p in range(n):
            order.advance(s, p, FLUSH_TS)
    step(caught_up=True)
    return outputs, numbering, late


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_merged_output_is_the_reference_join_in_input_order(sc: dict) -> None:
    rng = random.Random(sc["seed"])
    plan = make_plan(sc["windows"], sc["terms"], ((1,), (0,)))
    cores = [run_core(sc, plan, c, rng) for c in range(MAX_CORES)]
    late = late_refs(sc["arrivals"], sc["lateness"])
    for _, numbering, core_late in cores:
        assert core_late == late
        assert numbering == cores[0][1], "cores numbered the input differently"
    columns = sequence_columns(splitjoin_plan(plan))
    merge = OrderedMerge(sc["schedule"], columns, ordered=sc["precision"] > 0)
    assert len({c.schedule for outputs, _, _ in cores for c in outputs[-1:]}) == 1, "cores switched differently"
    pending = {c: deque(outputs) for c, (outputs, _, _) in enumerate(cores)}
    emitted = []
    while any(pending.values()):
        c = rng.choice([c for c, q in pending.items() if q])
        out = pending[c].popleft()
        merge.learn(out.schedule)
        merge.add(c, out.results, out.punctuation, out.retired)
        emitted += _refs(merge.release())
    assert merge.held == 0, "results left in the merger after every core punctuated the end"
    streams = [[ThetaTuple((f"t{i}", a.part, a.off), a.ts, {"x": a.x, "y": a.y})
                for a in sc["arrivals"] if a.stream == i and (f"t{i}", a.part, a.off) not in late] for i in range(2)]
    expected = reference_theta_join(streams, sc["windows"], pair_predicate(sc["terms"]))
    assert len(emitted) == len(set(r for r, _ in emitted)), "a result was produced twice"
    assert {r for r, _ in emitted} == expected
    if sc["precision"]:
        keys = [k for _, k in emitted]
        assert keys == sorted(keys), "results left out of input order"


def _refs(block) -> list[tuple[tuple, tuple]]:
    """(member refs, (probing member's order, partner's order)) of each result, in block order."""
    out = []
    for r in range(len(block)):
        members = [(i, ThetaTuple((f"t{i}", int(block[f"s{i}.partition"][r]), int(block[f"s{i}.offset"][r])),
                                  int(block[f"s{i}.ts"][r]), {})) for i in range(2)]
        keys = sorted((theta_order(i, t) for i, t in members), reverse=True)
        out.append((tuple(t.ref for _, t in members), tuple(keys)))
    return out


def test_a_core_stores_its_share_and_finds_each_pair_once() -> None:
    """Three cores, an equi-join: each tuple is stored by exactly one core, and the pair
    (r, s) is found by the core that stores the older member."""
    plan = make_plan([RefWindow(range_ms=100)] * 2, terms_of([((0, 1), "eq", 0)]), ((1,), (0,)))
    arrivals = [Arrival(i % 2, i, 0, i // 2, 10, 0.0) for i in range(12)]
    found = []
    for c in range(3):
        order = InputOrder([1, 1], 0, [block_of([])] * 2, Schedule.fixed(3))
        core = SplitCore(plan, c, Schedule.fixed(3), [template(2)] * 2, punctuate_every=1)
        for s in range(2):
            order.add(s, block_of([a for a in arrivals if a.stream == s]))
            order.advance(s, 0, 12)  # releases all twelve; none leaves the 100 ms window
        out = core.process(order.release(), order.horizon(), now_ms=0)
        assert core.state_tuples == 4  # 12 tuples, a third each
        found += [tuple(r) for r in zip(out.results["s0.offset"], out.results["s1.offset"])]
    assert len(found) == len(set(found)) == 36  # 6 x 6 pairs, all within the window


def test_a_release_counts_what_it_stored_even_when_it_expires_it() -> None:
    """A release whose horizon is past its own tuples (a restarted core reading its input and
    a far punctuation in one go): the share it stored is counted, then expired."""
    plan = make_plan([RefWindow(range_ms=100)] * 2, terms_of([((0, 1), "eq", 0)]), ((1,), (0,)))
    stored = []
    for c in range(2):
        order = InputOrder([1, 1], 0, [block_of([])] * 2, Schedule.fixed(2))
        core = SplitCore(plan, c, Schedule.fixed(2), [template(2)] * 2, punctuate_every=1)
        for s in range(2):
            order.add(s, block_of([Arrival(s, t, 0, t, 10, 0.0) for t in range(6)]))
            order.advance(s, 0, 10_000)  # far past the 100 ms window
        out = core.process(order.release(), order.horizon(), now_ms=0)
        assert core.state_tuples == 0
        stored.append(out.stored)
    assert [sum(col) for col in zip(*stored)] == [6, 6] and all(n > 0 for share in stored for n in share)


def test_switch_behind_the_core_is_refused() -> None:
    plan = make_plan([RefWindow(rows=3)] * 2, (), ((1,), (0,)))
    core = SplitCore(plan, 0, Schedule.fixed(2), [template(2)] * 2, punctuate_every=1)
    order = InputOrder([1, 1], 0, [block_of([])] * 2, Schedule.fixed(2))
    for s in range(2):
        order.add(s, block_of([Arrival(s, t, 0, t, 10, 0.0) for t in range(5)]))
        order.advance(s, 0, FLUSH_TS)
    core.process(order.release(), order.horizon(), now_ms=0)
    with pytest.raises(ValueError, match="behind"):
        core.switch(Schedule.fixed(2).switched(3, 4))
    core.switch(Schedule.fixed(2).switched(10, 4))
    assert core.schedule.cores_at(10) == 4


@pytest.mark.parametrize("epochs", [[], [(0, 2), (0, 3)], [(0, 2), (5, 0)]])
def test_bad_schedules_are_refused(epochs: list[tuple[int, int]]) -> None:
    from streamjoin.engine.splitjoin.schedule import Epoch
    with pytest.raises(ValueError):
        Schedule(tuple(Epoch(g, k) for g, k in epochs))


def test_sequence_numbers_do_not_depend_on_fetch_order() -> None:
    """Two partitions read in opposite orders and batch sizes: the same numbering."""
    arrivals = [Arrival(0, t * 3 % 17, t % 2, t // 2, 10, 0.0) for t in range(20)]
    numberings = []
    for first in (0, 1):
        order = InputOrder([2, 1], 5, [block_of([])] * 2, Schedule.fixed(1))
        numbering = {}
        for part in (first, 1 - first):
            for a in [a for a in arrivals if a.part == part]:
                order.add(0, block_of([a]))
                released = order.release()[0]
                numbering |= dict(zip(zip(released[PART].tolist(), released[OFF].tolist()), released[GLOBAL_SEQ].tolist()))
        for p in (0, 1):
            order.advance(0, p, FLUSH_TS)
        order.advance(1, 0, FLUSH_TS)
        released = order.release()[0]
        numbering |= dict(zip(zip(released[PART].tolist(), released[OFF].tolist()), released[GLOBAL_SEQ].tolist()))
        numberings.append(numbering)
    assert numberings[0] == numberings[1] and len(numberings[0]) > 0


def test_a_scale_mark_switches_at_the_first_tuple_past_every_partition_before_it() -> None:
    """Two partitions; the mark comes after ts 30 in one and ts 10 in the other, so the new
    modulus starts at the first released tuple later than 30, read in either order."""
    firsts = []
    for first_part in (0, 1):
        order = InputOrder([2, 1], 0, [block_of([])] * 2, Schedule.fixed(2))
        before = {0: [Arrival(0, t, 0, i, 10, 0.0) for i, t in enumerate((5, 30))],
                  1: [Arrival(0, t, 1, i, 10, 0.0) for i, t in enumerate((10,))]}
        after = {0: [Arrival(0, 40, 0, 2, 10, 0.0)], 1: [Arrival(0, 20, 1, 1, 10, 0.0), Arrival(0, 35, 1, 2, 10, 0.0)]}
        order.add(1, block_of([Arrival(1, 1, 0, 0, 10, 0.0)]))
        for p in (first_part, 1 - first_part):
            order.add(0, block_of(before[p]))
            order.scale_mark(0, p, "m1", 3)
            order.release()
            assert order.schedule == Schedule.fixed(2)  # not before the mark is read in every partition
        order.scale_mark(1, 0, "m1", 3)
        for p in (0, 1):
            order.add(0, block_of(after[p]))
            order.advance(0, p, FLUSH_TS)
        order.advance(1, 0, FLUSH_TS)
        released = order.release()[0]
        first = int(released[GLOBAL_SEQ][released["_ts"] == 35][0])
        assert order.schedule.epochs[-1].cores == 3
        firsts.append(order.schedule.epochs[-1].first_g)
        assert firsts[-1] == first  # ts 20 (after its mark, yet earlier than 30) stays in the old epoch
    assert firsts[0] == firsts[1]


def test_a_punctuation_without_results_moves_the_merger() -> None:
    """A core's last punctuation (caught up) often carries no result: the frontier, and with it
    what the merger says is complete, must move all the same."""
    merge = OrderedMerge(Schedule.fixed(2), ("s0._g", "s1._g"))
    result = Block({"s0._g": np.array([3]), "s1._g": np.array([7])})
    merge.add(0, result, 16, False)
    merge.add(1, Block(), 16, False)
    assert len(merge.release()) == 1 and merge.released_below == 16
    merge.add(0, Block(), 21, False)
    merge.add(1, Block(), 21, False)
    assert len(merge.release()) == 0 and merge.released_below == 21
