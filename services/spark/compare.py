"""`verify`'s comparison and statistics: produced results against the expected
ones (missing, extra, duplicated; results that do not decode or carry the wrong
id) and the delays with which they were produced, as percentiles.

Both sides are refs p<i>, o<i> (join_columns): the oracles' expected results
and the decoded result records (result_records.decode_results); a tumbling or
hopping window join's results are told apart by their window_start too (the
same members in two instances are two results).
"""

from __future__ import annotations

from functools import reduce
from typing import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamjoin.engine.outer import DECIDED
from streamjoin.engine.result_ids import ABSENT, WINDOW_START
from streamjoin.schemas.results import PRODUCED_MS, ref_columns
from streamjoin.services.spark.join_columns import o_ref, p_ref, quoted, ref_names
from streamjoin.services.spark.result_records import ID_OK, RECORD_OK, decode_results
from streamjoin.settings import JobSettings


def compare(expected: DataFrame, actual: DataFrame, m: int, windowed: bool = False) -> dict[str, int]:
    """missing / extra (distinct combinations) and duplicates (extra copies) between
    expected refs and produced refs, both as p<i>, o<i> columns (`windowed`: and window_start)."""
    refs = ref_names(m) + ([WINDOW_START] if windowed else [])
    produced = actual.groupBy(*refs).agg(F.count(F.lit(1)).alias("copies"))
    both = expected.select(*refs, F.lit(True).alias("wanted")).join(produced, refs, "full")
    row = both.agg(
        F.count_if(F.col("wanted") & F.col("copies").isNull()).alias("missing"),
        F.count_if(F.col("wanted").isNull()).alias("extra"),
        F.coalesce(F.sum(F.greatest(F.col("copies") - 1, F.lit(0))), F.lit(0)).alias("duplicates"),
        F.count_if(F.col("wanted")).alias("expected"),
    ).first()
    return {k: int(row[k]) for k in ("missing", "extra", "duplicates", "expected")}


def production_delays(actual: DataFrame, arrivals: Sequence[DataFrame]) -> DataFrame:
    """produced_ms and delay = produced_ms - latest Kafka timestamp among the result's inputs.

    `actual`: p<i>, o<i>, produced_ms; `arrivals[i]`: stream i's partition, offset, arrival.
    An absent member (refs ABSENT) meets no arrival: greatest() skips its null, so the
    delay is from the present members' arrivals."""
    out = actual
    for i, a in enumerate(arrivals):
        out = out.join(a.select(F.col("partition").alias(p_ref(i)), F.col("offset").alias(o_ref(i)),
                                F.col("arrival").alias(f"a{i}")), [p_ref(i), o_ref(i)], "left")
    latest = F.greatest(*[F.col(f"a{i}") for i in range(len(arrivals))])
    return out.select(PRODUCED_MS, (F.col(PRODUCED_MS) - latest).alias("delay")).filter(F.col("delay").isNotNull())


def unmatched_delays(actual: DataFrame, decoded: Sequence[DataFrame], job: JobSettings) -> DataFrame:
    """produced_ms and delay = produced_ms - deadline for each produced row alone (outer and
    anti joins): the deadline is its ts + its stream's RANGE window (a window join's instance
    size) + join.allowed_lateness_ms,
    the event time at which the watermark decides it.

    `actual`: p<i>, o<i>, produced_ms (absent members ABSENT); `decoded[i]`: stream i's
    partition, offset, ts; `job`: a join whose decided streams all have time windows (a
    count-window row has no deadline in time)."""
    parts = []
    for side in DECIDED[job.join.type]:
        window = job.streams[side].window.span_ms  # a window join's row alone: decided at ts + instance size
        assert window is not None, f"stream {side} counts rows: its rows have no deadline in time"
        alone = actual.filter((F.col(p_ref(1 - side)) == ABSENT) & (F.col(p_ref(side)) != ABSENT))
        ts = decoded[side].select(F.col("partition").alias(p_ref(side)), F.col("offset").alias(o_ref(side)), "ts")
        deadline = F.col("ts") + F.lit(window + job.join.allowed_lateness_ms)
        parts.append(alone.join(ts, [p_ref(side), o_ref(side)]).select(
            PRODUCED_MS, (F.col(PRODUCED_MS) - deadline).alias("delay")))
    # A result naming an input that did not decode has no ts: it is extra, not late.
    return reduce(DataFrame.unionByName, parts).filter(F.col("delay").isNotNull())


def unmatched_fields(job: JobSettings, expected: DataFrame, actual: DataFrame,
                     decoded: Sequence[DataFrame]) -> dict:
    """join_type; unmatched: expected results of rows no partner joined (left/right/full rows
    alone, anti rows; semi rows matched, so 0 as for inner); unmatched_delay_ms: percentiles of
    unmatched_delays, when every decided stream has a time window. Parameters as result_fields's."""
    fields: dict[str, object] = {"join_type": job.join.type, "unmatched": 0}
    if job.join.type in ("inner", "semi"):
        return fields
    absent = reduce(lambda a, b: a | b, [F.col(p_ref(i)) == ABSENT for i in range(len(job.streams))])
    fields["unmatched"] = expected.filter(absent).count()
    windows = [job.streams[s].window for s in DECIDED[job.join.type]]
    if all(w is not None and w.span_ms is not None for w in windows):  # as-of joins have no deadline in time
        fields["unmatched_delay_ms"] = percentiles(unmatched_delays(actual, decoded, job))
    return fields


def percentiles(delays: DataFrame) -> dict[str, float | None]:
    """p50, p95, p99 and mean of `delays`' delay column (None each when it is empty)."""
    row = delays.agg(F.percentile("delay", [0.5, 0.95, 0.99]).alias("q"), F.avg("delay").alias("mean")).first()
    q = row["q"] or [None] * 3
    return {"p50": q[0], "p95": q[1], "p99": q[2], "mean": row["mean"]}


def actual_refs(results: DataFrame, names: list[str], windowed: bool = False) -> DataFrame:
    """Decoded results as p<i>, o<i> ref columns and produced_ms (`windowed`: and window_start)."""
    refs = [c for i, n in enumerate(names)
            for c in (quoted(ref_columns(n)[0]).alias(p_ref(i)), quoted(ref_columns(n)[1]).alias(o_ref(i)))]
    return results.select(*refs, PRODUCED_MS, *([WINDOW_START] if windowed else []))


def result_fields(job: JobSettings, expected: DataFrame, raw_results: DataFrame,
                  decoded: list[DataFrame]) -> tuple[dict, DataFrame]:
    """Produced results against the expected ones: the report's result fields, and the delays.
    `bad_records` counts result records that do not decode (they are no result: not compared);
    `bad_ids` decoded results whose id is not the one their refs give; join_type, unmatched and
    unmatched_delay_ms as unmatched_fields says. `decoded[i]`: stream i's inputs (partition,
    offset, ts, arrival)."""
    names = [s.name for s in job.streams]
    results = decode_results(raw_results, job).localCheckpoint()
    windowed = job.window_instance is not None
    actual = actual_refs(results.filter(F.col(RECORD_OK)), names, windowed)
    diff = compare(expected, actual, len(names), windowed)
    totals = results.agg(F.count_if(F.col(RECORD_OK)).alias("n"), F.count_if(~F.col(RECORD_OK)).alias("bad_records"),
                         F.count_if(F.col(RECORD_OK) & ~F.col(ID_OK)).alias("bad_ids")).first()
    delays = production_delays(actual, decoded).localCheckpoint()
    return {"results": int(totals["n"]), "result_records": raw_results.count(), **diff,
            "bad_records": int(totals["bad_records"]), "bad_ids": int(totals["bad_ids"]),
            "delay_ms": percentiles(delays), **unmatched_fields(job, expected, actual, decoded)}, delays
