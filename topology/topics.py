"""The job's topics: names from the settings, replication and topic configs
from the job's `topics:` section. This module plans them, creates the missing
ones, checks that the cluster's partition counts line up with the partition
groups, and audits the cluster for settings that endanger recovery or
exactness (`streamjoin topics check`).

Brokers answer DescribeConfigs differently: Apache Kafka reports every config
with its effective value; Tansu (the embedded broker) reports only the configs
a topic was created with. A check whose config the broker did not report is
listed as not run, with the reason, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from streamjoin.settings import JobSettings, TopicRole
from streamjoin.settings.topics import ALWAYS_COMPACTED, KEEP_FOREVER, NEVER_COMPACTED

Severity = Literal["danger", "warning"]
# Losing these loses exactness (results, recovery's commits, re-routed input): one copy is a danger.
RECOVERY_CRITICAL: frozenset[TopicRole] = frozenset({"results", "commits", "changelog", "by_key", "core_output"})
# Transient roles: a lost replica costs a resend, not data; replication is not checked for them.
TRANSIENT: frozenset[TopicRole] = frozenset({"control", "ring_hop"})


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True)
class TopicPlan:
    """One topic the job uses: its `role`, the `partitions`, `replication_factor` (-1 = the
    cluster's default) and topic `config` it is created with; `exact_partitions`: the job needs
    exactly `partitions` (False: any count works); `stream`: the stream an input or by-key topic carries."""

    name: str
    role: TopicRole
    partitions: int
    replication_factor: int
    config: dict[str, str]
    exact_partitions: bool = True
    stream: str | None = None


def plan(job: JobSettings) -> list[TopicPlan]:
    """Every topic the job creates (ring hop topics aside: one per ring node, see `hop_plan`)."""
    p = job.partitions
    # Only hash mode without repartitioning relies on the producers' partitioning; with `auto` a
    # stream of another partition count is re-routed through its by-key topic, and a ring reads everything.
    inputs_exact = job.join.mode == "hash" and job.join.repartition == "never"
    topics = [_planned(job, job.topic_of(s), "input", p, inputs_exact, s.name) for s in job.streams]
    groups = job.group_count  # per-group topics: the partition groups, then hash mode's slots (hot_key_slots)
    topics += [
        # partition g holds group g's results; SplitJoin's are in input order, so in one partition
        _planned(job, job.results_topic, "results", 1 if job.join.mode == "splitjoin" else groups),
        _planned(job, job.commits_topic, "commits", groups),  # partition g: group g's batch commits
        _planned(job, job.dead_letter_topic, "dead_letter", groups),
        _planned(job, job.control_topic, "control", 1),  # one partition: heartbeats and assignments in order
        _planned(job, job.placement_topic, "placement", 1),
    ]
    if job.join.mode == "hash":  # partition g: records re-routed to group g by their join key
        topics += [_planned(job, job.by_key_topic(s), "by_key", p, stream=s.name) for s in job.streams]
        if job.worker.changelog:  # partition g: group g's state writes
            topics.append(_planned(job, job.changelog_topic, "changelog", groups))
        if job.slots:  # partition j: what groups with a split hot key send slot P + j, kept like re-routed input
            topics.append(_planned(job, job.split_topic, "by_key", len(job.slots)))
    if job.join.mode == "ring":  # one partition each: rounds and epochs are read back in order
        topics += [_planned(job, job.ring_log_topic, "ring_log", 1), _planned(job, job.ring_epochs_topic, "ring_epochs", 1)]
    if job.join.mode == "splitjoin":
        cores = job.splitjoin.max_cores
        topics += [
            _planned(job, job.core_output_topic, "core_output", cores),  # partition i: core i's results, punctuated
            _planned(job, job.core_changelog_topic, "changelog", cores),  # partition i: core i's sub-window, checkpoints
            _planned(job, job.merger_topic, "commits", 1),  # the merger's checkpoints
        ]
    return topics


def queries_plan(job: JobSettings, sinks: list[str]) -> list[TopicPlan]:
    """The query service's topics: its registry (compacted like placement: the latest record per
    key) and the queries' sink topics (results: never compacted)."""
    return ([_planned(job, job.queries_topic, "placement", 1)]
            + [_planned(job, sink, "results", job.queries.operator_partitions, exact_partitions=False)
               for sink in sinks])


def hop_plan(job: JobSettings, node: str) -> TopicPlan:
    """Ring mode: `node`'s hop topic, one partition so its predecessor's messages stay in order."""
    return _planned(job, job.hop_topic(node), "ring_hop", 1)


def _planned(job: JobSettings, name: str, role: TopicRole, partitions: int, exact_partitions: bool = True,
             stream: str | None = None) -> TopicPlan:
    """A TopicPlan with `role`'s replication factor and configs from the job's `topics:` section."""
    settings = job.topics.for_role(role)
    return TopicPlan(name, role, partitions, settings.replication_factor, dict(settings.config), exact_partitions,
                     stream)


def create_missing(admin: AdminClient, wanted: list[TopicPlan], timeout: float = 30.0) -> list[str]:
    """Create the topics of `wanted` the cluster lacks, with their planned settings; returns the names created.

    `admin`: the cluster's admin client; `timeout`: seconds per admin request. Existing topics are
    left as they are (`audit` reports what is wrong with them); raises TopologyError when the
    broker refuses one."""
    existing = admin.list_topics(timeout=timeout).topics
    missing = [t for t in wanted if t.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics([NewTopic(t.name, t.partitions, t.replication_factor, config=t.config)
                                   for t in missing], operation_timeout=timeout)
    created: list[str] = []
    for name, fut in futures.items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as e:  # TOPIC_ALREADY_EXISTS from a concurrent creator is fine
            if "already exists" not in str(e).lower():
                raise TopologyError(f"cannot create topic {name}: {e}") from e
    return created


def ensure(admin: AdminClient, job: JobSettings, timeout: float = 30.0) -> list[str]:
    """Create `job`'s missing topics through `admin`, then `check` them all (`timeout`: seconds per
    admin request); returns the names created."""
    created = create_missing(admin, plan(job), timeout)
    check(admin, job, timeout)
    return created


def check(admin: AdminClient, job: JobSettings, timeout: float = 30.0) -> None:
    """Raise TopologyError when a topic of `job` is missing on the cluster `admin` talks to, or has a
    partition count the partition groups cannot work with (what a worker waits for at start);
    settings are `audit`'s business. `timeout`: seconds for the metadata request."""
    existing = admin.list_topics(timeout=timeout).topics
    for t in plan(job):
        if t.name not in existing:
            raise TopologyError(f"topic {t.name} is missing: run `streamjoin topics create`")
        have = len(existing[t.name].partitions)
        if t.exact_partitions and have != t.partitions:
            raise TopologyError(f"topic {t.name} has {have} partitions but the job needs {t.partitions}: "
                                f"{_why_partitions(t)}")


def _why_partitions(t: TopicPlan) -> str:
    """Why topic `t` must have exactly its planned partition count, for error messages."""
    if t.role == "input":
        return "with join.repartition: never, partition g of every input is partition group g"
    if t.partitions == 1:
        return "its records must stay in one order"
    return "partition g of it belongs to partition group g"


# ----------------------------------------------------------------- audit


@dataclass(frozen=True)
class Finding:
    """A topic setting that endangers recovery or exactness (`danger`) or may (`warning`)."""

    severity: Severity
    topic: str
    role: TopicRole
    check: str
    detail: str


@dataclass(frozen=True)
class Skipped:
    """A check that could not run on one topic, and why (the broker did not say)."""

    topic: str
    check: str
    reason: str


@dataclass(frozen=True)
class NotRun:
    """A check that could not run on `topics`, for one `reason`."""

    check: str
    topics: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Report:
    """What `audit` found: `brokers` in the cluster, `findings`, and the checks that could not run."""

    brokers: int
    findings: list[Finding]
    not_run: list[NotRun]

    @property
    def dangerous(self) -> bool:
        return any(f.severity == "danger" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"brokers": self.brokers, "dangerous": self.dangerous,
                "findings": [asdict(f) for f in self.findings],
                "not_run": [asdict(n) for n in self.not_run]}


@dataclass(frozen=True)
class Observed:
    """One existing topic as the cluster describes it: `partitions`, `replication_factor` (the
    fewest distinct brokers holding any partition), and `config` (None with `config_error`
    when DescribeConfigs failed)."""

    partitions: int
    replication_factor: int
    config: dict[str, str] | None
    config_error: str | None = None

    def value(self, key: str) -> str | None:
        """Config `key` as reported, None when the broker did not report it."""
        return None if self.config is None else self.config.get(key)

    def unknown(self, topic: str, key: str) -> Skipped:
        """The check of config `key` on `topic` could not run: the broker did not report it."""
        return Skipped(topic, key, self.config_error or f"the broker reported no {key} (some, Tansu among them, "
                                                        "report only the configs a topic was created with)")


def audit(admin: AdminClient, job: JobSettings, timeout: float = 30.0) -> Report:
    """Every topic `job` plans (and, in ring mode, every hop topic found) checked on the cluster
    `admin` talks to: missing topics, partition counts, cleanup policy, retention, replication and
    min.insync.replicas. `timeout`: seconds per admin request.

    Raises KafkaException only when the cluster does not answer metadata requests; a check the
    broker cannot answer is reported as not run."""
    metadata = admin.list_topics(timeout=timeout)
    wanted = plan(job) + _hop_topics_found(job, metadata.topics)
    present = [t for t in wanted if t.name in metadata.topics]
    configs = _describe_configs(admin, [t.name for t in present], timeout)
    brokers = len(metadata.brokers)
    results: list[Finding | Skipped] = [
        Finding("danger", t.name, t.role, "missing", "the topic does not exist: run `streamjoin topics create`")
        for t in wanted if t.name not in metadata.topics]
    for t in present:
        seen = _observed(metadata.topics[t.name], configs[t.name])
        results += _topic_findings(job, t, seen, brokers)
    findings = [r for r in results if isinstance(r, Finding)]
    findings.sort(key=lambda f: (f.severity != "danger", f.topic, f.check))
    return Report(brokers, findings, _group_skipped([r for r in results if isinstance(r, Skipped)]))


def _hop_topics_found(job: JobSettings, existing: dict[str, Any]) -> list[TopicPlan]:
    """Ring mode: the hop topics among `existing` topic names; they exist per ring node, known
    only by their name `<job>.ring.<node>`."""
    if job.join.mode != "ring":
        return []
    prefix = job.hop_topic("")
    return [hop_plan(job, name[len(prefix):]) for name in sorted(existing) if name.startswith(prefix)]


def _describe_configs(admin: AdminClient, names: list[str], timeout: float) -> dict[str, dict[str, str] | str]:
    """Each topic of `names`'s reported configs, or the error text when the broker could not say
    (`timeout`: seconds for the request)."""
    if not names:
        return {}
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names],
                                         request_timeout=timeout)
    except KafkaException as e:  # a broker without DescribeConfigs: every config check is skipped
        return {n: f"DescribeConfigs failed: {e}" for n in names}
    out: dict[str, dict[str, str] | str] = {}
    for resource, fut in futures.items():
        try:
            # Sensitive configs come back without a value; none of ours is sensitive.
            out[resource.name] = {k: e.value for k, e in fut.result().items() if e.value is not None}
        except KafkaException as e:
            out[resource.name] = f"DescribeConfigs failed: {e}"
    return out


def _observed(metadata: Any, config: dict[str, str] | str) -> Observed:
    """An Observed from a topic's metadata (confluent_kafka TopicMetadata) and its reported config
    (a dict, or the error text). Tansu lists one broker several times for a replication factor
    above its broker count, so replicas are counted as distinct brokers."""
    replicas = min((len(set(p.replicas)) for p in metadata.partitions.values()), default=0)
    if isinstance(config, str):
        return Observed(len(metadata.partitions), replicas, None, config_error=config)
    return Observed(len(metadata.partitions), replicas, config)


def _topic_findings(job: JobSettings, t: TopicPlan, seen: Observed, brokers: int) -> list[Finding | Skipped]:
    """Every check of the existing topic `t` of `job`, as `seen` on a cluster of `brokers` brokers."""
    return (_partition_findings(t, seen) + _cleanup_findings(t, seen) + _retention_findings(job, t, seen)
            + _replication_findings(t, seen, brokers) + _insync_findings(t, seen))


def _partition_findings(t: TopicPlan, seen: Observed) -> list[Finding | Skipped]:
    """A partition count other than planned, where the job needs exactly that (`t` planned, `seen` observed)."""
    if not t.exact_partitions or seen.partitions == t.partitions:
        return []
    return [Finding("danger", t.name, t.role, "partitions",
                    f"{seen.partitions} partitions, the job needs {t.partitions}: {_why_partitions(t)}")]


def _cleanup_findings(t: TopicPlan, seen: Observed) -> list[Finding | Skipped]:
    """Compaction where records share keys; time deletion where recovery needs the latest record per
    key (`t` planned, `seen` observed)."""
    if t.role not in NEVER_COMPACTED | ALWAYS_COMPACTED:
        return []
    policy = seen.value("cleanup.policy")
    if policy is None:
        return [seen.unknown(t.name, "cleanup.policy")]
    if t.role in NEVER_COMPACTED:
        if "compact" not in policy:
            return []
        return [Finding("danger", t.name, t.role, "cleanup.policy",
                        f"cleanup.policy={policy}: compaction keeps one record per key and drops the rest")]
    retention = seen.value("retention.ms")
    if "delete" in policy and retention != str(KEEP_FOREVER):
        return [Finding("danger", t.name, t.role, "cleanup.policy",
                        f"cleanup.policy={policy} with retention.ms={retention or 'unreported'}: a group quiet for "
                        "longer loses its latest record, which recovery needs; use compact")]
    if "compact" not in policy:
        return [Finding("warning", t.name, t.role, "cleanup.policy",
                        f"cleanup.policy={policy}, kept forever: recovery reads every record ever written; use compact")]
    return []


def _retention_findings(job: JobSettings, t: TopicPlan, seen: Observed) -> list[Finding | Skipped]:
    """Input and by-key records (`t` planned, `seen` observed) must outlive their stream's window in
    `job` plus the allowed lateness (a window rebuilt from them), and a worker's outage
    (`topics.outage_margin_ms`) on top."""
    if t.stream is None:
        return []
    text = seen.value("retention.ms")
    if text is None:
        return [seen.unknown(t.name, "retention.ms")]
    retention = _as_int(text)
    if retention is None:
        return [Skipped(t.name, "retention.ms", f"retention.ms {text!r} is not a number")]
    window = next(s.window for s in job.streams if s.name == t.stream)
    if retention == KEEP_FOREVER:
        return []
    if window is None:  # an as-of join: its table's versions are read from the start on a first start
        if t.stream != job.join.table:
            return []
        return [Finding("warning", t.name, t.role, "retention.ms",
                        f"retention.ms={retention} on an as-of join's table: a row not updated for that long is "
                        "deleted from the topic, and a group rebuilt from it would not know it (compact the topic, "
                        "cleanup.policy=compact, or keep it forever)")]
    if window.span_ms is None:
        return [Finding("warning", t.name, t.role, "retention.ms",
                        f"retention.ms={retention} with a count window ({window.rows} rows): a rare key's rows "
                        "can be older than that, and a rebuilt window would miss them")]
    needed = window.span_ms + job.join.allowed_lateness_ms
    if retention < needed:
        return [Finding("danger", t.name, t.role, "retention.ms",
                        f"retention.ms={retention} < window {window.span_ms} + allowed lateness "
                        f"{job.join.allowed_lateness_ms}: records expire while a window still needs them")]
    if retention < needed + job.topics.outage_margin_ms:
        return [Finding("warning", t.name, t.role, "retention.ms",
                        f"retention.ms={retention} < window + lateness ({needed}) + topics.outage_margin_ms "
                        f"({job.topics.outage_margin_ms}): a worker down that long comes back to deleted input")]
    return []


def _replication_findings(t: TopicPlan, seen: Observed, brokers: int) -> list[Finding | Skipped]:
    """One copy (`seen`, of planned `t`) on a cluster of `brokers` that could hold more: losing that
    broker loses the topic."""
    if brokers <= 1 or seen.replication_factor > 1 or t.role in TRANSIENT:
        return []
    severity: Severity = "danger" if t.role in RECOVERY_CRITICAL else "warning"
    return [Finding(severity, t.name, t.role, "replication",
                    f"replication factor {seen.replication_factor} on a cluster of {brokers} brokers: "
                    "losing one broker loses the topic; set topics.replication_factor")]


def _insync_findings(t: TopicPlan, seen: Observed) -> list[Finding | Skipped]:
    """min.insync.replicas against the replication factor (`seen`, of planned `t`): writes with
    acks=all block when fewer replicas than it are in sync, and are acknowledged by that many copies only."""
    text = seen.value("min.insync.replicas")
    if text is None:
        return [seen.unknown(t.name, "min.insync.replicas")]
    insync, rf = _as_int(text), seen.replication_factor
    if insync is None:
        return [Skipped(t.name, "min.insync.replicas", f"min.insync.replicas {text!r} is not a number")]
    if insync > rf:
        return [Finding("danger", t.name, t.role, "min.insync.replicas",
                        f"min.insync.replicas={insync} > replication factor {rf}: every write fails")]
    if insync == rf and rf > 1:
        return [Finding("danger", t.name, t.role, "min.insync.replicas",
                        f"min.insync.replicas={insync} = replication factor: one broker down blocks every write")]
    if insync == 1 and rf >= 3:
        return [Finding("warning", t.name, t.role, "min.insync.replicas",
                        f"min.insync.replicas=1 with replication factor {rf}: an acknowledged write may exist "
                        "on one broker only; 2 is usual")]
    return []


def _as_int(text: str) -> int | None:
    """`text` as an integer, None when it is not one (brokers like Tansu store any text)."""
    try:
        return int(text)
    except ValueError:
        return None


def _group_skipped(skipped: list[Skipped]) -> list[NotRun]:
    """One NotRun per (check, reason) among `skipped`, naming every topic it applies to."""
    topics: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in skipped:
        topics[(s.check, s.reason)].append(s.topic)
    return [NotRun(check, tuple(names), reason) for (check, reason), names in topics.items()]
