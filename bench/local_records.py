"""A record as the worker's intake reads it, without a broker: drives the worker's batch
function (processor.run_cycle) in process, for the spill benchmark and the state tests."""

from __future__ import annotations


class LocalRecord:
    """Just what RecordBuffer reads from a confluent-kafka Message.

    topic, partition, offset: where the record would be in Kafka (its identity in results);
    key, value: its bytes; ts: its Kafka timestamp (ms); headers: its Kafka headers (None: none)."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_ts", "_headers")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, ts: int,
                 headers: list[tuple[str, bytes]] | None = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._ts, self._headers = key, value, ts, headers

    def error(self) -> None:
        """A record read, never a broker event."""
        return None

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (0, self._ts)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def partition(self) -> int:
        return self._partition

    def topic(self) -> str:
        return self._topic
