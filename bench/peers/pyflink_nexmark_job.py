"""Nexmark's q3, q8 and q20 in Flink SQL, run by the nexmark bench (bench/nexmark_peers.py) under
PyFlink's own Python (its pins clash with this project's, so it imports nothing from the project;
it shares pyflink_job.py's line counter, which sits beside it on the script's path).

Usage: python pyflink_nexmark_job.py SPEC.json. One TableEnvironment (streaming mode, UTC) runs
every query of the spec in turn on CSV file sources of the exported events (person, auction and
bid, Nexmark's table names; an event-time column `dateTime` with the spec's lateness as its
watermark), each query as Nexmark writes it, into CSV files naming each result's inputs (q8: the
person's id and the window start, its SELECT). With the spec's `measure_startup`, first a warm-up
job (q8 on empty files: the JVM side loads and compiles), then an empty job of each query (its
fixed start-up cost); then the queries on the events. Prints one JSON line: per query its
seconds, the CPU seconds of this process and its children (the JVM) over it, and the results
written; the same for each empty job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyflink_job import _lines

QUERIES = {
    "q3": ("`auctions.partition` INT, `auctions.offset` BIGINT, `persons.partition` INT, `persons.offset` BIGINT",
           "SELECT A.`partition`, A.`offset`, P.`partition`, P.`offset` "
           "FROM auction AS A INNER JOIN person AS P ON A.seller = P.id "
           "WHERE A.category = 10 AND (P.`state` = 'OR' OR P.`state` = 'ID' OR P.`state` = 'CA')"),
    "q8": ("`persons.id` BIGINT, window_start STRING",
           "SELECT P.id, CAST(P.starttime AS STRING) FROM ("
           "  SELECT id, name, window_start AS starttime, window_end AS endtime"
           "  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))"
           "  GROUP BY id, name, window_start, window_end) P "
           "JOIN ("
           "  SELECT seller, window_start AS starttime, window_end AS endtime"
           "  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))"
           "  GROUP BY seller, window_start, window_end) A "
           "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"),
    "q20": ("`bids.partition` INT, `bids.offset` BIGINT, `auctions.partition` INT, `auctions.offset` BIGINT",
            "SELECT B.`partition`, B.`offset`, A.`partition`, A.`offset` "
            "FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id WHERE A.category = 10"),
}


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live descendant (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    ours, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in ours:
                ours.add(child)
                frontier.append(child)
    return sum(cpu.get(pid, 0.0) for pid in ours)


def _tables(t_env, spec: dict, data_key: str) -> None:  # type: ignore[no-untyped-def]
    for view, table in spec["tables"].items():
        cols = ", ".join(f"`{name}` {sql_type}" for name, sql_type in table["columns"])
        t_env.execute_sql(f"DROP TABLE IF EXISTS {view}")
        t_env.execute_sql(
            f"CREATE TABLE {view} ({cols}, `dateTime` AS TO_TIMESTAMP_LTZ(`{spec['time_field']}`, 3), "
            f"WATERMARK FOR `dateTime` AS `dateTime` - {spec['lateness']}) "
            f"WITH ('connector' = 'filesystem', 'path' = '{table[data_key]}', 'format' = 'csv')")


def _query(t_env, spec: dict, query: str, data_key: str, out: Path) -> dict:  # type: ignore[no-untyped-def]
    """Runs `query` into CSV files under `out`: its seconds, CPU seconds and results."""
    _tables(t_env, spec, data_key)
    sink_columns, select = QUERIES[query]
    t_env.execute_sql(f"DROP TABLE IF EXISTS sink_{query}")
    t_env.execute_sql(f"CREATE TABLE sink_{query} ({sink_columns}) WITH ('connector' = 'filesystem', "
                      f"'path' = '{out}', 'format' = 'csv')")
    cpu, began = tree_cpu_seconds(), time.perf_counter()
    t_env.execute_sql(f"INSERT INTO sink_{query} {select}").wait()
    seconds, cpu = time.perf_counter() - began, tree_cpu_seconds() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "results": _lines(out) if out.exists() else 0}


def main(spec_path: str) -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    spec = json.loads(Path(spec_path).read_text())
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    t_env.get_config().set("parallelism.default", str(spec["parallelism"]))
    t_env.get_config().set("table.local-time-zone", "UTC")  # windows aligned on epoch milliseconds
    out = Path(spec["out"])
    empty = {}
    if spec["measure_startup"]:
        _query(t_env, spec, "q8", "empty_path", out / "warm-up")
        empty = {q: _query(t_env, spec, q, "empty_path", out / f"empty-{q}") for q in spec["queries"]}
    queries = {q: _query(t_env, spec, q, "path", out / q) for q in spec["queries"]}
    print(json.dumps({"empty": empty, "queries": queries}))


if __name__ == "__main__":
    main(sys.argv[1])
