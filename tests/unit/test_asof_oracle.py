"""The verifier's as-of oracle (services/spark/asof_oracle.py, Spark SQL) must be
engine/reference.py's as-of contract, exactly: random versions with ties in time, tombstones,
keys without versions, tuples at or past their group's final table watermark, inner and left."""

from __future__ import annotations

import random

import pytest

from streamjoin.engine.reference import RefTuple, RefVersion, reference_asof_join
from streamjoin.services.spark.asof_oracle import expected_asof_join

pytestmark = pytest.mark.spark

STREAM, TABLE = "orders", "customers"


def scenario(seed: int) -> tuple[list[RefTuple], list[RefVersion], int]:
    """Tuples and versions of one group (partition 0), many of them tied in time."""
    rng = random.Random(seed)
    keys, span = rng.randint(1, 6), rng.randint(5, 60)
    versions = [RefVersion((TABLE, 0, n), rng.randrange(keys + 1), rng.randrange(span), rng.random() < 0.25)
                for n in range(rng.randint(0, 30))]
    tuples = [RefTuple((STREAM, 0, n), rng.randrange(keys + 1), rng.randrange(span)) for n in range(rng.randint(0, 30))]
    return tuples, versions, rng.randrange(span + 5)


@pytest.mark.parametrize("join_type", ["inner", "left"])
@pytest.mark.parametrize("seed", range(4))
def test_the_asof_oracle_is_the_reference(spark, seed: int, join_type: str) -> None:
    tuples, versions, watermark = scenario(seed * 2 + (join_type == "left"))
    stream = spark.createDataFrame([(t.ref[1], t.ref[2], t.key, t.ts, 0) for t in tuples],
                                   "partition int, offset long, key long, ts long, group int")
    table = spark.createDataFrame([(v.ref[1], v.ref[2], v.key, v.ts, 0, v.deleted) for v in versions],
                                  "partition int, offset long, key long, ts long, group int, deleted boolean")
    marks = spark.createDataFrame([(0, watermark)], "group int, watermark long")
    rows = expected_asof_join(stream, table, join_type, marks).collect()
    got = {((STREAM, r["p0"], r["o0"]), (TABLE, r["p1"], r["o1"])) for r in rows}
    assert len(got) == len(rows)
    assert got == reference_asof_join(tuples, versions, join_type, TABLE, watermark)
    times = {t.ref: t.ts for t in tuples}
    assert all(r["event_time"] == times[(STREAM, r["p0"], r["o0"])] for r in rows)
