"""Tumbling and hopping window joins as real processes on the embedded broker, checked by Spark
`verify` (its window oracle: Spark SQL's own joins of the inputs exploded per instance).

A hopping full join through a worker SIGKILLed mid-run and restarted (its state, copies of
tuples per instance and their matched marks, read back from disk; the batch the kill cut
short replayed): a mark lost would let a row matched in an instance out null-padded in it
(an extra result), a mark kept per tuple instead of per instance would hold back a row alone
in another instance (a missing one). On the same inputs, a tumbling inner join.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.settings import JobSettings
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import read_all
from tests.integration.test_outer_join import TIMEOUTS, alone, restart_w0, verified, write_live

pytestmark = [pytest.mark.spark, pytest.mark.integration]

HOPPING = {"hopping_ms": 1000, "slide_ms": 500}


def windows_of(job: JobSettings, bootstrap: str) -> list[tuple[int, int, int]]:
    """(window_start, window_end, event_time) of every result record."""
    docs = [json.loads(m.value()) for m in read_all(bootstrap, job.results_topic, job.partitions, f"w-{job.job}")]
    return [(d["window_start"], d["window_end"], d["event_time"]) for d in docs]


def tumbling_twin(job: JobSettings, tmp_path: Path) -> JobSettings:
    """`job` as an inner join of tumbling windows on the same input topics (its own results,
    state and consumer group)."""
    return job.model_copy(update={
        "job": "tumbling",
        "streams": [s.model_copy(update={"topic": job.topic_of(s), "window": s.window.model_copy(  # type: ignore[union-attr]
            update={"hopping_ms": None, "slide_ms": None, "tumbling_ms": 700})}) for s in job.streams],
        "join": job.join.model_copy(update={"type": "inner"}),
        "worker": job.worker.model_copy(update={"state_dir": tmp_path / "tumbling-state"}),
        "coordinator": job.coordinator.model_copy(update={"expected_workers": 1}),
    })


def test_a_hopping_full_join_through_a_worker_crash_and_a_tumbling_inner_join_are_exact(
        broker, fleet_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two workers on 12 groups of a hopping (1000 ms by 500 ms) full join under a steady input,
    w0 SIGKILLed 2 s in and restarted (its recoveries counter moves); one worker runs a tumbling
    (700 ms) inner join of the same input. Spark verify finds both outputs exact: results
    in two instances per pair, rows alone in an instance null-padded once for it."""
    job = make_job(broker.bootstrap, tmp_path, [HOPPING] * 2, workers=2, partitions=12,
                   join={"type": "full", "allowed_lateness_ms": 300}, coordinator=TIMEOUTS)
    twin = tumbling_twin(job, tmp_path)
    fleet = fleet_for(job, 2)
    twin_fleet = fleet_for(twin, 1)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_live, job, broker.bootstrap, "rs", 5, 400, 47)
        time.sleep(2)
        restart_w0(job, broker.bootstrap, fleet)
        writing.result()
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    wait_drained(twin, broker.bootstrap, twin_fleet, timeout=60)
    fleet.stop_all()  # the outputs are complete: Spark gets both cores
    twin_fleet.stop_all()

    report = verified(job, broker.bootstrap)
    padded = alone(job, broker.bootstrap)
    assert report["results"] > 500 and report["bad_ids"] == 0
    assert report["unmatched"] > 0 and padded["r"] and padded["s"]
    windows = windows_of(job, broker.bootstrap)
    assert all(end - start == 1000 and start % 500 == 0 and start <= t < end for start, end, t in windows)
    twin_report = verified(twin, broker.bootstrap)
    assert twin_report["results"] > 0 and twin_report["bad_ids"] == 0 and twin_report["unmatched"] == 0
