"""Judging a peer pair by pair (bench/pairs.py), the window bench's readers of its peers' output
(Spark's window struct, Flink's CSV timestamps) and its PyFlink window-join statement, and the
CSV order that keeps every row within its file's watermark (pyflink_peer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from streamjoin.bench import pairs, window_peers
from streamjoin.bench.peers import pyflink_peer
from streamjoin.settings import load

COLUMNS = ("r_partition", "r_offset", "s_partition", "s_offset", "window_start")


def _table(rows: list[tuple[int, ...]]) -> pa.Table:
    return pa.table({c: pa.array([r[i] for r in rows], pa.int64()) for i, c in enumerate(COLUMNS)})


def _job():  # type: ignore[no-untyped-def]
    side = {"fields": {"k": "int", "ts": "int", "pad": "str"}, "time_field": "ts", "key_fields": ["k"],
            "window": {"tumbling_ms": 10_000}}
    return load(None, job="w", partitions=4, streams=[{"name": "r", **side}, {"name": "s", **side}],
                join={"allowed_lateness_ms": 2000})


def test_judge_counts_missing_extra_and_duplicates_by_every_column() -> None:
    expected = _table([(0, 1, 0, 2, 0), (0, 1, 0, 3, 0), (1, 5, 1, 6, 10_000)])
    # One pair right, one twice, one missing, the same refs in another window an extra one.
    got = _table([(0, 1, 0, 2, 0), (0, 1, 0, 2, 0), (1, 5, 1, 6, 0)])
    counts, missing, extra = pairs.judge(expected, got, COLUMNS)
    assert counts == {"results": 3, "missing": 2, "extra": 1, "duplicates": 1, "exact": False}
    assert sorted(missing.to_pylist(), key=str) == sorted(_table([(0, 1, 0, 3, 0), (1, 5, 1, 6, 10_000)]).to_pylist(),
                                                          key=str)
    assert extra.to_pylist() == _table([(1, 5, 1, 6, 0)]).to_pylist()
    assert pairs.judge(expected, expected, COLUMNS)[0]["exact"] is True


def test_flink_csv_timestamps_read_as_epoch_milliseconds(tmp_path: Path) -> None:
    out = tmp_path / "results" / "part-0"
    out.parent.mkdir()
    # Flink's CSV writer: TIMESTAMP(3) in the session time zone (UTC), fraction as it falls.
    out.write_text("1,7,2,9,2026-12-01 10:00:10,x,3\n1,8,2,9,2026-12-01 10:00:20.000,y,4\n")
    table = pairs.read_csv(tmp_path / "results", [*COLUMNS, "r_pad", "s_k"], COLUMNS,
                           {"window_start": pa.timestamp("ms")})
    assert table.schema == pairs.schema(COLUMNS)
    assert table["window_start"].to_pylist() == [1796119210000, 1796119220000]
    assert pairs.read_csv(tmp_path / "none", COLUMNS, COLUMNS).num_rows == 0


def test_spark_window_struct_gives_each_results_window_start() -> None:
    start = pa.array([1796119210000, 1796119220000], pa.timestamp("ms", "UTC")).cast(pa.timestamp("us", "UTC"))
    window = pa.StructArray.from_arrays([start, start], names=["start", "end"])
    batch = pa.table({"r_partition": pa.array([1, 2], pa.int32()), "r_offset": [7, 8], "r_released_ms": [0, 0],
                      "r_step": pa.array([0, 0], pa.int32()), "r_window": window,
                      "s_partition": pa.array([3, 3], pa.int32()), "s_offset": [9, 9], "s_released_ms": [0, 0],
                      "s_step": pa.array([0, 0], pa.int32())})
    sink = window_peers.PairSink(["r", "s"], columns=COLUMNS)
    sink.take(batch, held_ms=0.0)
    sink.take(batch.slice(0, 0), held_ms=0.0)
    assert sink.results == 2
    assert sink.table().to_pylist() == _table([(1, 7, 3, 9, 1796119210000), (2, 8, 3, 9, 1796119220000)]).to_pylist()


def test_flink_window_join_joins_on_the_key_and_both_window_edges(tmp_path: Path) -> None:
    job = _job()
    columns = [["partition", "INT"], ["offset", "BIGINT"], ["arrival_ms", "BIGINT"], ["k", "BIGINT"],
               ["ts", "BIGINT"], ["pad", "STRING"]]
    sides = {n: {"name": n, "columns": columns} for n in ("r", "s")}
    spec = window_peers.flink_spec(job, sides, tmp_path, 2)
    assert spec["size"] == "INTERVAL '10.000' SECOND(2, 3)"
    assert spec["on"] == ("r.`k` = s.`k` AND r.window_start = s.window_start AND r.window_end = s.window_end")
    names = [c for c, _ in spec["sink_columns"]]
    assert tuple(names[:5]) == window_peers.pair_columns(job) == COLUMNS
    assert spec["select"].split(", ")[:5] == ["r.`partition`", "r.`offset`", "s.`partition`", "s.`offset`",
                                             "r.window_start"]
    assert len(spec["select"].split(", ")) == len(names) == 4 + 1 + 2 * 4  # refs, window, the rest


def test_csv_files_in_event_time_order_hold_no_row_behind_their_watermark(tmp_path: Path) -> None:
    """Records of one tick reach Kafka partition by partition: merged by arrival, a file holding
    two partitions would put a row after a newer one by more than the lateness."""
    rng = np.random.default_rng(3)
    n = 2000
    part = rng.integers(0, 4, n)
    ts = np.sort(rng.integers(0, 60_000, n)) + np.where(part == 0, 3000, 0)  # partition 0 runs 3 s ahead
    table = pa.table({"partition": pa.array(part, pa.int32()), "offset": np.arange(n), "ts": ts})
    assert pyflink_peer.behind_file_watermark(table, "ts", 1000, 2) > 0
    ordered = pyflink_peer.in_event_time_order(table, "ts")
    assert pyflink_peer.behind_file_watermark(ordered, "ts", 1000, 2) == 0
    assert sorted(ordered["offset"].to_pylist()) == list(range(n))
    for p in range(4):  # each partition still in offset order
        offsets = ordered.filter(pa.array(ordered["partition"].to_numpy() == p))["offset"].to_numpy()
        assert (np.diff(offsets) > 0).all()
    pyflink_peer._write_csv(ordered, tmp_path / "in", 2)
    assert sum(pacsv.read_csv(f, read_options=pacsv.ReadOptions(autogenerate_column_names=True)).num_rows
               for f in (tmp_path / "in").iterdir()) == n
