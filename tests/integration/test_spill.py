"""Windows larger than memory, through the real parts: a 3-way join whose window state is at
least five times the workers' combined memory budget, two worker processes on the embedded
broker, RocksDB on disk, in both spill modes; one worker SIGKILLed (faults.crash_at) right
after it wrote results from spilled state (a clean-up's in deferred mode, a read-back group's
in probe mode) and before it committed them. The output is exact against the plain-Python
reference and Spark `verify`; the workers' in-memory window bytes stay within the budget, and
their peak RSS is reported beside it."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import heartbeats_since
from streamjoin.services.faults import marker_dir
from streamjoin.topology.partitioner import partition_for
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import metric, wait_heartbeats
from tests.integration.kafka_harness import Row, assert_spark_verified, check, produce

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 6
BUDGET = 16_000  # bytes of window state in memory, per worker
WINDOW_MS = 4000
KEYS = 150
CRASH = "w0:spill-written"


def _peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _flush_rows(start_ts: int) -> list[Row]:
    """Per group, one row per stream far past every window, each stream with its own key (so
    they join nothing): every group's watermark passes every spilled generation."""
    rows = []
    for g in range(PARTITIONS):
        keys = [k for k in range(10_000, 20_000) if partition_for(key_bytes(k), PARTITIONS) == g][:3]
        rows += [Row(stream, key, start_ts) for stream, key in zip("rst", keys)]
    return rows


@pytest.mark.parametrize("mode", ["probe", "deferred"])
def test_windows_five_times_the_memory_budget_stay_exact_through_a_crash(broker, fleet_for, tmp_path: Path,
                                                                         mode: str) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": WINDOW_MS}] * 3, workers=2, partitions=PARTITIONS,
                   join={"allowed_lateness_ms": 500},
                   worker={"memory_bytes": BUDGET, "spill": {"mode": mode}},
                   coordinator={"memory_balance_theta": 0.0}, faults={"crash_at": [CRASH]})
    fleet = fleet_for(job, 2)
    rnd = random.Random(3)
    producer = kafka.Cluster(broker.bootstrap).producer()
    ts = 10_000
    for second in range(12):
        rows = [Row(rnd.choice("rst"), rnd.randrange(KEYS), ts + rnd.randrange(1000)) for _ in range(420)]
        produce(job, broker.bootstrap, rows, producer=producer)
        ts += 1000
        time.sleep(0.5)  # the workers join as the input comes, spilling and pushing on the way
        fleet.supervise()  # the crashed worker restarts, as its Deployment would
    # The window state is at its largest once every row is joined and before the flush rows
    # expire it: a heartbeat of each worker after the drain reports it, however far behind the
    # workers ran meanwhile (the peak taken while writing missed it when they lagged).
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    wait_heartbeats(job, broker.bootstrap, ["w0", "w1"], int(time.time() * 1000), fleet=fleet)
    peaks: dict[str, int] = {}  # each worker's own peak: a restarting worker sends no beat for a while
    for b in heartbeats_since(job, kafka.Cluster(broker.bootstrap), 600.0):
        peaks[b.worker] = max(peaks.get(b.worker, 0), b.memory_bytes + b.spilled_bytes)
    peak_state = sum(peaks.values())
    produce(job, broker.bootstrap, _flush_rows(ts + WINDOW_MS + 2000), producer=producer)
    deadline = time.monotonic() + 120
    while not (marker_dir(job) / CRASH).exists():
        assert time.monotonic() < deadline, "the worker never wrote results from spilled state"
        fleet.supervise()
        time.sleep(0.5)
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    beats = heartbeats_since(job, kafka.Cluster(broker.bootstrap), 600.0)
    peak_memory = max(b.memory_bytes for b in beats)
    pushes = sum(max(b.pushes for b in beats if b.worker == w) for w in ("w0", "w1"))
    rss = {w: _peak_rss_kib(fleet.procs[w].pid) for w in ("w0", "w1")}
    print(f"spill {mode}: window state peaked at {peak_state} bytes = {peak_state / (2 * BUDGET):.1f} x the combined "
          f"budget ({2 * BUDGET}); in-memory window bytes peaked at {peak_memory} (budget {BUDGET} per worker); "
          f"peak RSS {rss} KiB (interpreter, NumPy, librdkafka and RocksDB included); "
          f"at least {pushes} pushes")
    assert fleet.restarts >= 1  # the injected crash was a real exit, restarted
    assert pushes >= 1
    assert peak_state >= 5 * 2 * BUDGET, "the window state never outgrew the memory budget five times"
    assert peak_memory <= BUDGET, "in-memory window bytes ran past the budget"
    assert metric(fleet.metrics_ports["w0"], "streamjoin_recoveries_total") >= 1  # the restart recovered
    if mode == "deferred":
        assert sum(metric(fleet.metrics_ports[w], "streamjoin_cleanups_total") for w in ("w0", "w1")) >= 1
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 2000
    assert_spark_verified(job, broker.bootstrap, result.expected)
