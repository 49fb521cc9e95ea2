from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.launcher import Fleet, write_job
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[embedded.EmbeddedBroker]:
    """A fresh embedded broker per test: Tansu keeps every record until it exits."""
    b = embedded.start(log_path=tmp_path / "broker.log")
    yield b
    b.stop()


def stream(name: str, window: dict) -> dict:
    return {"name": name, "fields": {"k": "int", "ts": "int", "pad": "str"}, "time_field": "ts",
            "key_fields": ["k"], "window": window}


def make_job(bootstrap: str, tmp_path: Path, windows: list[dict], workers: int, partitions: int = 60,
             **extra: object) -> JobSettings:
    worker = {"state_dir": str(tmp_path / "state"), "batch_ms": 100, "heartbeat_ms": 500} | dict(
        extra.pop("worker", {}))  # type: ignore[arg-type]
    coordinator = {"expected_workers": workers, "heartbeat_timeout_ms": 5000} | dict(
        extra.pop("coordinator", {}))  # type: ignore[arg-type]
    return load(None, job="it", bootstrap=bootstrap, partitions=partitions,
                streams=[stream(n, w) for n, w in zip("rst", windows)], worker=worker, coordinator=coordinator,
                **extra)


def on_the_same_inputs(job: JobSettings, name: str, tmp_path: Path, **join: object) -> JobSettings:
    """`job` as job `name` on the same input topics (its own results, state and consumer group),
    with the join settings in `join` replaced: a second job to compare on one input."""
    return job.model_copy(update={
        "job": name,
        "streams": [s.model_copy(update={"topic": job.topic_of(s)}) for s in job.streams],
        "join": job.join.model_copy(update=join),
        "worker": job.worker.model_copy(update={"state_dir": tmp_path / f"{name}-state"}),
    })


@pytest.fixture
def fleet_for(broker: embedded.EmbeddedBroker, tmp_path: Path) -> Iterator:
    fleets: list[Fleet] = []

    def start(job: JobSettings, workers: int) -> Fleet:
        topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
        home = tmp_path / job.job if fleets else tmp_path  # a test's later fleets: a folder of their own
        fleet = Fleet(job, write_job(job, home / "job.yaml"), broker.bootstrap, home / "logs")
        fleets.append(fleet)
        fleet.start_coordinator()
        ids = [f"w{i}" for i in range(workers)]
        for w in ids:
            fleet.start_worker(w)
        fleet.wait_assigned(ids)
        return fleet

    yield start
    for f in fleets:
        f.stop_all()
