"""A ring node's results and dead letters, written in Kafka transactions under the node's id.

The coordinator hands a silent node's id to a standby, but the process it took the id from
may be paused rather than dead, and come back. The standby's rollback reads which results are
written and re-drives the rest, so whatever the old process wrote after that read would be
there twice (results and dead letters alike). So a node writes them in transactions whose id
is the node's: the standby opening transactions under that id aborts the old process's open
transaction and fences it, its next commit fails, and it exits for a clean restart (it comes
back under the id the epochs log gives it). Hop records, the round log, round releases and
heartbeats stay on the node's plain producer: the nodes of a newer epoch drop an older one's.

Commits come where the ring needs its results visible: before a round's End goes on, before
the head logs a round (its dead letters are then written: the records below the logged read
positions are never decided again), before a rollback reads what is written, on stop, and
every COMMIT_EVERY_S otherwise (dead letters between rounds)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException, Producer

from streamjoin.services.io import kafka
from streamjoin.services.io.deliveries import Deliveries
from streamjoin.services.io.transactions import Transactions, exit_if_fenced
from streamjoin.settings import JobSettings

COMMIT_EVERY_S = 0.5


class RingTransactions:
    """The transactional producer of one ring node's results and dead letters."""

    def __init__(self, job: JobSettings, cluster: kafka.Cluster, deliveries: Deliveries) -> None:
        self.job, self.cluster, self.deliveries = job, cluster, deliveries
        self._transactions: Transactions | None = None
        self.committed_at = time.monotonic()

    @property
    def producer(self) -> Producer:
        assert self._transactions is not None, "RingTransactions.start() first"
        return self._transactions.producer

    def start(self, node_id: str) -> Producer:
        """Open transactions under `node_id`, fencing whichever process held that id before (a
        process whose id changed drops its old producer: the new holder fenced it)."""
        if self._transactions is not None:
            self._transactions.producer.purge()
        self._transactions = Transactions(self.cluster.producer(f"{self.job.job}-ring-{node_id}"), self.job.transactions,
                                          node=node_id)
        self._transactions.init()
        self._transactions.begin()
        self.committed_at = time.monotonic()
        return self.producer

    def commit(self) -> None:
        """Everything written since the last commit, visible to read_committed readers. A node
        fenced by its id's new holder exits (exit_if_fenced); another failure raises."""
        if self._transactions is None:
            return
        try:
            self._transactions.commit()
            self._transactions.begin()
        except KafkaException as e:
            exit_if_fenced(e)
            raise
        self.committed_at = time.monotonic()
        self.deliveries.check()

    def tick(self) -> None:
        """Commit when the last commit is COMMIT_EVERY_S old."""
        if time.monotonic() - self.committed_at >= COMMIT_EVERY_S:
            self.commit()
