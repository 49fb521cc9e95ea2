"""The nexmark bench's peers, on files of the events our fleets joined (exported from the topics),
each query as Nexmark writes it in SQL, each result judged against the Spark SQL oracle:

  pyflink  Flink SQL (bench/peers/pyflink_nexmark_job.py, all queries in one PyFlink process) on
           CSV files, each Kafka partition's rows in offset order and the partitions merged by
           their progress in event time (as a source with a watermark per partition reads them).
           Its throughput is a query's input events over the job's seconds less an empty job's,
           its CPU the process tree's (Python and the JVM) less the empty job's.
  spark    Spark Structured Streaming in this process's Spark, the query's tables as Parquet file
           streams, one available-now run: q3 and q20 as stream-stream inner joins (no
           watermark: state for the whole run, a regular join). q8 is not run: its windowed
           GROUP BYs feed a join, and Spark's streaming joins take no aggregated input. Its
           seconds are its batches' (planning before the first left out), its CPU the JVM's
           and this process's over the whole query, planning included.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin.bench.nexmark_model import AUCTION, BID, PERSON, TIME_FIELD
from streamjoin.bench.nexmark_queries import STREAMS, judge, result_keys
from streamjoin.bench.peers import pyflink_peer
from streamjoin.bench.scale import cpu_seconds
from streamjoin.engine.result_ids import WINDOW_START

VIEWS = {PERSON: "person", AUCTION: "auction", BID: "bid"}
_JOB = Path(__file__).with_name("peers") / "pyflink_nexmark_job.py"


def events_read(tables: dict[str, pa.Table], query: str) -> int:
    """The events a query reads: every record of its streams' topics."""
    return sum(tables[s].num_rows for s in STREAMS[query])


def _positive(x: float) -> float | None:
    return x if x > 0 else None


def figures(events: int, seconds: float | None, cpu_s: float | None) -> dict:
    """Events/s and events per CPU second (events/s per core busy)."""
    return {"events": events, "events_per_s": events / seconds if seconds else None,
            "events_per_cpu_s": events / cpu_s if cpu_s else None}


# ---------------------------------------------------------------- PyFlink


def run_pyflink(tables: dict[str, pa.Table], workdir: Path, queries: tuple[str, ...], lateness_ms: int,
                expected: dict[str, pa.Table], measure_startup: bool, parallelism: int = 2,
                timeout: float = 1800) -> dict:
    """Flink SQL of each query on CSV files of `tables`, judged against `expected`; reported as
    not run, and why, without its venv (STREAMJOIN_PYFLINK_PYTHON or the repository's .venv-pyflink).
    `measure_startup`: run a warm-up and an empty job of each query first, and report figures net
    of the empty job's seconds and CPU (without: gross figures only, start-up included)."""
    python = pyflink_peer.pyflink_python()
    if python is None:
        return {"ran": False, "why": f"{pyflink_peer.PYTHON_ENV} is not set and {pyflink_peer.DEFAULT_PYTHON} does "
                                     "not exist: PyFlink needs its own venv (ops/setup.sh makes it)"}
    root = workdir / "pyflink-nexmark"
    spec_tables = {}
    for kind, view in VIEWS.items():
        table = pyflink_peer.in_event_time_order(tables[kind], TIME_FIELD)
        pyflink_peer._write_csv(table, root / "in" / view, parallelism)
        pyflink_peer._write_csv(table.slice(0, 0), root / "empty" / view, parallelism)
        spec_tables[view] = {"columns": [[f.name, pyflink_peer._SQL_TYPES[f.type]] for f in table.schema],
                             "path": str(root / "in" / view), "empty_path": str(root / "empty" / view)}
    spec = {"parallelism": parallelism, "tables": spec_tables, "time_field": TIME_FIELD, "queries": list(queries),
            "lateness": pyflink_peer.interval(lateness_ms), "out": str(root / "out"),
            "measure_startup": measure_startup}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    began = time.monotonic()
    done = subprocess.run([python, str(_JOB), str(spec_path)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"ran": False, "why": f"the PyFlink job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    per_query = {}
    for q in queries:
        run, empty = out["queries"][q], out["empty"].get(q, {"seconds": 0.0, "cpu_seconds": 0.0})
        events = events_read(tables, q)
        net = figures(events, _positive(run["seconds"] - empty["seconds"]),
                      _positive(run["cpu_seconds"] - empty["cpu_seconds"])) if measure_startup else {}
        gross = figures(events, run["seconds"], run["cpu_seconds"])
        per_query[q] = {"events": events, "events_per_s": net.get("events_per_s"),
                        "events_per_cpu_s": net.get("events_per_cpu_s"),
                        "events_per_s_gross": gross["events_per_s"], "events_per_cpu_s_gross": gross["events_per_cpu_s"],
                        "seconds": run["seconds"], "cpu_seconds": run["cpu_seconds"],
                        "empty_seconds": empty["seconds"], "empty_cpu_seconds": empty["cpu_seconds"],
                        **judge(expected[q], read_csv_results(root / "out" / q, q))}
    return {"ran": True, "version": pyflink_peer._version(python), "parallelism": parallelism,
            "wall_seconds": round(time.monotonic() - began, 1), "queries": per_query,
            "how": "Flink SQL (streaming mode, UTC), CSV file sources with an event-time column and watermark "
                   f"{lateness_ms} ms, each query as Nexmark writes it (regular joins for q3 and q20, window TVF "
                   "GROUP BYs joined for q8), CSV sinks naming each result's inputs; events_per_s and "
                   "events_per_cpu_s over the job's seconds and CPU (Python and JVM) less an empty job's (none "
                   "where start-up was not measured or the difference is not positive), the _gross figures "
                   "over the whole job"}


def read_csv_results(root: Path, query: str) -> pa.Table:
    """The key columns of every CSV result file under `root` (q8's window start as epoch ms)."""
    keys = result_keys(query)
    options = pacsv.ReadOptions(column_names=keys)
    types = {WINDOW_START: pa.string()} if query == "q8" else {}
    parts = [pacsv.read_csv(f, read_options=options, convert_options=pacsv.ConvertOptions(column_types=types))
             for f in sorted(root.rglob("*")) if f.is_file() and not f.name.startswith(".") and f.stat().st_size]
    if not parts:
        return pa.table({k: pa.array([], pa.int64()) for k in keys})
    table = pa.concat_tables(parts)
    if query == "q8":  # 'YYYY-MM-DD hh:mm:ss.000' in UTC: whole seconds, windows being 10 s
        seconds = pc.strptime(pc.utf8_slice_codeunits(table[WINDOW_START], 0, 19), "%Y-%m-%d %H:%M:%S", "s")
        millis = pc.multiply(pc.cast(pc.cast(seconds, pa.int64()), pa.int64()), 1000)
        table = table.set_column(keys.index(WINDOW_START), WINDOW_START, millis)
    return table.cast(pa.schema([(k, pa.int64()) for k in keys]))


# ---------------------------------------------------------------- Spark Structured Streaming

SPARK_UNSUPPORTED = {"q8": "Spark Structured Streaming joins no aggregated stream: q8 joins two windowed GROUP BYs"}


def _spark_q3(frames: Callable[[str], DataFrame]) -> DataFrame:
    a, p = frames(AUCTION).alias("A"), frames(PERSON).alias("P")
    return (a.join(p, F.col("A.seller") == F.col("P.id"))
            .where((F.col("A.category") == 10) & F.col("P.state").isin("OR", "ID", "CA"))
            .select(F.col("A.partition").alias("auctions.partition"), F.col("A.offset").alias("auctions.offset"),
                    F.col("P.partition").alias("persons.partition"), F.col("P.offset").alias("persons.offset")))


def _spark_q20(frames: Callable[[str], DataFrame]) -> DataFrame:
    b, a = frames(BID).alias("B"), frames(AUCTION).alias("A")
    return (b.join(a, F.col("B.auction") == F.col("A.id")).where(F.col("A.category") == 10)
            .select(F.col("B.partition").alias("bids.partition"), F.col("B.offset").alias("bids.offset"),
                    F.col("A.partition").alias("auctions.partition"), F.col("A.offset").alias("auctions.offset")))


SPARK_QUERIES = {"q3": _spark_q3, "q20": _spark_q20}


def jvm_process() -> psutil.Process | None:
    """This process's Spark JVM (its java child)."""
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "java":
                return child
        except psutil.Error:
            continue
    return None


def run_spark(spark: SparkSession, tables: dict[str, pa.Table], workdir: Path, queries: tuple[str, ...],
              expected: dict[str, pa.Table], files: int = 4) -> dict:
    """Each query Spark Structured Streaming runs, on Parquet files of `tables` (`files` per
    kind, in event-time order), one available-now run each, judged against `expected`."""
    root = workdir / "spark-nexmark"
    for kind, table in tables.items():
        ordered = table.sort_by([(TIME_FIELD, "ascending")])
        (root / kind).mkdir(parents=True)
        step = -(-ordered.num_rows // files) or 1
        for i, lo in enumerate(range(0, ordered.num_rows, step)):
            pq.write_table(ordered.slice(lo, step), root / kind / f"{i:04d}.parquet")
    schemas = {kind: t.schema for kind, t in tables.items()}

    def frames(kind: str) -> DataFrame:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.readStream.schema(from_arrow_schema(schemas[kind])).parquet(str(root / kind))

    out: dict[str, dict] = {q: {"ran": False, "why": SPARK_UNSUPPORTED.get(q) or "not in this plan's Spark queries "
                                               "(the quick form runs q20 alone, for the suite's time)"} for q in STREAMS}
    for q in queries:
        if q in SPARK_QUERIES:
            out[q] = _spark_query(spark, SPARK_QUERIES[q](frames), root / f"checkpoint-{q}",
                                  events_read(tables, q), expected[q], result_keys(q))
    return {"ran": True, "version": spark.version, "queries": out,
            "how": "Spark Structured Streaming, Parquet file streams of the exported events, stream-stream inner "
                   "joins without watermarks (a regular join's unbounded state), trigger availableNow, results "
                   "collected in foreachBatch as Arrow; seconds: its batches' trigger executions; CPU: the JVM's "
                   "and the driver's over the whole query"}


def _spark_query(spark: SparkSession, joined: DataFrame, checkpoint: Path, events: int, expected_rows: pa.Table,
                 keys: list[str]) -> dict:
    parts: list[pa.Table] = []
    jvm, me = jvm_process(), psutil.Process()
    cpu = (cpu_seconds(jvm) if jvm else 0.0) + cpu_seconds(me)
    began = time.monotonic()
    query = (joined.writeStream.foreachBatch(lambda batch, _: parts.append(batch.toArrow()))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.monotonic() - began
    cpu = (cpu_seconds(jvm) if jvm else 0.0) + cpu_seconds(me) - cpu
    if query.exception() is not None:
        return {"ran": False, "why": f"the Spark query failed: {query.exception()}"}
    seconds = sum(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress if p.numInputRows) / 1000
    got = pa.concat_tables(parts).select(keys) if parts else pa.table({k: pa.array([], pa.int64()) for k in keys})
    return {"ran": True, **figures(events, seconds, cpu), "seconds": seconds, "wall_seconds": round(wall, 2),
            "cpu_seconds": cpu, "batches": len(query.recentProgress), **judge(expected_rows, got)}
