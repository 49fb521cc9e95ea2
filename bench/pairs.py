"""A peer's results judged pair by pair against an oracle's: each result named by columns that
identify it whatever engine made it (its inputs' Kafka partition and offset and, for a window
join, its window's start), all int64, compared as sets with duplicates counted.

  missing     the oracle's results the peer did not produce
  extra       distinct results of the peer outside the oracle's
  duplicates  the peer's results beyond the first of their kind
  exact       all three 0

The peers' own readers (CSV files, a results topic) give these columns; the workloads add what
their wrong answers mean on top (bench/asof_peers.py: orders joined with the wrong row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.csv as pacsv


def schema(columns: Sequence[str]) -> pa.Schema:
    """The judged columns, all int64 (Spark, Flink and JSON give partitions as int32 or int64)."""
    return pa.schema([(c, pa.int64()) for c in columns])


def judge(expected: pa.Table, got: pa.Table, columns: Sequence[str]) -> tuple[dict, pa.Table, pa.Table]:
    """`got` against `expected` by `columns`: the counts (results, missing, extra, duplicates,
    exact), and the missing and the extra results themselves, for the caller to say more."""
    keys, kinds = list(columns), schema(columns)
    expected, got = expected.select(keys).cast(kinds), got.select(keys).cast(kinds)
    distinct = got.group_by(keys).aggregate([])
    missing = expected.join(distinct, keys=keys, join_type="left anti")
    extra = distinct.join(expected, keys=keys, join_type="left anti")
    counts = {"results": got.num_rows, "missing": missing.num_rows, "extra": extra.num_rows,
              "duplicates": got.num_rows - distinct.num_rows}
    return counts | {"exact": counts["missing"] == counts["extra"] == counts["duplicates"] == 0}, missing, extra


def read_csv(root: Path, columns: Sequence[str], keep: Sequence[str],
             types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """The `keep` columns, as int64, of every headerless CSV file under `root` whose columns are
    `columns`; `types`: how to parse some of them first (a timestamp: its epoch milliseconds)."""
    read = pacsv.ReadOptions(column_names=list(columns))
    convert = pacsv.ConvertOptions(include_columns=list(keep), column_types=types or {})
    parts = [pacsv.read_csv(f, read_options=read, convert_options=convert) for f in sorted(root.rglob("*"))
             if f.is_file() and not f.name.startswith(".") and f.stat().st_size]
    if not parts:
        return schema(keep).empty_table()
    table = pa.concat_tables(parts)
    # A timestamp casts to int64 in its own unit: milliseconds, as `types` parsed it.
    return pa.table({c: table[c].cast(pa.int64()) for c in keep})
