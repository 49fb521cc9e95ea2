"""SplitJoin integration plumbing: a fleet of cores and a merger, waiting for the
merger's release, and the order check on the results topic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from streamjoin.engine.reference import ThetaTuple, theta_order
from streamjoin.launcher import Fleet, write_job
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RoundRelease
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.integration.kafka_harness import commits


def band_job(bootstrap: str, tmp_path: Path, window_ms: int, within: tuple[float, float], cores: int,
             max_cores: int, **over: object) -> JobSettings:
    """The SplitJoin paper's band join in splitjoin mode, two partitions per stream, with bands `within`
    (r.x to s.a, r.y to s.b) wide enough for a few thousand results; `over` replaces sections."""
    window = {"range_ms": window_ms}
    settings: dict[str, object] = {
        "job": "band", "bootstrap": bootstrap, "partitions": 2,
        "streams": [{"name": "r", "fields": {"x": "int", "y": "float", "z": "str", "ts": "int"},
                     "time_field": "ts", "window": window},
                    {"name": "s", "fields": {"a": "int", "b": "float", "c": "float", "d": "bool", "ts": "int"},
                     "time_field": "ts", "window": window}],
        "join": {"mode": "splitjoin", "allowed_lateness_ms": 200,
                 "predicate": [{"left": "r.x", "right": "s.a", "within": within[0]},
                               {"left": "r.y", "right": "s.b", "within": within[1]}]},
        "splitjoin": {"cores": cores, "max_cores": max_cores, "batch_ms": 50, "punctuate_every": 1},
        "worker": {"state_dir": str(tmp_path / "state"), "heartbeat_ms": 500},
    }
    return load(None, **(settings | over))


def splitjoin_fleet(job: JobSettings, bootstrap: str, tmp_path: Path, cores: int) -> Fleet:
    """Topics, `cores` cores and the merger, restarted when they crash (not when a core retires)."""
    topics.ensure(kafka.Cluster(bootstrap).admin(), job)
    fleet = Fleet(job, write_job(job, tmp_path / "job.yaml"), bootstrap, tmp_path / "logs")
    for position in range(cores):
        fleet.start_core(position)
    fleet.start_merger()
    return fleet


def splitjoin_cli(fleet: Fleet, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "streamjoin.cli", "splitjoin", *args, "--job", str(fleet.job_file),
                    "--bootstrap", fleet.bootstrap], check=True, capture_output=True, timeout=60)


def merger_watermark(job: JobSettings, bootstrap: str) -> int | None:
    """The merger's newest release: every input below it has all its results written."""
    marks = [c.watermark for c in commits(job, bootstrap) if isinstance(c, RoundRelease) and c.node == "merger"]
    return max(marks, default=None)


def wait_released(job: JobSettings, fleet: Fleet, watermark: int, timeout: float = 180.0) -> None:
    """Until the merger has released every input below `watermark` (crashed services restarted meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.assert_running()
        seen = merger_watermark(job, fleet.bootstrap)
        if seen is not None and seen >= watermark:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the merger did not release up to {watermark} within {timeout}s "
                       f"(at {merger_watermark(job, fleet.bootstrap)}); {fleet.complaints()}")


def result_order(job: JobSettings, bootstrap: str) -> list[tuple[tuple, tuple]]:
    """Each result on the (one-partition) results topic, in topic order, as (probing member's
    place in the input order, partner's): the order docs/modes/splitjoin.md promises is ascending."""
    records = kafka.read_partitions(kafka.Cluster(bootstrap), job.results_topic, {0: 0}, "check-order")
    decoded = decode_results(result_layout(job), job.output.format, [m.value() for m in records])
    assert not decoded.rejects, decoded.rejects[:3]
    cols = decoded.columns
    keys = []
    for r in range(len(cols[f"{job.streams[0].name}.offset"])):
        members = [theta_order(i, ThetaTuple((job.topic_of(s), int(cols[f"{s.name}.partition"][r]),
                                              int(cols[f"{s.name}.offset"][r])), int(cols[f"{s.name}.ts"][r]), {}))
                   for i, s in enumerate(job.streams)]
        keys.append((max(members), min(members)))
    return keys
