"""`verify`'s oracles for hash mode: the exact equi-join (`expected_join`) and
the 2-stream outer, semi and anti joins (`expected_outer_join`), computed with
Spark SQL under engine/reference.py's contract; `expected_results` picks one by
the job's join type. Results are refs p<i>, o<i> (join_columns) and event_time.

Windows, as an exclusive bound on the result time T each tuple allows
(`until`), so one rule covers both kinds and any number of streams:
  RANGE W:  T - ts < W                  <=>  T < ts + W
  ROWS  N:  fewer than N same-key tuples u with ts(u) <= T and
            (ts(u), offset(u)) > (ts(s), offset(s))
            <=>  T < ts of the N-th such tuple after s in (ts, offset) order
            (no bound when there is none).

Outer, semi and anti joins (2 streams) are Spark SQL's own left/right/full
outer, left semi and left anti joins on key equality and that window rule; a
null-padded row counts once its group's final watermark decides it
(engine/reference.py `decided`), its absent member's refs ABSENT.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.results import EVENT_TIME
from streamjoin.services.spark.join_columns import NO_BOUND, o_ref, p_ref, ref_names
from streamjoin.settings import WindowSpec


def _with_until(tuples: DataFrame, window: WindowSpec) -> DataFrame:
    """Adds `until`: the exclusive bound on T while the tuple is inside its window (null = none)."""
    if window.range_ms is not None:
        return tuples.withColumn("until", F.col("ts") + F.lit(window.range_ms))
    order = Window.partitionBy("key").orderBy("ts", "offset")
    # `le` counts tuples <= this one in (ts, offset) order, peers included (the
    # default RANGE frame), so position le + N is the N-th strictly newer one.
    ranked = (tuples.withColumn("le", F.count(F.lit(1)).over(order))
              .withColumn("pos", F.row_number().over(order)))
    nth = ranked.select(F.col("key").alias("n_key"), F.col("pos").alias("n_pos"), F.col("ts").alias("until"))
    joined = ranked.join(nth, (F.col("key") == F.col("n_key"))
                         & (F.col("n_pos") == F.col("le") + F.lit(window.rows)), "left")
    return joined.drop("le", "pos", "n_key", "n_pos")


def expected_join(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec],
                  final_watermark: DataFrame | None = None) -> DataFrame:
    """Every result of the m-way equi-join, as refs p0, o0, ..., p<m-1>, o<m-1> and event_time T.

    `inputs[i]` holds stream i's accepted tuples: partition int, offset long,
    key (any comparable type, e.g. a struct of several key fields), ts long,
    group int (the partition group that joins it: `key_groups`).
    `final_watermark` (group, watermark) keeps only results with T < watermark
    of their group, as reference_join does (its groups: the first stream's partitions).
    """
    acc: DataFrame | None = None
    for i, (tuples, window) in enumerate(zip(inputs, windows)):
        # Every member of a result has the same key, hence the same group: stream 0's is kept.
        group = [F.col("group").alias("g0")] if i == 0 else []
        side = _with_until(tuples.select("partition", "offset", "key", "ts", "group"), window).select(
            "key", F.col("partition").alias(p_ref(i)), F.col("offset").alias(o_ref(i)), F.col("ts").alias(f"ts{i}"),
            F.coalesce("until", F.lit(NO_BOUND)).alias(f"u{i}"), *group)
        acc = side if acc is None else acc.join(side, "key")
        if i:
            # T only grows as streams join, so a partial combination already past
            # some member's bound can never become a result: prune it now.
            t = F.greatest(*[F.col(f"ts{j}") for j in range(i + 1)])
            acc = acc.filter(t < F.least(*[F.col(f"u{j}") for j in range(i + 1)]))
    assert acc is not None
    out = acc.withColumn(EVENT_TIME, F.greatest(*[F.col(f"ts{j}") for j in range(len(inputs))]))
    if final_watermark is not None:
        wm = final_watermark.select(F.col("group").alias("g0"), "watermark")
        out = out.join(wm, "g0").filter(F.col(EVENT_TIME) < F.col("watermark"))
    return out.select(*ref_names(len(inputs)), EVENT_TIME)


# ---------------------------------------------------------------- outer, semi and anti joins (2 streams)

# Spark SQL's join type for each of the job's; the oracle is Spark's own join, not the engine's rule.
_SPARK_JOIN = {"left": "left_outer", "right": "right_outer", "full": "full_outer", "semi": "left_semi",
               "anti": "left_anti"}


def _decided(window: WindowSpec) -> Column:
    """Whether the group's final `watermark` proves no partner can still join the tuple
    (null watermark: its group never committed a batch, so nothing is decided):
    RANGE W: watermark >= ts + W = until;  ROWS N: the N-th newer tuple's ts (until) < watermark."""
    until, wm = F.col("until"), F.col("watermark")
    return F.coalesce(until <= wm if window.range_ms is not None else until < wm, F.lit(False))


def _outer_side(tuples: DataFrame, window: WindowSpec, i: int, watermarks: DataFrame) -> DataFrame:
    """Stream i's tuples as k<i> (key), p<i>, o<i>, ts<i>, u<i> (window bound, NO_BOUND for none),
    w<i> (its group's final watermark, null: none) and d<i> (decided by it).

    `tuples` as expected_join takes them; `watermarks`: group, watermark (final_watermarks)."""
    bounded = _with_until(tuples.select("partition", "offset", "key", "ts", "group"), window)
    with_wm = bounded.join(watermarks.select("group", "watermark"), "group", "left")
    return with_wm.select(F.col("key").alias(f"k{i}"), F.col("partition").alias(p_ref(i)),
                          F.col("offset").alias(o_ref(i)),
                          F.col("ts").alias(f"ts{i}"), F.coalesce("until", F.lit(NO_BOUND)).alias(f"u{i}"),
                          F.col("watermark").alias(f"w{i}"), _decided(window).alias(f"d{i}"))


def _emitted(join_type: str, eager: bool) -> Column:
    """Which rows of Spark's join are results: a combination once final (time windows: at
    once; count windows: T below its group's watermark), a row alone once decided. Semi rows
    are all results: the semi join itself asked for a final partner."""
    if join_type == "semi":
        return F.lit(True)
    p0, p1 = F.col(p_ref(0)), F.col(p_ref(1))
    # A group with no watermark leaves `final` null, which filter() takes as false: not final.
    final = F.lit(True) if eager else F.col(EVENT_TIME) < F.col("w0")
    return (p0.isNotNull() & p1.isNotNull() & final) | (p1.isNull() & F.col("d0")) | (p0.isNull() & F.col("d1"))


def expected_outer_join(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec], join_type: str,
                        watermarks: DataFrame) -> DataFrame:
    """Every result of a 2-way left, right, full, semi or anti join, as p0, o0, p1, o1 and
    event_time (the present member's ts for a row alone); an absent member's p and o are ABSENT.

    `inputs`, `windows` as expected_join takes them; `join_type` one of _SPARK_JOIN;
    `watermarks`: group, watermark, each group's final watermark (final_watermarks).
    Contract: engine/reference.py reference_outer_join."""
    assert len(inputs) == 2 and join_type in _SPARK_JOIN
    sides = [_outer_side(t, w, i, watermarks) for i, (t, w) in enumerate(zip(inputs, windows))]
    t = F.greatest(F.col("ts0"), F.col("ts1"))
    # The window rule on every pair, final or not: a row any combination holds is matched.
    on = (F.col("k0") == F.col("k1")) & (t < F.least(F.col("u0"), F.col("u1")))
    eager = all(w.range_ms is not None for w in windows)
    if join_type == "semi" and not eager:
        on = on & (t < F.col("w0"))  # semi: a row counts once it is in a final combination
    rows = sides[0].join(sides[1], on, _SPARK_JOIN[join_type])
    if join_type in ("semi", "anti"):  # Spark keeps only the left side's columns
        rows = rows.select("*", *[F.lit(None).cast(c.dataType).alias(c.name) for c in sides[1].schema.fields])
    # greatest() skips nulls: a row alone has its own ts.
    rows = rows.withColumn(EVENT_TIME, t).filter(_emitted(join_type, eager))
    # Spark's null padding is the absent member: its refs become ABSENT, as results carry them.
    refs = [F.coalesce(F.col(c), F.lit(ABSENT).cast(kind)).alias(c)
            for i in (0, 1) for c, kind in ((p_ref(i), "int"), (o_ref(i), "long"))]
    return rows.select(*refs, EVENT_TIME)


def expected_results(inputs: Sequence[DataFrame], windows: Sequence[WindowSpec], join_type: str,
                     watermarks: DataFrame) -> DataFrame:
    """The results a job of `join_type` must produce (refs and event_time): expected_join for
    inner (count windows bounded by the final watermarks), expected_outer_join otherwise.
    Parameters as expected_outer_join takes them."""
    if join_type != "inner":
        return expected_outer_join(inputs, windows, join_type, watermarks)
    counted = any(w.rows is not None for w in windows)
    return expected_join(inputs, windows, watermarks if counted else None)
