"""PyFlink event-time temporal join, run by the as-of bench (bench/asof_peers.py) under
PyFlink's own Python (PyFlink's pins clash with this project's, so it lives in a separate venv
and this file imports nothing from the project; it shares pyflink_job.py's pieces, which sit
beside it on the script's path).

Usage: python pyflink_asof_job.py SPEC.json. The stream and the table are CSV file sources in
streaming mode, each with its event time and the join's lateness as its watermark; the table
declares its key as PRIMARY KEY, which makes it a versioned table. Each order joins the row
valid at its time:

    SELECT ... FROM orders AS o [LEFT] JOIN customers FOR SYSTEM_TIME AS OF o.t AS c ON o.key = c.key

writing both inputs' partition and offset (ABSENT, -1, for a left join's order without a
row) to CSV files. Prints one JSON line: the seconds the join took on the real input, on an
empty input of the same shape (the job's fixed start-up cost, measured after a warm-up job),
and the number of results it wrote.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyflink_job import run, sink, source

ABSENT = -1


def _join(t_env, spec: dict, data_key: str, out: Path) -> float:  # type: ignore[no-untyped-def]
    """Runs the temporal join into CSV files under `out`; returns its wall seconds."""
    stream, table, key = spec["stream"], spec["table"], spec["key"]
    source(t_env, stream, data_key)
    source(t_env, table, data_key, primary_key=key)
    sink(t_env, [["stream_partition", "INT"], ["stream_offset", "BIGINT"], ["table_partition", "INT"],
                 ["table_offset", "BIGINT"]], out)
    join = "LEFT JOIN" if spec["how"] == "left" else "JOIN"
    began = time.perf_counter()
    t_env.execute_sql(
        f"INSERT INTO sink SELECT s.`partition`, s.`offset`, COALESCE(v.`partition`, {ABSENT}), "
        f"COALESCE(v.`offset`, CAST({ABSENT} AS BIGINT)) FROM {stream['name']} AS s {join} {table['name']} "
        f"FOR SYSTEM_TIME AS OF s.t AS v ON s.`{key}` = v.`{key}`").wait()
    return time.perf_counter() - began


def main(spec_path: str) -> None:
    run(spec_path, _join)


if __name__ == "__main__":
    main(sys.argv[1])
