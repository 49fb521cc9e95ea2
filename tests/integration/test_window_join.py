"""Tumbling and hopping window joins as real processes on the embedded broker, checked by Spark
`verify` (its window oracle: Spark SQL's own joins of the inputs exploded per instance).

A hopping full join through a worker SIGKILLed mid-run and restarted (its state, copies of
tuples per instance and their matched marks, read back from disk; the batch the kill cut
short replayed): a mark lost would let a row matched in an instance out null-padded in it
(an extra result), a mark kept per tuple instead of per instance would hold back a row alone
in another instance (a missing one). Tumbling windows and the other join types are checked
through the worker's batch function and Spark verify's pieces in
tests/unit/test_spark_window_verify.py (a second fleet and verify here would double the
test's time).
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
from tests.integration.test_outer_join import alone, restart_w0, verified, write_live

pytestmark = [pytest.mark.spark, pytest.mark.integration]

HOPPING = {"hopping_ms": 1000, "slide_ms": 500}
# The killed worker is restarted, not failed over: a loaded 2-core machine can take 10 s to start
# a process, so the coordinator waits longer than that before it calls a silent worker dead.
TIMEOUTS = {"heartbeat_timeout_ms": 4000, "worker_timeout_ms": 30000}


def windows_of(job: JobSettings, bootstrap: str) -> list[tuple[int, int, int]]:
    """(window_start, window_end, event_time) of every result record."""
    docs = [json.loads(m.value()) for m in read_all(bootstrap, job.results_topic, job.partitions, f"w-{job.job}")]
    return [(d["window_start"], d["window_end"], d["event_time"]) for d in docs]


def test_a_hopping_full_join_through_a_worker_crash_is_exact(broker, fleet_for,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    """Two workers on 12 groups of a hopping (1000 ms by 500 ms) full join under a steady input,
    w0 SIGKILLed 1.5 s in and restarted (its recoveries counter moves). Spark verify finds the
    output exact: results in two instances per pair, rows alone in an instance null-padded
    once for it, every record's window an instance holding its event time."""
    job = make_job(broker.bootstrap, tmp_path, [HOPPING] * 2, workers=2, partitions=12,
                   join={"type": "full", "allowed_lateness_ms": 300}, coordinator=TIMEOUTS)
    fleet = fleet_for(job, 2)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_live, job, broker.bootstrap, "rs", 4, 300, 47)
        time.sleep(1.5)
        restart_w0(job, broker.bootstrap, fleet)
        writing.result()
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    fleet.stop_all()  # the output is complete: Spark gets both cores

    report = verified(job, broker.bootstrap)
    padded = alone(job, broker.bootstrap)
    assert report["results"] > 300 and report["bad_ids"] == 0
    assert report["unmatched"] > 0 and padded["r"] and padded["s"]
    windows = windows_of(job, broker.bootstrap)
    assert all(end - start == 1000 and start % 500 == 0 and start <= t < end for start, end, t in windows)
