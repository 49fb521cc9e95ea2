"""The job's topics: their names (`TopicNames`, derived from the job's name, streams and
output) and the job file's `topics:` section, how they are created.

Cluster-wide `replication_factor` and `min_insync_replicas` (unset = the
cluster's own defaults), and per role (`input`, `results`, `commits`, `changelog`,
`dead_letter`, `control`, `placement`, `by_key`, `ring_hop`, `ring_log`, `ring_epochs`) overrides of
those two plus `retention_ms`, `cleanup_policy` and free-form `extra` topic
configs. A field left unset takes the role's default (ROLE_DEFAULTS, reasons
there). Settings that would endanger recovery or exactness are rejected at
load; `streamjoin topics check` looks for the same dangers on the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from streamjoin.settings.base import StrictModel

if TYPE_CHECKING:
    from streamjoin.settings.output import OutputSpec
    from streamjoin.settings.streams import StreamSpec

TopicRole = Literal["input", "results", "commits", "changelog", "dead_letter", "control", "placement", "by_key",
                    "ring_hop", "ring_log", "ring_epochs", "core_output"]
ROLES: tuple[TopicRole, ...] = get_args(TopicRole)
CleanupPolicy = Literal["delete", "compact", "compact,delete"]
TopicConfigValue = str | int | float | bool
# NewTopic's replication factor that asks the broker for its `default.replication.factor`.
CLUSTER_DEFAULT_REPLICATION = -1
KEEP_FOREVER = -1  # retention.ms -1: time never deletes a record

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Roles whose records are keyed by something other than "the latest value wins": compaction would
# drop records that share a key (results share a join key, inputs and dead letters a user's key,
# hop messages and re-routed records have no key, and a compacted topic refuses unkeyed writes).
NEVER_COMPACTED: frozenset[TopicRole] = frozenset({"input", "results", "dead_letter", "by_key", "ring_hop",
                                                   "ring_log", "core_output"})
# Roles recovery reads for the latest record per key (group, node, partition group): only
# compaction keeps that record however old it is.
ALWAYS_COMPACTED: frozenset[TopicRole] = frozenset({"commits", "changelog", "placement"})
# Topic configs with a typed field of their own: `extra` may not set them behind the validation's back.
TYPED_CONFIGS = {"cleanup.policy": "cleanup_policy", "retention.ms": "retention_ms",
                 "min.insync.replicas": "min_insync_replicas", "replication.factor": "replication_factor"}


class RoleTopics(StrictModel):
    """Settings for every topic of one role; None = the role's default (ROLE_DEFAULTS), else the
    cluster-wide `topics.replication_factor` / `topics.min_insync_replicas`, else the cluster's."""

    replication_factor: int | None = Field(
        default=None, ge=1, description="this role's replication factor (unset: topics.replication_factor)")
    min_insync_replicas: int | None = Field(
        default=None, ge=1,
        description="this role's min.insync.replicas (unset: topics.min_insync_replicas); below the replication "
                    "factor, or one broker down blocks every write")
    retention_ms: int | None = Field(default=None, ge=KEEP_FOREVER, description="-1 = keep forever")
    cleanup_policy: CleanupPolicy | None = Field(
        default=None,
        description="this role's cleanup.policy (unset: the role's default); roles whose records share keys "
                    "refuse compaction, roles recovery reads per key need it")
    extra: dict[str, TopicConfigValue] = Field(
        default_factory=dict, description="other topic configs (segment.ms, max.message.bytes, ...); `_` stands for `.`")

    @field_validator("extra", mode="before")
    @classmethod
    def _dotted(cls, v: Any) -> Any:
        """Topic config names use dots; environment variables cannot, so `_` stands for `.`."""
        return {str(k).lower().replace("_", "."): x for k, x in v.items()} if isinstance(v, dict) else v

    @field_validator("extra")
    @classmethod
    def _untyped_only(cls, v: dict[str, TopicConfigValue]) -> dict[str, TopicConfigValue]:
        typed = sorted(set(v) & set(TYPED_CONFIGS))
        if typed:
            raise ValueError("; ".join(f"extra sets {k}: give `{TYPED_CONFIGS[k]}` instead" for k in typed))
        return v

    @field_validator("retention_ms")
    @classmethod
    def _not_zero(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("retention_ms 0 would delete records at once: give a positive number of ms or -1 (forever)")
        return v


# Defaults per role, and why (docs/operations/kafka.md's table repeats these):
#   input       delete, cluster retention: the user's data; we only create missing input topics.
#               `topics check` wants retention >= window + lateness (+ topics.outage_margin_ms).
#   results     delete, cluster retention: what consumers read; never compacted (results share keys).
#   commits     compact: recovery needs the latest batch commit per group (key = group) and the latest
#               round release per node however old; compaction keeps exactly those, time retention would not.
#   changelog   compact: a group's state writes, key = the state key; a dropped block is a tombstone, so
#               compaction keeps the live window and the latest checkpoint per group, however old.
#   placement   compact: the coordinator restarts from the latest owner per partition group (key = group).
#   control     delete, 1 h, 10-min segments: heartbeats and assignments are level-triggered (the
#               coordinator resends what a heartbeat shows is stale); readers start at the end, ring
#               workers read it from the start, so a short log also keeps their start quick.
#   dead_letter delete, 30 days: records nobody processed; an operator must have time to inspect and
#               replay them, longer than the usual 7-day cluster default.
#   by_key      delete, 7 days (set explicitly, not the cluster's): re-routed input records. Kafka Streams
#               keeps repartition topics forever and purges them (DeleteRecords) after each commit;
#               we do not purge (Tansu has no DeleteRecords), so retention bounds the topic and must
#               cover what recovery re-reads: the window, the lateness and a worker's outage.
#   ring_hop    delete, 1 h, 10-min segments: a hop message is read within a round trip; after a
#               crash the ring rolls back and re-drives from the round log, never from old hop messages.
#   ring_log    delete, 7 days: every round the head released, read back after a crash to rebuild the
#               nodes' slices from the last checkpoint; must cover the window, the lateness and an outage.
#   ring_epochs compact: node starts (one key per incarnation) and the latest checkpoint (one key); a
#               restarted node reads it whole, so only the newest checkpoint is worth keeping.
ROLE_DEFAULTS: dict[TopicRole, RoleTopics] = {
    "input": RoleTopics(cleanup_policy="delete"),
    "results": RoleTopics(cleanup_policy="delete"),
    "commits": RoleTopics(cleanup_policy="compact"),
    "changelog": RoleTopics(cleanup_policy="compact"),
    "placement": RoleTopics(cleanup_policy="compact"),
    "control": RoleTopics(cleanup_policy="delete", retention_ms=HOUR_MS, extra={"segment.ms": 10 * 60_000}),
    "dead_letter": RoleTopics(cleanup_policy="delete", retention_ms=30 * DAY_MS),
    "by_key": RoleTopics(cleanup_policy="delete", retention_ms=7 * DAY_MS),
    "ring_hop": RoleTopics(cleanup_policy="delete", retention_ms=HOUR_MS, extra={"segment.ms": 10 * 60_000}),
    "ring_log": RoleTopics(cleanup_policy="delete", retention_ms=7 * DAY_MS),
    "ring_epochs": RoleTopics(cleanup_policy="compact"),
    # SplitJoin cores' results and punctuations: the merger re-reads them after a restart.
    "core_output": RoleTopics(cleanup_policy="delete", retention_ms=7 * DAY_MS),
}


@dataclass(frozen=True)
class TopicSettings:
    """What one role's topics are created with: `replication_factor` (-1 = the cluster's
    default.replication.factor) and `config`, the topic configs as Kafka spells them."""

    replication_factor: int
    config: dict[str, str]


class TopicsSpec(StrictModel):
    """How the job's topics are created (`streamjoin topics create`, the coordinator, ring workers).

    `replication_factor` / `min_insync_replicas`: for every role that does not set its own; unset =
    the cluster's default.replication.factor / min.insync.replicas. `outage_margin_ms`: how long a
    worker may be down with its input unread; `topics check` warns when an input or by-key topic's
    retention does not cover window + lateness + this margin (default 1 day: a worker that died in
    the night is back in recovery the next day). Per role: see ROLE_DEFAULTS."""

    replication_factor: int | None = Field(
        default=None, ge=1,
        description="the replication factor of every role that sets none (unset: the cluster's "
                    "default.replication.factor)")
    min_insync_replicas: int | None = Field(
        default=None, ge=1,
        description="min.insync.replicas of every role that sets none (unset: the cluster's)")
    outage_margin_ms: int = Field(
        default=DAY_MS, ge=0,
        description="how long a worker may be down with its input unread: `topics check` warns when input or "
                    "by-key retention does not cover the window plus the lateness plus this")
    input: RoleTopics = Field(default=RoleTopics(),
                              description="the stream topics the job reads (created only when missing)")
    results: RoleTopics = Field(default=RoleTopics(),
                                description="the results topic (output.topic, default `<job>.results`) and the query "
                                            "service's sink topics")
    commits: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.commits` (batch commits, watermarks, ring releases) and `<job>.merger` (the SplitJoin "
                    "merger's checkpoints), which recovery reads")
    changelog: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.changelog` (hash mode: each group's state writes) and `<job>.splitjoin.changelog` (each "
                    "SplitJoin core's sub-window and checkpoints), which state is rebuilt from")
    dead_letter: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.dead-letter`: records that did not join (late, malformed, oversize, ...), to inspect "
                    "and replay")
    control: RoleTopics = Field(default=RoleTopics(),
                                description="`<job>.control`: heartbeats, assignments and operators' requests")
    placement: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.placement` (the owner of every partition group, read back by a restarted coordinator) "
                    "and `<job>.queries` (the query service's registry)")
    by_key: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.<stream>.by-key` (hash mode): records re-routed to their join key's partition")
    ring_hop: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.ring.<node>` (ring mode): the hop messages a ring node reads from its predecessor")
    ring_log: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.ring-rounds` (ring mode): every round the head released, read back after a crash")
    ring_epochs: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.ring-epochs` (ring mode): node starts, hand-overs to standbys and checkpoints")
    core_output: RoleTopics = Field(
        default=RoleTopics(),
        description="`<job>.splitjoin.out` (splitjoin mode): the cores' results and punctuations, which the merger "
                    "re-reads after a restart")

    def effective(self, role: TopicRole) -> RoleTopics:
        """`role`'s settings with every unset field filled: its own, else cluster-wide, else the role's default."""
        given, default = getattr(self, role), ROLE_DEFAULTS[role]
        return RoleTopics(
            replication_factor=_first(given.replication_factor, self.replication_factor),
            min_insync_replicas=_first(given.min_insync_replicas, self.min_insync_replicas),
            retention_ms=_first(given.retention_ms, default.retention_ms),
            cleanup_policy=_first(given.cleanup_policy, default.cleanup_policy),
            extra=default.extra | given.extra,
        )

    def for_role(self, role: TopicRole) -> TopicSettings:
        """The replication factor and topic configs `role`'s topics are created with."""
        eff = self.effective(role)
        config = {k: _config_text(v) for k, v in eff.extra.items()}
        config["cleanup.policy"] = str(eff.cleanup_policy)
        # retention.ms only governs deletion; on a compact-only topic it would mean nothing.
        if eff.retention_ms is not None and "delete" in str(eff.cleanup_policy):
            config["retention.ms"] = str(eff.retention_ms)
        if eff.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(eff.min_insync_replicas)
        return TopicSettings(_first(eff.replication_factor, CLUSTER_DEFAULT_REPLICATION), config)

    @model_validator(mode="after")
    def _safe(self) -> "TopicsSpec":
        # dict.fromkeys: a cluster-wide value wrong for every role is reported once.
        problems = dict.fromkeys(p for role in ROLES for p in self._role_problems(role))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _role_problems(self, role: TopicRole) -> list[str]:
        """What in `role`'s settings would endanger recovery or exactness, naming the field."""
        given, eff, where = getattr(self, role), self.effective(role), f"topics.{role}"
        problems = []
        if role in NEVER_COMPACTED and given.cleanup_policy and "compact" in given.cleanup_policy:
            problems.append(f"{where}.cleanup_policy {given.cleanup_policy}: compaction drops records that share "
                            "a key (and refuses unkeyed ones); use delete")
        if role in ALWAYS_COMPACTED and given.cleanup_policy not in (None, "compact"):
            problems.append(f"{where}.cleanup_policy {given.cleanup_policy}: recovery needs the latest record per "
                            "key however old; only compact keeps it")
        if role in ALWAYS_COMPACTED and given.retention_ms is not None:
            problems.append(f"{where}.retention_ms: a compacted topic keeps the latest record per key; "
                            "time retention does not apply, remove it")
        problems += _insync_problems(where, given, eff)
        return problems


def _insync_problems(where: str, given: RoleTopics, eff: RoleTopics) -> list[str]:
    """min.insync.replicas that would block writes: above the replication factor, or equal to it
    with more than one replica (then one broker down stops every acks=all write).

    `where`: the role's settings path (topics.<role>); `given`: what the job set for the role;
    `eff`: the role's effective settings. The message names the fields the values came from."""
    rf, insync = eff.replication_factor, eff.min_insync_replicas
    if rf is None or insync is None or insync < rf or insync == rf == 1:
        return []
    insync_field = f"{where}.min_insync_replicas" if given.min_insync_replicas is not None else "topics.min_insync_replicas"
    rf_field = f"{where}.replication_factor" if given.replication_factor is not None else "topics.replication_factor"
    effect = "every write would fail" if insync > rf else "one broker down would block every write"
    return [f"{insync_field} {insync} with {rf_field} {rf}: {effect}; give min_insync_replicas {max(rf - 1, 1)} or less"]


def _first(*values: Any) -> Any:
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


def _config_text(value: TopicConfigValue) -> str:
    """A topic config value as Kafka reads it (booleans lower-case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class TopicNames:
    """The names of the job's topics, a base of `JobSettings`, derived from the job's name, its
    streams and its output section: internal topics carry the job's name, so two jobs on one
    cluster never share one; input and results topics may be named in the job file."""

    __slots__ = ()
    if TYPE_CHECKING:  # JobSettings' fields the names derive from
        job: str
        streams: list[StreamSpec]
        output: OutputSpec

    def topic_of(self, stream: StreamSpec) -> str:
        return stream.topic or f"{self.job}.{stream.name}"

    @property
    def input_topics(self) -> list[str]:
        return [self.topic_of(s) for s in self.streams]

    @property
    def results_topic(self) -> str:
        return self.output.topic or f"{self.job}.results"

    @property
    def commits_topic(self) -> str:
        """Internal: what recovery needs (batch boundaries, watermarks, ring releases), never on the results topic."""
        return f"{self.job}.commits"

    @property
    def changelog_topic(self) -> str:
        """Internal (hash mode): partition g holds group g's state writes (state/changelog.py)."""
        return f"{self.job}.changelog"

    @property
    def split_topic(self) -> str:
        """Internal (hash mode, coordinator.hot_key_slots): partition j holds what the groups with a
        split hot key send slot j (schemas/split_records.py)."""
        return f"{self.job}.split"

    def by_key_topic(self, stream: StreamSpec) -> str:
        """Internal (hash mode): `stream`'s records re-routed to the partition of their join key."""
        return f"{self.job}.{stream.name}.by-key"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.job}.dead-letter"

    @property
    def control_topic(self) -> str:
        return f"{self.job}.control"

    @property
    def queries_topic(self) -> str:
        """The query service's registry (compacted: the latest record per query and operator version)."""
        return f"{self.job}.queries"

    @property
    def placement_topic(self) -> str:
        return f"{self.job}.placement"

    @property
    def core_output_topic(self) -> str:
        """Internal (splitjoin mode): partition i holds core i's results and punctuations, for the merger."""
        return f"{self.job}.splitjoin.out"

    @property
    def core_changelog_topic(self) -> str:
        """Internal (splitjoin mode): partition i holds core i's stored blocks and checkpoints."""
        return f"{self.job}.splitjoin.changelog"

    @property
    def merger_topic(self) -> str:
        """Internal (splitjoin mode): the merger's checkpoints, written with the results they cover."""
        return f"{self.job}.merger"

    @property
    def ring_log_topic(self) -> str:
        """Ring mode: every round the head released, in order (one partition), for crash recovery."""
        return f"{self.job}.ring-rounds"

    @property
    def ring_epochs_topic(self) -> str:
        """Ring mode: node starts (each one a new ring epoch) and checkpoints, in order (one partition)."""
        return f"{self.job}.ring-epochs"

    def hop_topic(self, node: str) -> str:
        """Ring mode: the one-partition topic a ring node reads (FIFO from its predecessor)."""
        return f"{self.job}.ring.{node}"

