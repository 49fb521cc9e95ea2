"""Writing the Nexmark model's events (bench/nexmark_model.py) into a run's three topics.

  backlog  `write_events`: the parent draws a chunk of events at a time, encodes each kind's JSON
           objects and record keys in bulk (Arrow kernels) and the partitions of their keys
           (Kafka's murmur2), and hands each producer process the rows of the partitions it owns
           (bench/backlog.py's writer): every partition holds its events in emission order.
  paced    `write_paced`: the same events, in the same order per partition (so the same
           offsets), produced at a given rate from this process a tick at a time, each record's
           Kafka timestamp the moment it was handed over: what production delay is measured from.

Topics are keyed as bench/nexmark_queries.EVENT_KEYS says; values are the compact JSON objects of
each kind's fields in nexmark_model.FIELDS order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

from streamjoin.bench import backlog
from streamjoin.bench.nexmark_model import KINDS, Columns, NexmarkModel, adjusted_numbers, draw, kind_of
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from streamjoin.topology.partitioner import partitions_for_keys

TICK_S = 0.05  # the paced writer hands librdkafka a tick of events at a time


@dataclass(frozen=True)
class EventPlan:
    """events: how many (a multiple of chunk_events, itself a multiple of the model's
    out-of-order group); producers: backlog producer processes."""

    events: int
    chunk_events: int
    producers: int

    @property
    def chunks(self) -> int:
        return self.events // self.chunk_events


@dataclass(frozen=True)
class EventRows:
    """One kind's encoded events of one chunk: what backlog.write_backlog hands its producers."""

    stream: int
    values: pa.Array
    keys: pa.Array
    partition: np.ndarray

    def take(self, rows: np.ndarray) -> "EventRows":
        return EventRows(self.stream, pc.take(self.values, rows), pc.take(self.keys, rows), self.partition[rows])

    def __len__(self) -> int:
        return len(self.partition)

    def produce(self, producer: Any, job: JobSettings) -> None:
        backlog.produce_records(producer, job.topic_of(job.streams[self.stream]), self.values.to_pylist(),
                                self.keys.to_pylist(), self.partition)


def encode(job: JobSettings, stream: int, cols: Columns) -> EventRows:
    """Kind `stream`'s columns as JSON values, record keys and partitions."""
    spec = job.streams[stream]
    keys = backlog.record_keys(spec, cols)
    values = backlog.json_values(spec, cols, None).cast(pa.binary())
    return EventRows(stream, values, keys, partitions_for_keys(keys, job.partitions))


def event_rows(job: JobSettings, model: NexmarkModel, plan: EventPlan) -> Iterator[EventRows]:
    """Every chunk's events, kind by kind, encoded for `job` (the events job: one stream per kind)."""
    for chunk in range(plan.chunks):
        drawn = draw(model, chunk, plan.chunk_events)
        for i, kind in enumerate(KINDS):
            yield encode(job, i, drawn[kind])


def write_events(job: JobSettings, cluster: kafka.Cluster, model: NexmarkModel, plan: EventPlan,
                 console: Console) -> dict:
    """The whole run's events into `job`'s topics (created here) as a backlog; what was written."""
    return backlog.write_backlog(job, cluster, event_rows(job, model, plan), plan.producers, plan.events, console)


def write_paced(job: JobSettings, cluster: kafka.Cluster, model: NexmarkModel, plan: EventPlan, rate: float) -> dict:
    """The run's events into `job`'s topics (created already) at `rate` events/s of wall time,
    chunk after chunk, each kind's records in their emission order; what was written."""
    producer = cluster.producer(**backlog.PRODUCER_TUNING | {"linger.ms": 5})
    began = time.monotonic()
    for chunk in range(plan.chunks):
        drawn = draw(model, chunk, plan.chunk_events)
        rows = [encode(job, i, drawn[kind]) for i, kind in enumerate(KINDS)]
        kinds = kind_of(adjusted_numbers(model, chunk * plan.chunk_events, plan.chunk_events))
        positions = [np.flatnonzero(kinds == i) for i in range(len(KINDS))]  # each kind's rows, by position
        done = [0] * len(KINDS)
        while True:
            due = min(int((time.monotonic() - began) * rate) - chunk * plan.chunk_events, plan.chunk_events)
            for i, r in enumerate(rows):
                upto = int(np.searchsorted(positions[i], due, side="left"))
                if upto > done[i]:
                    r.take(np.arange(done[i], upto)).produce(producer, job)
                    done[i] = upto
            if due >= plan.chunk_events:
                break
            producer.poll(0)
            time.sleep(TICK_S)
    if producer.flush(120):
        raise RuntimeError("the broker did not acknowledge the paced Nexmark events within 120 s")
    seconds = time.monotonic() - began
    return {"events": plan.events, "seconds": round(seconds, 2), "events_per_s": plan.events / seconds,
            "target_rate": rate}
