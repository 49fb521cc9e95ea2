"""Topic planning, creation and `topics check`, against a fake admin client that answers like
Apache Kafka (every config reported, defaults included) unless a test makes it answer like Tansu."""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings, SettingsError, load
from streamjoin.topology import topics

runner = CliRunner()
DAY = 86_400_000
# What Apache Kafka reports for a topic that sets nothing (broker defaults; min.insync.replicas as
# clusters of three brokers usually set it).
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY), "min.insync.replicas": "2"}


@dataclass
class FakeTopic:
    partitions: int
    replication_factor: int
    config: dict[str, str] | Exception = field(default_factory=dict)


class FakeAdmin:
    """The AdminClient calls topology.topics makes: list_topics, create_topics, describe_configs.

    `reported`: "all" answers configs like Apache Kafka (defaults filled in), "set" like Tansu
    (only what the topic was created with); `describe_error`: describe_configs itself raises it."""

    def __init__(self, brokers: int = 3, reported: str = "all", describe_error: Exception | None = None) -> None:
        self.brokers, self.reported, self.describe_error = brokers, reported, describe_error
        self.topics: dict[str, FakeTopic] = {}
        self.created: list[Any] = []

    def list_topics(self, timeout: float) -> SimpleNamespace:
        parts = {n: SimpleNamespace(partitions={i: SimpleNamespace(replicas=list(range(t.replication_factor)))
                                                for i in range(t.partitions)})
                 for n, t in self.topics.items()}
        return SimpleNamespace(topics=parts, brokers={i: object() for i in range(self.brokers)})

    def create_topics(self, new_topics: list[Any], operation_timeout: float) -> dict[str, Future]:
        out = {}
        for nt in new_topics:
            self.created.append(nt)
            fut: Future = Future()
            if nt.topic in self.topics:
                fut.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "Topic already exists.")))
            else:
                rf = self.brokers if nt.replication_factor == -1 else nt.replication_factor
                self.topics[nt.topic] = FakeTopic(nt.num_partitions, rf, dict(nt.config))
                fut.set_result(None)
            out[nt.topic] = fut
        return out

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future]:
        if self.describe_error is not None:
            raise self.describe_error
        out = {}
        for r in resources:
            fut: Future = Future()
            config = self.topics[r.name].config
            if isinstance(config, Exception):
                fut.set_exception(config)
            else:
                shown = (KAFKA_DEFAULTS | config) if self.reported == "all" else config
                fut.set_result({k: SimpleNamespace(value=v) for k, v in shown.items()})
            out[r] = fut
        return out


def hash_job(**extra: Any) -> JobSettings:
    window = extra.pop("window", {"range_ms": 60_000})
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": window} for n in ("r", "s")]
    join = {"allowed_lateness_ms": 2000} | extra.pop("join", {})
    return load(None, job="t", partitions=4, streams=streams, join=join, **extra)


def ring_job() -> JobSettings:
    streams = [{"name": n, "fields": {"x": "int", "ts": "int"}, "time_field": "ts", "window": {"range_ms": 1000}}
               for n in ("r", "s")]
    return load(None, job="t", partitions=2, streams=streams,
                join={"mode": "ring", "predicate": [{"left": "r.x", "right": "s.x", "within": 1}]})


def healthy(job: JobSettings, brokers: int = 3) -> FakeAdmin:
    """A Kafka-like cluster with the job's topics created by `ensure`, replicated on every broker."""
    admin = FakeAdmin(brokers)
    topics.ensure(admin, job)  # type: ignore[arg-type]
    return admin


def found(report: topics.Report) -> set[tuple[str, str, str]]:
    return {(f.severity, f.topic, f.check) for f in report.findings}


# ------------------------------------------------------------------ plan


def test_plan_gives_every_role_its_settings() -> None:
    job = hash_job(topics={"replication_factor": 3, "min_insync_replicas": 2, "results": {"retention_ms": DAY}})
    by_name = {t.name: t for t in topics.plan(job)}
    assert {n: t.role for n, t in by_name.items()} == {
        "t.r": "input", "t.s": "input", "t.results": "results", "t.commits": "commits", "t.dead-letter": "dead_letter",
        "t.control": "control", "t.placement": "placement", "t.r.by-key": "by_key", "t.s.by-key": "by_key",
        "t.changelog": "changelog"}
    assert {t.replication_factor for t in by_name.values()} == {3}
    assert by_name["t.results"].config == {"cleanup.policy": "delete", "retention.ms": str(DAY),
                                           "min.insync.replicas": "2"}
    assert by_name["t.commits"].config == by_name["t.changelog"].config == {"cleanup.policy": "compact",
                                                                            "min.insync.replicas": "2"}
    assert by_name["t.changelog"].partitions == 4
    assert by_name["t.control"].partitions == by_name["t.placement"].partitions == 1
    assert by_name["t.r.by-key"].stream == "r" and by_name["t.r.by-key"].partitions == 4


def test_replication_defaults_to_the_cluster_and_role_defaults_apply() -> None:
    by_role = {t.role: t for t in topics.plan(hash_job())}
    assert {t.replication_factor for t in by_role.values()} == {-1}
    assert by_role["dead_letter"].config == {"cleanup.policy": "delete", "retention.ms": str(30 * DAY)}
    assert by_role["by_key"].config == {"cleanup.policy": "delete", "retention.ms": str(7 * DAY)}
    assert by_role["control"].config == {"segment.ms": "600000", "cleanup.policy": "delete", "retention.ms": "3600000"}
    assert "min.insync.replicas" not in by_role["results"].config


@pytest.mark.parametrize("repartition, exact", [("never", True), ("auto", False)])
def test_input_partitions_are_fixed_only_without_repartitioning(repartition: str, exact: bool) -> None:
    inputs = [t for t in topics.plan(hash_job(join={"repartition": repartition})) if t.role == "input"]
    assert [t.exact_partitions for t in inputs] == [exact, exact]


def test_ring_plan_has_no_by_key_topics_and_hop_topics_follow_ring_hop_settings() -> None:
    job = ring_job()
    assert not {"by_key", "changelog"} & {t.role for t in topics.plan(job)}
    assert not any(t.exact_partitions for t in topics.plan(job) if t.role == "input")
    hop = topics.hop_plan(job, "w1")
    assert (hop.name, hop.role, hop.partitions, hop.config["retention.ms"]) == ("t.ring.w1", "ring_hop", 1, "3600000")


# ------------------------------------------------------------------ create


def test_ensure_creates_missing_topics_with_their_settings_and_leaves_others() -> None:
    job = hash_job(topics={"replication_factor": 2})
    admin = FakeAdmin()
    admin.topics["t.r"] = FakeTopic(4, 1, {"retention.ms": "5"})
    created = topics.ensure(admin, job)  # type: ignore[arg-type]
    assert "t.r" not in created and len(created) == len(topics.plan(job)) - 1
    made = {nt.topic: nt for nt in admin.created}
    assert made["t.commits"].replication_factor == 2
    assert made["t.commits"].config == {"cleanup.policy": "compact"}
    assert admin.topics["t.r"].config == {"retention.ms": "5"}


def test_a_concurrent_creator_is_fine() -> None:
    job = hash_job()
    admin = FakeAdmin()
    admin.topics["t.results"] = FakeTopic(4, 3)
    # The cluster listing misses it (created between list and create): create answers "already exists".
    admin.list_topics = lambda timeout, real=admin.list_topics: SimpleNamespace(  # type: ignore[method-assign]
        topics={k: v for k, v in real(timeout).topics.items() if k != "t.results"}, brokers={})
    assert "t.results" not in topics.create_missing(admin, topics.plan(job))  # type: ignore[arg-type]


def test_check_raises_on_wrong_partitions_of_a_fixed_topic_only() -> None:
    job = hash_job()
    admin = healthy(job)
    admin.topics["t.r"].partitions = 7  # repartition: auto takes any count
    topics.check(admin, job)  # type: ignore[arg-type]
    admin.topics["t.dead-letter"].partitions = 7
    with pytest.raises(topics.TopologyError, match="t.dead-letter has 7 partitions but the job needs 4"):
        topics.check(admin, job)  # type: ignore[arg-type]


def test_a_hop_topic_is_created_from_its_plan() -> None:
    admin = FakeAdmin()
    # What services/ring/node.py's ensure_hop_topic does (that module is not importable at this commit).
    topics.create_missing(admin, [topics.hop_plan(ring_job(), "w2")])  # type: ignore[arg-type]
    assert admin.topics["t.ring.w2"].partitions == 1
    assert admin.topics["t.ring.w2"].config == {"segment.ms": "600000", "cleanup.policy": "delete",
                                                "retention.ms": "3600000"}


# ------------------------------------------------------------------ audit


def test_a_healthy_cluster_has_no_findings() -> None:
    job = hash_job()
    report = topics.audit(healthy(job), job)  # type: ignore[arg-type]
    assert (report.findings, report.not_run, report.dangerous, report.brokers) == ([], [], False, 3)


def _topic(admin: FakeAdmin, name: str, **change: Any) -> FakeAdmin:
    t = admin.topics[name]
    for key, value in change.items():
        if key in ("partitions", "replication_factor"):
            setattr(t, key, value)
        else:
            t.config[key.replace("_", ".")] = value  # type: ignore[index]
    return admin


@pytest.mark.parametrize("job_extra, topic, change, expected", [
    ({}, "t.results", {"partitions": 3}, ("danger", "partitions")),
    ({"join": {"repartition": "never"}}, "t.s", {"partitions": 3}, ("danger", "partitions")),
    ({}, "t.control", {"partitions": 2}, ("danger", "partitions")),
    ({}, "t.results", {"cleanup_policy": "compact"}, ("danger", "cleanup.policy")),
    ({}, "t.dead-letter", {"cleanup_policy": "compact,delete"}, ("danger", "cleanup.policy")),
    ({}, "t.r.by-key", {"cleanup_policy": "compact"}, ("danger", "cleanup.policy")),
    ({}, "t.r", {"cleanup_policy": "compact"}, ("danger", "cleanup.policy")),
    ({}, "t.commits", {"cleanup_policy": "delete"}, ("danger", "cleanup.policy")),
    ({}, "t.commits", {"cleanup_policy": "compact,delete", "retention_ms": str(DAY)}, ("danger", "cleanup.policy")),
    ({}, "t.placement", {"cleanup_policy": "delete", "retention_ms": str(30 * DAY)}, ("danger", "cleanup.policy")),
    ({}, "t.commits", {"cleanup_policy": "delete", "retention_ms": "-1"}, ("warning", "cleanup.policy")),
    ({}, "t.r", {"retention_ms": "61000"}, ("danger", "retention.ms")),
    ({}, "t.s.by-key", {"retention_ms": "1000"}, ("danger", "retention.ms")),
    ({}, "t.r", {"retention_ms": str(DAY)}, ("warning", "retention.ms")),
    ({}, "t.results", {"replication_factor": 1, "min_insync_replicas": "1"}, ("danger", "replication")),
    ({}, "t.commits", {"replication_factor": 1, "min_insync_replicas": "1"}, ("danger", "replication")),
    ({}, "t.r.by-key", {"replication_factor": 1, "min_insync_replicas": "1"}, ("danger", "replication")),
    ({}, "t.dead-letter", {"replication_factor": 1, "min_insync_replicas": "1"}, ("warning", "replication")),
    ({}, "t.results", {"min_insync_replicas": "4"}, ("danger", "min.insync.replicas")),
    ({}, "t.results", {"min_insync_replicas": "3"}, ("danger", "min.insync.replicas")),
    ({}, "t.commits", {"min_insync_replicas": "1"}, ("warning", "min.insync.replicas")),
])
def test_each_dangerous_setting_is_found(job_extra: dict, topic: str, change: dict, expected: tuple) -> None:
    job = hash_job(**job_extra)
    report = topics.audit(_topic(healthy(job), topic, **change), job)  # type: ignore[arg-type]
    assert found(report) == {(expected[0], topic, expected[1])}
    assert report.dangerous == (expected[0] == "danger")
    assert report.not_run == []


@pytest.mark.parametrize("topic, change", [
    ("t.r", {"retention_ms": "-1"}),  # kept forever
    ("t.r", {"retention_ms": str(62_000 + DAY)}),  # window + lateness + outage margin exactly
    ("t.commits", {"cleanup_policy": "compact,delete", "retention_ms": "-1"}),
    ("t.control", {"cleanup_policy": "compact", "replication_factor": 1, "min_insync_replicas": "1"}),
    ("t.results", {"replication_factor": 2, "min_insync_replicas": "1"}),
])
def test_safe_settings_are_not_reported(topic: str, change: dict) -> None:
    job = hash_job()
    assert topics.audit(_topic(healthy(job), topic, **change), job).findings == []  # type: ignore[arg-type]


def test_count_windows_warn_on_any_finite_retention() -> None:
    job = hash_job(window={"rows": 10})
    admin = _topic(healthy(job), "t.r", retention_ms="-1")
    assert found(topics.audit(admin, job)) == {  # type: ignore[arg-type]
        ("warning", t, "retention.ms") for t in ("t.s", "t.r.by-key", "t.s.by-key")}


def test_one_broker_with_one_replica_is_no_finding() -> None:
    job = hash_job()
    admin = healthy(job, brokers=1)
    for t in admin.topics.values():
        t.config["min.insync.replicas"] = "1"  # type: ignore[index]
    assert topics.audit(admin, job).findings == []  # type: ignore[arg-type]


def test_missing_topics_are_dangers() -> None:
    job = hash_job()
    admin = healthy(job)
    del admin.topics["t.commits"], admin.topics["t.s"]
    assert found(topics.audit(admin, job)) == {  # type: ignore[arg-type]
        ("danger", "t.commits", "missing"), ("danger", "t.s", "missing")}


def test_ring_hop_topics_are_found_by_name_and_checked() -> None:
    job = ring_job()
    admin = healthy(job)
    topics.create_missing(admin, [topics.hop_plan(job, "w0")])  # type: ignore[arg-type]
    _topic(admin, "t.ring.w0", cleanup_policy="compact", min_insync_replicas="5")
    assert found(topics.audit(admin, job)) == {  # type: ignore[arg-type]
        ("danger", "t.ring.w0", "cleanup.policy"), ("danger", "t.ring.w0", "min.insync.replicas")}


# ------------------------------------------------------------------ a broker that cannot say


def test_unreported_configs_are_listed_as_not_run() -> None:
    job = hash_job()
    admin = healthy(job, brokers=1)
    admin.reported = "set"  # Tansu: only the configs given at creation
    report = topics.audit(admin, job)  # type: ignore[arg-type]
    assert report.findings == []
    not_run = {n.check: set(n.topics) for n in report.not_run}
    assert not_run == {"retention.ms": {"t.r", "t.s"}, "min.insync.replicas": {t.name for t in topics.plan(job)}}
    assert all("reported no" in n.reason for n in report.not_run)


def test_describe_configs_failing_skips_the_config_checks_but_not_the_others() -> None:
    job = hash_job()
    admin = healthy(job)
    admin.describe_error = KafkaException(KafkaError(KafkaError._UNSUPPORTED_FEATURE, "no DescribeConfigs"))
    admin.topics["t.results"].partitions = 9
    report = topics.audit(admin, job)  # type: ignore[arg-type]
    assert found(report) == {("danger", "t.results", "partitions")}
    assert {n.check for n in report.not_run} == {"cleanup.policy", "retention.ms", "min.insync.replicas"}
    assert all("no DescribeConfigs" in n.reason for n in report.not_run)


def test_one_topic_failing_to_describe_skips_only_that_topic() -> None:
    job = hash_job()
    admin = healthy(job)
    admin.topics["t.commits"].config = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
    _topic(admin, "t.results", cleanup_policy="compact")
    report = topics.audit(admin, job)  # type: ignore[arg-type]
    assert found(report) == {("danger", "t.results", "cleanup.policy")}
    assert {(n.check, n.topics) for n in report.not_run} == {
        ("cleanup.policy", ("t.commits",)), ("min.insync.replicas", ("t.commits",))}


def test_a_config_that_is_not_a_number_is_not_run() -> None:
    job = hash_job()
    report = topics.audit(_topic(healthy(job), "t.r", retention_ms="soon"), job)  # type: ignore[arg-type]
    assert [(n.check, n.topics) for n in report.not_run] == [("retention.ms", ("t.r",))]


# ------------------------------------------------------------------ CLI


@pytest.fixture
def cli_admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    """The admin client every `streamjoin` command gets; starts as a healthy cluster for the default job."""
    admin = healthy(hash_job())
    monkeypatch.setattr(kafka.Cluster, "admin", lambda self: admin)
    return admin


def _check(tmp_path: Any, *flags: str) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(hash_job().model_dump(mode="json", include={"job", "partitions", "streams", "join"})))
    return runner.invoke(app, ["topics", "check", "--job", str(path), "--bootstrap", "x:1", *flags])


def test_cli_check_exits_0_on_warnings_and_1_on_dangers(cli_admin: FakeAdmin, tmp_path: Any) -> None:
    _topic(cli_admin, "t.commits", min_insync_replicas="1")
    result = _check(tmp_path)
    assert result.exit_code == 0, result.output
    assert "warning" in result.stdout and "t.commits" in result.stdout
    _topic(cli_admin, "t.results", cleanup_policy="compact")
    result = _check(tmp_path)
    assert result.exit_code == 1, result.output
    assert "1 danger(s), 1 warning(s)" in result.stdout


def test_cli_check_json(cli_admin: FakeAdmin, tmp_path: Any) -> None:
    cli_admin.reported = "set"
    _topic(cli_admin, "t.r", retention_ms="1000")
    result = _check(tmp_path, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["dangerous"] is True
    assert [(f["topic"], f["check"], f["severity"]) for f in report["findings"]] == [("t.r", "retention.ms", "danger")]
    assert {n["check"] for n in report["not_run"]} == {"retention.ms", "min.insync.replicas"}


def test_cli_check_without_an_answering_cluster_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    def no_answer(timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))

    monkeypatch.setattr(kafka.Cluster, "admin", lambda self: SimpleNamespace(list_topics=no_answer))
    result = _check(tmp_path)
    assert result.exit_code == 1
    assert "did not answer" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------ settings


def test_environment_sets_topic_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_TOPICS__REPLICATION_FACTOR", "3")
    monkeypatch.setenv("STREAMJOIN_TOPICS__DEAD_LETTER__RETENTION_MS", str(90 * DAY))
    monkeypatch.setenv("STREAMJOIN_TOPICS__RESULTS__EXTRA__MAX_MESSAGE_BYTES", "2000000")
    job = hash_job(topics={"results": {"min_insync_replicas": 2}})
    assert job.topics.for_role("dead_letter").config["retention.ms"] == str(90 * DAY)
    assert job.topics.for_role("results").config == {"max.message.bytes": "2000000", "cleanup.policy": "delete",
                                                     "min.insync.replicas": "2"}
    assert job.topics.for_role("control").replication_factor == 3


def test_role_overrides_win_over_cluster_wide_values() -> None:
    job = hash_job(topics={"replication_factor": 3, "min_insync_replicas": 2,
                           "control": {"replication_factor": 1, "min_insync_replicas": 1}})
    assert (job.topics.for_role("control").replication_factor, job.topics.for_role("commits").replication_factor) == (1, 3)
    assert job.topics.for_role("control").config["min.insync.replicas"] == "1"


@pytest.mark.parametrize("section, words", [
    ({"results": {"cleanup_policy": "compact"}}, "topics.results.cleanup_policy compact"),
    ({"by_key": {"cleanup_policy": "compact,delete"}}, "topics.by_key.cleanup_policy"),
    ({"commits": {"cleanup_policy": "delete"}}, "topics.commits.cleanup_policy delete"),
    ({"placement": {"cleanup_policy": "compact,delete"}}, "topics.placement.cleanup_policy"),
    ({"commits": {"retention_ms": DAY}}, "topics.commits.retention_ms"),
    ({"replication_factor": 2, "min_insync_replicas": 2},
     "topics.min_insync_replicas 2 with topics.replication_factor 2: one broker down"),
    ({"min_insync_replicas": 2, "control": {"replication_factor": 1}},
     "topics.min_insync_replicas 2 with topics.control.replication_factor 1: every write would fail"),
    ({"input": {"retention_ms": 61_999}}, "topics.input.retention_ms 61999 is shorter"),
    ({"by_key": {"retention_ms": 1000}}, "topics.by_key.retention_ms 1000 is shorter"),
    ({"dead_letter": {"retention_ms": 0}}, "topics.dead_letter.retention_ms"),
    ({"results": {"extra": {"retention.ms": 5}}}, "extra sets retention.ms: give `retention_ms`"),
    ({"ring_hop": {"colour": "red"}}, "topics.ring_hop.colour"),
])
def test_invalid_topic_settings_exit_2_naming_the_field(tmp_path: Any, section: dict, words: str) -> None:
    data = hash_job().model_dump(mode="json", include={"job", "partitions", "streams", "join"}) | {"topics": section}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["topics", "check", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_by_key_retention_is_checked_in_hash_mode_only() -> None:
    week_window = {"range_ms": 8 * 7 * DAY}
    with pytest.raises(SettingsError, match="topics.by_key.retention_ms 604800000 is shorter"):
        hash_job(window=week_window)
    ring = ring_job().model_dump(include={"job", "partitions", "streams", "join"})
    ring["streams"][0]["window"] = week_window
    assert load(None, **ring).topics.for_role("by_key").config["retention.ms"] == str(7 * DAY)


def test_an_asof_joins_table_warns_on_finite_retention_and_its_stream_does_not() -> None:
    job = hash_job(window=None, join={"table": "s"})
    assert found(topics.audit(healthy(job), job)) == {  # type: ignore[arg-type]
        ("warning", t, "retention.ms") for t in ("t.s", "t.s.by-key")}
    admin = _topic(_topic(healthy(job), "t.s", retention_ms="-1"), "t.s.by-key", retention_ms="-1")
    assert topics.audit(admin, job).findings == []  # type: ignore[arg-type]
