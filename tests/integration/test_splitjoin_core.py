"""SplitJoin cores through the real parts, without the merger: two cores as processes
(`streamjoin worker --core I`) on a fresh embedded broker, a band join; the union of their
core-output releases (per core, results probing below the `through` already accepted
dropped, as the merger does) is exactly the plain-Python theta reference, through a
clean stop and a SIGKILL of core 1 at `core-output-written` (each restored from its own
changelog; the killed attempt's output is visible on Tansu, and repeated by its retry);
malformed records are dead-lettered once, by core 0. And a core added by a scale starts
from core 0's snapshot, retires, and comes back from its own checkpoint."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import requests

from streamjoin.launcher import write_job
from streamjoin.schemas.splitjoin import decode_core_release
from streamjoin.services import broker as embedded
from streamjoin.services import faults
from streamjoin.services.io import kafka
from streamjoin.services.broker import free_port
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.ring_harness import band_rows, produce_rows, ring_expected
from tests.integration.splitjoin_harness import band_job

pytestmark = pytest.mark.integration

T0, SPAN_MS, WINDOW_MS, ROWS = 1_000, 20_000, 4_000, 900


def core_job(bootstrap: str, tmp_path: Path, **over: object) -> JobSettings:
    return band_job(bootstrap, tmp_path, WINDOW_MS, (600, 2500), cores=2, max_cores=2, **({"job": "sjcore"} | over))


class Cores:
    """Core processes, each started from a job file of its own choosing, scraped at a fixed port."""

    def __init__(self, bootstrap: str, logs: Path) -> None:
        self.bootstrap, self.logs = bootstrap, logs
        self.procs: dict[int, subprocess.Popen] = {}
        self.ports: dict[int, int] = {}

    def start(self, position: int, job_file: Path) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        port = self.ports.setdefault(position, free_port())
        cmd = [sys.executable, "-m", "streamjoin.cli", "worker", "--worker-id", f"core-{position}", "--core",
               str(position), "--job", str(job_file), "--bootstrap", self.bootstrap, "--metrics-port", str(port)]
        log = open(self.logs / f"core-{position}.log", "ab")
        self.procs[position] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def metric(self, position: int, name: str, labels: str = "") -> float:
        try:
            text = requests.get(f"http://127.0.0.1:{self.ports[position]}/metrics", timeout=5).text
        except requests.RequestException:
            return -1.0
        line = f"{name}{{{labels}}}" if labels else name
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.split(" ")[0] == line)

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            for position, proc in self.procs.items():
                assert proc.poll() is None, f"core {position} exited ({proc.returncode}): {self.tail(position)}"
            time.sleep(0.3)
        raise TimeoutError(f"{what} within {timeout}s; logs: {[self.tail(p) for p in self.procs]}")

    def tail(self, position: int) -> str:
        return (self.logs / f"core-{position}.log").read_text()[-3000:]

    def stop(self, position: int, sig: int = signal.SIGTERM) -> int:
        proc = self.procs.pop(position)
        if proc.poll() is None:
            proc.send_signal(sig)
        return proc.wait(30)

    def stop_all(self) -> None:
        for position in list(self.procs):
            self.stop(position)


def union_of_releases(job: JobSettings, bootstrap: str) -> list[tuple]:
    """Every core's results on the core-output topic, each once: per core, a complete
    release's results probing below the highest `through` accepted before it are repeats."""
    found = []
    records = kafka.read_partitions(kafka.Cluster(bootstrap), job.core_output_topic,
                                    dict.fromkeys(range(job.splitjoin.max_cores), 0), "check-core-out")
    accepted: dict[int, int] = {}
    for m in records:  # each partition's records in offset order
        meta, block = decode_core_release(m.value(), m.headers())
        assert meta.core == m.partition()
        through = accepted.get(meta.core, 0)
        if len(block):
            keep = np.maximum(block["r._g"], block["s._g"]) >= through
            refs = [[(job.topic_of(s), p, o) for p, o in zip(block[f"{s.name}.partition"][keep].tolist(),
                                                             block[f"{s.name}.offset"][keep].tolist())]
                    for s in job.streams]
            found += list(zip(*refs))
        if meta.piece == meta.pieces - 1:
            accepted[meta.core] = max(through, meta.through)
    return found


def released_through(job: JobSettings, bootstrap: str) -> dict[int, int]:
    """Per core, the highest `through` of its complete releases committed on the core-output
    topic (read_committed: a release whose transaction has not committed is not there yet)."""
    records = kafka.read_partitions(kafka.Cluster(bootstrap), job.core_output_topic,
                                    dict.fromkeys(range(job.splitjoin.max_cores), 0), "check-core-through")
    through: dict[int, int] = {}
    for m in records:
        meta, _ = decode_core_release(m.value(), m.headers())
        if meta.piece == meta.pieces - 1:
            through[meta.core] = max(through.get(meta.core, 0), meta.through)
    return through


def splitjoin_cli(job_file: Path, bootstrap: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "streamjoin.cli", "splitjoin", *args, "--job", str(job_file), "--bootstrap",
                    bootstrap], check=True, capture_output=True, timeout=60)


def test_two_cores_exact_through_a_stop_and_a_sigkill(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    plain = core_job(broker.bootstrap, tmp_path)
    armed = core_job(broker.bootstrap, tmp_path, faults={"crash_at": ["core-1:core-output-written"]})
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), plain)
    plain_file, armed_file = write_job(plain, tmp_path / "plain.yaml"), write_job(armed, tmp_path / "armed.yaml")
    rows = band_rows(plain, ROWS, seed=5, t0=T0, span_ms=SPAN_MS)
    cores = Cores(broker.bootstrap, tmp_path / "logs")
    try:
        cores.start(0, plain_file)
        cores.start(1, plain_file)
        produce_rows(plain, broker.bootstrap, rows[:300], raw=[(plain.input_topics[0], b"not json")])
        cores.wait("core 1 released", lambda: cores.metric(1, "streamjoin_splitjoin_core_through") > 0)
        assert cores.stop(1) == 0  # a clean stop ends the release in hand: the next start restores it
        produce_rows(plain, broker.bootstrap, rows[300:600])  # its first release after it has results
        cores.start(1, armed_file)
        killed = cores.procs[1]
        cores.wait("core 1 SIGKILLed at core-output-written", lambda: killed.poll() is not None)
        assert killed.returncode == -signal.SIGKILL
        assert (faults.marker_dir(plain) / "core-1:core-output-written").exists()
        cores.procs.pop(1)
        cores.start(1, armed_file)  # the marker makes the crash happen once
        produce_rows(plain, broker.bootstrap, rows[600:])
        splitjoin_cli(plain_file, broker.bootstrap, "tick", "--ts", str(T0 + SPAN_MS + WINDOW_MS + 1_000))
        cores.wait("every tuple released on both cores",
                   lambda: all(cores.metric(p, "streamjoin_splitjoin_core_through") == ROWS for p in (0, 1)), 90)
        restored = cores.metric(1, "streamjoin_splitjoin_core_restores_total", 'source="own"')
        stored = [cores.metric(p, "streamjoin_splitjoin_core_tuples_stored_total", f'stream="{s}"')
                  for p in (0, 1) for s in "rs"]
        # The gauge moves before the release's transaction commits: wait for the releases themselves.
        cores.wait("the last releases committed",
                   lambda: released_through(plain, broker.bootstrap) == {0: ROWS, 1: ROWS}, 60)
    finally:
        cores.stop_all()
    assert restored == 1, "core 1's last start did not restore from its own changelog"
    assert all(n > 0 for n in stored)
    expected, reasons = ring_expected(plain, broker.bootstrap, None, every_input=True)
    found = union_of_releases(plain, broker.bootstrap)
    counts = Counter(found)
    assert len(expected) > 300
    assert not [r for r, n in counts.items() if n > 1], "a result was written twice"
    assert set(counts) == expected, (len(set(counts) - expected), len(expected - set(counts)))
    assert reasons == Counter({"malformed": 1}), "the malformed record was dead-lettered other than once by core 0"


def test_a_core_added_by_a_scale_bootstraps_retires_and_comes_back(broker: embedded.EmbeddedBroker,
                                                                     tmp_path: Path) -> None:
    """k 2 -> 3 -> 2 -> 3: core 2 starts from core 0's snapshot, retires once its window has
    expired (exit 0), and started again after the next scale goes on from its own checkpoint."""
    job = core_job(broker.bootstrap, tmp_path, splitjoin={"cores": 2, "max_cores": 3, "batch_ms": 50,
                                                          "punctuate_every": 1})
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
    job_file = write_job(job, tmp_path / "job.yaml")
    rows = band_rows(job, ROWS, seed=7, t0=T0, span_ms=SPAN_MS)
    a, b, c = ROWS // 4, ROWS // 2, ROWS * 7 // 8  # [b, c) spans well over a window: core 2's expires
    cores = Cores(broker.bootstrap, tmp_path / "logs")
    try:
        cores.start(0, job_file)
        cores.start(1, job_file)
        produce_rows(job, broker.bootstrap, rows[:a])
        splitjoin_cli(job_file, broker.bootstrap, "scale", "--cores", "3")
        cores.start(2, job_file)
        produce_rows(job, broker.bootstrap, rows[a:b])
        splitjoin_cli(job_file, broker.bootstrap, "scale", "--cores", "2")
        produce_rows(job, broker.bootstrap, rows[b:c])
        retiring = cores.procs[2]
        cores.wait("core 2 retired", lambda: retiring.poll() is not None, 60)
        assert retiring.returncode == 0, cores.tail(2)
        bootstrapped = '"source": "bootstrap"' in cores.tail(2)  # its metrics went with the process
        cores.procs.pop(2)
        splitjoin_cli(job_file, broker.bootstrap, "scale", "--cores", "3")
        cores.start(2, job_file)
        produce_rows(job, broker.bootstrap, rows[c:])
        splitjoin_cli(job_file, broker.bootstrap, "tick", "--ts", str(T0 + SPAN_MS + WINDOW_MS + 1_000))
        cores.wait("every tuple released on every core",
                   lambda: all(cores.metric(p, "streamjoin_splitjoin_core_through") == ROWS for p in (0, 1, 2)), 90)
        own = cores.metric(2, "streamjoin_splitjoin_core_restores_total", 'source="own"')
        stored = cores.metric(2, "streamjoin_splitjoin_core_tuples_stored_total", 'stream="r"')
        # The gauge moves before the release's transaction commits: wait for the releases themselves.
        cores.wait("the last releases committed",
                   lambda: released_through(job, broker.bootstrap) == {0: ROWS, 1: ROWS, 2: ROWS}, 60)
    finally:
        cores.stop_all()
    assert bootstrapped and own == 1 and stored > 0
    expected, _ = ring_expected(job, broker.bootstrap, None, every_input=True)
    found = union_of_releases(job, broker.bootstrap)
    counts = Counter(found)
    assert not [r for r, n in counts.items() if n > 1], "a result was written twice"
    assert set(counts) == expected, (len(set(counts) - expected), len(expected - set(counts)))
