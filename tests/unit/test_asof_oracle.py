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


SCENARIOS = 4
KEY_SPAN = 1000  # scenario i's keys are shifted by i * KEY_SPAN: no key of one meets another's


@pytest.mark.parametrize("join_type", ["inner", "left"])
def test_the_asof_oracle_is_the_reference(spark, join_type: str) -> None:
    """SCENARIOS scenarios in one Spark job (a job costs seconds): scenario i is group and
    partition i, with keys of its own and its own final watermark, so the oracle must keep
    them apart as it keeps groups apart."""
    scenarios = [scenario(seed * 2 + (join_type == "left")) for seed in range(SCENARIOS)]
    stream = spark.createDataFrame([(i, t.ref[2], t.key + i * KEY_SPAN, t.ts, i)
                                    for i, (tuples, _, _) in enumerate(scenarios) for t in tuples],
                                   "partition int, offset long, key long, ts long, group int")
    table = spark.createDataFrame([(i, v.ref[2], v.key + i * KEY_SPAN, v.ts, i, v.deleted)
                                   for i, (_, versions, _) in enumerate(scenarios) for v in versions],
                                  "partition int, offset long, key long, ts long, group int, deleted boolean")
    marks = spark.createDataFrame([(i, watermark) for i, (_, _, watermark) in enumerate(scenarios)],
                                  "group int, watermark long")
    rows = expected_asof_join(stream, table, join_type, marks).collect()
    got = {((STREAM, r["p0"], r["o0"]), (TABLE, r["p1"], r["o1"])) for r in rows}
    assert len(got) == len(rows)
    want = set()
    for i, (tuples, versions, watermark) in enumerate(scenarios):
        for (_, _, o0), (_, p1, o1) in reference_asof_join(tuples, versions, join_type, TABLE, watermark):
            want.add(((STREAM, i, o0), (TABLE, i if p1 == 0 else p1, o1)))  # an absent member keeps its marker
    assert got == want
    times = {(STREAM, i, t.ref[2]): t.ts for i, (tuples, _, _) in enumerate(scenarios) for t in tuples}
    assert all(r["event_time"] == times[(STREAM, r["p0"], r["o0"])] for r in rows)
