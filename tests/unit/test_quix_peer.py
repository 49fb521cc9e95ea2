"""The Quix Streams peer's harness, without a broker or its venv: which
python it runs, the job spec, join_interval's bounds for our window rule,
the rule's pair set, the exactness comparison, the explanation of what Quix
misses, and the job script's stop at the drained input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from streamjoin.bench import equijoin
from streamjoin.bench.inputs import ARRIVAL
from streamjoin.bench.peers import quix_peer
from streamjoin.services.io.kafka import Cluster
from streamjoin.settings import JobSettings, WindowSpec


def windows(r_ms: int, s_ms: int) -> JobSettings:
    """The quick equijoin job with r's window `r_ms` and s's `s_ms`."""
    job = equijoin.base_job(equijoin.QUICK)
    streams = [spec.model_copy(update={"window": WindowSpec(range_ms=ms)}) for spec, ms in zip(job.streams,
                                                                                             (r_ms, s_ms))]
    return job.model_copy(update={"streams": streams})


def stream(keys: list[int], ts: list[int], arrival: list[int] | None = None, partition: int = 0) -> pa.Table:
    """An exported stream: one partition, offsets 0.., the given keys, event times and arrivals."""
    n = len(keys)
    return pa.table({"partition": pa.array([partition] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
                     ARRIVAL: pa.array(arrival if arrival is not None else ts, pa.int64()),
                     "k": pa.array(keys, pa.int64()), "ts": pa.array(ts, pa.int64()),
                     "pad": pa.array(["x"] * n)})


def pairs(rows: list[tuple[int, int, int, int]]) -> pa.Table:
    return pa.table({c: pa.array([r[i] for r in rows], pa.int64()) for i, c in enumerate(quix_peer.PAIR)})


def as_set(table: pa.Table) -> set[tuple[int, ...]]:
    return set(zip(*(table.column(c).to_pylist() for c in quix_peer.PAIR)))


def test_python_is_the_named_one_else_the_repository_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(quix_peer.PYTHON_ENV, "/opt/quix/bin/python")
    assert quix_peer.quix_python() == "/opt/quix/bin/python"
    monkeypatch.delenv(quix_peer.PYTHON_ENV)
    venv = tmp_path / "python"
    monkeypatch.setattr(quix_peer, "DEFAULT_PYTHON", venv)
    assert quix_peer.quix_python() is None
    venv.touch()
    assert quix_peer.quix_python() == str(venv)


def test_without_a_venv_the_peer_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(quix_peer.PYTHON_ENV, raising=False)
    monkeypatch.setattr(quix_peer, "DEFAULT_PYTHON", tmp_path / "absent")
    out = quix_peer.run_quix(windows(10_000, 10_000), {}, Cluster("localhost:1"), tmp_path, 0)
    assert out["ran"] is False and quix_peer.PYTHON_ENV in out["why"]


def test_only_two_range_streams_r_and_s_are_joined() -> None:
    job = windows(10_000, 10_000)
    assert quix_peer.unsupported(job) is None
    rows = job.model_copy(update={"streams": [job.streams[0].model_copy(update={"window": WindowSpec(rows=5)}),
                                              job.streams[1]]})
    assert "RANGE" in (quix_peer.unsupported(rows) or "")
    renamed = job.model_copy(update={"streams": [job.streams[0].model_copy(update={"name": "a"}), job.streams[1]]})
    assert "r and s" in (quix_peer.unsupported(renamed) or "")


def test_interval_bounds_are_the_strict_window_rule_in_milliseconds() -> None:
    # r (left) looks back W_s - 1 for s, s looks back W_r - 1 for r; grace adds the allowed lateness.
    job = windows(4_000, 7_000)
    assert quix_peer.interval(job) == {"backward_ms": 6_999, "forward_ms": 3_999,
                                       "grace_ms": 7_000 + job.join.allowed_lateness_ms}


def test_job_spec_reads_the_job_topics_under_a_fresh_group_into_a_fresh_topic(tmp_path: Path) -> None:
    job = windows(10_000, 10_000)
    a, b = (quix_peer.job_spec(job, Cluster("broker:9092"), 123, tmp_path) for _ in range(2))
    assert a["bootstrap"] == "broker:9092" and a["inputs"] == 123 and a["partitions"] == job.partitions
    assert a["streams"] == [{"name": s.name, "topic": job.topic_of(s), "time_field": s.time_field}
                            for s in job.streams]
    assert a["interval"] == quix_peer.interval(job)
    assert a["group"] != b["group"] and a["output"] != b["output"] and a["state_dir"] != b["state_dir"]
    assert a["output"] not in job.input_topics and a["output"] != job.results_topic
    assert Path(a["state_dir"]).parent == tmp_path


def test_rule_pairs_keep_equal_keys_inside_each_window() -> None:
    # W_r = 5: an s up to 4 ms after an r joins it; W_s = 3: an r up to 2 ms after an s joins it.
    job = windows(5, 3)
    r = stream([1, 1, 2], [100, 200, 100])
    s = stream([1, 1, 1, 1, 1, 2], [104, 105, 98, 97, 200, 300])
    got = as_set(quix_peer.rule_pairs(job, {"r": r, "s": s}))
    assert got == {(0, 0, 0, 0), (0, 0, 0, 2), (0, 1, 0, 4)}


def test_compare_counts_missing_extra_and_duplicates() -> None:
    expected = pairs([(0, 0, 0, 0), (0, 1, 0, 1), (1, 2, 1, 3)])
    got = pairs([(0, 0, 0, 0), (0, 0, 0, 0), (0, 1, 0, 1), (0, 9, 0, 9)])
    counts, missing = quix_peer.compare(expected, got)
    assert counts == {"results": 4, "missing": 1, "extra": 1, "duplicates": 1}
    assert as_set(missing) == {(1, 2, 1, 3)}
    assert counts["results"] == expected.num_rows - counts["missing"] + counts["extra"] + counts["duplicates"]
    assert quix_peer.compare(expected, expected)[0] == {"results": 3, "missing": 0, "extra": 0, "duplicates": 0}


def quix_lookups(job: JobSettings, tables: dict[str, pa.Table]) -> set[tuple[int, ...]]:
    """join_interval as quixstreams 3.28 runs it (dataframe/joins/join_interval.py), one partition
    per stream: the streams merged by Kafka timestamp (its buffered consumer pops the partition whose
    next record is oldest), each record stored, then matched against the other side's stored
    records with the same key and an event time in [t - bound, t]."""
    bounds = quix_peer.interval(job)
    events = sorted([(a, side, o, k, t) for side in ("r", "s") for a, o, k, t in
                     zip(*(tables[side].column(c).to_pylist() for c in (ARRIVAL, "offset", "k", "ts")))])
    stored: dict[str, list[tuple[int, int, int]]] = {"r": [], "s": []}
    out = set()
    for _, side, offset, key, t in events:
        stored[side].append((offset, key, t))
        other, bound = ("s", bounds["backward_ms"]) if side == "r" else ("r", bounds["forward_ms"])
        for o, k, u in stored[other]:
            if k == key and t - bound <= u <= t:
                out.add((0, offset, 0, o) if side == "r" else (0, o, 0, offset))
    return out


def test_quix_lookups_are_the_rule_in_event_time_order_and_miss_only_newer_first_pairs() -> None:
    rng = np.random.default_rng(7)
    job = windows(50, 30)
    n = 300
    keys = [rng.integers(0, 4, n).tolist() for _ in range(2)]
    ts = [np.sort(rng.integers(0, 1_000, n)).tolist() for _ in range(2)]
    # Arrivals (Kafka timestamps, rising with the offset as a producer's do): event time plus a jitter
    # up to 40 ms, so the two streams interleave out of event-time order.
    arrivals = [np.sort(np.array(t) + rng.integers(0, 40, n)).tolist() for t in ts]
    in_order = {"r": stream(keys[0], ts[0]), "s": stream(keys[1], ts[1])}
    rule = quix_peer.rule_pairs(job, in_order)
    assert quix_lookups(job, in_order) == as_set(rule) and rule.num_rows > 0

    jittered = {"r": stream(keys[0], ts[0], arrivals[0]), "s": stream(keys[1], ts[1], arrivals[1])}
    found = quix_lookups(job, jittered)
    counts, missing = quix_peer.compare(rule, pairs(sorted(found)))
    assert counts["extra"] == counts["duplicates"] == 0 and counts["missing"] > 0
    assert quix_peer.newer_arrived_first(job, jittered, missing) == counts["missing"]
    assert quix_peer.newer_arrived_first(job, jittered, rule) >= counts["missing"]


def test_job_stops_the_application_at_the_last_input_record() -> None:
    spec = importlib.util.spec_from_file_location("quix_job", Path(quix_peer.__file__).with_name("quix_job.py"))
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)  # stdlib only at import: it runs in Quix's venv, not ours
    stops: list[int] = []
    drain = job.Drain(3, lambda: stops.append(drain.processed))
    for _ in range(3):
        drain.tick()
    assert stops == [3] and drain.first is not None
    assert job.event_time("ts")({"ts": 42}, None, 7, 0) == 42
