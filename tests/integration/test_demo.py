"""README command 1 in small: the demo end to end, real Spark `sources`
feeding real workers on the embedded broker, real Spark `verify` judging;
then its results topic read the way any consumer would, with a plain
confluent-kafka consumer and `json.loads` alone. Run as a command, so that
whatever Spark's JVM prints would reach its terminal: none of it may."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from streamjoin.job_files import default_job_file
from streamjoin.settings import load
from tests.integration.spark_output import named_log, noise, spark_lines

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def read_plainly(bootstrap: str, topic: str) -> list:
    """Every record of `topic`, with nothing of streamjoin's: a stock consumer to the end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "plain-reader", "enable.partition.eof": True,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records, ended = [], set()
        while len(ended) < len(partitions):
            for m in consumer.consume(1000, 1.0):
                if m.error() is None:
                    records.append(m)
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
        return records
    finally:
        consumer.close()


def run_demo(bootstrap: str, report: Path) -> subprocess.CompletedProcess:
    """`streamjoin demo` as a command, its stdout and stderr captured."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    # The demo job at a third of its rate for 8 s: fewer matches, so a smaller key domain keeps output.
    env["STREAMJOIN_WORKLOAD__DOMAIN"] = "65536"
    # 4 partitions, not the job's 60: Spark `verify` reads every partition of each topic, one task each.
    command = [sys.executable, "-c", "from streamjoin.cli import app; app()", "demo", "--seconds", "8",
               "--workers", "2", "--rate", "500", "--partitions", "4", "--report", str(report),
               "--bootstrap", bootstrap]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def test_demo_is_verified_exact_quiet_and_its_results_are_plain_json(broker, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run = run_demo(broker.bootstrap, report)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert noise(run.stdout + run.stderr) == [], "Spark's and Python's chatter belongs in the Spark log"
    data = json.loads(report.read_text())
    assert data["logs"]["spark"] == named_log(run.stderr) == json.loads(run.stdout)["logs"]["spark"]
    assert spark_lines(Path(data["logs"]["spark"]).read_text()), "Spark's lines are in the log file instead"
    assert data["verified"] is True
    assert data["missing"] == data["extra"] == data["duplicates"] == 0
    assert data["inputs"]["total"] > 5000
    assert data["results"] == data["expected"] > 1000
    assert 0 < data["delay_ms"]["p50"] <= data["delay_ms"]["p99"]
    assert report.with_suffix(".png").stat().st_size > 10_000

    job = load(default_job_file())  # the topics' names, and nothing else of streamjoin's
    results = [(m.key(), json.loads(m.value())) for m in read_plainly(broker.bootstrap, job.results_topic)]
    inputs = {(m.topic(), m.partition(), m.offset()): json.loads(m.value())
              for topic in job.input_topics for m in read_plainly(broker.bootstrap, topic)}
    assert len(results) == data["results"]
    assert len({r["result_id"] for _, r in results}) == len(results)
    for key, r in results:
        members = {s: inputs[(ref["topic"], ref["partition"], ref["offset"])] for s, ref in r["inputs"].items()}
        assert set(members) == {"r", "s"}
        for s, fields in members.items():
            assert r[s] == fields  # the result carries each input's fields as they were written
        assert r["r"]["k"] == r["s"]["k"] and key == str(r["r"]["k"]).encode()
        assert r["event_time"] == max(fields["ts"] for fields in members.values())
