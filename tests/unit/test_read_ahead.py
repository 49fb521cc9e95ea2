"""Reading the next batch while the broker acknowledges a cycle (Emitter's `meanwhile`,
Worker._read_ahead), with stand-ins for the clients: the waits still end when the broker is
done, the transaction's calls run off the main thread, and a failed cycle drops what was read
ahead. The real broker's side: tests/integration/test_aligned_intake.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from streamjoin.services.hash import emit
from streamjoin.services.io import deliveries
from streamjoin.services.io.intake import RecordBuffer
from streamjoin.services.hash.main import Worker
from streamjoin.services.hash.emit import Emitter
from streamjoin.services.io.deliveries import Deliveries, flush


class _Producer:
    """A producer whose queue empties one record per flush call; it remembers each timeout."""

    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.timeouts: list[float] = []

    def flush(self, timeout: float) -> int:
        self.timeouts.append(timeout)
        self.queued = max(0, self.queued - 1)
        return self.queued


class _Work:
    """`meanwhile` work that finds something to do its first `busy` times."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls = busy, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls <= self.busy


def test_a_flush_with_work_meanwhile_polls_between_the_work_and_still_waits_for_every_record():
    producer, work = _Producer(queued=6), _Work(busy=3)
    flush(producer, Deliveries(), work)  # type: ignore[arg-type]
    assert producer.queued == 0
    assert work.calls == 6  # one piece of work per poll, until the queue was empty
    # short polls while there was work, longer waits once there was none
    assert producer.timeouts == [0.001] * 3 + [deliveries.IDLE_WAIT_S] * 3


def test_a_flush_without_work_meanwhile_blocks_as_before():
    producer = _Producer(queued=1)
    flush(producer, Deliveries())  # type: ignore[arg-type]
    assert producer.timeouts == [deliveries._FLUSH_TIMEOUT_S]


def test_a_flush_meanwhile_still_fails_on_a_failed_delivery():
    deliveries = Deliveries()
    deliveries.errors.append(KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaException):
        flush(_Producer(queued=2), deliveries, _Work(busy=1))  # type: ignore[arg-type]


def _emitter() -> Emitter:
    emitter = Emitter.__new__(Emitter)
    emitter._helper = emit.ThreadPoolExecutor(max_workers=1)
    return emitter


def test_the_transactions_call_runs_on_a_helper_while_the_work_runs_here():
    """The call ends only once the work has run three times: both ran at once."""
    worked = threading.Event()
    main_thread, calls = threading.get_ident(), []

    def work() -> bool:
        calls.append(threading.get_ident())
        if len(calls) == 3:
            worked.set()
        return True

    def end_transaction() -> int:
        assert worked.wait(10), "the work never ran while the call waited"
        return threading.get_ident()

    ran_on = _emitter()._while_waiting(end_transaction, work)
    assert ran_on != main_thread
    assert len(calls) >= 3 and set(calls) == {main_thread}


def test_the_transactions_failure_reaches_the_caller():
    def end_transaction() -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))

    with pytest.raises(KafkaException, match="commit timed out"):
        _emitter()._while_waiting(end_transaction, _Work(busy=0))


def test_without_work_the_call_is_made_here():
    assert _emitter()._while_waiting(threading.get_ident, None) == threading.get_ident()


def _buffer(group: int) -> RecordBuffer:
    """A stream's buffer holding one record read for `group`."""
    buffer = RecordBuffer()
    buffer.values.append(b"{}")
    buffer.keys.append(None)
    buffer.headers.append(None)
    buffer._push(np.array([group]), np.array([7]), np.array([group]), np.zeros(1, bool))
    buffer._read_up_to("in.r", np.array([group]), np.array([group]), np.array([7]))
    return buffer


def test_a_failed_cycle_drops_the_records_read_ahead_and_rebuilds_their_groups(monkeypatch):
    worker = Worker.__new__(Worker)
    worker.pending = {0: _buffer(5), 1: _buffer(9)}  # read ahead while the failed cycle committed
    reset: list[set[int]] = []
    monkeypatch.setattr(worker, "_reset", reset.append)
    worker._recover_failed_cycle({1, 2})
    assert reset == [{1, 2, 5, 9}]  # read again from their checkpoints, with the cycle's own groups
    assert worker.pending == {}
