"""The verifier's outer, semi and anti joins (Spark SQL's own joins, expected_results) must be
engine/reference.py's reference_outer_join, exactly; and the delays verify reports for
results that lack a member."""

from __future__ import annotations

import random
from functools import reduce

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamjoin.engine.reference import JOIN_TYPES, RefTuple, RefWindow, TupleRef, reference_outer_join
from streamjoin.engine.result_ids import ABSENT
from streamjoin.services.spark.compare import production_delays, unmatched_delays
from streamjoin.services.spark.oracles import expected_results
from streamjoin.settings import JobSettings, WindowSpec, load

pytestmark = pytest.mark.spark

TOPICS = ["s0", "s1"]
PARTITIONS = 4  # groups are partitions, as in reference_outer_join; the last one never committed a batch
FOREVER = 1 << 40  # a watermark that decides every row

CASES = [
    # (seed, windows): time, count, and mixed windows both ways round
    (1, [{"range_ms": 5}, {"range_ms": 3}]),
    (2, [{"rows": 2}, {"rows": 1}]),
    (3, [{"rows": 2}, {"range_ms": 4}]),
    (4, [{"range_ms": 3}, {"rows": 3}]),
]


def _streams(rng: random.Random, n: int, keys: int, span: int) -> list[list[RefTuple]]:
    """Two streams of random tuples: ties in ts, keys spread over partitions, offsets with gaps.
    Stream i draws keys i .. keys - 2 + i, so each stream has rows that can never match."""
    streams = []
    for i in range(2):
        next_offset = [0] * PARTITIONS
        tuples = []
        for _ in range(n):
            p = rng.randrange(PARTITIONS)
            tuples.append(RefTuple((TOPICS[i], p, next_offset[p]), rng.randrange(i, keys - 1 + i), rng.randrange(span)))
            next_offset[p] += rng.choice((1, 1, 2))
        streams.append(tuples)
    return streams


def _watermarks(rng: random.Random, span: int) -> dict[int, int]:
    """A random final watermark per group, around the inputs' times; the last group has none."""
    return {g: rng.randrange(span + 6) for g in range(PARTITIONS - 1)}


def _frame(spark, tuples: list[RefTuple]):
    """The tuples as expected_results takes them, each in the group of its partition."""
    rows = [(t.ref[1], t.ref[2], t.key, t.ts, t.ref[1]) for t in tuples]
    return spark.createDataFrame(rows, "partition int, offset long, key long, ts long, group int")


def _spark_results(spark, streams: list[list[RefTuple]], windows: list[WindowSpec],
                   watermark: dict[int, int]) -> dict[str, set[tuple[TupleRef, ...]]]:
    """Per join type, expected_results' refs: all types in one Spark job (one job costs ~1 s)."""
    frames = [_frame(spark, s) for s in streams]
    wm = spark.createDataFrame(list(watermark.items()), "group int, watermark long")
    every = reduce(DataFrame.unionByName, [expected_results(frames, windows, t, wm).withColumn("type", F.lit(t))
                                           for t in JOIN_TYPES])
    out: dict[str, set[tuple[TupleRef, ...]]] = {t: set() for t in JOIN_TYPES}
    for r in every.collect():
        out[r["type"]].add(tuple((TOPICS[i], r[f"p{i}"], r[f"o{i}"]) for i in range(2)))
    return out


def _alone(results: set[tuple[TupleRef, ...]]) -> set[tuple[TupleRef, ...]]:
    return {r for r in results if any(m[1] == ABSENT for m in r)}


@pytest.mark.parametrize("seed,windows", CASES)
def test_expected_results_match_reference(spark, seed: int, windows: list[dict]) -> None:
    """Every join type; random watermarks decide some rows and leave others (and the group
    with no watermark) undecided."""
    rng = random.Random(seed)
    span = 16
    streams = _streams(rng, n=40, keys=6, span=span)
    watermark = _watermarks(rng, span)
    ref_windows = [RefWindow(**w) for w in windows]
    spark_results = _spark_results(spark, streams, [WindowSpec(**w) for w in windows], watermark)
    for join_type in JOIN_TYPES:
        want = reference_outer_join(streams, ref_windows, join_type, TOPICS, watermark)
        got = spark_results[join_type]
        assert got == want, f"{join_type}: missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}"
        # The case must exercise what it checks: rows alone, and rows the watermarks leave undecided.
        assert want, join_type
        if join_type not in ("inner", "semi"):
            everything = reference_outer_join(streams, ref_windows, join_type, TOPICS,
                                              {g: FOREVER for g in range(PARTITIONS)})
            assert _alone(want) and _alone(want) != _alone(everything), join_type


def _job(join_type: str, lateness: int) -> JobSettings:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": w} for n, w in zip("ab", ({"range_ms": 10}, {"range_ms": 4}))]
    return load(None, job="oj", streams=streams, join={"type": join_type, "allowed_lateness_ms": lateness})


def _inputs(spark, rows: list[tuple[int, int, int, int]]):
    return spark.createDataFrame(rows, "partition int, offset long, ts long, arrival long")


def _actual(spark, rows: list[tuple[int, int, int, int, int]]):
    return spark.createDataFrame(rows, "p0 int, o0 long, p1 int, o1 long, produced_ms long")


def test_delays_of_results_lacking_a_member(spark) -> None:
    """production_delays counts from the present members' arrivals; unmatched_delays from a row
    alone's deadline (ts + its window + allowed lateness), on either side of a full join, and
    leaves combinations out."""
    decoded = [_inputs(spark, [(0, 3, 20, 50), (0, 4, 22, 52)]), _inputs(spark, [(1, 7, 7, 60)])]
    actual = _actual(spark, [(0, 3, ABSENT, ABSENT, 100), (ABSENT, ABSENT, 1, 7, 90), (0, 4, 1, 7, 70)])
    produced = {(r.produced_ms, r.delay) for r in production_delays(actual, decoded).collect()}
    assert produced == {(100, 50), (90, 30), (70, 10)}
    alone = {(r.produced_ms, r.delay) for r in unmatched_delays(actual, decoded, _job("full", 5)).collect()}
    assert alone == {(100, 100 - (20 + 10 + 5)), (90, 90 - (7 + 4 + 5))}
    left = {(r.produced_ms, r.delay) for r in unmatched_delays(actual, decoded, _job("left", 0)).collect()}
    assert left == {(100, 100 - (20 + 10))}
