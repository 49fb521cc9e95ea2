"""A hash worker's backlog in bytes: the cluster join paper's load signal (section IV-C, the buffer a slave
has not processed yet) where Kafka is the master's buffer. It is what the worker has fetched
but not joined, plus what waits in its partitions (consumer lag, in records) priced at the mean
size of the records it has taken so far. The coordinator averages it over a reorganisation
epoch and divides by `coordinator.buffer_bytes` (services/coordinator/adapt.py)."""

from __future__ import annotations

from collections.abc import Mapping

from streamjoin.services.io.intake import RecordBuffer


class RecordSize:
    """Running mean of the value bytes of every record a worker has taken (0 before the first)."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0

    def observe(self, pending: Mapping[int, RecordBuffer]) -> None:
        """Count a cycle's records: `pending` maps stream -> its records waiting for the cycle."""
        self.records += sum(len(buf) for buf in pending.values())
        self.bytes += sum(buf.value_bytes() for buf in pending.values())

    @property
    def mean(self) -> float:
        return self.bytes / self.records if self.records else 0.0


def backlog_bytes(pending: Mapping[int, RecordBuffer], behind_records: int, record_size: RecordSize) -> int:
    """Bytes of the fetched records in `pending` plus `behind_records` not fetched yet.

    pending: stream -> records fetched and not joined yet; behind_records: consumer lag of the
    worker's input partitions; record_size: the mean record size, which prices that lag."""
    fetched = sum(buf.value_bytes() for buf in pending.values())
    return fetched + round(behind_records * record_size.mean)
