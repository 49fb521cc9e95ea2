"""PyFlink interval join, run by `pyflink_peer` under PyFlink's own Python
(PyFlink's pins clash with this project's, so it lives in a separate venv and
this file imports nothing from the project).

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


def _tables(t_env, streams: list[dict], data_key: str) -> None:  # type: ignore[no-untyped-def]
    for s in streams:
        cols = ", ".join(f"`{name}` {sql_type}" for name, sql_type in s["columns"])
        t_env.execute_sql(f"DROP TABLE IF EXISTS {s['name']}")
        t_env.execute_sql(
            f"CREATE TABLE {s['name']} ({cols}, t AS TO_TIMESTAMP_LTZ(`{s['time_field']}`, 3), "
            f"WATERMARK FOR t AS t - {s['lateness']}) "
            f"WITH ('connector' = 'filesystem', 'path' = '{s[data_key]}', 'format' = 'csv')")


def _join(t_env, spec: dict, data_key: str, out: Path) -> float:  # type: ignore[no-untyped-def]
    """Runs the join into CSV files under `out`; returns its wall seconds."""
    _tables(t_env, spec["streams"], data_key)
    sink_cols = ", ".join(f"`{name}` {sql_type}" for name, sql_type in spec["sink_columns"])
    t_env.execute_sql("DROP TABLE IF EXISTS sink")
    t_env.execute_sql(f"CREATE TABLE sink ({sink_cols}) WITH ('connector' = 'filesystem', 'path' = '{out}', "
                      "'format' = 'csv')")
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
