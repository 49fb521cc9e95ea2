"""A state transaction: one cycle's puts and deletes, with explicit states.

    started   puts and deletes are collected (a RocksDB WriteBatch, and the same
              writes in order for the changelog);
    prepared  the writes were handed to the changelog inside the cycle's Kafka
              transaction: nothing may be added any more;
    complete  that Kafka transaction committed and the writes are applied to
              RocksDB at once, so a crash leaves either all of a cycle's state or none;
    failed    the Kafka transaction did not commit: the writes are dropped.

So a group's local state never runs ahead of what Kafka says was decided, and
the changelog always holds what the local state will hold."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rocksdict import Rdict, WriteBatch


class TxState(Enum):
    STARTED = "started"
    PREPARED = "prepared"
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass(frozen=True)
class Write:
    """One put (`value`) or delete (`value` None; `deleted_bytes`: the size of the value it
    removes, so the changelog can retract every chunk of it)."""

    key: bytes
    value: bytes | None
    deleted_bytes: int = 0


class TransactionStateError(RuntimeError):
    """A transaction used out of order (a put after prepare, a commit after a failure...)."""


class StateTransaction:
    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._batch = WriteBatch(raw_mode=True)
        self.writes: list[Write] = []  # in order
        self.state = TxState.STARTED

    def put(self, key: bytes, value: bytes) -> None:
        self._expect(TxState.STARTED)
        self._batch.put(key, value)
        self.writes.append(Write(key, value))

    def delete(self, key: bytes, size: int = 0) -> None:
        """Delete `key`, whose value has `size` bytes."""
        self._expect(TxState.STARTED)
        self._batch.delete(key)
        self.writes.append(Write(key, None, size))

    def prepare(self) -> list[Write]:
        """Close the transaction to new writes; returns them, in order, for the changelog."""
        self._expect(TxState.STARTED)
        self.state = TxState.PREPARED
        return self.writes

    def commit(self) -> None:
        """Apply every write to RocksDB at once (from started too: a store without a changelog)."""
        self._expect(TxState.STARTED, TxState.PREPARED)
        if not self._batch.is_empty():
            self._db.write(self._batch)
        self.state = TxState.COMPLETE

    def fail(self) -> None:
        """Drop the writes: what they describe was not decided."""
        self._expect(TxState.STARTED, TxState.PREPARED)
        self.state = TxState.FAILED

    def _expect(self, *allowed: TxState) -> None:
        if self.state not in allowed:
            raise TransactionStateError(f"state transaction is {self.state.value}, "
                                        f"expected {' or '.join(s.value for s in allowed)}")
