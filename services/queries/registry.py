"""The query service's durable registry: a compacted topic, the latest record per key.

Keys and values (JSON):
  query/<id>      a registration: its text, sink, region, lifetime, barriers, operator and
                  the planner's decision as `explain` shows it
  version/<job>   an operator version: operator id, version number, definition, the source
                  offsets it started at, the segments of event time it serves each query for,
                  and whether it has retired
A restarted service reads the topic to its end and carries on from what it holds
(services/queries/service.py). Written synchronously (flush) before the service
acts on a change, so nothing it did is missing from the registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from streamjoin.schemas.query import Column, Selection
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology.reuse.operator import OperatorDef

QUERY, VERSION = "query/", "version/"


@dataclass
class VersionRecord:
    """One operator version: `job` (its job name), `operator`, `version`, `definition`,
    `start_offsets` (source topic -> partition -> offset), `segments` (query -> [lo, hi)),
    `retired`, `start_event_ms` (the event time before which its tuples cannot matter:
    its first barrier minus its longest RANGE; None: keep all)."""

    job: str
    operator: str
    version: int
    definition: OperatorDef
    start_offsets: dict[str, dict[int, int]]
    segments: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    retired: bool = False
    start_event_ms: int | None = None


def _column(text: str) -> Column:
    stream, _, name = text.partition(".")
    return Column(stream, name)


def operator_from_json(data: dict[str, Any]) -> OperatorDef:
    """An OperatorDef from its `to_json` form."""
    return OperatorDef(
        sources=tuple(data["sources"]),
        join_classes=frozenset(frozenset(_column(c) for c in members) for members in data["join_classes"]),
        selections=tuple(Selection(_column(c), frozenset(values)) for c, values in data["selections"].items()),
        columns=tuple(_column(c) for c in data["columns"]),
        range_ms=tuple(sorted(data["range_ms"].items())),
        slide_ms=data["slide_ms"],
        expires_ms=data["expires_ms"],
        region=data["region"],
    )


def version_to_json(record: VersionRecord) -> dict[str, Any]:
    return {"job": record.job, "operator": record.operator, "version": record.version,
            "definition": record.definition.to_json(), "start_offsets": record.start_offsets,
            "segments": {q: list(seg) for q, seg in record.segments.items()}, "retired": record.retired,
            "start_event_ms": record.start_event_ms}


def version_from_json(data: dict[str, Any]) -> VersionRecord:
    return VersionRecord(
        job=data["job"], operator=data["operator"], version=data["version"],
        definition=operator_from_json(data["definition"]),
        start_offsets={t: {int(p): o for p, o in parts.items()} for t, parts in data["start_offsets"].items()},
        segments={q: (lo, hi) for q, (lo, hi) in data["segments"].items()}, retired=data["retired"],
        start_event_ms=data.get("start_event_ms"))  # absent in records written before it existed


class Registry:
    """Reads and writes the registry topic of `service` (JobSettings.queries_topic)."""

    def __init__(self, service: JobSettings, cluster: kafka.Cluster) -> None:
        self.topic = service.queries_topic
        self.cluster = cluster
        self.producer: Producer = cluster.producer()

    def load(self) -> tuple[dict[str, dict[str, Any]], dict[str, VersionRecord]]:
        """Every query record and version record, the latest per key, in write order."""
        queries: dict[str, dict[str, Any]] = {}
        versions: dict[str, VersionRecord] = {}
        for message in kafka.read_partition(self.cluster, self.topic, 0, 0, f"{self.topic}-load"):
            key = (message.key() or b"").decode()
            if message.value() is None:
                continue
            data = json.loads(message.value())
            if key.startswith(QUERY):
                queries[key.removeprefix(QUERY)] = data
            elif key.startswith(VERSION):
                versions[key.removeprefix(VERSION)] = version_from_json(data)
        return queries, versions

    def put_query(self, query_id: str, data: dict[str, Any]) -> None:
        self._put(QUERY + query_id, data)

    def put_version(self, record: VersionRecord) -> None:
        self._put(VERSION + record.job, version_to_json(record))

    def _put(self, key: str, data: dict[str, Any]) -> None:
        self.producer.produce(self.topic, key=key.encode(), value=json.dumps(data, sort_keys=True).encode(),
                              partition=0)
        if self.producer.flush(30) > 0:
            raise RuntimeError(f"the registry topic {self.topic} did not take a write within 30 s")
