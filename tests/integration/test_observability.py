"""Metrics through the real parts: a real Prometheus server (Debian's
`prometheus`) scrapes real workers and evaluates ops/prometheus/rules.yml;
/healthz answers; the partitioner agrees with librdkafka's murmur2; `status`
shows the fleet."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamjoin.services.io import kafka
from streamjoin.services.broker import free_port
from streamjoin.cli import app
from streamjoin.launcher import wait_drained, write_job
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.topology.partitioner import partition_for
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import wait_heartbeats
from tests.integration.kafka_harness import Row, produce, read_all
from tests.integration.test_hash_join import rows_out_of_order

pytestmark = pytest.mark.integration
OPS = Path(__file__).resolve().parents[2] / "ops" / "prometheus"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _query(port: int, promql: str) -> list:
    status, body = _get(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def start_prometheus(conf_dir: Path, tmp_path: Path, tries: int = 3) -> tuple[subprocess.Popen, int]:
    """Prometheus on a free port, once it answers /-/ready; its log in tmp_path. A port taken
    between choosing and binding it (another process of the suite) makes it exit: then again
    on another port, and the last log says why when every try failed."""
    for attempt in range(tries):
        port, log_path = free_port(), tmp_path / f"prometheus-{attempt}.log"
        with log_path.open("wb") as log:
            prom = subprocess.Popen(["prometheus", f"--config.file={conf_dir / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / f'tsdb-{attempt}'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while prom.poll() is None and time.monotonic() < deadline:
            try:
                if _get(f"http://127.0.0.1:{port}/-/ready")[0] == 200:
                    return prom, port
            except urllib.error.URLError:
                pass
            time.sleep(0.2)
        prom.kill()
        prom.wait(10)
    raise AssertionError(f"prometheus did not start: {log_path.read_text()[-2000:]}")


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed (ops/setup.sh)")
def test_prometheus_scrapes_workers_and_evaluates_rules(broker, fleet_for, tmp_path: Path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=2,
                   join={"allowed_lateness_ms": 100})
    fleet = fleet_for(job, 2)
    for name in ("coordinator", "w0", "w1"):
        assert _get(f"http://127.0.0.1:{fleet.metrics_ports[name]}/healthz") == (200, "running")
    conf_dir = tmp_path / "prom"
    conf_dir.mkdir()
    for f in ("prometheus.yml", "rules.yml"):
        shutil.copy(OPS / f, conf_dir / f)
    fleet.write_prometheus_targets(conf_dir / "targets.json")
    prom, port = start_prometheus(conf_dir, tmp_path)
    try:
        rows = rows_out_of_order("rs", 4000, 50, seed=7)
        produce(job, broker.bootstrap, rows)
        wait_drained(job, broker.bootstrap, fleet, timeout=120)
        produce(job, broker.bootstrap, [Row("r", 1, 0)])  # behind every watermark by now: late
        wait_drained(job, broker.bootstrap, fleet, timeout=120)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            tuples = _query(port, 'sum(streamjoin_tuples_in_total{component="worker"})')
            late = _query(port, 'sum(streamjoin_dead_letter_total{reason="late"})')
            if tuples and float(tuples[0]["value"][1]) == len(rows) and late:
                break  # both scraped since the late row was dead-lettered
            time.sleep(0.5)
        assert tuples and float(tuples[0]["value"][1]) == len(rows)
        assert late, "the late row's dead letter was never scraped"
        assert float(late[0]["value"][1]) == 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every target has had its first scrape
            up = _query(port, 'up{job="it"}')
            if len(up) == 3:
                break
            time.sleep(0.5)
        assert sorted(r["metric"]["component"] for r in up) == ["coordinator", "worker", "worker"]
        assert all(r["value"][1] == "1" for r in up)
        status, body = _get(f"http://127.0.0.1:{port}/api/v1/rules")
        assert status == 200 and json.loads(body)["data"]["groups"], "rules.yml was not loaded"
    finally:
        prom.terminate()
        prom.wait(10)


def test_keys_land_where_kafkas_partitioner_puts_them(broker, tmp_path: Path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 5}, {"range_ms": 5}], workers=1)
    from streamjoin.topology import topics

    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
    keys = list(range(500))
    produce(job, broker.bootstrap, [Row("r", k, 1) for k in keys])
    msgs = read_all(broker.bootstrap, job.topic_of(job.streams[0]), job.partitions, "pcheck")
    assert len(msgs) == len(keys)
    assert all(m.partition() == partition_for(key_bytes(json.loads(m.value())["k"]), 60) for m in msgs)


def test_status_shows_workers_groups_and_lag(broker, fleet_for, tmp_path: Path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=2)
    fleet = fleet_for(job, 2)
    # Every group is held (wait_assigned); what `status` shows is each worker's newest heartbeat,
    # so both must have beaten since: a heartbeat from before the assignment showed other groups.
    wait_heartbeats(job, broker.bootstrap, ["w0", "w1"], since_ms=int(time.time() * 1000), fleet=fleet)
    result = CliRunner().invoke(app, ["status", "--json", "--job", str(write_job(job, tmp_path / "j.yaml"))])
    assert result.exit_code == 0, result.output
    snap = json.loads(result.output)
    rows = {w["worker"]: w for w in snap["workers"]}
    assert set(rows) == {"w0", "w1"} and snap["groups_placed"] == 60
    assert all(r["alive"] and len(r["held_groups"]) == 30 and r["lag"] == 0 for r in rows.values())
