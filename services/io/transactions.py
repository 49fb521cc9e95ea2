"""Kafka transactions, one way for every process that writes in them: the hash worker's
cycles (hash/cycle.py), a ring node's results and dead letters (ring/transactions.py), the
SplitJoin cores and merger, and the query router.

`Transactions` is one transactional producer's transactions: `init` fences the previous
incarnation of its transactional id (the broker aborts its open transaction and bumps the
id's epoch), then `begin`, `send_offsets`, `flush` (checked: it fails on any record not
delivered), `commit` and `abort`. Init and commit are retried by one policy (`retried`):
again, with backoff, while the client marks the error retriable (a broker away or busy).
A producer fenced by a newer holder of its id ends its process (`exit_if_fenced`), through
`hard_exit`, the process's one hard exit; the supervisor restarts it and recovery replays.

The transaction timeouts come from the job's `transactions:` section (settings/kafka.py
TransactionSpec): the broker's limit on an open transaction (transaction.timeout.ms, which
kafka.Cluster.producer gives every transactional producer) and the waits of init and commit.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from streamjoin.services import metrics
from streamjoin.services.io.deliveries import Deliveries, Meanwhile, flush

from streamjoin.settings import TransactionSpec

if TYPE_CHECKING:
    from streamjoin.services.io.kafka import Cluster

log = structlog.get_logger("streamjoin.transactions")

OFFSETS_TIMEOUT_S = 30.0  # one send_offsets_to_transaction call's wait
ABORT_TIMEOUT_S = 30.0  # one abort_transaction call's wait
COMMIT_ATTEMPTS = 20  # commit calls before a retriable error is raised after all (about 80 s of backoff)
RESTART_EXIT = 75  # EX_TEMPFAIL: the supervisor (Kubernetes, the local launcher) starts the process again
# Fencing that librdkafka may report as abortable, not fatal (seen in CI: a ProduceRequest
# answered PRODUCER_FENCED, "current transaction must be aborted"): a newer producer holds this
# transactional.id, so aborting and retrying can never succeed.
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class Transactions:
    """The transactions of one transactional producer (see the module docstring); `timeouts`:
    the job's `transactions:` section; `context`: fields logged with each retry, naming the process."""

    def __init__(self, producer: Producer, timeouts: TransactionSpec, **context: object) -> None:
        self.producer, self.timeouts, self.context = producer, timeouts, context

    def init(self) -> None:
        """Initialise the producer's transactions, retried for as long as the broker says it may
        work later (a process cannot write without it). This fences the previous incarnation of
        its transactional id (its open transaction is aborted), so a restarted process calls it
        before it reads any state."""
        retried(lambda: self.producer.init_transactions(self.timeouts.init_transactions_timeout_s), None, "init_transactions", **self.context)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send_offsets(self, offsets: list[TopicPartition], group: Any) -> None:
        """Commit `offsets` for the consumer group `group` (its consumer_group_metadata()) with
        the open transaction."""
        self.producer.send_offsets_to_transaction(offsets, group, OFFSETS_TIMEOUT_S)

    def flush(self, deliveries: Deliveries, meanwhile: Meanwhile | None = None) -> None:
        """Wait for every record of the open transaction; fail on any not delivered."""
        flush(self.producer, deliveries, meanwhile)

    def commit(self) -> None:
        """Commit the open transaction, retried COMMIT_ATTEMPTS times while the error is retriable."""
        retried(lambda: self.producer.commit_transaction(self.timeouts.commit_timeout_s), COMMIT_ATTEMPTS, "commit_transaction",
                **self.context)

    def abort(self) -> None:
        """Abort the open transaction, if any: a failure (nothing open, the broker gone) is left
        to recovery, which fences and settles it."""
        try:
            self.producer.abort_transaction(ABORT_TIMEOUT_S)
        except KafkaException:
            pass


def retried(call: Callable[[], object], attempts: int | None, what: str, **context: object) -> None:
    """`call()`, made again while the client marks its error retriable, waiting 0.2 s and twice
    as long each time up to 5 s; raises the error when it is not retriable or after `attempts`
    calls (None: no limit). Each retry is metered and logged as `what` with `context`."""
    delay, made = 0.2, 0
    while True:
        made += 1
        try:
            call()
            return
        except KafkaException as e:
            if not e.args[0].retriable() or (attempts is not None and made >= attempts):
                raise
            metrics.BROKER_ERRORS.labels("retriable").inc()
            log.warning(f"{what} failed; retrying", error=str(e), retry_in_s=delay, **context)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def fence(cluster: Cluster, transactional_id: str) -> None:
    """Initialise a producer with `transactional_id` and close it: the broker aborts that id's
    open transaction and bumps its epoch, so a producer still using the id fails its next
    transactional call with a fatal `fenced` error."""
    producer, timeout_s = cluster.producer(transactional_id), cluster.transactions.init_transactions_timeout_s
    producer.init_transactions(timeout_s)
    producer.flush(timeout_s)


def exit_if_fenced(error: KafkaException) -> None:
    """A fatal producer error or a fencing one (this process's transactions were fenced: it was
    declared dead and its work moved on) ends the process; its supervisor restarts it fresh."""
    err = error.args[0] if error.args else None
    if isinstance(err, KafkaError) and (err.fatal() or err.code() in FENCED_CODES):
        log.error("this process's transactions were fenced (declared dead, its work moved on); exiting "
                  "for a clean restart", error=str(err))
        hard_exit(RESTART_EXIT)


def hard_exit(code: int) -> NoReturn:
    """End the process now with `code`, without unwinding: no `finally`, no atexit, no flush.
    The process's one hard exit, for where a clean exit cannot be trusted to end: a producer
    fenced by a newer holder of its transactional id, a librdkafka call that stalled and cannot
    be interrupted, a stop that outlived its grace period, a forked child whose exec no longer
    has a parent to serve. Crash-only: the supervisor restarts the process and recovery replays
    what was left, so skipping the clean path loses nothing that was committed."""
    os._exit(code)
