"""An operator version as a hash-mode job, and the deployer that runs it.

Each version of a shared operator (topology/reuse/operator.py's OperatorDef) is
a hash-mode job of its own: its sources, each decoding only the operator's
projected fields, filtered at intake by the operator's selection cover
(`StreamSpec.where`), keyed by its join classes and windowed by its ranges;
results as Arrow blocks for the router. A version starts at given source
offsets (`join.start_offsets`): about a window before its switch barrier.

A version starts on a backlog, however late after its barrier its processes
come up: its groups read the records already in their partitions at once,
and the records they re-route (a source not keyed the way the operator joins)
reach their groups a cycle later, behind the event time the backlog ran the
groups up to. So a version carries its watermarks across the repartition
(`join.repartition_watermarks`, services/hash/progress.py): a group's
watermark follows every source partition, a re-routed tuple is late only
against its own source partition, and the job's allowed lateness is enough,
whatever the start delay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.topology.reuse.operator import OperatorDef

Offsets = dict[str, dict[int, int]]  # source topic -> partition -> offset


def version_job_name(service_job: str, operator: str, version: int) -> str:
    """The job name of one operator version: unique, and a valid job name (`[a-zA-Z0-9_-]+`)."""
    return f"{service_job}-{operator}-v{version}"


def _operator_stream(catalog: StreamSpec, service: JobSettings, op: OperatorDef) -> StreamSpec:
    """`catalog`'s stream as the operator reads it: projected, filtered, keyed and windowed."""
    name = catalog.name
    keys = op.key_fields(name)
    # The cover's fields too: the intake filters on them before the join.
    wanted = set(op.fields_of(name)) | set(keys) | set(op.where(name)) | {catalog.time_field}
    fields = {f: t for f, t in catalog.fields.items() if f in wanted}
    return StreamSpec.model_validate(catalog.model_dump(mode="json") | {
        "topic": service.topic_of(catalog), "fields": fields, "key_fields": keys, "where": op.where(name),
        "window": {"range_ms": op.range_of(name)},
    })


def version_job(service: JobSettings, operator: str, version: int, op: OperatorDef,
                start_offsets: Offsets, start_event_ms: int | None = None) -> JobSettings:
    """The hash-mode job settings of `operator`'s `version` with definition `op`.

    `service`: the query service's settings (catalog streams, Kafka, `queries:`);
    `start_offsets`: where its groups start reading the sources; `start_event_ms`: the event
    time its tuples are skipped below (the backfill reads from before it)."""
    name = version_job_name(service.job, operator, version)
    catalog = {s.name: s for s in service.streams}
    streams = [_operator_stream(catalog[s], service, op) for s in op.sources]
    data = service.job_file_data()
    for section in ("queries", "workload"):
        data.pop(section, None)
    data.update({
        "job": name,
        "partitions": service.queries.operator_partitions,
        "streams": [s.model_dump(mode="json") for s in streams],
        "output": {"format": "blocks"},
    })
    data["join"] = data["join"] | {"mode": "hash", "start_offsets": start_offsets, "predicate": [],
                                   "repartition": "auto", "repartition_watermarks": True,
                                   "start_event_ms": start_event_ms}
    data["worker"] = data["worker"] | {"state_dir": str(Path(service.worker.state_dir) / name),
                                       "region": op.region}
    data["coordinator"] = data["coordinator"] | {"expected_workers": service.queries.operator_workers}
    return JobSettings.model_validate(data)


class Deployer(Protocol):
    """Runs operator versions: on this machine a launcher fleet, on Kubernetes a release."""

    def start(self, job: JobSettings) -> None:
        """Create the job's topics and start its services."""

    def stop(self, job_name: str) -> None:
        """Stop the job's services (its topics stay: the router may still read them)."""

    def check(self) -> None:
        """Restart services that died; raise when a job cannot run."""

    def close(self) -> None:
        """The service is stopping: stop what this deployer runs on its behalf (a local fleet
        dies with its service; a release on a cluster would stay)."""
