"""The verifier's ring-mode Spark SQL join must be reference_theta_join's contract, exactly:
band, equality and UDF terms, 2- to 4-way, RANGE and ROWS windows, ties in event time."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from streamjoin.engine.predicates import compile_terms
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from streamjoin.services.spark.theta_oracle import expected_theta_join
from streamjoin.settings import PredicateTerm, WindowSpec
from tests.unit.ring_harness import pair_predicate

pytestmark = pytest.mark.spark

_DDL = {"int": "bigint", "float": "double", "str": "string", "bool": "boolean", "bytes": "binary"}
PIXELS = 4  # 12-byte images: cheap, and a trailing NUL byte now and then


def both_even(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A tiny UDF: both values even (so it needs both arrays)."""
    return (a % 2 == 0) & (b % 2 == 0)


def _image(rng: random.Random, scene: int) -> bytes:
    base = random.Random(scene).randbytes(3 * PIXELS)
    noisy = bytes(min(255, max(0, v + rng.randint(-6, 6))) for v in base)
    return noisy[:-1] + b"\x00" if rng.random() < 0.3 else noisy


def _value(rng: random.Random, name: str, ftype: str) -> Any:
    if ftype == "int":
        return rng.randrange(3 if name == "k" else 8)  # k: a small key domain, so equalities hold often
    if ftype == "float":
        return rng.randrange(16) / 2
    return _image(rng, rng.randrange(3))


def _streams(rng: random.Random, fields: list[dict[str, str]], n: int, span: int) -> list[list[ThetaTuple]]:
    """Random tuples with many ties in ts, spread over 3 partitions, offsets with gaps."""
    streams = []
    for i, spec in enumerate(fields):
        next_offset = [0, 0, 0]
        tuples = []
        for _ in range(n):
            p = rng.randrange(3)
            values = {f: _value(rng, f, t) for f, t in spec.items()}
            tuples.append(ThetaTuple((f"s{i}", p, next_offset[p]), rng.randrange(span), values))
            next_offset[p] += rng.choice((1, 1, 3))
        streams.append(tuples)
    return streams


def _frame(spark, tuples: list[ThetaTuple], fields: dict[str, str]):
    struct = ",".join(f"{f}:{_DDL[t]}" for f, t in fields.items())
    rows = [(t.ref[1], t.ref[2], t.ts, tuple(t.fields[f] for f in fields)) for t in tuples]
    return spark.createDataFrame(rows, f"partition int, offset long, ts long, v struct<{struct}>")


CASES = {
    # name: (fields per stream, windows, predicate terms, tuples per stream)
    "band-2way": ([{"x": "int", "y": "float"}, {"a": "int", "b": "float"}],
                  [{"range_ms": 5}, {"range_ms": 3}],
                  [{"left": "r.x", "right": "s.a", "within": 1}, {"left": "r.y", "right": "s.b", "within": 1.5}], 40),
    "band-3way": ([{"x": "int"}, {"a": "int", "b": "float"}, {"e": "float"}],
                  [{"range_ms": 4}, {"range_ms": 6}, {"range_ms": 3}],
                  [{"left": "r.x", "right": "s.a", "within": 1}, {"left": "t.e", "right": "s.b", "within": 2}], 18),
    "udf-2way": ([{"img": "bytes", "k": "int"}, {"img": "bytes", "k": "int"}],
                 [{"range_ms": 6}, {"range_ms": 4}],
                 [{"left": "r.img", "right": "s.img", "udf": "similar", "args": {"threshold": 0.9, "tolerance": 16}},
                  {"left": "r.k", "right": "s.k", "udf": "even"}], 40),
    "rows-2way": ([{"x": "int"}, {"a": "int"}],
                  [{"rows": 3}, {"rows": 2}],
                  [{"left": "r.x", "right": "s.a", "within": 2}], 30),
    "mixed-4way": ([{"k": "int", "x": "float"}, {"k": "int"}, {"y": "float", "k": "int"}, {"z": "int"}],
                   [{"range_ms": 6}, {"rows": 4}, {"range_ms": 5}, {"range_ms": 8}],
                   [{"left": "r.k", "right": "s.k"}, {"left": "r.x", "right": "t.y", "within": 1},
                    {"left": "t.k", "right": "s.k"}, {"left": "u.z", "right": "s.k", "within": 2}], 12),
    # u relates to no stream: joined by the time band its RANGE window implies.
    "unrelated-3way": ([{"x": "int"}, {"a": "int"}, {"z": "int"}],
                       [{"range_ms": 4}, {"range_ms": 3}, {"range_ms": 2}],
                       [{"left": "r.x", "right": "s.a"}], 14),
}
UDFS = {"similar": "streamjoin.engine.udfs:pixel_similarity", "even": "tests.unit.test_spark_theta:both_even"}


@pytest.mark.parametrize("case", list(CASES))
def test_expected_theta_join_matches_reference(spark, case: str) -> None:
    fields, windows, predicate, n = CASES[case]
    names = "rstu"[:len(fields)]
    rng = random.Random(case)
    streams = _streams(rng, fields, n, span=12)
    terms = compile_terms(list(names), [PredicateTerm(**t) for t in predicate], UDFS)
    want = reference_theta_join(streams, [RefWindow(**w) for w in windows], pair_predicate(terms))
    frames = [_frame(spark, s, f) for s, f in zip(streams, fields)]
    rows = expected_theta_join(frames, [WindowSpec(**w) for w in windows], terms).collect()
    got = {tuple((f"s{i}", r[f"p{i}"], r[f"o{i}"]) for i in range(len(fields))) for r in rows}
    assert want, "the case should have results"
    assert len(rows) == len(got), "each combination once"
    assert got == want, f"missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}"
    event_times = {tuple((f"s{i}", r[f"p{i}"], r[f"o{i}"]) for i in range(len(fields))): r["event_time"] for r in rows}
    ts = {t.ref: t.ts for s in streams for t in s}
    assert all(t == max(ts[ref] for ref in combo) for combo, t in event_times.items())
