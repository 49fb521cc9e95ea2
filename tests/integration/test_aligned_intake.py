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
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.conftest import make_job, on_the_same_inputs
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


def drain(bootstrap: str, fleet_for, job: JobSettings) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    """One worker drains the backlog already written to `job`'s inputs; its peak window (tuples),
    the records it read while the broker acknowledged its cycles, and the check."""
    fleet = fleet_for(job, 1)
    wait_drained(job, bootstrap, fleet, timeout=240)
    port = fleet.metrics_ports["w0"]
    peak, read_ahead = (metric(port, "streamjoin_window_state_tuples_peak"),
                        metric(port, "streamjoin_read_ahead_records_total"))
    fleet.stop_all()  # the next job gets the machine
    return peak, read_ahead, check(job, bootstrap)


def test_aligned_intake_keeps_the_window_near_its_size_where_unaligned_holds_the_first_stream_whole(
        broker, fleet_for, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One backlog, written once, drained by two jobs on the same input topics: with
    join.max_read_ahead_ms, then without (job `unaligned`: its own results, state and group)."""
    aligned = make_job(broker.bootstrap, tmp_path, [{"range_ms": WINDOW_MS}] * 2, workers=1, partitions=4,
                       join={"allowed_lateness_ms": LATENESS_MS, "max_read_ahead_ms": AHEAD_MS},
                       worker={"max_batch_records": BATCH_RECORDS})
    unaligned = on_the_same_inputs(aligned, "unaligned", tmp_path, max_read_ahead_ms=None)
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), aligned)
    produce(aligned, broker.bootstrap, one_stream_then_the_other())

    peak, read_ahead, result = drain(broker.bootstrap, fleet_for, aligned)
    assert result.exact, result
    assert read_ahead > 0  # a backlog has records waiting while each cycle commits: the next batch took some
    assert result.expected > PER_STREAM  # keys repeat within the window: many results
    # What a window holds at steady state, both streams: event time within the window, the lateness and
    # the read-ahead of the newest tuple, 200 tuples per second each; plus one batch read past the bound.
    window = 2 * (WINDOW_MS + LATENESS_MS + AHEAD_MS) * 1000 // GAP_MS // 1000
    assert peak <= window * 1.6 + BATCH_RECORDS, (peak, window)  # expired tuples leave with their run's next merge

    peak, _, result = drain(broker.bootstrap, fleet_for, unaligned)
    assert result.exact, result
    assert peak >= PER_STREAM * 0.9, peak  # r read whole before s moves the watermark
