"""What tests do to a running fleet: read a service's metrics, lose a worker's disk, run a
fleet whose broker is reached through a TCP proxy the test controls."""

from __future__ import annotations

import shutil
import signal
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from confluent_kafka import TopicPartition

from streamjoin.launcher import Fleet, input_end_offsets, wait_drained, write_job
from streamjoin.schemas.control import Heartbeat
from streamjoin.schemas.results import BatchCommit
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import heartbeats_since
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import Row, commits, produce
from tests.integration.tcp_proxy import Proxy


def metric(port: int, name: str, labels: str = "") -> float:
    """The value of the sample `name` the service on `port` serves: unlabelled, or with `labels`
    as Prometheus prints them (e.g. 'outcome="done"')."""
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        samples = [line.split()[-1] for line in response.read().decode().splitlines() if line.startswith(prefix)]
    return float(samples[0])


def wait_metric(port: int, name: str, at_least: float, timeout: float) -> float:
    """Until the service on `port` serves `name` >= `at_least` (it may still be starting); its value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        try:
            value = metric(port, name)
        except (OSError, IndexError):  # not serving yet, or no sample yet
            value = None
        if value is not None and value >= at_least:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{name} on port {port} stayed at {value}, below {at_least}, for {timeout}s")


T = TypeVar("T")


def wait_until(what: str, done: Callable[[], T], timeout: float = 60.0, fleet: Fleet | None = None,
               interval: float = 0.2) -> T:
    """Until `done()` returns something true, which is returned; `fleet`'s services are checked
    meanwhile (restarted as `Fleet.supervise` does, RuntimeError when one is down for good).
    TimeoutError naming `what` (and the services' last complaints) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if fleet is not None:
            fleet.assert_running()
        value = done()
        if value:
            return value
        if time.monotonic() >= deadline:
            complaints = f"; services' last warnings: {fleet.complaints()}" if fleet is not None else ""
            raise TimeoutError(f"{what}: not within {timeout}s{complaints}")
        time.sleep(interval)


def heartbeats_after(job: JobSettings, bootstrap: str, since_ms: int) -> list[Heartbeat]:
    """Every heartbeat on the control topic written after wall clock `since_ms`, oldest first."""
    window_s = max(1.0, time.time() - since_ms / 1000 + 1.0)
    return [b for b in heartbeats_since(job, kafka.Cluster.of(job, bootstrap), window_s) if b.wall_ms > since_ms]


def wait_heartbeats(job: JobSettings, bootstrap: str, workers: list[str], since_ms: int, count: int = 1,
                    timeout: float = 60.0, fleet: Fleet | None = None) -> dict[str, list[Heartbeat]]:
    """Until each of `workers` has written `count` heartbeats after wall clock `since_ms` (its
    loop has gone round that often since): each worker's heartbeats since then, oldest first."""
    def beats() -> dict[str, list[Heartbeat]] | None:
        found: dict[str, list[Heartbeat]] = {w: [] for w in workers}
        for b in heartbeats_after(job, bootstrap, since_ms):
            if b.worker in found:
                found[b.worker].append(b)
        return found if all(len(found[w]) >= count for w in workers) else None

    return wait_until(f"{count} heartbeats of each of {workers} after {since_ms}", beats, timeout, fleet, 0.3)


def feed_in_two_batches(job: JobSettings, bootstrap: str, fleet: Fleet, rows: list[Row]) -> set[tuple[int, int]]:
    """Produce `rows` in two halves, draining after each, so every group with rows in both
    writes two batches at least; returns (group, seq) of every batch the commits topic holds."""
    half = len(rows) // 2
    for part in (rows[:half], rows[half:]):
        produce(job, bootstrap, part)
        wait_drained(job, bootstrap, fleet, timeout=120)
    return {(c.group, c.seq) for c in commits(job, bootstrap) if isinstance(c, BatchCommit)}


def take_through(worker, ends: dict[tuple[str, int], int]) -> None:  # type: ignore[no-untyped-def]
    """Take records into an in-process `worker` (services/hash/main.Worker, its consumer
    assigned) until its position reaches `ends` on every input partition."""
    deadline = time.monotonic() + 60
    while True:
        worker._take(worker.consumer.consume(10_000, 0.2))
        positions = worker.consumer.position([TopicPartition(t, p) for t, p in ends])
        if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in positions):
            return
        assert time.monotonic() < deadline, "input not read within 60 s"


def lose_disk_and_rewind(job: JobSettings, bootstrap: str, fleet: Fleet, worker: str) -> None:
    """Stop `worker`, delete its RocksDB state and commit offset 0 on every input, so its
    restart replays every batch the commits topic holds (and must commit their offsets)."""
    fleet.kill(worker, signal.SIGTERM)
    shutil.rmtree(Path(job.worker.state_dir) / worker)
    ends = input_end_offsets(job, bootstrap)
    rewind = kafka.Cluster(bootstrap).consumer(job.consumer_group)
    rewind.commit(offsets=[TopicPartition(topic, p, 0) for topic, p in ends], asynchronous=False)
    rewind.close()


@contextmanager
def proxied_fleet(tmp_path: Path, proxy_type: type[Proxy], workers: int = 1, partitions: int = 60,
                  restart_workers: bool = True,
                  **job: object) -> Iterator[tuple[embedded.EmbeddedBroker, Proxy, JobSettings, Fleet]]:
    """A fresh broker that clients reach only through a `proxy_type` proxy (it advertises the
    proxy's port), a 2-way job on it (`partitions`, 500 ms windows, `job` settings on top),
    its coordinator and `workers` workers w0.. with every group assigned. Yields (broker,
    proxy, job, fleet); stops the fleet, then the proxy, then the broker."""
    front = embedded.free_port()
    broker = embedded.start(log_path=tmp_path / "broker.log", advertised_port=front)
    proxy = proxy_type(front, broker.listen_port)
    fleet: Fleet | None = None
    try:
        embedded.wait_until_ready(broker.bootstrap, 30, broker.process)
        settings = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}, {"range_ms": 500}], workers=workers,
                            partitions=partitions, **job)
        topics.ensure(kafka.Cluster(broker.bootstrap).admin(), settings)
        fleet = Fleet(settings, write_job(settings, tmp_path / "job.yaml"), broker.bootstrap, tmp_path / "logs")
        fleet.restart_workers = restart_workers
        fleet.start_coordinator()
        ids = [f"w{i}" for i in range(workers)]
        for worker_id in ids:
            fleet.start_worker(worker_id)
        fleet.wait_assigned(ids)
        yield broker, proxy, settings, fleet
    finally:
        if fleet is not None:
            fleet.stop_all()
        proxy.pause()
        broker.stop()
