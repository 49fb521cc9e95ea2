"""Event-time aligned intake (join.max_read_ahead_ms) on the embedded broker: a
backlog whose streams were written one after the other (all of r, then all of
s) is drained with the window held near its size, and exactly (the
plain-Python reference). The control: the same records without alignment, r
read before s is written (what a backlog's fetch order can do to any run),
hold all of r at once, since the slower stream holds the watermark back."""

from __future__ import annotations

import random

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.services.io import kafka
from streamjoin.topology import topics
from tests.integration.conftest import make_job, on_the_same_inputs
from tests.integration.fleet_harness import metric
from tests.integration.kafka_harness import Row, check, produce

pytestmark = pytest.mark.integration

PER_STREAM = 20_000
GAP_MS = 5  # one tuple per stream every 5 ms of event time: 200 per second
WINDOW_MS, LATENESS_MS, AHEAD_MS = 20_000, 1_000, 1_000
BATCH_RECORDS = 1_000


def one_stream_then_the_other() -> list[Row]:
    """All of r, then all of s, over the same 100 s of event time (a little jitter)."""
    rnd = random.Random(16)
    return [Row(name, rnd.randrange(400), 10_000 + i * GAP_MS + rnd.randint(-200, 0))
            for name in "rs" for i in range(PER_STREAM)]


def peak_of(fleet) -> float:  # type: ignore[no-untyped-def]
    """The peak window (tuples, both streams) of the fleet's one worker."""
    return metric(fleet.metrics_ports["w0"], "streamjoin_window_state_tuples_peak")


def test_aligned_intake_keeps_the_window_near_its_size_where_unaligned_holds_the_first_stream_whole(
        broker, fleet_for, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One backlog drained by two jobs on the same input topics: without join.max_read_ahead_ms
    (job `unaligned`: its own results, state and group) while the backlog is written, r before s,
    then with it, from the whole backlog at once."""
    aligned = make_job(broker.bootstrap, tmp_path, [{"range_ms": WINDOW_MS}] * 2, workers=1, partitions=4,
                       join={"allowed_lateness_ms": LATENESS_MS, "max_read_ahead_ms": AHEAD_MS},
                       worker={"max_batch_records": BATCH_RECORDS})
    unaligned = on_the_same_inputs(aligned, "unaligned", tmp_path, max_read_ahead_ms=None)
    topics.ensure(kafka.Cluster(broker.bootstrap).admin(), aligned)
    rows = one_stream_then_the_other()

    produce(aligned, broker.bootstrap, rows[:PER_STREAM])
    fleet = fleet_for(unaligned, 1)
    wait_drained(unaligned, broker.bootstrap, fleet, timeout=240)
    assert peak_of(fleet) >= PER_STREAM  # every r tuple held: s, with nothing yet, holds the watermark back
    produce(aligned, broker.bootstrap, rows[PER_STREAM:])
    wait_drained(unaligned, broker.bootstrap, fleet, timeout=240)
    fleet.stop_all()  # the next job gets the machine
    result = check(unaligned, broker.bootstrap)
    assert result.exact, result

    fleet = fleet_for(aligned, 1)
    wait_drained(aligned, broker.bootstrap, fleet, timeout=240)
    peak, read_ahead = peak_of(fleet), metric(fleet.metrics_ports["w0"], "streamjoin_read_ahead_records_total")
    fleet.stop_all()
    result = check(aligned, broker.bootstrap)
    assert result.exact, result
    assert read_ahead > 0  # a backlog has records waiting while each cycle commits: the next batch took some
    assert result.expected > PER_STREAM  # keys repeat within the window: many results
    # What a window holds at steady state, both streams: event time within the window, the lateness and
    # the read-ahead of the newest tuple, 200 tuples per second each; plus one batch read past the bound.
    window = 2 * (WINDOW_MS + LATENESS_MS + AHEAD_MS) * 1000 // GAP_MS // 1000
    assert peak <= window * 1.6 + BATCH_RECORDS, (peak, window)  # expired tuples leave with their run's next merge
