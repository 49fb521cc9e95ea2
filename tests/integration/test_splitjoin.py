"""SplitJoin mode through the real parts (seed 001): cores and the merger as
processes on a fresh embedded broker, a band join checked exactly against the
plain-Python theta reference and Spark `verify`, and in input order on the
results topic, through a core's SIGKILL and k going 3 -> 2 -> 4."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from streamjoin.launcher import Fleet
from streamjoin.services import broker as embedded
from tests.integration.kafka_harness import assert_spark_verified
from tests.integration.ring_harness import band_rows, check_ring, produce_rows
from tests.integration.splitjoin_harness import band_job, result_order, splitjoin_cli, splitjoin_fleet, wait_released

pytestmark = pytest.mark.integration

T0, SPAN_MS, WINDOW_MS = 1_000, 30_000, 5_000


def wait_exited(fleet: Fleet, name: str, timeout: float = 120.0) -> None:
    """Until `name` has exited on its own with 0 (a core that scaled away retires)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.assert_running()
        if name not in fleet.procs:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{name} did not retire within {timeout}s: {fleet.complaints()}")


def metric(fleet: Fleet, name: str, series: str) -> float:
    """`series` (a metric name with its labels, as /metrics prints it) on service `name`; 0 when absent."""
    text = requests.get(f"http://127.0.0.1:{fleet.metrics_ports[name]}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(series + " "))


def wait_metric(fleet: Fleet, name: str, series: str, at_least: float, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.assert_running()
        try:
            if metric(fleet, name, series) >= at_least:
                return
        except requests.RequestException:
            pass  # not serving yet
        time.sleep(0.5)
    raise TimeoutError(f"{name} {series} did not reach {at_least} in {timeout}s: {fleet.complaints()}")


@pytest.mark.spark
def test_three_cores_exact_and_ordered_through_a_crash_and_scaling(broker: embedded.EmbeddedBroker,
                                                                   tmp_path: Path) -> None:
    job = band_job(broker.bootstrap, tmp_path, WINDOW_MS, (500, 2000), cores=3, max_cores=4)
    rows = band_rows(job, 1500, seed=12, t0=T0, span_ms=SPAN_MS)
    fleet = splitjoin_fleet(job, broker.bootstrap, tmp_path, cores=3)
    try:
        produce_rows(job, broker.bootstrap, rows[:400])
        wait_metric(fleet, "core-1", "streamjoin_splitjoin_core_through", 1)  # it has checkpointed
        produce_rows(job, broker.bootstrap, rows[400:500])
        fleet.kill("core-1")  # SIGKILL while it takes the new rows
        fleet.start_core(1)
        wait_metric(fleet, "core-1", 'streamjoin_splitjoin_core_restores_total{source="own"}', 1)
        splitjoin_cli(fleet, "scale", "--cores", "2")  # 3 -> 2: core-2 probes on until its window expires
        produce_rows(job, broker.bootstrap, rows[500:1000])
        wait_exited(fleet, "core-2")
        splitjoin_cli(fleet, "scale", "--cores", "4")  # 2 -> 4: core-2 again, core-3 from core 0's snapshot
        fleet.start_core(2)
        fleet.start_core(3)
        produce_rows(job, broker.bootstrap, rows[1000:])
        end = T0 + SPAN_MS + WINDOW_MS
        splitjoin_cli(fleet, "tick", "--ts", str(end + job.join.allowed_lateness_ms))
        wait_released(job, fleet, end)
        order = result_order(job, broker.bootstrap)
        result = check_ring(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    assert result.expected > 1000 and result.exact, result
    assert order == sorted(order) and len(set(order)) == len(order), "results left the merger out of input order"
    assert_spark_verified(job, broker.bootstrap, result.expected)
