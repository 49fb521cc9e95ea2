"""The window bench's oracle and peers, on the input our fleet joined (bench/inputs.py's export):

  oracle   Spark verify's window oracle (services/spark/window_oracle.py) over the exported
           inputs: every result as PAIR columns, both inputs' (partition, offset) and the
           window's start.
  spark    Structured Streaming's windowed stream-stream join (bench/peers/spark_peer.py on a
           job with window instances: `window()` on both sides, joined on the key and the
           window, watermarks of the allowed lateness), its backlog fed as the equijoin peer's
           is, Parquet files of one batch interval of event time each; the driver keeps each
           result's PAIR columns (`PairSink`).
  pyflink  Flink SQL's window join (bench/peers/pyflink_window_job.py: the TUMBLE window
           table-valued function on both sides, joined on the key, window_start and
           window_end) from the venv STREAMJOIN_PYFLINK_PYTHON names, on CSV files of the
           exported inputs in event-time order per Kafka partition (pyflink_peer.write_sides).

Each peer's results are judged against the oracle's by their PAIR columns (bench/pairs.py:
missing, extra, duplicates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from streamjoin.bench import pairs
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.inputs import oracle_inputs
from streamjoin.bench.peers import pyflink_peer, spark_peer
from streamjoin.schemas.results import EVENT_TIME
from streamjoin.services.spark.join_columns import o_ref, p_ref
from streamjoin.services.spark.window_oracle import WINDOW_START, expected_window_join
from streamjoin.settings import JobSettings

_PYFLINK_JOB = Path(__file__).with_name("peers") / "pyflink_window_job.py"


def pair_columns(job: JobSettings) -> tuple[str, ...]:
    """A result's identity: each stream's partition and offset (as the peers prefix them), then
    the window's start (epoch ms)."""
    return (*(f"{s.name}_{c}" for s in job.streams for c in ("partition", "offset")), WINDOW_START)


def expected_pairs(env: BenchEnv, job: JobSettings, tables: dict[str, pa.Table]) -> pa.Table:
    """The oracle's results on the exported inputs: PAIR columns and `event_time` (the newest
    member's time). An inner window join's combinations are final at once: no watermark."""
    size, slide = job.window_instance  # type: ignore[misc]
    sides = oracle_inputs(env.spark, job, tables)
    expected = expected_window_join([sides[s.name] for s in job.streams], size, slide, "inner", None)
    refs = [r for i in range(len(job.streams)) for r in (p_ref(i), o_ref(i))]
    names = pair_columns(job)
    return expected.select(*(F.col(r).cast("long").alias(n) for r, n in zip(refs, names)),
                           F.col(WINDOW_START).cast("long"), F.col(EVENT_TIME).cast("long")).toArrow()


def window_end_wait(job: JobSettings, expected: pa.Table) -> dict:
    """How far in event time each result's window end, plus the lateness, lies after its newest
    member: the least a join that emits a window's results once the watermark passes its end
    holds each one back (ms percentiles). Ours emits a result as its newest member arrives."""
    size, _ = job.window_instance  # type: ignore[misc]
    wait = (expected[WINDOW_START].to_numpy() + size + job.join.allowed_lateness_ms
            - expected[EVENT_TIME].to_numpy()).astype(np.float64)
    if not len(wait):
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    p50, p95, p99 = np.percentile(wait, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(wait.mean())}


# ---------------------------------------------------------------- Spark's windowed join


@dataclass
class PairSink(spark_peer.Sink):
    """Sink's counts, and each result's PAIR columns for the judge (`columns`: pair_columns);
    the window's start from the first stream's `window()` struct."""

    columns: tuple[str, ...] = field(kw_only=True)
    pairs: list[pa.Table] = field(default_factory=list)

    def take(self, out: pa.Table, held_ms: float) -> None:
        super().take(out, held_ms)
        if not out.num_rows:
            return
        start = pc.struct_field(out.column(f"{self.names[0]}_{spark_peer.WINDOW}"), "start")
        start = start.cast(pa.timestamp("ms", start.type.tz)).cast(pa.int64())
        self.pairs.append(pa.table([*(out.column(c) for c in self.columns[:-1]), start], names=list(self.columns)))

    def table(self) -> pa.Table:
        return pa.concat_tables(self.pairs) if self.pairs else pairs.schema(self.columns).empty_table()


def run_spark(env: BenchEnv, job: JobSettings, tables: dict[str, pa.Table], expected: pa.Table,
              files_per_trigger: int) -> dict:
    """Spark's windowed stream-stream join drained as a backlog: sustained tuples/s, its results
    judged against `expected`."""
    names = [s.name for s in job.streams]
    ms = job.worker.batch_ms
    by_time = {s.name: spark_peer.Slices.cut(tables[s.name], s.time_field, ms, [0]) for s in job.streams}
    sink = PairSink(names, columns=pair_columns(job))
    backlog = spark_peer.run_backlog(env.spark, job, by_time, spark_peer.key_equality(job), env.workdir / "spark",
                                     files_per_trigger, sink=sink)
    judged, _, _ = pairs.judge(expected, sink.table(), pair_columns(job))
    size, _ = job.window_instance  # type: ignore[misc]
    return {"ran": True, **backlog, "tuples": backlog["inputs"], **judged, "expected": expected.num_rows,
            "how": f"Structured Streaming windowed stream-stream inner join on Parquet file sources (a file per "
                   f"stream per {ms} ms of event time, {files_per_trigger} files per trigger), watermark "
                   f"{job.join.allowed_lateness_ms} ms on both, window(t, '{size} milliseconds') on both, condition "
                   "k = k and window = window, foreachBatch collecting every column; results judged against the "
                   "oracle's pairs"}


# ---------------------------------------------------------------- PyFlink's window join


def flink_spec(job: JobSettings, sides: dict[str, dict], root: Path, parallelism: int) -> dict:
    """pyflink_window_job's spec: the sides, the window, the ON clause and the sink's columns
    (PAIR columns first, then every other column of both streams)."""
    size, _ = job.window_instance  # type: ignore[misc]
    names = [s.name for s in job.streams]
    refs = [[f"{n}_{c}", kind] for n in names for c, kind in sides[n]["columns"] if c in ("partition", "offset")]
    rest = [[f"{n}_{c}", kind] for n in names for c, kind in sides[n]["columns"] if c not in ("partition", "offset")]
    select = [f"{n}.`{c}`" for n in names for c in ("partition", "offset")] + [f"{names[0]}.window_start"]
    select += [f"{n}.`{c}`" for n in names for c, _ in sides[n]["columns"] if c not in ("partition", "offset")]
    windows = [f"{a}.{edge} = {b}.{edge}" for a, b in zip(names, names[1:]) for edge in ("window_start", "window_end")]
    return {"parallelism": parallelism, "streams": [sides[n] for n in names], "size": pyflink_peer.interval(size),
            "on": " AND ".join(pyflink_peer.key_terms(job) + windows), "select": ", ".join(select),
            "sink_columns": [*refs, [WINDOW_START, "TIMESTAMP(3)"], *rest], "out": str(root / "out")}


def run_pyflink(job: JobSettings, tables: dict[str, pa.Table], workdir: Path, expected: pa.Table,
                parallelism: int = 2) -> dict:
    """PyFlink's window join on CSV files of `tables`, judged against `expected`; reported as
    not run, and why, unless STREAMJOIN_PYFLINK_PYTHON names its venv."""
    if (missing := pyflink_peer.not_installed()) is not None:
        return missing
    root = workdir / "pyflink-window"
    sides = pyflink_peer.write_sides(job, tables, root, parallelism)
    spec = flink_spec(job, sides, root, parallelism)
    out = pyflink_peer.run_job(_PYFLINK_JOB, spec, root, sum(t.num_rows for t in tables.values()))
    if not out["ran"]:
        return out
    got = pairs.read_csv(root / "out" / "results", [c for c, _ in spec["sink_columns"]], pair_columns(job),
                         {WINDOW_START: pa.timestamp("ms")})
    judged, _, _ = pairs.judge(expected, got, pair_columns(job))
    return {**out, **judged, "behind_file_watermark": pyflink_peer.behind(sides), "expected": expected.num_rows,
            "how": f"Flink SQL window join (streaming mode): TUMBLE(TABLE x, DESCRIPTOR(t), {spec['size']}) on both "
                   f"sides, ON {spec['on']}; CSV file sources with watermark {job.join.allowed_lateness_ms} ms (rows "
                   "in event-time order per Kafka partition, partitions merged by their progress: "
                   "behind_file_watermark counts rows late in their file), session time zone UTC; every column "
                   "written to CSV files, judged against the oracle's pairs; throughput over the job's seconds less "
                   "an empty job's"}
