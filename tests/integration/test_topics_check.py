"""Topic creation and `topics check` against the embedded broker (Tansu): it creates topics with
replication factor -1 and configs, and DescribeConfigs reports the configs a topic was created with
(nothing else: no broker defaults), so checks on unset configs are listed as not run."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.services.io import kafka
from streamjoin.services.broker import EmbeddedBroker
from streamjoin.settings import JobSettings, load
from streamjoin.topology import topics

runner = CliRunner()


def small_job(name: str, **extra: object) -> JobSettings:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 60_000}} for n in ("r", "s")]
    return load(None, job=name, partitions=4, streams=streams, **extra)


def reported(admin: AdminClient, name: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    return {k: e.value for k, e in admin.describe_configs([resource])[resource].result().items()}


def test_ensure_creates_topics_with_their_settings_and_check_finds_nothing(broker: EmbeddedBroker) -> None:
    job = small_job("clean")
    admin = kafka.Cluster(broker.bootstrap).admin()
    assert sorted(topics.ensure(admin, job)) == sorted(t.name for t in topics.plan(job))
    assert reported(admin, job.commits_topic) == reported(admin, job.changelog_topic) == {"cleanup.policy": "compact"}
    assert reported(admin, job.dead_letter_topic)["retention.ms"] == str(30 * 86_400_000)
    replicas = admin.list_topics(timeout=10).topics[job.results_topic].partitions[0].replicas
    assert len(replicas) == 1  # replication factor -1: the broker's default

    report = topics.audit(admin, job)
    assert report.findings == [] and report.brokers == 1
    assert {n.check: len(n.topics) for n in report.not_run} == {"retention.ms": 2, "min.insync.replicas": 10}


def test_a_ring_hop_topic_gets_the_ring_hop_settings(broker: EmbeddedBroker) -> None:
    job = small_job("ring")
    admin = kafka.Cluster(broker.bootstrap).admin()
    assert topics.create_missing(admin, [topics.hop_plan(job, "w0")]) == ["ring.ring.w0"]
    assert topics.create_missing(admin, [topics.hop_plan(job, "w0")]) == []  # already there: left alone
    assert reported(admin, "ring.ring.w0") == {"segment.ms": "600000", "cleanup.policy": "delete",
                                               "retention.ms": "3600000"}


def test_check_reports_dangerous_topics_made_by_someone_else(broker: EmbeddedBroker, tmp_path: Path) -> None:
    job = small_job("risky", topics={"min_insync_replicas": 1})
    admin = kafka.Cluster(broker.bootstrap).admin()
    premade = [NewTopic(job.results_topic, 3, -1, config={"cleanup.policy": "compact", "min.insync.replicas": "1"}),
               NewTopic("risky.r", 4, -1, config={"retention.ms": "1000", "min.insync.replicas": "1"}),
               NewTopic(job.commits_topic, 4, -1, config={"cleanup.policy": "delete", "retention.ms": "3600000",
                                                          "min.insync.replicas": "2"})]
    for fut in admin.create_topics(premade).values():
        fut.result()
    topics.create_missing(admin, topics.plan(job))

    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job.model_dump(mode="json", include={"job", "partitions", "streams", "topics"})))
    result = runner.invoke(app, ["topics", "check", "--job", str(path), "--bootstrap", broker.bootstrap, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert {(f["severity"], f["topic"], f["check"]) for f in report["findings"]} == {
        ("danger", "risky.results", "partitions"), ("danger", "risky.results", "cleanup.policy"),
        ("danger", "risky.r", "retention.ms"), ("danger", "risky.commits", "cleanup.policy"),
        ("danger", "risky.commits", "min.insync.replicas")}
    # Tansu reports only configs given at creation: risky.r's cleanup policy, and the retention of
    # risky.s (created by create_missing, cluster retention), cannot be checked.
    assert [(n["check"], n["topics"]) for n in report["not_run"]] == [("cleanup.policy", ["risky.r"]),
                                                                       ("retention.ms", ["risky.s"])]
