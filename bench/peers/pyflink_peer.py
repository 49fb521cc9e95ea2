"""PyFlink's interval join on the same input: the other well-known engine that
installs from PyPI and runs this join here. Its pins (py4j, pandas, pyarrow,
apache-beam) clash with PySpark's and ours, so it runs from its own venv,
named by STREAMJOIN_PYFLINK_PYTHON; without it the peer reports why it did
not run. Input: CSV files of the exported tuples (two per stream, split by
Kafka partition so both source tasks read the whole time range), Flink's
filesystem source in streaming mode with the same watermark, the interval
condition equal to our window rule, every column written to CSV files.
Throughput is the input over (job seconds minus an empty job's seconds).

The as-of and window benches run their own PyFlink jobs (pyflink_asof_job.py,
pyflink_window_job.py) through the pieces here: the venv look-up, the CSV
files of each side in event-time order per Kafka partition (`write_sides`)
and the job's launch and figures (`run_job`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
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


def key_terms(job: JobSettings) -> list[str]:
    """Equal keys between consecutive streams (equality is transitive), one SQL term per field."""
    specs = job.streams
    return [f"{a.name}.`{ka}` = {b.name}.`{kb}`" for a, b in zip(specs, specs[1:])
            for ka, kb in zip(a.key_fields, b.key_fields)]


def where_clause(job: JobSettings) -> str:
    """Equal keys between consecutive streams and, for every ordered pair, t_j < t_i + W_i."""
    specs = job.streams
    keys = key_terms(job)
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


def not_installed() -> dict | None:
    """The peer's report when no venv is named (it then does not run); None when one is."""
    if os.environ.get(PYTHON_ENV):
        return None
    return {"ran": False, "why": f"{PYTHON_ENV} is not set: PyFlink needs its own venv (see docs/benchmarks/index.md)"}


def run_job(script: Path, spec: dict, root: Path, inputs: int, timeout: float = 1800) -> dict:
    """Runs the PyFlink job `script` on `spec` (written under `root`) from the venv PYTHON_ENV
    names: its JSON line, with `ran`, `tuples` (`inputs`), `tuples_per_s` (over its seconds less
    an empty job's), the PyFlink version and the parallelism; `ran: false` and why if it fails."""
    python = os.environ[PYTHON_ENV]
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([python, str(script), str(spec_path)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"ran": False, "why": f"the PyFlink job failed ({done.returncode}): {done.stderr[-2000:]}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    work = out["seconds"] - out["startup_seconds"]
    return {"ran": True, "tuples": inputs, "tuples_per_s": inputs / work if work > 0 else None, **out,
            "version": _version(python), "parallelism": spec["parallelism"]}


def run_pyflink(job: JobSettings, tables: dict[str, pa.Table], workdir: Path, parallelism: int = 2) -> dict:
    if (missing := not_installed()) is not None:
        return missing
    spec = _spec(job, tables, workdir / "pyflink", parallelism)
    out = run_job(_JOB, spec, workdir / "pyflink", sum(t.num_rows for t in tables.values()))
    if not out["ran"]:
        return out
    return {**out, "how": "Flink SQL interval join (streaming mode), filesystem CSV source and sink, watermark "
                          f"{job.join.allowed_lateness_ms} ms, WHERE {spec['where']}"}


# ---------------------------------------------------------------- CSV files in event-time order


def write_sides(job: JobSettings, tables: dict[str, pa.Table], root: Path, parallelism: int) -> dict[str, dict]:
    """Per stream: `tables`' rows `in_event_time_order` as CSV files under root/in (and an empty
    input of the same shape under root/empty), and its entry of a job spec (name, columns,
    time_field, lateness, path, empty_path); `behind_file_watermark` counts the rows a file
    source would still take as late (0 by construction)."""
    sides = {}
    for spec in job.streams:
        table = in_event_time_order(tables[spec.name], spec.time_field)
        _write_csv(table, root / "in" / spec.name, parallelism)
        _write_csv(table.slice(0, 0), root / "empty" / spec.name, parallelism)
        sides[spec.name] = {
            "name": spec.name, "columns": [[f.name, _SQL_TYPES[f.type]] for f in table.schema],
            "time_field": spec.time_field, "lateness": interval(job.join.allowed_lateness_ms),
            "path": str(root / "in" / spec.name), "empty_path": str(root / "empty" / spec.name),
            "behind_file_watermark": behind_file_watermark(table, spec.time_field, job.join.allowed_lateness_ms,
                                                           parallelism)}
    return sides


def behind(sides: dict[str, dict]) -> dict[str, int]:
    """`write_sides`' count of rows behind their file's watermark, per stream."""
    return {name: side["behind_file_watermark"] for name, side in sides.items()}


def in_event_time_order(table: pa.Table, time_field: str) -> pa.Table:
    """`table`'s rows with each Kafka partition's in offset order, the partitions merged by how
    far each has come in event time (the newest time so far in its partition): no row then
    follows one newer than it by more than its own partition's disorder, as a source with a
    watermark per Kafka partition reads them (ours, Kafka's sources). A CSV file holds several
    partitions; merged by Kafka timestamp, records written in one tick could fall behind the
    file's watermark."""
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    part, ts = table["partition"].to_numpy(), table[time_field].to_numpy()
    progress = np.empty_like(ts)
    starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(ts)]):
        progress[a:b] = np.maximum.accumulate(ts[a:b])
    return table.take(np.lexsort((table["offset"].to_numpy(), part, progress)))


def behind_file_watermark(table: pa.Table, time_field: str, lateness_ms: int, files: int) -> int:
    """Rows of `table` that follow, in their CSV file (partition mod `files`, rows in table order),
    a row newer than them by more than the lateness: behind the watermark of a source reading
    that file (none, in `in_event_time_order`)."""
    which = table["partition"].to_numpy() % files
    ts = table[time_field].to_numpy()
    late = 0
    for i in range(files):
        t = ts[which == i]
        late += int((t < np.maximum.accumulate(t) - lateness_ms).sum())
    return late


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
