"""A state transaction: puts and deletes collected in a RocksDB WriteBatch and
applied at once, so a crash leaves either all of a batch's state or none."""

from __future__ import annotations

from rocksdict import Rdict, WriteBatch


class StateTransaction:
    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._batch = WriteBatch(raw_mode=True)

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        self._batch.delete(key)

    def commit(self) -> None:
        if not self._batch.is_empty():
            self._db.write(self._batch)
        self._batch = WriteBatch(raw_mode=True)
