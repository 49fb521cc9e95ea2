"""PyFlink's interval join on the same input: the other well-known engine that
installs from PyPI and runs this join here. Its pins (py4j, pandas, pyarrow,
apache-beam) clash with PySpark's and ours, so it runs from its own venv,
named by STREAMJOIN_PYFLINK_PYTHON; without it the peer reports why it did
not run. Input: CSV files of the exported tuples (two per stream, split by
Kafka partition so both source tasks read the whole time range), Flink's
filesystem source in streaming mode with the same watermark, the interval
condition equal to our window rule, every column written to CSV files.
Throughput is the input over (job seconds minus an empty job's seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from streamjoin.settings import JobSettings

PYTHON_ENV = "STREAMJOIN_PYFLINK_PYTHON"
# The venv ops/setup.sh builds; only `bench nexmark` falls back to it (pyflink_python), so the
# other benchmarks' quick forms in the suite run PyFlink only when PYTHON_ENV names it.
DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-pyflink" / "bin" / "python"
_JOB = Path(__file__).with_name("pyflink_job.py")
_SQL_TYPES = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING", pa.float64(): "DOUBLE",
              pa.bool_(): "BOOLEAN"}


def interval(ms: int) -> str:
    """A Flink SQL interval literal of `ms` milliseconds (SECOND(p) has a leading precision to respect)."""
    return f"INTERVAL '{ms / 1000:.3f}' SECOND({max(2, len(str(ms // 1000)))}, 3)"


def where_clause(job: JobSettings) -> str:
    """Equal keys between consecutive streams and, for every ordered pair, t_j < t_i + W_i."""
    specs = job.streams
    keys = [f"{a.name}.`{ka}` = {b.name}.`{kb}`" for a, b in zip(specs, specs[1:])
            for ka, kb in zip(a.key_fields, b.key_fields)]
    times = [f"{b.name}.t < {a.name}.t + {interval(a.window.range_ms)}"
             for a in specs for b in specs if b is not a]
    return " AND ".join(keys + times)


def _write_csv(table: pa.Table, directory: Path, parts: int) -> None:
    directory.mkdir(parents=True)
    which = table.column("partition").to_numpy() % parts
    for i in range(parts):
        pacsv.write_csv(table.filter(pa.array(which == i)), directory / f"part-{i}.csv",
                        pacsv.WriteOptions(include_header=False))


def _spec(job: JobSettings, tables: dict[str, pa.Table], root: Path, parallelism: int) -> dict:
    streams, sink_columns, select = [], [], []
    for spec in job.streams:
        table = tables[spec.name]
        columns = [[f.name, _SQL_TYPES[f.type]] for f in table.schema]
        _write_csv(table, root / "in" / spec.name, parallelism)
        _write_csv(table.slice(0, 0), root / "empty" / spec.name, parallelism)
        streams.append({"name": spec.name, "columns": columns, "time_field": spec.time_field,
                        "lateness": interval(job.join.allowed_lateness_ms),
                        "path": str(root / "in" / spec.name), "empty_path": str(root / "empty" / spec.name)})
        sink_columns += [[f"{spec.name}_{n}", t] for n, t in columns]
        select += [f"{spec.name}.`{n}`" for n, _ in columns]
    return {"parallelism": parallelism, "streams": streams, "sink_columns": sink_columns, "select": ", ".join(select),
            "from": ", ".join(s.name for s in job.streams), "where": where_clause(job), "out": str(root / "out")}


def run_pyflink(job: JobSettings, tables: dict[str, pa.Table], workdir: Path, parallelism: int = 2,
                timeout: float = 1800) -> dict:
    python = os.environ.get(PYTHON_ENV)
    if not python:
        return {"ran": False, "why": f"{PYTHON_ENV} is not set: PyFlink needs its own venv (see "
                                     "docs/benchmarks/index.md)"}
    spec = _spec(job, tables, workdir / "pyflink", parallelism)
    spec_path = workdir / "pyflink" / "spec.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([python, str(_JOB), str(spec_path)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"ran": False, "why": f"the PyFlink job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    inputs = sum(t.num_rows for t in tables.values())
    work = out["seconds"] - out["startup_seconds"]
    return {"ran": True, "tuples_per_s": inputs / work if work > 0 else None, "inputs": inputs, **out,
            "version": _version(python), "parallelism": parallelism,
            "how": "Flink SQL interval join (streaming mode), filesystem CSV source and sink, watermark "
                   f"{job.join.allowed_lateness_ms} ms, WHERE {spec['where']}"}


def pyflink_python() -> str | None:
    """PyFlink's python: STREAMJOIN_PYFLINK_PYTHON, else the repository's .venv-pyflink if it exists."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return named
    return str(DEFAULT_PYTHON) if DEFAULT_PYTHON.exists() else None


def _version(python: str) -> str | None:
    done = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('apache-flink'))"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or None
