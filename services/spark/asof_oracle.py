"""`verify`'s oracle for as-of (temporal) joins of a stream with a versioned table, computed
with Spark SQL under engine/reference.py's contract (`reference_asof_join`), sharing no code
with the engine (engine/asof.py):

  each stream tuple whose time is below its group's final table watermark, with the version
  of its key with the greatest (ts, offset) at or before its time: Spark's own range join
  (key equal, version ts <= tuple ts) and a window ranking the candidates; no version, or a
  tombstone, gives no result for `inner` and the tuple alone (the table's refs ABSENT) for
  `left`.

Results are refs p0, o0 (the stream tuple), p1, o1 (the version) and event_time (the tuple's).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from streamjoin.engine.result_ids import ABSENT
from streamjoin.schemas.results import EVENT_TIME
from streamjoin.services.spark.join_columns import o_ref, p_ref, ref_names


def expected_asof_join(stream: DataFrame, table: DataFrame, join_type: str, watermarks: DataFrame) -> DataFrame:
    """Every result of the as-of join, as p0, o0, p1, o1 and event_time.

    `stream`: the accepted stream tuples (partition int, offset long, key, ts long, group int);
    `table`: the accepted versions (the same columns and `deleted` boolean); `join_type`
    inner or left; `watermarks`: group, watermark, each group's final table watermark (a group
    without one decided nothing)."""
    assert join_type in ("inner", "left")
    tuples = (stream.join(watermarks.select("group", "watermark"), "group")
              .filter(F.col("ts") < F.col("watermark"))
              .select("key", F.col("partition").alias(p_ref(0)), F.col("offset").alias(o_ref(0)),
                      F.col("ts").alias(EVENT_TIME)))
    versions = table.select(F.col("key").alias("v_key"), F.col("partition").alias(p_ref(1)),
                            F.col("offset").alias(o_ref(1)), F.col("ts").alias("v_ts"), "deleted")
    candidates = tuples.join(versions, (F.col("key") == F.col("v_key")) & (F.col("v_ts") <= F.col(EVENT_TIME)),
                             "left_outer")
    newest = Window.partitionBy(p_ref(0), o_ref(0)).orderBy(F.col("v_ts").desc_nulls_last(),
                                                             F.col(o_ref(1)).desc_nulls_last())
    valid = candidates.withColumn("rank", F.row_number().over(newest)).filter(F.col("rank") == 1)
    joined = F.col(p_ref(1)).isNotNull() & ~F.coalesce(F.col("deleted"), F.lit(False))
    if join_type == "inner":
        out = valid.filter(joined)
    else:
        out = valid.select(p_ref(0), o_ref(0), EVENT_TIME,
                           F.when(joined, F.col(p_ref(1))).otherwise(F.lit(ABSENT)).cast("int").alias(p_ref(1)),
                           F.when(joined, F.col(o_ref(1))).otherwise(F.lit(ABSENT)).cast("long").alias(o_ref(1)))
    return out.select(*ref_names(2), EVENT_TIME)
