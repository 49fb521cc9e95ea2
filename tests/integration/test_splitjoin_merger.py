"""The SplitJoin merger as a process on the embedded broker, fed hand-made core releases of
two cores (an aborted-looking attempt re-sent with other boundaries, an unfinished piece
sequence, an unreadable record): every result once, in input order, through a clean stop
with results held back and a SIGKILL at `merger-written` (faults.crash_at)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import result_head
from streamjoin.schemas.codecs import encode_block
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RoundRelease, decode_commit
from streamjoin.schemas.splitjoin import CORE_HEADER, CoreMeta, encode_core_release
from streamjoin.services import broker as embedded
from streamjoin.services import faults
from streamjoin.services.io import kafka
from streamjoin.services.splitjoin.merger import MergerCheckpoint
from streamjoin.launcher import write_job
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.integration.fleet_harness import wait_until

pytestmark = pytest.mark.integration

CORES, END = 2, 14
CRASH = "merger:merger-written"


def splitjoin_job(bootstrap: str, tmp_path: Path, crash: bool) -> JobSettings:
    fields = {"k": "int", "ts": "int", "pad": "str"}
    return load(None, job="sjm", bootstrap=bootstrap, partitions=1,
                streams=[{"name": n, "fields": fields, "time_field": "ts", "window": {"range_ms": 1000}} for n in "rs"],
                join={"mode": "splitjoin"}, splitjoin={"cores": CORES, "max_cores": CORES, "punctuate_every": 1},
                worker={"state_dir": str(tmp_path / "state"), "heartbeat_ms": 300},
                faults={"crash_at": [CRASH] if crash else []})


def pairs(core: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Core `core`'s (probing, partner) sequence numbers in [lo, hi): each pair found by one core."""
    return [(g, q) for g in range(lo, hi) for q in range(g) if q % CORES == core and (g + q) % 3]


def results(job: JobSettings, core: int, lo: int, hi: int) -> Block:
    """The result block core `core` makes for probing sequences [lo, hi): input tuple g is
    record g of its stream's partition 0 (even g in r, odd in s)."""
    found = pairs(core, lo, hi)
    g = np.array([p for p, _ in found], np.int64)
    q = np.array([p for _, p in found], np.int64)
    r, s = np.where(g % 2 == 0, g, q), np.where(g % 2 == 0, q, g)
    zero = np.zeros(len(g), np.int32)
    head = result_head([job.topic_of(st) for st in job.streams], [zero, zero], [r, s], np.maximum(r, s) * 10,
                       int(time.time() * 1000))
    cols = dict(head)
    for name, seq in (("r", r), ("s", s)):
        cols |= {f"{name}.partition": zero, f"{name}.offset": seq, f"{name}.ts": seq * 10, f"{name}.k": seq % 5,
                 f"{name}.pad": np.full(len(g), "x"), f"{name}._g": seq}
    return Block(cols | {"newest_arrival_ms": np.full(len(g), int(time.time() * 1000) - 5)})


def release(job: JobSettings, core: int, lo: int, hi: int) -> list[tuple[bytes, list]]:
    meta = CoreMeta(core=core, from_g=lo, through=hi, punctuation=hi, watermark=hi * 10, schedule=[(0, CORES)])
    return encode_core_release(meta, results(job, core, lo, hi))


def unfinished(job: JobSettings, core: int, lo: int, hi: int) -> list[tuple[bytes, list]]:
    """Piece 0 of 2 of a release whose attempt died."""
    meta = CoreMeta(core=core, from_g=lo, through=hi, punctuation=hi, watermark=hi * 10, schedule=[(0, CORES)],
                    pieces=2)
    return [(encode_block(results(job, core, lo, hi)), [(CORE_HEADER, meta.model_dump_json().encode())])]


def produce(job: JobSettings, bootstrap: str, records: dict[int, list[tuple[bytes, list]]]) -> None:
    p = kafka.Cluster(bootstrap).producer()
    for core, recs in records.items():
        for value, headers in recs:
            p.produce(job.core_output_topic, value=value, headers=headers, partition=core)
    assert p.flush(30) == 0


def start_merger(job_file: Path, port: int, log: Path) -> subprocess.Popen:
    code = ("from streamjoin.settings import load; from streamjoin.services.io import kafka; "
            "from streamjoin.services.splitjoin.merger import run_merger; "
            f"job = load({str(job_file)!r}); run_merger(job, kafka.Cluster.of(job), {port})")
    return subprocess.Popen([sys.executable, "-c", code], stdout=log.open("ab"), stderr=subprocess.STDOUT)


def written(job: JobSettings, bootstrap: str) -> list[tuple[int, int]]:
    """The results topic's results as (probing, partner) sequence numbers, in topic order."""
    records = kafka.read_partitions(kafka.Cluster(bootstrap), job.results_topic, {0: 0}, "check-sjm")
    decoded = decode_results(result_layout(job), job.output.format, [m.value() for m in records])
    assert not decoded.rejects, decoded.rejects[:3]
    r, s = decoded.columns["r.offset"], decoded.columns["s.offset"]
    return list(zip(np.maximum(r, s).tolist(), np.minimum(r, s).tolist()))


def wait_written(job: JobSettings, bootstrap: str, count: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(written(job, bootstrap)) < count:
        assert proc.poll() is None, f"the merger exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{len(written(job, bootstrap))} of {count} results written"
        time.sleep(0.3)


def wait_taken(job: JobSettings, bootstrap: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the merger has taken every record of the core partitions and committed what it made
    of them: its newest checkpoint, written in one transaction with the results it released
    (read_committed: visible once that committed), has every lane's next offset at its end."""
    cluster = kafka.Cluster(bootstrap)
    ends = kafka.end_offsets(cluster, [(job.core_output_topic, p) for p in range(CORES)], "check-sjm-ends")
    deadline = time.monotonic() + timeout
    while True:
        records = kafka.read_partitions(cluster, job.merger_topic, {0: 0}, "check-sjm-taken")
        lanes = MergerCheckpoint.model_validate_json(records[-1].value()).lanes if records else {}
        behind = {p: (lanes[p].next if p in lanes else 0, end) for (_, p), end in ends.items()
                  if p not in lanes or lanes[p].next < end}
        if not behind:
            return
        assert proc.poll() is None, f"the merger exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"core partitions taken and committed up to, of their ends: {behind}"
        time.sleep(0.3)


def metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name))


def stopped(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def test_the_merger_writes_every_result_once_in_input_order_through_a_sigkill(broker: embedded.EmbeddedBroker,
                                                                             tmp_path: Path) -> None:
    job = splitjoin_job(broker.bootstrap, tmp_path, crash=False)
    crashing = splitjoin_job(broker.bootstrap, tmp_path, crash=True)
    clean_file, crash_file = write_job(job, tmp_path / "job.yaml"), write_job(crashing, tmp_path / "crash.yaml")
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
    port, log = embedded.free_port(), tmp_path / "merger.log"
    expected = sorted(pairs(0, 0, END) + pairs(1, 0, END))

    # Core 0 runs ahead (an attempt writes [4, 9) and dies, its retry cuts at 6), core 1 lags at 3:
    # what probes below 3 leaves, core 0's results from 3 on wait in the merger.
    produce(job, broker.bootstrap, {0: release(job, 0, 0, 4) + release(job, 0, 4, 9) + release(job, 0, 4, 6),
                                    1: release(job, 1, 0, 3)})
    merger = start_merger(clean_file, port, log)
    try:
        wait_written(job, broker.bootstrap, sum(g < 3 for g, _ in expected), merger)
        wait_taken(job, broker.bootstrap, merger)  # it has read all there is: nothing else may leave
        assert len(written(job, broker.bootstrap)) == sum(g < 3 for g, _ in expected)
        # The gauge is set right after the transaction commits (a scrape may come in between).
        wait_until("results held", lambda: metric(port, "streamjoin_splitjoin_merger_held_results") > 0, 30)
        assert metric(port, "streamjoin_splitjoin_merger_held_results") > 0
    finally:
        assert stopped(merger) == 0

    # The rest, with an unfinished piece sequence and an unreadable record in core 1's partition.
    produce(job, broker.bootstrap, {1: unfinished(job, 1, 3, 9) + [(b"junk", [(CORE_HEADER, b"{")])]
                                    + release(job, 1, 3, 7) + release(job, 1, 7, END),
                                    0: release(job, 0, 6, 11) + release(job, 0, 11, END)})
    merger = start_merger(crash_file, port, log)
    assert merger.wait(60) == -signal.SIGKILL, "the merger did not crash at merger-written"
    assert (faults.marker_dir(crashing) / CRASH).exists()
    merger = start_merger(crash_file, port, log)
    try:
        wait_written(job, broker.bootstrap, len(expected), merger)
        wait_taken(job, broker.bootstrap, merger)  # the junk record among what it read; nothing more to write
        restores = metric(port, "streamjoin_splitjoin_merger_restores_total")
        unreadable = metric(port, "streamjoin_splitjoin_merger_unreadable_records_total")
    finally:
        assert stopped(merger) == 0
    out = written(job, broker.bootstrap)
    assert len(out) == len(set(out)), "a result was written twice"
    assert out == expected, "results missing or out of input order"
    assert restores == 1 and unreadable == 1
    releases = [decode_commit(m.value()) for m in kafka.read_partitions(
        kafka.Cluster(broker.bootstrap), job.commits_topic, {0: 0}, "check-sjm-commits")]
    assert max(r.watermark for r in releases if isinstance(r, RoundRelease) and r.node == "merger") == END * 10
    checkpoints = kafka.read_partitions(kafka.Cluster(broker.bootstrap), job.merger_topic, {0: 0}, "check-sjm-ck")
    assert json.loads(checkpoints[-1].value())["released_below"] == END
