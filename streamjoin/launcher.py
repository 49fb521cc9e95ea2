"""Local launcher: runs the services as real processes on this machine, the
way the demo, the integration tests and the benchmarks need them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import TopicPartition

from streamjoin.schemas.control import RING_FENCED_EXIT
from streamjoin.services.io import kafka
from streamjoin.services.broker import free_port
from streamjoin.services.shutdown import signals_deferred
from streamjoin.services.coordinator.status import latest_heartbeats
from streamjoin.settings import JobSettings


def write_job(job: JobSettings, path: Path) -> Path:
    """Write `job` to `path` as the job file the child services load; returns `path`.

    Kafka secrets given by reference stay references (`{env: NAME}`, `{file: PATH}`,
    STREAMJOIN_KAFKA__* as `{env: ...}`): the children inherit this environment and see the
    same files, so the value never lands here. A secret given inline in the job file has no
    other home and is written as it is: so the file is created owner-only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(job.job_file_data(), sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that exists already
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


@dataclass
class Fleet:
    """A coordinator and workers as subprocesses of this one."""

    job: JobSettings
    job_file: Path
    bootstrap: str
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    restart_workers: bool = True  # like a StatefulSet: a worker that exits comes back with the same id
    restarts: int = 0
    metrics_ports: dict[str, int] = field(default_factory=dict)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")
        cmd = [sys.executable, "-m", "streamjoin.cli", *args, "--job", str(self.job_file), "--bootstrap",
               self.bootstrap]
        with signals_deferred():  # a bench stopped mid-spawn still knows, and so stops, every child
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
                                    start_new_session=True)
            self.procs[name] = proc
        return proc

    def start_coordinator(self) -> None:
        self._spawn("coordinator", ["coordinator", "--metrics-port", str(self._port("coordinator"))])

    def start_worker(self, worker_id: str) -> None:
        self._spawn(worker_id, ["worker", "--worker-id", worker_id, "--metrics-port", str(self._port(worker_id))])

    def start_core(self, position: int) -> str:
        """A SplitJoin core as worker `core-<position>`; returns its name."""
        name = f"core-{position}"
        self._spawn(name, ["worker", "--worker-id", name, "--core", str(position),
                           "--metrics-port", str(self._port(name))])
        return name

    def start_merger(self) -> None:
        self._spawn("merger", ["merger", "--metrics-port", str(self._port("merger"))])

    def _port(self, name: str) -> int:
        """A fixed port per service name, so a restarted process is scraped at the same address."""
        if name not in self.metrics_ports:
            self.metrics_ports[name] = free_port()
        return self.metrics_ports[name]

    def write_prometheus_targets(self, path: Path) -> Path:
        """File-based service discovery for ops/prometheus/prometheus.yml."""
        groups = [{"targets": [f"127.0.0.1:{port}"],
                   "labels": {"job": self.job.job, "component": "coordinator" if name == "coordinator" else "worker",
                              "instance_name": name}}
                  for name, port in sorted(self.metrics_ports.items())]
        path.write_text(json.dumps(groups, indent=2))
        return path

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(30)

    def terminate_all(self) -> None:
        """Ask every running service to stop (SIGTERM), without waiting."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()

    def stop_all(self, wait_s: float = 20.0) -> None:
        """Stop every service: SIGTERM to all at once, SIGKILL to those still up after `wait_s`."""
        self.terminate_all()
        deadline = time.monotonic() + wait_s
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def supervise(self) -> None:
        """Restart services that exited on their own (called from the waiting loops), as
        Kubernetes would: the coordinator and the merger always (Deployments), a
        worker while `restart_workers` (a StatefulSet), but not a ring node that exited
        with RING_FENCED_EXIT (it would only be fenced again) nor a SplitJoin core that
        retired (exit 0)."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            if name == "coordinator":
                self.restarts += 1
                self.start_coordinator()
            elif name == "merger":
                self.restarts += 1
                self.start_merger()
            elif name.startswith("core-"):
                if proc.returncode == 0:  # a core that scaled away retires: it is done, not crashed
                    self.procs.pop(name)
                elif self.restart_workers:
                    self.restarts += 1
                    self.start_core(int(name.removeprefix("core-")))
            elif self.restart_workers and proc.returncode != RING_FENCED_EXIT:
                self.restarts += 1
                self.start_worker(name)

    def assert_running(self) -> None:
        self.supervise()
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            tails = {n: (self.log_dir / f"{n}.log").read_text()[-2000:] for n in dead}
            raise RuntimeError(f"services exited: {dead}\n{tails}")

    def complaints(self, last: int = 5) -> dict[str, list[str]]:
        """Each service's last `last` warning and error log lines: what a timeout's message shows."""
        found = {}
        for name in self.procs:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
            found[name] = [line[:400] for line in lines if '"level": "warning"' in line or '"level": "error"' in line
                           or "Traceback" in line][-last:]
        return {name: lines for name, lines in found.items() if lines}

    def wait_assigned(self, workers: list[str], timeout: float = 120.0) -> None:
        """Until every group (and slot: coordinator.hot_key_slots) is held by one of `workers`, as
        their heartbeats say."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_running()
            beats = latest_heartbeats(self.job, kafka.Cluster.of(self.job, self.bootstrap), window_s=5)
            held = [g for w in workers if w in beats for g in beats[w].groups]
            if sorted(held) == list(range(self.job.group_count)):
                return
            time.sleep(0.5)
        raise TimeoutError(f"groups not assigned to {workers} within {timeout}s")


def input_partitions(job: JobSettings, cluster: kafka.Cluster) -> list[tuple[str, int]]:
    """Every partition of the job's source topics, whatever their partition counts."""
    metadata = cluster.admin().list_topics(timeout=30).topics
    return [(t, p) for t in job.input_topics for p in sorted(metadata[t].partitions)]


def forwarded_partitions(job: JobSettings) -> list[tuple[str, int]]:
    """Hash mode: the by-key partitions groups also read (`join.repartition: auto`), and the slots'
    partitions of `<job>.split` (coordinator.hot_key_slots)."""
    if job.join.mode != "hash":
        return []
    slots = [(job.split_topic, j) for j in range(len(job.slots))]
    if job.join.repartition != "auto":
        return slots
    return [(job.by_key_topic(s), g) for s in job.streams for g in range(job.partitions)] + slots


def input_end_offsets(job: JobSettings, bootstrap: str) -> dict[tuple[str, int], int]:
    cluster = kafka.Cluster.of(job, bootstrap)
    return kafka.end_offsets(cluster, input_partitions(job, cluster), f"{job.consumer_group}-probe")


def committed_offsets(job: JobSettings, bootstrap: str,
                      partitions: list[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
    """The job's committed offsets of `partitions` (default: every source partition)."""
    cluster = kafka.Cluster.of(job, bootstrap)
    c = cluster.consumer(job.consumer_group)
    try:
        tps = [TopicPartition(t, p) for t, p in partitions or input_partitions(job, cluster)]
        return {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=30)}
    finally:
        c.close()


def wait_drained(job: JobSettings, bootstrap: str, fleet: Fleet | None = None, timeout: float = 300.0,
                 on_progress=None) -> None:  # type: ignore[no-untyped-def]
    """Until the workers have committed every input record written so far, and then every
    record re-routed through the by-key topics (their forwards are committed with the source
    offsets that caused them, so once the sources are done, the by-key topics' ends are final)."""
    deadline = time.monotonic() + timeout
    _wait_committed(job, bootstrap, input_end_offsets(job, bootstrap), fleet, deadline, on_progress)
    forwarded = forwarded_partitions(job)
    if forwarded:
        ends = kafka.end_offsets(kafka.Cluster.of(job, bootstrap), forwarded, f"{job.consumer_group}-probe")
        _wait_committed(job, bootstrap, ends, fleet, deadline, None)


def _wait_committed(job: JobSettings, bootstrap: str, ends: dict[tuple[str, int], int], fleet: Fleet | None,
                    deadline: float, on_progress) -> None:  # type: ignore[no-untyped-def]
    total = sum(ends.values())
    lagging: dict[tuple[str, int], tuple[int, int]] = {}
    while time.monotonic() < deadline:
        if fleet is not None:
            fleet.assert_running()
        done = committed_offsets(job, bootstrap, list(ends))
        lagging = {k: (max(done.get(k, 0), 0), end) for k, end in ends.items() if end > max(done.get(k, 0), 0)}
        behind = sum(end - committed for committed, end in lagging.values())
        if on_progress:
            on_progress(total - behind, total)
        if behind == 0:
            return
        time.sleep(0.5)
    shown = ", ".join(f"{t}[{p}] at {c} of {e}" for (t, p), (c, e) in sorted(lagging.items())[:8])
    complaints = f"; services' last warnings: {fleet.complaints()}" if fleet is not None else ""
    raise TimeoutError(f"workers did not drain the input in time: {len(lagging)} partitions behind ({shown})"
                       f"{complaints}")


def wait_layout(job: JobSettings, bootstrap: str, fleet: Fleet, layout: list[str], timeout: float = 120.0) -> None:
    """Until the head's rounds run on `layout` (a resize has finished all its stages)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.assert_running()
        beats = latest_heartbeats(job, kafka.Cluster.of(job, bootstrap), window_s=3)
        if any(b.ring_layout == layout for b in beats.values()):
            return
        time.sleep(0.5)
    raise TimeoutError(f"ring did not reach layout {layout} within {timeout}s")


def wait_ring_quiet(job: JobSettings, bootstrap: str, fleet: Fleet, timeout: float = 180.0) -> None:
    """Until the head has taken every input record and no released round is still travelling.

    "Not busy" counts only from a head heartbeat written after every input record was seen
    taken: the head commits its source offsets right after releasing the round that carries
    them, so an older heartbeat (the head's loop can stall for seconds on a loaded machine)
    may predate that round and say "not busy" while it travels."""
    deadline = time.monotonic() + timeout
    ends = input_end_offsets(job, bootstrap)
    quiet, taken_ms = 0, None  # taken_ms: wall clock when every input record was first seen taken
    while time.monotonic() < deadline:
        fleet.assert_running()
        done = committed_offsets(job, bootstrap)
        behind = sum(max(0, e - max(done.get(k, 0), 0)) for k, e in ends.items())
        taken_ms = (taken_ms or time.time() * 1000) if behind == 0 else None
        beats = latest_heartbeats(job, kafka.Cluster.of(job, bootstrap), window_s=3)
        head = [b for b in beats.values() if b.ring_layout and taken_ms is not None and b.wall_ms > taken_ms]
        quiet = quiet + 1 if head and not any(b.ring_busy for b in head) else 0
        if quiet >= 3:
            return
        time.sleep(1.0)
    raise TimeoutError(f"ring did not go quiet within {timeout}s")


class FleetDeployer:
    """The query service's deployer on one machine (services/queries/deploy.py's Deployer):
    each operator version runs as a fleet of its own, a coordinator and
    `queries.operator_workers` workers, its job file and logs under `work_dir/<job>`."""

    def __init__(self, bootstrap: str, work_dir: Path) -> None:
        self.bootstrap, self.work_dir = bootstrap, work_dir
        self.fleets: dict[str, Fleet] = {}

    def start(self, job: JobSettings) -> None:
        from streamjoin.topology import topics

        home = self.work_dir / job.job
        topics.ensure(kafka.Cluster.of(job, self.bootstrap).admin(), job)
        fleet = Fleet(job, write_job(job, home / "job.yaml"), self.bootstrap, home / "logs")
        fleet.start_coordinator()
        for n in range(job.coordinator.expected_workers):
            fleet.start_worker(f"w{n}")
        self.fleets[job.job] = fleet

    def stop(self, job_name: str) -> None:
        fleet = self.fleets.pop(job_name, None)
        if fleet is not None:
            fleet.stop_all()

    def check(self) -> None:
        for fleet in self.fleets.values():
            fleet.supervise()

    def close(self) -> None:
        for fleet in self.fleets.values():  # all at once: the service's own grace period is short
            fleet.terminate_all()
        for name in list(self.fleets):
            self.stop(name)
