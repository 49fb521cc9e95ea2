"""The reuse benchmark's inputs: the airline workload (services/workloads.py, kind airline)
and its job file, the query templates (bench/query_templates.py), and the benchmark's
in-process operator runs (bench/reuse_exec.py) against the reference join."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.bench.reuse import Joined, RunCache, Served, digest_check
from streamjoin.bench.reuse_exec import Inputs, KeyCache, compare, compensate, digest, measure_statistics, run_operator
from streamjoin.bench.reuse_plan import STRATEGIES, plan_all, planning_at_scale, planning_figures, registrations
from streamjoin.engine.block import Block
from streamjoin.engine.reference import RefTuple, RefWindow, reference_join
from streamjoin.schemas.codecs import table_to_block
from streamjoin.schemas.cql_validate import compile_query
from streamjoin.schemas.query import Registration
from streamjoin.bench.query_templates import LIFETIMES_S, RANGES_MIN, SLIDES_MIN, generate_queries
from streamjoin.services.spark.sources import _check_formats
from streamjoin.services.workloads import (AIRLINE_FIELDS, CARRIER_CODES, airline_stream, carrier_shares,
                                           flight_catalogue, generate, json_values)
from streamjoin.settings import JobSettings, SettingsError, load
from streamjoin.topology.reuse.compensation import compensation
from streamjoin.topology.reuse.operator import for_query, relax
from tests.profiles import examples

JOB_FILE = "streamjoin/jobs/airline.yaml"
T0 = 1_700_000_000_000
DTYPE_KINDS = {"int": "i", "float": "f", "str": "U"}
REGIONS = ["us-east", "us-west", "eu", "ap"]


@pytest.fixture(scope="module")
def job() -> JobSettings:
    return load(JOB_FILE)


def columns(job: JobSettings, stream: int, ms: int, seed: int = 1, batch: int = 1) -> dict[str, np.ndarray]:
    return generate(job, stream, np.random.default_rng([seed, stream, batch]), T0, T0 + ms, job.workload.rate)


# ---------------------------------------------------------------- the job file


def test_job_file_is_the_seed_example(job: JobSettings) -> None:
    assert [s.name for s in job.streams] == ["flights", "checkins", "baggage", "weather"]
    assert {s.name: s.fields for s in job.streams} == AIRLINE_FIELDS
    assert [s.key_fields for s in job.streams] == [["num"], ["flight"], ["flight"], ["city"]]
    assert job.join.mode == "hash" and job.workload.kind == "airline"
    assert job.queries.regions == REGIONS
    assert job.queries.latency("us-east", "ap") == job.queries.latency("ap", "us-east") > \
        job.queries.latency("us-east", "us-east")
    assert set(job.queries.source_regions) == set(AIRLINE_FIELDS)
    _check_formats(job)  # what `streamjoin sources` checks before Spark starts


# ---------------------------------------------------------------- the workload


def test_columns_types_order_and_rates(job: JobSettings) -> None:
    """Every stream: its fields in order and type, arrivals in the interval, at rate x its factor."""
    seconds = 20
    for i, spec in enumerate(job.streams):
        cols = columns(job, i, seconds * 1000)
        assert list(cols) == list(spec.fields)
        assert {f: cols[f].dtype.kind for f in cols} == {f: DTYPE_KINDS[t] for f, t in spec.fields.items()}
        ts = cols["ts"]
        assert np.all(np.diff(ts) >= 0) and T0 <= ts.min() and ts.max() < T0 + seconds * 1000
        expected = job.workload.rate * job.workload.rate_factors[spec.name] * seconds
        assert abs(len(ts) - expected) < 5 * np.sqrt(expected) + 1, (spec.name, len(ts), expected)


def test_same_batch_for_the_same_seed_stream_and_batch(job: JobSettings) -> None:
    a, b, other = columns(job, 1, 2000), columns(job, 1, 2000), columns(job, 1, 2000, batch=2)
    assert all(a[f].tobytes() == b[f].tobytes() for f in a)
    assert a["flight"].tobytes() != other["flight"].tobytes()


def test_empty_interval_keeps_the_types(job: JobSettings) -> None:
    for i, spec in enumerate(job.streams):
        cols = generate(job, i, np.random.default_rng(0), T0, T0, 100.0)
        assert {f: (v.dtype.kind, len(v)) for f, v in cols.items()} == {
            f: (DTYPE_KINDS[t], 0) for f, t in spec.fields.items()}


def test_catalogue_has_a_few_big_carriers(job: JobSettings) -> None:
    """Zipf shares of flights by carrier (DL the biggest), distinct flight numbers, gates in
    their terminal, destinations among the weather cities."""
    catalogue = flight_catalogue(job.workload)
    assert len(set(catalogue.num.tolist())) == len(catalogue.num)
    codes, counts = np.unique(catalogue.carrier, return_counts=True)
    shares = dict(zip(codes.tolist(), counts / counts.sum()))
    expected = carrier_shares(job.workload.carriers, job.workload.carrier_skew)
    for rank, code in enumerate(CARRIER_CODES[:job.workload.carriers]):
        assert shares[code] == pytest.approx(expected[rank], abs=0.01)
    assert max(shares, key=shares.__getitem__) == "DL" and shares["DL"] > 3 * shares[CARRIER_CODES[5]]
    assert np.all(np.strings.startswith(catalogue.gate, catalogue.terminal))
    assert np.all(np.strings.startswith(catalogue.num, catalogue.carrier))
    weather = columns(job, 3, 600_000)
    assert set(catalogue.dest.tolist()) <= set(weather["city"].tolist())


def test_streams_refer_to_the_catalogues_flights(job: JobSettings) -> None:
    """Flight updates, check-ins and bags name catalogued flights (so FLIGHTS joins them), with
    the flight's own attributes; bags arrive at a belt of the flight's terminal."""
    catalogue = flight_catalogue(job.workload)
    row = {num: i for i, num in enumerate(catalogue.num.tolist())}
    flights, checkins, baggage = (columns(job, i, 60_000) for i in range(3))
    for cols, name in ((flights, "num"), (checkins, "flight"), (baggage, "flight")):
        assert set(cols[name].tolist()) <= set(row)
    at = np.array([row[n] for n in flights["num"].tolist()])
    for field in ("carrier", "terminal", "gate", "dest"):
        assert np.array_equal(flights[field], getattr(catalogue, field)[at])
    terminals = catalogue.terminal[np.array([row[n] for n in baggage["flight"].tolist()])]
    assert np.all(np.strings.startswith(baggage["area"], np.strings.add(terminals, "-belt")))
    assert len(np.intersect1d(flights["num"], checkins["flight"])) > 0


@pytest.mark.parametrize("change, message", [
    ({"name": "passengers"}, "generates streams"),
    ({"fields": {"flight": "str", "status": "str", "ts": "int"}}, "needs fields"),
])
def test_unknown_airline_stream_is_named(job: JobSettings, change: dict, message: str) -> None:
    spec = job.streams[1].model_copy(update=change)
    with pytest.raises(ValueError, match=message):
        airline_stream(spec)


@pytest.mark.parametrize("factors, message", [
    ({"pasengers": 1.0}, "names streams"),
    ({"weather": 0.0}, "positive finite"),
    ({"weather": float("nan")}, "positive finite"),
])
def test_bad_rate_factors_are_refused(factors: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load(JOB_FILE, workload={"rate_factors": factors})


def test_rate_factors_leave_other_kinds_alone() -> None:
    job = load("streamjoin/jobs/equijoin.yaml")
    assert job.workload.rate_factors == {}
    cols = generate(job, 0, np.random.default_rng(1), T0, T0 + 2000, 500.0)
    assert 800 < len(cols["ts"]) < 1200


# ---------------------------------------------------------------- the templates


def test_templates_are_deterministic_and_prefix_stable() -> None:
    many = generate_queries(50, 3, REGIONS)
    assert generate_queries(50, 3, REGIONS) == many
    assert generate_queries(20, 3, REGIONS) == many[:20]
    assert generate_queries(50, 4, REGIONS) != many
    assert generate_queries(0, 3, REGIONS) == []


@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), regions=st.lists(st.sampled_from(REGIONS), min_size=1, max_size=4, unique=True))
def test_templates_compile_against_the_catalog(seed: int, regions: list[str]) -> None:
    """Every generated query compiles; its windows, slides, selections, sink and lifetime are
    what the templates promise."""
    job = load(JOB_FILE)
    carriers = set(CARRIER_CODES[:job.workload.carriers])
    for text, sink, region, lifetime in generate_queries(30, seed, regions):
        query = compile_query(text, job.streams)
        assert region in regions and sink.startswith(f"ois.{region}.")
        assert lifetime in LIFETIMES_S
        ranges = {w.range_ms for w in query.windows}
        assert ranges <= {m * 60_000 for m in RANGES_MIN}
        if query.slide_ms is not None:
            assert query.slide_ms in {m * 60_000 for m in SLIDES_MIN} and query.slide_ms <= min(ranges)
        assert len(query.join_classes) == 1
        for selection in query.selections:
            assert str(selection.column) in ("flights.carrier", "flights.terminal")
            if selection.column.field == "carrier":
                assert 1 <= len(selection.values) <= 3 and selection.values <= carriers


def test_templates_mix_every_shape_and_region() -> None:
    job = load(JOB_FILE)
    queries = [(compile_query(t, job.streams), region) for t, _, region, _ in generate_queries(400, 5, REGIONS)]
    shapes = {tuple(sorted(q.sources)) for q, _ in queries}
    assert shapes == {("checkins", "flights"), ("baggage", "flights"), ("baggage", "checkins", "flights"),
                      ("flights", "weather")}
    assert {region for _, region in queries} == set(REGIONS)
    dl = sum(any("DL" in s.values for s in q.selections) for q, _ in queries)
    ek = sum(any("EK" in s.values for s in q.selections) for q, _ in queries)
    assert dl > 3 * ek, "big carriers are named more often"


@pytest.mark.parametrize("args, message", [
    ((-1, 0, REGIONS), "number of queries"),
    ((5, 0, []), "at least one region"),
])
def test_template_arguments_are_checked(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_queries(*args)


def test_template_carriers_must_exist() -> None:
    with pytest.raises(ValueError, match="carriers must lie"):
        generate_queries(5, 0, REGIONS, carriers=len(CARRIER_CODES) + 1)


# ---------------------------------------------------------------- operators run in process


def small_inputs(job: JobSettings, seconds: int) -> Inputs:
    """`seconds` of the workload as the benchmark's read-back blocks, offsets running per stream."""
    blocks, sizes = {}, {}
    for i, spec in enumerate(job.streams):
        cols = columns(job, i, seconds * 1000, seed=11)
        n = len(cols["ts"])
        blocks[spec.name] = table_to_block(spec, pa.table(cols), np.arange(n, dtype=np.int32) % 3,
                                           np.arange(n, dtype=np.int64), cols["ts"])
        sizes[spec.name] = np.strings.str_len(json_values(spec, cols)).astype(np.int64)
    return Inputs(blocks, sizes, dict.fromkeys(blocks, 0.0), T0, T0 + seconds * 1000)


def registration(job: JobSettings, text: str, number: int) -> Registration:
    return Registration(f"q-{number}", text, compile_query(text, job.streams), f"sink-{number}", "us-east",
                        None, T0, T0)


def reference(job: JobSettings, inputs: Inputs, reg: Registration) -> set[tuple]:
    """The reference join of `reg`'s query (one join class; its selections applied first)."""
    query = reg.query
    key_of = {c.stream: c.field for c in next(iter(query.join_classes))}
    streams = []
    for window in query.windows:
        block = inputs.blocks[window.stream]
        keep = np.ones(len(block), dtype=bool)
        for selection in query.selections:
            if selection.column.stream == window.stream:
                keep &= np.isin(block[selection.column.field], list(selection.values))
        rows = np.flatnonzero(keep)
        streams.append([RefTuple((window.stream, int(block["_part"][r]), int(block["_off"][r])),
                                 str(block[key_of[window.stream]][r]), int(block["_ts"][r])) for r in rows])
    expected = reference_join(streams, [RefWindow(w.range_ms) for w in query.windows])
    return {tuple((ref[1], ref[2]) for ref in refs) for refs in expected}


def result_refs(results, reg: Registration) -> set[tuple]:
    names = [w.stream for w in reg.query.windows]
    parts = [zip(results[f"{s}.partition"].tolist(), results[f"{s}.offset"].tolist()) for s in names]
    return set(zip(*parts))


def test_operator_runs_equal_the_reference_join(job: JobSettings) -> None:
    """A query alone, and two queries through one relaxed operator and their compensations,
    give exactly the reference join's results of each query."""
    inputs = small_inputs(job, 90)
    keys = KeyCache(inputs, {s.name: s for s in job.streams})
    narrow = registration(job, "SELECT flights.num, checkins.status FROM flights [RANGE 1 MIN], checkins "
                               "[RANGE 1 MIN] WHERE flights.num = checkins.flight AND flights.carrier = 'DL'", 1)
    wide = registration(job, "SELECT flights.gate, checkins.vacant_seats FROM flights [RANGE 5 MIN SLIDE 1 MIN], "
                             "checkins [RANGE 1 MIN SLIDE 1 MIN] WHERE flights.num = checkins.flight AND "
                             "flights.carrier IN ('DL', 'AA')", 2)
    alone = run_operator(job, "alone", for_query(narrow, "us-east"), inputs, keys, 1000)
    want = reference(job, inputs, narrow)
    assert len(want) > 20, "the sample must hold results to compare"
    assert result_refs(alone.results, narrow) == want
    shared_op = relax(for_query(narrow, "us-east"), wide)
    shared = run_operator(job, "shared", shared_op, inputs, keys, 1000)
    for reg in (narrow, wide):
        got = compensate(shared.results, compensation(shared_op, reg), reg.start_ms, None)
        assert result_refs(got, reg) == reference(job, inputs, reg)
    verdict = compare(compensate(shared.results, compensation(shared_op, narrow), T0, None), alone.results,
                      ["flights.num", "checkins.status"])
    assert verdict | {"results": 0} == {"results": 0, "missing": 0, "extra": 0, "duplicates": 0,
                                        "alone_duplicates": 0, "differing_values": 0}


def _alone(job: JobSettings, sql: str, number: int) -> Block:
    """The results of query `sql` (registration `number`) run alone over 60 s of small inputs."""
    inputs = small_inputs(job, 60)
    keys = KeyCache(inputs, {s.name: s for s in job.streams})
    return run_operator(job, "op", for_query(registration(job, sql, number), "us-east"), inputs, keys, 1000).results


def test_compare_counts_missing_extra_and_duplicates(job: JobSettings) -> None:
    results = _alone(job, "SELECT flights.num FROM flights [RANGE 5 MIN], checkins [RANGE 5 MIN] "
                          "WHERE flights.num = checkins.flight", 3)
    n = len(results)
    assert n > 4
    shuffled = results.take(np.r_[np.arange(2, n), 2])  # first two missing, one duplicated
    verdict = compare(shuffled, results, ["flights.num"])
    assert (verdict["missing"], verdict["extra"], verdict["duplicates"]) == (2, 0, 1)
    assert compare(results, shuffled, ["flights.num"])["extra"] == 2


def test_digest_ignores_order_but_not_results_or_values(job: JobSettings) -> None:
    results = _alone(job, "SELECT flights.gate, checkins.status FROM flights [RANGE 5 MIN], checkins "
                          "[RANGE 5 MIN] WHERE flights.num = checkins.flight", 4)
    cols = ["flights.gate", "checkins.status"]
    n = len(results)
    reversed_ = results.take(np.arange(n)[::-1])
    assert digest(reversed_, cols) == digest(results, cols) and digest(results, cols)[0] == n
    assert digest(results.take(np.r_[np.arange(n), 0]), cols) != digest(results, cols)  # a duplicate
    assert digest(results.take(np.arange(1, n)), cols) != digest(results, cols)  # a missing result
    changed = Block(dict(results.columns) | {"checkins.status": np.r_[["changed"], results["checkins.status"][1:]]})
    assert digest(changed, cols)[0] == n and digest(changed, cols) != digest(results, cols)
    assert digest(results.take(np.empty(0, np.int64)), cols) == (0, 0)
    assert digest_check({"q-1": digest(changed, cols), "q-2": (0, 0)}, {"q-1": digest(results, cols), "q-2": (0, 0)}) \
        == {"queries_checked": 2, "count_mismatches": 0, "checksum_mismatches": 1}


def test_statistics_are_measured_on_the_input(job: JobSettings) -> None:
    inputs = small_inputs(job, 60)
    stats = measure_statistics(job, inputs)
    span_s = (inputs.t1_ms - inputs.t0_ms) / 1000
    for spec in job.streams:
        measured = stats.of(spec.name)
        assert measured.rate == pytest.approx(len(inputs.blocks[spec.name]) / span_s)
        assert set(measured.field_bytes) == set(spec.fields) and all(v > 0 for v in measured.field_bytes.values())
    flights = stats.of("flights")
    assert sum(flights.frequencies["carrier"].values()) == pytest.approx(1.0)
    assert max(flights.frequencies["carrier"], key=flights.frequencies["carrier"].get) == "DL"
    assert "num" not in flights.frequencies, "flight numbers are too many to list"
    assert flights.distinct["terminal"] == job.workload.terminals
    assert flights.field_bytes["carrier"] == pytest.approx(4.0)  # "DL": two letters and the quotes


def test_planning_at_scale_registers_the_synthetic_operators_in_every_mode(job: JobSettings) -> None:
    stats = measure_statistics(job, small_inputs(job, 30))
    found = planning_at_scale(job, stats, operators=60, probes=5, at_ms=T0)
    assert set(found) == set(STRATEGIES)
    for strategy, figures in found.items():
        assert figures["operators"] == 60 and figures["queries"] == 5, strategy
        assert figures["median_ms"] <= figures["p99_ms"]
    assert found["none"]["candidates_median"] == 0 < found["relax"]["candidates_median"]


def test_strategies_plan_the_same_queries(job: JobSettings) -> None:
    """none deploys one operator per query; relax shares, each relaxation a deployment."""
    stats = measure_statistics(job, small_inputs(job, 30))
    regs = registrations(job, 40, 1, T0)
    assert [r.id for r in regs] == [f"q-{i}" for i in range(40)]
    none, relaxed = plan_all(job, "none", regs, stats), plan_all(job, "relax", regs, stats)
    assert len(none.planner.operators()) == 40 and planning_figures(none, 0.5)["deployments"] == 40
    figures = planning_figures(relaxed, 0.5)
    assert len(relaxed.planner.operators()) < 40
    assert figures["deployments"] == figures["decisions"]["new"] + figures["decisions"]["relax"]
    assert figures["time_to_deploy"]["seconds"] == pytest.approx(figures["planning"]["total_s"]
                                                                 + 0.5 * figures["deployments"], abs=1e-3)
    served = sorted(q for state in relaxed.planner.operators().values() for q in state.queries)
    assert served == sorted(r.id for r in regs)


def test_run_cache_holds_only_complete_runs(job: JobSettings) -> None:
    """An operator is run again unless every one of its queries was served, and a sampled
    query's output kept."""
    reg = registration(job, "SELECT flights.num FROM flights [RANGE 5 MIN], checkins [RANGE 5 MIN] "
                            "WHERE flights.num = checkins.flight", 5)
    op = for_query(reg, "us-east")
    cache = RunCache()
    assert not cache.holds(op, ["q-5"], frozenset())
    cache.joined[op] = Joined(0.1, 10, 3)
    cache.served[(op, "q-5")] = Served(3, 100, (3, 7), 0.0, None)
    assert cache.holds(op, ["q-5"], frozenset())
    assert not cache.holds(op, ["q-5", "q-6"], frozenset()), "q-6 was never served"
    assert not cache.holds(op, ["q-5"], frozenset({"q-5"})), "a sampled query needs its output"
    assert not cache.holds(relax(op, registration(job, reg.text.replace("5 MIN]", "10 MIN]", 1), 6)), ["q-5"],
                           frozenset())
