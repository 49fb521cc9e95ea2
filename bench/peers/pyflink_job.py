"""PyFlink interval join, run by `pyflink_peer` under PyFlink's own Python
(PyFlink's pins clash with this project's, so it lives in a separate venv and
this file imports nothing from the project). Its runner, sources and sink
serve the as-of and window jobs beside it too.

Usage: python pyflink_job.py SPEC.json; prints one JSON line: the seconds
the join took on the real input, on an empty input of the same shape (the
job's fixed start-up cost, measured after a warm-up job), and the number of
results it wrote.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable


def source(t_env, side: dict, data_key: str, primary_key: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """A CSV file source of one side (pyflink_peer.write_sides' entry): its columns, event time
    t with the lateness as watermark and, given `primary_key`, that key as PRIMARY KEY (which
    makes it a versioned table)."""
    cols = ", ".join(f"`{name}` {sql_type}" for name, sql_type in side["columns"])
    key = f", PRIMARY KEY (`{primary_key}`) NOT ENFORCED" if primary_key else ""
    t_env.execute_sql(f"DROP TABLE IF EXISTS {side['name']}")
    t_env.execute_sql(
        f"CREATE TABLE {side['name']} ({cols}, t AS TO_TIMESTAMP_LTZ(`{side['time_field']}`, 3), "
        f"WATERMARK FOR t AS t - {side['lateness']}{key}) "
        f"WITH ('connector' = 'filesystem', 'path' = '{side[data_key]}', 'format' = 'csv')")


def sink(t_env, columns: list[list[str]], out: Path) -> None:  # type: ignore[no-untyped-def]
    """The CSV file sink `sink` under `out`, with `columns` ([name, SQL type] each)."""
    cols = ", ".join(f"`{name}` {sql_type}" for name, sql_type in columns)
    t_env.execute_sql("DROP TABLE IF EXISTS sink")
    t_env.execute_sql(f"CREATE TABLE sink ({cols}) WITH ('connector' = 'filesystem', 'path' = '{out}', "
                      "'format' = 'csv')")


def _join(t_env, spec: dict, data_key: str, out: Path) -> float:  # type: ignore[no-untyped-def]
    """Runs the join into CSV files under `out`; returns its wall seconds."""
    for side in spec["streams"]:
        source(t_env, side, data_key)
    sink(t_env, spec["sink_columns"], out)
    began = time.perf_counter()
    t_env.execute_sql(f"INSERT INTO sink SELECT {spec['select']} FROM {spec['from']} WHERE {spec['where']}").wait()
    return time.perf_counter() - began


def _lines(root: Path) -> int:
    return sum(sum(1 for _ in f.open("rb")) for f in root.rglob("*") if f.is_file())


def run(spec_path: str, join: Callable) -> None:  # type: ignore[type-arg]
    """Run `join(t_env, spec, data_key, out)` (seconds it took) on an empty input twice (a warm-up:
    the first job also loads and compiles the JVM side; then the start-up cost) and on the real
    one, and print the figures (the module docstring's JSON line)."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    spec = json.loads(Path(spec_path).read_text())
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    t_env.get_config().set("parallelism.default", str(spec["parallelism"]))
    out = Path(spec["out"])
    join(t_env, spec, "empty_path", out / "warm-up")
    empty = join(t_env, spec, "empty_path", out / "empty")
    seconds = join(t_env, spec, "path", out / "results")
    print(json.dumps({"seconds": seconds, "startup_seconds": empty, "results": _lines(out / "results")}))


def main(spec_path: str) -> None:
    run(spec_path, _join)


if __name__ == "__main__":
    main(sys.argv[1])
