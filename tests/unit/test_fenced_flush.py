"""A fenced transactional producer's flush: confluent-kafka has raised a KafkaException, a bare
SystemError and the KafkaError itself (no BaseException at all) for it, all seen in CI. Each
must come out as a fatal KafkaException, which the worker's fencing exit handles (exit 75);
a stop request must pass through untouched."""

from __future__ import annotations

import ctypes

import pytest
from confluent_kafka import KafkaError, KafkaException

from streamjoin.services.shutdown import Stopped
from streamjoin.services.io.deliveries import _flushed

_SET_ERROR = ctypes.pythonapi.PyErr_SetObject
_SET_ERROR.argtypes, _SET_ERROR.restype = [ctypes.py_object, ctypes.py_object], None


class _Producer:
    def __init__(self, fail: str) -> None:
        self.fail = fail

    def flush(self, timeout: float) -> int:
        fenced = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
        if self.fail == "kafka-exception":
            raise KafkaException(fenced)
        if self.fail == "system-error":
            raise SystemError("<built-in method flush> returned a result with an exception set")
        if self.fail == "bare-kafka-error":
            _SET_ERROR(KafkaError, fenced)  # what the C extension does: the error object raised as is
        raise Stopped()


@pytest.mark.parametrize("fail", ["kafka-exception", "system-error", "bare-kafka-error"])
def test_a_fenced_flush_is_a_fatal_kafka_exception(fail: str) -> None:
    with pytest.raises(KafkaException) as raised:
        _flushed(_Producer(fail), 30)  # type: ignore[arg-type]
    assert raised.value.args[0].fatal()


def test_a_stop_request_in_flush_passes_through() -> None:
    with pytest.raises(Stopped):
        _flushed(_Producer("stop"), 30)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED])
def test_a_fencing_error_reported_as_abortable_still_exits_75(code: int, monkeypatch) -> None:
    """librdkafka answered a zombie's ProduceRequest with PRODUCER_FENCED, not fatal (seen in CI):
    retrying after an abort can never succeed, so it exits like a fatal fence; other errors do not."""
    from streamjoin.services.io import transactions

    exits: list[int] = []
    monkeypatch.setattr(transactions.os, "_exit", exits.append)
    transactions.exit_if_fenced(KafkaException(KafkaError(code, "fenced", fatal=False)))
    transactions.exit_if_fenced(KafkaException(KafkaError(KafkaError._CONFLICT, "abort in progress", fatal=False)))
    assert exits == [75]
