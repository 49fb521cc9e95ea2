"""What every producer needs to know that its records landed: `Deliveries` collects one
producer's delivery reports, and `flush` waits for its queue to empty and then fails on any
record that was not delivered (the checked flush every writer and transaction relies on:
"visible" implies "durable before" only across such a flush). While the broker acknowledges,
a caller's `meanwhile` work may run between short waits instead of one blocked wait."""

from __future__ import annotations

import sys
import time
from typing import Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from streamjoin.services import metrics

# How long one wait on the broker lasts when the `meanwhile` work found nothing to do: short, so
# that records arriving meanwhile are taken, long enough that polling costs nothing measurable.
IDLE_WAIT_S = 0.01
_FLUSH_TIMEOUT_S = 30  # one flush's wait before it is metered as a timeout and waited again
Meanwhile = Callable[[], bool]  # work done while the broker acknowledges; returns whether it found any


class Deliveries:
    """Delivery reports of one producer: the newest offset delivered per (topic, partition),
    and every failure. `check` raises the first failure."""

    def __init__(self) -> None:
        self.newest: dict[tuple[str, int], int] = {}
        self.errors: list[KafkaError] = []

    def report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err)
            metrics.BROKER_ERRORS.labels("delivery").inc()
            return
        key = (msg.topic(), msg.partition())
        self.newest[key] = max(self.newest.get(key, -1), msg.offset())

    def clear(self) -> None:
        self.newest.clear()
        self.errors.clear()

    def check(self) -> None:
        if self.errors:
            raise KafkaException(self.errors[0])


def flush(producer: Producer, deliveries: Deliveries, meanwhile: Meanwhile | None = None) -> None:
    """Wait for every queued record, then fail on any that was not delivered; `meanwhile`: work
    to do between short waits instead of one long one (None: just wait)."""
    while _waited(producer, meanwhile) > 0:
        metrics.BROKER_ERRORS.labels("flush-timeout").inc()
    deliveries.check()


def _waited(producer: Producer, meanwhile: Meanwhile | None) -> int:
    """Up to _FLUSH_TIMEOUT_S of waiting for the producer's queue to empty, `meanwhile` run
    between short waits; returns the records still queued."""
    if meanwhile is None:
        return _flushed(producer, _FLUSH_TIMEOUT_S)
    deadline = time.monotonic() + _FLUSH_TIMEOUT_S
    while True:
        # flush() with a tiny timeout still serves the delivery reports (flush(0) would not poll)
        remaining = _flushed(producer, 0.001 if meanwhile() else IDLE_WAIT_S)
        if remaining == 0 or time.monotonic() >= deadline:
            return remaining


def _flushed(producer: Producer, timeout_s: float) -> int:
    """producer.flush(timeout_s). A transactional producer fenced by a newer one with its id (this
    worker was declared dead) makes confluent-kafka's flush raise a bare SystemError or the
    KafkaError itself instead of a KafkaException (both seen on Tansu): reported as the
    KafkaException it is, so the caller's fatal-error handling applies."""
    try:
        return producer.flush(timeout_s)
    except KafkaException:
        raise
    except Exception as e:  # noqa: BLE001 - the SystemError
        raise _fenced_in_flush(e) from e
    except BaseException:
        raise  # a stop request (services/shutdown.Stopped), KeyboardInterrupt, SystemExit
    except:  # noqa: E722 - the KafkaError raised bare is no BaseException: only a bare except matches it
        raise _fenced_in_flush(sys.exc_info()[1]) from None


def _fenced_in_flush(error: object) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, f"producer failed fatally in flush: {error!r}", fatal=True))


def count_failed_control_delivery(err: KafkaError | None, _msg: Message) -> None:
    """Delivery report of a control record (a heartbeat, a RingFailed): a failure is counted and
    fails nothing; the next heartbeat retries or replaces a lost one."""
    if err is not None:
        metrics.BROKER_ERRORS.labels("control-delivery").inc()
