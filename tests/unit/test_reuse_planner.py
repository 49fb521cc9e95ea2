"""The StreamReuse paper's relaxation, compensation and planner against their definitions.

The property: on random streams, a relaxed operator's results (the reference join of the
tuples passing its cover, with its RANGEs) filtered by a query's compensation are exactly
that query's standalone results (the reference join of the tuples passing its own
selections with its own RANGEs, between its barriers), for every query folded into it."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.schemas.query import Column, Query, Registration, Selection, SourceWindow
from streamjoin.settings import QueriesSpec, StreamSpec, WindowSpec
from streamjoin.topology.reuse.compensation import (
    Compensation, CompensationError, compensation, compensation_mask, release_ms,
)
from streamjoin.topology.reuse.cost import Statistics, StreamStats
from streamjoin.topology.reuse.operator import (
    OperatorError, answers, fold, for_query, relax, selection_map,
)
from streamjoin.topology.reuse.planner import Planner, PlanningError, UnknownQueryError
from tests.profiles import examples

MINUTE = 60_000

# ------------------------------------------------------------------ random streams and queries

VALUE_DOMAINS = {"k": [0, 1], "j": [0, 1], "x": [0, 1, 2], "y": ["p", "q", "r"]}


def _joins(classes: list[list[Column]]) -> tuple[tuple[Column, Column], ...]:
    """Chain each class's columns into sorted (left, right) equality pairs."""
    pairs = [tuple(sorted(pair)) for members in classes for pair in zip(members, members[1:])]
    return tuple(sorted(pairs))  # type: ignore[arg-type]


@st.composite
def shapes(draw) -> tuple[list[str], tuple[tuple[Column, Column], ...]]:
    streams = ["a", "b", "c"][:draw(st.integers(2, 3))]
    key_names = ["k", "j"][:draw(st.integers(1, 2))]  # one or two join classes (a composite key)
    return streams, _joins([[Column(s, name) for s in streams] for name in key_names])


@st.composite
def registrations(draw, streams: list[str], joins: tuple[tuple[Column, Column], ...], number: int,
                  filtered: list[Column]) -> Registration:
    """A random query over `streams`; its selections are on columns of `filtered`, which the
    queries of one scenario share, so that covers keep columns and widen their values."""
    all_columns = [Column(s, f) for s in streams for f in VALUE_DOMAINS]
    selections = []
    for column in filtered:
        if draw(st.integers(0, 3)) > 0:
            domain = VALUE_DOMAINS[column.field]
            values = draw(st.sets(st.sampled_from(domain), min_size=1, max_size=len(domain)))
            selections.append(Selection(column, frozenset(values)))
    selected = draw(st.lists(st.sampled_from(all_columns), min_size=1, max_size=5, unique=True))
    windows = tuple(SourceWindow(s, draw(st.integers(1, 20)), draw(st.sampled_from([None, 1, 2, 3, 4, 6])))
                    for s in streams)
    start = draw(st.integers(0, 15))
    end = draw(st.one_of(st.none(), st.integers(start, start + 30)))
    query = Query(columns=tuple(selected), windows=windows, joins=joins, selections=tuple(selections))
    lifetime = draw(st.one_of(st.none(), st.integers(1, 1000)))
    return Registration(id=f"q{number}", text="", query=query, sink=f"sink{number}", region="r0",
                        lifetime_ms=lifetime, registered_ms=0, start_ms=start, end_ms=end)


def _filtered(streams: list[str]) -> st.SearchStrategy[list[Column]]:
    return st.lists(st.sampled_from([Column(s, f) for s in streams for f in VALUE_DOMAINS]), max_size=4, unique=True)


@st.composite
def scenarios(draw):
    streams, joins = draw(shapes())
    data = {}
    for s in streams:
        rows = draw(st.lists(st.fixed_dictionaries(
            {**{f: st.sampled_from(domain) for f, domain in VALUE_DOMAINS.items()}, "ts": st.integers(0, 40)}),
            max_size=10))
        data[s] = rows
    filtered = draw(_filtered(streams))
    regs = [draw(registrations(streams, joins, n, filtered)) for n in range(draw(st.integers(2, 5)))]
    return data, regs


def _passing(rows: list[dict], stream: str, allowed: dict[Column, frozenset]) -> list[int]:
    """Offsets of the rows of `stream` passing every selection on it in `allowed`."""
    conditions = [(c.field, values) for c, values in allowed.items() if c.stream == stream]
    return [i for i, row in enumerate(rows) if all(row[f] in values for f, values in conditions)]


def _join(data: dict[str, list[dict]], sources: tuple[str, ...], key_fields: dict[str, list[str]],
          allowed: dict[Column, frozenset], ranges: dict[str, int]) -> set[tuple]:
    streams = [[RefTuple((s, 0, i), tuple(data[s][i][f] for f in key_fields[s]), data[s][i]["ts"])
                for i in _passing(data[s], s, allowed)] for s in sources]
    return reference_join(streams, [RefWindow(range_ms=ranges[s]) for s in sources])


def _result_columns(data: dict[str, list[dict]], op, results: list[tuple]) -> dict[str, np.ndarray]:
    """An operator's result block: event_time and, per stream, ts/partition/offset and its
    projected fields only (so a compensation reading anything else fails)."""
    columns: dict[str, list] = {"event_time": [max(data[s][i]["ts"] for s, _, i in refs) for refs in results]}
    for position, stream in enumerate(op.sources):
        rows = [data[stream][refs[position][2]] for refs in results]
        columns[f"{stream}.ts"] = [row["ts"] for row in rows]
        columns[f"{stream}.partition"] = [refs[position][1] for refs in results]
        columns[f"{stream}.offset"] = [refs[position][2] for refs in results]
        for name in op.fields_of(stream):
            columns[f"{stream}.{name}"] = [row[name] for row in rows]
    return {name: np.asarray(values, dtype=str if name.endswith(".y") else np.int64)
            for name, values in columns.items()}


@settings(max_examples=examples(75), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_compensated_output_equals_each_query_alone(scenario) -> None:
    data, regs = scenario
    op = fold(regs, "r0")
    op_keys = {s: op.key_fields(s) for s in op.sources}
    results = sorted(_join(data, op.sources, op_keys, op.cover(), dict(op.range_ms)))
    block = _result_columns(data, op, results)
    for reg in regs:
        comp = compensation(op, reg)
        assert set(comp.columns) <= set(op.columns)
        mask = compensation_mask(block, comp, reg.start_ms, reg.end_ms)
        got = {refs for refs, keep in zip(results, mask) if keep}
        expected = {refs for refs in _join(data, op.sources, op_keys, selection_map(reg.query.selections),
                                           {w.stream: w.range_ms for w in reg.query.windows})
                    if reg.start_ms <= max(data[s][i]["ts"] for s, _, i in refs)
                    and (reg.end_ms is None or max(data[s][i]["ts"] for s, _, i in refs) < reg.end_ms)}
        assert got == expected, reg
        # the operator releases no later than the query wants its results (its slide divides the query's)
        times = block["event_time"][mask]
        assert np.all(release_ms(times, comp.slide_ms) >= release_ms(times, op.slide_ms))


@settings(max_examples=examples(100), deadline=None)
@given(st.data())
def test_fold_is_order_free_and_relax_leaves_an_answering_operator_unchanged(data) -> None:
    streams, joins = data.draw(shapes())
    filtered = data.draw(_filtered(streams))
    regs = [data.draw(registrations(streams, joins, n, filtered)) for n in range(data.draw(st.integers(2, 4)))]
    folded = fold(regs, "r0")
    assert all(fold(list(order), "r0") == folded for order in itertools.permutations(regs))
    assert all(answers(folded, reg) for reg in regs)
    extra = data.draw(registrations(streams, joins, 9, data.draw(_filtered(streams))))
    assert (relax(folded, extra) == folded) == answers(folded, extra)
    assert answers(relax(folded, extra), extra)


# ------------------------------------------------------------------ the StreamReuse paper, section 3.2

def _col(name: str) -> Column:
    stream, field = name.split(".")
    return Column(stream, field)


def _sel(name: str, *values) -> Selection:
    return Selection(_col(name), frozenset(values))


FLIGHTS_CHECKINS = ((_col("checkins.flight"), _col("flights.num")),)

# j: the FLIGHTS x CHECKINS join deployed for Q1 (the StreamReuse paper, section 3.2), results every minute.
J = Query(columns=tuple(map(_col, ["flights.num", "flights.gate", "flights.dest", "checkins.status"])),
          windows=(SourceWindow("flights", 5 * MINUTE, MINUTE), SourceWindow("checkins", MINUTE, MINUTE)),
          joins=FLIGHTS_CHECKINS,
          selections=(_sel("flights.carrier_code", "DL"), _sel("flights.terminal", "TERMINAL A")))
# Q2: low-capacity flights of DL and CO, refreshed every 5 minutes.
Q2 = Query(columns=tuple(map(_col, ["flights.num", "checkins.status", "checkins.vacant_seats"])),
           windows=(SourceWindow("flights", 5 * MINUTE, 5 * MINUTE),
                    SourceWindow("checkins", 5 * MINUTE, 5 * MINUTE)),
           joins=FLIGHTS_CHECKINS, selections=(_sel("flights.carrier_code", "DL", "CO"),))


def _reg(query_id: str, query: Query, region: str, lifetime_ms: int | None = None, now: int = 0) -> Registration:
    return Registration(id=query_id, text="", query=query, sink=f"{query_id}.out", region=region,
                        lifetime_ms=lifetime_ms, registered_ms=now, start_ms=now)


def test_seed_example_q1_q2_relaxes_j_as_the_seed_describes() -> None:
    q1, q2 = _reg("q1", J, "r0", lifetime_ms=3_600_000), _reg("q2", Q2, "r0", lifetime_ms=7_200_000)
    relaxed = relax(for_query(q1, "r0"), q2)
    # 1: CARRIER CODE IN (DL, CO) relaxed, TERMINAL dropped from the cover
    assert relaxed.selections == (_sel("flights.carrier_code", "CO", "DL"),)
    assert relaxed.where("flights") == {"carrier_code": ["CO", "DL"]}
    # 2: the seed's list L, plus CHECKINS.FLIGHT: every stream's key column is projected (hash-mode key)
    assert [str(c) for c in relaxed.columns] == [
        "checkins.flight", "checkins.status", "checkins.vacant_seats", "flights.carrier_code", "flights.dest",
        "flights.gate", "flights.num", "flights.terminal"]
    # 3: the longer lifetime; 4: CHECKINS RANGE 5 min, the slide (t mod 1) OR (t mod 5) = every minute
    assert relaxed.expires_ms == 7_200_000
    assert dict(relaxed.range_ms) == {"checkins": 5 * MINUTE, "flights": 5 * MINUTE}
    assert relaxed.slide_ms == MINUTE
    assert relaxed.key_fields("flights") == ["num"] and relaxed.key_fields("checkins") == ["flight"]
    # compensation: Q1 gets j's original conditions back and its 1-minute CHECKINS range ...
    assert compensation(relaxed, q1) == Compensation(
        selections=(_sel("flights.carrier_code", "DL"), _sel("flights.terminal", "TERMINAL A")),
        columns=J.columns, range_ms=(("checkins", MINUTE),), slide_ms=MINUTE)
    # ... while Q2's only condition is the cover itself: nothing to re-check, released every 5 minutes
    assert compensation(relaxed, q2) == Compensation(selections=(), columns=Q2.columns, range_ms=(),
                                                     slide_ms=5 * MINUTE)
    assert not answers(for_query(q1, "r0"), q2) and answers(relaxed, q1) and answers(relaxed, q2)


def test_compensation_mask_and_release_on_a_block() -> None:
    comp = Compensation(selections=(_sel("flights.terminal", "TERMINAL A"),), columns=(), range_ms=(("checkins", 10),),
                        slide_ms=5)
    block = {"event_time": np.array([100, 104, 105, 120]), "checkins.ts": np.array([95, 90, 100, 119]),
             "flights.terminal": np.array(["TERMINAL A", "TERMINAL A", "TERMINAL B", "TERMINAL A"], dtype=object)}
    assert compensation_mask(block, comp, 100, 120).tolist() == [True, False, False, False]
    assert compensation_mask(block, comp, 0, None).tolist() == [True, False, False, True]
    assert release_ms(block["event_time"], 5).tolist() == [105, 105, 110, 125]
    assert release_ms(block["event_time"], None).tolist() == [100, 104, 105, 120]
    numbers = Compensation(selections=(_sel("checkins.vacant_seats", 1, "1"),), columns=(), range_ms=(), slide_ms=None)
    seats = {"event_time": np.array([1, 2, 3]), "checkins.vacant_seats": np.array([1, 2, 1])}
    assert compensation_mask(seats, numbers, 0, None).tolist() == [True, False, True]  # "1" is not 1
    with pytest.raises(CompensationError, match="flights.terminal"):
        compensation_mask({"event_time": np.array([1]), "checkins.ts": np.array([1])}, comp, 0, None)


def test_queries_hash_mode_cannot_run_are_refused_with_the_reason() -> None:
    no_join = Query(columns=(_col("flights.num"),), windows=J.windows, joins=())
    with pytest.raises(OperatorError, match="no join predicate"):
        for_query(_reg("q", no_join, "r0"), "r0")
    nowhere = Query(columns=(_col("baggage.area"),), windows=J.windows, joins=FLIGHTS_CHECKINS)
    with pytest.raises(OperatorError, match="baggage.area"):
        for_query(_reg("q", nowhere, "r0"), "r0")
    with pytest.raises(OperatorError, match="sources or join"):
        relax(for_query(_reg("q1", J, "r0"), "r0"), _reg("q", Query(
            columns=J.columns, windows=J.windows, joins=((_col("checkins.flight"), _col("flights.gate")),)), "r0"))


# ------------------------------------------------------------------ planner

CATALOG = [
    StreamSpec(name="flights", fields={"num": "int", "carrier_code": "str", "terminal": "str", "gate": "str",
                                       "dest": "str", "ts": "int"},
               time_field="ts", key_fields=["num"], window=WindowSpec(range_ms=5 * MINUTE)),
    StreamSpec(name="checkins", fields={"flight": "int", "status": "str", "vacant_seats": "int", "ts": "int"},
               time_field="ts", key_fields=["flight"], window=WindowSpec(range_ms=5 * MINUTE)),
]
# Regions: the sources' (where SINK1 is), the operator's (where SINK3 and SINK4 are), latency 50 between.
SEED_SPEC = QueriesSpec(regions=["sources", "hub"], latency_ms=[[0, 50], [50, 0]], backfill_margin_ms=0,
                        source_regions={"flights": "sources", "checkins": "sources"})


def _stats() -> Statistics:
    stats = Statistics.defaults(CATALOG, rate=200.0)
    flights = stats.of("flights")
    shares = StreamStats(rate=flights.rate, tuple_bytes=flights.tuple_bytes, field_bytes=flights.field_bytes,
                         frequencies={"carrier_code": {"DL": 0.4, "CO": 0.3, "AA": 0.3}},
                         distinct={**flights.distinct, "carrier_code": 3, "terminal": 4})
    return Statistics(streams={**stats.streams, "flights": shares})


def _planner(spec: QueriesSpec = SEED_SPEC) -> Planner:
    return Planner(spec, CATALOG, _stats())


def _register(planner: Planner, reg: Registration):
    decision = planner.plan(reg)
    planner.apply(reg, decision)
    return decision


def test_identical_query_is_served_exactly() -> None:
    planner = _planner()
    first = _register(planner, _reg("q1", J, "hub"))
    assert (first.kind, first.operator, first.candidates) == ("new", "op-1", 0)
    again = _register(planner, _reg("q1bis", J, "hub"))
    assert (again.kind, again.operator, again.candidates) == ("exact", "op-1", 1)
    assert again.costs["op-1"] < again.costs["new@hub"]
    assert planner.operators()["op-1"].version == 1 and planner.operators()["op-1"].queries == ("q1", "q1bis")


def test_overlapping_query_relaxes_when_its_sink_is_near_the_operator() -> None:
    planner = _planner()
    _register(planner, _reg("q1", J, "hub"))
    decision = _register(planner, _reg("q2", Q2, "hub"))  # SINK4: beside the operator
    assert (decision.kind, decision.operator) == ("relax", "op-1")
    assert decision.definition == relax(decision.previous, _reg("q2", Q2, "hub"))
    state = planner.operators()["op-1"]
    assert state.version == 2 and state.queries == ("q1", "q2") and state.definition == decision.definition
    assert planner.compensation("q1").range_ms == (("checkins", MINUTE),)
    explained = json.loads(json.dumps(decision.explain()))
    assert explained["relaxation"]["selection"] == {
        "flights.carrier_code": {"before": ["DL"], "after": ["CO", "DL"]},
        "flights.terminal": {"before": ["TERMINAL A"], "after": None}}
    assert explained["relaxation"]["projection"]["added"] == [
        "checkins.vacant_seats", "flights.carrier_code", "flights.terminal"]
    assert explained["relaxation"]["window"]["range_ms"] == {"checkins": {"before": MINUTE, "after": 5 * MINUTE}}
    assert set(explained["costs"]) == {"op-1", "new@hub"}
    assert explained["costs"]["op-1"]["total"] < explained["costs"]["new@hub"]["total"]


def test_overlapping_query_gets_a_fresh_operator_when_its_sink_is_far_from_the_operator() -> None:
    planner = _planner()
    _register(planner, _reg("q1", J, "hub"))
    decision = _register(planner, _reg("q2", Q2, "sources"))  # SINK1: 50 away from the operator, 0 from the data
    assert (decision.kind, decision.operator, decision.candidates) == ("new", "op-2", 1)
    assert decision.costs["new@sources"] < decision.costs["op-1"]
    assert planner.operators()["op-1"].version == 1


def test_modes_none_and_exact() -> None:
    none = _planner(SEED_SPEC.model_copy(update={"reuse": "none"}))
    _register(none, _reg("q1", J, "hub"))
    assert _register(none, _reg("q1bis", J, "hub")).kind == "new"
    exact = _planner(SEED_SPEC.model_copy(update={"reuse": "exact"}))
    _register(exact, _reg("q1", J, "hub"))
    assert _register(exact, _reg("q2", Q2, "hub")).kind == "new"  # would need relaxing
    assert (_register(exact, _reg("q1bis", J, "hub")).kind, exact.operator_of("q1bis")) == ("exact", "op-1")


def test_drop_narrows_back_then_removes() -> None:
    local = QueriesSpec(regions=["hub"], backfill_margin_ms=0)  # sources beside the operator: switches are free
    planner = _planner(local)
    _register(planner, _reg("q1", J, "hub"))
    _register(planner, _reg("q2", Q2, "hub"))
    narrowed = planner.drop("q2", now_ms=0)
    assert narrowed is not None and narrowed.kind == "narrow"
    assert narrowed.definition == for_query(_reg("q1", J, "hub"), "hub")
    assert planner.operators()["op-1"].version == 3
    assert planner.compensation("q1") == Compensation((), J.columns, (), MINUTE)
    removed = planner.drop("q1", now_ms=0)
    assert removed is not None and (removed.kind, removed.operator) == ("remove", "op-1")
    assert not planner.operators()
    assert planner.plan(_reg("q1", J, "hub")).candidates == 0  # the lattice forgot it too
    with pytest.raises(UnknownQueryError):
        planner.drop("q1")


def test_drop_keeps_the_wide_operator_when_narrowing_does_not_pay_for_its_backfill() -> None:
    planner = _planner()  # sources 50 away: a new version re-reads 5 minutes of both topics across
    _register(planner, _reg("q1", J, "hub"))
    _register(planner, _reg("q1bis", J, "hub"))
    assert planner.drop("q1bis", now_ms=0) is None  # nothing narrower
    _register(planner, _reg("q2", Q2, "hub"))
    assert planner.drop("q2", now_ms=0) is None  # same lifetime: only join CPU to save, less than the backfill
    assert planner.operators()["op-1"].queries == ("q1",) and planner.operators()["op-1"].version == 2
    short = _planner()
    _register(short, _reg("q1", J, "hub", lifetime_ms=MINUTE))
    _register(short, _reg("q2", Q2, "hub", lifetime_ms=None))
    narrowed = short.drop("q2", now_ms=0)  # a day of pulling both topics across saved
    assert narrowed is not None and narrowed.kind == "narrow" and narrowed.definition.expires_ms == MINUTE


def test_hostile_registrations_and_stale_decisions_are_refused() -> None:
    planner = _planner()
    _register(planner, _reg("q1", J, "hub"))
    with pytest.raises(PlanningError, match="already registered"):
        planner.plan(_reg("q1", J, "hub"))
    with pytest.raises(PlanningError, match="region 'moon'"):
        planner.plan(_reg("q9", J, "moon"))
    unknown = Query(columns=(_col("flights.nope"),), windows=J.windows, joins=FLIGHTS_CHECKINS)
    with pytest.raises(PlanningError, match="flights.nope"):
        planner.plan(_reg("q9", unknown, "hub"))
    with pytest.raises(PlanningError, match="no join predicate"):
        planner.plan(_reg("q9", Query(columns=J.columns, windows=J.windows, joins=()), "hub"))
    first, second = planner.plan(_reg("qa", Q2, "sources")), planner.plan(_reg("qb", Q2, "sources"))
    planner.apply(_reg("qa", Q2, "sources"), first)
    with pytest.raises(PlanningError, match="stale"):
        planner.apply(_reg("qb", Q2, "sources"), second)
    relaxing = planner.plan(_reg("qc", Q2, "hub"))
    planner.apply(_reg("qd", J, "hub"), planner.plan(_reg("qd", J, "hub")))
    assert relaxing.kind == "relax"
    planner.apply(_reg("qc", Q2, "hub"), relaxing)  # op-1 did not change: still valid
    assert planner.operator_of("qc") == "op-1"


def test_result_rate_grows_with_windows_and_falls_with_selections() -> None:
    costs = _planner().costs
    narrow_q = Query(columns=J.columns, windows=J.windows, joins=FLIGHTS_CHECKINS,
                     selections=(_sel("flights.carrier_code", "DL"),))
    wide_q = Query(columns=J.columns, windows=tuple(SourceWindow(w.stream, 2 * w.range_ms) for w in J.windows),
                   joins=FLIGHTS_CHECKINS, selections=(_sel("flights.carrier_code", "DL", "CO"),))
    # DL is 0.4 of flights, DL or CO 0.7; each arrival meets rate x RANGE / 100 keys of the other stream
    flights_window, checkins_window = 200 * 0.4 * 300 / 100, 200 * 60 / 100
    expected = 200 * 0.4 * checkins_window + 200 * flights_window
    assert costs.result_rate(narrow_q) == pytest.approx(expected)
    assert costs.result_rate(wide_q) == pytest.approx(expected * 2 * 0.7 / 0.4)
    assert math.isclose(costs.remaining_s(None, 0), 86_400.0)


def test_restore_rebuilds_the_same_planner() -> None:
    planner = _planner()
    for reg in (_reg("q1", J, "hub"), _reg("q2", Q2, "hub"), _reg("q3", Q2, "sources")):
        _register(planner, reg)
    restored = _planner()
    states = dict(planner.operators())
    regs = [planner.registration(q) for q in ("q1", "q2", "q3")]
    restored.restore(states, regs, next_id=3)
    assert restored.operators() == planner.operators() and restored.operator_of("q2") == "op-1"
    probe = _reg("q4", J, "sources")
    assert restored.plan(probe).costs == planner.plan(probe).costs
    assert restored.plan(_reg("q5", Q2, "sources")).operator == "op-2"
    with pytest.raises(PlanningError, match="on no operator"):
        restored.restore(states, regs[:2], next_id=3)
    with pytest.raises(PlanningError, match="two operators"):
        restored.restore({**states, "op-9": states["op-1"]}, regs, next_id=10)


# ------------------------------------------------------------------ planner against a full evaluation

THREE_REGIONS = QueriesSpec(regions=["sources", "hub", "far"], latency_ms=[[0, 2, 9], [2, 0, 5], [9, 5, 0]],
                            source_regions={"flights": "sources", "checkins": "sources"}, backfill_margin_ms=1000)


@st.composite
def airline_registrations(draw, number: int) -> Registration:
    carriers = draw(st.sets(st.sampled_from(["DL", "CO", "AA"]), min_size=1))
    selections = [_sel("flights.carrier_code", *carriers)] if draw(st.booleans()) else []
    if draw(st.booleans()):
        selections.append(_sel("flights.terminal", *draw(st.sets(st.sampled_from(["A", "B"]), min_size=1))))
    slide = draw(st.sampled_from([None, MINUTE, 5 * MINUTE]))
    windows = tuple(SourceWindow(s, draw(st.sampled_from([1, 5, 10])) * MINUTE, slide) for s in ("flights", "checkins"))
    columns = draw(st.lists(st.sampled_from([_col(c) for c in ("flights.num", "flights.gate", "checkins.status")]),
                            min_size=1, unique=True))
    query = Query(columns=tuple(columns), windows=windows, joins=FLIGHTS_CHECKINS, selections=tuple(selections))
    lifetime = draw(st.sampled_from([None, MINUTE, 3_600_000]))
    return _reg(f"q{number}", query, draw(st.sampled_from(THREE_REGIONS.regions)), lifetime, now=number * 1000)


def _full_rank(planner: Planner, op_id: str | None, reg: Registration) -> tuple[float, bool, float, int]:
    """An option's rank worked out in full from its relaxed definition (op_id None: fresh)."""
    costs = planner.costs
    if op_id is None:
        fresh = for_query(reg, reg.region)
        cost = costs.fresh(fresh, reg)
        return (cost.total, True, costs.cpu(fresh), 2)
    current = planner.operators()[op_id].definition
    widened = relax(current, reg)
    now, changed = reg.registered_ms, widened != current
    seconds = costs.remaining_s(None if reg.lifetime_ms is None else now + reg.lifetime_ms, now)
    total = (costs.results_usage(reg, current.region) * seconds
             + costs.pull_usage(current.sources, current.region)
             * (costs.remaining_s(widened.expires_ms, now) - costs.remaining_s(current.expires_ms, now))
             + (costs.backfill(widened.sources, widened.region, max(r for _, r in widened.range_ms)) if changed else 0))
    return (total, changed, costs.cpu(widened) - costs.cpu(current) if changed else 0.0, 1 if changed else 0)


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_planner_picks_the_best_option_and_operators_answer_their_queries(data) -> None:
    planner = Planner(THREE_REGIONS, CATALOG, _stats())
    for number in range(data.draw(st.integers(1, 12))):
        reg = data.draw(airline_registrations(number))
        decision = planner.plan(reg)
        ranks = {op_id: _full_rank(planner, op_id, reg) for op_id in planner.operators()}
        best = min([_full_rank(planner, None, reg)] + list(ranks.values()))
        assert decision.costs == pytest.approx({f"new@{reg.region}": _full_rank(planner, None, reg)[0]}
                                               | {op_id: rank[0] for op_id, rank in ranks.items()}, rel=1e-9)
        chosen = _full_rank(planner, None if decision.kind == "new" else decision.operator, reg)
        assert chosen == pytest.approx(best, rel=1e-9), (decision.explain(), ranks)
        assert decision.definition == (for_query(reg, reg.region) if decision.kind == "new"
                                       else relax(planner.operators()[decision.operator].definition, reg))
        planner.apply(reg, decision)
        if data.draw(st.booleans()):
            planner.drop(data.draw(st.sampled_from(sorted(planner.operators()[decision.operator].queries))),
                         now_ms=reg.registered_ms)
        for state in planner.operators().values():
            regs = [planner.registration(q) for q in state.queries]
            assert all(answers(state.definition, r) for r in regs)
