"""The as-of bench's peers, run on the input our fleet joined and judged against the oracle's
pairs (asof_workload.expected_pairs):

  quix     Quix Streams' `join_asof` (bench/peers/quix_asof_job.py) from its own venv, reading
           the same topics: it joins each order, when it processes it, with the newest row of
           its customer at or before the order's time among the rows processed so far; it reads
           the topics in Kafka-timestamp order, so a row that arrives after an order it is valid
           for is not there yet, and the order is joined with an older row (or none).
  pyflink  PyFlink's event-time temporal join (bench/peers/pyflink_asof_job.py) from the venv
           STREAMJOIN_PYFLINK_PYTHON names, on CSV files of the exported inputs.

Both are launched as their window-join counterparts are (bench/peers/quix_peer.py,
pyflink_peer.py), with those modules' venv look-up, consumer settings and CSV writer.

A peer's results are compared with the oracle's pairs by both inputs' (partition, offset):
missing, extra (distinct pairs outside the oracle's), duplicates (results beyond the first of
their pair) and `wrong_version`: orders whose one result names another row than the valid one
(or none where there is one, or one where there is none).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from streamjoin.bench.asof_workload import PAIR, STREAM, TABLE, spec_of
from streamjoin.bench.peers import pyflink_peer, quix_peer
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings

_PAIR_SCHEMA = pa.schema([(c, pa.int64()) for c in PAIR])
_QUIX_JOB = Path(__file__).with_name("peers") / "quix_asof_job.py"
_PYFLINK_JOB = Path(__file__).with_name("peers") / "pyflink_asof_job.py"


def judge(expected: pa.Table, got: pa.Table) -> dict:
    """`got`'s results against the `expected` pairs (both PAIR columns): the counts of results,
    missing, extra, duplicates and wrong_version, and `exact`."""
    keys = list(PAIR)
    expected, got = expected.cast(_PAIR_SCHEMA), got.cast(_PAIR_SCHEMA)
    distinct = got.group_by(keys).aggregate([])
    missing = expected.join(distinct, keys=keys, join_type="left anti")
    extra = distinct.join(expected, keys=keys, join_type="left anti")
    orders = list(PAIR[:2])
    wrong = missing.select(orders).join(extra.select(orders).group_by(orders).aggregate([]), keys=orders,
                                        join_type="inner")
    counts = {"results": got.num_rows, "missing": missing.num_rows, "extra": extra.num_rows,
              "duplicates": got.num_rows - distinct.num_rows, "wrong_version": wrong.num_rows}
    return counts | {"exact": counts["missing"] == counts["extra"] == counts["duplicates"] == 0}


def read_topic_pairs(cluster: kafka.Cluster, topic: str, partitions: int) -> pa.Table:
    """The PAIR columns of every JSON result in `topic` (read_committed, to its true end)."""
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(partitions), 0), f"{topic}-read")
    rows = [json.loads(m.value()) for m in records]  # a peer's output, read once: not a hot path
    return pa.table({c: pa.array([r[c] for r in rows], pa.int64()) for c in PAIR})


# ---------------------------------------------------------------- Quix Streams


def run_quix(job: JobSettings, tables: dict[str, pa.Table], cluster: kafka.Cluster, workdir: Path,
             expected: pa.Table, grace_ms: int, consumer: dict, timeout: float = 1800) -> dict:
    """Quix's `join_asof` on the job's topics (`tables`: the exported inputs, how many records it
    must process), judged against `expected`; `grace_ms`: how long its store keeps a row behind
    the customer's newest; `consumer`: consumer settings over quix_peer's own."""
    python = quix_peer.quix_python()
    if python is None:
        return {"ran": False, "why": f"{quix_peer.PYTHON_ENV} is not set and {quix_peer.DEFAULT_PYTHON} does not "
                                     "exist: Quix Streams needs its own venv (ops/setup.sh makes it)"}
    inputs = sum(t.num_rows for t in tables.values())
    root = workdir / "quix-asof"
    root.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    sides = {name: {"name": name, "topic": job.topic_of(spec_of(job, name)),
                    "time_field": spec_of(job, name).time_field} for name in (STREAM, TABLE)}
    spec = {"bootstrap": cluster.bootstrap, "group": f"{job.job}-quix-{run}", "inputs": inputs,
            "stream": sides[STREAM], "table": sides[TABLE], "how": job.join.type, "grace_ms": grace_ms,
            "output": f"{job.job}.quix-results-{run}", "partitions": job.partitions,
            "state_dir": str(root / f"state-{run}"), "consumer_config": quix_peer._CONSUMER | consumer}
    spec_path = root / f"{spec['group']}.json"
    spec_path.write_text(json.dumps(spec))
    try:
        done = subprocess.run([python, str(_QUIX_JOB), str(spec_path)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "why": f"the Quix job did not drain the input within {timeout:.0f}s"}
    if done.returncode != 0:
        return {"ran": False, "why": f"the Quix job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    judged = judge(expected, read_topic_pairs(cluster, spec["output"], job.partitions))
    return {"ran": True, "tuples": inputs, "tuples_per_s": inputs / out["seconds"], **out, **judged,
            "expected": expected.num_rows,
            "how": f"quixstreams Application, exactly-once, fresh group from the earliest offsets of both topics, "
                   f"event time from the JSON time field; orders.join_asof(customers, how='{job.join.type}', "
                   f"grace_ms={grace_ms}) (a grace covering the whole run: no row expires before an order needs "
                   "it); results as JSON naming both inputs, judged against the oracle's pairs"}


# ---------------------------------------------------------------- PyFlink


def run_pyflink(job: JobSettings, tables: dict[str, pa.Table], workdir: Path, expected: pa.Table,
                parallelism: int = 2, timeout: float = 1800) -> dict:
    """PyFlink's event-time temporal join on CSV files of `tables`, judged against `expected`;
    reported as not run, and why, unless STREAMJOIN_PYFLINK_PYTHON names its venv."""
    python = os.environ.get(pyflink_peer.PYTHON_ENV)
    if not python:
        return {"ran": False, "why": f"{pyflink_peer.PYTHON_ENV} is not set: PyFlink needs its own venv (see "
                                     "docs/benchmarks/index.md)"}
    root = workdir / "pyflink-asof"
    sides = {}
    for name in (STREAM, TABLE):
        spec, table = spec_of(job, name), tables[name]
        pyflink_peer._write_csv(table, root / "in" / name, parallelism)
        pyflink_peer._write_csv(table.slice(0, 0), root / "empty" / name, parallelism)
        sides[name] = {"name": name, "columns": [[f.name, pyflink_peer._SQL_TYPES[f.type]] for f in table.schema],
                       "time_field": spec.time_field,
                       "lateness": pyflink_peer.interval(job.join.allowed_lateness_ms),
                       "path": str(root / "in" / name), "empty_path": str(root / "empty" / name)}
    spec = {"parallelism": parallelism, "stream": sides[STREAM], "table": sides[TABLE], "how": job.join.type,
            "key": spec_of(job, TABLE).key_fields[0], "out": str(root / "out")}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([python, str(_PYFLINK_JOB), str(spec_path)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        return {"ran": False, "why": f"the PyFlink job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    inputs = sum(t.num_rows for t in tables.values())
    work = out["seconds"] - out["startup_seconds"]
    judged = judge(expected, read_csv_pairs(root / "out" / "results"))
    return {"ran": True, "tuples": inputs, "tuples_per_s": inputs / work if work > 0 else None, **out, **judged,
            "expected": expected.num_rows, "version": pyflink_peer._version(python), "parallelism": parallelism,
            "how": f"Flink SQL event-time temporal join (streaming mode), CSV file sources with watermark "
                   f"{job.join.allowed_lateness_ms} ms, customers with PRIMARY KEY (a versioned table): orders "
                   f"{'LEFT ' if job.join.type == 'left' else ''}JOIN customers FOR SYSTEM_TIME AS OF the order's "
                   "time; results as CSV naming both inputs, judged against the oracle's pairs; throughput over "
                   "the job's seconds less an empty job's"}


def read_csv_pairs(root: Path) -> pa.Table:
    """The PAIR columns of every CSV result file under `root`."""
    options = pacsv.ReadOptions(column_names=list(PAIR))
    parts = [pacsv.read_csv(f, read_options=options) for f in sorted(root.rglob("*"))
             if f.is_file() and not f.name.startswith(".") and f.stat().st_size]
    return pa.concat_tables(parts).cast(_PAIR_SCHEMA) if parts else _PAIR_SCHEMA.empty_table()
