"""Where the source topics stood when: samples of their end offsets by wall clock.

A new operator version must start reading its sources about a window before
its switch barrier (a window-bounded backfill). Kafka's offsets-for-times
would answer that from record timestamps, but not every broker answers it (the
embedded Tansu broker gives 0 for any time), so the service samples the
sources' end offsets itself, about once a second, and a version starts at the
newest sample taken at or before (barrier - window - lateness - margin). A
record at or after that offset was written after the sample; its tuple can
only be older than the window if its event time ran ahead of the clock by
more than the margin (`queries.backfill_margin_ms`). Samples are thinned by
halving once `capacity` are held, so a long-running service keeps about
`capacity` of them across its whole life; before the first sample (a service
just started) a version starts at the beginning.
"""

from __future__ import annotations

import bisect
import time

from confluent_kafka import OFFSET_END, TopicPartition

from streamjoin.services import kafka
from streamjoin.settings import JobSettings

Offsets = dict[str, dict[int, int]]


class SourceIndex:
    """End-offset samples of `service`'s source topics. `capacity`: samples kept;
    `every_s`: least seconds between two samples."""

    def __init__(self, service: JobSettings, cluster: kafka.Cluster, capacity: int = 4096,
                 every_s: float = 1.0) -> None:
        self.service, self.cluster = service, cluster
        self.capacity, self.every_s = capacity, every_s
        self.times: list[int] = []
        self.samples: list[Offsets] = []
        self.consumer = cluster.consumer(f"{service.job}-queries-index")
        self.partitions: list[TopicPartition] = []
        self.last_s = 0.0

    def sample(self) -> None:
        """Take a sample when `every_s` has passed since the last one."""
        if time.monotonic() - self.last_s < self.every_s:
            return
        self.last_s = time.monotonic()
        if not self.partitions:
            metadata = self.cluster.admin().list_topics(timeout=10).topics
            self.partitions = [TopicPartition(t, p, OFFSET_END) for t in self.service.input_topics
                               if t in metadata for p in sorted(metadata[t].partitions)]
        wall_ms = int(time.time() * 1000)
        # ListOffsets(latest): a broker may answer a little short of the end (Tansu: the last
        # batch's base offset + 1), which only starts a version a few records earlier.
        found = kafka.resolved(self.consumer, list(self.partitions), 10)
        offsets: Offsets = {}
        for tp in found:
            if tp.offset >= 0:
                offsets.setdefault(tp.topic, {})[tp.partition] = tp.offset
        self.times.append(wall_ms)
        self.samples.append(offsets)
        if len(self.times) > self.capacity:
            self.times, self.samples = self.times[::2], self.samples[::2]

    def offsets_before(self, wall_ms: int) -> Offsets:
        """The newest sample taken at or before `wall_ms` ({} = start at the beginning)."""
        at = bisect.bisect_right(self.times, wall_ms)
        return self.samples[at - 1] if at else {}
