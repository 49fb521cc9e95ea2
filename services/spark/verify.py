"""Spark `verify` job: reads a job's inputs, results, commits and dead letters, computes
the exact join with Spark SQL under engine/reference.py's contract and says
what is missing, extra or duplicated, plus production-delay percentiles.

This module owns the job itself (`run_verify`): one snapshot of the topics, then
per mode which inputs count and which oracle joins them. Hash mode (equi-join
on keys, outer, semi and anti joins) is oracles.expected_results, tumbling and
hopping window joins window_oracle.expected_window_join; ring and
splitjoin modes (predicate terms, reference_theta_join) are
theta_oracle.expected_theta_join (SplitJoin's merger writes the same release
records as the ring head). Inputs are read by input_records.py, result and
commit records by result_records.py, compared by compare.py, and the report and
its plot are report.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin.engine.predicates import compile_terms
from streamjoin.schemas.splitjoin import MARK_HEADER
from streamjoin.services.io.kafka import Cluster
from streamjoin.services.spark.asof_oracle import expected_asof_join
from streamjoin.services.spark.compare import result_fields
from streamjoin.services.spark.input_records import (accepted_inputs, decode_ring_dead_letters, decode_tuples,
                                                     hash_inputs, mark_dead)
from streamjoin.services.spark.join_columns import o_ref, p_ref
from streamjoin.services.spark.kafka_source import NAME as KAFKA, local_session
from streamjoin.services.spark.kafka_source import options as kafka_options
from streamjoin.services.spark.oracles import expected_results
from streamjoin.services.spark.report import (MUST_BE_ZERO, groups_without_results, input_summary, plot_delays,
                                              stream_info)
from streamjoin.services.spark.result_records import final_watermarks, release_watermark
from streamjoin.services.spark.theta_oracle import expected_theta_join
from streamjoin.services.spark.window_oracle import expected_window_join
from streamjoin.settings import JobSettings


def _read(spark: SparkSession, cluster: Cluster, topics: list[str]) -> DataFrame:
    """One snapshot of all the topics, pinned so every later step sees the same records. Read
    as one partition per core, not one per topic partition: every later stage runs a task per
    partition, and a task that starts a Python worker for a few records costs more than it does."""
    return (spark.read.format(KAFKA).options(**kafka_options(cluster)).option("topics", ",".join(topics))
            .load().coalesce(spark.sparkContext.defaultParallelism).localCheckpoint(eager=True))


def _verify_hash(job: JobSettings, raw: DataFrame) -> tuple[dict, DataFrame]:
    """Hash mode: the report's input and result fields, and the production delays."""
    names = [s.name for s in job.streams]
    decoded, dead = hash_inputs(raw, job)
    raw_results = raw.filter(F.col("topic") == job.results_topic)
    accepted = [accepted_inputs(d) for d in decoded]

    watermarks = final_watermarks(raw.filter(F.col("topic") == job.commits_topic)).localCheckpoint()
    instance = job.window_instance
    if job.table_index is not None:
        expected = _expected_asof(job, accepted, watermarks).localCheckpoint()
    elif instance is not None:
        expected = expected_window_join(accepted, *instance, job.join.type, watermarks).localCheckpoint()
    else:
        expected = expected_results(accepted, [s.window for s in job.streams], job.join.type,
                                    watermarks).localCheckpoint()
    outcome, delays = result_fields(job, expected, raw_results, decoded)
    return {
        **input_summary(names, decoded, dead.count()),
        **outcome,
        "watermark_bounded": job.emits_on_watermark,
        "groups_without_results": groups_without_results(accepted, watermarks),
    }, delays


def _expected_asof(job: JobSettings, accepted: list[DataFrame], watermarks: DataFrame) -> DataFrame:
    """The as-of join's results (asof_oracle.py), refs in the job's stream order. A commit's
    watermark in an as-of job is its group's table watermark: the stream tuples below it were
    joined."""
    t = job.table_index
    assert t is not None
    expected = expected_asof_join(accepted[1 - t], accepted[t], job.join.type, watermarks)
    if t == 1:
        return expected
    swap = {p_ref(0): p_ref(1), o_ref(0): o_ref(1), p_ref(1): p_ref(0), o_ref(1): o_ref(0)}
    return expected.select(*(F.col(c).alias(swap.get(c, c)) for c in expected.columns))


def _verify_ring(job: JobSettings, raw: DataFrame) -> tuple[dict, DataFrame]:
    """Accepted inputs: decoded, not dead-lettered, and released (ts below the final release watermark)."""
    names = [s.name for s in job.streams]
    raw_dead = raw.filter(F.col("topic") == job.dead_letter_topic)
    dead = decode_ring_dead_letters(raw_dead, job).localCheckpoint()
    raw_results = raw.filter(F.col("topic") == job.results_topic)
    # SplitJoin's scale and tick marks ride in the source partitions; they carry no tuple.
    tuples = raw.filter(F.col("headers").getItem(MARK_HEADER).isNull())
    decoded = [mark_dead(decode_tuples(tuples.filter(F.col("topic") == job.topic_of(s)), s), dead).localCheckpoint()
               for s in job.streams]
    release = release_watermark(raw.filter(F.col("topic") == job.commits_topic))
    released = F.col("ts") < F.lit(release) if release is not None else F.lit(False)
    valid = [accepted_inputs(d) for d in decoded]
    terms = compile_terms(names, list(job.join.predicate), job.join.udfs)
    expected = expected_theta_join([v.filter(released) for v in valid], [s.window for s in job.streams],
                                   terms).localCheckpoint()
    outcome, delays = result_fields(job, expected, raw_results, decoded)
    return {
        **input_summary(names, decoded, raw_dead.count()),
        **outcome,
        "release_watermark": release,
        "unreleased": sum(v.filter(~released).count() for v in valid),
    }, delays


def _check_formats(job: JobSettings) -> None:
    """Refuses, before Spark starts, a job with inputs in a format verify does not decode."""
    readable = ("json", "blocks") if job.join.mode != "hash" else ("json",)
    unsupported = [s.name for s in job.streams if s.format not in readable]
    if unsupported:
        raise ValueError(f"verify decodes {' and '.join(readable)} inputs in {job.join.mode} mode; "
                         f"streams {unsupported} use another format")


def run_verify(job: JobSettings, cluster: Cluster, report_path: Path | None = None,
               plot_path: Path | None = None) -> dict:
    """Verify the job's results topic against the exact join of its inputs; returns the report."""
    _check_formats(job)
    spark = local_session("streamjoin-verify")
    raw = _read(spark, cluster, [*job.input_topics, job.results_topic, job.commits_topic, job.dead_letter_topic])
    checked, delays = (_verify_hash if job.join.mode == "hash" else _verify_ring)(job, raw)
    report = {"job": job.job, "streams": stream_info(job), **checked}
    report["verified"] = all(report[k] == 0 for k in MUST_BE_ZERO)
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if plot_path is not None:
        plot_delays(delays, report["delay_ms"], f"{job.job}: production delay of {report['results']} results "
                                                f"({'verified' if report['verified'] else 'NOT verified'})",
                    plot_path)
    return report
