"""The broker goes away for a while mid-run (its connections dropped, new ones
refused) and comes back: workers retry with backoff and nothing is lost."""

from __future__ import annotations

import time

import pytest

from streamjoin.services import broker as embedded
from streamjoin.services import kafka
from streamjoin.launcher import Fleet, wait_drained, write_job
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import check, produce
from tests.integration.tcp_proxy import Proxy
from tests.integration.test_hash_join import rows_out_of_order
from streamjoin.topology import topics

pytestmark = pytest.mark.integration


def test_broker_away_for_a_while(tmp_path) -> None:
    front = embedded.free_port()
    b = embedded.start(log_path=tmp_path / "broker.log", advertised_port=front)
    proxy = Proxy(front, b.listen_port)
    embedded.wait_until_ready(b.bootstrap, 30, b.process)
    job = make_job(b.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=2,
                   worker={"stall_timeout_ms": 15_000})
    topics.ensure(kafka.Cluster(b.bootstrap).admin(), job)
    fleet = Fleet(job, write_job(job, tmp_path / "job.yaml"), b.bootstrap, tmp_path / "logs")
    try:
        fleet.start_coordinator()
        fleet.start_worker("w0")
        fleet.start_worker("w1")
        fleet.wait_assigned(["w0", "w1"])
        rows = rows_out_of_order("rs", 8000, 100, seed=6)
        produce(job, b.bootstrap, rows[:4000])
        time.sleep(0.5)
        proxy.pause()
        time.sleep(8)  # longer than a cycle, a heartbeat and librdkafka's first reconnects
        proxy.resume()
        produce(job, b.bootstrap, rows[4000:])
        wait_drained(job, b.bootstrap, fleet, timeout=180)
        result = check(job, b.bootstrap)
        assert result.exact, result
        assert result.expected > 2000
    finally:
        fleet.stop_all()
        proxy.pause()
        b.stop()
