"""PSP ring mode through the real parts: ring workers as processes on a fresh
embedded broker, hops as one-partition Kafka topics, checked exactly against
the plain-Python theta reference join."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamjoin.services import broker as embedded
from streamjoin.services import kafka
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


def ring_cli(job_file: Path, bootstrap: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "streamjoin.cli", "ring", *args, "--job", str(job_file),
                    "--bootstrap", bootstrap], check=True, capture_output=True, timeout=60)


def band3(bootstrap: str, tmp_path: Path, **over: object) -> JobSettings:
    settings: dict[str, object] = {"worker": {"state_dir": str(tmp_path / "state"), "heartbeat_ms": 500},
                                   "coordinator": {"expected_workers": 3, "heartbeat_timeout_ms": 5000}}
    return load(Path("streamjoin/jobs/band3.yaml"), bootstrap=bootstrap, **(settings | over))


@pytest.mark.spark
def test_three_node_band_ring_exact_through_add_and_remove(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    from streamjoin.services.spark.verify import run_verify

    job = band3(broker.bootstrap, tmp_path)
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0", "w1", "w2"])
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1", "w2"])
        fleet.start_worker("w3")  # a spare, started once the ring has formed
        rows = band_rows(job, 1500, seed=3, span_ms=30_000)
        produce_rows(job, broker.bootstrap, rows[:500])
        ring_cli(fleet.job_file, broker.bootstrap, "add", "w3")  # mid-run: tuples keep coming
        produce_rows(job, broker.bootstrap, rows[500:1000])
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1", "w2", "w3"])
        ring_cli(fleet.job_file, broker.bootstrap, "remove", "w1")
        produce_rows(job, broker.bootstrap, rows[1000:])
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w2", "w3"])
        wait_ring_quiet(job, broker.bootstrap, fleet)
        result = check_ring(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    assert result.expected > 1000, result
    assert result.exact, result
    spark = run_verify(job, kafka.Cluster(broker.bootstrap))  # the independent oracle agrees
    assert spark["verified"] and spark["results"] == result.results, spark


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
