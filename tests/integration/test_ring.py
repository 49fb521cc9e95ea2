"""PSP ring mode through the real parts: ring workers as processes on a fresh
embedded broker, hops as one-partition Kafka topics, checked exactly against
the plain-Python theta reference join. (A ring growing and shrinking live under
a fault schedule, checked by the reference and Spark `verify`: test_nemesis.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.launcher import Fleet, wait_layout, wait_ring_quiet, write_job
from streamjoin.settings import JobSettings, load
from tests.integration.ring_harness import band_rows, check_ring, produce_rows
from streamjoin.topology import topics

pytestmark = pytest.mark.integration


def ring_fleet(job: JobSettings, bootstrap: str, tmp_path: Path, workers: list[str]) -> Fleet:
    topics.ensure(kafka.Cluster(bootstrap).admin(), job)
    fleet = Fleet(job, write_job(job, tmp_path / "job.yaml"), bootstrap, tmp_path / "logs")
    fleet.restart_workers = False
    fleet.start_coordinator()
    for w in workers:
        fleet.start_worker(w)
    return fleet


def band3(bootstrap: str, tmp_path: Path, **over: object) -> JobSettings:
    settings: dict[str, object] = {"worker": {"state_dir": str(tmp_path / "state"), "heartbeat_ms": 500},
                                   "coordinator": {"expected_workers": 3, "heartbeat_timeout_ms": 5000}}
    return load(Path("streamjoin/jobs/band3.yaml"), bootstrap=bootstrap, **(settings | over))


def test_failing_udf_dead_letters_its_records_and_the_ring_goes_on(broker: embedded.EmbeddedBroker,
                                                                  tmp_path: Path) -> None:
    job = band3(broker.bootstrap, tmp_path, join={
        "mode": "ring", "allowed_lateness_ms": 200,
        "udfs": {"close": "tests.integration.udfs_for_tests:close_unless_poison"},
        "predicate": [{"left": "r.x", "right": "s.a", "udf": "close", "args": {"within": 300}},
                      {"left": "s.a", "right": "t.e", "within": 300}]},
        ring={"nodes": 2}, coordinator={"expected_workers": 2, "heartbeat_timeout_ms": 5000})
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0", "w1"])
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1"])
        rows = band_rows(job, 900, seed=5)
        for k in (100, 400, 700):  # poison in r.x: every pair with it makes the UDF raise
            i, v = rows[k]
            rows[k] = (0, {"x": 13, "y": 5.0, "z": "p" * 20, "ts": v["ts"]})
        produce_rows(job, broker.bootstrap, rows)
        wait_ring_quiet(job, broker.bootstrap, fleet)
        fleet.assert_running()  # the ring kept running
        result = check_ring(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    assert result.dead_letter["udf-error"] >= 3, result
    assert result.expected > 100 and result.exact, result
