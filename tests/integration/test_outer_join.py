"""Outer joins (join.type left and full) as real processes on the embedded broker, checked
by Spark `verify` (Spark SQL's own outer join of the inputs).

* Through a crash: a worker SIGKILLed mid-run and restarted (its state from disk), or
  never restarted (its groups fail over and are rebuilt from the changelog). A matched
  mark the state lost would let a matched row out null-padded (an extra result); a row
  decided twice would be a duplicate.
* An input that goes idle: with join.idle_timeout_ms a silent stream stops holding the
  watermark, so the other stream's unmatched rows still reach their deadline and come out
  (once every input is silent, on the wall clock); without it they stay undecided (the
  contrast docs/concepts/join-types.md states).

The streams' key ranges only half overlap, so many rows never match and null-padded rows
are really checked. Event times follow the wall clock, so a row's deadline (event time +
window + allowed lateness) is a wall-clock instant and the delay past it means something.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator
from urllib.request import urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamjoin.launcher import Fleet, wait_drained, write_job
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import snapshot
from streamjoin.settings import JobSettings
from streamjoin.topology import topics
from tests.integration.conftest import make_job, on_the_same_inputs
from tests.integration.fleet_harness import wait_metric, wait_until
from tests.integration.kafka_harness import Row, check, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]

# Half of each stream's keys never appear on the other: their rows are unmatched for sure.
KEYS = {"r": range(0, 200), "s": range(100, 300)}
# Timeouts a loaded 2-core machine keeps: a slow worker is not failed over, a dead one is within seconds.
TIMEOUTS = {"heartbeat_timeout_ms": 4000, "worker_timeout_ms": 8000}
# A restarted worker must be back before it counts as dead, however long a loaded machine takes
# to start it (well over 8 s at times): else its groups fail over and it recovers none.
RESTART_TIMEOUTS = TIMEOUTS | {"worker_timeout_ms": 60_000}
JITTER_MS = 100  # event times up to this far behind the wall clock: out of order, well within the lateness


def write_live(job: JobSettings, bootstrap: str, streams: str, seconds: float, rate: int, seed: int) -> dict[str, int]:
    """Write rows of `streams` (stream names, one letter each) for `seconds` at `rate` rows/s
    in all, a tenth of a second's worth at a time, keys from KEYS, event time the wall clock
    less up to JITTER_MS. Returns the newest event time written per stream."""
    rnd = random.Random(seed)
    producer = kafka.Cluster(bootstrap).producer()
    newest: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now_ms = int(time.time() * 1000)
        rows = [Row(s, rnd.choice(KEYS[s]), now_ms - rnd.randint(0, JITTER_MS))
                for s in (rnd.choice(streams) for _ in range(rate // 10))]
        produce(job, bootstrap, rows, producer=producer)
        for row in rows:
            newest[row.stream] = max(newest.get(row.stream, row.ts), row.ts)
        time.sleep(0.1)
    return newest


def alone(job: JobSettings, bootstrap: str) -> dict[str, dict[tuple[int, int], int]]:
    """Per stream, the job's null-padded results that hold only a row of it: the row's ref
    (partition, offset) -> the result's event time (the row's). The JSON result record names
    an absent member null in `inputs`."""
    out: dict[str, dict[tuple[int, int], int]] = {s.name: {} for s in job.streams}
    for m in read_all(bootstrap, job.results_topic, job.partitions, f"alone-{job.job}"):
        doc = json.loads(m.value())
        present = [s.name for s in job.streams if doc["inputs"].get(s.name) is not None]
        if len(present) == 1:
            ref = doc["inputs"][present[0]]
            out[present[0]][(ref["partition"], ref["offset"])] = doc["event_time"]
    return out


def metric_sum(port: int, name: str) -> float:
    """The sum of every sample named `name` (whatever its labels) the service on `port` serves."""
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = [s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]
    assert samples, f"{name} is not served on port {port}"
    return float(sum(samples))


def verified(job: JobSettings, bootstrap: str) -> dict:
    """Spark `verify`'s report on the job, asserted exact: nothing missing, extra or duplicated."""
    from streamjoin.services.spark.verify import run_verify  # Spark starts only for the tests that ask

    report = run_verify(job, kafka.Cluster(bootstrap))
    wrong = {k: report[k] for k in ("missing", "extra", "duplicates", "bad_ids", "lost")}
    assert report["verified"] and report["missing"] == report["extra"] == report["duplicates"] == 0, wrong
    assert report["join_type"] == job.join.type
    assert report["results"] == report["expected"]
    return report


# ---------------------------------------------------------------- through a crash


def _held(job: JobSettings, bootstrap: str) -> dict[str, list[int]]:
    """Each worker's groups as its newest heartbeat says."""
    return {w["worker"]: w["held_groups"] for w in snapshot(job, kafka.Cluster(bootstrap))["workers"]}


def restart_w0(job: JobSettings, bootstrap: str, fleet: Fleet) -> None:
    """SIGKILL w0 and start it again with its disk: the new process recovers its groups (a batch
    the kill cut short is replayed) before it joins, which its recoveries counter shows."""
    fleet.kill("w0", signal.SIGKILL)
    time.sleep(0.5)
    fleet.start_worker("w0")
    wait_metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total", 1, timeout=60)


def fail_over_w1(job: JobSettings, bootstrap: str, fleet: Fleet) -> None:
    """SIGKILL w1 for good: its groups fail over to w0, which rebuilds each of them (windows and
    matched marks) from the changelog, as its restores counter shows. Killed only once each of
    its groups has a committed batch in the changelog: a group w1 never committed (a loaded
    machine can keep a new worker from its first cycle for seconds) has nothing to restore,
    and w0 would rightly count no restore for it."""
    orphans = _held(job, bootstrap)["w1"]
    assert orphans, "w1 held no group to fail over"
    changelog = [(job.changelog_topic, g) for g in orphans]
    wait_until("a committed batch of each of w1's groups in the changelog",
               lambda: all(end > 0 for end in kafka.end_offsets(kafka.Cluster(bootstrap), changelog,
                                                                f"{job.job}-probe").values()),
               timeout=120, fleet=fleet)
    fleet.restart_workers = False
    fleet.kill("w1", signal.SIGKILL)
    deadline = time.monotonic() + 90
    while not set(orphans) <= set(_held(job, bootstrap).get("w0", [])):
        assert time.monotonic() < deadline, "w1's groups were not failed over to w0 within 90 s"
        time.sleep(0.5)
    # w0 heartbeats the groups once their recovery (the restore among it) is done: no long wait.
    wait_metric(fleet.metrics_ports["w0"], "streamjoin_changelog_restores_total", len(orphans), timeout=60)


@pytest.mark.parametrize("join_type, crash, timeouts", [("left", restart_w0, RESTART_TIMEOUTS),
                                                      ("full", fail_over_w1, TIMEOUTS)],
                         ids=["left-restarted", "full-failed-over"])
def test_outer_join_through_a_worker_crash_is_exact(broker, fleet_for, join_type: str,  # type: ignore[no-untyped-def]
                                                    crash: Callable[[JobSettings, str, Fleet], None],
                                                    timeouts: dict, tmp_path: Path) -> None:
    """Two workers on 12 groups under a steady input, one SIGKILLed 3 s in. Spark verify finds
    the output exact, with null-padded rows in it: of r only for a left join, of both streams
    for a full join, as many as verify expects (`unmatched`)."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 500}] * 2, workers=2, partitions=12,
                   join={"type": join_type, "allowed_lateness_ms": 500}, coordinator=timeouts)
    fleet = fleet_for(job, 2)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_live, job, broker.bootstrap, "rs", 8, 600, 31)
        time.sleep(3)
        crash(job, broker.bootstrap, fleet)
        writing.result()
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    fleet.stop_all()  # the output is complete: Spark gets both cores

    report = verified(job, broker.bootstrap)
    padded = alone(job, broker.bootstrap)
    assert report["results"] > 1000
    assert report["unmatched"] == sum(len(rows) for rows in padded.values()) > 0
    assert padded["r"] and bool(padded["s"]) == (join_type == "full"), {s: len(rows) for s, rows in padded.items()}


# ---------------------------------------------------------------- an idle input


@pytest.fixture
def start_fleet(broker, tmp_path: Path) -> Iterator[Callable[[JobSettings], Fleet]]:  # type: ignore[no-untyped-def]
    """Starts a job's coordinator and one worker w0, each job in its own directory (several
    jobs run side by side); stops them all at the end."""
    fleets: list[Fleet] = []

    def start(job: JobSettings) -> Fleet:
        topics.ensure(kafka.Cluster(broker.bootstrap).admin(), job)
        home = tmp_path / job.job
        fleet = Fleet(job, write_job(job, home / "job.yaml"), broker.bootstrap, home / "logs")
        fleets.append(fleet)
        fleet.start_coordinator()
        fleet.start_worker("w0")
        fleet.wait_assigned(["w0"])
        return fleet

    yield start
    for f in fleets:
        f.stop_all()


def wait_zero(port: int, name: str, timeout: float) -> None:
    """Until the service on `port` serves `name` (summed over its labels) as 0."""
    deadline = time.monotonic() + timeout
    while (value := metric_sum(port, name)) != 0:
        assert time.monotonic() < deadline, f"{name} on port {port} stayed at {value} for {timeout} s"
        time.sleep(0.2)


def test_an_idle_input_stops_holding_unmatched_rows_back(broker, start_fleet,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    """A left join: r and s for 4 s, then s goes silent while r writes 4 s more, then r stops.
    With join.idle_timeout_ms (1 s) the silent s stops holding the watermark: r's unmatched rows
    written after s went silent reach their deadline on r's time and come out; once r is silent
    too, the wall clock moves the watermark, so even r's last rows are decided and no row is
    left waiting. Exact (Spark verify), with the delay past the deadline measured. The same
    input joined without the timeout (job `held`, side by side) decides none of them: its
    watermark waits for s, its null-padded rows are a strict subset and its worker's gauge
    shows the rows left waiting."""
    idle_ms, window_ms, lateness_ms = 1000, 1000, 500
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": window_ms}] * 2, workers=1, partitions=4,
                   join={"type": "left", "allowed_lateness_ms": lateness_ms, "idle_timeout_ms": idle_ms})
    held = on_the_same_inputs(job, "held", tmp_path, idle_timeout_ms=None)
    fleets = {j.job: start_fleet(j) for j in (job, held)}
    s_last = write_live(job, broker.bootstrap, "rs", 4, 400, 41)["s"]
    r_last = write_live(job, broker.bootstrap, "r", 4, 200, 42)["r"]
    for j in (job, held):
        wait_drained(j, broker.bootstrap, fleets[j.job], timeout=120)
    ports = {name: fleet.metrics_ports["w0"] for name, fleet in fleets.items()}
    # The gauge is set after each cycle's transaction commits: at 0, the idle job's output is final.
    wait_zero(ports[job.job], "streamjoin_rows_awaiting_decision", timeout=30)
    still_waiting = metric_sum(ports[held.job], "streamjoin_rows_awaiting_decision")
    emitted = metric_sum(ports[job.job], "streamjoin_unmatched_rows_total")
    for fleet in fleets.values():
        fleet.stop_all()  # the output is complete: Spark gets both cores

    report = verified(job, broker.bootstrap)
    decided = alone(job, broker.bootstrap)["r"]
    after_silence = {ref for ref, t in decided.items() if t > s_last}
    delay = report["unmatched_delay_ms"]
    print(json.dumps({"join_type": "left", "idle_timeout_ms": idle_ms, "unmatched": report["unmatched"],
                      "unmatched_after_s_went_silent": len(after_silence), "unmatched_delay_ms": delay}))
    assert report["unmatched"] == len(decided) == emitted
    assert len(decided) > len(after_silence) > 0
    # Rows past r's own time (r_last - lateness >= ts + window fails for them): decided on the wall clock.
    assert max(decided.values()) > r_last - window_ms - lateness_ms
    assert all(math.isfinite(delay[q]) and delay[q] >= 0 for q in ("p50", "p95", "p99", "mean")), delay

    held_decided = alone(held, broker.bootstrap)["r"]
    assert not [t for t in held_decided.values() if t > s_last]
    assert set(held_decided) < set(decided) and not after_silence & set(held_decided)
    assert still_waiting >= len(after_silence)


def test_a_stalled_worker_does_not_take_its_unread_input_for_silence(broker, start_fleet,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    """A left join with join.idle_timeout_ms (1 s) whose worker is stopped (SIGSTOP) for 3 s
    while both streams keep coming: on waking, every stream of every group has had no record
    read for longer than the timeout, yet each one's partitions hold what was written meanwhile.
    Unread input is not silence: nothing is dead-lettered as late and the output is exact (the
    reference's left join). Taken for silence, the wall clock would have moved each group's
    watermark past the records written during the stop, and they would have been late.

    Then the worker is SIGKILLed and restarted, and only r is written: the restarted worker
    takes each stream's idle clock from its groups' checkpoints (its log says so) rather than
    starting every clock at its own start, and the output stays exact."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 1000}] * 2, workers=1, partitions=4,
                   join={"type": "left", "allowed_lateness_ms": 500, "idle_timeout_ms": 1000})
    fleet = start_fleet(job)
    write_live(job, broker.bootstrap, "rs", 2, 400, 51)
    wait_metric(fleet.metrics_ports["w0"], "streamjoin_batch_seconds_count", 1, timeout=60)
    worker = fleet.procs["w0"]
    worker.send_signal(signal.SIGSTOP)
    try:
        write_live(job, broker.bootstrap, "rs", 3, 400, 52)
    finally:
        worker.send_signal(signal.SIGCONT)
    write_live(job, broker.bootstrap, "rs", 1, 400, 53)
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    wait_zero(fleet.metrics_ports["w0"], "streamjoin_rows_awaiting_decision", timeout=30)
    restart_w0(job, broker.bootstrap, fleet)
    write_live(job, broker.bootstrap, "r", 1, 200, 54)
    wait_drained(job, broker.bootstrap, fleet, timeout=120)
    wait_zero(fleet.metrics_ports["w0"], "streamjoin_rows_awaiting_decision", timeout=30)
    fleet.stop_all()
    assert "idle clocks restored" in (fleet.log_dir / "w0.log").read_text(errors="replace")
    result = check(job, broker.bootstrap)
    assert result.dead_letter.get("late", 0) == 0, result.dead_letter
    assert result.exact, result
    # The volume written depends on how fast a loaded machine runs the writer; some hundreds of
    # rows of each stream join at all: the check above covered real output.
    assert result.expected > 100, result
