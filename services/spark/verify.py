"""Spark `verify` job: reads a job's inputs, results and dead letters, computes
the exact join with Spark SQL under engine/reference.py's contract and says
what is missing, extra or duplicated, plus production-delay percentiles.

A tuple's identity is (partition, offset) of its input record; a result's is
the ordered tuple of its inputs' identities, one per stream. Internally every
ref column is `p<i>` / `o<i>` for stream i in join order.

Windows, as an exclusive bound on the result time T each tuple allows
(`until`), so one rule covers both kinds and any number of streams:
  RANGE W:  T - ts < W                  <=>  T < ts + W
  ROWS  N:  fewer than N same-key tuples u with ts(u) <= T and
            (ts(u), offset(u)) > (ts(s), offset(s))
            <=>  T < ts of the N-th such tuple after s in (ts, offset) order
            (no bound when there is none).
"""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BooleanType, DataType, DoubleType, IntegerType, LongType, StringType, StructField,
                               StructType)

from schemas.results import (EVENT_TIME, H_GROUP, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, H_WM, PRODUCED_MS,
                             RESULT_ID, ref_columns)
from services.spark.kafka_source import NAME as KAFKA, local_session
from streamjoin.settings import JobSettings, StreamSpec, WindowSpec

_SPARK_TYPES: dict[str, DataType] = {"int": LongType(), "float": DoubleType(), "str": StringType(),
                                     "bool": BooleanType(), "bytes": StringType()}
_NO_BOUND = int(np.iinfo(np.int64).max)  # `until` of a tuple no T can push out
# Results plotted at most; more are sampled down.
_PLOT_POINTS = 100_000


def _p(i: int) -> str:
    return f"p{i}"


def _o(i: int) -> str:
    return f"o{i}"


def _refs(m: int) -> list[str]:
    return [c for i in range(m) for c in (_p(i), _o(i))]


def _q(name: str) -> Column:
    """A column whose name holds dots (`r.partition`)."""
    return F.col(f"`{name}`")


# ---------------------------------------------------------------- the exact join


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
    key (any comparable type, e.g. a struct of several key fields), ts long.
    `final_watermark` (partition, watermark) keeps only results with
    T < watermark of the first stream's partition, as reference_join does.
    """
    acc: DataFrame | None = None
    for i, (tuples, window) in enumerate(zip(inputs, windows)):
        side = _with_until(tuples.select("partition", "offset", "key", "ts"), window).select(
            "key", F.col("partition").alias(_p(i)), F.col("offset").alias(_o(i)), F.col("ts").alias(f"ts{i}"),
            F.coalesce("until", F.lit(_NO_BOUND)).alias(f"u{i}"))
        acc = side if acc is None else acc.join(side, "key")
        if i:
            # T only grows as streams join, so a partial combination already past
            # some member's bound can never become a result: prune it now.
            t = F.greatest(*[F.col(f"ts{j}") for j in range(i + 1)])
            acc = acc.filter(t < F.least(*[F.col(f"u{j}") for j in range(i + 1)]))
    assert acc is not None
    out = acc.withColumn(EVENT_TIME, F.greatest(*[F.col(f"ts{j}") for j in range(len(inputs))]))
    if final_watermark is not None:
        wm = final_watermark.select(F.col("partition").alias("wm_partition"), "watermark")
        out = (out.join(wm, F.col(_p(0)) == F.col("wm_partition"))
               .filter(F.col(EVENT_TIME) < F.col("watermark")))
    return out.select(*_refs(len(inputs)), EVENT_TIME)


# ---------------------------------------------------------------- reading Kafka


def _read(spark: SparkSession, bootstrap: str, topics: list[str]) -> DataFrame:
    """One snapshot of all the topics, pinned so every later step sees the same records."""
    return (spark.read.format(KAFKA).option("bootstrap", bootstrap).option("topics", ",".join(topics))
            .load().localCheckpoint(eager=True))


def value_schema(spec: StreamSpec) -> StructType:
    return StructType([StructField(n, _SPARK_TYPES[t]) for n, t in spec.fields.items()])


def decode_inputs(raw: DataFrame, spec: StreamSpec) -> DataFrame:
    """partition, offset, arrival (Kafka timestamp), key, ts, ok (parsed with every field present)."""
    v = F.from_json(F.col("value").cast("string"), value_schema(spec))
    parsed = raw.select("topic", "partition", "offset", F.col("timestamp_ms").alias("arrival"), v.alias("v"))
    keys = [F.col(f"v.{k}") for k in spec.key_fields]
    ok = reduce(lambda a, b: a & b, [F.col(f"v.{n}").isNotNull() for n in spec.fields])
    return parsed.select("topic", "partition", "offset", "arrival",
                         (keys[0] if len(keys) == 1 else F.struct(*keys)).alias("key"),
                         F.col(f"v.{spec.time_field}").alias("ts"), F.coalesce(ok, F.lit(False)).alias("ok"))


def decode_dead_letters(raw: DataFrame) -> DataFrame:
    """topic, partition, offset of the input each dead letter stands for, and its reason (one row per input)."""
    h = F.col("headers")
    return (raw.select(h[H_TOPIC].alias("topic"), h[H_PARTITION].cast("int").alias("partition"),
                       h[H_OFFSET].cast("long").alias("offset"), h[H_REASON].alias("reason"))
            .groupBy("topic", "partition", "offset").agg(F.min("reason").alias("reason")))


def result_schema(job: JobSettings) -> StructType:
    fields = [StructField(RESULT_ID, LongType()), StructField("id_ok", BooleanType()),
              StructField(EVENT_TIME, LongType()), StructField(PRODUCED_MS, LongType())]
    for s in job.streams:
        part, off, _ = ref_columns(s.name)
        fields += [StructField(part, IntegerType()), StructField(off, LongType())]
    return StructType(fields)


def _block_decoder(job: JobSettings):
    """mapInArrow function: result records (Arrow IPC blocks) -> one row per result,
    with the id recomputed from the refs (`id_ok`). Works a block at a time."""
    names = [s.name for s in job.streams]
    topics = job.input_topics
    schema = result_schema(job)
    arrow_schema = to_arrow_schema(schema)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from engine.result_ids import result_ids

        for batch in batches:
            for value in batch.column("value").to_pylist():
                table = pa.ipc.open_stream(value).read_all() if value else None
                if table is None or table.num_rows == 0:  # a batch's commit marker
                    continue
                parts = [table.column(ref_columns(n)[0]).to_numpy() for n in names]
                offs = [table.column(ref_columns(n)[1]).to_numpy() for n in names]
                ids = table.column(RESULT_ID).to_numpy().astype(np.uint64)
                cols = [ids.view(np.int64), result_ids(topics, parts, offs) == ids,
                        table.column(EVENT_TIME).to_numpy(), table.column(PRODUCED_MS).to_numpy()]
                for part, off in zip(parts, offs):
                    cols += [part, off]
                yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, arrow_schema)],
                                                 schema=arrow_schema)

    return decode, schema


def decode_results(raw: DataFrame, job: JobSettings) -> DataFrame:
    """One row per produced result: result_id (int64 bits of the uint64), id_ok, event_time,
    produced_ms, `<stream>.partition`, `<stream>.offset`."""
    decode, schema = _block_decoder(job)
    return raw.select("value").mapInArrow(decode, schema)


def final_watermarks(raw_results: DataFrame) -> DataFrame:
    """partition (= group), watermark: the highest sj-wm any of the group's result records carries."""
    h = F.col("headers")
    return (raw_results.select(h[H_GROUP].cast("int").alias("partition"), h[H_WM].cast("long").alias("wm"))
            .groupBy("partition").agg(F.max("wm").alias("watermark")))


# ---------------------------------------------------------------- comparing


def compare(expected: DataFrame, actual: DataFrame, m: int) -> dict[str, int]:
    """missing / extra (distinct combinations) and duplicates (extra copies) between
    expected refs and produced refs, both as p<i>, o<i> columns."""
    refs = _refs(m)
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
    """produced_ms and delay = produced_ms - latest Kafka timestamp among the result's inputs."""
    out = actual
    for i, a in enumerate(arrivals):
        out = out.join(a.select(F.col("partition").alias(_p(i)), F.col("offset").alias(_o(i)),
                                F.col("arrival").alias(f"a{i}")), [_p(i), _o(i)], "left")
    latest = F.greatest(*[F.col(f"a{i}") for i in range(len(arrivals))])
    return out.select(PRODUCED_MS, (F.col(PRODUCED_MS) - latest).alias("delay")).filter(F.col("delay").isNotNull())


def _percentiles(delays: DataFrame) -> dict[str, float | None]:
    row = delays.agg(F.percentile("delay", [0.5, 0.95, 0.99]).alias("q"), F.avg("delay").alias("mean")).first()
    q = row["q"] or [None] * 3
    return {"p50": q[0], "p95": q[1], "p99": q[2], "mean": row["mean"]}


def plot_delays(delays: DataFrame, stats: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = delays.count()
    sample = delays if n <= _PLOT_POINTS else delays.sample(fraction=_PLOT_POINTS / n, seed=1)
    pts = sample.toPandas()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if len(pts):
        t0 = pts[PRODUCED_MS].min()
        ax.scatter((pts[PRODUCED_MS] - t0) / 1000, pts["delay"], s=2, alpha=0.4, label="result")
        for key, style in (("p50", "--"), ("p99", ":")):
            ax.axhline(stats[key], color="red", linestyle=style, label=f"{key} = {stats[key]:.0f} ms")
        ax.legend(loc="upper right")
    ax.set_xlabel("produced at (s since first result)")
    ax.set_ylabel("production delay (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stream_info(job: JobSettings) -> list[dict]:
    return [{"name": s.name, "topic": job.topic_of(s), "format": s.format, "key_fields": s.key_fields,
             "time_field": s.time_field, "window": s.window.model_dump(exclude_none=True)} for s in job.streams]


def _input_summary(names: list[str], decoded: list[DataFrame], dead: DataFrame) -> dict:
    """Input counts per stream, the dead-lettered ones by reason, and the lost ones
    (unparsable, yet never dead-lettered)."""
    counts = [d.agg(F.count(F.lit(1)).alias("n"),
                    F.count_if(F.col("reason").isNotNull()).alias("dead"),
                    F.count_if(~F.col("ok") & F.col("reason").isNull()).alias("lost")).first() for d in decoded]
    by_reason = (reduce(DataFrame.unionByName, [d.filter(F.col("reason").isNotNull()).select("reason")
                                                for d in decoded]).groupBy("reason").count().collect())
    per_stream = {n: int(c["n"]) for n, c in zip(names, counts)}
    return {
        "inputs": {"per_stream": per_stream, "total": sum(per_stream.values())},
        "dead_letter": {"count": sum(int(c["dead"]) for c in counts),
                        "by_reason": {r["reason"]: int(r["count"]) for r in by_reason},
                        "records": dead.count()},
        "lost": sum(int(c["lost"]) for c in counts),
    }


def _groups_without_results(accepted: list[DataFrame], watermarks: DataFrame) -> int:
    """Groups with input but not one result record: never processed. Count windows
    expect nothing of them (nothing is final there), so the report says so."""
    groups = reduce(DataFrame.unionByName, [a.select("partition") for a in accepted]).distinct()
    return groups.join(watermarks, "partition", "left_anti").count()


def _actual_refs(results: DataFrame, names: list[str]) -> DataFrame:
    """Decoded results as p<i>, o<i> ref columns and produced_ms."""
    refs = [c for i, n in enumerate(names)
            for c in (_q(ref_columns(n)[0]).alias(_p(i)), _q(ref_columns(n)[1]).alias(_o(i)))]
    return results.select(*refs, PRODUCED_MS)


def run_verify(job: JobSettings, bootstrap: str, report_path: Path | None = None,
               plot_path: Path | None = None) -> dict:
    """Verify the job's results topic against the exact join of its inputs; returns the report."""
    unsupported = [s.name for s in job.streams if s.format != "json"]
    if unsupported:
        raise ValueError(f"verify decodes JSON inputs only; streams {unsupported} use another format")
    spark = local_session("streamjoin-verify")
    names = [s.name for s in job.streams]
    raw = _read(spark, bootstrap, [*job.input_topics, job.results_topic, job.dead_letter_topic])
    dead = decode_dead_letters(raw.filter(F.col("topic") == job.dead_letter_topic)).localCheckpoint()
    raw_results = raw.filter(F.col("topic") == job.results_topic)
    decoded = [decode_inputs(raw.filter(F.col("topic") == job.topic_of(s)), s)
               .join(dead, ["topic", "partition", "offset"], "left") for s in job.streams]
    accepted = [d.filter(F.col("ok") & F.col("reason").isNull()) for d in decoded]

    watermarks = final_watermarks(raw_results).localCheckpoint()
    expected = expected_join(accepted, [s.window for s in job.streams],
                             watermarks if job.emits_on_watermark else None).localCheckpoint()
    results = decode_results(raw_results, job).localCheckpoint()
    actual = _actual_refs(results, names)
    diff = compare(expected, actual, len(names))
    totals = results.agg(F.count(F.lit(1)).alias("n"), F.count_if(~F.col("id_ok")).alias("bad")).first()
    delays = production_delays(actual, decoded).localCheckpoint()

    report = {
        "job": job.job,
        "streams": _stream_info(job),
        **_input_summary(names, decoded, dead),
        "results": int(totals["n"]),
        "result_records": raw_results.count(),
        **diff,
        "bad_ids": int(totals["bad"]),
        "watermark_bounded": job.emits_on_watermark,
        "groups_without_results": _groups_without_results(accepted, watermarks),
        "delay_ms": _percentiles(delays),
    }
    report["verified"] = all(report[k] == 0 for k in ("missing", "extra", "duplicates", "bad_ids", "lost"))
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if plot_path is not None:
        plot_delays(delays, report["delay_ms"], f"{job.job}: production delay of {report['results']} results "
                                                f"({'verified' if report['verified'] else 'NOT verified'})",
                    plot_path)
    return report
