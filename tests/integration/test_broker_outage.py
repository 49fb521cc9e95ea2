"""The broker goes away for a while mid-run (its connections dropped, new ones
refused) and comes back: workers retry with backoff and nothing is lost."""

from __future__ import annotations

import time

import pytest

from streamjoin.launcher import wait_drained
from tests.integration.fleet_harness import proxied_fleet
from tests.integration.kafka_harness import check, produce
from tests.integration.tcp_proxy import Proxy
from tests.integration.test_hash_join import rows_out_of_order

pytestmark = pytest.mark.integration


def test_broker_away_for_a_while(tmp_path) -> None:
    with proxied_fleet(tmp_path, Proxy, workers=2, worker={"stall_timeout_ms": 15_000}) as (broker, proxy, job, fleet):
        rows = rows_out_of_order("rs", 8000, 100, seed=6)
        produce(job, broker.bootstrap, rows[:4000])
        time.sleep(0.5)
        proxy.pause()
        time.sleep(8)  # longer than a cycle, a heartbeat and librdkafka's first reconnects
        proxy.resume()
        produce(job, broker.bootstrap, rows[4000:])
        wait_drained(job, broker.bootstrap, fleet, timeout=180)
        result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 2000
