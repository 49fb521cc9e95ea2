"""Kafka's default partitioner (Java client's murmur2), so a user's keyed
producer already lands each key in the partition group the worker expects.
librdkafka producers get the same with `partitioner=murmur2_random`.

Scalar reference (`murmur2`, `partition_for`) and its whole-block twins
(`key_text`, `murmur2_many` over engine/hash_kernels.py, `partitions_for_keys`),
which the property tests hold equal for every input.

Canonical join-key text (a record's key, and a hash-mode result's key): the
key fields' values as text joined by ",": int -> decimal ASCII, str -> its
UTF-8, bool -> true/false (what Spark's concat_ws(",", cast(string)) writes).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjoin.engine import hash_kernels
from streamjoin.schemas.columns import flat, string_array
from streamjoin.settings import FieldType

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


def key_bytes(value: object) -> bytes:
    """The record key streamjoin's producers write for a one-field join-key value
    (the canonical key text: bools as true/false, like `key_text`)."""
    if isinstance(value, (bool, np.bool_)):
        return b"true" if value else b"false"
    return str(value).encode()


def _field_text(values: np.ndarray, ftype: FieldType) -> pa.LargeStringArray:
    """One key field's values in the canonical text.

    values: a block column (int64, NumPy 'U' or object str, bool); ftype: its field type."""
    if ftype == "int":
        return pa.array(np.asarray(values, np.int64)).cast(pa.large_string())
    if ftype == "bool":
        return pa.array(np.asarray(values, np.bool_)).cast(pa.large_string())  # Arrow writes true/false
    if ftype == "str":
        return string_array(values)
    raise ValueError(f"join keys are int, str or bool fields, not {ftype}")


def key_text(columns: Sequence[tuple[np.ndarray, FieldType]]) -> pa.LargeBinaryArray:
    """The canonical join-key text of every row, as an Arrow large_binary array.

    columns: the key fields in key order, each (values, field type), equal lengths."""
    if not columns:
        raise ValueError("a join key has at least one field")
    texts = [_field_text(values, ftype) for values, ftype in columns]
    joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, pa.scalar(",", pa.large_string()))
    return joined.cast(pa.large_binary())


def murmur2_many(keys: pa.Array | Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of every key (int32, equal to `murmur2` of each), in one numba loop
    (engine/hash_kernels.py).

    keys: Arrow binary-like array (binary, string or their large_ kinds) without nulls, e.g.
    `key_text`'s, or a sequence of bytes."""
    keys = keys if isinstance(keys, pa.Array) else pa.array(keys, pa.binary())
    if keys.null_count:
        raise ValueError("a null key has no murmur2 partition (Kafka spreads null keys instead)")
    data, offsets = flat(keys)
    return hash_kernels.murmur2_flat(data, offsets.view(np.uint64)).view(np.int32)


def partitions_for_keys(keys: pa.Array | Sequence[bytes], partitions: int) -> np.ndarray:
    """The partition (int32) Kafka's default partitioner picks for every key.

    keys: as for `murmur2_many`; partitions: the topic's partition count."""
    return ((murmur2_many(keys) & 0x7FFFFFFF) % partitions).astype(np.int32)
