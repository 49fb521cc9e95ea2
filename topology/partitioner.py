"""Kafka's default partitioner (Java client's murmur2), so a user's keyed
producer already lands each key in the partition group the worker expects.
librdkafka producers get the same with `partitioner=murmur2_random`.

Scalar reference (`murmur2`, `partition_for`) and its whole-block twins
(`murmur2_many` over engine/hash_kernels.py, `partitions_for_keys`), which the
property tests hold equal for every input. What they hash is the canonical
join-key text (schemas/join_keys.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from streamjoin.engine import hash_kernels
from streamjoin.schemas.columns import flat

_SEED, _M, _R = 0x9747B28C, 0x5BD1E995, 24


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    seed, m, r = _SEED, _M, _R
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    base = length - tail
    if tail >= 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """Partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def murmur2_many(keys: pa.Array | Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of every key (int32, equal to `murmur2` of each), in one numba loop
    (engine/hash_kernels.py).

    keys: Arrow binary-like array (binary, string or their large_ kinds) without nulls, e.g.
    `schemas.join_keys.key_text`'s, or a sequence of bytes."""
    keys = keys if isinstance(keys, pa.Array) else pa.array(keys, pa.binary())
    if keys.null_count:
        raise ValueError("a null key has no murmur2 partition (Kafka spreads null keys instead)")
    data, offsets = flat(keys)
    return hash_kernels.murmur2_flat(data, offsets.view(np.uint64)).view(np.int32)


def partitions_for_keys(keys: pa.Array | Sequence[bytes], partitions: int) -> np.ndarray:
    """The partition (int32) Kafka's default partitioner picks for every key.

    keys: as for `murmur2_many`; partitions: the topic's partition count."""
    return ((murmur2_many(keys) & 0x7FFFFFFF) % partitions).astype(np.int32)
