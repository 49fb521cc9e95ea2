"""The changelog: partition group g's state writes, mirrored to partition g of
`<job>.changelog` inside the cycle's Kafka transaction, so that any worker can
rebuild the group without the disk of the one that had it.

A record's key is the RocksDB key it writes (state/partition.py), its value the
value, a tombstone (None) a delete. A value over CHUNK_BYTES (a big batch's
block) is cut into chunks keyed `<key>#<i>/<n>`, each under the producer's
message size; a delete retracts every chunk, so a compacted changelog keeps
only live keys. The group's checkpoint is the last record of every batch.

Recovery reads from the checkpoint's `changelog_low` (the first record any live
block or the checkpoint still needs) up to the newest checkpoint: the work
grows with the window, not with the job's age."""

from __future__ import annotations

from typing import Iterable

from streamjoin.state.transaction import Write

CHUNK_BYTES = 512 * 1024
_CHUNK = b"#"


def chunks_of(size: int) -> int:
    """How many records a value of `size` bytes takes."""
    return max(1, -(-size // CHUNK_BYTES))


def records(writes: Iterable[Write]) -> list[tuple[bytes, bytes | None]]:
    """Changelog records (key, value or None) of `writes`, in order."""
    out: list[tuple[bytes, bytes | None]] = []
    for w in writes:
        if w.value is None:
            n = chunks_of(w.deleted_bytes)
            out += [(w.key, None)] if n == 1 else [(_chunk_key(w.key, i, n), None) for i in range(n)]
        elif len(w.value) <= CHUNK_BYTES:
            out.append((w.key, w.value))
        else:
            n = chunks_of(len(w.value))
            out += [(_chunk_key(w.key, i, n), w.value[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]) for i in range(n)]
    return out


def _chunk_key(key: bytes, i: int, n: int) -> bytes:
    return key + _CHUNK + f"{i:04d}/{n:04d}".encode()


class Image:
    """A group's state as its changelog records rebuild it: feed records in log order
    (`apply`), then `values` gives every live key's value with chunks joined, and
    `offsets` the offset where each value's first record is. A chunked
    value missing a chunk (its write was cut short by a crash before the checkpoint the
    reader stops at, so it cannot be read) is left out, not joined partially."""

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}
        self._chunks: dict[bytes, dict[int, bytes]] = {}  # key -> chunk index -> bytes
        self._counts: dict[bytes, int] = {}
        self.offsets: dict[bytes, int] = {}

    def apply(self, key: bytes, value: bytes | None, offset: int) -> None:
        """The record at `offset` of the group's changelog partition."""
        base, i, n = _split(key)
        if value is None or n == 0 or i == 0:  # a delete, or a new value under this key: the old one goes
            self._values.pop(base, None)
            self._chunks.pop(base, None)
            self._counts.pop(base, None)
            self.offsets.pop(base, None)
        if value is None:
            return
        if n == 0:
            self._values[base] = value
            self.offsets[base] = offset
        elif base in self._chunks and self._counts[base] == n:
            self._chunks[base][i] = value
        elif i == 0:
            self._chunks[base], self._counts[base], self.offsets[base] = {0: value}, n, offset
        # else: a later chunk whose first one was not read (before the low mark): not a value to keep

    def values(self) -> dict[bytes, bytes]:
        joined = {key: b"".join(parts[i] for i in range(self._counts[key]))
                  for key, parts in self._chunks.items() if len(parts) == self._counts[key]}
        return self._values | joined


def base_key(key: bytes) -> bytes:
    """The state key a changelog record's key writes (a chunk's without its chunk suffix)."""
    return _split(key)[0]


def _split(key: bytes) -> tuple[bytes, int, int]:
    """(base key, chunk index, chunk count); count 0 for a value in one record."""
    base, sep, tail = key.rpartition(_CHUNK)
    if not sep or b"/" not in tail:
        return key, 0, 0
    index, _, count = tail.partition(b"/")
    if not (index.isdigit() and count.isdigit()):
        return key, 0, 0
    return base, int(index), int(count)
