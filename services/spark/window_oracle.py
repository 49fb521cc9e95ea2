"""`verify`'s oracle for tumbling and hopping window joins, computed with Spark SQL under
engine/reference.py's contract (`reference_window_join`), sharing no code with the engine
(engine/window_instances.py):

  a window of size W sliding by S has an instance [s, s + W) for every multiple s of S;
  each tuple is exploded into one row per instance holding it (`F.sequence` of starts),
  and the join is Spark's own equi-join on (key, instance start): inner for any number of
  streams, left/right/full outer, left semi and left anti for two. A row alone in its
  instance (outer, anti) counts once its group's final watermark >= ts + W (the sliding
  window rule the engine runs it under); a group without a watermark decides nothing.
  Semi rows need no watermark: a window join's combinations are final at once.

Results are refs p0, o0, p1, o1, ... (join_columns), event_time (the newest member's ts, a
row alone its own) and `window_start`, the instance's start (its end is start + W).
"""

from __future__ import annotations

from functools import reduce
from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.results import EVENT_TIME
from streamjoin.services.spark.join_columns import all_of, o_ref, p_ref, ref_names

WINDOW_START = "window_start"  # result column: the start of the instance a result belongs to

# Spark SQL's join type for each of the job's; the oracle is Spark's own join, not the engine's rule.
_SPARK_JOIN = {"left": "left_outer", "right": "right_outer", "full": "full_outer",
               "semi": "left_semi", "anti": "left_anti"}
# The streams whose rows come out alone when their instance holds no partner.
_ALONE = {"left": (0,), "right": (1,), "full": (0, 1), "anti": (0,)}


def _starts(size_ms: int, slide_ms: int) -> Column:
    """The starts of the instances holding `ts`, ascending: the multiples s of the slide with
    ts - W < s <= ts, in exact long arithmetic (pmod is never negative, so negative times
    floor as they should)."""
    ts, slide = F.col("ts"), F.lit(slide_ms).cast("long")
    newest = ts - F.pmod(ts, slide)
    oldest = ts - F.lit(size_ms) - F.pmod(ts - F.lit(size_ms), slide) + slide
    return F.sequence(oldest, newest, slide)


def _side(tuples: DataFrame, size_ms: int, slide_ms: int, i: int, watermarks: DataFrame | None) -> DataFrame:
    """Stream i's tuples, one row per instance: k<i> (key), s<i> (instance start), p<i>, o<i>,
    ts<i>, and with `watermarks` d<i> (decided alone: its group's watermark >= ts + W)."""
    exploded = tuples.select("partition", "offset", "key", "ts", "group",
                             F.explode(_starts(size_ms, slide_ms)).alias("start"))
    decided: list[Column] = []
    if watermarks is not None:
        exploded = exploded.join(watermarks.select("group", "watermark"), "group", "left")
        # A null watermark (no batch committed in the group) leaves the comparison null: not decided.
        decided = [F.coalesce(F.col("watermark") >= F.col("ts") + F.lit(size_ms), F.lit(False)).alias(f"d{i}")]
    return exploded.select(F.col("key").alias(f"k{i}"), F.col("start").alias(f"s{i}"),
                           F.col("partition").alias(p_ref(i)), F.col("offset").alias(o_ref(i)),
                           F.col("ts").alias(f"ts{i}"), *decided)


def _inner(sides: list[DataFrame]) -> DataFrame:
    """The combinations of same-key rows of `_side`s, all of one instance."""
    acc = sides[0]
    for i, side in enumerate(sides[1:], start=1):
        acc = acc.join(side, all_of([F.col("k0") == F.col(f"k{i}"), F.col("s0") == F.col(f"s{i}")]))
    newest = F.greatest(*[F.col(f"ts{i}") for i in range(len(sides))])
    return acc.select(*ref_names(len(sides)), newest.alias(EVENT_TIME), F.col("s0").alias(WINDOW_START))


def expected_window_join(inputs: Sequence[DataFrame], size_ms: int, slide_ms: int, join_type: str,
                         watermarks: DataFrame | None) -> DataFrame:
    """Every result of a tumbling (slide == size) or hopping window join, as p0, o0, ...,
    event_time and window_start; an absent member's p and o are ABSENT.

    `inputs[i]` holds stream i's accepted tuples: partition int, offset long, key (any
    comparable type), ts long, group int (as expected_join takes them); `join_type` inner
    (any number of streams) or left, right, full, semi, anti (two); `watermarks`: group,
    watermark, each group's final watermark (final_watermarks; inner reads none, its
    combinations are final at once, so it may be None). Contract: engine/reference.py reference_window_join."""
    assert join_type == "inner" or (join_type in _SPARK_JOIN and len(inputs) == 2 and watermarks is not None)
    assert 0 < slide_ms <= size_ms
    if join_type == "inner":
        return _inner([_side(t, size_ms, slide_ms, i, None) for i, t in enumerate(inputs)])
    sides = [_side(t, size_ms, slide_ms, i, watermarks) for i, t in enumerate(inputs)]
    on = (F.col("k0") == F.col("k1")) & (F.col("s0") == F.col("s1"))
    rows = sides[0].join(sides[1], on, _SPARK_JOIN[join_type])
    if join_type in ("semi", "anti"):  # Spark keeps only the left side's columns
        rows = rows.select("*", *[F.lit(None).cast(c.dataType).alias(c.name) for c in sides[1].schema.fields])
    # semi: every row Spark keeps had a partner in its instance. The others: a combination at
    # once (anti has none), a row alone once decided.
    if join_type != "semi":
        p0, p1 = F.col(p_ref(0)), F.col(p_ref(1))
        alone = [(p1.isNull() if side == 0 else p0.isNull()) & F.col(f"d{side}") for side in _ALONE[join_type]]
        rows = rows.filter(reduce(lambda a, b: a | b, alone, p0.isNotNull() & p1.isNotNull()))
    # Spark's null padding is the absent member: its refs become ABSENT, as results carry them.
    refs = [F.coalesce(F.col(c), F.lit(ABSENT).cast(kind)).alias(c)
            for i in (0, 1) for c, kind in ((p_ref(i), "int"), (o_ref(i), "long"))]
    # greatest() skips nulls: a row alone has its own ts and its own instance.
    return rows.select(*refs, F.greatest(F.col("ts0"), F.col("ts1")).alias(EVENT_TIME),
                       F.coalesce(F.col("s0"), F.col("s1")).alias(WINDOW_START))
