"""The Spark jobs end to end on the embedded broker: `run_sources` writes a
real workload, the test writes a results topic computed with the reference
join (and the batch commits that carry the groups' watermarks), and
`run_verify` must accept it, then catch a duplicate, a loss and a result
record that does not decode."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from streamjoin.launcher import write_job
from streamjoin.engine.reference import RefTuple, RefWindow, TupleRef, reference_join
from streamjoin.schemas.results import dead_letter_headers
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.spark.kafka_source import NAME as KAFKA
from streamjoin.services.spark.sources import run_sources
from streamjoin.services.spark.verify import run_verify
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics
from tests.integration.spark_output import named_log, noise, spark_lines
from tests.unit.result_writer import Result as ResultRecord
from tests.unit.result_writer import batch_commit, encode

pytestmark = [pytest.mark.spark, pytest.mark.integration]

PARTITIONS = 4
Result = tuple[TupleRef, ...]


def make_job(name: str, bootstrap: str, input_topics: list[str] | None = None, output: str = "json") -> JobSettings:
    """r: a time window, s: a count window, so final watermarks matter too; results in `output` format."""
    windows = [{"range_ms": 60_000}, {"rows": 3}]
    streams = [{"name": n, "fields": {"k": "int", "ts": "int", "pad": "str"}, "time_field": "ts",
                "key_fields": ["k"], "window": w} for n, w in zip("rs", windows)]
    for s, t in zip(streams, input_topics or []):
        s["topic"] = t
    return load(None, job=name, bootstrap=bootstrap, partitions=PARTITIONS, streams=streams,
                workload={"rate": 80, "domain": 256, "skew": 0.7, "seconds": 5}, output={"format": output})


@dataclass
class World:
    bootstrap: str
    job: JobSettings
    sources: dict
    streams: list[list[RefTuple]]
    lags: list[int]
    results: list[Result]
    ts: dict[TupleRef, int]
    watermarks: dict[int, int]
    malformed: TupleRef


def produce_malformed(bootstrap: str, topic: str) -> TupleRef:
    where: list[TupleRef] = []
    p = kafka.Cluster(bootstrap).producer()
    p.produce(topic, key=b"1", value=b'{"k": 1, "ts": oops', partition=0,
              on_delivery=lambda err, msg: where.append((msg.topic(), msg.partition(), msg.offset())))
    assert p.flush(30) == 0 and where
    return where[0]


def write_dead_letter(job: JobSettings, bootstrap: str, ref: TupleRef) -> None:
    p = kafka.Cluster(bootstrap).producer()
    p.produce(job.dead_letter_topic, partition=ref[1], key=b"1", value=b'{"k": 1, "ts": oops',
              headers=dead_letter_headers("malformed", "not JSON", *ref, group=ref[1], seq=0))
    assert p.flush(30) == 0


def read_inputs(job: JobSettings, bootstrap: str) -> tuple[list[list[RefTuple]], list[int]]:
    """Every well-formed input tuple (via the Spark batch reader) and each one's lag:
    its Kafka timestamp minus its event time."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    rows = (spark.read.format(KAFKA).option("bootstrap", bootstrap).option("topics", ",".join(job.input_topics))
            .load().select("topic", "partition", "offset", "timestamp_ms", "value").collect())
    streams: dict[str, list[RefTuple]] = {t: [] for t in job.input_topics}
    lags = []
    for r in rows:
        try:
            v = json.loads(r.value)
        except ValueError:  # the malformed record the fixture wrote
            continue
        streams[r.topic].append(RefTuple((r.topic, r.partition, r.offset), v["k"], v["ts"]))
        lags.append(r.timestamp_ms - v["ts"])
    return [streams[t] for t in job.input_topics], lags


def write_results(job: JobSettings, bootstrap: str, results: list[Result], ts: dict[TupleRef, int],
                  watermarks: dict[int, int], extra: tuple[bytes, ...] = ()) -> None:
    """As workers write them: per group (the first stream's partition) a batch commit with
    the group's watermark, then its results in the job's output format; then `extra` records."""
    p = kafka.Cluster(bootstrap).producer()
    now = int(time.time() * 1000)
    for g in range(job.partitions):
        mine = [ResultRecord(r, max(ts[ref] for ref in r), now) for r in results if r[0][1] == g]
        p.produce(job.commits_topic, partition=g, key=str(g).encode(), value=batch_commit(g, watermarks[g]))
        for value in encode(job, mine):
            p.produce(job.results_topic, partition=g, value=value)
    for value in extra:
        p.produce(job.results_topic, partition=0, value=value)
    assert p.flush(30) == 0


@pytest.fixture(scope="module")
def world(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    broker = embedded.start(log_path=log)
    try:
        job = make_job("sparkit", broker.bootstrap)
        topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
        sources = run_sources(job, kafka.Cluster(broker.bootstrap), seconds=5, rate=80, show_progress=False)
        malformed = produce_malformed(broker.bootstrap, job.input_topics[0])
        write_dead_letter(job, broker.bootstrap, malformed)
        streams, lags = read_inputs(job, broker.bootstrap)
        # Count windows are final below the watermark: hold every group's back a little.
        watermarks = {g: max(t.ts for s in streams for t in s) - 300 for g in range(job.partitions)}
        results = sorted(reference_join(streams, [RefWindow(s.window.range_ms, s.window.rows) for s in job.streams],
                                        watermarks))
        ts = {t.ref: t.ts for s in streams for t in s}
        write_results(job, broker.bootstrap, results, ts, watermarks)
        yield World(broker.bootstrap, job, sources, streams, lags, results, ts, watermarks, malformed)
    finally:
        broker.stop()


def test_sources_write_the_workload(world: World) -> None:
    counts = world.sources["records"]
    assert counts == {s.name: len(t) for s, t in zip(world.job.streams, world.streams)}
    for name, rate in world.sources["rate"].items():
        assert 40 < rate < 160, f"stream {name} ran at {rate}/s, asked for 80/s"
    # Event time is the wall clock at production: records leave within seconds of it (Spark's
    # micro-batches on a loaded machine add a second or two), never minutes.
    assert statistics.median(world.lags) < 10_000, "records should leave close to their event time"
    assert len(world.results) > 50, "the workload should join"


def test_verify_accepts_a_correct_join(world: World, tmp_path: Path) -> None:
    report = run_verify(world.job, kafka.Cluster(world.bootstrap), tmp_path / "report.json", tmp_path / "delay.png")
    assert report["verified"], report
    assert report["expected"] == report["results"] == report["result_records"] == len(world.results)
    assert (report["missing"], report["extra"], report["duplicates"], report["bad_ids"], report["bad_records"]) == (
        0, 0, 0, 0, 0)
    assert report["dead_letter"]["count"] == 1 and report["dead_letter"]["by_reason"] == {"malformed": 1}
    assert report["lost"] == 0
    assert report["inputs"]["total"] == sum(len(s) for s in world.streams) + 1
    assert report["delay_ms"]["p50"] is not None and report["delay_ms"]["p50"] >= 0
    assert json.loads((tmp_path / "report.json").read_text())["verified"] is True
    assert (tmp_path / "delay.png").stat().st_size > 1000


def test_verify_catches_duplicate_missing_lost_and_bad_records(world: World) -> None:
    # Same inputs under another job name, so it gets results and dead-letter topics of its own; Avro results.
    job = make_job("sparkit-bad", world.bootstrap, world.job.input_topics, output="avro")
    topics.ensure(kafka.Cluster(world.bootstrap).admin(), job)
    write_dead_letter(job, world.bootstrap, world.malformed)
    produce_malformed(world.bootstrap, job.input_topics[1])  # never dead-lettered: lost
    results = world.results[1:] + world.results[-1:]  # drop the first, repeat the last
    write_results(job, world.bootstrap, results, world.ts, world.watermarks, extra=(b"not avro",))
    report = run_verify(job, kafka.Cluster(world.bootstrap))
    assert not report["verified"]
    assert (report["missing"], report["extra"], report["duplicates"]) == (1, 0, 1), report
    assert (report["bad_records"], report["bad_ids"], report["result_records"]) == (1, 0, len(results) + 1), report
    assert report["lost"] == 1 and report["dead_letter"]["count"] == 1, report


def test_sources_command_keeps_spark_output_in_its_log(world: World, tmp_path: Path) -> None:
    """The terminal gets the command's JSON and progress; Spark's own lines go to the file it
    names, and no line anywhere shows the job's Kafka client settings' values."""
    secret = "Hunter2-S3cr3t"
    # sasl.password without a SASL protocol: librdkafka keeps it unused, so the embedded broker still serves.
    job = make_job("sparkit-cli", world.bootstrap).model_copy(update={"kafka": {"sasl.password": secret}})
    topics.ensure(kafka.Cluster(world.bootstrap).admin(), job)
    command = [sys.executable, "-c", "from streamjoin.cli import app; app()", "sources",
               "--job", str(write_job(job, tmp_path / "job.yaml")), "--bootstrap", world.bootstrap, "--seconds", "2"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sum(json.loads(run.stdout)["records"].values()) > 0
    assert noise(run.stdout + run.stderr) == []
    log = Path(named_log(run.stderr)).read_text()
    assert spark_lines(log), "Spark's lines are in the log file instead"
    assert secret not in run.stdout + run.stderr + log
