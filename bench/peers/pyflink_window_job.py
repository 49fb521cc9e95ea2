"""PyFlink tumbling-window join, run by the window bench (bench/window_peers.py) under
PyFlink's own Python (PyFlink's pins clash with this project's, so it lives in a separate venv
and this file imports nothing from the project; it shares pyflink_job.py's pieces, which sit
beside it on the script's path).

Usage: python pyflink_window_job.py SPEC.json. Both streams are CSV file sources in streaming
mode, each with its event time and the join's lateness as its watermark; the window
table-valued function cuts each into tumbling windows and Flink's window join joins them per
window, as its documentation writes it:

    SELECT ... FROM (SELECT * FROM TABLE(TUMBLE(TABLE r, DESCRIPTOR(t), INTERVAL W))) AS r
    JOIN (SELECT * FROM TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), INTERVAL W))) AS s
    ON r.k = s.k AND r.window_start = s.window_start AND r.window_end = s.window_end

writing the spec's columns (both inputs' partition and offset, the window's start, every other
column of both) to CSV files. The session time zone is UTC, so window_start, a TIMESTAMP in
it, reads as the instance's UTC start. Prints pyflink_job.run's JSON line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyflink_job import run, sink, source


def _join(t_env, spec: dict, data_key: str, out: Path) -> float:  # type: ignore[no-untyped-def]
    """Runs the window join into CSV files under `out`; returns its wall seconds."""
    t_env.get_config().set("table.local-time-zone", "UTC")
    for side in spec["streams"]:
        source(t_env, side, data_key)
    sink(t_env, spec["sink_columns"], out)
    left, right = (f"(SELECT * FROM TABLE(TUMBLE(TABLE {s['name']}, DESCRIPTOR(t), {spec['size']}))) AS {s['name']}"
                   for s in spec["streams"])
    began = time.perf_counter()
    t_env.execute_sql(f"INSERT INTO sink SELECT {spec['select']} FROM {left} JOIN {right} ON {spec['on']}").wait()
    return time.perf_counter() - began


def main(spec_path: str) -> None:
    run(spec_path, _join)


if __name__ == "__main__":
    main(sys.argv[1])
