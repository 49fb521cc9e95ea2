"""Event-time aligned intake (join.max_read_ahead_ms) on the embedded broker: a
backlog whose streams were written one after the other (all of r, then all of
s) is drained with the window held near its size, and exactly (the
plain-Python reference). The same backlog without alignment holds all of r at
once, which is what shows the bound is the mechanism's doing."""

from __future__ import annotations

import random

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.services import kafka
from streamjoin.topology import topics
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import metric
from tests.integration.kafka_harness import Row, check, produce

pytestmark = pytest.mark.integration

PER_STREAM = 30_000
GAP_MS = 5  # one tuple per stream every 5 ms of event time: 200 per second
WINDOW_MS, LATENESS_MS, AHEAD_MS = 20_000, 1_000, 1_000
BATCH_RECORDS = 1_000


def one_stream_then_the_other() -> list[Row]:
    """All of r, then all of s, over the same 150 s of event time (a little jitter)."""
    rnd = random.Random(16)
    return [Row(name, rnd.randrange(400), 10_000 + i * GAP_MS + rnd.randint(-200, 0))
            for name in "rs" for i in range(PER_STREAM)]


def drain(broker, fleet_for, tmp_path, read_ahead_ms: int | None) -> tuple[float, float, object]:
    """Produce the backlog, then start one worker on it; its peak window (tuples), the records it
    read while the broker acknowledged its cycles, and the check."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": WINDOW_MS}] * 2, workers=1, partitions=4,
                   join={"allowed_lateness_ms": LATENESS_MS, "max_read_ahead_ms": read_ahead_ms},
                   worker={"max_batch_records": BATCH_RECORDS})
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
    produce(job, broker.bootstrap, one_stream_then_the_other())
    fleet = fleet_for(job, 1)
    wait_drained(job, broker.bootstrap, fleet, timeout=240)
    port = fleet.metrics_ports["w0"]
    return (metric(port, "streamjoin_window_state_tuples_peak"), metric(port, "streamjoin_read_ahead_records_total"),
            check(job, broker.bootstrap))


def test_a_backlog_of_one_stream_then_the_other_keeps_the_window_near_its_size(broker, fleet_for, tmp_path) -> None:
    peak, read_ahead, result = drain(broker, fleet_for, tmp_path, AHEAD_MS)
    assert result.exact, result
    assert read_ahead > 0  # a backlog has records waiting while each cycle commits: the next batch took some
    assert result.expected > PER_STREAM  # keys repeat within the window: many results
    # What a window holds at steady state, both streams: event time within the window, the lateness and
    # the read-ahead of the newest tuple, 200 tuples per second each; plus one batch read past the bound.
    window = 2 * (WINDOW_MS + LATENESS_MS + AHEAD_MS) * 1000 // GAP_MS // 1000
    assert peak <= window * 1.6 + BATCH_RECORDS, (peak, window)  # expired tuples leave with their run's next merge


def test_without_alignment_the_same_backlog_holds_the_first_stream_whole(broker, fleet_for, tmp_path) -> None:
    peak, _, result = drain(broker, fleet_for, tmp_path, None)
    assert result.exact, result
    assert peak >= PER_STREAM * 0.9, peak  # r read whole before s moves the watermark
