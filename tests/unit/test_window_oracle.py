"""The verifier's window-join oracle (services/spark/window_oracle.py, Spark SQL) must be
engine/reference.py's window-join contract, exactly: random small inputs with negative times
and ties, two groups (one sometimes without a final watermark), every join type, tumbling and
hopping windows (slides that do not divide the size among them), and a 3-way inner join."""

from __future__ import annotations

import random

import pytest

from streamjoin.engine.reference import JOIN_TYPES, RefTuple, reference_window_join
from streamjoin.services.spark.window_oracle import WINDOW_START, expected_window_join

pytestmark = pytest.mark.spark

TOPICS = ["t0", "t1", "t2"]
SCHEMA = "partition int, offset long, key long, ts long, group int"


def scenario(seed: int, streams: int, hopping: bool) -> tuple[int, int, list[list[RefTuple]], dict[int, int]]:
    """(size, slide, tuples per stream, group -> final watermark): a key's tuples in partition
    (= group) key % 2; group 1 has no watermark one time in three."""
    rng = random.Random(seed)
    size = rng.randint(2, 15)
    slide = rng.randint(1, size - 1) if hopping else size
    keys, lo, span = rng.randint(1, 3), rng.randint(-30, 5), rng.randint(5, 40)
    tuples = []
    for i in range(streams):
        drawn = [(rng.randrange(keys), rng.randint(lo, lo + span)) for _ in range(rng.randint(2, 15))]
        tuples.append([RefTuple((TOPICS[i], k % 2, n), k, t) for n, (k, t) in enumerate(drawn)])
    # Watermarks from mid-span to past every deadline: some rows alone decided, some not yet.
    marks = {0: rng.randint(lo + span // 2, lo + span + size + 5)}
    if rng.random() > 1 / 3:
        marks[1] = rng.randint(lo + span // 2, lo + span + size + 5)
    return size, slide, tuples, marks


def _oracle(spark, size: int, slide: int, tuples: list[list[RefTuple]], join_type: str,
            marks: dict[int, int]) -> set[tuple]:
    inputs = [spark.createDataFrame([(t.ref[1], t.ref[2], t.key, t.ts, t.ref[1]) for t in s], SCHEMA) for s in tuples]
    watermarks = spark.createDataFrame(list(marks.items()), "group int, watermark long")
    rows = expected_window_join(inputs, size, slide, join_type, watermarks).collect()
    times = {t.ref: t.ts for s in tuples for t in s}
    got = set()
    for r in rows:
        refs = tuple((TOPICS[i], r[f"p{i}"], r[f"o{i}"]) for i in range(len(tuples)))
        present = [times[ref] for ref in refs if ref in times]
        assert r["event_time"] == max(present), r
        got.add((r[WINDOW_START], *refs))
    assert len(got) == len(rows), "a result twice"
    return got


@pytest.mark.parametrize("hopping", [False, True], ids=["tumbling", "hopping"])
@pytest.mark.parametrize("join_type", JOIN_TYPES)
@pytest.mark.parametrize("seed", range(1))
def test_the_window_oracle_is_the_reference(spark, seed: int, join_type: str, hopping: bool) -> None:
    size, slide, tuples, marks = scenario(seed * 97 + JOIN_TYPES.index(join_type) * 7 + hopping, 2, hopping)
    expected = reference_window_join(tuples, size, slide, join_type, TOPICS[:2], marks)
    assert _oracle(spark, size, slide, tuples, join_type, marks) == expected


@pytest.mark.parametrize("hopping", [False, True], ids=["tumbling", "hopping"])
def test_a_three_way_inner_window_join_is_the_reference(spark, hopping: bool) -> None:
    size, slide, tuples, marks = scenario(12 + hopping, 3, hopping)
    expected = reference_window_join(tuples, size, slide, "inner", TOPICS, marks)
    assert expected, "the scenario should produce results"
    assert _oracle(spark, size, slide, tuples, "inner", marks) == expected
