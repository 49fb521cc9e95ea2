"""The job's `kafka:` settings reach every Kafka client the CLI, the services and
Spark create, and a secret given by environment shows up nowhere.

One run serves both tests: an embedded broker that clients reach only through a
sniffing proxy (it advertises the proxy's port), a job file whose `kafka:` section
sets `client.id`, and STREAMJOIN_KAFKA__SASL_PASSWORD in the environment (with
PLAINTEXT librdkafka ignores it). Real processes: `topics create`, a coordinator
and a worker (streamjoin.launcher.Fleet), `status` as a table and as JSON, and
Spark `sources` for two seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from streamjoin.launcher import Fleet, write_job
from streamjoin.services import broker as embedded
from streamjoin.settings import load
from tests.integration.conftest import stream
from tests.integration.tcp_proxy import Request, SniffingProxy

pytestmark = pytest.mark.integration

CLIENT_ID = "sj-clientconf-it"
SECRET = "never-shown-7f3a9c"
# Kafka API keys: each client kind must have been seen, or "every client" proves nothing.
PRODUCE, FETCH, CREATE_TOPICS = 0, 1, 19


@dataclass
class Run:
    """What the run left behind to inspect."""

    requests: list[Request]
    outputs: dict[str, subprocess.CompletedProcess]  # by command
    log_files: list[Path]
    launcher_job_file: Path


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `streamjoin <args>` as its own process, checking that it succeeded."""
    proc = subprocess.run([sys.executable, "-m", "streamjoin.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())
    assert proc.returncode == 0, f"streamjoin {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _user_job_file(tmp: Path) -> Path:
    """A job file as a user writes it: client settings in `kafka:`, no secret."""
    data = {"job": "clientconf", "partitions": 4,
            "streams": [stream("r", {"range_ms": 1000}), stream("s", {"range_ms": 1000})],
            "worker": {"state_dir": str(tmp / "state"), "batch_ms": 100, "heartbeat_ms": 500},
            "coordinator": {"expected_workers": 1, "heartbeat_timeout_ms": 5000},
            "kafka": {"client.id": CLIENT_ID, "security.protocol": "plaintext"}}
    path = tmp / "user-job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _drive(tmp: Path, bootstrap: str, fleets: list[Fleet]) -> dict[str, subprocess.CompletedProcess]:
    """Every kind of process that makes Kafka clients, one after the other, through the proxy;
    the fleet started is appended to `fleets` (for the caller to stop)."""
    user_job = _user_job_file(tmp)
    common = ["--job", str(user_job), "--bootstrap", bootstrap]
    outputs = {"topics create": _cli("topics", "create", *common)}
    job = load(user_job, bootstrap=bootstrap)
    fleet = Fleet(job, write_job(job, tmp / "launcher" / "job.yaml"), bootstrap, tmp / "logs")
    fleets.append(fleet)
    fleet.start_coordinator()
    fleet.start_worker("w0")
    fleet.wait_assigned(["w0"], timeout=90)
    outputs["status"] = _cli("status", *common)
    outputs["status --json"] = _cli("status", "--json", *common)
    outputs["sources"] = _cli("sources", *common, "--seconds", "2", "--rate", "20", timeout=240)
    return outputs


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("clientconf")
    front = embedded.free_port()
    broker = embedded.start(log_path=tmp / "broker.log", advertised_port=front)
    proxy = SniffingProxy(front, broker.listen_port)
    fleets: list[Fleet] = []
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
            embedded.wait_until_ready(broker.bootstrap, 30, broker.process)
            proxy.pause()  # the readiness check's default client id is not the job's: start counting afresh
            proxy.requests.clear()
            proxy.resume()
            outputs = _drive(tmp, broker.bootstrap, fleets)
    finally:
        for fleet in fleets:
            fleet.stop_all()  # before the logs are read: they are complete
        proxy.pause()
        broker.stop()
    return Run(list(proxy.requests), outputs, sorted((tmp / "logs").glob("*.log")), tmp / "launcher" / "job.yaml")


def test_kafka_settings_from_the_job_file_reach_every_client(run: Run) -> None:
    assert {r.client_id for r in run.requests} == {CLIENT_ID}
    assert {PRODUCE, FETCH, CREATE_TOPICS} <= {r.api_key for r in run.requests}
    # Spark's clients went through the proxy too (the broker advertises only it): sources wrote records.
    written = json.loads(run.outputs["sources"].stdout)["records"]
    assert sum(written.values()) > 0, written


def test_a_secret_from_the_environment_shows_up_nowhere(run: Run) -> None:
    assert [p.name for p in run.log_files] == ["coordinator.log", "w0.log"]
    shown = {p.name: p.read_text() for p in [*run.log_files, run.launcher_job_file]} | {
        command: proc.stdout + proc.stderr for command, proc in run.outputs.items()}
    assert all(shown.values()), "nothing to search in: the check would pass vacuously"
    assert [name for name, text in shown.items() if SECRET in text] == []
    # The launcher's job file names where the secret is, so the services still get it.
    written = yaml.safe_load(run.launcher_job_file.read_text())
    assert written["kafka"]["sasl.password"] == {"env": "STREAMJOIN_KAFKA__SASL_PASSWORD"}
    assert [w["worker"] for w in json.loads(run.outputs["status --json"].stdout)["workers"]] == ["w0"]
