"""Groups that move, through the real parts: three worker processes on the embedded
broker under a steady input rate; `streamjoin move` and `streamjoin drain` (the CLI,
as an operator runs them) mid-stream, then a worker SIGKILLed and never restarted, its
groups failed over to the live one; then the same protocol with a process killed at each
of its steps. The output is checked exactly against the plain-Python reference (and Spark
`verify` for the first); the move's, the drain's and the failover's times are printed."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamjoin.launcher import wait_drained
from streamjoin.schemas.control import FIRST_EPOCH
from streamjoin.schemas.results import BatchCommit
from streamjoin.services.io import kafka
from streamjoin.services.coordinator.status import snapshot
from streamjoin.services.faults import marker_dir
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import metric, wait_until
from tests.integration.kafka_harness import Row, assert_spark_verified, check, commits, produce

pytestmark = pytest.mark.integration

PARTITIONS = 12
PARTITIONS_SMALL = 4
RATE = 400  # rows per second, event time about wall time


class SteadyInput(threading.Thread):
    """Produces RATE rows a second, in tenths of a second, until stopped."""

    def __init__(self, job, bootstrap: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.job, self.bootstrap = job, bootstrap
        self.stop_flag = threading.Event()
        self.rows = 0

    def run(self) -> None:
        rnd = random.Random(21)
        producer = kafka.Cluster(self.bootstrap).producer()
        started = time.time()
        while not self.stop_flag.is_set():
            now_ms = int((time.time() - started) * 1000) + 10_000
            chunk = [Row(rnd.choice("rs"), rnd.randrange(300), now_ms - rnd.randint(0, 200)) for _ in range(RATE // 10)]
            produce(self.job, self.bootstrap, chunk, producer=producer)
            self.rows += len(chunk)
            time.sleep(0.1)

    def wait_rows(self, rows: int, timeout: float = 120) -> None:
        """Until at least `rows` rows are written (a loaded machine can starve this thread, and
        a scale-in done in a second would leave too little output to prove anything)."""
        deadline = time.monotonic() + timeout
        while self.rows < rows:
            assert time.monotonic() < deadline, f"only {self.rows} of {rows} input rows written in {timeout} s"
            time.sleep(0.2)


def _cli(job_file: Path, bootstrap: str, *args: str) -> float:
    """Run `streamjoin ARGS` as an operator would; the seconds it took (it waits for the move to finish)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", *args, "--job", str(job_file),
                           "--bootstrap", bootstrap], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - started


def _held(job, bootstrap: str) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    """Each worker's groups as its newest heartbeat says (alive or not: on a loaded machine a
    heartbeat can be older than the timeout that `status` calls alive)."""
    return {w["worker"]: w["held_groups"] for w in snapshot(job, kafka.Cluster(bootstrap))["workers"]}


# Timeouts a loaded 2-core machine keeps: a slow worker is not failed over, a dead one is within seconds.
TIMEOUTS = {"heartbeat_timeout_ms": 4000, "worker_timeout_ms": 8000}
# The move's crashes kill its receiver twice in a row; on a loaded machine two restarts leave it
# silent for longer than 8 s, and a failover would then take its groups before the move is seen
# through. A failover has its own test: here a worker is declared dead only after a minute.
MOVE_TIMEOUTS = {**TIMEOUTS, "worker_timeout_ms": 60_000}


def _under_load(broker, fleet_for, tmp_path: Path, workers: int, partitions: int,  # type: ignore[no-untyped-def]
                coordinator: dict, crash_at: tuple[str, ...] = ()):
    """A job of 1 s windows with `workers` workers on `partitions` groups and the input already
    flowing at RATE, its processes crashing at the `crash_at` steps (faults.crash_at); (job,
    fleet, the input thread)."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 1000}, {"range_ms": 1000}], workers=workers,
                   partitions=partitions, coordinator=coordinator, faults={"crash_at": list(crash_at)})
    fleet = fleet_for(job, workers)
    steady = SteadyInput(job, broker.bootstrap)
    steady.start()
    return job, fleet, steady


@pytest.mark.spark
def test_move_drain_and_failover_under_load_stay_exact(broker, fleet_for, tmp_path: Path) -> None:
    job, fleet, steady = _under_load(broker, fleet_for, tmp_path, 3, PARTITIONS, TIMEOUTS)
    try:
        steady.wait_rows(4 * RATE)
        moved = next(g for g in _held(job, broker.bootstrap)["w0"])
        move_s = _cli(fleet.job_file, broker.bootstrap, "move", str(moved), "--to", "w2")
        assert moved in _held(job, broker.bootstrap)["w2"]
        steady.wait_rows(steady.rows + 2 * RATE)
        drain_s = _cli(fleet.job_file, broker.bootstrap, "drain", "w1")
        assert _held(job, broker.bootstrap)["w1"] == []
        steady.wait_rows(steady.rows + 2 * RATE)
        orphans = set(_held(job, broker.bootstrap)["w2"])
        fleet.restart_workers = False
        killed = time.monotonic()
        fleet.kill("w2", signal.SIGKILL)
        deadline = killed + 90
        while not orphans <= set(_held(job, broker.bootstrap).get("w0", [])):
            assert time.monotonic() < deadline, "the dead worker's groups were not failed over within 90 s"
            time.sleep(0.5)
        failover_s = time.monotonic() - killed
        steady.wait_rows(steady.rows + 2 * RATE)
    finally:
        steady.stop_flag.set()
        steady.join(30)
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    port = fleet.metrics_ports["coordinator"]
    done, failed_over = (metric(port, "streamjoin_migrations_total", 'outcome="done"'),
                         metric(port, "streamjoin_migrations_total", 'outcome="failover"'))
    pauses = metric(port, "streamjoin_migration_pause_seconds_count")
    pause_s = metric(port, "streamjoin_migration_pause_seconds_sum") / max(pauses, 1)
    print(f"migration: move {move_s:.1f} s and drain {drain_s:.1f} s of CLI wall time, mean pause {pause_s:.2f} s "
          f"over {pauses:.0f} moves, failover {failover_s:.1f} s (worker_timeout_ms "
          f"{job.coordinator.worker_timeout_ms}); moves done {done:.0f}, failed over {failed_over:.0f}; "
          f"{steady.rows} rows")
    # At least the killed worker's groups; a loaded machine may stall another worker past the timeout too.
    assert failed_over >= len(orphans) and done >= 1 + PARTITIONS // 3
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 1000
    assert_spark_verified(job, broker.bootstrap, result.expected)


def test_a_paused_worker_is_fenced_when_its_groups_fail_over(broker, fleet_for, tmp_path: Path) -> None:
    """A worker stopped (SIGSTOP) past `worker_timeout_ms` is declared dead and its groups fail
    over; the receiver fences its transactions first, so when it is continued (SIGCONT, a
    zombie) its next commit fails and it exits for a restart as a fresh worker, and nothing it
    wrote after the failover is visible: the output stays exact. A zombie that had nothing in
    hand when told it holds nothing stays on as a standby that can commit nothing more: it is
    given a group, whose first commit ends it the same way."""
    job, fleet, steady = _under_load(broker, fleet_for, tmp_path, 2, PARTITIONS_SMALL, TIMEOUTS)
    try:
        steady.wait_rows(3 * RATE)
        zombie = fleet.procs["w1"]
        zombie.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 90
        while sorted(_held(job, broker.bootstrap).get("w0", [])) != list(range(PARTITIONS_SMALL)):
            assert time.monotonic() < deadline, "the paused worker's groups were not failed over within 90 s"
            time.sleep(0.5)
        steady.wait_rows(steady.rows + 2 * RATE)  # input for the groups it held, while it is away
        zombie.send_signal(signal.SIGCONT)
        # Fenced: its next commit fails and it exits for a clean restart. Or it had nothing in
        # hand when told it holds nothing (a heartbeat holding nothing: it let go without a
        # commit): a standby whose producer can commit nothing more.
        standby = wait_until("the zombie exited or stood by", lambda: zombie.poll() is not None
                             or _held(job, broker.bootstrap).get("w1") == [], timeout=60) and zombie.poll() is None
        if standby:  # its first group ends it the same way
            _cli(fleet.job_file, broker.bootstrap, "move", "0", "--to", "w1", "--wait", "0")
        assert zombie.wait(60) == 75
        assert "transactions were fenced" in (fleet.log_dir / "w1.log").read_text()  # its own, the fenced path
        steady.wait_rows(steady.rows + 2 * RATE)
    finally:
        steady.stop_flag.set()
        steady.join(30)
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    assert metric(fleet.metrics_ports["w0"], "streamjoin_fenced_workers_total") >= 1
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 500


def test_adaptive_coordinator_scales_in_an_idle_job_through_the_protocol(broker, fleet_for, tmp_path: Path) -> None:
    """coordinator.placement: adaptive on a light load: no worker is a supplier, so the cluster join
    paper's degree of declustering shrinks: the worker with the least state is drained to standby
    by moves the coordinator starts itself; the output stays exact."""
    job, fleet, steady = _under_load(broker, fleet_for, tmp_path, 2, PARTITIONS_SMALL,
                                     {"placement": "adaptive", "reorg_epoch_ms": 2000, "scale_cooldown_ms": 1000})
    try:
        deadline = time.monotonic() + 90
        while not any(groups == [] for groups in _held(job, broker.bootstrap).values()):
            assert time.monotonic() < deadline, "the adaptive coordinator did not scale in within 90 s"
            time.sleep(0.5)
        steady.wait_rows(steady.rows + 2 * RATE)  # input after the scale-in too
        steady.wait_rows(4 * RATE)
    finally:
        steady.stop_flag.set()
        steady.join(30)
    wait_drained(job, broker.bootstrap, fleet, timeout=180)
    held = _held(job, broker.bootstrap)
    assert sorted(g for groups in held.values() for g in groups) == list(range(PARTITIONS_SMALL)), held
    assert metric(fleet.metrics_ports["coordinator"], "streamjoin_migrations_total", 'outcome="done"') >= 1
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 200


# Every step of the protocol a process can die at (settings.dev.CRASH_STEPS), in the order one
# move reaches them: the coordinator after storing the move, the sender after its last
# transaction, the coordinator after storing the release, the receiver after restoring the
# changelog and after replaying, before the heartbeat that ends the move.
MOVE_CRASHES = ("coordinator:move-stored", "w0:sender-committed", "coordinator:release-stored",
                "w1:receiver-restored", "w1:receiver-recovered")
# A failover's: the coordinator after storing it, the receiver after fencing the dead worker.
FAILOVER_CRASHES = ("coordinator:failover-stored", "w0:receiver-fenced")


def _settle(job, bootstrap: str, fleet, crashes: tuple[str, ...],  # type: ignore[no-untyped-def]
            done, what: str) -> None:
    """Restart whatever crashed (as Kubernetes would) until every crash in `crashes` has
    happened and `done(held)` holds for the workers' heartbeats. The crashes come one after
    another, each costing a process start and a recovery: on a loaded 2-core machine that is
    minutes, so the wait is long (it ends as soon as the condition holds)."""
    deadline = time.monotonic() + 300
    while True:
        fleet.supervise()
        crashed = {entry for entry in crashes if (marker_dir(job) / entry).exists()}
        held = _held(job, bootstrap)
        if crashed == set(crashes) and done(held):
            return
        assert time.monotonic() < deadline, f"{what}: crashes {sorted(crashed)} of {crashes}; held {held}"
        time.sleep(0.5)


def _one_owner_each(job, bootstrap: str, fleet, alive: list[str]) -> None:  # type: ignore[no-untyped-def]
    """After the input stopped: drained, and every group held by exactly one live worker."""
    wait_drained(job, bootstrap, fleet, timeout=180)
    held = _held(job, bootstrap)
    assert sorted(g for w in alive for g in held.get(w, [])) == list(range(job.partitions)), held


def test_a_move_stays_exact_with_a_crash_at_every_step(broker, fleet_for, tmp_path: Path) -> None:
    """One move of a group from w0 to w1 under load, while the coordinator, the sender and the
    receiver are each killed (SIGKILL, by faults.crash_at) at every step the move reaches and
    restarted: the move completes, each group has one owner and the output is exact."""
    job, fleet, steady = _under_load(broker, fleet_for, tmp_path, 2, PARTITIONS_SMALL, MOVE_TIMEOUTS, MOVE_CRASHES)
    try:
        steady.wait_rows(2 * RATE)
        moved = _held(job, broker.bootstrap)["w0"][0]
        _cli(fleet.job_file, broker.bootstrap, "move", str(moved), "--to", "w1", "--wait", "0")
        _settle(job, broker.bootstrap, fleet, MOVE_CRASHES, lambda held: moved in held.get("w1", []), "the move")
        steady.wait_rows(steady.rows + 2 * RATE)
    finally:
        steady.stop_flag.set()
        steady.join(30)
    _one_owner_each(job, broker.bootstrap, fleet, ["w0", "w1"])
    assert fleet.restarts >= len(MOVE_CRASHES)  # each crash was a real process exit, restarted
    # The receiver rebuilt the group from the changelog (in the incarnation killed right after).
    assert "groups restored from the changelog" in (fleet.log_dir / "w1.log").read_text()
    # Every batch commit says at which placement epoch its worker held the group.
    epochs = {(c.worker, c.epoch) for c in commits(job, broker.bootstrap)
              if isinstance(c, BatchCommit) and c.group == moved}
    assert {e for w, e in epochs if w == "w0"} == {FIRST_EPOCH} and min(e for w, e in epochs if w == "w1") > FIRST_EPOCH
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 300


def test_a_failover_stays_exact_with_a_crash_at_every_step(broker, fleet_for, tmp_path: Path) -> None:
    """w1 SIGKILLed and never restarted; its groups fail over to w0 while the coordinator dies
    right after storing the failover and w0 right after fencing w1: the restarted coordinator
    still has w0 fence w1 (the placement records name the dead owner), the groups end on w0
    and the output is exact."""
    job, fleet, steady = _under_load(broker, fleet_for, tmp_path, 2, PARTITIONS_SMALL, TIMEOUTS, FAILOVER_CRASHES)
    try:
        steady.wait_rows(3 * RATE)
        fleet.kill("w1", signal.SIGKILL)
        _settle(job, broker.bootstrap, fleet, FAILOVER_CRASHES,
                lambda held: sorted(held.get("w0", [])) == list(range(PARTITIONS_SMALL)), "the failover")
        steady.wait_rows(steady.rows + 2 * RATE)
    finally:
        steady.stop_flag.set()
        steady.join(30)
    _one_owner_each(job, broker.bootstrap, fleet, ["w0"])
    assert fleet.restarts >= len(FAILOVER_CRASHES)
    assert metric(fleet.metrics_ports["w0"], "streamjoin_fenced_workers_total") >= 1  # fenced again after its crash
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 300
