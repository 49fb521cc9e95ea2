"""services/io/kafka.py's client helpers against the embedded broker."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamjoin.services.io import kafka

pytestmark = pytest.mark.integration


def test_consume_ready_returns_what_is_there_in_order_and_at_most_asked(broker) -> None:
    """An empty partition gives nothing; then every record comes back once, in order, in
    calls of at most `max_messages` (and exactly one record when asked for one)."""
    cluster = kafka.Cluster(broker.bootstrap)
    admin = cluster.admin()  # kept: the futures fail if their client is collected first
    admin.create_topics([NewTopic("hops", 1, 1)])["hops"].result(30)
    consumer = cluster.consumer("consume-ready")
    consumer.assign([TopicPartition("hops", 0, 0)])
    assert kafka.consume_ready(consumer, 10, 0.2) == []
    producer = cluster.producer()
    for i in range(25):
        producer.produce("hops", value=str(i).encode(), partition=0)
    producer.flush(30)
    got: list[int] = []
    sizes: list[int] = []
    for _ in range(200):
        batch = kafka.consume_ready(consumer, 1 if not got else 7, 0.2)
        assert all(m.error() is None for m in batch)
        sizes.append(len(batch))
        got += [int(m.value()) for m in batch]
        if len(got) >= 25:
            break
    consumer.close()
    assert got == list(range(25))
    assert sizes[0] == 1 and max(sizes) <= 7
