"""The job's topics: names come from the settings; this module creates them
and checks that an existing cluster matches (same partition count on every
input, or the partition groups would not line up)."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

from streamjoin.settings import JobSettings


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True)
class TopicPlan:
    name: str
    partitions: int
    config: dict[str, str]


def plan(job: JobSettings) -> list[TopicPlan]:
    p = job.partitions
    topics = [TopicPlan(t, p, {}) for t in job.input_topics]
    topics += [
        TopicPlan(job.results_topic, p, {}),  # partition g holds group g's results
        TopicPlan(job.commits_topic, p, {"cleanup.policy": "compact"}),  # partition g: group g's batch commits
        TopicPlan(job.dead_letter_topic, p, {}),
        TopicPlan(job.control_topic, 1, {}),  # one partition: heartbeats and assignments in order
        TopicPlan(job.placement_topic, 1, {"cleanup.policy": "compact"}),
    ]
    if job.join.mode == "hash":  # partition g: records re-routed to group g by their join key
        topics += [TopicPlan(job.by_key_topic(s), p, {}) for s in job.streams]
    return topics


def ensure(admin: AdminClient, job: JobSettings, timeout: float = 30.0) -> list[str]:
    """Create missing topics, verify existing ones; returns the names created."""
    existing = admin.list_topics(timeout=timeout).topics
    wanted = plan(job)
    missing = [t for t in wanted if t.name not in existing]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(
            [NewTopic(t.name, t.partitions, 1, config=t.config) for t in missing], operation_timeout=timeout
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except Exception as e:  # TOPIC_ALREADY_EXISTS from a concurrent creator is fine
                if "already exists" not in str(e).lower():
                    raise TopologyError(f"cannot create topic {name}: {e}") from e
    check(admin, job, timeout)
    return created


def check(admin: AdminClient, job: JobSettings, timeout: float = 30.0) -> None:
    md = admin.list_topics(timeout=timeout).topics
    for t in plan(job):
        if t.name not in md:
            raise TopologyError(f"topic {t.name} is missing: run `streamjoin topics create`")
        have = len(md[t.name].partitions)
        if have != t.partitions:
            raise TopologyError(
                f"topic {t.name} has {have} partitions but the job needs {t.partitions}: "
                "input, results and dead-letter topics must all have `partitions` partitions"
            )
