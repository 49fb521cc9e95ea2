"""The Pathway peer's harness, without a broker or its venv: the venv it
needs, the interval bounds for our window rule, the job spec, the judging of
Pathway's output rows (results, retractions, the last one written), its
figures, and the job script's progress and stop at the drained input."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from streamjoin.bench import equijoin, report
from streamjoin.bench.peers import pathway_peer, quix_peer
from streamjoin.services.io.kafka import Cluster
from streamjoin.settings import JobSettings, WindowSpec


def windows(r_ms: int, s_ms: int) -> JobSettings:
    """The quick equijoin job with r's window `r_ms` and s's `s_ms`."""
    job = equijoin.base_job(equijoin.QUICK)
    streams = [spec.model_copy(update={"window": WindowSpec(range_ms=ms)})
               for spec, ms in zip(job.streams, (r_ms, s_ms))]
    return job.model_copy(update={"streams": streams})


def pathway_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pathway_job", Path(pathway_peer.__file__).with_name("pathway_job.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib only at import: it runs in Pathway's venv, not ours
    return module


def test_without_its_venv_the_peer_says_why_it_did_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(pathway_peer.PYTHON_ENV, raising=False)
    out = pathway_peer.run_pathway(windows(10_000, 10_000), {}, Cluster("localhost:1"), tmp_path, 0)
    assert out["ran"] is False and pathway_peer.PYTHON_ENV in out["why"]
    monkeypatch.setenv(pathway_peer.PYTHON_ENV, "/opt/pathway/bin/python")
    job = windows(10_000, 10_000)
    rows = job.model_copy(update={"streams": [job.streams[0].model_copy(update={"window": WindowSpec(rows=5)}),
                                              job.streams[1]]})
    out = pathway_peer.run_pathway(rows, {}, Cluster("localhost:1"), tmp_path, 0)
    assert out["ran"] is False and "Pathway" in out["why"] and "RANGE" in out["why"]


def test_interval_bounds_are_the_strict_window_rule_in_milliseconds() -> None:
    # Pathway joins when r.t + lower <= s.t <= r.t + upper; the rule: s.t < r.t + W_r and r.t < s.t + W_s.
    job = windows(4_000, 7_000)
    bounds = pathway_peer.interval(job)
    assert bounds == {"lower": -6_999, "upper": 3_999}
    for gap in range(-7_005, 4_005):  # gap = s.t - r.t
        assert (bounds["lower"] <= gap <= bounds["upper"]) is (gap < 4_000 and -gap < 7_000)


def test_job_spec_reads_the_job_topics_under_a_fresh_group_into_a_fresh_topic() -> None:
    job = windows(10_000, 10_000)
    a, b = (pathway_peer.job_spec(job, Cluster("broker:9092"), 123, 2) for _ in range(2))
    assert a["bootstrap"] == "broker:9092" and a["inputs"] == 123 and a["threads"] == 2
    assert a["streams"] == [{"name": s.name, "topic": job.topic_of(s), "time_field": s.time_field,
                             "key_fields": list(s.key_fields), "fields": dict(s.fields)} for s in job.streams]
    assert a["interval"] == pathway_peer.interval(job) and a["autocommit_ms"] == job.worker.batch_ms
    assert a["group"] != b["group"] and a["output"] != b["output"]
    assert a["output"] not in job.input_topics and a["output"] != job.results_topic


def rows(diffs: list[int], stamps: list[int]) -> pa.Table:
    """Pathway's output rows as read back, every one naming the pair (0, 1, 2, 3): the pair columns,
    another column, diff, Pathway's time and the Kafka timestamp."""
    n = len(diffs)
    cols = {c: pa.array([i] * n, pa.int64()) for i, c in enumerate(quix_peer.PAIR)}
    return pa.table({**cols, "r_k": pa.array([7] * n), "diff": pa.array(diffs, pa.int64()), "time": pa.array([2] * n),
                     quix_peer.TIMESTAMP_MS: pa.array(stamps, pa.int64())})


def test_judged_rows_are_the_additions_with_retractions_counted_and_the_last_write() -> None:
    pairs, retracted, last = pathway_peer.judge_rows(rows([1, 1, -1, 1], [5_000, 9_500, 7_000, 8_000]))
    assert pairs.column_names == list(quix_peer.PAIR) and pairs.num_rows == 3
    assert retracted == 1 and last == 9.5
    # Three additions of one pair: one result and two duplicates, judged like any peer's.
    counts, _ = quix_peer.compare(pairs.slice(0, 1), pairs)
    assert counts == {"results": 3, "missing": 0, "extra": 0, "duplicates": 2}
    empty, none_retracted, never = pathway_peer.judge_rows(None)
    assert empty.num_rows == 0 and none_retracted == 0 and never is None


def test_figures_run_from_the_launch_to_the_last_result_and_over_the_middle_of_the_drain() -> None:
    launched = 1_000.0
    # 4 s to the first input, then 1,000 inputs/s for 10 s; the sink's last write 1 s after.
    samples = [[launched + 4 + t, 1_000 * t] for t in range(0, 11)]
    out = {"first": launched + 4, "done": launched + 14, "samples": samples}
    got = pathway_peer.figures(out, launched, launched + 15, 10_000)
    assert got["startup_seconds"] == 4 and got["results_out_seconds"] == 14 and got["wall_seconds"] == 15
    assert math.isclose(got["cold_start_tuples_per_s"], 10_000 / 15)
    assert math.isclose(got["tuples_per_s"], 1_000.0)
    assert got["tuples_per_s"] == report.sustained_rate([(0.0, 0)] + [(t - launched, n) for t, n in samples])


def test_progress_stops_once_every_input_has_its_results_out() -> None:
    job = pathway_job()
    clock = iter(float(t) for t in range(100, 200))
    stops: list[int] = []
    progress = job.Progress(10, lambda: stops.append(progress.out()), clock=lambda: next(clock))
    progress.inputs(2, 4)
    assert progress.out() == 0 and progress.samples == []  # counted, but no result closed yet
    progress.results_closed(2)
    progress.inputs(4, 10)  # every input counted at time 4 ...
    progress.results_closed(3)  # ... but the results have closed time 3 only
    assert progress.out() == 4 and stops == []
    progress.results_closed(4)
    assert stops == [10] and progress.done is not None
    progress.results_closed(6)
    assert stops == [10]  # once
    assert [n for _, n in progress.samples] == [4, 10]
    assert progress.first is not None and progress.first <= progress.samples[0][0]


def test_progress_stops_when_the_inputs_come_after_their_results_closed() -> None:
    # The two subscriptions call back in either order: the results may close a time before the
    # inputs' count at that time is reported.
    job = pathway_job()
    stops: list[bool] = []
    progress = job.Progress(3, lambda: stops.append(True))
    progress.results_closed(8)
    progress.inputs(8, 3)
    assert stops == [True] and progress.samples[-1][1] == 3


def test_job_settings_are_strings_for_pathways_connectors() -> None:
    job = pathway_job()
    settings = job._settings({"bootstrap": "b:1"}, {"session.timeout.ms": 3_000, "group.id": "g"})
    assert settings == {"bootstrap.servers": "b:1", "session.timeout.ms": "3000", "group.id": "g"}
