"""Stopping services the way Kubernetes does, with SIGTERM, as real processes: they
exit 0 within a grace period (services/shutdown.py), a broker that is gone does not
hold them, and `streamjoin broker` takes its Tansu child with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamjoin.launcher import Fleet, wait_drained
from streamjoin.schemas import control
from streamjoin.services.io import kafka
from streamjoin.services.shutdown import GRACE_S
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import metric, proxied_fleet, wait_metric, wait_until
from tests.integration.kafka_harness import check, produce
from tests.integration.tcp_proxy import FETCH, DelayingProxy, Proxy
from tests.integration.test_hash_join import _produce_steadily, rows_out_of_order

pytestmark = pytest.mark.integration

PROMPT_S = 10.0  # a stop that waits on nothing but the loop's next look at its flag


def _terminate(fleet: Fleet, name: str, sig: int = signal.SIGTERM) -> tuple[int, float]:
    """Send `sig` to a service of `fleet`; returns its exit code and how long it took to exit."""
    proc = fleet.procs.pop(name)
    began = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(GRACE_S + 30)
    return code, time.monotonic() - began


def test_sigterm_then_sigkills_mid_run_and_every_restart_stays_exact(broker, fleet_for, tmp_path: Path) -> None:
    """Two workers under a steady input. w0 is stopped mid-run with SIGTERM (exit 0, promptly,
    logged) and restarted, then SIGKILLed twice at different points of its cycle and restarted
    each time: every restart recovers its groups (the recoveries counter of the new process)
    before it joins, and the output is exact. The coordinator exits 0 on SIGTERM at the end."""
    # 12 groups, 6 a worker, are plenty for the stop paths; every group costs each cycle and each recovery.
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=2, partitions=12)
    fleet = fleet_for(job, 2)
    writer = _produce_steadily(job, broker.bootstrap, rows_out_of_order("rs", 24_000, 100, seed=21), seconds=10)
    # Mid-run: w0 is joining the input (a batch of it done; the writer goes on for seconds).
    wait_metric(fleet.metrics_ports["w0"], "streamjoin_batch_seconds_count", 1, timeout=60)
    code, took = _terminate(fleet, "w0")
    assert code == 0 and took < PROMPT_S, (code, took)
    assert "worker stopped" in (tmp_path / "logs" / "w0.log").read_text()
    fleet.start_worker("w0")
    wait_metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total", 1, timeout=60)
    for _ in range(2):  # SIGKILL twice, at different points of the cycle
        time.sleep(2.5)
        fleet.kill("w0", signal.SIGKILL)
        time.sleep(0.5)
        fleet.start_worker("w0")
        # Each restart recovers its groups (replaying a batch or not, as the kill fell) before it joins.
        wait_metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total", 1, timeout=60)
    writer.join()
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 5000
    code, took = _terminate(fleet, "coordinator")
    assert code == 0 and took < PROMPT_S, (code, took)


def test_sigterm_while_the_broker_is_unreachable(tmp_path: Path) -> None:
    """A running worker, a worker still waiting for its first broker answer, and the
    coordinator all exit 0 on SIGTERM while every connection to the broker is refused."""
    with proxied_fleet(tmp_path, Proxy, partitions=4, restart_workers=False) as (broker, proxy, job, fleet):
        produce(job, broker.bootstrap, rows_out_of_order("rs", 2000, 50, seed=22))
        wait_drained(job, broker.bootstrap, fleet, timeout=120)

        proxy.pause()
        refused = {name: _refused(fleet, name) for name in ("w0", "coordinator")}
        fleet.start_worker("w1")  # never reaches the broker
        # Long enough for librdkafka to notice and the worker to retry: w0's and the coordinator's
        # clients have had a reconnect refused, and w1 missed the broker and is retrying.
        wait_until("the services noticed the broker gone",
                   lambda: all(_refused(fleet, name) > n for name, n in refused.items())
                   and "broker not reachable; retrying" in (fleet.log_dir / "w1.log").read_text(), timeout=60)
        code, took = _terminate(fleet, "w0")
        assert code == 0 and took < GRACE_S + 5, (code, took)
        code, took = _terminate(fleet, "w1")
        assert code == 0 and took < PROMPT_S, (code, took)
        code, took = _terminate(fleet, "coordinator")
        assert code == 0 and took < GRACE_S + 5, (code, took)


def test_sigterm_while_recovery_waits_on_the_broker(tmp_path: Path) -> None:
    """A worker whose recovery's reads get no answer (every Fetch on a new connection held
    for minutes: recovery opens new consumers, the worker's own clients keep theirs) exits
    0 promptly on SIGTERM, out of the recovery retry loop."""
    with proxied_fleet(tmp_path, DelayingProxy, partitions=4, restart_workers=False) as (b, proxy, job, fleet):
        produce(job, b.bootstrap, rows_out_of_order("rs", 2000, 50, seed=23))
        wait_drained(job, b.bootstrap, fleet, timeout=120)
        code, took = _terminate(fleet, "coordinator")  # from here on, the test assigns the groups itself
        assert code == 0 and took < PROMPT_S, (code, took)

        fleet.kill("w0", signal.SIGTERM)
        fleet.start_worker("w0")
        log = tmp_path / "logs" / "w0.log"
        _wait_for_line(log, "worker started", after=log.read_text().count("worker started"))
        # Its control consumer has its connection and is fetching: a Fetch passed the proxy since
        # (nothing else fetches now: the coordinator is stopped and w0 holds no group yet).
        fetches = _fetches(proxy)
        wait_until("w0's control consumer fetching", lambda: _fetches(proxy) > fetches, timeout=30)
        proxy.delay_new_connections(300)
        _assign(job, b.bootstrap, "w0", list(range(job.partitions)))
        deadline = time.monotonic() + 30
        while proxy.held == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proxy.held > 0, "recovery never read"
        # Recovery's read is the one held (for 300 s, on a connection it opened after the delay
        # began): it cannot finish, and the worker is inside it, not past it.
        assert metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total") == 0  # still recovering
        assert "assignment applied" not in log.read_text().rpartition("worker started")[2]
        code, took = _terminate(fleet, "w0")
        assert code == 0 and took < PROMPT_S, (code, took)
        assert "stopped while waiting on the broker" in log.read_text()


def _wait_for_line(path: Path, text: str, after: int, timeout: float = 60) -> None:
    """Until `path` holds more than `after` lines with `text`."""
    deadline = time.monotonic() + timeout
    while path.read_text().count(text) <= after:
        assert time.monotonic() < deadline, f"no new {text!r} in {path} within {timeout}s"
        time.sleep(0.2)


def _refused(fleet: Fleet, name: str) -> int:
    """Connections to the broker refused so far, as the librdkafka clients of service `name` log them."""
    return (fleet.log_dir / f"{name}.log").read_text().count("Connection refused")


def _fetches(proxy: DelayingProxy) -> int:
    """Fetch requests that clients have sent through `proxy` so far."""
    return sum(r.api_key == FETCH for r in list(proxy.requests))


def _assign(job, bootstrap: str, worker: str, groups: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Tell `worker` its groups on the control topic, as the coordinator would."""
    producer = kafka.Cluster(bootstrap).producer()
    message = control.Assignment(worker=worker, groups=groups, epoch=1)
    producer.produce(job.control_topic, value=control.encode(message), key=b"assignment", partition=0)
    assert producer.flush(30) == 0


def _child_pids(pid: int) -> list[int]:
    """The children of `pid` (Linux: /proc/<pid>/task/<tid>/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped has already ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.parametrize("sig, expected_code", [(signal.SIGTERM, 0), (signal.SIGINT, 0), (signal.SIGKILL, -9)])
def test_broker_command_takes_its_tansu_child_with_it(sig: int, expected_code: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    cli = subprocess.Popen([sys.executable, "-m", "streamjoin.cli", "broker"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, env=env)
    tansu: list[int] = []
    try:
        assert cli.stdout is not None and cli.stdout.readline().startswith("127.0.0.1:")  # ready
        tansu += _child_pids(cli.pid)
        assert len(tansu) == 1 and _alive(tansu[0])
        cli.send_signal(sig)
        assert cli.wait(20) == expected_code
        deadline = time.monotonic() + 10
        while _alive(tansu[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(tansu[0]), f"tansu (pid {tansu[0]}) outlived `streamjoin broker` stopped by {sig!r}"
    finally:  # nothing of this test's left running, whatever failed
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for pid in filter(_alive, tansu):
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_bench_takes_its_broker_and_services_with_it(tmp_path: Path) -> None:
    """SIGTERM while `bench` runs its first fleet: it exits 0 and no process it started outlives
    it (Tansu dies with its parent anyway; the coordinator and workers only if the bench stops them)."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    cli = subprocess.Popen([sys.executable, "-m", "streamjoin.cli", "bench", "adapt", "--quick", "--json",
                            str(tmp_path / "out.json")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    children: list[int] = []
    try:
        def services_started() -> bool:
            children[:] = _child_pids(cli.pid)
            return any(b"streamjoin.cli\x00coordinator" in _cmdline(pid) for pid in children)

        wait_until("a coordinator started by the bench", services_started, 120)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(GRACE_S + 30) == 0
        left = [pid for pid in children if _alive(pid)]
        assert not left, f"processes the bench started outlived it: {[_cmdline(p)[:80] for p in left]}"
        assert not (tmp_path / "out.json").exists()  # stopped: no report
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for pid in filter(_alive, children):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""
