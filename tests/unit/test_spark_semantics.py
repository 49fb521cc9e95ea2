"""The verifier's Spark SQL join must be engine/reference.py's contract, exactly."""

from __future__ import annotations

import random

import pytest

from streamjoin.engine.reference import RefTuple, RefWindow, TupleRef, reference_join
from streamjoin.services.spark.oracles import expected_join
from streamjoin.settings import WindowSpec

pytestmark = pytest.mark.spark


def _streams(rng: random.Random, m: int, n: int, keys: int, span: int, pair_keys: bool) -> list[list[RefTuple]]:
    """Random tuples with many ties in ts, keys spread over partitions, offsets increasing per partition."""
    streams = []
    for i in range(m):
        next_offset = [0, 0, 0]
        tuples = []
        for _ in range(n):
            p = rng.randrange(3)
            k = rng.randrange(keys)
            key = (k, k % 2) if pair_keys else k
            tuples.append(RefTuple((f"s{i}", p, next_offset[p]), key, rng.randrange(span)))
            next_offset[p] += rng.choice((1, 1, 2))  # gaps, as transaction markers leave
        streams.append(tuples)
    return streams


def _frame(spark, tuples: list[RefTuple], pair_keys: bool, groups: dict[TupleRef, int] | None = None):
    """The tuples as expected_join takes them; a tuple's group is its partition (as in
    reference_join) unless `groups` says otherwise."""
    key_type = "struct<a:long,b:long>" if pair_keys else "long"
    rows = [(t.ref[1], t.ref[2], t.key, t.ts, (groups or {}).get(t.ref, t.ref[1])) for t in tuples]
    return spark.createDataFrame(rows, f"partition int, offset long, key {key_type}, ts long, group int")


def _spark_join(spark, streams, windows, watermark, pair_keys, groups=None):
    frames = [_frame(spark, s, pair_keys, groups) for s in streams]
    wm = None if watermark is None else spark.createDataFrame(list(watermark.items()), "group int, watermark long")
    rows = expected_join(frames, windows, wm).collect()
    return {tuple((f"s{i}", r[f"p{i}"], r[f"o{i}"]) for i in range(len(streams))) for r in rows}


CASES = [
    # (seed, windows, with final watermark, two-field key)
    (1, [{"range_ms": 5}, {"range_ms": 3}], False, False),
    (2, [{"rows": 2}, {"rows": 1}], True, False),
    (3, [{"rows": 3}, {"range_ms": 4}], True, False),
    (4, [{"range_ms": 6}, {"range_ms": 2}, {"range_ms": 4}], False, False),
    (5, [{"rows": 2}, {"rows": 2}, {"range_ms": 5}], True, False),
    (6, [{"range_ms": 4}, {"rows": 2}], False, True),
    (7, [{"rows": 1}, {"rows": 4}, {"rows": 2}], True, False),
]


@pytest.mark.parametrize("seed,windows,with_watermark,pair_keys", CASES)
def test_expected_join_matches_reference(spark, seed, windows, with_watermark, pair_keys) -> None:
    rng = random.Random(seed)
    m = len(windows)
    streams = _streams(rng, m, n=30 if m == 2 else 14, keys=4, span=12, pair_keys=pair_keys)
    # Partition 2 has no watermark: like reference_join, none of its results count as final.
    watermark = {0: 7, 1: 10} if with_watermark else None
    want = reference_join(streams, [RefWindow(**w) for w in windows], watermark)
    got = _spark_join(spark, streams, [WindowSpec(**w) for w in windows], watermark, pair_keys)
    assert want, "the case should have results"
    assert got == want, (f"missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}")


def test_final_watermark_holds_per_key_group_not_per_partition(spark) -> None:
    """Repartitioned input: tuples came in on any partition, their key's group joined them.
    The reference, run on the tuples moved to their groups, must agree once moved back."""
    streams = _streams(random.Random(8), 2, n=30, keys=4, span=12, pair_keys=False)
    windows = [RefWindow(rows=2), RefWindow(rows=1)]
    watermark = {0: 7, 1: 10, 2: 12}
    groups = {t.ref: t.key % 3 for s in streams for t in s}

    def in_group(ref: TupleRef) -> TupleRef:
        """The ref with its group for partition; the partition it came in on moves into the topic
        (count windows order by (ts, offset), so offsets stay)."""
        topic, partition, offset = ref
        return f"{topic}@{partition}", groups[ref], offset

    moved = {in_group(t.ref): t.ref for s in streams for t in s}
    in_groups = [[RefTuple(in_group(t.ref), t.key, t.ts) for t in s] for s in streams]
    want = {tuple(moved[ref] for ref in combo) for combo in reference_join(in_groups, windows, watermark)}
    got = _spark_join(spark, streams, [WindowSpec(rows=2), WindowSpec(rows=1)], watermark, False, groups)
    by_partition = _spark_join(spark, streams, [WindowSpec(rows=2), WindowSpec(rows=1)], watermark, False)
    assert want and got == want
    assert by_partition != want, "the case tells groups from partitions"
