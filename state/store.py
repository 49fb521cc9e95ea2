"""One RocksDB database per worker (rocksdict, raw bytes), opened under the
worker's state directory. Writes go through `StateTransaction` only, so a
batch's window blocks and its checkpoint land atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from rocksdict import Options, Rdict

from streamjoin.state.transaction import StateTransaction


class Store:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.path = path
        self._db = Rdict(str(path), opts)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield it.key(), it.value()
            it.next()

    def transaction(self) -> StateTransaction:
        return StateTransaction(self._db)

    def close(self) -> None:
        self._db.close()
