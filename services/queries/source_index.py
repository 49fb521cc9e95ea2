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
`capacity` of them across its whole life. Before the first sample old enough (a
service just started or restarted) the index searches the record timestamps
themselves: per partition, a binary search for the first record stamped at or
after the time, a record read at each step (any broker answers that).
"""

from __future__ import annotations

import bisect
import time

from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicPartition

from streamjoin.services.io import kafka
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
        # Uncommitted records too: the search reads timestamps, and any record's will do.
        self.consumer = cluster.consumer(f"{service.job}-queries-index", **{
            "enable.partition.eof": True, "isolation.level": "read_uncommitted"})
        self.partitions: list[TopicPartition] = []
        self.last_s = 0.0

    def sample(self) -> None:
        """Take a sample when `every_s` has passed since the last one."""
        if time.monotonic() - self.last_s < self.every_s:
            return
        self.last_s = time.monotonic()
        wall_ms = int(time.time() * 1000)
        # ListOffsets(latest): a broker may answer a little short of the end (Tansu: the last
        # batch's base offset + 1), which only starts a version a few records earlier.
        found = kafka.resolved(self.consumer, self._partitions(), 10)
        offsets: Offsets = {}
        for tp in found:
            if tp.offset >= 0:
                offsets.setdefault(tp.topic, {})[tp.partition] = tp.offset
        self.times.append(wall_ms)
        self.samples.append(offsets)
        if len(self.times) > self.capacity:
            self.times, self.samples = self.times[::2], self.samples[::2]

    def offsets_before(self, wall_ms: int) -> Offsets:
        """Offsets before which every record was written before `wall_ms`: the newest sample
        taken at or before it, or (none is that old) a search of the record timestamps."""
        at = bisect.bisect_right(self.times, wall_ms)
        if at:
            return self.samples[at - 1]
        # True ends (ListOffsets may answer short of them, see kafka.end_offsets).
        ends = kafka.end_offsets(self.cluster, [(tp.topic, tp.partition) for tp in self._partitions()],
                                 f"{self.service.job}-queries-index", isolation="read_uncommitted")
        offsets: Offsets = {}
        for (topic, partition), end in sorted(ends.items()):
            offsets.setdefault(topic, {})[partition] = self._first_stamped_at(topic, partition, end, wall_ms)
        return offsets

    def _partitions(self) -> list[TopicPartition]:
        """Every partition of the source topics, at their ends (looked up once)."""
        if not self.partitions:
            metadata = self.cluster.admin().list_topics(timeout=10).topics
            self.partitions = [TopicPartition(t, p, OFFSET_END) for t in self.service.input_topics
                               if t in metadata for p in sorted(metadata[t].partitions)]
        return list(self.partitions)

    def _first_stamped_at(self, topic: str, partition: int, end: int, wall_ms: int) -> int:
        """The first offset of `topic`/`partition` (before `end`, its end) whose record is stamped
        at or after `wall_ms` (`end` when none is). Binary search: timestamps rise with offsets
        as producers write; where they do not, the backfill margin covers the difference."""
        low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0], end
        while low < high:
            middle = (low + high) // 2
            found = self._record_at(topic, partition, middle)
            if found is None or found[1] >= wall_ms:
                high = middle
            else:
                low = found[0] + 1
        return low

    def _record_at(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `offset`; None at the end."""
        self.consumer.unassign()  # drops what was fetched for the step before (a plain re-assign may not)
        self.consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for message in self.consumer.consume(1, 0.2):
                # A message fetched for an earlier step may still come out of the queue: skip it.
                if (message.topic(), message.partition()) != (topic, partition) or \
                        (message.error() is None and message.offset() < offset):
                    continue
                if message.error() is None:
                    return message.offset(), message.timestamp()[1]
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return None
                raise KafkaException(message.error())
        raise TimeoutError(f"no record or end of {topic}[{partition}] at offset {offset} within 10 s")
