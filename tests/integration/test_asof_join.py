"""As-of joins (join.table) as real processes on the embedded broker, checked by Spark
`verify` (Spark SQL's own range join and ranking of versions, services/spark/asof_oracle.py).

Orders are joined with the customer row valid at each order's time. The orders' producer
keys them by order id, not by the customer they look up: every order is re-routed to its
customer's group through the by-key topic (a foreign-key lookup). Customer rows change all
the time and arrive out of order within the lateness; some customers never have a row, so
the left join null-pads their orders, and customers are deleted now and then (tombstones). One worker is SIGKILLed and restarted mid-run, and a
group is moved live from one worker to the other; the output stays exact.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamjoin.launcher import Fleet, wait_drained
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.coordinator.status import snapshot
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, load
from tests.integration.fleet_harness import wait_metric
from tests.integration.kafka_harness import read_all
from tests.integration.test_outer_join import metric_sum

pytestmark = [pytest.mark.spark, pytest.mark.integration]

CUSTOMERS = range(60)
WITH_ROWS = range(50)  # customers 50..59 never have a row: their orders come out null-padded
LATENESS_MS = 500
# A SIGKILLed worker restarted with its disk is back before it counts as dead, however loaded the
# machine (a restart there can take well over 8 s): the test's crash is a restart, not a failover.
TIMEOUTS = {"heartbeat_timeout_ms": 4000, "worker_timeout_ms": 60_000}


def asof_job(bootstrap: str, tmp_path: Path) -> JobSettings:
    orders = {"name": "orders", "fields": {"ts": "int", "order": "int", "customer": "int", "amount": "float"},
              "time_field": "ts", "key_fields": ["customer"]}
    customers = {"name": "customers", "fields": {"ts": "int", "customer": "int", "tier": "int"},
                 "time_field": "ts", "key_fields": ["customer"]}
    return load(None, job="asof", bootstrap=bootstrap, partitions=12, streams=[orders, customers],
                join={"table": "customers", "type": "left", "allowed_lateness_ms": LATENESS_MS},
                worker={"state_dir": str(tmp_path / "state"), "batch_ms": 100, "heartbeat_ms": 500},
                coordinator={"expected_workers": 2} | TIMEOUTS)


def write_live(job: JobSettings, bootstrap: str, seconds: float, rate: int, seed: int) -> int:
    """Orders (keyed by order id) and customer rows (keyed by customer) for `seconds` at about
    `rate` records/s, event times the wall clock less up to 400 ms (rows) or 200 ms (orders):
    out of order, within the lateness. Returns the orders written."""
    rnd = random.Random(seed)
    producer = kafka.Cluster(bootstrap).producer()
    order = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now_ms = int(time.time() * 1000)
        for _ in range(rate // 20):
            c, ts = rnd.choice(WITH_ROWS), now_ms - rnd.randint(0, 400)
            if rnd.random() < 0.1:  # the customer is deleted: a tombstone at its record time
                producer.produce("asof.customers", key=key_bytes(c), value=None, timestamp=ts)
            else:
                row = {"ts": ts, "customer": c, "tier": rnd.randint(1, 5)}
                producer.produce("asof.customers", key=key_bytes(c), value=json.dumps(row).encode())
            doc = {"ts": now_ms - rnd.randint(0, 200), "order": order, "customer": rnd.choice(CUSTOMERS),
                   "amount": rnd.random() * 100}
            producer.produce("asof.orders", key=key_bytes(order), value=json.dumps(doc).encode())
            order += 1
        time.sleep(0.1)
    # The table's clock moves past every order written: each one is decided.
    later = int(time.time() * 1000) + 2 * LATENESS_MS
    for c in WITH_ROWS:
        producer.produce("asof.customers", key=key_bytes(c),
                         value=json.dumps({"ts": later, "customer": c, "tier": 0}).encode())
    assert producer.flush(30) == 0
    return order


def _held(job: JobSettings, bootstrap: str) -> dict[str, list[int]]:
    return {w["worker"]: w["held_groups"] for w in snapshot(job, kafka.Cluster(bootstrap))["workers"]}


def _move(fleet: Fleet, bootstrap: str, group: int, to: str) -> None:
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "move", str(group), "--to", to, "--job",
                           str(fleet.job_file), "--bootstrap", bootstrap], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr


def test_asof_left_join_by_foreign_key_is_exact_through_a_sigkill_and_a_move(broker, fleet_for,  # type: ignore[no-untyped-def]
                                                                              tmp_path: Path) -> None:
    from streamjoin.services.spark.verify import run_verify  # Spark starts only for the tests that ask

    job = asof_job(broker.bootstrap, tmp_path)
    fleet = fleet_for(job, 2)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_live, job, broker.bootstrap, 9, 400, 37)
        time.sleep(2.5)
        fleet.kill("w0", signal.SIGKILL)
        time.sleep(0.5)
        fleet.start_worker("w0")
        wait_metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total", 1, timeout=60)
        moved = _held(job, broker.bootstrap)["w0"][0]
        _move(fleet, broker.bootstrap, moved, "w1")
        assert moved in _held(job, broker.bootstrap)["w1"]
        orders = writing.result()
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    assert sum(metric_sum(fleet.metrics_ports[w], "streamjoin_asof_versions") for w in ("w0", "w1")) > 0
    fleet.stop_all()  # the output is complete: Spark gets both cores

    report = run_verify(job, kafka.Cluster(broker.bootstrap))
    wrong = {k: report[k] for k in ("missing", "extra", "duplicates", "bad_ids", "lost")}
    assert report["verified"] and report["missing"] == report["extra"] == report["duplicates"] == 0, wrong
    # Every order is joined once, or dead-lettered as late: a re-routed order can trail the
    # group's own orders by more than the lateness (its forwarder was the worker killed).
    late = report["dead_letter"]["by_reason"].get("late", 0)
    assert report["results"] == report["expected"] and report["results"] + late >= orders > report["results"] // 2
    assert set(report["dead_letter"]["by_reason"]) <= {"late"}, "every tombstone was taken as a deletion"
    # Orders of customers without a row (never, or deleted), and orders older than their customer's first row.
    assert report["unmatched"] > 0
    results = [json.loads(m.value()) for m in read_all(broker.bootstrap, job.results_topic, job.partitions, "asof-t")]
    joined = [r for r in results if r["inputs"].get("customers") is not None]
    assert joined and all(r["customers"]["customer"] == r["orders"]["customer"] for r in joined)
    assert all(r["customers"]["ts"] <= r["orders"]["ts"] for r in joined)
